//! A prioritized learner's step done plainly, for `replaybuf bench` to time beside the
//! buffer's (system `plain-tree`): the work of a `sample+update` with nothing shared
//! and nothing checked, one thread, tuned as the buffer's step is.
//!
//! The rows of a workload's fields sit in one plain array ([`PlainRows`]) and their
//! masses in an unsynchronized sum tree and min tree of sixteen children a node, shaped
//! as the buffer's trees are, beside an array of raw priorities, all on huge pages as
//! the buffer's memory is. A step
//!
//! - draws the batch in proportion to mass: every descent starts at the highest level
//!   of at most [`SUMMIT_ENTRIES`] entries, by a binary search of its running totals
//!   (taken once a batch), then goes down a level at a time for the whole batch, each
//!   next node prefetched, a node's children counted with AVX2 where the CPU has it;
//! - copies the drawn rows' fields into the batch's columns, prefetching as the
//!   buffer's reads do ([`PlainRows::gather`]), and weighs each row `(min / m)^beta`,
//!   the batch's powers taken together as the buffer takes them (`powers.rs`);
//! - gives each drawn row a fresh priority, with the lines of the updates
//!   [`UPDATES_AHEAD`] on prefetched: its raw priority, its mass `(p + eps)^alpha` (the
//!   batch's powers taken together), its leaf, the sums above it, and the minimums
//!   above it while they change (a lower child lowers an entry; only a child that rose
//!   from the entry's value makes it look at all its children again).
//!
//! No stamps, laps, atomics, retries or checks: the floor of the buffer's step on this
//! machine, in the same process and the same spells.

use crate::rows::{prefetch_lines, Level, PlainRows, Shape};
use crate::{huge_pages, powers, xorshift, FreshPriorities};

/// Children of a node, as in the buffer's trees.
pub const ARITY: usize = 16;
/// Updates ahead of the one being applied whose lines have been started into L1, as the
/// buffer's updates do (`UPDATES_AHEAD` in its `update_many`).
pub const UPDATES_AHEAD: usize = 16;
/// The most entries of the level a batch's descents start from, as in the buffer's
/// samples (its `SUMMIT_ENTRIES`).
pub const SUMMIT_ENTRIES: usize = 512;
/// The most rows a plain prioritized floor holds: its masses are near 2^40 (as the
/// buffer's of a million rows are; its priorities, 1 and then [`FreshPriorities`]'
/// under 1.1, keep them under 2^41), so every running total of this many rows stays
/// under 2^63, where the AVX2 pick's signed comparison is exact.
pub const MAX_ROWS: usize = 1 << 22;

/// The plain step's state: rows, trees, and a batch's room.
pub struct PlainPrioritized {
    rows: PlainRows,
    /// The sum tree's levels, the leaves (masses) first and the root last.
    sums: Vec<Words>,
    /// The min tree's levels above the leaves (`mins[l - 1]` is level `l`).
    mins: Vec<Words>,
    /// Each row's priority as given (`f64` bits), as the buffer keeps a raw word a row
    /// beside its leaf.
    raws: Words,
    alpha: f32,
    beta: f32,
    eps: f64,
    /// Mass units per unit of `(p + eps)^alpha`.
    unit: f64,
    state: u64,
    fresh: FreshPriorities,
    /// Each draw's node on the way down, then its row.
    drawn: Vec<usize>,
    /// Each draw's mass left within its node.
    left: Vec<u64>,
    /// The running totals of the level the descents start from.
    summit: Vec<u64>,
    /// Whether the CPU has AVX2 and POPCNT, for the picks.
    avx2: bool,
    weights: Vec<f32>,
    /// The powers of an update's priorities, taken together.
    powers: Vec<f64>,
}

