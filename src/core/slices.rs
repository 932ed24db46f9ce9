//! The slice sample: windows of trajectories picked from the lanes' tables and read
//! row by row under the slot protocol (see `sampler/slice.rs` for what the storage
//! keeps and the rules of a window).
//!
//! Layer: core.

use rand::RngExt;
use smallvec::SmallVec;

use super::{Core, SampleOut, SampleParts};
use crate::batch::Scratch;
use crate::error::SampleError;
use crate::rng::Rng;
use crate::sampler::prioritized::{self, Masses};
use crate::sampler::slice::{self, Marks, NoPick, Slice, SlicePriority};
use crate::sampler::without_replacement::Epochs;
use crate::storage::lanes::{LaneView, Lanes, TrajectorySpan, TRAJ_MASK};
use crate::storage::shard::Window as ShardWindow;
use crate::storage::Miss;
use crate::sumtree::tree::Tree;
use crate::sync::Backoff;

impl Core {
    /// Samples `n` rows as windows of one trajectory each into `out`, shaped
    /// `[num_slices, slice_len]` (see `sampler/slice.rs`); returns the rows written.
    /// Every window is picked first and its first rows prefetched, so that the
    /// windows' memory misses overlap; then each is read, and one that does not read
    /// whole is picked again.
    pub(crate) fn sample_slices(
        &self,
        state: &slice::SliceState,
        rng: &mut Rng,
        n: usize,
        out: &mut impl SampleOut,
        scratch: &mut Scratch,
    ) -> Result<usize, SampleError> {
        let cfg = &state.cfg;
        let (slices, len) = cfg.sample_layout(n)?;
        let spec = self.storage.spec();
        let map = out.column_map(spec)?;
        out.check_weighted(state.priorities.is_some())?;
        let lanes = self
            .storage
            .lanes()
            .expect("replaybuf internal error: a slice buffer without lane blocks");
        let Scratch {
            lanes: views,
            cumulative,
            slices: windows,
            windows: shard_windows,
            ..
        } = scratch;
        let trees = self.storage.trees();
        let prio = state.priorities.as_ref().map(|p| Prio {
            state: p,
            over: cfg
                .prioritized
                .map_or(SlicePriority::Start, |(_, over)| over),
            min: trees.iter().map(Tree::min).min().unwrap_or(u64::MAX),
            masses: Masses::new(&trees),
            trees: &trees,
            shard_windows,
            first_view: SmallVec::new(),
        });
        let mut picker = Picker {
            buffer: self,
            cfg,
            lanes,
            views,
            cumulative,
            len: len as u64,
            failures: 0,
            backoff: Backoff::new(),
            prio,
            starts: None,
        };
        windows.clear();
        if let Some(epochs) = &state.epochs {
            return self.read_epoch_slices(epochs, picker, windows, slices, out, &map);
        }
        if picker.refresh() == 0 {
            return Err(SampleError::Empty);
        }
        for _ in 0..slices {
            windows.push(picker.pick(rng)?);
        }
        self.prefetch_windows(windows);
        let weighted = picker.prio.is_some();
        out.shape_slices(slices, len, weighted);
        let mut parts = out.parts(&self.storage, &map);
        parts.weight = parts.weight.filter(|_| weighted);
        for (s, &first_pick) in windows.iter().enumerate() {
            let mut w = first_pick;
            while !self.read_window(&w, s * len, len, &mut parts) {
                picker.failures += 1;
                w = picker.pick(rng)?;
            }
        }
        Ok(slices * len)
    }

