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
//!   for long ranges; an append's fields of 32 bytes and more move by 32-byte AVX
//!   loads and stores where the CPU has AVX. An `asm!` block is opaque to the
//!   compiler: it cannot be split, merged, elided or turned into a racy plain access,
//!   and every access it makes is a single hardware load or store, atomic at least per
//!   byte. This is the technique of taiki-e's `atomic-memcpy` / `atomic-maybe-uninit`,
//!   applied to a runtime-sized range. It runs near `memcpy` speed (see
//!   `benches/row_copy.rs`).
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

/// A cache line's bytes.
pub(crate) const LINE_BYTES: usize = 64;

/// Copies at least this long use `rep movsb` on x86_64, which moves whole cache lines
/// (and skips the read-for-ownership of destination lines it fully overwrites).
const REP_MOVSB_BYTES: usize = 1024;

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
    unsafe { FieldCopy::new(dst.len()).load(words, offset, dst) }
}

/// Copies `src` into shared memory starting at byte `offset` of `words`.
///
/// The caller must hold the slot(s) the range covers for writing (stamp protocol).
#[inline]
pub fn store(words: &[AtomicU64], offset: usize, src: &[u8]) {
    check_range(words, offset, src.len());
    // SAFETY: `check_range` put the range inside `words`.
    unsafe { store_with(words, offset, src, Store::Cached) };
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
    unsafe { store_with(words, offset, src, Store::Streaming) };
}

/// [`store_streaming`] of a streaming append's stage (`Storage::stream_run`): a few KiB
/// of small rows at a time, whose lines go out by one 64-byte non-temporal store each
/// where the CPU has AVX-512. Measured (AMD EPYC family 26, 2026-11-28, three rounds
/// alternating): 1,000 mujoco rows 6.35-6.42 us, against 6.85-6.94 with `movntdq`;
/// but 256 rows of 56 KB fields 506-519 us against 481-495, so the fields of large
/// rows keep `movntdq`.
#[cfg_attr(replaybuf_loom, allow(dead_code))]
#[inline]
pub(crate) fn store_stage(words: &[AtomicU64], offset: usize, src: &[u8]) {
    check_range(words, offset, src.len());
    // SAFETY: `check_range` put the range inside `words`.
    unsafe { store_with(words, offset, src, Store::Stage) };
}

/// How [`store_with`] stores.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(replaybuf_loom, allow(dead_code))]
enum Store {
    Cached,
    Streaming,
    Stage,
}

/// [`store`] without its range check, with non-temporal stores if `streaming` (a
/// constant at every call site, so the branch folds away).
///
/// # Safety
///
/// `offset + src.len()` is at most `words.len() * 8`.
#[inline]
unsafe fn store_with(words: &[AtomicU64], offset: usize, src: &[u8], how: Store) {
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
            match how {
                Store::Cached => x86::copy(from, to, src.len()),
                Store::Streaming => x86::copy_streaming(from, to, src.len(), false),
                Store::Stage => x86::copy_streaming(from, to, src.len(), crate::cpu::avx512f()),
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
        let _ = how;
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

/// How a field of one fixed length is stored, row after row: the length's moves
/// chosen once, so that each row's copy is a few moves with no branch (the general
/// [`store`] finds them again for every call, by a chain of compares).
///
/// The moves are those of [`store`]: single hardware stores of 1 to 16 bytes, the
/// last of them overlapping the one before where the length is not a multiple of it
/// (see `docs/orderings.rs` §6), or `rep movsb` for long fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FieldCopy {
    len: usize,
    moves: Moves,
    /// Stored by [`x86::wide_rows`]'s 32-byte moves rather than `moves` (x86_64 CPUs
    /// with AVX, fields of 32 bytes up to the `rep movsb` threshold).
    wide: bool,
}

/// A field's stores are 32-byte AVX moves from this length up to [`REP_MOVSB_BYTES`],
/// where the CPU has AVX: a row's stores are fewer, and a store that misses the cache
/// holds a store-queue entry for every 32 bytes rather than every 16. Measured
/// (AMD EPYC family 26, 2026-11-28, three rounds alternating with 16-byte moves):
/// 1,000 typed 168-byte rows into a million 7.38-7.50 us against 7.86-8.29;
/// `replaybuf bench --workload mujoco` extends 9.13-9.67 us against 9.77-10.26; 256
/// rows of 100 bytes (two 46-byte fields) 1.74-1.79 against 1.75-1.88.
const WIDE_BYTES: usize = 32;

/// The single hardware moves that copy a range of some length (see [`FieldCopy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moves {
    None,
    Byte,
    /// Two moves of this many bytes (2, 4, 8 or 16): at 0 and at `len - bytes`.
    Pair(usize),
    /// Four 16-byte moves, at 0, 16, `len - 32` and `len - 16`: lengths 33 to 63.
    Quad,
    /// Six 16-byte moves, at 0, 16, 32, 48, `len - 32` and `len - 16`: lengths 64 to
    /// 96, with no loop (mujoco's 68-byte observations: `sample` 256 laps alternating
    /// with `Blocks` in one process, Intel Xeon family 6 model 207, 0.96-0.99x the
    /// time on 10,000 rows, 0.98-1.00x on a million).
    Hexa,
    /// 64-byte blocks from the start, then up to three 16-byte moves, the last
    /// ending at the range's end: lengths 97 and up to the `rep movsb` threshold.
    Blocks,
    /// `rep movsb`.
    String,
}