impl PlainPrioritized {
    /// A full buffer of `shape`'s rows, every one at priority 1 (the priority new rows
    /// of the buffer get before any update), its masses `(p + eps)^alpha` and its
    /// weights `(min / m)^beta`, as the buffer's `Prioritized::new(alpha,
    /// beta).eps(eps)` makes them.
    ///
    /// # Panics
    /// If `shape` holds no rows or more than [`MAX_ROWS`].
    pub fn new(shape: &Shape, alpha: f32, beta: f32, eps: f64) -> PlainPrioritized {
        assert!(
            (1..=MAX_ROWS).contains(&shape.capacity),
            "a plain prioritized floor of 1 to {MAX_ROWS} rows, not {}",
            shape.capacity
        );
        let mut plain = PlainPrioritized {
            rows: PlainRows::new(shape),
            sums: Vec::new(),
            mins: Vec::new(),
            raws: Words::of(&vec![1f64.to_bits(); shape.capacity]),
            alpha,
            beta,
            eps,
            // Masses near 2^40, as the buffer's of a million rows are.
            unit: (1u64 << 40) as f64,
            state: 0x9e37_79b9_7f4a_7c15,
            fresh: FreshPriorities::new(shape.batch, 5),
            drawn: vec![0; shape.batch],
            left: vec![0; shape.batch],
            summit: Vec::with_capacity(SUMMIT_ENTRIES),
            #[cfg(target_arch = "x86_64")]
            avx2: is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt"),
            #[cfg(not(target_arch = "x86_64"))]
            avx2: false,
            weights: vec![0.0; shape.batch],
            powers: Vec::with_capacity(shape.batch),
        };
        let mut level = vec![plain.mass(1.0); shape.capacity];
        let mut mins = level.clone();
        while level.len() > 1 {
            let up: Vec<u64> = level.chunks(ARITY).map(|c| c.iter().sum()).collect();
            mins = mins
                .chunks(ARITY)
                .map(|c| c.iter().copied().min().unwrap_or(u64::MAX))
                .collect();
            plain
                .sums
                .push(Words::of(&std::mem::replace(&mut level, up)));
            plain.mins.push(Words::of(&mins));
        }
        plain.sums.push(Words::of(&level));
        plain
    }

    /// The mass of priority `p`.
    fn mass(&self, p: f64) -> u64 {
        let x = powers::power(p + self.eps, f64::from(self.alpha));
        mass_in_units(x, self.unit)
    }

    /// One learner step: a prioritized sample of the batch, then fresh priorities for
    /// its rows.
    pub fn step(&mut self) {
        self.sample();
        self.update();
    }

