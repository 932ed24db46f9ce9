//! The heap backing: an anonymous private mapping, so pages are allocated by the kernel
//! only when first written (TorchRL's `LazyTensorStorage`, without the first-extend
//! allocation spike), and read as zero until then.

use std::io;

use crate::sync::AtomicU64;

/// A zeroed region of `len` atomic words.
#[derive(Debug)]
pub(crate) struct Region {
    /// The mapping. Only ever accessed through [`Region::words`] and raw pointers taken
    /// from those words; no `&[u8]` to it is ever created, since other threads write it.
    #[cfg(not(replaybuf_loom))]
    map: memmap2::MmapRaw,
    #[cfg(replaybuf_loom)]
    words: Box<[AtomicU64]>,
    len: usize,
}

impl Region {
    /// Reserves `len` words on the heap; no page is touched until written.
    #[cfg(not(replaybuf_loom))]
    pub(crate) fn heap(len: usize) -> io::Result<Region> {
        let bytes = len
            .checked_mul(8)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "region size overflows"))?;
        let map = memmap2::MmapOptions::new()
            .len(bytes.max(8))
            .no_reserve_swap()
            .map_anon()?;
        // Random row access over hundreds of MiB misses the TLB on 4 KiB pages; huge
        // pages cut that. Best effort: a kernel without THP keeps small pages.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Region {
            map: map.into(),
            len,
        })
    }

    #[cfg(replaybuf_loom)]
    pub(crate) fn heap(len: usize) -> io::Result<Region> {
        Ok(Region {
            words: (0..len).map(|_| AtomicU64::new(0)).collect(),
            len,
        })
    }

    /// The region as atomic words.
    #[cfg(not(replaybuf_loom))]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        // SAFETY: (1) the mapping is page aligned and at least `len * 8` bytes long, so
        // it holds `len` properly aligned u64-sized cells; (2) `AtomicU64` has the size
        // and alignment of `u64` and every bit pattern is valid, including the zeroes a
        // fresh anonymous mapping reads as; (3) the mapping lives as long as `self`, and
        // all access to it goes through these atomics or the atomic row copy, never
        // through a plain reference to the bytes.
        unsafe { std::slice::from_raw_parts(self.map.as_mut_ptr().cast::<AtomicU64>(), self.len) }
    }

    #[cfg(replaybuf_loom)]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        &self.words
    }

    /// Bytes of memory this region has reserved (not all of it resident).
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.len * 8
    }
}
