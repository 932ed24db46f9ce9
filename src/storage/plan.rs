//! Copy plans: which bytes of a caller's data go to which bytes of a row, and back.
//!
//! A columnar batch is scattered into rows on write and gathered out of rows on read,
//! one field at a time. A typed buffer's `T` is one field covering the whole row, so
//! both faces share one path.
//!
//! Layer: algos.

use smallvec::SmallVec;

use super::atomic_copy;
use crate::sync::AtomicU64;

/// Where a logical field's stored part lies in a stored row, and which bytes of the
/// field's value it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) offset: usize,
    pub(crate) skip: usize,
    pub(crate) len: usize,
}

impl Place {
    /// A field of `bytes` bytes stored whole at `offset`.
    pub(crate) fn whole(offset: usize, bytes: usize) -> Place {
        Place {
            offset,
            skip: 0,
            len: bytes,
        }
    }
}

/// One field's bytes in the caller's data, for every row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SrcCol<'a> {
    /// Row after row, `bytes` each.
    pub(crate) data: &'a [u8],
    pub(crate) bytes: usize,
    /// Where the field lies in a stored row, and the part of each row's value that is
    /// stored there (all of it, but for a frame stack's newest frame and a `next_of`
    /// field's nothing; see `frames.rs`).
    pub(crate) place: Place,
}

impl<'a> SrcCol<'a> {
    /// A field stored whole.
    pub(crate) fn whole(data: &'a [u8], bytes: usize, offset: usize) -> SrcCol<'a> {
        SrcCol {
            data,
            bytes,
            place: Place::whole(offset, bytes),
        }
    }

    /// The stored part of data row `r`.
    #[inline]
    fn stored(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.bytes + self.place.skip..][..self.place.len]
    }

    /// All of data row `r`'s value.
    #[inline]
    pub(crate) fn value(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.bytes..][..self.bytes]
    }
}

/// How the rows of an extend are ordered in the caller's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowOrder {
    /// ndim 1: step `j` is row `j`.
    Flat,
    /// ndim 2, data `[t, envs]`: step `j`, env `e` is row `j * envs + e`.
    TimeMajor { envs: u64, env0: u64 },
    /// ndim 2, data `[envs, t]` (`dim_extend = 1`): row `e * steps + j`.
    EnvMajor { steps: u64, env0: u64 },
}

impl RowOrder {
    /// The row of the caller's data holding step `step`, lane `lane`.
    #[inline]
    pub(crate) fn row(&self, step: u64, lane: u64) -> usize {
        (match *self {
            RowOrder::Flat => step,
            RowOrder::TimeMajor { envs, env0 } => step * envs + env0 + lane,
            RowOrder::EnvMajor { steps, env0 } => (env0 + lane) * steps + step,
        }) as usize
    }

    /// The data rows of consecutive slots of a run whose first step is data step
    /// `j`, `width` lanes a step: `out[g]` gets the row of the run's slot `s + g`
    /// (step `j + (s + g) / width`, lane `(s + g) % width`).
    #[inline]
    pub(crate) fn rows_of(&self, j: u64, width: u64, s: u64, out: &mut [usize]) {
        if let (RowOrder::Flat, 1) = (self, width) {
            let first = (j + s) as usize;
            for (g, row) in out.iter_mut().enumerate() {
                *row = first + g;
            }
            return;
        }
        let (mut step, mut lane) = (j + s / width, s % width);
        for row in out {
            *row = self.row(step, lane);
            lane += 1;
            if lane == width {
                (step, lane) = (step + 1, 0);
            }
        }
    }
}

/// The rows an extend writes.
#[derive(Clone, Debug)]
pub(crate) struct Source<'a> {
    pub(crate) cols: SmallVec<[SrcCol<'a>; 8]>,
    pub(crate) order: RowOrder,
}

