//! Trajectory lanes of a slice buffer: per lane (an ndim-2 storage's environment, or
//! the whole ring), where each trajectory starts, kept by the lane's appender as it
//! writes and read by slice samplers (`sampler/slice.rs`) to pick windows.
//!
//! Layer: algos (storage). It knows rows by their fields' bytes ([`Bounds`]), never
//! the sampler that reads it.

use crate::dtype::DType;
use crate::storage::geometry::Geometry;
use crate::storage::plan::Source;
use crate::sync::{AtomicU64, Backoff, Ordering};

/// Words of a lane's state block (one cache line).
const STATE_WORDS: usize = 8;
const TAIL: usize = 0;
const COUNT: usize = 1;
const LAST_ID: usize = 2;
const LAST_FLAGS: usize = 3;

/// The trajectory word of a row: its trajectory number in the low bits, its flags on
/// top.
pub(crate) const TRAJ_MASK: u64 = (1 << 62) - 1;
pub(crate) const FLAG_DONE: u64 = 1 << 62;
pub(crate) const FLAG_TRUNCATED: u64 = 1 << 63;

/// One scalar field of the spec, read from a caller's batch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scalar {
    pub(crate) field: usize,
    pub(crate) dtype: DType,
}

impl Scalar {
    /// The value of data row `r`, widened to 64 bits.
    #[inline]
    pub(crate) fn get(&self, src: &Source<'_>, r: usize) -> u64 {
        let col = &src.cols[self.field];
        let b = &col.data[r * col.bytes..][..col.bytes];
        match self.dtype {
            DType::Bool | DType::U8 => u64::from(b[0]),
            DType::I8 => b[0] as i8 as i64 as u64,
            DType::I16 => i16::from_ne_bytes([b[0], b[1]]) as i64 as u64,
            DType::U16 => u64::from(u16::from_ne_bytes([b[0], b[1]])),
            DType::I32 => i32::from_ne_bytes(b.try_into().expect("4 bytes")) as i64 as u64,
            DType::U32 => u64::from(u32::from_ne_bytes(b.try_into().expect("4 bytes"))),
            _ => u64::from_ne_bytes(b.try_into().expect("8 bytes")),
        }
    }
}

/// How trajectories are told apart: by an id field, or by an end-flag field.
#[derive(Clone, Copy, Debug)]
pub(crate) enum By {
    Id(Scalar),
    End(Scalar),
}

/// How a slice buffer tells where trajectories end, resolved against its spec.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    by: By,
    truncated: Option<Scalar>,
}

/// What a written row says about its trajectory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowKey {
    /// The trajectory id, when trajectories are told apart by id.
    id: Option<u64>,
    /// `FLAG_DONE` and `FLAG_TRUNCATED` bits.
    flags: u64,
}

impl Bounds {
    pub(crate) fn new(by: By, truncated: Option<Scalar>) -> Bounds {
        Bounds { by, truncated }
    }

    /// Row (`step`, `lane`) of an extend's data.
    #[inline]
    pub(crate) fn key(&self, src: &Source<'_>, step: u64, lane: u64) -> RowKey {
        let r = src.order.row(step, lane);
        let truncated = self.truncated.is_some_and(|t| t.get(src, r) != 0);
        let mut flags = if truncated { FLAG_TRUNCATED } else { 0 };
        let id = match self.by {
            By::Id(s) => Some(s.get(src, r)),
            By::End(s) => {
                if s.get(src, r) != 0 {
                    flags |= FLAG_DONE;
                }
                None
            }
        };
        RowKey { id, flags }
    }
}

/// Where every lane's block lives in the region.
#[derive(Clone, Debug)]
pub(crate) struct Lanes {
    /// Per shard: the first word of its first lane's block.
    base: Box<[usize]>,
    /// Per shard: ring steps (the table length of each of its lanes).
    steps: Box<[u64]>,
}

impl Lanes {
    /// Lane blocks for every lane of `geometry`, from word `first` on; returns them and
    /// the words they take.
    pub(crate) fn new(geometry: &Geometry, first: usize) -> Option<(Lanes, usize)> {
        let mut next = first;
        let (mut base, mut steps) = (Vec::new(), Vec::new());
        for k in 0..geometry.shards() {
            let ring = geometry.ring(k);
            base.push(next);
            steps.push(ring.steps);
            let block = STATE_WORDS.checked_add(usize::try_from(ring.steps).ok()?)?;
            next = next.checked_add(block.checked_mul(ring.width as usize)?)?;
        }
        let lanes = Lanes {
            base: base.into(),
            steps: steps.into(),
        };
        Some((lanes, next - first))
    }