    /// The without-replacement slice sample: the open epoch's next `slices` windows
    /// (see [`Slice::without_replacement`]), each read once; a window whose rows were
    /// replaced since the epoch began is skipped for the epoch's next one. Returns the
    /// rows written.
    fn read_epoch_slices(
        &self,
        epochs: &Epochs<slice::SliceWindow>,
        mut picker: Picker<'_>,
        windows: &mut Vec<slice::SliceWindow>,
        slices: usize,
        out: &mut impl SampleOut,
        map: &[usize],
    ) -> Result<usize, SampleError> {
        let (len, strict) = (picker.len, picker.cfg.strict_length);
        let in_rows = |e| match e {
            SampleError::NotEnough {
                requested,
                available,
            } => SampleError::NotEnough {
                requested: requested * len as usize,
                available: available * len as usize,
            },
            e => e,
        };
        // Whether a window was cut for slices of this sample's length. An epoch is cut
        // at one length, and a `num_slices` sampler's length follows the batch size: a
        // window cut longer overran its slice (a panic), and one cut shorter made a
        // strict slice short.
        let fits = |w: &slice::SliceWindow| {
            let rows = w.to - w.from;
            rows <= len && (!strict || rows == len)
        };
        for fresh in [false, true] {
            // The longest trajectory, when a new epoch found no window at all: rows,
            // but none in a trajectory as long as a strict slice.
            let mut too_short = None;
            epochs
                .take(
                    slices,
                    |out| {
                        let trajectories = picker.refresh();
                        let words = self.storage.words();
                        slice::epoch_windows(picker.lanes, words, picker.views, len, strict, out);
                        if out.is_empty() && trajectories > 0 && strict {
                            too_short = slice::longest(picker.lanes, words, picker.views);
                        }
                    },
                    windows,
                )
                .map_err(|e| match (e, too_short) {
                    (SampleError::Empty, Some(longest)) => SampleError::TrajectoriesTooShort {
                        slice_len: len as usize,
                        longest,
                    },
                    (e, _) => in_rows(e),
                })?;
            if fresh || windows.iter().all(fits) {
                break;
            }
            // The open epoch was cut at another length: a new one is cut at this one.
            // (A window that still does not fit, cut by a learner of another length in
            // between, is skipped below.)
            epochs.close();
            windows.clear();
        }
        self.prefetch_windows(windows);
        let len = len as usize;
        out.shape_slices(slices, len, false);
        let mut parts = out.parts(&self.storage, map);
        parts.weight = None;
        let mut read = 0;
        let mut next = 0;
        while read < slices {
            if next == windows.len() {
                // A window was skipped: the epoch's next one stands in, if any is left.
                if !epochs.take_more(1, windows) {
                    break;
                }
            }
            let mut w = windows[next];
            if w.next.is_none() {
                // Cut while its trajectory was the lane's last: whether a row has
                // begun another since says if its last row ends it (its marks).
                w.next = picker.lanes.next_start(
                    self.storage.words(),
                    w.shard as usize,
                    u64::from(w.lane),
                    w.traj,
                );
            }
            if fits(&w) && self.read_window(&w, read * len, len, &mut parts) {
                read += 1;
            }
            next += 1;
        }
        drop(parts);
        let drop_last = epochs.drop_last();
        if read == 0 || (drop_last && read < slices) {
            // The windows ran out under this sample: the epoch is over.
            epochs.close_exhausted();
            return Err(SampleError::EpochEnd);
        }
        out.shape_slices(read, len, false);
        Ok(read * len)
    }

    /// Prefetches the first rows of every window.
    fn prefetch_windows(&self, windows: &[slice::SliceWindow]) {
        for w in windows {
            for seq in w.from..w.from + (w.to - w.from).min(SLICE_PREFETCH_ROWS) {
                self.storage.prefetch(self.storage.locate(w.draw(seq)));
            }
        }
    }

    /// Reads window `w` into rows `first..first + len` of `out`, padding after its
    /// rows; `false` if a row was lapped or belongs to another trajectory (a table
    /// entry overwritten under the pick).
    fn read_window(
        &self,
        w: &slice::SliceWindow,
        first: usize,
        len: usize,
        out: &mut SampleParts<'_>,
    ) -> bool {
        let rows = (w.to - w.from) as usize;
        for i in 0..rows {
            let ahead = w.from + (i as u64) + SLICE_PREFETCH_ROWS;
            if ahead < w.to {
                self.storage.prefetch(self.storage.locate(w.draw(ahead)));
            }
            let (seq, k) = (w.from + i as u64, first + i);
            let read = loop {
                match self.storage.read_slice_row(w.draw(seq), &mut out.dest, k) {
                    Err(Miss::Torn) => continue,
                    other => break other,
                }
            };
            match read {
                // A prioritized slice's drawn row must be the one its leaf's mass is for.
                Ok((stamp, _, _))
                    if w.drawn
                        .is_some_and(|(at, lap)| at == seq && stamp.lap() != lap) =>
                {
                    return false
                }
                Ok((stamp, index, word)) if word & TRAJ_MASK == w.traj => {
                    out.index[k] = index;
                    out.generation[k] = stamp.generation();
                    if let Some(marks) = out.marks.as_deref_mut() {
                        marks[k] = Marks::of(w, seq, word);
                    }
                }
                _ => return false,
            }
        }
        for k in first + rows..first + len {
            out.dest.zero_row(k);
            out.index[k] = crate::batch::PADDING_INDEX;
            out.generation[k] = 0;
        }
        if let Some(marks) = out.marks.as_deref_mut() {
            marks[first + rows..first + len].fill(Marks::default());
        }
        if let Some(weight) = out.weight.as_deref_mut() {
            weight[first..first + rows].fill(w.weight);
            weight[first + rows..first + len].fill(0.0);
        }
        true
    }
}

