//! Slice sampling (TorchRL `SliceSampler`): windows of consecutive steps of one
//! trajectory, with trajectory boundaries kept as rows are written.
//!
//! # What the storage keeps
//!
//! A trajectory lives in one *lane*: one environment's column of an ndim-2 storage, or
//! one shard's ring of an ndim-1 storage. Trajectories in a lane are numbered in the
//! order they start. For every lane the region holds a small state block and a table:
//!
//! ```text
//! lane block:  | tail | count | last id | last flags | (padding to 8 words) | starts ... |
//! ```
//!
//! - `tail`: every sequence number below it is published and has its trajectory;
//! - `count`: trajectories started below `tail` (and perhaps one at `tail`);
//! - `last id`, `last flags`: the trajectory id and end flags of row `tail - 1`;
//! - `starts[n % steps]`: the sequence number of trajectory `n`'s first row. A lane of
//!   `steps` slots holds at most `steps` live trajectories, so older entries are only
//!   ever overwritten once their trajectories are gone.
//!
//! Every row's slot header also holds its trajectory number and its end flags (the
//! *trajectory word*), so a reader can tell from the row itself, under the same stamp
//! check as its payload, which trajectory it belongs to.
//!
//! # Writers
//!
//! An append whose first row is `s` first waits for each of its lanes' `tail == s`
//! (with one collector per shard, as the API arranges, it never waits), and takes
//! the lane's state into registers (a [`Turn`](crate::storage::lanes::Turn)). For each
//! row it decides from the last id and flags whether the row starts a trajectory,
//! records the start in the table if so, and writes the trajectory word into the
//! header with the row before publishing it. When all its rows are published it stores the state back, `count` with
//! Release, and last `tail = s + steps` with Release. The next append's Acquire load
//! of `tail` orders all of that before its own decisions; a sample sees the append's
//! rows from then on.
//!
//! # Readers
//!
//! A sample reads each lane's `tail` (Acquire), then `count` (Acquire), then the live
//! window's low end from the shard cursor. It picks a trajectory uniformly among the
//! live ones of every lane (TorchRL's distribution), a window inside it, and reads the
//! window's rows with the usual stamp check, requiring each row's trajectory word to
//! name the picked trajectory. A table entry overwritten during the sample, or a row
//! lapped by a writer, fails that check, and the whole window is drawn again: a window
//! is never returned torn or spanning two trajectories.
//!
//! # Without replacement, and by priority
//!
//! Without replacement, an epoch lists every window once when it begins (each live
//! trajectory cut into consecutive windows) and learners share it through the epochs
//! of `without_replacement.rs`; a listed window whose rows were lapped since fails the
//! same checks and is skipped for the next one. By priority, a row is drawn from the
//! concurrent trees of a prioritized buffer, its trajectory found by a binary search
//! of its lane's table, and the window built from it; a draw no window can serve is
//! drawn again (the trees are never written by a sample), and the read also requires
//! the drawn row to be of the lap its leaf names.
//!
//! Layer: algos.

use rand::RngExt;

use crate::dtype::DType;
use crate::error::{BuildErrorKind, SampleError};
use crate::key::Key;
use crate::region::Block;
use crate::rng::Rng;
use crate::sampler::prioritized::{self, Prioritized};
use crate::sampler::without_replacement::{Epochs, WithoutReplacement};
use crate::spec::Spec;
use crate::storage::lanes::{
    Bounds, By, LaneView, Lanes, Scalar, TrajectorySpan, FLAG_DONE, FLAG_TRUNCATED,
};
use crate::storage::Draw;
use crate::sync::AtomicU64;