impl<'a> Source<'a> {
    /// Rows `a..b` of an ndim-1 (`Flat`) source, as a source of their own.
    pub(crate) fn rows(&self, a: u64, b: u64) -> Source<'a> {
        let (a, b) = (a as usize, b as usize);
        Source {
            cols: self
                .cols
                .iter()
                .map(|c| SrcCol {
                    data: &c.data[a * c.bytes..b * c.bytes],
                    ..*c
                })
                .collect(),
            order: self.order,
        }
    }

    /// The same data seen from one env group (`env0` onward) of an ndim-2 storage.
    pub(crate) fn for_group(&self, env0: u64) -> Source<'a> {
        let order = match self.order {
            RowOrder::Flat => RowOrder::Flat,
            RowOrder::TimeMajor { envs, .. } => RowOrder::TimeMajor { envs, env0 },
            RowOrder::EnvMajor { steps, .. } => RowOrder::EnvMajor { steps, env0 },
        };
        Source {
            cols: self.cols.clone(),
            order,
        }
    }

    /// Stores row (`step`, `lane`) of the data into the row at byte `row` of `words`.
    #[inline]
    pub(crate) fn write_row(&self, words: &[AtomicU64], row: usize, step: u64, lane: u64) {
        let r = self.order.row(step, lane);
        for c in &self.cols {
            atomic_copy::store(words, row + c.place.offset, c.stored(r));
        }
    }

    /// Stores data rows `rows[k]` into the rows at bytes `first + k * step` of
    /// `words`, for an append too large to stay in cache: fields of at least
    /// [`STREAMING_FIELD_BYTES`] go out as non-temporal stores, between two fences
    /// (`atomic_copy::store_streaming`): the slots' writing marks are visible before
    /// any of the rows, and all of the rows before the publishing stores after them.
    pub(crate) fn write_rows_streaming(
        &self,
        words: &[AtomicU64],
        first: usize,
        step: usize,
        rows: &[usize],
    ) {
        atomic_copy::streaming_fence();
        for (k, &r) in rows.iter().enumerate() {
            let row = first + k * step;
            for c in &self.cols {
                let data = c.stored(r);
                if data.len() >= STREAMING_FIELD_BYTES {
                    atomic_copy::store_streaming(words, row + c.place.offset, data);
                } else {
                    atomic_copy::store(words, row + c.place.offset, data);
                }
            }
        }
        atomic_copy::streaming_fence();
    }

    /// Starts loading, for writing, the lines of the row at byte `row` of `words` that
    /// [`Source::write_rows_streaming`] writes through the cache: every line of a
    /// field it stores cached, and a streamed field's partial first and last lines
    /// (its whole lines go out by non-temporal stores, which need none loaded).
    #[inline]
    pub(crate) fn prefetch_cached_lines(&self, words: &[AtomicU64], row: usize) {
        use atomic_copy::Intent::Write;
        for c in &self.cols {
            let Place { offset, len, .. } = c.place;
            let (first, end) = (row + offset, row + offset + len);
            if len >= STREAMING_FIELD_BYTES {
                atomic_copy::prefetch(words, first, Write);
                atomic_copy::prefetch(words, end - 1, Write);
            } else {
                atomic_copy::prefetch_lines(words, first, end, Write);
            }
        }
    }
}

/// How many rows `r` of a buffer of `len` bytes, a row every `stride` bytes, have
/// their `r * stride..r * stride + end` inside it (all of them if `stride` is 0 and
/// the first fits).
fn rows_within(len: usize, stride: usize, end: usize) -> usize {
    match len.checked_sub(end) {
        Some(room) => room.checked_div(stride).map_or(usize::MAX, |r| r + 1),
        None => 0,
    }
}

/// The one check of a row copy planned by [`RowCopies`] or [`Dest`]: row `r` of the
/// caller's `rows`, and the stored row at byte `row`, `span` bytes of it, inside
/// `words`.
#[inline]
fn check_row(r: usize, rows: usize, row: usize, span: usize, words: &[AtomicU64]) {
    assert!(
        r < rows
            && row
                .checked_add(span)
                .is_some_and(|end| end <= words.len() * 8),
        "replaybuf internal error: row {r} of {rows}, stored at byte {row}, of a {}-byte region",
        words.len() * 8
    );
}

/// A source's columns set out for the row loop of one append: checked against the
/// caller's data and the region once, so that each row costs one bounds check rather
/// than three a field (a mujoco row's five fields took 357 instructions a row to
/// append before, by callgrind).
#[derive(Debug)]
pub(crate) struct RowCopies<'a> {
    cols: SmallVec<[ColCopy<'a>; 8]>,
    /// Rows of the data whose every stored part lies inside it.
    rows: usize,
    /// Bytes from a row's start past its last stored byte.
    span: usize,
}

/// One field of [`RowCopies`]: row `r`'s stored part is `data[r * stride..][..copy.len()]`
/// and goes `offset` bytes into the row.
#[derive(Clone, Copy, Debug)]
struct ColCopy<'a> {
    data: &'a [u8],
    stride: usize,
    offset: usize,
    /// The field's length, and the moves that copy it.
    copy: atomic_copy::FieldCopy,
}

