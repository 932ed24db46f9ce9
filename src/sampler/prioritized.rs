//! Prioritized experience replay (Schaul et al. 2016), TorchRL's `PrioritizedSampler`,
//! on the concurrent segment trees of `sumtree/`.
//!
//! Row `i` is drawn with probability `P(i) = m_i / sum_j m_j`, where its mass is
//! `m_i = (p_i + eps)^alpha` and `p_i` its priority. It carries the importance weight
//! `(N * P(i))^-beta / max_j (N * P(j))^-beta`, which is `(m_min / m_i)^beta`: the
//! min tree gives `m_min`. New rows enter with the largest priority seen so far (or,
//! with `max_priority_within_buffer`, the largest stored now), or with the values of
//! the batch's priority field. Updates, inserts and draws all run at once from any
//! threads: the trees take no lock.
//!
//! Masses are integers: `(p + eps)^alpha` in `f64` times a power of two that the
//! buffer raises and lowers as its priorities move (`mass_scale.rs`), so any priority
//! from the smallest to the largest finite float keeps its ratio to the others, within
//! the span of a 64-bit sum; a positive priority never loses its mass, and nothing
//! saturates.
//!
//! How leaves are written (updates, new rows, `set_alpha`, rescales) so that each stays
//! the mass of its row's raw priority: `leaf_writes.rs`.
//!
//! Layer: algos.

use rand::distr::{Distribution, Uniform};
use rand::RngExt;

use crate::error::PriorityError;
use crate::region::Block;
use crate::rng::Rng;
use crate::sampler::mass_scale::ALPHA_MAX;
use crate::storage::layout::Global;
use crate::storage::shard::{Positions, Shard, Window};
use crate::storage::Draw;
use crate::sumtree::tree::{summit_room, Landing, Summit, Tree, SUMMIT_ENTRIES};
use crate::sync::{AtomicU64, Ordering};

/// How the priorities of one row with several values (a multi-dimensional priority
/// field, such as a trajectory's TD errors) reduce to one (TorchRL's `reduction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// The largest value (TorchRL's default).
    #[default]
    Max,
    /// The smallest value.
    Min,
    /// The mean.
    Mean,
    /// The median (the lower middle value for an even count).
    Median,
    /// The sum (TorchRL's default for a max-value writer's rank).
    Sum,
}

impl Reduction {
    /// Reduces one row's values (at least one) to a priority: NaN if any is.
    #[inline]
    pub fn reduce(self, values: &[f64]) -> f64 {
        match values {
            [one] => *one,
            _ => self.reduce_many(values),
        }
    }

    /// [`reduce`](Self::reduce), refusing a result that is no priority (finite
    /// values whose sum or mean is not: `f64::MAX` twice); `Err` holds it.
    #[inline]
    pub(crate) fn reduce_valid(self, values: &[f64]) -> Result<f64, f64> {
        let p = self.reduce(values);
        if valid(p) {
            Ok(p)
        } else {
            Err(p)
        }
    }

    fn reduce_many(self, values: &[f64]) -> f64 {
        // A NaN among them makes the row's value NaN, as a sum's does (and TorchRL's
        // `max`): `f64::max` skipped it, and a median sorted it to an end.
        if values.iter().any(|v| v.is_nan()) {
            return f64::NAN;
        }
        match self {
            Reduction::Max => values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            Reduction::Min => values.iter().copied().fold(f64::INFINITY, f64::min),
            Reduction::Mean => values.iter().sum::<f64>() / values.len() as f64,
            Reduction::Sum => values.iter().sum::<f64>(),
            Reduction::Median => {
                let mut v: smallvec::SmallVec<[f64; 16]> = values.iter().copied().collect();
                let mid = (v.len() - 1) / 2;
                *v.select_nth_unstable_by(mid, f64::total_cmp).1
            }
        }
    }