/// Slice sampling (TorchRL `SliceSampler`): every sample is `num_slices` windows of
/// `slice_len` consecutive steps of one trajectory each, laid out `[num_slices,
/// slice_len]`.
///
/// Exactly one of [`Slice::num_slices`] and [`Slice::slice_len`] fixes the shape; the
/// batch size must be a multiple of it. Trajectories are told apart by an integer
/// trajectory-id field ([`Slice::traj_key`]) or by end flags ([`Slice::end_key`],
/// `("next", "done")` by default). A trajectory is drawn uniformly among the stored
/// ones, then a window uniformly inside it.
///
/// ```
/// use replaybuf::sampler::Slice;
/// let by_id = Slice::slice_len(32).traj_key("traj");
/// let by_flags = Slice::num_slices(8).end_key("done").truncated_key("truncated");
/// let loose = Slice::slice_len(16).strict_length(false).span(usize::MAX, 0);
/// # let _ = (by_id, by_flags, loose);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub(crate) shape: SliceShape,
    pub(crate) traj_key: Option<Key>,
    pub(crate) end_key: Key,
    pub(crate) truncated_key: Option<Key>,
    pub(crate) strict_length: bool,
    pub(crate) span: (usize, usize),
    pub(crate) without_replacement: Option<WithoutReplacement>,
    pub(crate) prioritized: Option<(Prioritized, SlicePriority)>,
}

/// Which rows' priorities decide how likely a slice is (see [`Slice::prioritized`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlicePriority {
    /// A slice is drawn in proportion to its first row's priority, among the rows a
    /// slice can start at (TorchRL's `PrioritizedSliceSampler`).
    #[default]
    Start,
    /// A row is drawn in proportion to its priority and the slice is one of the
    /// windows holding it, uniformly: a slice's chance is the mean of its rows'
    /// priorities (exactly so away from trajectory ends, where fewer windows hold a
    /// row).
    Window,
}

/// What fixes a slice batch's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SliceShape {
    /// This many slices; their length is the batch size over it.
    Count(usize),
    /// Slices this long; their count is the batch size over it.
    Len(usize),
}

impl Slice {
    /// `n` slices per batch, each `batch_size / n` steps long.
    pub fn num_slices(n: usize) -> Slice {
        Slice::with_shape(SliceShape::Count(n))
    }

    /// Slices of `len` steps, `batch_size / len` of them per batch.
    pub fn slice_len(len: usize) -> Slice {
        Slice::with_shape(SliceShape::Len(len))
    }

    fn with_shape(shape: SliceShape) -> Slice {
        Slice {
            shape,
            traj_key: None,
            end_key: Key::from(("next", "done")),
            truncated_key: None,
            strict_length: true,
            span: (0, 0),
            without_replacement: None,
            prioritized: None,
        }
    }

    /// Tells trajectories apart by this integer field: consecutive rows of a lane with
    /// the same id are one trajectory. Takes precedence over the end flags.
    pub fn traj_key(mut self, key: impl Into<Key>) -> Self {
        self.traj_key = Some(key.into());
        self
    }

    /// The flag (bool or integer) that ends a trajectory at its row; default
    /// `("next", "done")`.
    pub fn end_key(mut self, key: impl Into<Key>) -> Self {
        self.end_key = key.into();
        self
    }

    /// A flag (bool or integer) that also ends a trajectory (a time limit), and is
    /// reported as truncation in sampled marks.
    pub fn truncated_key(mut self, key: impl Into<Key>) -> Self {
        self.truncated_key = Some(key.into());
        self
    }

    /// With `true` (the default), trajectories shorter than a slice are never drawn,
    /// and a sample fails if no stored trajectory is long enough. With `false`, a short
    /// trajectory gives a shorter slice, padded, with its padding marked invalid.
    pub fn strict_length(mut self, strict: bool) -> Self {
        self.strict_length = strict;
        self
    }

    /// Lets a slice start up to `left` steps before its trajectory's first step and end
    /// up to `right` steps after its last; the part outside is cut off, so the slice
    /// comes back shorter and padded (TorchRL's `span`). A value of `slice_len` or more
    /// (`usize::MAX`, TorchRL's `True`) leaves at least one step in the slice.
    pub fn span(mut self, left: usize, right: usize) -> Self {
        self.span = (left, right);
        self
    }