/// Picks that fail in a row before a slice sample looks at the lanes afresh.
const SLICE_REFRESH_AFTER: u32 = 64;
/// Picks that fail in a row before a slice sample gives up.
const MAX_SLICE_ATTEMPTS: u32 = 1 << 20;
/// Rows of a window prefetched before its copy starts, and how far ahead of the row
/// being copied a window prefetches: enough to cover memory latency at 10^7 rows,
/// few enough not to crowd out the other windows' first rows (measured on the 2-core
/// machine: 2 to 4 were best; 8 was 15% slower at 10^7 rows, and prefetching all
/// 32 rows up front slower still).
const SLICE_PREFETCH_ROWS: u64 = 4;

/// A slice sample's picks: the lanes as last seen, and the failures so far.
struct Picker<'a> {
    buffer: &'a Core,
    cfg: &'a Slice,
    lanes: &'a Lanes,
    views: &'a mut Vec<LaneView>,
    cumulative: &'a mut Vec<u64>,
    len: u64,
    /// Picks and reads that failed in this sample.
    failures: u32,
    backoff: Backoff,
    /// A prioritized slice sampler's trees, as this sample sees them.
    prio: Option<Prio<'a>>,
    /// The masses of the rows that can start a strict slice, once picks by the
    /// trees' masses kept landing on rows that cannot (see [`StartMasses`]).
    starts: Option<StartMasses>,
}

/// Failed picks in a row after which a prioritized slice sample of strict slices
/// that start at the drawn row draws from the rows that can start one instead.
const SCAN_STARTS_AFTER: u32 = 256;

/// Every trajectory's rows that can start a strict slice, with their masses summed:
/// what a prioritized pick draws from once rejecting the rows that cannot has failed
/// [`SCAN_STARTS_AFTER`] times in a row. The distribution is the same, the pick's by
/// mass given that it starts a slice (TorchRL's `PrioritizedSliceSampler` zeroes the
/// others' masses for the draw); only its cost differs: a pass over the live rows'
/// leaves, against draws without end when nearly all the mass sits on the last
/// steps of trajectories (per-step errors of a sparse reward).
struct StartMasses {
    /// By trajectory: the mass of the ones before it, and the trajectory.
    trajectories: Vec<(u64, StartRun)>,
    total: u64,
}

/// A trajectory's rows that can start a slice: `span.lo..=last` of view `view`.
#[derive(Clone, Copy)]
struct StartRun {
    view: usize,
    traj: u64,
    span: TrajectorySpan,
    last: u64,
}

/// What a prioritized slice sample draws from.
struct Prio<'a> {
    state: &'a prioritized::Priorities,
    over: SlicePriority,
    trees: &'a [Tree<'a>],
    masses: Masses,
    /// The smallest mass stored, read before the draws (the weights' normaliser).
    min: u64,
    shard_windows: &'a mut Vec<ShardWindow>,
    /// The index in `views` of each shard's first lane.
    first_view: SmallVec<[usize; 8]>,
}