/// Runs `$each!(|from, to| kernel)` with the kernel of `$moves` for copies of `$len`
/// bytes: `$each` is a caller's loop over its rows, which binds `from` and `to` for
/// each row and calls the kernel in an `unsafe` block under its own SAFETY comment.
/// The match on the moves, a pair's width included, stays out of the loop: the
/// kernel's own match on the width then folds away.
#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
macro_rules! each_by_moves {
    ($moves:expr, $len:expr, $each:ident) => {{
        let len = $len;
        match $moves {
            Moves::None => {}
            Moves::Byte => $each!(|from, to| x86::byte(from, to)),
            Moves::Pair(16) => $each!(|from, to| x86::pair(from, to, 16, len - 16)),
            Moves::Pair(8) => $each!(|from, to| x86::pair(from, to, 8, len - 8)),
            Moves::Pair(4) => $each!(|from, to| x86::pair(from, to, 4, len - 4)),
            Moves::Pair(bytes) => $each!(|from, to| x86::pair(from, to, bytes, len - bytes)),
            Moves::Quad => $each!(|from, to| x86::quad(from, to, len - 32, len - 16)),
            Moves::Hexa => $each!(|from, to| x86::hexa(from, to, len - 32, len - 16)),
            Moves::Blocks => $each!(|from, to| x86::blocks(from, to, len)),
            Moves::String => $each!(|from, to| x86::rep_movsb(from, to, len)),
        }
    }};
}

impl Moves {
    /// The moves of a copy of `len` bytes.
    #[inline]
    fn of(len: usize) -> Moves {
        match len {
            0 => Moves::None,
            1 => Moves::Byte,
            2..=3 => Moves::Pair(2),
            4..=7 => Moves::Pair(4),
            8..=15 => Moves::Pair(8),
            16..=32 => Moves::Pair(16),
            33..=63 => Moves::Quad,
            64..=96 => Moves::Hexa,
            _ if len < REP_MOVSB_BYTES => Moves::Blocks,
            _ => Moves::String,
        }
    }
}

impl FieldCopy {
    pub(crate) fn new(len: usize) -> FieldCopy {
        FieldCopy {
            len,
            moves: Moves::of(len),
            wide: (WIDE_BYTES..REP_MOVSB_BYTES).contains(&len) && crate::cpu::avx(),
        }
    }