    /// Samples without replacement (TorchRL `SliceSamplerWithoutReplacement`): an
    /// epoch cuts every trajectory stored when it begins into consecutive windows of
    /// `slice_len` steps (with `strict_length`, a shorter remainder is left out;
    /// without, it is a padded slice), and hands each window out once, shuffled or in
    /// lane order, to all learners together. A window whose rows collectors have
    /// replaced since the epoch began is skipped. When the windows run out (with
    /// `drop_last`, when fewer than `num_slices` are left) the sample gets
    /// [`SampleError::EpochEnd`] and the next one starts
    /// a new epoch; otherwise the last batch has fewer slices. `span` does not apply.
    /// With `num_slices`, whose slices' length follows the batch size, a sample of
    /// another length than the open epoch's windows starts a new epoch cut at its own.
    pub fn without_replacement(mut self, epochs: WithoutReplacement) -> Self {
        self.without_replacement = Some(epochs);
        self
    }

    /// Draws slices by priority (TorchRL `PrioritizedSliceSampler`), on the concurrent
    /// sum-trees of a prioritized buffer: every row has a priority, set, updated and
    /// weighted as with [`Prioritized`], and `over` says which rows
    /// of a slice count. A draw that lands on a row no slice can start at (too near
    /// its trajectory's end; without `strict_length`, a trajectory shorter than a
    /// slice starts one at its first row only, as TorchRL's) is drawn again: the trees are
    /// never changed by sampling. Every row of a slice carries the slice's importance
    /// weight: its first row's for [`SlicePriority::Start`], the mean of its rows'
    /// masses for [`SlicePriority::Window`]. Not with `without_replacement`.
    ///
    /// `span` applies as it does to uniform slices: a window holding the drawn row
    /// ([`SlicePriority::Window`]) may hang over either end of its trajectory, and a
    /// slice that starts at it ([`SlicePriority::Start`]) over its end, by the right
    /// span (a slice may start that many rows nearer the end); the part outside
    /// is cut off and the slice padded. A start's left span does not apply: its first
    /// row is the one drawn (TorchRL's `PrioritizedSliceSampler` turns it off too).
    pub fn prioritized(mut self, priorities: Prioritized, over: SlicePriority) -> Self {
        self.prioritized = Some((priorities, over));
        self
    }

    /// `(num_slices, slice_len)` for a batch of `n` rows, if `n` divides.
    pub(crate) fn layout(&self, n: usize) -> Option<(usize, usize)> {
        let by = match self.shape {
            SliceShape::Count(c) | SliceShape::Len(c) => c,
        };
        if by == 0 || n == 0 || !n.is_multiple_of(by) {
            return None;
        }
        Some(match self.shape {
            SliceShape::Count(c) => (c, n / c),
            SliceShape::Len(l) => (n / l, l),
        })
    }

    /// The span `(left, right)` for slices of `len` rows: at most `len - 1` each, so
    /// that at least one row of the trajectory stays in the slice.
    pub(crate) fn span_for(&self, len: u64) -> (u64, u64) {
        let cap = len.saturating_sub(1);
        ((self.span.0 as u64).min(cap), (self.span.1 as u64).min(cap))
    }

    /// [`Slice::layout`] for a sample of `n` rows, or the sample's refusal.
    pub(crate) fn sample_layout(&self, n: usize) -> Result<(usize, usize), SampleError> {
        self.layout(n).ok_or(SampleError::SliceBatchSize {
            batch: n,
            divisor: self.divisor(),
        })
    }

    /// The divisor a batch size must be a multiple of.
    pub(crate) fn divisor(&self) -> usize {
        match self.shape {
            SliceShape::Count(c) | SliceShape::Len(c) => c,
        }
    }

