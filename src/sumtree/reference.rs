//! The locked twin of the concurrent trees: the leaves in a `Mutex<Vec<_>>`, every
//! total, minimum, maximum and descent recomputed from scratch by a plain scan. The
//! property tests and the fuzz target drive it beside the concurrent trees with the same
//! operations and compare every answer (arc-swap keeps a locked strategy for the same
//! cross-checking).
//!
//! Layer: algos.

use super::{quantize, Leaf};
use crate::sync::Mutex;

/// A sum, min and max "tree" that is just a locked list of leaves, each with its raw
/// priority as a raw word keeps it (`None` once cleared).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
#[derive(Debug)]
pub struct ReferenceTree {
    leaves: Mutex<Vec<(Leaf, Option<f64>)>>,
}

#[cfg_attr(not(feature = "internals"), allow(dead_code))]
impl ReferenceTree {
    /// `n` empty leaves.
    pub fn new(n: usize) -> Self {
        ReferenceTree {
            leaves: Mutex::new(vec![(Leaf::EMPTY, None); n]),
        }
    }

    /// Gives slots `first..` new rows' leaves, except where a slot's leaf belongs to a
    /// newer row (its lap is ahead, counting laps with wrap-around).
    pub fn set_run(&self, first: usize, leaves: &[(Leaf, f64)]) {
        let mut stored = self.leaves.lock();
        for (slot, &(leaf, raw)) in stored[first..first + leaves.len()].iter_mut().zip(leaves) {
            let newer = slot.0 != Leaf::EMPTY && (slot.0.lap().wrapping_sub(leaf.lap()) as i32) > 0;
            if !newer {
                *slot = (leaf, Some(quantize(raw)));
            }
        }
    }

    /// Sets slot `i`'s mass if it holds the row of lap `lap` and was not cleared;
    /// whether it did.
    pub fn update(&self, i: usize, lap: u32, value: u64, raw: f64) -> bool {
        let mut leaves = self.leaves.lock();
        let ok = leaves[i].0.is_of(lap) && leaves[i].1.is_some();
        if ok {
            leaves[i] = (Leaf::new(lap, value), Some(quantize(raw)));
        }
        ok
    }

    /// Empties slot `i` if it holds the row of lap `lap`.
    pub fn clear(&self, i: usize, lap: u32) {
        let mut leaves = self.leaves.lock();
        if leaves[i].0.is_of(lap) {
            leaves[i] = (Leaf::new(lap, 0), None);
        }
    }

    /// The leaf of slot `i` and its raw priority (0 for none).
    pub fn leaf(&self, i: usize) -> (Leaf, f64) {
        let (leaf, raw) = self.leaves.lock()[i];
        (leaf, raw.unwrap_or(0.0))
    }

    /// The sum of all masses.
    pub fn total(&self) -> u64 {
        self.leaves.lock().iter().map(|(l, _)| l.value()).sum()
    }

    /// The smallest non-zero mass, or `u64::MAX`.
    pub fn min(&self) -> u64 {
        let leaves = self.leaves.lock();
        leaves
            .iter()
            .map(|(l, _)| l.value())
            .filter(|&v| v > 0)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// The largest mass, or 0.
    pub fn max(&self) -> u64 {
        self.leaves
            .lock()
            .iter()
            .map(|(l, _)| l.value())
            .max()
            .unwrap_or(0)
    }

    /// The slot holding mass `t`, counting left to right, or `None` past the total.
    pub fn descend(&self, mut t: u64) -> Option<usize> {
        for (i, (l, _)) in self.leaves.lock().iter().enumerate() {
            if t < l.value() {
                return Some(i);
            }
            t -= l.value();
        }
        None
    }
}
