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
//! # Memory ordering
//!
//! A leaf is a cache of its row's raw priority's mass under the buffer's mass function
//! (the scale word and `alpha`). Every writer of leaves (a collector's new rows, a
//! priority update, a pass after `set_alpha` or a rescale) reads the scale word, then
//! `alpha`, computes, writes, and reads the scale word again: if it moved, the writer
//! brings the leaves it wrote to the new function from their raw words, and repeats.
//! Whoever moves the word (storing `alpha` first) then passes over every leaf of every
//! tree. All of these are `SeqCst`, so a leaf written under an old function after the
//! pass went by belongs to a writer whose second read comes later still, and sees the
//! new word. Updates write the raw word before the leaf and follow it after (see
//! `sumtree/tree.rs`). Once writes stop, every leaf holds its raw priority's mass under
//! the last function: a collector racing `set_alpha` cannot leave a leaf of the old
//! alpha behind.

use rand::RngExt;

use crate::error::PriorityError;
use crate::region::Block;
use crate::rng::Rng;
use crate::sampler::mass_scale::{MassFn, Scale, TooHeavy, ALPHA_MAX};
use crate::storage::layout::Global;
use crate::storage::shard::{Positions, Shard, Window};
use crate::storage::Draw;
use crate::sumtree::tree::{Tree, Update};
use crate::sumtree::{priority_in, quantize, raw_bits, Leaf};
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
    /// Reduces one row's values (at least one) to a priority.
    pub fn reduce(self, values: &[f64]) -> f64 {
        if let [one] = values {
            return *one;
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
}

/// Prioritized sampling (TorchRL `PrioritizedSampler`).
///
/// ```
/// use replaybuf::{Prioritized, Reduction};
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
/// ([`Scale`]).
#[derive(Debug)]
pub(crate) struct State {
    globals: Block,
    config: Prioritized,
    pub(crate) reduction: Reduction,
}

/// Checks a priority: finite and not negative.
pub(crate) fn valid(p: f64) -> bool {
    p.is_finite() && p >= 0.0
}

/// Checks an alpha: a priority, and at most [`ALPHA_MAX`] (which bounds the exponent
/// a mass may need).
fn valid_alpha(alpha: f64) -> bool {
    valid(alpha) && alpha <= ALPHA_MAX
}

/// Leaves re-massed at once by a pass over a tree: one check of the scale word each.
const REMASS_CHUNK_LEAVES: usize = 4096;

impl State {
    /// The state of `config` over the region's `globals`, which [`State::initialize`]
    /// fills in a new region.
    pub(crate) fn new(config: Prioritized, globals: Block) -> State {
        State {
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
        self.word(Global::MaxSeen)
            .store(INITIAL_PRIORITY.to_bits(), Ordering::Relaxed);
    }

    #[inline]
    fn word(&self, g: Global) -> &AtomicU64 {
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
            return Err(PriorityError::Invalid {
                position: 0,
                value: beta,
            });
        }
        self.word(Global::Beta)
            .store(beta.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// The scale word (see the module's ordering notes).
    fn scale(&self) -> Scale {
        Scale::from_bits(self.word(Global::MassScale).load(Ordering::SeqCst))
    }

    /// Replaces the scale word `from` by `to`; whether it was still `from`.
    fn move_scale(&self, from: Scale, to: Scale) -> bool {
        self.word(Global::MassScale)
            .compare_exchange(from.bits(), to.bits(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// The mass function now, for trees like `tree` (every tree of a storage has the
    /// same bound): the scale word, then alpha.
    pub(crate) fn mass_fn(&self, tree: &Tree<'_>) -> MassFn {
        let scale = self.scale();
        MassFn::new(
            scale,
            self.alpha(),
            self.config.eps,
            tree.layout().value_max,
        )
    }

    /// Stores a new alpha and moves the scale word's epoch, then brings every leaf of
    /// `trees` to it. Even the same alpha again moves the epoch and passes over the
    /// leaves.
    pub(crate) fn set_alpha(&self, alpha: f64, trees: &[Tree<'_>]) -> Result<(), PriorityError> {
        if !valid_alpha(alpha) {
            return Err(PriorityError::Invalid {
                position: 0,
                value: alpha,
            });
        }
        // Alpha first: a writer that reads the new word reads the new alpha after it.
        self.word(Global::Alpha)
            .store(alpha.to_bits(), Ordering::SeqCst);
        loop {
            let scale = self.scale();
            if self.move_scale(scale, scale.bumped()) {
                break;
            }
        }
        self.remass(trees);
        self.raise_if_light(trees);
        Ok(())
    }

    /// Lowers the scale so that a mass `heavy` (too heavy under `f`) fits, unless
    /// another writer lowered it enough already; whether this call moved it (and so
    /// owes a pass over every leaf).
    fn lower_for(&self, f: &MassFn, heavy: TooHeavy) -> bool {
        loop {
            let now = self.scale();
            match f.lowered_for(now, heavy) {
                None => return false,
                Some(to) if self.move_scale(now, to) => return true,
                Some(_) => {}
            }
        }
    }

    /// After a write: raises the scale if the buffer's total mass has fallen below the
    /// low-water mark (see `mass_scale.rs`), and passes over every leaf if it did.
    fn raise_if_light(&self, trees: &[Tree<'_>]) {
        let Some(first) = trees.first() else {
            return;
        };
        let total: u128 = trees.iter().map(|t| u128::from(t.total())).sum();
        let f = self.mass_fn(first);
        if !f.is_light(total) {
            return;
        }
        let new_row = quantize(self.new_row_priority(trees));
        if let Some(to) = f.raised_for(total, new_row) {
            // Another writer that moved the word first decides instead.
            if self.move_scale(f.scale(), to) {
                self.remass(trees);
            }
        }
    }

    /// Brings every leaf of `trees` to the mass function now, a chunk at a time,
    /// lowering the scale for a priority too heavy for it; again from the start if this
    /// pass lowered it.
    pub(crate) fn remass(&self, trees: &[Tree<'_>]) {
        let mut again = true;
        while again {
            again = false;
            for tree in trees {
                let leaves = tree.layout().leaves;
                for first in (0..leaves).step_by(REMASS_CHUNK_LEAVES) {
                    let n = REMASS_CHUNK_LEAVES.min(leaves - first);
                    let mut f = self.mass_fn(tree);
                    loop {
                        let mut heavy = None;
                        tree.remass_run(first, n, |p| keep_heavy(&f, p, &mut heavy));
                        if let Some(h) = heavy {
                            again |= self.lower_for(&f, h);
                        } else if self.scale() == f.scale() {
                            break;
                        }
                        f = self.mass_fn(tree);
                    }
                }
            }
        }
    }

    /// After leaves were written under `f`, the heaviest of them `heaviest`: while the
    /// scale word is no longer `f`'s, brings them (`redo`, given the mass of a
    /// priority) to the function now. Then the pass a lowering owes (`owed`, or one
    /// made here), and a raise if the buffer is light: looked at only if the write
    /// could have made it so (no mass it wrote reaches the low-water mark), so that a
    /// write of ordinary masses reads no tree roots that other shards' writers change.
    fn settle(
        &self,
        trees: &[Tree<'_>],
        tree: &Tree<'_>,
        mut f: MassFn,
        heaviest: u64,
        mut owed: bool,
        mut redo: impl FnMut(&mut dyn FnMut(f64) -> Option<u64>),
    ) {
        let may_be_light = f.under_low_water(heaviest);
        let moved = self.scale() != f.scale();
        // A priority too heavy for `f` moves the word (here or in another writer),
        // so the loop goes round again.
        while self.scale() != f.scale() {
            f = self.mass_fn(tree);
            let mut heavy = None;
            redo(&mut |p| keep_heavy(&f, p, &mut heavy));
            if let Some(h) = heavy {
                owed |= self.lower_for(&f, h);
            }
        }
        if owed {
            self.remass(trees);
        }
        if may_be_light || moved {
            self.raise_if_light(trees);
        }
    }

    /// Recomputes every leaf of `trees` with plain stores, for a region nobody else
    /// uses (a recovery, a load): leaf `i` of tree `k` gets the mass of `row(k, i)`'s
    /// priority, if it holds a live row (`(lap, priority)`), and is emptied otherwise.
    /// The scale stays (so a loaded checkpoint draws as the original would), unless a
    /// priority is too heavy for it.
    pub(crate) fn rebuild(
        &self,
        trees: &[Tree<'_>],
        row: impl Fn(usize, usize) -> Option<(u32, f64)>,
    ) {
        let Some(first) = trees.first() else {
            return;
        };
        loop {
            let f = self.mass_fn(first);
            let mut heavy = None;
            for (k, tree) in trees.iter().enumerate() {
                tree.rebuild(|i| match row(k, i) {
                    Some((lap, p)) => Leaf::new(lap, keep_heavy(&f, p, &mut heavy).unwrap_or(0)),
                    None => Leaf::EMPTY,
                });
            }
            match heavy {
                None => return,
                Some(h) => {
                    self.lower_for(&f, h);
                }
            }
        }
    }

    /// Records `p` as seen (for the priority of later new rows).
    pub(crate) fn saw(&self, p: f64) {
        self.word(Global::MaxSeen)
            .fetch_max(p.to_bits(), Ordering::Relaxed);
    }

    /// The priority of new rows: the largest seen, or the largest stored now.
    pub(crate) fn new_row_priority(&self, trees: &[Tree<'_>]) -> f64 {
        if !self.config.max_priority_within_buffer {
            return f64::from_bits(self.word(Global::MaxSeen).load(Ordering::Relaxed));
        }
        trees
            .iter()
            .filter_map(|t| t.argmax().and_then(|i| t.raw(i, t.leaf(i).lap())))
            .fold(None, |acc: Option<f64>, p| {
                Some(acc.map_or(p, |a| a.max(p)))
            })
            .unwrap_or(INITIAL_PRIORITY)
    }

    /// Sets the priorities of `rows` of tree `k` (`(leaf, lap, p)` each) whose leaves
    /// and raw words still belong to rows of those laps; `applied` receives which did.
    /// Each raw word is set before its leaf; a leaf whose raw word another writer
    /// changed meanwhile follows that word, and all of them follow a mass function
    /// that changed meanwhile (see the module's ordering notes).
    pub(crate) fn update(
        &self,
        trees: &[Tree<'_>],
        k: usize,
        rows: &[(usize, u32, f64)],
        applied: &mut [bool],
    ) {
        if let Some(top) = rows.iter().map(|&(_, _, p)| p).reduce(f64::max) {
            self.saw(top);
        }
        let tree = &trees[k];
        let mut owed = false;
        let mut items: Vec<Update> = Vec::with_capacity(rows.len());
        let mut heaviest = 0;
        let f = loop {
            let f = self.mass_fn(tree);
            let mut heavy = None;
            items.clear();
            items.extend(rows.iter().map(|&(leaf, lap, p)| {
                // The mass of the priority as the raw word keeps it.
                let raw = raw_bits(lap, Some(p));
                let mass = keep_heavy(&f, priority_in(raw), &mut heavy).unwrap_or(0);
                heaviest = heaviest.max(mass);
                Update {
                    leaf,
                    lap,
                    mass,
                    raw,
                }
            }));
            match heavy {
                None => break f,
                Some(h) => owed |= self.lower_for(&f, h),
            }
        };
        for leaf in tree.update_many(&items, applied) {
            // Another writer's raw word: this leaf follows it.
            tree.remass_run(leaf, 1, |p| f.mass(p).ok());
        }
        let applied_items = || items.iter().zip(applied.iter()).filter(|(_, &a)| a);
        self.settle(trees, tree, f, heaviest, owed, |mass_of| {
            for (u, _) in applied_items() {
                tree.remass_run(u.leaf, 1, &mut *mass_of);
            }
        });
    }

    /// Gives the new rows of runs `(first slot, slots, lap)` of tree `k` their leaves
    /// (their raw words are stored already): slot `j` of run `r` priority `each(r, j)`,
    /// or every one `top` without `each`. `top` is at least every priority.
    pub(crate) fn set_leaves(
        &self,
        trees: &[Tree<'_>],
        k: usize,
        runs: &[(usize, usize, u32)],
        top: f64,
        each: Option<impl Fn(usize, usize) -> f64>,
    ) {
        let tree = &trees[k];
        let mut owed = false;
        let (f, heaviest) = loop {
            let f = self.mass_fn(tree);
            match f.mass(quantize(top)) {
                Ok(m) => break (f, m),
                Err(h) => owed |= self.lower_for(&f, h),
            }
        };
        for (r, &(first, n, lap)) in runs.iter().enumerate() {
            match &each {
                // Masses grow with priorities: none passes the heaviest's.
                Some(each) => tree.set_run(first, n, |j| {
                    let m = f.mass(quantize(each(r, j)));
                    Leaf::new(lap, m.map_or(heaviest, |m| m.min(heaviest)))
                }),
                None => {
                    let leaf = Leaf::new(lap, heaviest);
                    tree.set_run(first, n, |_| leaf)
                }
            }
        }
        self.settle(trees, tree, f, heaviest, owed, |mass_of| {
            for &(first, n, _) in runs {
                tree.remass_run(first, n, &mut *mass_of);
            }
        });
    }

    /// The importance weight of a row of mass `m`, given the smallest mass `min`:
    /// `(min / m)^beta`, in `f32` (the weight's own precision).
    pub(crate) fn weight(&self, m: u64, min: u64) -> f32 {
        (min as f32 / m as f32).powf(self.beta() as f32)
    }
}

/// The mass of `p` under `f`, or `None` (and the heaviest such priority kept in
/// `heavy`) if it is too heavy for `f`'s scale.
fn keep_heavy(f: &MassFn, p: f64, heavy: &mut Option<TooHeavy>) -> Option<u64> {
    match f.mass(p) {
        Ok(m) => Some(m),
        Err(h) => {
            if heavy.is_none_or(|k| k.0 < h.0) {
                *heavy = Some(h);
            }
            None
        }
    }
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

/// Draws `n` rows in proportion to mass into `out`. A landing that does not name a
/// live row becomes a draw with `mass == 0`, which the read loop replaces.
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
    for start in (0..n).step_by(GROUP) {
        let len = GROUP.min(n - start);
        let mut targets: [(usize, u64); GROUP] = [(0, 0); GROUP];
        for t in targets.iter_mut().take(len) {
            *t = masses.target(rng);
        }
        // Descend each shard's targets together, then put them back in draw order.
        let mut hits = [None; GROUP];
        for (k, tree) in trees.iter().enumerate() {
            let mine: smallvec::SmallVec<[usize; GROUP]> =
                (0..len).filter(|&g| targets[g].0 == k).collect();
            if mine.is_empty() {
                continue;
            }
            let mut group: smallvec::SmallVec<[(u64, Option<_>); GROUP]> =
                mine.iter().map(|&g| (targets[g].1, None)).collect();
            tree.descend_many(&mut group);
            for (&g, (_, landing)) in mine.iter().zip(group) {
                hits[g] = landing.map(|l| (k, l));
            }
        }
        out.extend(hits.iter().take(len).map(|l| match l {
            Some((k, l)) => to_draw(shards, &positions, *k, l.leaf, l.value, l.lap),
            None => Draw::default(),
        }));
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
    let (pos, lane) = match ring.width {
        1 => (leaf as u64, 0),
        w => (leaf as u64 / w, leaf as u64 % w),
    };
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