    /// Reduces one row's integer values (at least one) exactly, for an order: a
    /// mean orders as the sum does (every row has as many values).
    pub(crate) fn reduce_exact(self, values: &[i128]) -> i128 {
        match self {
            Reduction::Max => values.iter().copied().max().unwrap_or_default(),
            Reduction::Min => values.iter().copied().min().unwrap_or_default(),
            Reduction::Mean | Reduction::Sum => values.iter().sum(),
            Reduction::Median => {
                let mut v: smallvec::SmallVec<[i128; 16]> = values.iter().copied().collect();
                let mid = (v.len() - 1) / 2;
                *v.select_nth_unstable(mid).1
            }
        }
    }
}

/// Prioritized sampling (TorchRL `PrioritizedSampler`).
///
/// ```
/// use replaybuf::sampler::{Prioritized, Reduction};
/// let sampler = Prioritized::new(0.6, 0.4).eps(1e-6).reduction(Reduction::Mean);
/// # let _ = sampler;
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prioritized {
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
    pub(crate) eps: f64,
    pub(crate) max_capacity: Option<usize>,
    pub(crate) reduction: Reduction,
    pub(crate) max_priority_within_buffer: bool,
}

impl Prioritized {
    /// Sampling with exponent `alpha` (0: uniform, 1: proportional) and importance
    /// correction `beta` (0: none, 1: full); `eps` 1e-8, reduction max.
    pub fn new(alpha: f64, beta: f64) -> Self {
        Prioritized {
            alpha,
            beta,
            eps: 1e-8,
            max_capacity: None,
            reduction: Reduction::Max,
            max_priority_within_buffer: false,
        }
    }

    /// Added to every priority before `alpha`, so no row's mass is zero unless its
    /// priority is and `eps` is 0.
    pub fn eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// TorchRL's `max_capacity`: the most rows the sampler covers. The buffer's
    /// capacity must not exceed it.
    pub fn max_capacity(mut self, rows: usize) -> Self {
        self.max_capacity = Some(rows);
        self
    }

    /// How a row with several priority values reduces them to one.
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// New rows get the largest priority stored now instead of the largest ever seen.
    pub fn max_priority_within_buffer(mut self, yes: bool) -> Self {
        self.max_priority_within_buffer = yes;
        self
    }

    /// Why these settings cannot work with a storage of `capacity` rows, if they can't.
    pub(crate) fn check(&self, capacity: usize) -> Option<&'static str> {
        let ok = |x: f64| x.is_finite() && x >= 0.0;
        if !valid_alpha(self.alpha) {
            Some("alpha must be finite, at least 0 and at most 2^20")
        } else if !ok(self.beta) {
            Some("beta must be finite and at least 0")
        } else if !ok(self.eps) {
            Some("eps must be finite and at least 0")
        } else if self.max_capacity.is_some_and(|m| m < capacity) {
            Some("max_capacity is smaller than the buffer's capacity")
        } else {
            None
        }
    }
}

/// The priority every new row gets before any update: TorchRL's initial maximum.
const INITIAL_PRIORITY: f64 = 1.0;

/// A prioritized sampler with its running state, which lives in the storage's region
/// (so that every process of a shared buffer, and a checkpoint, sees the same):
/// `Global::Alpha` and `Global::Beta` as `f64` bits, `Global::MaxSeen`, the largest
/// priority seen (non-negative `f64` bits order like the floats), and
/// `Global::MassScale`, the trees' mass scale and the mass function's epoch
/// (`mass_scale::Scale`), which `leaf_writes.rs` keeps.
#[derive(Debug)]
pub(crate) struct Priorities {
    globals: Block,
    pub(super) config: Prioritized,
    pub(crate) reduction: Reduction,
}

/// Checks a priority: finite and not negative.
pub(crate) fn valid(p: f64) -> bool {
    // By the bits: below infinity's are the positive finite floats and zero; a
    // negative zero is zero too. (`is_finite() && p >= 0.0` compiled to twenty
    // instructions, and an update checks every priority.)
    let bits = p.to_bits();
    bits < f64::INFINITY.to_bits() || bits == (-0.0f64).to_bits()
}