    #[inline]
    fn block(&self, k: usize, lane: u64) -> usize {
        self.base[k] + lane as usize * (STATE_WORDS + self.steps[k] as usize)
    }

    /// Takes the lane's turn for an append whose first row is `seq`: waits until every
    /// row before it has its trajectory (the appender of `seq` goes after the one
    /// before it), then reads the lane's state.
    pub(crate) fn begin(&self, words: &[AtomicU64], k: usize, lane: u64, seq: u64) -> Turn {
        let b = self.block(k, lane);
        let mut backoff = Backoff::new();
        while words[b + TAIL].load(Ordering::Acquire) < seq {
            backoff.snooze();
        }
        Turn {
            block: b,
            table_len: self.steps[k],
            count: words[b + COUNT].load(Ordering::Relaxed),
            last_id: words[b + LAST_ID].load(Ordering::Relaxed),
            last_flags: words[b + LAST_FLAGS].load(Ordering::Relaxed),
        }
    }

    /// Closes lane `lane` of shard `k` after its writers died (`storage/recover.rs`;
    /// the caller has the region to itself): rows `tail..cursor` were claimed, and
    /// perhaps partly written, by an append that never finished its turn.
    ///
    /// That append recorded the start of every trajectory it began before writing the
    /// trajectory's first row, so the table already holds the starts of the
    /// trajectories its published rows name (`word_of(seq)`: the trajectory word of
    /// row `seq` if it is published): they count. The lane's tail moves to `cursor`,
    /// and the next row begins a new trajectory. Rows left half written stay
    /// unpublished; a window over them fails its read and is drawn again, until the
    /// ring laps them.
    pub(crate) fn recover(
        &self,
        words: &[AtomicU64],
        k: usize,
        lane: u64,
        cursor: u64,
        word_of: impl Fn(u64) -> Option<u64>,
    ) {
        let b = self.block(k, lane);
        let tail = words[b + TAIL].load(Ordering::Acquire);
        if tail > cursor {
            // A damaged region: no row past the cursor exists.
            words[b + TAIL].store(cursor, Ordering::Release);
        }
        if tail >= cursor {
            return;
        }
        let mut count = words[b + COUNT].load(Ordering::Acquire);
        for seq in tail.max(cursor.saturating_sub(self.steps[k]))..cursor {
            if let Some(word) = word_of(seq) {
                count = count.max((word & TRAJ_MASK) + 1);
            }
        }
        words[b + COUNT].store(count, Ordering::Release);
        self.end_trajectory(words, k, lane);
        words[b + TAIL].store(cursor, Ordering::Release);
    }

    /// Ends lane `lane` of shard `k`'s last trajectory: the next row begins a new
    /// one. The caller has the region to itself, between appends.
    pub(crate) fn end_trajectory(&self, words: &[AtomicU64], k: usize, lane: u64) {
        words[self.block(k, lane) + LAST_FLAGS].store(FLAG_DONE, Ordering::Relaxed);
    }

    /// A snapshot of lane `lane` of shard `k` whose live rows start at `lo`.
    pub(crate) fn view(&self, words: &[AtomicU64], k: usize, lane: u64, lo: u64) -> LaneView {
        let b = self.block(k, lane);
        let tail = words[b + TAIL].load(Ordering::Acquire);
        let count = words[b + COUNT].load(Ordering::Acquire);
        let steps = self.steps[k];
        let mut view = LaneView {
            shard: k as u32,
            lane: lane as u32,
            lo,
            tail,
            first: count,
            count,
        };
        if tail <= lo || count == 0 {
            return view;
        }
        // The trajectory holding `lo`: the last start at or before it, searched among
        // the table's entries (the older ones are gone).
        let (mut a, mut z) = (count.saturating_sub(steps), count);
        if self.start(words, k, lane, a) > lo {
            view.first = a;
            return view;
        }
        while z - a > 1 {
            let mid = a + (z - a) / 2;
            if self.start(words, k, lane, mid) <= lo {
                a = mid;
            } else {
                z = mid;
            }
        }
        view.first = a;
        view
    }

