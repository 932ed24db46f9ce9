//! One contiguous, zero-initialised, word-aligned byte region that holds all of a
//! storage's state (see `storage/layout.rs`), seen as a slice of atomic words.
//!
//! Every backing gives the same thing: memory that reads as zero until written, that
//! only atomic word operations and the crate's atomic row copy (`storage::atomic_copy`)
//! ever touch, and that lives as long as the `Region`. The algorithms above it do not
//! know which backing they run on. The heap backing is the one loom checks: under
//! `replaybuf_loom` it is a boxed slice of loom atomics instead of a mapping.

mod heap;

use std::sync::Arc;

pub(crate) use heap::Region;

use crate::sync::AtomicU64;

/// A run of words of a shared region: what the structures beside a region (a shard's
/// cursor block, the sampler's settings) hold to reach their words. Keeps the region
/// alive.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    region: Arc<Region>,
    at: usize,
    len: usize,
}

impl Block {
    /// Words `at..at + len` of `region`. Panics if they are not all in it: blocks are
    /// laid out by the storage, never by a caller.
    pub(crate) fn new(region: &Arc<Region>, at: usize, len: usize) -> Block {
        assert!(
            at + len <= region.words().len(),
            "replaybuf internal error: a block past its region's end"
        );
        Block {
            region: region.clone(),
            at,
            len,
        }
    }

    /// Word `i` of the block.
    #[inline]
    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.len);
        &self.region.words()[self.at + i]
    }
}