impl<'a> RowCopies<'a> {
    pub(crate) fn new(src: &Source<'a>) -> RowCopies<'a> {
        let cols: SmallVec<[ColCopy<'a>; 8]> = src
            .cols
            .iter()
            .map(|c| ColCopy {
                data: c.data.get(c.place.skip..).unwrap_or_default(),
                stride: c.bytes,
                offset: c.place.offset,
                copy: atomic_copy::FieldCopy::new(c.place.len),
            })
            .collect();
        let rows = cols
            .iter()
            .map(|c| rows_within(c.data.len(), c.stride, c.copy.len()))
            .min()
            .unwrap_or(usize::MAX);
        let span = cols
            .iter()
            .map(|c| c.offset + c.copy.len())
            .max()
            .unwrap_or(0);
        RowCopies { cols, rows, span }
    }

    /// Stores data rows `rows[k]` into the rows at bytes `first + k * step` of `words`
    /// (all held for writing, under the stamp protocol), a field at a time: each
    /// field's source and moves stay in registers across the rows, and its copies run
    /// with no branch (`atomic_copy::FieldCopy`). One check covers every copy.
    #[inline]
    pub(crate) fn write_rows(
        &self,
        words: &[AtomicU64],
        first: usize,
        step: usize,
        rows: &[usize],
    ) {
        let Some(last) = rows.len().checked_sub(1) else {
            return;
        };
        let max = rows.iter().copied().max().unwrap_or(0);
        let last_row = last
            .checked_mul(step)
            .and_then(|b| b.checked_add(first))
            .unwrap_or(usize::MAX);
        check_row(max, self.rows, last_row, self.span, words);
        for c in &self.cols {
            // SAFETY: every `r < self.rows`, so `r * stride + len <= data.len()`; the
            // last row's `offset + len <= span` lies inside `words`, as do the ones
            // before it.
            unsafe {
                c.copy
                    .store_rows(words, first + c.offset, step, c.data, c.stride, rows)
            };
        }
    }
}

impl RowCopies<'_> {
    /// Gathers data rows `rows[k]` into `stage` at bytes `first + k * step`: private
    /// memory, where a streaming append sets its rows out before storing them
    /// (`Storage::stream_run`). A field at a time, as [`RowCopies::write_rows`], each
    /// field's moves chosen once for all the rows ([`stage_field`]); plain moves, as
    /// no other thread sees `stage`.
    ///
    /// After each field's rows, calls `between(k, fields)` with `k` the fields gathered
    /// so far: a streaming append stores the stage before this one a part at a time
    /// there (`Storage::stream_run`).
    ///
    /// Panics if a row is not a row of the data or a staged row does not fit in `stage`.
    #[inline]
    #[cfg_attr(replaybuf_loom, allow(dead_code))]
    pub(crate) fn stage_rows(
        &self,
        stage: &mut [u8],
        first: usize,
        step: usize,
        rows: StagedRows<'_>,
        mut between: impl FnMut(usize, usize),
    ) {
        let Some(last) = rows.len().checked_sub(1) else {
            return;
        };
        let max = rows.max();
        assert!(
            max < self.rows && first + last * step + self.span <= stage.len(),
            "replaybuf internal error: rows up to {max} staged from {first} of {}",
            stage.len()
        );
        let fields = self.cols.len();
        for (k, c) in self.cols.iter().enumerate() {
            // SAFETY: every row is below `self.rows`, so `r * stride + len <=
            // data.len()`; every staged row's field ends by `first + last * step +
            // span <= stage.len()` (asserted).
            unsafe { stage_field(c, stage.as_mut_ptr().add(first + c.offset), step, rows) };
            between(k + 1, fields);
        }
    }
}

/// The data rows a stage takes, in its order: `Run(r, n)` the `n` rows from `r` on
/// (a flat source's rows: the moves then walk the columns, with no index to load and
/// multiply for each row), `Listed` any others.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(replaybuf_loom, allow(dead_code))]
pub(crate) enum StagedRows<'r> {
    Run(usize, usize),
    Listed(&'r [usize]),
}

#[cfg_attr(replaybuf_loom, allow(dead_code))]
impl StagedRows<'_> {
    fn len(self) -> usize {
        match self {
            StagedRows::Run(_, n) => n,
            StagedRows::Listed(rows) => rows.len(),
        }
    }