    /// A prioritized sample of the batch into the batch's columns and weights, its
    /// picks counted with AVX2 where the CPU has it, as the buffer's are.
    pub fn sample(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            // SAFETY: `avx2` says the CPU has AVX2 and POPCNT.
            return unsafe { self.sample_avx2() };
        }
        self.sample_with(pick)
    }

    /// [`PlainPrioritized::sample`] compiled for AVX2, full nodes counted by
    /// [`pick_avx2`].
    ///
    /// # Safety
    /// The CPU has AVX2 and POPCNT.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,popcnt")]
    unsafe fn sample_avx2(&mut self) {
        self.sample_with(|kids, left| match kids.try_into() {
            // SAFETY: the caller's CPU has AVX2 and POPCNT.
            Ok(node) => unsafe { pick_avx2(node, left) },
            Err(_) => pick(kids, left),
        })
    }

    #[inline(always)]
    fn sample_with(&mut self, pick: impl Fn(&[u64], u64) -> (usize, u64)) {
        // The highest level of at most `SUMMIT_ENTRIES` entries: its running totals are
        // taken once a batch, and every descent starts there with a binary search.
        let level = self
            .sums
            .iter()
            .position(|level| level.len() <= SUMMIT_ENTRIES)
            .expect("the root's level has one entry");
        self.summit.clear();
        self.summit
            .extend(self.sums[level].iter().scan(0u64, |total, &m| {
                *total += m;
                Some(*total)
            }));
        let total = self.summit.last().copied().unwrap_or(0);
        for (left, node) in self.left.iter_mut().zip(&mut self.drawn) {
            *left = ((u128::from(xorshift(&mut self.state)) * u128::from(total)) >> 64) as u64;
            *node = self.summit.partition_point(|&t| t <= *left);
            *left -= node.checked_sub(1).map_or(0, |before| self.summit[before]);
            if let Some(below) = level.checked_sub(1) {
                prefetch_node(&self.sums[below], *node);
            }
        }
        for level in (1..=level).rev() {
            let children = &self.sums[level - 1];
            for (left, node) in self.left.iter_mut().zip(&mut self.drawn) {
                let first = *node * ARITY;
                let kids = &children[first..(first + ARITY).min(children.len())];
                let (count, before) = pick(kids, *left);
                *node = first + count.min(kids.len() - 1);
                *left -= before.min(*left);
                if level > 1 {
                    prefetch_node(&self.sums[level - 2], *node);
                }
            }
        }
        self.rows.gather(&self.drawn);
        let min = self.mins.last().map_or(0, |m| m[0]);
        for (weight, &row) in self.weights.iter_mut().zip(&self.drawn) {
            *weight = (min as f64 / self.sums[0][row] as f64) as f32;
        }
        powers::powers_f32(&mut self.weights, f64::from(self.beta));
        std::hint::black_box((self.rows.columns(), &self.weights));
    }

    /// Fresh priorities for the rows the last [`PlainPrioritized::sample`] drew (the
    /// second half of a step), timed alone where a bench has pushed the rows' lines out
    /// of the cache between the two, as a learner's passes do.
    pub fn update(&mut self) {
        let (alpha, eps, unit) = (self.alpha, self.eps, self.unit);
        let PlainPrioritized {
            fresh,
            drawn,
            sums,
            mins,
            raws,
            powers,
            ..
        } = self;
        for &row in drawn.iter().take(UPDATES_AHEAD) {
            prefetch_update(sums, mins, raws, row);
        }
        let priorities = fresh.next_batch();
        powers.clear();
        powers.extend(priorities.iter().map(|&p| p + eps));
        powers::powers(powers, f64::from(alpha));
        for (k, ((&row, &p), &x)) in drawn.iter().zip(priorities).zip(&*powers).enumerate() {
            if let Some(&ahead) = drawn.get(k + UPDATES_AHEAD) {
                prefetch_update(sums, mins, raws, ahead);
            }
            raws[row] = p.to_bits();
            let mass = mass_in_units(x, unit);
            let old = std::mem::replace(&mut sums[0][row], mass);
            let delta = mass.wrapping_sub(old);
            let mut node = row;
            for level in &mut sums[1..] {
                node /= ARITY;
                level[node] = level[node].wrapping_add(delta);
            }
            // The minimums above, while they change: a child that fell below its
            // entry lowers it; one that rose from the entry's value may have raised
            // it, and the entry is its children's minimum again.
            let (mut old, mut new, mut node) = (old, mass, row);
            for level in 1..sums.len() {
                node /= ARITY;
                let entry = mins[level - 1][node];
                let min = if new < entry {
                    new
                } else if old == entry && new > old {
                    let below = if level == 1 {
                        &sums[0]
                    } else {
                        &mins[level - 2]
                    };
                    let kids = &below[node * ARITY..((node + 1) * ARITY).min(below.len())];
                    kids.iter().copied().min().unwrap_or(u64::MAX)
                } else {
                    break;
                };
                if min == entry {
                    break;
                }
                mins[level - 1][node] = min;
                (old, new) = (entry, min);
            }
        }
    }
}

/// How many of `kids` end, in running total, at or before `left`, and the running
/// total before the child that holds it: the running totals unrolled into an array and
/// counted by a binary search without branches, as the buffer's scalar pick does.
#[inline(always)]
fn pick(kids: &[u64], left: u64) -> (usize, u64) {
    let mut totals = [u64::MAX; ARITY + 1];
    totals[0] = 0;
    for (k, &m) in kids.iter().enumerate() {
        totals[k + 1] = totals[k] + m;
    }
    let mut c = 0;
    let mut step = ARITY / 2;
    while step > 0 {
        c += if totals[c + step] <= left { step } else { 0 };
        step /= 2;
    }
    c += usize::from(totals[c + 1] <= left);
    (c, totals[c])
}