impl Picker<'_> {
    /// Snapshots every lane; returns the trajectories that may have live rows.
    fn refresh(&mut self) -> u64 {
        let words = self.buffer.storage.words();
        self.starts = None;
        self.views.clear();
        self.cumulative.clear();
        let mut total = 0;
        if let Some(p) = &mut self.prio {
            self.buffer.storage.windows(p.shard_windows);
            p.masses = Masses::new(p.trees);
            p.first_view.clear();
        }
        let storage = &self.buffer.storage;
        for (k, shard) in storage.shards().iter().enumerate() {
            // A frames buffer's rows that cannot be rebuilt (the newest, which waits
            // for its successor's frame) are left out: a window reading one failed,
            // and a buffer of one short trajectory was picked from until `Starved`.
            let (lo, below) = match storage.frames() {
                Some(_) => {
                    let w = storage.sampleable(k);
                    (w.lo, w.hi)
                }
                None => (shard.window().lo, u64::MAX),
            };
            if let Some(p) = &mut self.prio {
                p.first_view.push(self.views.len());
            }
            for lane in 0..shard.ring().width {
                let mut v = self.lanes.view(words, k, lane, lo);
                v.tail = v.tail.min(below);
                total += v.trajectories();
                self.views.push(v);
                self.cumulative.push(total);
            }
        }
        total
    }

    /// A window of a trajectory drawn uniformly, picking again while picks land on
    /// trajectories with no live row or (strict) too short.
    fn pick(&mut self, rng: &mut Rng) -> Result<slice::SliceWindow, SampleError> {
        let words = self.buffer.storage.words();
        loop {
            if self.failures > 0 && self.failures.is_multiple_of(SLICE_REFRESH_AFTER) {
                // The writers have moved on, or the picks keep landing on trajectories
                // too short: look at the lanes afresh, and give up if none can serve.
                self.backoff.snooze();
                if self.refresh() == 0 {
                    return Err(SampleError::Empty);
                }
                if self.cfg.strict_length {
                    // A scan a writer tore says nothing: the picks go on (and end
                    // `Starved` if the writers never let one land).
                    let longest = slice::longest(self.lanes, words, self.views);
                    if let Some(longest) = longest.filter(|&l| l < self.len) {
                        return Err(SampleError::TrajectoriesTooShort {
                            slice_len: self.len as usize,
                            longest,
                        });
                    }
                }
            }
            if self.failures >= MAX_SLICE_ATTEMPTS {
                return Err(SampleError::Starved {
                    attempts: self.failures,
                });
            }
            let scan = self.cfg.strict_length
                && self.failures >= SCAN_STARTS_AFTER
                && matches!(&self.prio, Some(p) if p.over == SlicePriority::Start);
            if scan && self.starts.is_none() {
                self.starts = Some(self.start_masses());
            }
            let picked = match (&self.prio, &self.starts) {
                (Some(p), Some(starts)) if scan => self.pick_start(p, starts, rng),
                (Some(p), _) => self.pick_by_priority(p, rng),
                (None, _) => slice::pick(
                    self.lanes,
                    words,
                    self.views,
                    self.cumulative,
                    self.cfg,
                    self.len,
                    rng,
                ),
            };
            match picked {
                Ok(w) => return Ok(w),
                Err(NoPick::Again) => self.failures += 1,
            }
        }
    }
}

