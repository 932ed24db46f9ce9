//! The heap backing: an anonymous private mapping, so pages are allocated by the kernel
//! only when first written (TorchRL's `LazyTensorStorage`, without the first-extend
//! allocation spike), and read as zero until then.
//!
//! Layer: algos.

use std::io;

use super::{Backing, Region};

impl Region {
    /// Reserves `len` words on the heap; no page is touched until written.
    #[cfg(not(replaybuf_loom))]
    pub(crate) fn heap(len: usize) -> io::Result<Region> {
        let map = memmap2::MmapOptions::new()
            .len(super::bytes_of(len)?.max(8))
            .no_reserve_swap()
            .map_anon()?;
        // Random row access over hundreds of MiB misses the TLB on 4 KiB pages; huge
        // pages cut that. Best effort: a kernel without THP keeps small pages.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Region::mapped(map.into(), len, Backing::Heap))
    }

    #[cfg(replaybuf_loom)]
    pub(crate) fn heap(len: usize) -> io::Result<Region> {
        Ok(Region {
            words: (0..len).map(|_| crate::sync::AtomicU64::new(0)).collect(),
            len,
            backing: Backing::Heap,
        })
    }
}