/// [`pick`] for a full node, with AVX2: four entries a register, their running totals
/// by two lane shifts and adds, each register's carried into the next by a broadcast of
/// its last lane; the count is the number of totals not past `left` (totals stay below
/// 2^63, so the signed comparison AVX2 has is exact).
///
/// # Safety
/// The CPU has AVX2 and POPCNT.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,popcnt")]
#[inline]
unsafe fn pick_avx2(kids: &[u64; ARITY], left: u64) -> (usize, u64) {
    use std::arch::x86_64::*;
    let target = _mm256_set1_epi64x(left as i64);
    let zero = _mm256_setzero_si256();
    let mut carry = zero;
    let mut totals = [0u64; ARITY + 1];
    let mut past = 0;
    for (quad, out) in kids.chunks_exact(4).zip(totals[1..].chunks_exact_mut(4)) {
        // SAFETY: `quad` is four readable `u64`s; an unaligned load.
        let v = unsafe { _mm256_loadu_si256(quad.as_ptr().cast()) };
        // Each lane plus the lane below it, then plus the two lanes below those.
        let v = _mm256_add_epi64(
            v,
            _mm256_blend_epi32::<0b0000_0011>(_mm256_permute4x64_epi64::<0b10_01_00_00>(v), zero),
        );
        let v = _mm256_add_epi64(v, _mm256_permute2x128_si256::<0x08>(v, v));
        let v = _mm256_add_epi64(v, carry);
        carry = _mm256_permute4x64_epi64::<0b11_11_11_11>(v);
        // SAFETY: `out` is four writable `u64`s; an unaligned store.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) };
        let over = _mm256_cmpgt_epi64(v, target);
        past += _mm256_movemask_pd(_mm256_castsi256_pd(over)).count_ones() as usize;
    }
    let count = ARITY - past;
    (count, totals[count])
}

/// Starts loading node `j` of `level`'s entries into L1.
fn prefetch_node(level: &[u64], j: usize) {
    let at = j * ARITY;
    prefetch_lines(
        bytemuck::cast_slice(&level[at..(at + ARITY).min(level.len())]),
        Level::L1,
    );
}

/// Starts the lines an update of `row` writes below the levels every update shares into
/// L1: its leaf, its raw word, and the sum and min entries above its leaf.
fn prefetch_update(sums: &[Words], mins: &[Words], raws: &[u64], row: usize) {
    fn word(level: &[u64], i: usize) -> &[u8] {
        bytemuck::cast_slice(&level[i..=i])
    }
    prefetch_lines(word(&sums[0], row), Level::L1);
    prefetch_lines(word(raws, row), Level::L1);
    if let (Some(sums), Some(mins)) = (sums.get(1), mins.first()) {
        prefetch_lines(word(sums, row / ARITY), Level::L1);
        prefetch_lines(word(mins, row / ARITY), Level::L1);
    }
}

/// The mass of a priority whose power `(p + eps)^alpha` is `x`: `x` in `unit`s, at
/// least one.
fn mass_in_units(x: f64, unit: f64) -> u64 {
    ((x * unit + 0.5) as u64).max(1)
}

/// `u64`s on huge pages where the kernel gives them, as the buffer's trees are
/// (random leaves of a million rows on 4 KiB pages would each miss the TLB).
struct Words {
    map: memmap2::MmapMut,
    len: usize,
}

impl Words {
    fn of(values: &[u64]) -> Words {
        let mut words = Words {
            map: huge_pages(values.len().max(1) * 8),
            len: values.len(),
        };
        words.copy_from_slice(values);
        words
    }
}