    /// The field's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies the field at byte `offset` of `words` into `dst` (`len` bytes): [`load`]
    /// with the moves chosen once and no range check.
    ///
    /// # Safety
    ///
    /// `dst.len()` is the field's length, and `offset..offset + dst.len()` lies inside
    /// `words`.
    #[inline(always)]
    pub(crate) unsafe fn load(&self, words: &[AtomicU64], offset: usize, dst: &mut [u8]) {
        debug_assert!(dst.len() == self.len && offset + self.len <= words.len() * 8);
        #[cfg(all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        ))]
        // SAFETY: (1) the caller put `offset..offset + dst.len()` inside `words`, and
        // `dst` is a unique borrow of its bytes; (2) private `dst` cannot overlap the
        // shared region; (3) the region is only ever accessed through atomics and
        // these copies (`Region` invariant), so the concurrent accesses are all
        // atomic. `new` chose the moves for this length.
        unsafe {
            x86::moves(
                self.moves,
                words.as_ptr().cast::<u8>().add(offset),
                dst.as_mut_ptr(),
                self.len,
            );
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        )))]
        words::load(words, offset, dst);
    }

    /// Stores the field of each data row `rows[k]`, `data[rows[k] * stride..][..len]`,
    /// at byte `offset + k * step` of `words` (each held for writing, under the stamp
    /// protocol).
    ///
    /// # Safety
    ///
    /// For every `r` of `rows`, `r * stride + len <= data.len()`; and if `rows` is not
    /// empty, `offset + (rows.len() - 1) * step + len <= words.len() * 8`.
    #[inline]
    pub(crate) unsafe fn store_rows(
        &self,
        words: &[AtomicU64],
        offset: usize,
        step: usize,
        data: &[u8],
        stride: usize,
        rows: &[usize],
    ) {
        #[cfg(all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        ))]
        {
            let base = words.as_ptr().cast::<u8>().cast_mut().wrapping_add(offset);
            if self.wide {
                // SAFETY: as below, for every row; `new` found AVX and a length of at
                // least 32.
                unsafe { x86::wide_rows(data.as_ptr(), stride, rows, base, step, self.len) };
                return;
            }
            // Every row's copy by one kernel, the moves' kind matched once for all the
            // rows rather than once a row (a row of mujoco's three short fields took 13
            // instructions fewer by callgrind).
            macro_rules! each_row {
                (|$from:ident, $to:ident| $kernel:expr) => {
                    for (k, &r) in rows.iter().enumerate() {
                        let ($from, $to) = (
                            data.as_ptr().wrapping_add(r * stride),
                            base.wrapping_add(k * step),
                        );
                        // SAFETY: (1) the caller put the row's source inside `data` and
                        // its destination inside `words`; (2) `data` is private memory,
                        // the destination shared, so they cannot overlap; (3) the region
                        // is only ever accessed through atomics and these copies
                        // (`Region` invariant). `new` chose the moves for this length.
                        unsafe { $kernel }
                    }
                };
            }
            each_by_moves!(self.moves, self.len, each_row);
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        )))]
        for (k, &r) in rows.iter().enumerate() {
            words::store(words, offset + k * step, &data[r * stride..][..self.len]);
        }
    }

    /// Loads the field of each stored row `(row, k)` of `rows`, at byte
    /// `row + offset` of `words`, into `data[k * stride + skip..][..len]` (each read
    /// under the stamp protocol): [`FieldCopy::load`] for many rows, its moves chosen
    /// once for all of them.
    ///
    /// # Safety
    ///
    /// For every `(row, k)` of `rows`, `row + offset + len <= words.len() * 8` and
    /// `k * stride + skip + len <= data.len()`.
    #[inline]
    pub(crate) unsafe fn load_rows(
        &self,
        words: &[AtomicU64],
        offset: usize,
        rows: &[(usize, usize)],
        data: &mut [u8],
        stride: usize,
        skip: usize,
    ) {
        #[cfg(all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        ))]
        {
            let base = words.as_ptr().cast::<u8>().wrapping_add(offset);
            let out = data.as_mut_ptr().wrapping_add(skip);
            /// The rows' copies with one kernel (`each_by_moves`).
            macro_rules! each {
                (|$from:ident, $to:ident| $kernel:expr) => {
                    for &(row, k) in rows {
                        let ($from, $to) = (base.wrapping_add(row), out.wrapping_add(k * stride));
                        // SAFETY: (1) the caller put each row's source inside `words`
                        // and its destination inside `data`; (2) `data` is private
                        // memory, the source shared, so they cannot overlap; (3) the
                        // region is only ever accessed through atomics and these copies
                        // (`Region` invariant). `new` chose the moves for this length.
                        unsafe { $kernel }
                    }
                };
            }
            each_by_moves!(self.moves, self.len, each);
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        )))]
        for &(row, k) in rows {
            words::load(
                words,
                row + offset,
                &mut data[k * stride + skip..][..self.len],
            );
        }
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

/// Hints the CPU to start loading the cache line holding byte `offset` of `words`.
///
/// `Intent::Write` asks for the line to write (`_MM_HINT_ET0`), but a build without the
/// `prfchw` target feature, the default one, lowers it to `prefetcht0`, a read. A true
/// `prefetchw` (through `asm!`) was measured on a Zen 3 host and left out: a prioritized
/// writer beside its own learner, whose locked leaf and entry changes it was to spare
/// a second trip, took 33.0-33.6 us an extend with it and 32.1-34.2 without, three
/// runs alternating.
///
/// Never faults and never changes memory: a prefetch is not an access, so `offset`
/// is not checked: a sample prefetches six lines a row, and the check was 3.5% of its
/// instructions. Callers keep it inside `words` or a line or two past its end (a
/// drawn row's second line pair when the row is the last, a tree level's last node),
/// where it loads a line for nothing.
#[inline]
pub(crate) fn prefetch(words: &[AtomicU64], offset: usize, intent: Intent) {
    prefetch_address(words.as_ptr().cast::<i8>().wrapping_add(offset), intent);
}