/// Checks an alpha: a priority, and at most [`ALPHA_MAX`] (which bounds the exponent
/// a mass may need).
pub(super) fn valid_alpha(alpha: f64) -> bool {
    valid(alpha) && alpha <= ALPHA_MAX
}

impl Priorities {
    /// The state of `config` over the region's `globals`, which [`Priorities::initialize`]
    /// fills in a new region.
    pub(crate) fn new(config: Prioritized, globals: Block) -> Priorities {
        Priorities {
            globals,
            reduction: config.reduction,
            config,
        }
    }

    /// Writes the configured alpha and beta and the initial maximum into a new region.
    /// (The scale word starts at zero: priority 1 at the top of the leaves' range.)
    pub(crate) fn initialize(&self) {
        self.word(Global::Alpha)
            .store(self.config.alpha.to_bits(), Ordering::SeqCst);
        self.word(Global::Beta)
            .store(self.config.beta.to_bits(), Ordering::Relaxed);
        self.forget_seen();
    }

    #[inline]
    pub(super) fn word(&self, g: Global) -> &AtomicU64 {
        self.globals.word(g.offset())
    }

    pub(crate) fn alpha(&self) -> f64 {
        f64::from_bits(self.word(Global::Alpha).load(Ordering::SeqCst))
    }

    pub(crate) fn beta(&self) -> f64 {
        f64::from_bits(self.word(Global::Beta).load(Ordering::Relaxed))
    }

