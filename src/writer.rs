//! Write policies and the collector's handle.
//!
//! Layer: api.

use std::ops::Range;

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::core::Core;
use crate::core::Written;
use crate::error::DataError;

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

    /// The shard this handle writes (after a swap to fewer shards, the one its shard
    /// went to: `shard % shards`).
    pub fn shard(&self) -> usize {
        self.shard_of(&self.buffer.state().core)
    }

    /// This handle's shard in the buffer state `inner`.
    fn shard_of(&self, core: &Core) -> usize {
        self.shard % core.storage.shards().len()
    }

    /// The environments this handle owns on an ndim-2 storage (`None` for ndim 1).
    pub fn envs(&self) -> Option<Range<usize>> {
        let inner = self.buffer.state();
        let storage = &inner.core.storage;
        (storage.geometry().ndim() == 2).then(|| {
            let ring = storage.shards()[self.shard_of(&inner.core)].ring();
            ring.index_offset as usize..(ring.index_offset + ring.width) as usize
        })
    }

    /// The buffer this handle writes to.
    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }

    /// Adds one transition (shape `[1]`, ndim 1) and returns its index.
    pub fn add(&self, row: &Batch) -> Result<u64, DataError> {
        self.buffer.limited_insert(
            row.len(),
            |inner| inner.precheck(Some(self.shard_of(&inner.core)), row, true),
            || {
                self.buffer
                    .retrying(|inner| inner.add(self.shard_of(&inner.core), row))
            },
        )
    }

    /// Appends a batch to this handle's shard: `[n]` for ndim 1; for ndim 2, `t` steps
    /// of this handle's environments (`[t, group]`, or `[group, t]` with
    /// `dim_extend = 1`).
    pub fn extend(&self, batch: &Batch) -> Result<Written, DataError> {
        self.buffer.limited_insert(
            batch.len(),
            |inner| inner.precheck(Some(self.shard_of(&inner.core)), batch, false),
            || {
                self.buffer
                    .retrying(|inner| inner.extend(Some(self.shard_of(&inner.core)), batch))
            },
        )
    }
}