/// The prefetch of the line holding address `p`, for [`prefetch`] and
/// [`prefetch_room`]: any address, mapped or not (x86_64; nothing elsewhere or under
/// loom).
#[inline(always)]
fn prefetch_address(p: *const i8, intent: Intent) {
    #[cfg(all(target_arch = "x86_64", not(replaybuf_loom)))]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0, _MM_HINT_T0, _MM_HINT_T1};
        // SAFETY: a prefetch of any address, mapped or not, has no architectural
        // effect besides the cache (Intel SDM vol. 2, PREFETCHh: "does not affect
        // program behavior").
        unsafe {
            match intent {
                Intent::Read => _mm_prefetch::<_MM_HINT_T0>(p),
                Intent::ReadLater => _mm_prefetch::<_MM_HINT_T1>(p),
                Intent::Write => _mm_prefetch::<_MM_HINT_ET0>(p),
            }
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(replaybuf_loom))))]
    let _ = (p, intent);
}

/// Starts loading every cache line of the `len` values from `first` into L1: memory
/// of this thread's that it is about to overwrite from the start (a sample's draws,
/// its batch's indices and generations; a vector's room up to its capacity counts),
/// and that a learner's passes since its last sample will have pushed out of the
/// cache. The lines then come in together, not one after another as each store
/// reaches a missing one; a line no other core holds comes in exclusive, and the store
/// needs no second trip. (`prefetcht0`: see [`prefetch`] on `prefetchw`.)
///
/// Mujoco `sample` 256 of a million rows, in laps alternating in one process on the
/// Intel host of 2026-11-30, each after a write over 64 MiB, beside the plain gather
/// after the same: 1.08-1.16x its time with the draws, indices and generations so
/// fetched, 1.19-1.21x without (three runs); 16 samples after 8 untimed ones, no
/// write between, 0.66-0.67x the cold gather's time against 0.77-0.78x; in loops of
/// 2,000 samples, 1.03-1.20x a loop of the plain gather against 0.98-1.23x (seven
/// runs; the median 1.07x against 1.16x).
///
/// Never faults and never changes memory, as [`prefetch`].
#[inline]
pub(crate) fn prefetch_room<T>(first: *const T, len: usize) {
    let start = first.cast::<i8>();
    let lead = start as usize % LINE_BYTES;
    let line = start.wrapping_sub(lead);
    for offset in (0..lead + len * std::mem::size_of::<T>()).step_by(LINE_BYTES) {
        prefetch_address(line.wrapping_add(offset), Intent::Read);
    }
}

/// [`prefetch`] of every cache line holding a byte of `words`' bytes `start..end`.
#[inline]
pub(crate) fn prefetch_lines(words: &[AtomicU64], start: usize, end: usize, intent: Intent) {
    let mut line = start & !(LINE_BYTES - 1);
    while line < end {
        prefetch(words, line, intent);
        line += LINE_BYTES;
    }
}

