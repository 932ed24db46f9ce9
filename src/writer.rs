//! Write policies and the collector's handle.

use std::ops::Range;

use smallvec::SmallVec;

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::error::DataError;
use crate::storage::geometry::Ring;
use crate::storage::plan::RowOrder;
use crate::storage::stamp::Stamp;

/// How rows enter the storage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WritePolicy {
    /// Append at the ring's cursor, evicting the oldest row of the shard (TorchRL
    /// `RoundRobinWriter`).
    #[default]
    RoundRobin,
    /// A read-only dataset (TorchRL `ImmutableDatasetWriter`): every write (`add`,
    /// `extend`, a [`Writer`]'s, `write_all`, the typed and list faces') is refused with
    /// [`DataError::Immutable`] and changes nothing. Its rows come from
    /// [`ReplayBufferBuilder::build_from`](crate::ReplayBufferBuilder::build_from).
    Immutable,
}

/// Where the rows of one `extend` went. Rows are numbered as in the extended batch.
///
/// Holds a few numbers, not a list: reading an index computes it.
#[derive(Clone, Debug)]
pub struct Written {
    /// Steps extended.
    steps: u64,
    /// How the batch's rows are ordered (`Flat` for ndim 1).
    order: RowOrder,
    /// One run per shard written: its ring, first sequence number, and the first env
    /// of the batch's env axis it took.
    runs: SmallVec<[(Ring, u64, u64); 1]>,
}

impl Written {
    pub(crate) fn new(steps: u64, order: RowOrder) -> Written {
        Written {
            steps,
            order,
            runs: SmallVec::new(),
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

    /// Rows extended.
    pub fn len(&self) -> usize {
        (self.steps * self.envs()) as usize
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

    /// The storage index of batch row `row`. Panics if `row >= self.len()`.
    pub fn index(&self, row: usize) -> u64 {
        let (ring, seq, lane) = self.locate(row);
        ring.index(seq % ring.steps, lane)
    }

    /// The write generation of batch row `row`: the generation a sampled batch reports
    /// for this row until it is overwritten or edited.
    pub fn generation(&self, row: usize) -> u64 {
        let (ring, seq, _) = self.locate(row);
        Stamp::published((seq / ring.steps) as u32, 0).generation()
    }

    /// The storage indices of all rows, in batch order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = u64> + '_ {
        (0..self.len()).map(|r| self.index(r))
    }

    /// The storage indices of all rows, in batch order.
    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }
}

/// A collector's handle, bound to one shard (see [`ReplayBuffer::writer`]).
///
/// Collectors holding handles of different shards never touch the same cache line.
#[derive(Clone, Debug)]
pub struct Writer {
    buffer: ReplayBuffer,
    shard: usize,
}

impl Writer {
    pub(crate) fn new(buffer: ReplayBuffer, shard: usize) -> Writer {
        Writer { buffer, shard }
    }

    /// The shard this handle writes.
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// The environments this handle owns on an ndim-2 storage (`None` for ndim 1).
    pub fn envs(&self) -> Option<Range<usize>> {
        let storage = &self.buffer.inner.storage;
        (storage.geometry().ndim() == 2).then(|| {
            let ring = storage.shards()[self.shard].ring();
            ring.index_offset as usize..(ring.index_offset + ring.width) as usize
        })
    }

    /// The buffer this handle writes to.
    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }

    /// Adds one transition (shape `[1]`, ndim 1) and returns its index.
    pub fn add(&self, row: &Batch) -> Result<u64, DataError> {
        self.buffer.inner.add(self.shard, row)
    }

    /// Appends a batch to this handle's shard: `[n]` for ndim 1; for ndim 2, `t` steps
    /// of this handle's environments (`[t, group]`, or `[group, t]` with
    /// `dim_extend = 1`).
    pub fn extend(&self, batch: &Batch) -> Result<Written, DataError> {
        self.buffer.inner.extend(Some(self.shard), batch)
    }
}
