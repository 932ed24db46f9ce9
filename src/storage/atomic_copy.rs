//! Copying bytes between shared slot memory and private buffers without a data race.
//!
//! A reader may copy a row while a writer that lapped it overwrites the same bytes. The
//! stamp protocol (`stamp.rs`) throws such a copy away, but the copy itself must still
//! not be a data race in the Rust memory model: a plain `copy_from_slice` racing a
//! store is undefined behaviour even if its result is discarded (crossbeam's
//! `AtomicCell` admits its volatile read is exactly that). Both sides therefore access
//! shared row memory only through operations the model treats as atomic:
//!
//! - On x86_64 the copy is one inline-assembly loop of unaligned 16-byte SSE loads and
//!   stores, then one more move of the range's last 16 bytes (8, 4 or 2 for shorter
//!   ranges, overlapping what was copied: see `docs/orderings.rs` §6), or `rep movsb`
//!   for long ranges. An `asm!` block is opaque to the compiler: it
//!   cannot be split, merged, elided or turned into a racy plain access, and every
//!   access it makes is a single hardware load or store, atomic at least per byte. This
//!   is the technique of taiki-e's `atomic-memcpy` / `atomic-maybe-uninit`, applied to a
//!   runtime-sized range. It runs near `memcpy` speed (see `benches/row_copy.rs`).
//! - Elsewhere, under loom, and with `--cfg replaybuf_atomic_copy` (used by the
//!   sanitizer runs so ThreadSanitizer sees every access), the copy is one
//!   `AtomicU64` load or store per word, `Relaxed`.
//!
//! Ordering is not this module's business: callers bracket copies with the fences and
//! stamp operations described in `stamp.rs`.
//!
//! # Partial words in the fallback
//!
//! Rows start on a word boundary and are padded to whole words, but fields inside a
//! row need not be. The fallback stores a partial word by reading the word, replacing
//! the field's bytes and storing it back. That is only correct because one slot has one
//! writer at a time (the stamp protocol's exclusion), and the word belongs to that slot.
//!
//! Layer: algos.

use crate::sync::AtomicU64;

#[inline]
fn check_range(words: &[AtomicU64], offset: usize, len: usize) {
    let end = offset.checked_add(len);
    assert!(
        end.is_some_and(|end| end <= words.len() * 8),
        "replaybuf internal error: copy of {len} bytes at {offset} overruns a region of {} bytes",
        words.len() * 8
    );
}

/// Copies `dst.len()` bytes of shared memory starting at byte `offset` of `words`.
///
/// The bytes may be concurrently written; the result is then some mix of old and new
/// bytes, which the caller must detect (stamps) and discard.
#[inline]
pub fn load(words: &[AtomicU64], offset: usize, dst: &mut [u8]) {
    check_range(words, offset, dst.len());
    // SAFETY: `check_range` put the range inside `words`.
    unsafe { load_unchecked(words, offset, dst) }
}

/// [`load`] without its range check: for a caller that checked a whole row's fields
/// at once.
///
/// # Safety
///
/// `offset..offset + dst.len()` lies inside `words`.
#[inline]
pub(crate) unsafe fn load_unchecked(words: &[AtomicU64], offset: usize, dst: &mut [u8]) {
    debug_assert!(offset + dst.len() <= words.len() * 8);
    #[cfg(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    ))]
    // SAFETY: (1) the caller put `offset..offset + dst.len()` inside `words`, and
    // `dst` is a unique borrow of `dst.len()` bytes; (2) private `dst` cannot overlap
    // the shared region; (3) the region is only ever accessed through atomics and this
    // copy (`Region` invariant), so the concurrent accesses are all atomic.
    unsafe {
        x86::copy(
            words.as_ptr().cast::<u8>().add(offset),
            dst.as_mut_ptr(),
            dst.len(),
        );
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    )))]
    words::load(words, offset, dst);
}

