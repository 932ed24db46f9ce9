//! The locked twin of the concurrent trees: the leaves in a `Mutex<Vec<_>>`, every
//! total, minimum, maximum and descent recomputed from scratch by a plain scan. The
//! property tests and the fuzz target drive it beside the concurrent trees with the same
//! operations and compare every answer (arc-swap keeps a locked strategy for the same
//! cross-checking).

use super::Leaf;
use crate::sync::Mutex;

/// A sum, min and max "tree" that is just a locked list of leaves.
#[derive(Debug)]
pub struct ReferenceTree {
    leaves: Mutex<Vec<(Leaf, f64)>>,
}

impl ReferenceTree {
    /// `n` empty leaves.
    pub fn new(n: usize) -> Self {
        ReferenceTree {
            leaves: Mutex::new(vec![(Leaf::EMPTY, 0.0); n]),
        }
    }

    /// Gives slots `first..` new rows' leaves, except where a slot's leaf belongs to a
    /// newer row (its tag is ahead, counting laps with wrap-around).
    pub fn set_run(&self, first: usize, leaves: &[(Leaf, f64)]) {
        let mut stored = self.leaves.lock();
        for (slot, &new) in stored[first..first + leaves.len()].iter_mut().zip(leaves) {
            let newer =
                slot.0 != Leaf::EMPTY && (slot.0.tag().wrapping_sub(new.0.tag()) as i16) > 0;
            if !newer {
                *slot = new;
            }
        }
    }

    /// Sets slot `i`'s mass if its leaf belongs to lap `lap`; whether it did.
    pub fn update(&self, i: usize, lap: u32, value: u64, raw: f64) -> bool {
        let mut leaves = self.leaves.lock();
        let ok = leaves[i].0.is_of(lap);
        if ok {
            leaves[i] = (Leaf::new(lap, value), raw);
        }
        ok
    }

    /// Takes slot `i`'s mass away if its tag is `tag`.
    pub fn clear(&self, i: usize, tag: u16) {
        let mut leaves = self.leaves.lock();
        if leaves[i].0.tag() == tag {
            leaves[i].0 = Leaf::new(u32::from(tag), 0);
        }
    }

    /// The leaf of slot `i` and its raw priority.
    pub fn leaf(&self, i: usize) -> (Leaf, f64) {
        self.leaves.lock()[i]
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