impl std::ops::Deref for Words {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        // A mapping starts on a page: aligned for `u64`s.
        bytemuck::cast_slice(&self.map[..self.len * 8])
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        bytemuck::cast_slice_mut(&mut self.map[..self.len * 8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry of both trees is the sum, or the minimum, of its children, after
    /// many steps of updates.
    fn assert_consistent(plain: &PlainPrioritized) {
        for level in 1..plain.sums.len() {
            let below = &plain.sums[level - 1];
            for (j, &sum) in plain.sums[level].iter().enumerate() {
                let kids = &below[j * ARITY..((j + 1) * ARITY).min(below.len())];
                assert_eq!(sum, kids.iter().sum::<u64>(), "sum {level}/{j}");
            }
            let below = if level == 1 {
                &plain.sums[0]
            } else {
                &plain.mins[level - 2]
            };
            for (j, &min) in plain.mins[level - 1].iter().enumerate() {
                let kids = &below[j * ARITY..((j + 1) * ARITY).min(below.len())];
                assert_eq!(Some(min), kids.iter().copied().min(), "min {level}/{j}");
            }
        }
        for (row, (&leaf, &raw)) in plain.sums[0].iter().zip(plain.raws.iter()).enumerate() {
            assert_eq!(leaf, plain.mass(f64::from_bits(raw)), "row {row}");
        }
    }

    /// The plain step of the mujoco-prioritized workload over `capacity` rows (alpha
    /// 0.6, beta 0.4, eps 1e-8).
    fn of_rows(capacity: usize) -> (Shape, PlainPrioritized) {
        let shape = crate::rows::mujoco(capacity);
        let plain = PlainPrioritized::new(&shape, 0.6, 0.4, 1e-8);
        (shape, plain)
    }

    #[test]
    fn the_plain_trees_stay_the_sums_and_minimums_of_their_leaves() {
        let (_, mut plain) = of_rows(5_000);
        assert_consistent(&plain);
        for _ in 0..40 {
            plain.step();
        }
        assert_consistent(&plain);
        // Fresh priorities in [0.1, 1.1) moved the leaves they landed on off priority 1.
        let start = plain.mass(1.0);
        assert!(plain.sums[0].iter().filter(|&&m| m != start).count() > 1_000);
        assert!(plain.weights.iter().all(|&w| w > 0.0 && w <= 1.0));
    }

    /// The AVX2 pick names the same child and total before it as the scalar one, for
    /// targets inside, on the edges of and past a node's children.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_pick_counts_as_the_scalar_pick_does() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("popcnt")) {
            return;
        }
        let mut state = 7;
        for round in 0..2_000 {
            let mut kids = [0u64; ARITY];
            for m in &mut kids {
                // Some children empty, masses up to 2^40.
                *m = match xorshift(&mut state) % 4 {
                    0 => 0,
                    _ => xorshift(&mut state) >> 24,
                };
            }
            let total: u64 = kids.iter().sum();
            let edge = kids[..(round % ARITY)].iter().sum::<u64>();
            for left in [0, edge, edge.saturating_sub(1), total / 2, total, total + 1] {
                // SAFETY: checked above that the CPU has AVX2 and POPCNT.
                let vector = unsafe { pick_avx2(&kids, left) };
                assert_eq!(vector, pick(&kids, left), "{kids:?} {left}");
            }
        }
    }

    /// The trees of 100,000 rows: descents start two levels above the leaves (at a
    /// summit of 391 entries), and updates climb three.
    #[test]
    fn deeper_plain_trees_stay_the_sums_and_minimums_of_their_leaves() {
        let (_, mut plain) = of_rows(100_000);
        for _ in 0..40 {
            plain.step();
        }
        assert_consistent(&plain);
    }

    /// Draws land in proportion to mass: a row holding half the mass gets about half
    /// the draws, whether the descents start one level above the leaves or two.
    #[test]
    fn plain_draws_follow_the_masses() {
        for (rows, heavy) in [(4_096, 1_234), (100_000, 77_777)] {
            draws_follow_the_masses(rows, heavy);
        }
    }

    fn draws_follow_the_masses(rows: usize, heavy: usize) {
        let (shape, mut plain) = of_rows(rows);
        let rest: u64 = plain.sums[0].iter().sum::<u64>() - plain.sums[0][heavy];
        let delta = rest - plain.sums[0][heavy];
        plain.sums[0][heavy] = rest;
        let mut node = heavy;
        for level in 1..plain.sums.len() {
            node /= ARITY;
            plain.sums[level][node] += delta;
        }
        let mut hits = 0;
        for _ in 0..40 {
            plain.sample();
            hits += plain.drawn.iter().filter(|&&r| r == heavy).count();
        }
        let share = hits as f64 / (40 * shape.batch) as f64;
        assert!((0.45..0.55).contains(&share), "{rows} rows: {share}");
    }
}