/// Copies `src` into shared memory starting at byte `offset` of `words`.
///
/// The caller must hold the slot(s) the range covers for writing (stamp protocol).
#[inline]
pub fn store(words: &[AtomicU64], offset: usize, src: &[u8]) {
    check_range(words, offset, src.len());
    // SAFETY: `check_range` put the range inside `words`.
    unsafe { store_with(words, offset, src, false) };
}

/// [`store`] without the range check, for a caller that checked a whole row's range
/// once (`plan::RowCopies`).
///
/// # Safety
///
/// `offset + src.len()` is at most `words.len() * 8`.
#[inline]
pub(crate) unsafe fn store_unchecked(words: &[AtomicU64], offset: usize, src: &[u8]) {
    debug_assert!(offset + src.len() <= words.len() * 8);
    // SAFETY: the caller's promise is `store_with`'s.
    unsafe { store_with(words, offset, src, false) };
}

/// [`store`] for rows that will not be read again soon, as a large append writes them:
/// the 64-byte blocks of the destination go out as non-temporal stores (`movntdq`),
/// which write whole lines to memory without reading them first and without pushing
/// the rest of the cache out. The copy's ends are ordinary stores.
///
/// Non-temporal stores are weakly ordered: they may become visible before an earlier
/// ordinary store, or after a later one. The caller brackets a run of these copies with
/// [`streaming_fence`] on both sides (see `stamp.rs`: after the slot's writing mark,
/// before its publishing store).
#[inline]
pub fn store_streaming(words: &[AtomicU64], offset: usize, src: &[u8]) {
    check_range(words, offset, src.len());
    // SAFETY: `check_range` put the range inside `words`.
    unsafe { store_with(words, offset, src, true) };
}

/// [`store`] without its range check, with non-temporal stores if `streaming` (a
/// constant at every call site, so the branch folds away).
///
/// # Safety
///
/// `offset + src.len()` is at most `words.len() * 8`.
#[inline]
unsafe fn store_with(words: &[AtomicU64], offset: usize, src: &[u8], streaming: bool) {
    #[cfg(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    ))]
    {
        let (from, to) = (
            src.as_ptr(),
            words.as_ptr().cast::<u8>().cast_mut().wrapping_add(offset),
        );
        // SAFETY: (1) the caller put the destination range inside `words`, and `src`
        // is a borrow of `src.len()` readable bytes; (2) `src` is private memory,
        // the destination shared, so they cannot overlap; (3) the region is only ever
        // accessed through atomics and these copies (`Region` invariant). Writing
        // through a pointer derived from `&[AtomicU64]` is allowed: the words are
        // interior-mutable cells.
        unsafe {
            if streaming {
                x86::copy_streaming(from, to, src.len());
            } else {
                x86::copy(from, to, src.len());
            }
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    )))]
    {
        // Ordinary word stores either way (see `streaming_fence`).
        let _ = streaming;
        words::store(words, offset, src);
    }
}

/// Orders every store before it, non-temporal ones included, before every store
/// after it (`sfence` on x86_64; nothing elsewhere, where [`store_streaming`] makes
/// ordinary stores).
#[inline]
pub fn streaming_fence() {
    #[cfg(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    ))]
    // SAFETY: `sfence` touches no memory and no register.
    unsafe {
        std::arch::asm!("sfence", options(nostack, preserves_flags));
    }
}

/// What a prefetch prepares a cache line for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Intent {
    Read,
    /// To read soon, but not next: into L2, leaving L1 to the lines read next.
    ReadLater,
    Write,
}

/// Hints the CPU to start loading the cache line holding byte `offset` of `words`
/// (for writing: in exclusive state, so the stores that follow need no second trip).
/// Never faults and never changes memory: a prefetch is not an access.
#[inline]
pub(crate) fn prefetch(words: &[AtomicU64], offset: usize, intent: Intent) {
    #[cfg(all(target_arch = "x86_64", not(replaybuf_loom)))]
    if offset < words.len() * 8 {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0, _MM_HINT_T1};
        let p = words.as_ptr().cast::<i8>().wrapping_add(offset);
        // SAFETY: a prefetch of any address, mapped or not, has no architectural
        // effect besides the cache; this one is inside the region anyway.
        unsafe {
            match intent {
                Intent::Read => _mm_prefetch::<_MM_HINT_T0>(p),
                Intent::ReadLater => _mm_prefetch::<_MM_HINT_T1>(p),
                Intent::Write => _mm_prefetch::<_MM_HINT_ET0>(p),
            }
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(replaybuf_loom))))]
    let _ = (words, offset, intent);
}

