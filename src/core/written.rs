//! [`Written`]: where the rows of one extend went.
//!
//! Layer: core.

use crate::storage::geometry::Ring;
use crate::storage::plan::RowOrder;
use crate::storage::stamp::Stamp;
use smallvec::SmallVec;

/// Where the rows of one `extend` went. Rows are numbered as in the extended batch.
///
/// Holds a few numbers, not a list: reading an index computes it. A max-value writer
/// places rows one by one and may reject some: its `Written` lists them, and a rejected
/// row reads as index `u64::MAX` and generation 0 (as a slice batch's padding rows do).
#[derive(Clone, Debug)]
pub struct Written {
    /// Steps extended.
    steps: u64,
    /// How the batch's rows are ordered (`Flat` for ndim 1).
    order: RowOrder,
    /// One run per shard written: its ring, first sequence number, and the first env
    /// of the batch's env axis it took.
    runs: SmallVec<[(Ring, u64, u64); 1]>,
    /// Rows placed one by one (a max-value writer): each row's index and generation,
    /// `None` if rejected. When set, `runs` is empty.
    placed: Option<Box<[Placed]>>,
}

/// Where a max-value writer put one row: `(index, generation)`, `None` if rejected.
pub(crate) type Placed = Option<(u64, u64)>;

impl Written {
    pub(crate) fn new(steps: u64, order: RowOrder) -> Written {
        Written {
            steps,
            order,
            runs: SmallVec::new(),
            placed: None,
        }
    }

    /// Rows placed one by one: `(index, generation)` per row, `None` if rejected.
    pub(crate) fn placed(rows: Box<[Placed]>) -> Written {
        Written {
            steps: rows.len() as u64,
            order: RowOrder::Flat,
            runs: SmallVec::new(),
            placed: Some(rows),
        }
    }

    pub(crate) fn push(&mut self, ring: Ring, first_seq: u64, env0: u64) {
        self.runs.push((ring, first_seq, env0));
    }

    fn envs(&self) -> u64 {
        match self.order {
            RowOrder::Flat => 1,
            _ => self.runs.iter().map(|(ring, _, _)| ring.width).sum(),
        }
    }

    /// Rows extended (rejected ones included).
    pub fn len(&self) -> usize {
        (self.steps * self.envs()) as usize
    }

    /// Whether the write policy rejected batch row `row` (a max-value writer keeps
    /// only rows that rank high enough). Panics if `row >= self.len()`.
    pub fn is_rejected(&self, row: usize) -> bool {
        self.stored(row).is_none()
    }

    /// The batch rows the write policy rejected, in order.
    pub fn rejected(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&r| self.is_rejected(r))
    }

    /// Rows stored (not rejected).
    pub fn accepted(&self) -> usize {
        match &self.placed {
            Some(placed) => placed.iter().filter(|p| p.is_some()).count(),
            None => self.len(),
        }
    }

    /// The storage index of batch row `row`, or `None` if it was rejected. Panics if
    /// `row >= self.len()`.
    pub fn get(&self, row: usize) -> Option<u64> {
        self.stored(row).map(|(index, _)| index)
    }

    /// Where row `row` went: `(index, generation)`, `None` if rejected.
    fn stored(&self, row: usize) -> Option<(u64, u64)> {
        if let Some(placed) = &self.placed {
            assert!(
                row < placed.len(),
                "row {row} of an extend of {} rows",
                placed.len()
            );
            return placed[row];
        }
        let (ring, seq, lane) = self.locate(row);
        Some((
            ring.index(ring.pos(seq), lane),
            Stamp::published(ring.lap(seq), 0).generation(),
        ))
    }

    /// Whether the extend was empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ring, sequence number and lane of batch row `row`.
    fn locate(&self, row: usize) -> (Ring, u64, u64) {
        assert!(
            row < self.len(),
            "row {row} of an extend of {} rows",
            self.len()
        );
        let row = row as u64;
        let (step, env) = match self.order {
            RowOrder::Flat => (row, 0),
            RowOrder::TimeMajor { .. } => (row / self.envs(), row % self.envs()),
            RowOrder::EnvMajor { .. } => (row % self.steps, row / self.steps),
        };
        let &(ring, first, env0) = self
            .runs
            .iter()
            .find(|(ring, _, env0)| (*env0..env0 + ring.width).contains(&env))
            .expect("replaybuf internal error: an extended env has no run");
        (ring, first + step, env - env0)
    }

    /// The storage index of batch row `row` (`u64::MAX` if it was rejected). Panics if
    /// `row >= self.len()`.
    pub fn index(&self, row: usize) -> u64 {
        self.stored(row).map_or(u64::MAX, |(index, _)| index)
    }

    /// The write generation of batch row `row`: the generation a sampled batch reports
    /// for this row until it is overwritten or edited (0 if it was rejected).
    pub fn generation(&self, row: usize) -> u64 {
        self.stored(row).map_or(0, |(_, generation)| generation)
    }

    /// The storage indices of all rows, in batch order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        (0..self.len()).map(|r| self.index(r))
    }

    /// The storage indices of all rows, in batch order.
    pub fn to_vec(&self) -> Vec<u64> {
        match (&self.placed, self.order, self.runs.as_slice()) {
            // One ndim-1 run, the common extend: walk the ring rather than divide per
            // row, which `index` must.
            (None, RowOrder::Flat, &[(ring, first, _)]) => {
                let mut pos = ring.pos(first);
                (0..self.steps)
                    .map(|_| {
                        let index = ring.index(pos, 0);
                        pos += 1;
                        if pos == ring.steps {
                            pos = 0;
                        }
                        index
                    })
                    .collect()
            }
            _ => self.iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_vec_walks_the_ring_as_index_computes_it() {
        let ring = Ring::new(7, 1, 0, 3, 1);
        // First sequence numbers that start mid-ring, at a wrap, and laps in; batches
        // shorter than, as long as and longer than the ring.
        for first in [0, 5, 6, 7, 20] {
            for steps in [0, 1, 3, 7, 16] {
                let mut written = Written::new(steps, RowOrder::Flat);
                written.push(ring, first, 0);
                let by_row: Vec<u64> = (0..written.len()).map(|r| written.index(r)).collect();
                assert_eq!(written.to_vec(), by_row, "first {first}, steps {steps}");
            }
        }
    }
}
