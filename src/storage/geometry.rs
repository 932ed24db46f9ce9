//! Where each storage position lives: which shard, which step of its ring, which lane.
//!
//! - **ndim 1**, capacity `C` in `S` shards: shard `k` is a ring of `C / S` steps (the
//!   first `C % S` shards one more), one row per step, holding the storage positions
//!   `[start_k, start_k + steps_k)`. Storage order is shard order.
//! - **ndim 2**, shape `[T, E]` in `S` shards: the `E` environments are split into `S`
//!   contiguous groups; shard `k` is a ring of `T` steps, each step holding one row per
//!   environment of its group (its lanes). Position `(t, e)` has index `t * E + e`, as
//!   in TorchRL's row-major `[T, E]` storage, so every environment's column stays one
//!   trajectory in time order however many collectors write.
//!
//! In memory each shard's slots are contiguous: step after step, lanes side by side.
//!
//! Layer: algos.

use strength_reduce::StrengthReducedU64;
/// `total` items split into `parts` contiguous near-equal parts (the first
/// `total % parts` parts one larger).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ShardSplit {
    parts: u64,
    base: u64,
    extra: u64,
}

impl ShardSplit {
    pub(crate) fn new(total: u64, parts: u64) -> ShardSplit {
        debug_assert!(parts >= 1 && parts <= total);
        ShardSplit {
            parts,
            base: total / parts,
            extra: total % parts,
        }
    }

    pub(crate) fn len(&self, k: u64) -> u64 {
        self.base + u64::from(k < self.extra)
    }

    pub(crate) fn start(&self, k: u64) -> u64 {
        k * self.base + k.min(self.extra)
    }

    /// The part holding item `x`, and `x`'s offset inside it.
    #[inline]
    pub(crate) fn locate(&self, x: u64) -> (u64, u64) {
        if self.parts == 1 {
            return (0, x);
        }
        let big = self.extra * (self.base + 1);
        if x < big {
            (x / (self.base + 1), x % (self.base + 1))
        } else {
            let k = self.extra + (x - big) / self.base;
            (k, x - self.start(k))
        }
    }

    pub(crate) fn parts(&self) -> u64 {
        self.parts
    }
}

/// The shape of the whole storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Geometry {
    /// ndim 1: `capacity` positions split across shards.
    Flat { capacity: u64, split: ShardSplit },
    /// ndim 2: `[steps, envs]`, environments split across shards.
    Grid {
        steps: u64,
        envs: u64,
        split: ShardSplit,
    },
}

/// One shard's ring, as the geometry gives it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ring {
    /// Steps in the ring.
    pub(crate) steps: u64,
    /// `steps` as a divisor by multiplication: a sample splits every drawn sequence
    /// number into position and lap, and a 64-bit `div` there was a fifth of its time.
    by_steps: StrengthReducedU64,
    /// Rows per step (1 for ndim 1; the environments of the group for ndim 2).
    pub(crate) width: u64,
    /// The shard's first slot in the region.
    pub(crate) first_slot: u64,
    /// Index of a row: `pos * index_stride + index_offset + lane`.
    pub(crate) index_stride: u64,
    pub(crate) index_offset: u64,
}

impl Ring {
    pub(crate) fn new(
        steps: u64,
        width: u64,
        first_slot: u64,
        index_stride: u64,
        index_offset: u64,
    ) -> Ring {
        Ring {
            steps,
            // An empty ring divides nothing; 1 keeps the divisor valid.
            by_steps: StrengthReducedU64::new(steps.max(1)),
            width,
            first_slot,
            index_stride,
            index_offset,
        }
    }

    /// The ring position of sequence number `seq`: `seq % steps`.
    #[inline]
    pub(crate) fn pos(&self, seq: u64) -> u64 {
        seq % self.by_steps
    }

    /// The lap of sequence number `seq`, as stamps hold it: `seq / steps`, wrapping.
    #[inline]
    pub(crate) fn lap(&self, seq: u64) -> u32 {
        (seq / self.by_steps) as u32
    }