    /// Resolves the keys against `spec`, or says which one is wrong.
    pub(crate) fn bounds(&self, spec: &Spec) -> Result<Bounds, BuildErrorKind> {
        if self.divisor() == 0 {
            return Err(BuildErrorKind::Sampler {
                reason: "num_slices and slice_len must be at least 1",
            });
        }
        if self.prioritized.is_some() && self.without_replacement.is_some() {
            return Err(BuildErrorKind::Sampler {
                reason: "a slice sampler is prioritized or without replacement, not both",
            });
        }
        let flag = |key: &Key, integer_only: bool| {
            let bad = |reason| BuildErrorKind::SliceKey {
                key: key.clone(),
                reason,
            };
            let (i, f) = spec
                .field(key)
                .ok_or_else(|| bad("no such field in the spec"))?;
            if f.elements() != 1 {
                return Err(bad("must hold one value per row"));
            }
            let ok = match f.dtype() {
                DType::Bool => !integer_only,
                DType::F16 | DType::BF16 | DType::F32 | DType::F64 => false,
                _ => true,
            };
            if !ok {
                return Err(bad(if integer_only {
                    "a trajectory id must be an integer field"
                } else {
                    "an end flag must be a bool or integer field"
                }));
            }
            Ok(Scalar {
                field: i,
                dtype: f.dtype(),
            })
        };
        let by = match &self.traj_key {
            Some(key) => By::Id(flag(key, true)?),
            None => By::End(flag(&self.end_key, false)?),
        };
        let truncated = match &self.truncated_key {
            Some(key) => Some(flag(key, false)?),
            None => None,
        };
        Ok(Bounds::new(by, truncated))
    }
}

/// A picked window: trajectory `traj` of a lane, its live extent and the rows read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SliceWindow {
    pub(crate) shard: u32,
    pub(crate) lane: u32,
    pub(crate) traj: u64,
    /// The trajectory's first row (it may be evicted already) and its end: the next
    /// trajectory's first row, or `None` for a trajectory still open at the tail.
    pub(crate) start: u64,
    pub(crate) next: Option<u64>,
    /// The rows to read: `from..to`.
    pub(crate) from: u64,
    pub(crate) to: u64,
    /// A prioritized slice: the row its draw landed on, and the lap its leaf had (the
    /// row must still be of that lap).
    pub(crate) drawn: Option<(u64, u32)>,
    /// The importance weight of every row (1 unless prioritized).
    pub(crate) weight: f32,
}

impl SliceWindow {
    /// Row `seq` of the window's lane, as a draw.
    #[inline]
    pub(crate) fn draw(&self, seq: u64) -> Draw {
        Draw {
            shard: self.shard,
            lane: self.lane,
            seq,
            ..Draw::default()
        }
    }
}

/// Why a pick gave no window: the trajectory has no live row, or is shorter than a
/// slice. Pick again.
pub(crate) enum NoPick {
    Again,
}

/// Picks a trajectory uniformly among `views` (whose trajectory counts add up to
/// `total`) and a window of `len` steps inside it.
pub(crate) fn pick(
    lanes: &Lanes,
    words: &[AtomicU64],
    views: &[LaneView],
    cumulative: &[u64],
    cfg: &Slice,
    len: u64,
    rng: &mut Rng,
) -> Result<SliceWindow, NoPick> {
    let total = *cumulative.last().unwrap_or(&0);
    let r = rng.random_range(0..total);
    let i = cumulative.partition_point(|&c| c <= r);
    let v = &views[i];
    let before = if i == 0 { 0 } else { cumulative[i - 1] };
    let n = v.first + (r - before);
    let span = lanes.trajectory(words, v, n);
    let (start, next, a, b) = (span.start, span.next, span.lo, span.hi);
    if b <= a || (cfg.strict_length && b - a < len) {
        return Err(NoPick::Again);
    }
    let (left, right) = cfg.span_for(len);
    let (left, right) = (left as i128, right as i128);
    let lowest = a as i128 - left;
    let highest = (b as i128 - len as i128 + right).max(lowest);
    let w0 = rng.random_range(lowest..=highest);
    let from = w0.max(a as i128) as u64;
    let to = (w0 + len as i128).min(b as i128) as u64;
    Ok(SliceWindow {
        shard: v.shard,
        lane: v.lane,
        traj: n,
        start,
        next,
        from,
        to,
        drawn: None,
        weight: 1.0,
    })
}