    /// The trajectory of lane view `v` holding row `seq`, if any may.
    pub(crate) fn trajectory_of(&self, words: &[AtomicU64], v: &LaneView, seq: u64) -> Option<u64> {
        let (k, lane) = (v.shard as usize, u64::from(v.lane));
        let (mut a, mut z) = (v.first, v.count);
        if a == z || self.start(words, k, lane, a) > seq {
            return None;
        }
        while z - a > 1 {
            let mid = a + (z - a) / 2;
            if self.start(words, k, lane, mid) <= seq {
                a = mid;
            } else {
                z = mid;
            }
        }
        Some(a)
    }

    /// The first sequence number of trajectory `n` of the lane, as the table says now.
    #[inline]
    pub(crate) fn start(&self, words: &[AtomicU64], k: usize, lane: u64, n: u64) -> u64 {
        let b = self.block(k, lane);
        words[b + STATE_WORDS + (n % self.steps[k]) as usize].load(Ordering::Acquire)
    }

    /// Where trajectory `n` of lane `lane` of shard `k` ends, as the lane says now:
    /// the next one's first sequence number, if one has begun (and its table entry is
    /// not yet reused).
    pub(crate) fn next_start(
        &self,
        words: &[AtomicU64],
        k: usize,
        lane: u64,
        n: u64,
    ) -> Option<u64> {
        let count = words[self.block(k, lane) + COUNT].load(Ordering::Acquire);
        (n + 1 < count && count <= n + 1 + self.steps[k]).then(|| self.start(words, k, lane, n + 1))
    }

    /// Trajectory `n` of view `v`, as the table says now: where it starts, where the
    /// next one does (none for the view's last), and its live rows.
    #[inline]
    pub(crate) fn trajectory(&self, words: &[AtomicU64], v: &LaneView, n: u64) -> TrajectorySpan {
        let (k, lane) = (v.shard as usize, u64::from(v.lane));
        let start = self.start(words, k, lane, n);
        let next = (n + 1 < v.count).then(|| self.start(words, k, lane, n + 1));
        TrajectorySpan {
            start,
            next,
            lo: start.max(v.lo),
            hi: next.map_or(v.tail, |x| x.min(v.tail)),
        }
    }
}

/// One trajectory of a [`LaneView`] ([`Lanes::trajectory`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrajectorySpan {
    /// Its first sequence number.
    pub(crate) start: u64,
    /// The next trajectory's first, if the view has a next.
    pub(crate) next: Option<u64>,
    /// Its live rows are `lo..hi`: none when `hi <= lo`, and `hi < lo` when a writer
    /// lapped the lane while the table was read.
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

/// A lane's bookkeeping while one append holds its turn: kept in registers, and
/// stored back by [`Turn::finish`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Turn {
    block: usize,
    table_len: u64,
    count: u64,
    last_id: u64,
    last_flags: u64,
}

impl Turn {
    /// Gives row `seq` its trajectory and returns the row's trajectory word. `fresh`:
    /// no earlier row of the lane counts (the first row after `empty`).
    #[inline]
    pub(crate) fn advance(
        &mut self,
        words: &[AtomicU64],
        seq: u64,
        key: RowKey,
        fresh: bool,
    ) -> u64 {
        let new = fresh
            || self.count == 0
            || self.last_flags & (FLAG_DONE | FLAG_TRUNCATED) != 0
            || key.id.is_some_and(|id| id != self.last_id);
        if new {
            let entry = self.block + STATE_WORDS + (self.count % self.table_len) as usize;
            words[entry].store(seq, Ordering::Release);
            self.count += 1;
        }
        self.last_id = key.id.unwrap_or(0);
        self.last_flags = key.flags;
        (self.count - 1) | key.flags
    }

    /// Ends the turn: every row below `tail` is published and has its trajectory.
    /// The state goes back first, then `tail` (Release) hands the turn on and shows
    /// the rows to samples.
    pub(crate) fn finish(self, words: &[AtomicU64], tail: u64) {
        let b = self.block;
        words[b + LAST_ID].store(self.last_id, Ordering::Relaxed);
        words[b + LAST_FLAGS].store(self.last_flags, Ordering::Relaxed);
        words[b + COUNT].store(self.count, Ordering::Release);
        words[b + TAIL].store(tail, Ordering::Release);
    }
}

/// One lane as a sample sees it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LaneView {
    pub(crate) shard: u32,
    pub(crate) lane: u32,
    /// Live rows are `lo..tail`.
    pub(crate) lo: u64,
    pub(crate) tail: u64,
    /// Trajectories `first..count` may have live rows.
    pub(crate) first: u64,
    pub(crate) count: u64,
}

impl LaneView {
    pub(crate) fn trajectories(&self) -> u64 {
        self.count - self.first
    }
}