    /// [`Ring::pos`] and [`Ring::lap`] at once.
    #[inline]
    pub(crate) fn pos_lap(&self, seq: u64) -> (u64, u32) {
        let (lap, pos) = StrengthReducedU64::div_rem(seq, self.by_steps);
        (pos, lap as u32)
    }

    /// Row `r` of the ring, counted a step at a time (`width` rows a step), as its
    /// step and lane. A flat ring's row is its step: no division.
    #[inline]
    pub(crate) fn step_lane(&self, r: u64) -> (u64, u64) {
        match self.width {
            1 => (r, 0),
            w => (r / w, r % w),
        }
    }

    #[inline]
    pub(crate) fn slot(&self, pos: u64, lane: u64) -> u64 {
        self.first_slot + pos * self.width + lane
    }

    #[inline]
    pub(crate) fn index(&self, pos: u64, lane: u64) -> u64 {
        pos * self.index_stride + self.index_offset + lane
    }
}

impl Geometry {
    pub(crate) fn flat(capacity: u64, shards: u64) -> Geometry {
        Geometry::Flat {
            capacity,
            split: ShardSplit::new(capacity, shards),
        }
    }

    pub(crate) fn grid(steps: u64, envs: u64, shards: u64) -> Geometry {
        Geometry::Grid {
            steps,
            envs,
            split: ShardSplit::new(envs, shards),
        }
    }

    pub(crate) fn shards(&self) -> u64 {
        match self {
            Geometry::Flat { split, .. } | Geometry::Grid { split, .. } => split.parts(),
        }
    }

    /// Positions in the storage.
    pub(crate) fn capacity(&self) -> u64 {
        match *self {
            Geometry::Flat { capacity, .. } => capacity,
            Geometry::Grid { steps, envs, .. } => steps * envs,
        }
    }

    pub(crate) fn ndim(&self) -> usize {
        match self {
            Geometry::Flat { .. } => 1,
            Geometry::Grid { .. } => 2,
        }
    }

    pub(crate) fn ring(&self, k: u64) -> Ring {
        match *self {
            Geometry::Flat { split, .. } => {
                Ring::new(split.len(k), 1, split.start(k), 1, split.start(k))
            }
            Geometry::Grid { steps, envs, split } => Ring::new(
                steps,
                split.len(k),
                steps * split.start(k),
                envs,
                split.start(k),
            ),
        }
    }

    /// The shard, ring position and lane of storage index `index`, or `None` if it is
    /// out of range.
    #[inline]
    pub(crate) fn locate(&self, index: u64) -> Option<(u64, u64, u64)> {
        if index >= self.capacity() {
            return None;
        }
        Some(match *self {
            Geometry::Flat { split, .. } => {
                let (k, pos) = split.locate(index);
                (k, pos, 0)
            }
            Geometry::Grid { envs, split, .. } => {
                let (k, lane) = split.locate(index % envs);
                (k, index / envs, lane)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_locates_every_item() {
        for total in 1..40 {
            for parts in 1..=total.min(9) {
                let s = ShardSplit::new(total, parts);
                let mut seen = 0;
                for k in 0..parts {
                    assert_eq!(s.start(k), seen);
                    for off in 0..s.len(k) {
                        assert_eq!(s.locate(seen + off), (k, off));
                    }
                    seen += s.len(k);
                }
                assert_eq!(seen, total);
            }
        }
    }

    #[test]
    fn every_index_maps_to_one_slot_and_back() {
        for g in [
            Geometry::flat(10, 4),
            Geometry::flat(7, 1),
            Geometry::grid(5, 6, 4),
            Geometry::grid(3, 2, 2),
        ] {
            let mut slots = std::collections::HashSet::new();
            for index in 0..g.capacity() {
                let (k, pos, lane) = g.locate(index).unwrap();
                let ring = g.ring(k);
                assert!(pos < ring.steps && lane < ring.width);
                assert_eq!(ring.index(pos, lane), index);
                assert!(slots.insert(ring.slot(pos, lane)));
            }
            assert_eq!(slots.len() as u64, g.capacity());
            assert!(slots.iter().all(|&s| s < g.capacity()));
            assert_eq!(g.locate(g.capacity()), None);
        }
    }
}