    pub(crate) fn set_beta(&self, beta: f64) -> Result<(), PriorityError> {
        if !valid(beta) {
            return Err(PriorityError::InvalidSetting {
                name: "beta",
                value: beta,
            });
        }
        self.word(Global::Beta)
            .store(beta.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// What is wrong with the region's alpha, beta and largest priority seen, if
    /// anything: words of a region opened again or attached to, which only damage
    /// (or another program) can have set out of range. An alpha of NaN turned every
    /// mass into a loop that never ended.
    pub(crate) fn damage(&self) -> Option<String> {
        let (alpha, beta) = (self.alpha(), self.beta());
        let seen = f64::from_bits(self.word(Global::MaxSeen).load(Ordering::Relaxed));
        if !valid_alpha(alpha) {
            Some(format!("alpha is {alpha}"))
        } else if !valid(beta) {
            Some(format!("beta is {beta}"))
        } else if !valid(seen) {
            Some(format!("the largest priority seen is {seen}"))
        } else {
            None
        }
    }

    /// Forgets every priority seen: new rows get the initial priority again (after
    /// the buffer is emptied).
    pub(crate) fn forget_seen(&self) {
        self.word(Global::MaxSeen)
            .store(INITIAL_PRIORITY.to_bits(), Ordering::Relaxed);
    }

    /// Records `p` as seen (for the priority of later new rows).
    ///
    /// The word compares a priority's bits, which order as the priorities do for
    /// every one but a negative zero (sign set): that is zero here, or it would pass
    /// every positive priority and stay the largest seen.
    pub(crate) fn saw(&self, p: f64) {
        let bits = p.abs().to_bits();
        // Read first: most updates see nothing new, and a read leaves the line shared
        // with the collectors that read it for every new row.
        let word = self.word(Global::MaxSeen);
        if word.load(Ordering::Relaxed) < bits {
            word.fetch_max(bits, Ordering::Relaxed);
        }
    }

    /// The priority of new rows: the largest seen, or the largest stored now (found
    /// by the max tree; with alpha 0, whose masses are all one, by a pass over every
    /// row).
    pub(crate) fn new_row_priority(&self, trees: &[Tree<'_>]) -> f64 {
        if !self.config.max_priority_within_buffer {
            return f64::from_bits(self.word(Global::MaxSeen).load(Ordering::Relaxed));
        }
        let largest = |found: Option<f64>, p: f64| Some(found.map_or(p, |a| a.max(p)));
        if self.alpha() == 0.0 {
            // Every stored row's mass is one, and the heaviest leaf says nothing of
            // the priorities (the leftmost's was taken): their largest is a pass over
            // the raw words (TorchRL keeps the raw largest for alpha 0 too).
            return trees
                .iter()
                .flat_map(|t| {
                    (0..t.layout().leaves).filter_map(move |i| {
                        let leaf = t.leaf(i);
                        (leaf.value() > 0).then(|| t.raw(i, leaf.lap())).flatten()
                    })
                })
                .fold(None, largest)
                .unwrap_or(INITIAL_PRIORITY);
        }
        trees
            .iter()
            .filter_map(|t| t.argmax().and_then(|i| t.raw(i, t.leaf(i).lap())))
            .fold(None, largest)
            .unwrap_or(INITIAL_PRIORITY)
    }

    /// The importance weight of a row of mass `m`, given the smallest mass `min`:
    /// `(min / m)^beta`, in `f32` (the weight's own precision), as
    /// [`Priorities::weigh`] gives it from the row's [`ratio`].
    pub(crate) fn weight(&self, m: u64, min: u64) -> f32 {
        crate::powers::power(f64::from(ratio(m, min)), self.beta()) as f32
    }

    /// Turns each [`ratio`] of `out` into its weight, `ratio^beta`: a batch's ratios
    /// are taken as its rows are read, their powers together after (`powers.rs`).
    pub(crate) fn weigh(&self, out: &mut [f32]) {
        crate::powers::powers_f32(out, self.beta())
    }
}

/// `min / m`, of a row of mass `m` given the smallest mass `min` (at most `m`): what
/// its importance weight is a power of (see [`Priorities::weigh`]). Normal, as
/// `powers.rs` wants: masses are at most 2^63.
pub(crate) fn ratio(m: u64, min: u64) -> f32 {
    (min as f64 / m as f64) as f32
}

/// The draws of one sample: a snapshot of the shard totals.
pub(crate) struct Masses {
    totals: smallvec::SmallVec<[u64; 8]>,
    total: u128,
}

impl Masses {
    pub(crate) fn new(trees: &[Tree<'_>]) -> Masses {
        let totals: smallvec::SmallVec<[u64; 8]> = trees.iter().map(Tree::total).collect();
        let total = totals.iter().map(|&t| u128::from(t)).sum();
        Masses { totals, total }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// A random (shard, mass within the shard) drawn in proportion to mass.
    fn target(&self, rng: &mut Rng) -> (usize, u64) {
        if self.totals.len() == 1 {
            return (0, rng.random_range(0..self.totals[0]));
        }
        let mut t = match u64::try_from(self.total) {
            Ok(total) => u128::from(rng.random_range(0..total)),
            Err(_) => rng.random_range(0..self.total),
        };
        for (k, &m) in self.totals.iter().enumerate() {
            if t < u128::from(m) {
                return (k, t as u64);
            }
            t -= u128::from(m);
        }
        let last = self.totals.iter().rposition(|&m| m > 0).unwrap_or(0);
        (last, self.totals[last].saturating_sub(1))
    }
}

/// Descents per interleaved group: enough misses in flight to hide memory latency.
const GROUP: usize = 32;

/// Shards up to which a sample reads a summit of each tree.
const SUMMIT_SHARDS: usize = 8;

/// Draws `n` rows in proportion to mass into `out`, from `masses` that are not empty
/// (`Core::draw` checks). A landing that does not name a live row becomes a draw with
/// `mass == 0`, which the read loop replaces.
pub(crate) fn draw(
    trees: &[Tree<'_>],
    shards: &[Shard],
    windows: &[Window],
    masses: &Masses,
    rng: &mut Rng,
    n: usize,
    out: &mut Vec<Draw>,
) {
    out.clear();
    let positions: smallvec::SmallVec<[Positions; 8]> = shards
        .iter()
        .zip(windows)
        .map(|(s, w)| w.positions(s.ring().steps))
        .collect();
    // Each shard's summit (`sumtree/tree.rs`), on the stack for up to
    // `SUMMIT_SHARDS` shards.
    let mut room = [0u64; SUMMIT_ENTRIES];
    let summits: smallvec::SmallVec<[Option<Summit<'_>>; SUMMIT_SHARDS]> =
        if trees.len() <= SUMMIT_SHARDS {
            room.chunks_mut(summit_room(n, trees.len()))
                .zip(trees)
                .map(|(room, tree)| tree.summit(room))
                .collect()
        } else {
            smallvec::SmallVec::new()
        };
    let landed = |k: usize, landing: &Option<Landing>| match landing {
        Some(l) => to_draw(shards, &positions, k, l.leaf, l.value, l.lap),
        None => Draw::default(),
    };
    for start in (0..n).step_by(GROUP) {
        let len = GROUP.min(n - start);
        if let [tree] = trees {
            // One shard: its targets descend in draw order, drawn by one uniform
            // distribution a group (`random_range` sets one up every draw).
            let mut group = [(0, None); GROUP];
            let one = Uniform::new(0, masses.totals[0]).expect("a drawn tree has mass");
            for (t, _) in group.iter_mut().take(len) {
                *t = one.sample(rng);
            }
            tree.descend_many(summits.first().copied().flatten(), &mut group[..len]);
            out.extend(group[..len].iter().map(|(_, l)| landed(0, l)));
            continue;
        }
        let mut targets: [(usize, u64); GROUP] = [(0, 0); GROUP];
        for t in targets.iter_mut().take(len) {
            *t = masses.target(rng);
        }
        // Descend each shard's targets together, then put them back in draw order.
        let mut hits = [(0, None); GROUP];
        for (k, tree) in trees.iter().enumerate() {
            let mine: smallvec::SmallVec<[usize; GROUP]> =
                (0..len).filter(|&g| targets[g].0 == k).collect();
            if mine.is_empty() {
                continue;
            }
            let mut group: smallvec::SmallVec<[(u64, Option<_>); GROUP]> =
                mine.iter().map(|&g| (targets[g].1, None)).collect();
            tree.descend_many(summits.get(k).copied().flatten(), &mut group);
            for (&g, (_, landing)) in mine.iter().zip(group) {
                hits[g] = (k, landing);
            }
        }
        out.extend(hits.iter().take(len).map(|(k, l)| landed(*k, l)));
    }
}

/// One fresh draw, to replace one that missed.
pub(crate) fn redraw(
    trees: &[Tree<'_>],
    shards: &[Shard],
    windows: &[Window],
    masses: &Masses,
    rng: &mut Rng,
) -> Option<Draw> {
    if masses.is_empty() {
        return None;
    }
    let (k, t) = masses.target(rng);
    let ring = shards[k].ring();
    let positions = [windows[k].positions(ring.steps)];
    Some(
        match trees[k].descend(t) {
            Some(l) => to_draw(&shards[k..=k], &positions, 0, l.leaf, l.value, l.lap),
            None => Draw::default(),
        }
        .on_shard(k),
    )
}

/// The draw of slot `leaf` of shard `k`: the live row at its position, with the
/// leaf's mass and lap (mass 0 if the position holds no live row).
fn to_draw(
    shards: &[Shard],
    positions: &[Positions],
    k: usize,
    leaf: usize,
    mass: u64,
    lap: u32,
) -> Draw {
    let ring = shards[k].ring();
    let (pos, lane) = ring.step_lane(leaf as u64);
    match positions[k].seq_at(pos) {
        Some(seq) => Draw {
            shard: k as u32,
            lane: lane as u32,
            seq,
            mass,
            lap,
        },
        None => Draw::default(),
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::valid;

    /// The bit test takes what `is_finite() && p >= 0.0` takes, and nothing else.
    #[test]
    fn a_priority_is_finite_and_not_negative() {
        let floats = [
            0.0,
            -0.0,
            f64::MIN_POSITIVE,
            f64::from_bits(1),
            -f64::from_bits(1),
            1.0,
            -1.0,
            f64::MAX,
            f64::MIN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001),
        ];
        for p in floats {
            assert_eq!(
                valid(p),
                p.is_finite() && p >= 0.0,
                "{p:?} ({:#x})",
                p.to_bits()
            );
        }
    }
}