#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
mod x86 {
    /// Copies at least this long use `rep movsb`, which moves whole cache lines (and
    /// skips the read-for-ownership of destination lines it fully overwrites).
    const REP_MOVSB_BYTES: usize = 1024;

    /// `rep movsb`: a string move. Its loads are ordinary loads for x86 memory
    /// ordering; its stores may be performed out of order among themselves, but a
    /// string operation is not reordered with other stores (Intel SDM vol. 3, "Memory
    /// ordering of string operations"). So a stamp stored after the copy is seen after
    /// all of it, as the stamp protocol needs.
    ///
    /// # Safety
    ///
    /// As for [`copy`].
    #[inline]
    unsafe fn rep_movsb(src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: the caller's obligations make every access in bounds,
        // non-overlapping and atomic against other threads; the direction flag is
        // clear on entry to any Rust code, as the ABI requires.
        unsafe {
            std::arch::asm!(
                "rep movsb",
                inout("rsi") src => _,
                inout("rdi") dst => _,
                inout("rcx") len => _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// [`copy`] with the destination's whole 64-byte blocks written by non-temporal
    /// 16-byte stores (`movntdq`, which needs a 16-byte aligned destination: the bytes
    /// before the first block, and after the last, go through [`copy`]). Each store is
    /// a single hardware store, as in [`copy`]; their ordering is the caller's (see
    /// `store_streaming`).
    ///
    /// # Safety
    ///
    /// As for [`copy`].
    #[inline]
    pub(super) unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize) {
        let head = dst.align_offset(64).min(len);
        let blocks = (len - head) / 64;
        // SAFETY: the caller's obligations cover the whole range; `head` is within it.
        unsafe { copy(src, dst, head) };
        if blocks > 0 {
            // SAFETY: `dst + head` is 64-byte aligned and `blocks * 64` bytes from it
            // (and from `src + head`) lie inside the caller's ranges; every access is a
            // single hardware load or store (obligation 3); SSE2 is baseline.
            unsafe {
                std::arch::asm!(
                    "2:",
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu {b}, xmmword ptr [{s} + 16]",
                    "movdqu {c}, xmmword ptr [{s} + 32]",
                    "movdqu {d}, xmmword ptr [{s} + 48]",
                    "movntdq xmmword ptr [{t}], {a}",
                    "movntdq xmmword ptr [{t} + 16], {b}",
                    "movntdq xmmword ptr [{t} + 32], {c}",
                    "movntdq xmmword ptr [{t} + 48], {d}",
                    "add {s}, 64",
                    "add {t}, 64",
                    "dec {n}",
                    "jnz 2b",
                    s = inout(reg) src.add(head) => _,
                    t = inout(reg) dst.add(head) => _,
                    n = inout(reg) blocks => _,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    c = out(xmm_reg) _,
                    d = out(xmm_reg) _,
                    options(nostack),
                );
            }
        }
        let done = head + blocks * 64;
        // SAFETY: the rest of the caller's range.
        unsafe { copy(src.add(done), dst.add(done), len - done) };
    }

    /// Copies `len` bytes from `src` to `dst` with single-instruction loads and stores
    /// (16-byte SSE moves, then one move of the last 16 bytes; under 16 bytes, the first
    /// and last 8, 4 or 2, or the one byte), none of which the compiler can see into.
    /// A short field (a mujoco row's are 68, 24, 4, 68 and 1 bytes) takes one or two
    /// branches this way where 8/4/2/1-byte tails took four: the mujoco `extend` of
    /// 1,000 rows went from 22.1 to 18.7 us on the development VM (median of 7 runs).
    ///
    /// # Safety
    ///
    /// 1. `src` is valid for reads and `dst` for writes of `len` bytes.
    /// 2. The two ranges do not overlap.
    /// 3. Any byte of either range that another thread accesses at the same time is
    ///    accessed by it only through atomic operations or this function.
    #[inline]
    pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
        if len >= REP_MOVSB_BYTES {
            // SAFETY: the caller's obligations are this function's.
            unsafe { rep_movsb(src, dst, len) };
            return;
        }
        // SAFETY: obligations 1-2 make every access in bounds and non-overlapping;
        // obligation 3 makes concurrent accesses atomic. SSE2 is part of the x86_64
        // baseline. The block touches no stack and restores nothing it did not declare.
        unsafe {
            std::arch::asm!(
                "cmp {n}, 16",
                "jb 5f",
                // 16 bytes or more: 64-byte blocks, then 16-byte pieces while more than
                // 16 bytes are left, then the last 16 bytes of the range, which may
                // overlap the piece before.
                "lea {es}, [{s} + {n} - 16]",
                "lea {et}, [{t} + {n} - 16]",
                "cmp {n}, 64",
                "jb 3f",
                "2:",
                "movdqu {a}, xmmword ptr [{s}]",
                "movdqu {b}, xmmword ptr [{s} + 16]",
                "movdqu {c}, xmmword ptr [{s} + 32]",
                "movdqu {d}, xmmword ptr [{s} + 48]",
                "movdqu xmmword ptr [{t}], {a}",
                "movdqu xmmword ptr [{t} + 16], {b}",
                "movdqu xmmword ptr [{t} + 32], {c}",
                "movdqu xmmword ptr [{t} + 48], {d}",
                "add {s}, 64",
                "add {t}, 64",
                "sub {n}, 64",
                "cmp {n}, 64",
                "jae 2b",
                "3:",
                "cmp {n}, 16",
                "jbe 4f",
                "movdqu {a}, xmmword ptr [{s}]",
                "movdqu xmmword ptr [{t}], {a}",
                "add {s}, 16",
                "add {t}, 16",
                "sub {n}, 16",
                "jmp 3b",
                "4:",
                "movdqu {a}, xmmword ptr [{es}]",
                "movdqu xmmword ptr [{et}], {a}",
                "jmp 9f",
                // Under 16 bytes: the first and the last 8, 4 or 2 bytes (overlapping
                // when the length is not twice that), or the one byte.
                "5:",
                "cmp {n}, 8",
                "jb 6f",
                "mov {w}, qword ptr [{s}]",
                "mov {v}, qword ptr [{s} + {n} - 8]",
                "mov qword ptr [{t}], {w}",
                "mov qword ptr [{t} + {n} - 8], {v}",
                "jmp 9f",
                "6:",
                "cmp {n}, 4",
                "jb 7f",
                "mov {w:e}, dword ptr [{s}]",
                "mov {v:e}, dword ptr [{s} + {n} - 4]",
                "mov dword ptr [{t}], {w:e}",
                "mov dword ptr [{t} + {n} - 4], {v:e}",
                "jmp 9f",
                "7:",
                "test {n}, {n}",
                "jz 9f",
                "mov {w:l}, byte ptr [{s}]",
                "mov byte ptr [{t}], {w:l}",
                "cmp {n}, 2",
                "jb 9f",
                "mov {w:x}, word ptr [{s} + {n} - 2]",
                "mov word ptr [{t} + {n} - 2], {w:x}",
                "9:",
                s = inout(reg) src => _,
                t = inout(reg) dst => _,
                n = inout(reg) len => _,
                es = out(reg) _,
                et = out(reg) _,
                w = out(reg) _,
                v = out(reg) _,
                a = out(xmm_reg) _,
                b = out(xmm_reg) _,
                c = out(xmm_reg) _,
                d = out(xmm_reg) _,
                options(nostack),
            );
        }
    }
}

#[cfg(not(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
)))]
mod words {
    use crate::sync::AtomicU64;
    use crate::sync::Ordering::Relaxed;