    /// The highest row, or 0 if none.
    fn max(self) -> usize {
        match self {
            StagedRows::Run(r, n) => (r + n).saturating_sub(1),
            StagedRows::Listed(rows) => rows.iter().copied().max().unwrap_or(0),
        }
    }
}

/// Copies field `c` of data rows `rows[k]` to `dst + k * step` ([`stage_moves`]): by
/// 64-byte moves for fields of 64 bytes or more where the CPU has AVX-512, 32-byte
/// AVX moves where it has AVX, and 16-byte SSE moves elsewhere.
///
/// # Safety
///
/// As for [`stage_moves`].
#[inline]
#[cfg_attr(replaybuf_loom, allow(dead_code))]
unsafe fn stage_field(c: &ColCopy<'_>, dst: *mut u8, step: usize, rows: StagedRows<'_>) {
    #[cfg(target_arch = "x86_64")]
    if c.copy.len() >= 64 && crate::cpu::avx512f() {
        // SAFETY: the caller's obligations; the CPU has AVX-512.
        return unsafe { stage_field_avx512(c, dst, step, rows) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::avx() {
        // SAFETY: the caller's obligations; the CPU has AVX.
        return unsafe { stage_field_avx(c, dst, step, rows) };
    }
    // SAFETY: the caller's obligations.
    unsafe { stage_moves::<16>(c, dst, step, rows) }
}

/// [`stage_moves`] by 64-byte moves, compiled for AVX-512: fields of 64 bytes or
/// more, whose rows then take fewer stores (a 68-byte field two, not three), and a
/// streaming append's gather less of the store bandwidth its non-temporal stores
/// share (`Storage::stream_run`). Measured (Intel Xeon, family 6 model 207,
/// 2026-11-30; one process alternating with 32-byte moves in 30 laps, the median of
/// the laps' ratios): 1,000 mujoco rows into a million 0.962x and 0.975x; 1,000
/// 168-byte `TypedBuffer` rows (one field) 0.937x and 0.947x.
///
/// # Safety
///
/// As for [`stage_moves`], on a CPU with AVX-512.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[cfg_attr(replaybuf_loom, allow(dead_code))]
unsafe fn stage_field_avx512(c: &ColCopy<'_>, dst: *mut u8, step: usize, rows: StagedRows<'_>) {
    // SAFETY: the caller's obligations.
    unsafe { stage_moves::<64>(c, dst, step, rows) }
}

/// [`stage_moves`] by 32-byte moves, compiled for AVX.
///
/// # Safety
///
/// As for [`stage_moves`], on a CPU with AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stage_field_avx(c: &ColCopy<'_>, dst: *mut u8, step: usize, rows: StagedRows<'_>) {
    // SAFETY: the caller's obligations.
    unsafe { stage_moves::<32>(c, dst, step, rows) }
}

/// Copies field `c` of data rows `rows[k]` to `dst + k * step`: moves of `W` bytes
/// from the field's start and one ending at its end (for fields shorter than `W`, two
/// moves of the largest power of two not above the length, which overlap where the
/// length is not one; or one byte), the kind chosen once for all the rows, so that
/// each row's copy is a few moves with no branch but its loop's.
///
/// # Safety
///
/// For every `k`, `c.data[rows[k] * c.stride..][..len]` is in bounds, and `dst + k *
/// step` is valid for writes of `len` bytes that nothing else accesses.
#[inline(always)]
#[cfg_attr(replaybuf_loom, allow(dead_code))]
unsafe fn stage_moves<const W: usize>(
    c: &ColCopy<'_>,
    dst: *mut u8,
    step: usize,
    rows: StagedRows<'_>,
) {
    match rows {
        // SAFETY: the caller's obligations, for rows `r..r + n`.
        StagedRows::Run(r, n) => unsafe {
            let src = c.data.as_ptr().add(r * c.stride);
            stage_moves_by::<W>(c.copy.len(), n, |k| src.add(k * c.stride), dst, step)
        },
        // SAFETY: the caller's obligations, for the listed rows.
        StagedRows::Listed(rows) => unsafe {
            let src = c.data.as_ptr();
            stage_moves_by::<W>(
                c.copy.len(),
                rows.len(),
                |k| src.add(rows[k] * c.stride),
                dst,
                step,
            )
        },
    }
}

/// [`stage_moves`] of `n` rows of a field of `len` bytes, row `k`'s bytes at `src(k)`:
/// moves of `W` from the field's start while a whole one fits (of 16 or 32 bytes, or
/// of the largest power of two, below `W`), then one move of the smallest of 4, 8,
/// 16, 32 and 64 bytes that covers the rest, ending at the field's end; a field of 1,
/// 2, 4 or 8 bytes is one move. A 68-byte field is two moves of 32 and one of 4
/// (where the CPU has no AVX-512), where moves of 32 ending at the end wrote 96
/// bytes: a stage's time is its stores' bytes.
/// Measured (AMD EPYC family 26, 2026-11-28, two rounds alternating, against the last
/// move as wide as the others): 1,000 mujoco rows into a million 5.51-5.61 us against
/// 5.76-5.84; 256 rows of 100 bytes (two 46-byte fields) into 512 MB 1.14 us against
/// 1.25-1.26. One move for mujoco's 4-byte reward and 1-byte done, not two: 5.31-5.42
/// us against 5.52-5.60.
///
/// # Safety
///
/// For every `k < n`, `src(k)` is valid for reads and `dst + k * step` for writes of
/// `len` bytes, which nothing else writes.
#[inline(always)]
#[cfg_attr(replaybuf_loom, allow(dead_code))]
unsafe fn stage_moves_by<const W: usize>(
    len: usize,
    n: usize,
    src: impl Fn(usize) -> *const u8,
    dst: *mut u8,
    step: usize,
) {
    // The tails below cover at most `W` bytes past the last whole move.
    const {
        assert!(
            W == 16 || W == 32 || W == 64,
            "stage moves of 16, 32 or 64 bytes"
        )
    };
    /// One plain unaligned move of a `$t` at `$at` bytes into the field.
    macro_rules! mv {
        ($t:ty, $s:ident, $d:ident, $at:expr) => {{
            let v = $s.add($at).cast::<$t>().read_unaligned();
            $d.add($at).cast::<$t>().write_unaligned(v);
        }};
    }
    /// Each row's copy: moves of `$p` bytes at `$m * $p` for each `$m` (unrolled), or
    /// for each `m` below `$count` (a loop), then a `$t` ending at the field's end.
    /// Every move lies in the field's `len` bytes: the callers below keep
    /// `(m + 1) * p <= len`, and no tail is longer than the field.
    macro_rules! moves {
        ($p:expr, $t:ty; $($m:literal)*) => {
            for k in 0..n {
                // SAFETY: the caller's ranges; unaligned plain moves inside them.
                unsafe {
                    let (s, d) = (src(k), dst.add(k * step));
                    $( mv!([u8; $p], s, d, $m * $p); )*
                    mv!($t, s, d, len - std::mem::size_of::<$t>());
                }
            }
        };
        ($p:expr, $t:ty; ..$count:expr) => {
            for k in 0..n {
                // SAFETY: the caller's ranges; unaligned plain moves inside them.
                unsafe {
                    let (s, d) = (src(k), dst.add(k * step));
                    for m in 0..$count {
                        mv!([u8; $p], s, d, m * $p);
                    }
                    mv!($t, s, d, len - std::mem::size_of::<$t>());
                }
            }
        };
    }
    /// A field of at most two `$t`s: one from the start and one ending at the end, or
    /// the one where the field is a `$t` long.
    macro_rules! pairs {
        ($t:ty) => {{
            const P: usize = std::mem::size_of::<$t>();
            if len == P {
                moves!(P, $t;)
            } else {
                moves!(P, $t; 0)
            }
        }};
    }
    /// [`moves!`] of `$p` bytes covering `$covered` bytes, with the tail the rest
    /// asks for: the smallest of 4, 8, 16, 32 and 64 bytes at least `len - $covered`,
    /// or a move of `$p` again where none is left (it then rewrites the last block's
    /// bytes with themselves).
    macro_rules! with_tail {
        ($p:expr, $covered:expr; $($blocks:tt)*) => {
            match len - $covered {
                0 => moves!($p, [u8; $p]; $($blocks)*),
                1..=4 => moves!($p, u32; $($blocks)*),
                5..=8 => moves!($p, u64; $($blocks)*),
                9..=16 => moves!($p, u128; $($blocks)*),
                17..=32 => moves!($p, [u8; 32]; $($blocks)*),
                _ => moves!($p, [u8; 64]; $($blocks)*),
            }
        };
    }
    match len {
        0 => {}
        1 => pairs!(u8),
        2..4 => pairs!(u16),
        4..8 => pairs!(u32),
        8..16 => pairs!(u64),
        // A move of 16, then the rest's (at most 16 more where `W` is 32 or 64).
        len if len < W.min(32) => with_tail!(16, 16; 0),
        // `W` 64: a move of 32, then the rest's (at most 32 more).
        len if len < W => with_tail!(32, 32; 0),
        // One to four moves of `W` and the one that ends the field, unrolled: most
        // fields of a row (the loop below costs a branch a move). The rest is under
        // `W`, so its tail is at most `W` (64 bytes at the most, AVX-512's).
        len if len < 5 * W => match len / W {
            1 => with_tail!(W, W; 0),
            2 => with_tail!(W, 2 * W; 0 1),
            3 => with_tail!(W, 3 * W; 0 1 2),
            _ => with_tail!(W, 4 * W; 0 1 2 3),
        },
        // Five moves of `W` or more: a loop of them, then the tail.
        len => {
            let whole = len / W;
            with_tail!(W, whole * W; ..whole)
        }
    }
}

/// A field this long or longer is written with non-temporal stores by a streaming
/// append; a shorter one is not worth its partial lines and the two fences its row
/// then waits at. Measured (`benches/extend.rs`, 256-row chunks into 512 MB rings,
/// 2026-11-27): rows of 3 KB (two 1.5 KB fields) took 99.6 us streamed at a 1 KiB
/// threshold and 46-53 us cached, beside a raw copy of 64-67 us; 16 KB rows (two
/// 8 KB fields) 268 us streamed and 366 us cached.
pub(crate) const STREAMING_FIELD_BYTES: usize = 4096;

/// One field's destination in the caller's buffers, for every row. Its parts are set
/// once: a [`Dest`] checks them when it is made.
#[derive(Debug)]
pub(crate) struct DstCol<'a> {
    /// Row after row, `bytes` each.
    data: &'a mut [u8],
    bytes: usize,
    /// Where the field lies in a stored row, and where in each row's value the stored
    /// bytes go (as [`SrcCol`]); the rest is rebuilt from other rows (`frames.rs`).
    place: Place,
    /// The moves of a copy of the stored part.
    copy: atomic_copy::FieldCopy,
}