impl Picker<'_> {
    /// The rows that can start a strict slice, and their masses (a pass over every
    /// live row's leaf).
    fn start_masses(&self) -> StartMasses {
        let p = self.prio.as_ref().expect("a prioritized pick");
        let storage = &self.buffer.storage;
        let words = storage.words();
        let (_, right) = self.cfg.span_for(self.len);
        let mut trajectories = Vec::new();
        let mut total = 0u64;
        for (view, v) in self.views.iter().enumerate() {
            let (k, lane) = (v.shard as usize, u64::from(v.lane));
            let (tree, ring) = (&p.trees[k], storage.shards()[k].ring());
            for traj in v.first..v.count {
                let span = self.lanes.trajectory(words, v, traj);
                if span.hi < span.lo + self.len {
                    continue;
                }
                let last = span.hi - self.len + right;
                let mass: u64 = (span.lo..=last)
                    .map(|seq| mass_of(tree, ring, lane, seq))
                    .fold(0u64, u64::saturating_add);
                if mass > 0 {
                    trajectories.push((
                        total,
                        StartRun {
                            view,
                            traj,
                            span,
                            last,
                        },
                    ));
                    total = total.saturating_add(mass);
                }
            }
        }
        StartMasses {
            trajectories,
            total,
        }
    }

    /// A prioritized pick from [`StartMasses`]: a trajectory by its starts' mass,
    /// then one of its starts by its own; its window as [`Picker::pick_by_priority`]
    /// makes it. Again if the rows moved on since the pass.
    fn pick_start(
        &self,
        p: &Prio<'_>,
        starts: &StartMasses,
        rng: &mut Rng,
    ) -> Result<slice::SliceWindow, NoPick> {
        if starts.total == 0 {
            return Err(NoPick::Again);
        }
        let r = rng.random_range(0..starts.total);
        let at = starts
            .trajectories
            .partition_point(|&(below, _)| below <= r)
            - 1;
        let (below, run) = starts.trajectories[at];
        let v = &self.views[run.view];
        let (k, lane) = (v.shard as usize, u64::from(v.lane));
        let (tree, ring) = (&p.trees[k], self.buffer.storage.shards()[k].ring());
        let mut left = r - below;
        // The start whose share of the trajectory's mass holds `left` (a mass of 0,
        // the leaf's row replaced since the pass, never does).
        let (seq, mass) = (run.span.lo..=run.last)
            .map(|seq| (seq, mass_of(tree, ring, lane, seq)))
            .find(|&(_, m)| {
                let here = left < m;
                left = left.saturating_sub(m);
                here
            })
            .ok_or(NoPick::Again)?;
        Ok(slice::SliceWindow {
            shard: v.shard,
            lane: v.lane,
            traj: run.traj,
            start: run.span.start,
            next: run.span.next,
            from: seq,
            to: (seq + self.len).min(run.span.hi),
            drawn: Some((seq, ring.lap(seq))),
            weight: p.state.weight(mass, p.min.min(mass)),
        })
    }

    /// A prioritized pick: a row drawn by mass, then the window it starts (or one
    /// holding it); a row no window can serve is drawn again.
    fn pick_by_priority(&self, p: &Prio<'_>, rng: &mut Rng) -> Result<slice::SliceWindow, NoPick> {
        let storage = &self.buffer.storage;
        let words = storage.words();
        let d = prioritized::redraw(p.trees, storage.shards(), p.shard_windows, &p.masses, rng)
            .filter(|d| d.mass > 0)
            .ok_or(NoPick::Again)?;
        let (k, lane, seq) = (d.shard as usize, u64::from(d.lane), d.seq);
        let v = self.views[p.first_view[k] + d.lane as usize];
        let n = self
            .lanes
            .trajectory_of(words, &v, seq)
            .ok_or(NoPick::Again)?;
        let span = self.lanes.trajectory(words, &v, n);
        let (start, next, a, b) = (span.start, span.next, span.lo, span.hi);
        if seq < a || seq >= b || (self.cfg.strict_length && b - a < self.len) {
            return Err(NoPick::Again);
        }
        let (left, right) = self.cfg.span_for(self.len);
        let (from, to) = match p.over {
            SlicePriority::Start => {
                // A slice starts where its trajectory holds all its rows but the right
                // span's, and is cut at the trajectory's end; without strict length, a
                // trajectory too short for one also starts one at its first row (as
                // TorchRL's `PrioritizedSliceSampler` zeroes every other start: rows
                // near an end started short slices).
                let to = (seq + self.len).min(b);
                if (self.cfg.strict_length || seq != a) && to - seq + right < self.len {
                    return Err(NoPick::Again);
                }
                (seq, to)
            }
            SlicePriority::Window if (left, right) != (0, 0) => {
                // A window holding the row, hanging over the trajectory's ends by up to
                // the span, and cut at them. (One always holds it: the window that
                // starts at the row, or at the trajectory's first row, fits.)
                let (seq, a, b, len) = (seq as i128, a as i128, b as i128, self.len as i128);
                let lowest = (seq + 1 - len).max(a - left as i128);
                let highest = seq.min(b - len + right as i128).max(lowest);
                let w0 = rng.random_range(lowest..=highest);
                (w0.max(a) as u64, (w0 + len).min(b) as u64)
            }
            SlicePriority::Window => {
                let len = self.len.min(b - a);
                let lowest = (seq + 1).saturating_sub(len).max(a);
                let from = rng.random_range(lowest..=seq.min(b - len));
                (from, from + len)
            }
        };
        let mass = match p.over {
            SlicePriority::Start => d.mass,
            SlicePriority::Window => {
                let (tree, ring) = (&p.trees[k], storage.shards()[k].ring());
                let leaf = |s: u64| (ring.pos(s) * ring.width + lane) as usize;
                let sum: u64 = (from..to).map(|s| tree.leaf(leaf(s)).value()).sum();
                (sum / (to - from)).max(1)
            }
        };
        Ok(slice::SliceWindow {
            shard: d.shard,
            lane: d.lane,
            traj: n,
            start,
            next,
            from,
            to,
            drawn: Some((seq, d.lap)),
            weight: p.state.weight(mass, p.min.min(mass)),
        })
    }
}

/// The mass of row `seq` of lane `lane` (0 if its leaf holds another row now).
fn mass_of(tree: &Tree<'_>, ring: &crate::storage::geometry::Ring, lane: u64, seq: u64) -> u64 {
    let leaf = tree.leaf((ring.pos(seq) * ring.width + lane) as usize);
    if leaf.is_of(ring.lap(seq)) {
        leaf.value()
    } else {
        0
    }
}