    /// Splits `offset..offset + len` into (word, first byte in word, bytes) pieces.
    fn pieces(offset: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        let mut pos = offset;
        let end = offset + len;
        std::iter::from_fn(move || {
            (pos < end).then(|| {
                let (word, byte) = (pos / 8, pos % 8);
                let take = (8 - byte).min(end - pos);
                pos += take;
                (word, byte, take)
            })
        })
    }

    pub(super) fn load(words: &[AtomicU64], offset: usize, dst: &mut [u8]) {
        let mut out = 0;
        for (word, byte, take) in pieces(offset, dst.len()) {
            let bytes = words[word].load(Relaxed).to_ne_bytes();
            dst[out..out + take].copy_from_slice(&bytes[byte..byte + take]);
            out += take;
        }
    }

    pub(super) fn store(words: &[AtomicU64], offset: usize, src: &[u8]) {
        let mut at = 0;
        for (word, byte, take) in pieces(offset, src.len()) {
            let mut bytes = if take == 8 {
                [0; 8]
            } else {
                // Partial word: keep the neighbouring bytes of this (exclusively held)
                // slot. See "Partial words in the fallback".
                words[word].load(Relaxed).to_ne_bytes()
            };
            bytes[byte..byte + take].copy_from_slice(&src[at..at + take]);
            words[word].store(u64::from_ne_bytes(bytes), Relaxed);
            at += take;
        }
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    fn region(words: usize) -> Vec<AtomicU64> {
        (0..words).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn streaming_round_trips_every_length_and_offset() {
        let words = region(160);
        for offset in 0..72 {
            for len in (0..600).step_by(7).chain([1024, 1088, 1100]) {
                let src: Vec<u8> = (0..len).map(|i| (i * 5 + offset + 3) as u8).collect();
                store_streaming(&words, offset, &src);
                streaming_fence();
                let mut back = vec![0u8; len];
                load(&words, offset, &mut back);
                assert_eq!(back, src, "offset {offset} len {len}");
            }
        }
    }

    #[test]
    fn round_trips_every_length_and_offset() {
        let words = region(64);
        for offset in 0..24 {
            for len in 0..300 {
                let src: Vec<u8> = (0..len).map(|i| (i * 7 + offset + 1) as u8).collect();
                store(&words, offset, &src);
                let mut back = vec![0u8; len];
                load(&words, offset, &mut back);
                assert_eq!(back, src, "offset {offset} len {len}");
            }
        }
    }

    #[test]
    fn every_length_stays_inside_its_range() {
        let words = region(64);
        let mut back = [0u8; 512];
        for offset in 0..24 {
            for len in 0..300 {
                store(&words, 0, &[0xAA; 512]);
                store(&words, offset, &vec![0x55; len]);
                load(&words, 0, &mut back);
                let inside = offset..offset + len;
                for (i, &b) in back.iter().enumerate() {
                    let want = if inside.contains(&i) { 0x55 } else { 0xAA };
                    assert_eq!(b, want, "offset {offset} len {len} byte {i}");
                }
            }
        }
    }

    #[test]
    fn store_leaves_neighbouring_bytes_alone() {
        let words = region(8);
        store(&words, 0, &[0xAA; 64]);
        store(&words, 5, &[1, 2, 3]);
        let mut back = [0u8; 64];
        load(&words, 0, &mut back);
        assert_eq!(&back[..5], &[0xAA; 5]);
        assert_eq!(&back[5..8], &[1, 2, 3]);
        assert!(back[8..].iter().all(|&b| b == 0xAA));
    }

    #[test]
    #[should_panic(expected = "overruns")]
    fn refuses_a_range_past_the_region() {
        let words = region(2);
        load(&words, 9, &mut [0u8; 8]);
    }
}