impl<'a> DstCol<'a> {
    /// Rows of `bytes` each into `data`, their stored part at `place`.
    pub(crate) fn new(data: &'a mut [u8], bytes: usize, place: Place) -> DstCol<'a> {
        DstCol {
            data,
            bytes,
            place,
            copy: atomic_copy::FieldCopy::new(place.len),
        }
    }

    /// A field stored whole.
    pub(crate) fn whole(data: &'a mut [u8], bytes: usize, offset: usize) -> DstCol<'a> {
        DstCol::new(data, bytes, Place::whole(offset, bytes))
    }

    /// All of output row `k`'s value.
    #[inline]
    pub(crate) fn value_mut(&mut self, k: usize) -> &mut [u8] {
        &mut self.data[k * self.bytes..][..self.bytes]
    }
}

/// Where sampled rows go: the columns, checked once when made against every row
/// they can take, so that a row read costs one bounds check rather than three a field
/// (the read side of [`RowCopies`]: a mujoco sample went from 599 to 528 instructions
/// a row by callgrind, and from 9.5 to 9.1 us for 256 rows in cache).
#[derive(Debug)]
pub(crate) struct Dest<'a> {
    cols: SmallVec<[DstCol<'a>; 8]>,
    /// Output rows whose every stored part lies inside its column.
    rows: usize,
    /// Bytes from a stored row's start past the last byte any column reads.
    span: usize,
}

impl<'a> Dest<'a> {
    pub(crate) fn new(cols: SmallVec<[DstCol<'a>; 8]>) -> Dest<'a> {
        let rows = cols
            .iter()
            .map(|c| rows_within(c.data.len(), c.bytes, c.place.skip + c.place.len))
            .min()
            .unwrap_or(usize::MAX);
        let span = cols
            .iter()
            .map(|c| c.place.offset + c.place.len)
            .max()
            .unwrap_or(0);
        Dest { cols, rows, span }
    }

    /// Column `i`.
    pub(crate) fn col_mut(&mut self, i: usize) -> &mut DstCol<'a> {
        &mut self.cols[i]
    }

    /// Columns `a` and `b` (different ones) at once.
    pub(crate) fn two_cols_mut(&mut self, a: usize, b: usize) -> [&mut DstCol<'a>; 2] {
        self.cols
            .get_disjoint_mut([a, b])
            .expect("replaybuf internal error: two columns that are one")
    }

    /// Zeroes row `k` of the destination (a slice batch's padding).
    pub(crate) fn zero_row(&mut self, k: usize) {
        for c in &mut self.cols {
            c.value_mut(k).fill(0);
        }
    }

    /// Copies each row `(row, k)` of `rows`, at byte `row` of `words`, into row `k` of
    /// the destination: a column at a time, so that each field's moves are chosen once
    /// for all the rows (the read side of [`RowCopies::write_rows`]).
    #[inline]
    pub(crate) fn read_rows(&mut self, words: &[AtomicU64], rows: &[(usize, usize)]) {
        for &(row, k) in rows {
            check_row(k, self.rows, row, self.span, words);
        }
        for c in &mut self.cols {
            let Place { offset, skip, .. } = c.place;
            // SAFETY: every `k < self.rows`, so `k * bytes + skip + len <= data.len()`;
            // `offset + len <= span` and every `row + span` is inside `words`.
            unsafe { c.copy.load_rows(words, offset, rows, c.data, c.bytes, skip) };
        }
    }

    /// Copies the row at byte `row` of `words` into row `k` of the destination.
    #[inline(always)]
    pub(crate) fn read_row(&mut self, words: &[AtomicU64], row: usize, k: usize) {
        check_row(k, self.rows, row, self.span, words);
        for c in &mut self.cols {
            let Place { offset, skip, len } = c.place;
            let at = k * c.bytes + skip;
            // SAFETY: `k < self.rows`, so `k * bytes + skip + len <= data.len()`.
            let out = unsafe { c.data.get_unchecked_mut(at..at + len) };
            // SAFETY: `out` is the field's `len` bytes; `offset + len <= span` and
            // `row + span` is inside `words`.
            unsafe { c.copy.load(words, row + offset, out) };
        }
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    /// A stage's moves copy every field length exactly, for both widths: each staged
    /// row is its source row's field, and no byte around it changes.
    #[test]
    fn stage_moves_copy_every_length_exactly() {
        const ROWS: usize = 5;
        fn check<const W: usize>(len: usize) {
            let (stride, step) = (len + 3, len + 7);
            let src: Vec<u8> = (0..ROWS * stride)
                .map(|i| (i * 7 + len) as u8 | 1)
                .collect();
            let mut stage = vec![0u8; ROWS * step + 64];
            let dst = stage[32..].as_mut_ptr();
            // SAFETY: row `k` is `src[k * stride..][..len]`, inside `src`; staged row
            // `k` is `len` bytes from `32 + k * step`, inside `stage`.
            unsafe { stage_moves_by::<W>(len, ROWS, |k| src.as_ptr().add(k * stride), dst, step) };
            for (i, &b) in stage.iter().enumerate() {
                let at = i.checked_sub(32).map(|j| (j / step, j % step));
                match at {
                    Some((k, j)) if k < ROWS && j < len => {
                        assert_eq!(
                            b,
                            src[k * stride + j],
                            "W {W}, len {len}, row {k}, byte {j}"
                        )
                    }
                    _ => assert_eq!(b, 0, "W {W}, len {len}: byte {i} outside the rows"),
                }
            }
        }
        for len in 0..=300 {
            check::<16>(len);
            check::<32>(len);
            check::<64>(len);
        }
    }

    /// A group's rows are the rows of its slots one by one, from any slot of a run,
    /// for every order and width.
    #[test]
    fn rows_of_a_group_are_its_slots_rows() {
        let orders = [
            RowOrder::Flat,
            RowOrder::TimeMajor { envs: 6, env0: 2 },
            RowOrder::EnvMajor { steps: 9, env0: 1 },
        ];
        for order in orders {
            for width in [1, 3, 4] {
                for s in 0..13 {
                    let mut out = [0; 7];
                    order.rows_of(5, width, s, &mut out);
                    let want: Vec<usize> = (s..s + 7)
                        .map(|slot| order.row(5 + slot / width, slot % width))
                        .collect();
                    assert_eq!(out.to_vec(), want, "{order:?} width {width} from {s}");
                }
            }
        }
    }
}
