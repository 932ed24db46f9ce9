//! A prioritized learner's step done plainly, for `replaybuf bench` to time beside the
//! buffer's (system `plain-tree`): the work of a `sample+update` with nothing shared
//! and nothing checked, one thread.
//!
//! The rows of a workload's fields sit in one plain array ([`PlainRows`]) and their
//! masses in an unsynchronized sum tree and min tree of sixteen children a node, shaped
//! as the buffer's trees are, all on huge pages as the buffer's memory is. A step draws
//! the batch in proportion to mass, every descent from the root a level at a time with
//! each next node (and, last, each row) prefetched, as the buffer's descents run;
//! copies each drawn row's fields into the batch's columns (inline moves by the field's
//! length, a field at a time); weighs it `(min / m)^beta`; then gives each drawn row a
//! fresh priority: its mass `(p + eps)^alpha` as an `f32` power, its leaf, the sums
//! above it, and the minimums above it while they change.
//!
//! No stamps, laps, atomics, retries or checks; but none of the buffer's tuning either
//! (its picks count a node's children with vector instructions, its descents start
//! below a summit read once a batch, its reads copy a block of rows at once, and its
//! updates prefetch their lines). So it is a baseline, not a floor: it says what the
//! step costs written the plain way, as a segment-tree buffer without a server or a
//! lock would write it.

use crate::bench::{floor_memory, xorshift, FreshPriorities};
use crate::plain_rows::{prefetch_lines, Level, PlainRows};
use crate::workloads::Workload;

/// Children of a node, as in the buffer's trees.
const ARITY: usize = 16;

/// The plain step's state: rows, trees, and a batch's room.
pub struct PlainPrioritized {
    rows: PlainRows,
    /// The sum tree's levels, the leaves (masses) first and the root last.
    sums: Vec<Words>,
    /// The min tree's levels above the leaves (`mins[l - 1]` is level `l`).
    mins: Vec<Words>,
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
    weights: Vec<f32>,
}

impl PlainPrioritized {
    /// A full buffer of `w`'s rows, every one at priority 1 (the priority new rows of the
    /// buffer get before any update), with the sampler's settings of
    /// [`Workload::builder`] (alpha 0.6, beta 0.4, eps 1e-8).
    pub fn new(w: Workload) -> PlainPrioritized {
        let mut plain = PlainPrioritized {
            rows: PlainRows::new(w),
            sums: Vec::new(),
            mins: Vec::new(),
            alpha: 0.6,
            beta: 0.4,
            eps: 1e-8,
            // Masses near 2^40, as the buffer's of a million rows are.
            unit: (1u64 << 40) as f64,
            state: 0x9e37_79b9_7f4a_7c15,
            fresh: FreshPriorities::new(w.batch, 5),
            drawn: vec![0; w.batch],
            left: vec![0; w.batch],
            weights: vec![0.0; w.batch],
        };
        let mut level = vec![plain.mass(1.0); w.capacity];
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
        mass_of(p, self.alpha, self.eps, self.unit)
    }

    /// One learner step: a prioritized sample of the batch, then fresh priorities for
    /// its rows.
    pub fn step(&mut self) {
        self.sample();
        self.update();
    }

    fn sample(&mut self) {
        let root = self.sums.len() - 1;
        let total = self.sums[root][0];
        for (left, node) in self.left.iter_mut().zip(&mut self.drawn) {
            *left = ((u128::from(xorshift(&mut self.state)) * u128::from(total)) >> 64) as u64;
            *node = 0;
        }
        for level in (1..=root).rev() {
            let children = &self.sums[level - 1];
            for (left, node) in self.left.iter_mut().zip(&mut self.drawn) {
                let first = *node * ARITY;
                let kids = &children[first..(first + ARITY).min(children.len())];
                // The children whose running total ends at or before `left`, and the
                // mass before the one holding it.
                let (mut total, mut before, mut count) = (0u64, 0u64, 0usize);
                for &m in kids {
                    total += m;
                    let past = total <= *left;
                    count += usize::from(past);
                    before = if past { total } else { before };
                }
                *node = first + count.min(kids.len() - 1);
                *left -= before.min(*left);
                match level {
                    1 => prefetch_lines(self.rows.row(*node), Level::L1),
                    _ => {
                        let below = &self.sums[level - 2];
                        let at = *node * ARITY;
                        prefetch_lines(
                            bytemuck::cast_slice(&below[at..(at + ARITY).min(below.len())]),
                            Level::L1,
                        );
                    }
                }
            }
        }
        let min = self.mins.last().map_or(0, |m| m[0]);
        for (k, &row) in self.drawn.iter().enumerate() {
            self.rows.copy(k, row);
            self.weights[k] = (min as f32 / self.sums[0][row] as f32).powf(self.beta);
        }
        std::hint::black_box((self.rows.columns(), &self.weights));
    }

    fn update(&mut self) {
        let (alpha, eps, unit) = (self.alpha, self.eps, self.unit);
        let PlainPrioritized {
            fresh,
            drawn,
            sums,
            mins,
            ..
        } = self;
        for (&row, &p) in drawn.iter().zip(fresh.next()) {
            let mass = mass_of(p, alpha, eps, unit);
            let delta = mass.wrapping_sub(sums[0][row]);
            sums[0][row] = mass;
            let mut node = row;
            let mut min_moves = true;
            for level in 1..sums.len() {
                node /= ARITY;
                sums[level][node] = sums[level][node].wrapping_add(delta);
                if min_moves {
                    let below = if level == 1 {
                        &sums[0]
                    } else {
                        &mins[level - 2]
                    };
                    let kids = &below[node * ARITY..((node + 1) * ARITY).min(below.len())];
                    let min = kids.iter().copied().min().unwrap_or(u64::MAX);
                    let entry = &mut mins[level - 1][node];
                    min_moves = *entry != min;
                    *entry = min;
                }
            }
        }
    }
}

/// The mass of priority `p`: `(p + eps)^alpha` as an `f32` power, in `unit`s, at least
/// one.
fn mass_of(p: f64, alpha: f32, eps: f64, unit: f64) -> u64 {
    let x = f64::from(((p + eps) as f32).powf(alpha));
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
            map: floor_memory(values.len().max(1) * 8),
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
    }

    /// The plain step of the mujoco-prioritized workload over `capacity` rows.
    fn of_rows(capacity: usize) -> (Workload, PlainPrioritized) {
        let w = Workload {
            capacity,
            ..Workload::mujoco_prioritized(true)
        };
        (w, PlainPrioritized::new(w))
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

    /// Draws land in proportion to mass: a row holding half the mass gets about half
    /// the draws.
    #[test]
    fn plain_draws_follow_the_masses() {
        let (w, mut plain) = of_rows(4_096);
        let heavy = 1_234;
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
        let share = hits as f64 / (40 * w.batch) as f64;
        assert!((0.45..0.55).contains(&share), "{share}");
    }
}