#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
mod x86 {
    use crate::storage::atomic_copy::Moves;

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
    pub(super) unsafe fn rep_movsb(src: *const u8, dst: *mut u8, len: usize) {
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

    /// One byte.
    ///
    /// # Safety
    ///
    /// As for [`copy`], with `len` 1.
    #[inline(always)]
    pub(super) unsafe fn byte(src: *const u8, dst: *mut u8) {
        // SAFETY: the caller's obligations are `copy`'s for these bytes.
        unsafe {
            std::arch::asm!(
                "mov {w:l}, byte ptr [{s}]",
                "mov byte ptr [{t}], {w:l}",
                s = in(reg) src,
                t = in(reg) dst,
                w = out(reg) _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// Two moves of `bytes` bytes (2, 4, 8 or 16), at 0 and at `last`: a length from
    /// `bytes` to `2 * bytes` (`2 * bytes - 1` under 16), whose `last` is the length
    /// less `bytes`.
    ///
    /// # Safety
    ///
    /// As for [`copy`], with `len` `last + bytes`.
    #[inline(always)]
    pub(super) unsafe fn pair(src: *const u8, dst: *mut u8, bytes: usize, last: usize) {
        /// The two moves, of `$ptr`-sized words in registers named with `$reg`.
        macro_rules! moves {
            ($ptr:literal, $reg:literal) => {
                std::arch::asm!(
                    concat!("mov {w", $reg, "}, ", $ptr, " ptr [{s}]"),
                    concat!("mov {v", $reg, "}, ", $ptr, " ptr [{s} + {o}]"),
                    concat!("mov ", $ptr, " ptr [{t}], {w", $reg, "}"),
                    concat!("mov ", $ptr, " ptr [{t} + {o}], {v", $reg, "}"),
                    s = in(reg) src,
                    t = in(reg) dst,
                    o = in(reg) last,
                    w = out(reg) _,
                    v = out(reg) _,
                    options(nostack, preserves_flags),
                )
            };
        }
        // SAFETY: the caller's obligations are `copy`'s for these bytes.
        unsafe {
            match bytes {
                16 => std::arch::asm!(
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu {b}, xmmword ptr [{s} + {o}]",
                    "movdqu xmmword ptr [{t}], {a}",
                    "movdqu xmmword ptr [{t} + {o}], {b}",
                    s = in(reg) src,
                    t = in(reg) dst,
                    o = in(reg) last,
                    a = out(xmm_reg) _,
                    b = out(xmm_reg) _,
                    options(nostack, preserves_flags),
                ),
                8 => moves!("qword", ""),
                4 => moves!("dword", ":e"),
                _ => moves!("word", ":x"),
            }
        }
    }

    /// Four 16-byte moves, at 0, 16, `o2` and `o3`: a length of 33 to 63, with `o3`
    /// the length less 16 and `o2` the length less 32.
    ///
    /// # Safety
    ///
    /// As for [`copy`], with `len` `o3 + 16`, from 33 to 63, and `o2` `o3 - 16`.
    #[inline(always)]
    pub(super) unsafe fn quad(src: *const u8, dst: *mut u8, o2: usize, o3: usize) {
        // SAFETY: the caller's obligations are `copy`'s for these bytes.
        unsafe {
            std::arch::asm!(
                "movdqu {a}, xmmword ptr [{s}]",
                "movdqu {b}, xmmword ptr [{s} + 16]",
                "movdqu {c}, xmmword ptr [{s} + {o2}]",
                "movdqu {d}, xmmword ptr [{s} + {o3}]",
                "movdqu xmmword ptr [{t}], {a}",
                "movdqu xmmword ptr [{t} + 16], {b}",
                "movdqu xmmword ptr [{t} + {o2}], {c}",
                "movdqu xmmword ptr [{t} + {o3}], {d}",
                s = in(reg) src,
                t = in(reg) dst,
                o2 = in(reg) o2,
                o3 = in(reg) o3,
                a = out(xmm_reg) _,
                b = out(xmm_reg) _,
                c = out(xmm_reg) _,
                d = out(xmm_reg) _,
                options(nostack, preserves_flags),
            );
        }
    }

    /// Six 16-byte moves, at 0, 16, 32, 48, `o4` and `o5`: a length of 64 to 96, with
    /// `o5` the length less 16 and `o4` the length less 32. A [`quad`] of the first 64
    /// bytes, then a [`pair`] of the last 32.
    ///
    /// # Safety
    ///
    /// As for [`copy`], with `len` `o5 + 16`, from 64 to 96, and `o4` `o5 - 16`.
    #[inline(always)]
    pub(super) unsafe fn hexa(src: *const u8, dst: *mut u8, o4: usize, o5: usize) {
        debug_assert!(o5 == o4 + 16 && (48..=80).contains(&o5));
        // SAFETY: the caller's obligations are `copy`'s for these bytes: the quad's
        // 64 from the start, inside since `o5 + 16 >= 64`, and the pair's 32 from `o4`.
        unsafe {
            quad(src, dst, 32, 48);
            pair(src.add(o4), dst.add(o4), 16, 16);
        }
    }

    /// `$n` (at least one) 64-byte blocks from `$src` to `$dst`, each four 16-byte
    /// loads and four 16-byte stores by `$store` (`movdqu`, or `movntdq` to a 16-byte
    /// aligned destination).
    macro_rules! block_moves {
        ($store:literal, $src:expr, $dst:expr, $n:expr) => {
            std::arch::asm!(
                "2:",
                "movdqu {a}, xmmword ptr [{s}]",
                "movdqu {b}, xmmword ptr [{s} + 16]",
                "movdqu {c}, xmmword ptr [{s} + 32]",
                "movdqu {d}, xmmword ptr [{s} + 48]",
                concat!($store, " xmmword ptr [{t}], {a}"),
                concat!($store, " xmmword ptr [{t} + 16], {b}"),
                concat!($store, " xmmword ptr [{t} + 32], {c}"),
                concat!($store, " xmmword ptr [{t} + 48], {d}"),
                "add {s}, 64",
                "add {t}, 64",
                "dec {n}",
                "jnz 2b",
                s = inout(reg) $src => _,
                t = inout(reg) $dst => _,
                n = inout(reg) $n => _,
                a = out(xmm_reg) _,
                b = out(xmm_reg) _,
                c = out(xmm_reg) _,
                d = out(xmm_reg) _,
                options(nostack),
            )
        };
    }

    /// 64-byte blocks of 16-byte moves from the start, then as many 16-byte moves as
    /// the rest needs, the last ending at the range's end: a length of at least 64.
    ///
    /// # Safety
    ///
    /// As for [`copy`], with `len` at least 64.
    #[inline(always)]
    pub(super) unsafe fn blocks(src: *const u8, dst: *mut u8, len: usize) {
        let pieces = (len % 64).div_ceil(16);
        let rest = len - 16 * pieces;
        // SAFETY: the caller's obligations are `copy`'s for these bytes; `len >= 64`
        // puts the pieces, which start at `rest >= 16 * (len / 64)`, inside the range.
        unsafe {
            block_moves!("movdqu", src, dst, len / 64);
            if pieces > 0 {
                std::arch::asm!(
                    "2:",
                    "movdqu {a}, xmmword ptr [{s}]",
                    "movdqu xmmword ptr [{t}], {a}",
                    "add {s}, 16",
                    "add {t}, 16",
                    "dec {n}",
                    "jnz 2b",
                    s = inout(reg) src.add(rest) => _,
                    t = inout(reg) dst.add(rest) => _,
                    n = inout(reg) pieces => _,
                    a = out(xmm_reg) _,
                    options(nostack),
                );
            }
        }
    }

    /// Copies `len` bytes (at least 32) from `data + rows[k] * stride` to
    /// `dst + k * step` for every `k`, each by 32-byte AVX moves from the start, the
    /// last ending at the range's end (overlapping the one before where `len` is not a
    /// multiple of 32): single hardware loads and stores, as in [`copy`]. Clears the
    /// registers' upper halves before returning, so that SSE code after it pays no
    /// transition.
    ///
    /// # Safety
    ///
    /// As for [`copy`], for each row's range of `len` bytes; `len >= 32`; the CPU has
    /// AVX.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn wide_rows(
        data: *const u8,
        stride: usize,
        rows: &[usize],
        dst: *mut u8,
        step: usize,
        len: usize,
    ) {
        /// One 32-byte move, `at` bytes into the row.
        macro_rules! move32 {
            ($src:expr, $dst:expr, $at:expr) => {
                std::arch::asm!(
                    "vmovdqu {a}, ymmword ptr [{s} + {o}]",
                    "vmovdqu ymmword ptr [{t} + {o}], {a}",
                    s = in(reg) $src,
                    t = in(reg) $dst,
                    o = in(reg) $at,
                    a = out(ymm_reg) _,
                    options(nostack, preserves_flags),
                )
            };
        }
        let last = len - 32;
        for (k, &r) in rows.iter().enumerate() {
            let (src, dst) = (data.wrapping_add(r * stride), dst.wrapping_add(k * step));
            // SAFETY: the caller's obligations are `copy`'s for the row's `len` bytes,
            // and every move lies inside them (`at < last`, then `last`); AVX is there.
            unsafe {
                let mut at = 0;
                while at < last {
                    move32!(src, dst, at);
                    at += 32;
                }
                move32!(src, dst, last);
            }
        }
        // SAFETY: AVX is there (the caller's obligation).
        unsafe { upper_clean() };
    }

    /// `lines` lines from `src` to the 64-byte aligned `dst`, each by one unaligned
    /// 64-byte load and one non-temporal 64-byte store (`vmovntdq`), then
    /// `vzeroupper`.
    ///
    /// The compiler adds no `vzeroupper` after an `asm!` block (it does after its own
    /// vector code, as in `plan::stage_field_avx`), and without one the register's
    /// upper bits stay dirty for the SSE code after it: on Intel cores every legacy SSE
    /// instruction then waits on them (AMD's keep no such state). Measured (Intel Xeon,
    /// family 6 model 207, 2026-11-30; 1,000 mujoco rows into a million, laps of 200
    /// extends alternating in one process, medians of 20): 18.3 and 19.4 us with it,
    /// 26.4 and 29.8 without, beside a `memcpy` of the chunk's bytes at 17.7 and 18.8.
    ///
    /// # Safety
    ///
    /// As for [`copy`], for `lines * 64` bytes, `dst` 64-byte aligned, on a CPU with
    /// AVX-512.
    #[target_feature(enable = "avx512f")]
    unsafe fn stream_lines_avx512(src: *const u8, dst: *mut u8, lines: usize) {
        // SAFETY: the caller's ranges; single hardware loads and stores, opaque to the
        // compiler (obligation 3 of `copy`).
        unsafe {
            std::arch::asm!(
                "2:",
                "vmovdqu64 {v}, zmmword ptr [{s}]",
                "vmovntdq zmmword ptr [{t}], {v}",
                "add {s}, 64",
                "add {t}, 64",
                "dec {n}",
                "jnz 2b",
                s = inout(reg) src => _,
                t = inout(reg) dst => _,
                n = inout(reg) lines => _,
                v = out(zmm_reg) _,
                options(nostack),
            );
            upper_clean();
        }
    }

    /// `vzeroupper`: the upper bits of every vector register zeroed, so that SSE
    /// code after a block of 256- or 512-bit moves runs without waiting on them.
    ///
    /// # Safety
    ///
    /// The CPU has AVX.
    #[inline(always)]
    pub(super) unsafe fn upper_clean() {
        // SAFETY: `vzeroupper` touches no memory; every vector register it changes is
        // caller-saved, as the clobber says.
        unsafe {
            std::arch::asm!(
                "vzeroupper",
                clobber_abi("C"),
                options(nostack, nomem, preserves_flags)
            );
        }
    }

    /// [`copy`] with the destination's whole 64-byte blocks written by non-temporal
    /// 16-byte stores (`movntdq`, which needs a 16-byte aligned destination: the bytes
    /// before the first block, and after the last, go through [`copy`]), or, if `wide`,
    /// one 64-byte non-temporal store a block (`vmovntdq`). Each store is a single
    /// hardware store, as in [`copy`]; their ordering is the caller's (see
    /// `store_streaming`).
    ///
    /// # Safety
    ///
    /// As for [`copy`]; `wide` only on a CPU with AVX-512.
    #[inline]
    pub(super) unsafe fn copy_streaming(src: *const u8, dst: *mut u8, len: usize, wide: bool) {
        let head = dst.align_offset(64).min(len);
        let blocks = (len - head) / 64;
        // SAFETY: the caller's obligations cover the whole range; `head` is within it.
        unsafe { copy(src, dst, head) };
        if blocks > 0 && wide {
            // SAFETY: as below; the CPU has AVX-512.
            unsafe { stream_lines_avx512(src.add(head), dst.add(head), blocks) };
        } else if blocks > 0 {
            // SAFETY: `dst + head` is 64-byte aligned and `blocks * 64` bytes from it
            // (and from `src + head`) lie inside the caller's ranges; every access is a
            // single hardware load or store (obligation 3); SSE2 is baseline.
            unsafe { block_moves!("movntdq", src.add(head), dst.add(head), blocks) };
        }
        let done = head + blocks * 64;
        // SAFETY: the rest of the caller's range.
        unsafe { copy(src.add(done), dst.add(done), len - done) };
    }

    /// Copies `len` bytes from `src` to `dst` with single-instruction loads and stores,
    /// none of which the compiler can see into: the moves [`Moves::of`] the length
    /// (16-byte SSE moves, the last overlapping the one before; under 16 bytes, the
    /// first and last 8, 4 or 2, or the one byte; `rep movsb` for long ranges).
    ///
    /// # Safety
    ///
    /// 1. `src` is valid for reads and `dst` for writes of `len` bytes.
    /// 2. The two ranges do not overlap.
    /// 3. Any byte of either range that another thread accesses at the same time is
    ///    accessed by it only through atomic operations or this function.
    #[inline]
    pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: the caller's obligations are `moves`'s, with the moves for `len`.
        unsafe { moves(Moves::of(len), src, dst, len) };
    }

    /// Copies `len` bytes from `src` to `dst` by `m`, the moves for `len`.
    ///
    /// # Safety
    ///
    /// As for [`copy`], and `m` is `Moves::of(len)`.
    #[inline(always)]
    pub(super) unsafe fn moves(m: Moves, src: *const u8, dst: *mut u8, len: usize) {
        // SAFETY: the caller's obligations are each kernel's; `Moves::of` chose the
        // kernel whose lengths include `len`.
        unsafe {
            match m {
                Moves::None => {}
                Moves::Byte => byte(src, dst),
                Moves::Pair(bytes) => pair(src, dst, bytes, len - bytes),
                Moves::Quad => quad(src, dst, len - 32, len - 16),
                Moves::Hexa => hexa(src, dst, len - 32, len - 16),
                Moves::Blocks => blocks(src, dst, len),
                Moves::String => rep_movsb(src, dst, len),
            }
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

    /// Every length of every class of moves, rows scattered at several steps and in
    /// any order: each row gets exactly its source's bytes, the bytes between the rows
    /// keep theirs, and `load_rows` reads the rows back.
    #[test]
    fn field_copies_store_exactly_their_rows() {
        let words = region(1200);
        let mut back = vec![0u8; 1200 * 8];
        // Both the 32-byte AVX moves (where this CPU has AVX) and the 16-byte ones.
        let copies = (0..200)
            .chain([255, 256, 511, 1023, 1024, 1100])
            .flat_map(|len| {
                let copy = FieldCopy::new(len);
                [
                    copy,
                    FieldCopy {
                        wide: false,
                        ..copy
                    },
                ]
            });
        for copy in copies {
            let len = copy.len();
            let stride = len + 3;
            let data: Vec<u8> = (0..stride * 5).map(|i| (i * 7 + len + 1) as u8).collect();
            for (offset, rows) in [(0, vec![0]), (5, vec![4, 0, 2]), (13, vec![1, 1, 3, 2])] {
                let step = len + offset % 4;
                store(&words, 0, &vec![0xAA; 1200 * 8]);
                // SAFETY: every row lies inside `data`, and the last destination
                // (under 4 * 1104 + 13 bytes) inside the region.
                unsafe { copy.store_rows(&words, offset, step, &data, stride, &rows) };
                load(&words, 0, &mut back);
                let mut want = vec![0xAA; 1200 * 8];
                for (k, &r) in rows.iter().enumerate() {
                    let at = offset + k * step;
                    want[at..at + len].copy_from_slice(&data[r * stride..][..len]);
                }
                assert!(
                    back == want,
                    "len {len} offset {offset} rows {rows:?} wide {}",
                    copy.wide
                );
                // And loaded back by the same moves, row `k` into `out[k * stride + 1..]`.
                let held: Vec<(usize, usize)> = (0..rows.len()).map(|k| (k * step, k)).collect();
                let mut out = vec![0x33u8; stride * rows.len() + 1];
                // SAFETY: each row `k` lies at `offset + k * step` inside the region,
                // and `k * stride + 1 + len` inside `out`.
                unsafe { copy.load_rows(&words, offset, &held, &mut out, stride, 1) };
                for (k, &r) in rows.iter().enumerate() {
                    let got = &out[k * stride + 1..][..len];
                    assert_eq!(got, &data[r * stride..][..len], "load: len {len} row {k}");
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

    /// The copies by 256- and 512-bit moves end with the vector registers' upper bits
    /// zeroed (`vzeroupper`), as the processor reports them (`XINUSE`, read by
    /// `xgetbv` with `ecx` 1): left dirty, every SSE instruction after them waits on
    /// them on Intel cores (`x86::stream_lines_avx512`). The check runs where the CPU
    /// reports the state, and shows it can see it dirty first.
    #[cfg(all(target_arch = "x86_64", not(replaybuf_atomic_copy)))]
    #[test]
    fn vector_copies_leave_the_upper_registers_clean() {
        use std::arch::x86_64::__cpuid_count;
        /// `XINUSE` bits of the upper halves of `ymm0-15` and of `zmm0-15`.
        const UPPER: u32 = 1 << 2 | 1 << 6;
        /// Whether the upper state is in use, as `xgetbv` with `ecx` 1 says.
        fn upper_dirty() -> bool {
            let (lo, _hi): (u32, u32);
            // SAFETY: `xgetbv` reads a register; the caller found it supported.
            unsafe {
                std::arch::asm!("xgetbv", in("ecx") 1, out("eax") lo, out("edx") _hi,
                    options(nostack, nomem, preserves_flags));
            }
            lo & UPPER != 0
        }
        #[allow(unused_unsafe)]
        // SAFETY: `cpuid` leaf 0xd exists where `xsave` is reported.
        let xinuse = std::arch::is_x86_feature_detected!("xsave")
            && unsafe { __cpuid_count(0xd, 1) }.eax & 1 << 2 != 0;
        if !xinuse || !crate::cpu::avx() {
            return;
        }
        /// Whether a 256-bit load shows as dirty upper state, and `vzeroupper` clears it.
        #[target_feature(enable = "avx")]
        fn seen() -> bool {
            let ones = [u64::MAX; 4];
            // SAFETY: the load reads a live array.
            unsafe {
                std::arch::asm!("vmovdqu {v}, ymmword ptr [{p}]", p = in(reg) ones.as_ptr(),
                    v = out(ymm_reg) _, options(nostack, readonly, preserves_flags));
            }
            let dirty = upper_dirty();
            // SAFETY: AVX is there.
            unsafe { x86::upper_clean() };
            dirty && !upper_dirty()
        }
        // Dirty, as the processor sees it, or the check below shows nothing.
        // SAFETY: AVX is there.
        let seen = unsafe { seen() };
        if !seen {
            return;
        }
        let words = region(512);
        let data: Vec<u8> = (0..4096).map(|i| i as u8).collect();
        // A field copied by `x86::wide_rows`.
        let copy = FieldCopy::new(68);
        assert!(copy.wide);
        // SAFETY: rows 0..3 of 68 bytes lie inside `data`, and three 100-byte steps
        // inside the region's 4 KiB.
        unsafe { copy.store_rows(&words, 8, 100, &data, 68, &[2, 0, 1]) };
        assert!(!upper_dirty(), "after 32-byte field moves");
        // A stage's lines by `x86::stream_lines_avx512` where there is AVX-512.
        store_stage(&words, 64, &data[..2048]);
        streaming_fence();
        assert!(!upper_dirty(), "after a stage's streaming stores");
    }
}