/// A slice sampler's running state: its settings, and its epochs when it samples
/// without replacement.
#[derive(Debug)]
pub(crate) struct SliceState {
    pub(crate) cfg: Slice,
    pub(crate) epochs: Option<Epochs<SliceWindow>>,
    pub(crate) priorities: Option<prioritized::Priorities>,
}

impl SliceState {
    pub(crate) fn new(cfg: Slice, seed: u64, globals: Block) -> SliceState {
        SliceState {
            epochs: cfg.without_replacement.map(|w| Epochs::new(w, seed)),
            priorities: cfg
                .prioritized
                .map(|(p, _)| prioritized::Priorities::new(p, globals)),
            cfg,
        }
    }
}

/// Every window of an epoch: each live trajectory of `views` cut into consecutive
/// windows of `len` steps, lane after lane; a shorter remainder only when not
/// `strict`.
pub(crate) fn epoch_windows(
    lanes: &Lanes,
    words: &[AtomicU64],
    views: &[LaneView],
    len: u64,
    strict: bool,
    out: &mut Vec<SliceWindow>,
) {
    for v in views {
        for n in v.first..v.count {
            let span = lanes.trajectory(words, v, n);
            let (start, next, a, b) = (span.start, span.next, span.lo, span.hi);
            let mut from = a;
            while from < b && (!strict || b - from >= len) {
                let to = (from + len).min(b);
                out.push(SliceWindow {
                    shard: v.shard,
                    lane: v.lane,
                    traj: n,
                    start,
                    next,
                    from,
                    to,
                    drawn: None,
                    weight: 1.0,
                });
                from = to;
            }
        }
    }
}

/// The most live steps of any one trajectory the views list, or `None` if a writer
/// lapped a lane during the scan: a trajectory whose next start then reads as past the
/// view's tail, or its own start past its end, reads as no rows, and the scan says
/// nothing about the lengths.
pub(crate) fn longest(lanes: &Lanes, words: &[AtomicU64], views: &[LaneView]) -> Option<u64> {
    let mut best = 0;
    for v in views {
        for n in v.first..v.count {
            let TrajectorySpan { lo: a, hi: b, .. } = lanes.trajectory(words, v, n);
            if b < a {
                return None;
            }
            best = best.max(b - a);
        }
    }
    Some(best)
}

/// A row's marks in a slice batch (see [`crate::Batch::marks`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct Marks(u8);

impl Marks {
    const VALID: u8 = 1;
    const START: u8 = 2;
    const END: u8 = 4;
    const TRUNCATED: u8 = 8;

    /// The row holds data (not padding after a short slice).
    pub fn is_valid(self) -> bool {
        self.0 & Self::VALID != 0
    }

    /// The row is its trajectory's first step.
    pub fn is_start(self) -> bool {
        self.0 & Self::START != 0
    }

    /// The row is its trajectory's last step: its end or truncation flag was set, or the
    /// next row of its lane begins another trajectory.
    pub fn is_end(self) -> bool {
        self.0 & Self::END != 0
    }

    /// The trajectory goes on past this row but the slice does not (the slice's last
    /// row, unless it ends the trajectory), or the row's truncation flag was set.
    pub fn is_truncated(self) -> bool {
        self.0 & Self::TRUNCATED != 0
    }

    /// The marks of row `seq` of window `w`, whose trajectory word is `word`.
    pub(crate) fn of(w: &SliceWindow, seq: u64, word: u64) -> Marks {
        let mut m = Self::VALID;
        if seq == w.start {
            m |= Self::START;
        }
        // A truncation flag ends the trajectory as a done flag does: the row is its
        // last step whether or not a row of the lane has come after it yet.
        let end = word & (FLAG_DONE | FLAG_TRUNCATED) != 0 || w.next == Some(seq + 1);
        if end {
            m |= Self::END;
        }
        if word & FLAG_TRUNCATED != 0 || (seq + 1 == w.to && !end) {
            m |= Self::TRUNCATED;
        }
        Marks(m)
    }
}
