//! One contiguous, zero-initialised, word-aligned byte region that holds all of a
//! storage's state (see `storage/layout.rs`), seen as a slice of atomic words.
//!
//! Every backing gives the same thing: memory that reads as zero until written, that
//! only atomic word operations and the crate's atomic row copy (`storage::atomic_copy`)
//! ever touch, and that lives as long as the `Region`. The algorithms above it do not
//! know which backing they run on. The heap backing is the one loom checks: under
//! `replaybuf_loom` it is a boxed slice of loom atomics instead of a mapping.
//!
//! Layer: algos.

#[cfg(not(replaybuf_loom))]
mod file;
mod heap;
#[cfg(not(replaybuf_loom))]
pub(crate) mod shared;

#[cfg(not(replaybuf_loom))]
use std::io;
use std::sync::Arc;

#[cfg(not(replaybuf_loom))]
pub(crate) use file::Access;

use crate::sync::AtomicU64;

/// What memory backs a region.
#[derive(Debug)]
pub(crate) enum Backing {
    /// An anonymous mapping (or, under loom, a boxed slice).
    Heap,
    /// A mapped file, kept open.
    #[cfg(not(replaybuf_loom))]
    File {
        file: std::fs::File,
        /// Its locks' own description of it.
        lock: shared::LockFile,
    },
    /// A named shared-memory object.
    #[cfg(not(replaybuf_loom))]
    Shared {
        /// The mapped object.
        _file: std::fs::File,
        /// The liveness locks' own description of it.
        lock: shared::LockFile,
        object: String,
        /// The object `object` named when it was created or opened.
        id: shared::ObjectId,
    },
}

/// A zeroed region of atomic words.
#[derive(Debug)]
pub(crate) struct Region {
    /// The mapping. Only ever accessed through [`Region::words`] and raw pointers taken
    /// from those words; no `&[u8]` to it is ever created, since other threads (and,
    /// for shared backings, other processes) write it.
    #[cfg(not(replaybuf_loom))]
    map: memmap2::MmapRaw,
    #[cfg(replaybuf_loom)]
    words: Box<[AtomicU64]>,
    len: usize,
    #[cfg_attr(replaybuf_loom, allow(dead_code))]
    backing: Backing,
}

/// Bytes of `len` words, if the address space has them.
#[cfg(not(replaybuf_loom))]
fn bytes_of(len: usize) -> io::Result<usize> {
    len.checked_mul(8)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "region size overflows"))
}

impl Region {
    /// A region over `map`, which is at least `len` words long and page aligned.
    #[cfg(not(replaybuf_loom))]
    fn mapped(map: memmap2::MmapRaw, len: usize, backing: Backing) -> Region {
        debug_assert!(map.len() >= len * 8);
        Region { map, len, backing }
    }

    /// The region as atomic words.
    #[cfg(not(replaybuf_loom))]
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: (1) the mapping is page aligned and at least `len * 8` bytes long, so
        // it holds `len` properly aligned u64-sized cells; (2) `AtomicU64` has the size
        // and alignment of `u64` and every bit pattern is valid, including the zeroes a
        // fresh mapping reads as; (3) the mapping lives as long as `self`, and all
        // access to it goes through these atomics or the atomic row copy, never
        // through a plain reference to the bytes.
        unsafe { std::slice::from_raw_parts(self.map.as_mut_ptr().cast::<AtomicU64>(), self.len) }
    }

    #[cfg(replaybuf_loom)]
    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        &self.words
    }

    /// Bytes of memory this region has reserved (not all of it resident).
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.len * 8
    }
}

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

    /// The region the block is in.
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // for shared regions' files
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// Word `i` of the block.
    #[inline]
    pub(crate) fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.len);
        &self.region.words()[self.at + i]
    }
}
