//! Row-major sharded storage: the rings, their slots and stamps, in one region.
//!
//! ```text
//! region:  | shard 0 slots ............ | shard 1 slots ............ | ...
//! slot:    | stamp (8 bytes) | [raw priority] | [trajectory word] | row (a multiple of 8) |
//! ```
//!
//! A prioritized buffer's slots carry the row's raw priority, and a slice buffer's its
//! trajectory word (`sampler/slice.rs`); their trees and lane blocks follow the slots.
//!
//! A slot's stamp sits right before its row, so a reader's first cache line holds both
//! and sampling one row touches `ceil((8 + row) / 64)` lines. The pieces:
//!
//! - `atomic_copy.rs`: the race-free byte copy in and out of the region;
//! - `stamp.rs`: the slot protocol (writers, editors, readers) and its ordering proof;
//! - `shard.rs`: one ring's cursor, floor, and the appender/editor handshake;
//! - `geometry.rs`: index <-> (shard, position, lane), ndim 1 and 2;
//! - `plan.rs`: which bytes of a caller's data go to which bytes of a row.
//!
//! Layer: algos.

pub mod atomic_copy;
pub(crate) mod frames;
pub(crate) mod freeze;
pub(crate) mod geometry;
pub(crate) mod lanes;
pub(crate) mod layout;
#[cfg(not(replaybuf_loom))]
pub(crate) mod member;
pub(crate) mod plan;
pub(crate) mod recover;
pub(crate) mod shard;
pub mod stamp;

use std::cmp::Ordering as Cmp;
use std::io;
use std::sync::Arc;

use geometry::Geometry;
use plan::{Dest, Source};
use shard::{Shard, Window};
use stamp::{lap_cmp, Claim, Prev, Stamp};

use atomic_copy::{Intent, LINE_BYTES};

use crate::region::{Block, Region};
use crate::shared::procs::ProcTable;
use crate::spec::Spec;
use crate::storage::frames::{FrameLayout, StepWord};
use crate::storage::lanes::{Bounds, Lanes, Turn};
#[cfg(not(replaybuf_loom))]
use crate::storage::member::Member;
use crate::sumtree::tree::Tree;
use crate::sumtree::{self, TreeLayout};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use crossbeam_utils::CachePadded;
use freeze::Retired;
use layout::{Global, RegionLayout, ShardWord};
use smallvec::SmallVec;

/// Cache lines prefetched per row: the stamp and the first 256 bytes. Longer rows are
/// streamed by the hardware prefetcher once the copy starts.
const PREFETCH_LINES: usize = 4;
/// A prioritized buffer's slot keeps its raw priority in this word, after its stamp
/// (word 0).
const RAW_WORD: usize = 1;
/// How many slots ahead an append prefetches its destination: enough misses in flight
/// to hide memory latency, few enough to stay in L1.
const APPEND_AHEAD_SLOTS: u64 = 8;
/// How many bytes ahead of the slot it writes an append of rows alone prefetches. At
/// 1 KiB a typed append of 168-byte rows spent 30% of its time waiting on each slot's
/// stamp load (perf); at 2 KiB, 1,000 such rows took 12.8-12.9 us where they took
/// 14.7-14.9 (4 KiB: 12.7-12.9), and `replaybuf bench --workload mujoco` extends
/// 16.7-21.4 us (median 17.7) where they took 18.7-21.7 (median 19.0), alternating.
/// On a faster host (AMD EPYC, family 26, 2026-11-28), whose memory takes writes at
/// twice the rate, 2 KiB is too short: 256 rows of 100 bytes 2.01 us at 2 KiB, 1.89 at
/// 4 KiB, 2.03 at 8 KiB; 1,000 typed rows 9.38, 8.06, 7.53; the mujoco extend 12.06,
/// 10.46, 10.60. A page ahead suits both hosts.
const APPEND_AHEAD_BYTES: usize = 4096;
/// At most this many slots are held for writing at once by [`Storage::append_rows`]
/// ...
const GROUP_SLOTS: usize = 16;
/// ... and no more than about this many bytes of them, but one slot at least: a group
/// of small rows saves each row its fields' setup, and a large row has none to save.
/// Measured on the development VM (2026-11-27), 256 rows of 100 bytes into a 512 MB
/// ring: 3.8 us row by row, 2.9 us in groups of 1 KiB (raw copy of the columns 2.3 to
/// 2.6 us). Larger groups lose on mujoco's five fields: 16.7 us at 1 KiB and 16.8 row
/// by row, but 19.4 us at 4 KiB (a group's fields then store to more lines than are in
/// flight at once). With the page-ahead prefetch on the faster host (2026-11-28, two
/// rounds): 100-byte rows 1.82 and 1.79 us at 1 KiB, 1.66 and 1.65 at 2 KiB, 1.74 and
/// 1.76 at 3 KiB; the mujoco extend 9.72-10.19 at 1 KiB, 8.67-9.38 at 2 KiB, 9.18-9.55
/// at 3 KiB; 1,000 typed rows 7.54-7.80, 7.20-7.44, 7.63-7.73.
const GROUP_BYTES: usize = 2048;

/// A streaming append ([`Storage::stream_run`]) gathers its rows into a buffer on
/// the stack, in L1, at most this many bytes and [`STAGE_SLOTS`] rows at a time, and
/// sends each of its whole lines to memory by a non-temporal store. Measured (AMD
/// EPYC family 26, 2026-11-28; 1,000 mujoco rows of 176-byte slots a call, means of
/// 500 calls, two runs): stages of 16 rows 6.3-6.6 us, 24 6.1-6.5, 32 5.8-6.1, 40
/// 6.3-6.7, 48 6.4-6.6, 64 6.4-6.6, 128 7.3-7.5. Once a stage's moves wrote only
/// their fields' bytes (`plan.rs`), a stage of 5 KiB (28 such rows) took 5.17-5.45
/// where 6 KiB (32) took 5.56-5.79, three runs alternating; 4 KiB (20) 5.46-5.55,
/// 4.5 KiB (24) 5.36-5.42, 8 KiB 5.72-5.82, 11 KiB 5.84-5.94. 256 rows of 100
/// bytes: 1.16-1.21 us against 1.15-1.17.
#[cfg_attr(replaybuf_loom, allow(dead_code))]
const STAGE_BYTES: usize = 5120;
#[cfg_attr(replaybuf_loom, allow(dead_code))]
const STAGE_SLOTS: usize = 64;
/// The stack's room for a stream's two stages: a line period of slots of up to
/// [`STACK_STAGE_SLOT_BYTES`] each ([`Storage::stage_slots`]), and a line for the first slot's offset in its line
/// (the staged rows keep the slots' offsets in their lines, so that staged and stored
/// lines coincide). Stages of longer slots take room on the heap (`stream_rows`): two
/// stages of 4 KiB slots on the stack, 65 KiB, took every stream's 256 rows of 100
/// bytes 2.31-2.54 us where 10 KiB took 2.13-2.19 (three runs alternating), whether
/// the used stages lay together or apart.
#[cfg_attr(replaybuf_loom, allow(dead_code))]
const STACK_STAGE_SPAN: usize = LINE_SLOTS_MAX * STACK_STAGE_SLOT_BYTES + LINE_BYTES;
/// The longest slots whose stages fit in [`STACK_STAGE_SPAN`].
#[cfg_attr(replaybuf_loom, allow(dead_code))]
const STACK_STAGE_SLOT_BYTES: usize = 1024;
/// The most slots after which a run of slots starts a line again: slots are whole
/// words, and a line is 8 of them.
#[cfg_attr(replaybuf_loom, allow(dead_code))]
const LINE_SLOTS_MAX: usize = LINE_BYTES / 8;
/// Appends of fewer bytes than this are not streamed: two fences and the staging
/// buffer cost more than a few lines read for ownership. Under loom, whose rings are
/// a few rows, appends of two rows or more stream and single rows do not, so that the
/// models cover both protocols.
#[cfg_attr(replaybuf_loom, allow(dead_code))]
const STREAM_MIN_BYTES: usize = 4096;
/// Slots longer than this are not streamed: their fields are long enough for
/// `append_rows`' own non-temporal stores ([`plan::STREAMING_FIELD_BYTES`]), and a
/// stage of 8 of them is already 32 KiB. Measured (AMD EPYC family 25 model 17,
/// 2026-12-02; 256-row appends into 512 MB rings, one process alternating half-second
/// spells of the two builds with spells of the raw copy of the columns, medians):
/// rows of 3 KB (slots of 3,080 bytes) 0.90x the raw copy streamed against 1.27x
/// through the cache, 1 KB 0.77x against 0.98x; in an earlier build, 2 KB 0.90x
/// against 1.13x and 1.5 KB 0.84x against 1.09x. (Stages of one such slot, each
/// stored with partial lines at both ends, took 1.57x to 1.67x.)
const STREAM_SLOT_BYTES: usize = 4096;

/// Ends a streaming append that unwinds ([`Storage::stream_rows`]), dropping its rows.
struct EndOnUnwind<'a> {
    storage: &'a Storage,
    k: usize,
}

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        self.storage.end_dead_stream(self.k);
    }
}

/// How many slots of `slot_bytes` after one that starts a line the next one does.
#[cfg(not(replaybuf_loom))]
fn line_slots(slot_bytes: usize) -> usize {
    LINE_BYTES / gcd(slot_bytes, LINE_BYTES)
}

/// The greatest common divisor of `a` and `b`.
#[cfg(not(replaybuf_loom))]
fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The stack's room for a streaming append's two stages ([`stages_in`]).
#[cfg(not(replaybuf_loom))]
#[repr(C, align(64))]
struct StackStages([std::mem::MaybeUninit<u8>; 2 * STACK_STAGE_SPAN]);

/// A streaming append's two stages of `len` bytes in `room` (whose first byte starts
/// a line, with room for both), the second from the line after the first's end,
/// zeroed, the second empty unless `second`: every byte a stage stores is then
/// initialised, padding included, and holds nothing from any other buffer's rows.
#[cfg(not(replaybuf_loom))]
fn stages_in(room: &mut [std::mem::MaybeUninit<u8>], len: usize, second: bool) -> [&mut [u8]; 2] {
    let apart = len.next_multiple_of(LINE_BYTES);
    let total = if second { apart + len } else { len };
    let room = &mut room[..total];
    room.fill(std::mem::MaybeUninit::new(0));
    // SAFETY: every byte of `room` was just written; `MaybeUninit<u8>` has the layout
    // of `u8`.
    let all = unsafe { &mut *(std::ptr::from_mut(room) as *mut [u8]) };
    let (first, rest) = all.split_at_mut(len);
    let second = rest.get_mut(apart - len..).unwrap_or_default();
    [first, second]
}

/// A streaming append's stage on its way to the region while the next is gathered
/// (`Storage::stream_run`): its bytes `from..from + len` of its stage buffer, for the
/// region's bytes from `to`, the first `done` of them stored.
#[cfg(not(replaybuf_loom))]
#[derive(Clone, Copy, Debug)]
struct Outgoing {
    from: usize,
    len: usize,
    to: usize,
    done: usize,
}

#[cfg(not(replaybuf_loom))]
impl Outgoing {
    /// Stores the stage's bytes up to `part / parts` of it, that end cut back to the
    /// start of its line in the region (so that each part's lines are whole, and
    /// stored non-temporally), or all of them once `part` reaches `parts`; `bytes` is
    /// the stage's buffer.
    fn store_part(&mut self, words: &[AtomicU64], bytes: &[u8], part: usize, parts: usize) {
        let end = if part >= parts {
            self.len
        } else {
            let end = self.to + self.len * part / parts;
            (end - end % LINE_BYTES).saturating_sub(self.to)
        };
        if end > self.done {
            let stored = &bytes[self.from + self.done..self.from + end];
            atomic_copy::store_stage(words, self.to + self.done, stored);
            self.done = end;
        }
    }
}

/// The slots an append holds for writing at once, for slots of `slot_bytes`.
fn append_group(slot_bytes: usize) -> usize {
    (GROUP_BYTES / slot_bytes).clamp(1, GROUP_SLOTS)
}

/// An append of at least this many bytes into a ring of at least
/// [`STREAMING_RING_BYTES`] writes its large fields with non-temporal stores
/// (`plan.rs`, fields of at least `STREAMING_FIELD_BYTES`). Measured here
/// (`benches/extend.rs`, 256-row chunks into 512 MB rings): 16 KB rows 28% faster than
/// with cached stores, 56 KB rows 33%; below a few hundred KB the lines a cached append
/// leaves behind are worth more.
const STREAMING_APPEND_BYTES: usize = 512 << 10;

/// The smallest ring a streaming append writes to: one past a last-level cache (32 MiB,
/// a Zen CCX's), whose rows a learner reads from memory anyway. A smaller ring keeps
/// new rows cached for the learners that sample them; a larger one, appended to
/// through the cache, reads every line it writes from memory first. One collector
/// beside one learner (mujoco rows, 1,000-row extends, 3 s, two runs each, 2026-11-29,
/// Zen 3 host), appends through the cache against streamed, in M rows/s: a ring of
/// 50,000 rows (9.6 MB) writer 36.5 and 24.7 against 49.6 and 49.5, learner 15.3 and
/// 14.6 against 11.6 and 11.1; 100,000 rows (19 MB) writer 12.9 and 33.3 against 47.0
/// and 57.1, learner 12.2 and 14.0 against 12.0 and 11.5; 200,000 rows (38 MB) writer
/// 18.2 and 37.9 against 57.3 and 50.8, learner 13.3 and 14.2 against 12.2 and 14.1.
/// (At 64 MiB, the bound before, rings between the two appended at about 30 µs a
/// chunk where streamed ones took 15 to 21, beside a raw copy of 20 to 25.)
const STREAMING_RING_BYTES: usize = 32 << 20;
/// A smaller ring's appends stream too, their stages stored through the cache
/// ([`Storage::stream_rows`]), where the ring holds at least this many of them: the
/// rows a stream announces are busy to learners until it ends, and over a larger
/// share of the ring their draws would hit them often. Measured (Intel Xeon, family 6
/// model 207, 2026-11-30; mujoco rows, 1,000-row extends, one collector and one
/// learner sampling 256, 2-3 s each way, streamed against marked slots, in us): a
/// ring of 100,000 rows, the collector alone 19.3, 18.2, 20.8 against 29.2, 26.7,
/// 36.6, beside the learner 21.5, 21.0, 21.5 against 25.0, 32.8, 30.6, the learner
/// beside it 17.5, 13.0, 16.7 against 17.3, 17.1, 14.4; 64,000 rows, alone 16.8 and
/// 17.1 against 35.6 and 21.8, learner beside 16.7 and 12.9 against 17.8 and 12.9.
/// At 32,000 rows (32 appends) the learner took 19.1-19.5 against 13.4-16.7, at
/// 10,000 24.1 against 15.7, and at 4,000 48.3 against 14.5.
const STREAM_RING_SHARE: u64 = 64;
/// How many draws ahead a sample prefetches its rows (see `Storage::prefetch`).
pub(crate) const SAMPLE_AHEAD_DRAWS: usize = 16;

/// One drawn row: a ring sequence number and lane in a shard, and for prioritized
/// draws the mass and lap of the leaf that was drawn (a prioritized draw with no mass
/// names no row and is replaced).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Draw {
    pub(crate) shard: u32,
    pub(crate) lane: u32,
    pub(crate) seq: u64,
    pub(crate) mass: u64,
    pub(crate) lap: u32,
}

impl Draw {
    /// The same draw, naming shard `k` (for draws made against one shard's slice).
    pub(crate) fn on_shard(mut self, k: usize) -> Draw {
        if self.mass > 0 {
            self.shard = k as u32;
        }
        self
    }
}

/// Where a drawn row lies ([`Storage::locate`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Located {
    /// The slot the draw names.
    pub(crate) slot: u64,
    /// The storage index of that slot's row.
    pub(crate) index: u64,
    /// The lap of the drawn sequence number, as stamps hold it.
    pub(crate) lap: u32,
    /// The region byte where the slot starts (its stamp): found once, for the
    /// prefetches and the read.
    pub(crate) offset: usize,
    /// The draw's shard and sequence number, for the checks against streaming
    /// appends ([`StreamWords`]).
    pub(crate) shard: u32,
    pub(crate) seq: u64,
}

/// Which row a read accepts at the drawn slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Exactly the row of the drawn sequence number (uniform sampling: anything else
    /// is redrawn).
    Exact,
    /// That row or any later one at the same position (reads by position).
    AtLeast,
}

/// Rows an append of raw priorities needs before it takes its shard's leaf turn: the
/// turn and the fences of plain leaf stores (`sumtree/tree.rs`, "Plain leaves") cost
/// about 9 ns each on the Intel host of 2026-11-30, as a compare-exchange does, and a
/// plain store saves about 7.5 ns of one: a node's leaves pay for them several times.
/// Under loom, one row, so that its models of one-row appends take the turn.
const LEAF_TURN_MIN_ROWS: u64 = if cfg!(replaybuf_loom) { 1 } else { 16 };

/// What an append claimed: its first sequence number, and the shard's leaf turn if it
/// took it ([`Storage::append_entered`]).
#[derive(Debug)]
pub(crate) struct Appended<'a> {
    pub(crate) first: u64,
    pub(crate) turn: Option<shard::TurnHeld<'a>>,
}

/// Why a read returned no row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// The wanted row is not published yet (being written, or not reached).
    Busy,
    /// A later row replaced the wanted one (`Want::Exact` only).
    Gone,
    /// A writer overwrote the row during the copy; the copy was discarded.
    Torn,
}

/// Rows [`Storage::read_block`] reads in one pass: enough that their copies' loads
/// are in flight together (the instructions are about those of one row at a time; the
/// time is not), few enough that the block's lines, prefetched [`SAMPLE_AHEAD_DRAWS`]
/// rows ahead, have arrived. Mujoco `sample` 256 of a million rows, on this VM:
/// 9.8-10.3 µs a row at a time, 9.0-9.4 with blocks of 8, 9.5-9.9 of 4, and 11.4 of 16,
/// whose last rows were prefetched only just before.
pub(crate) const READ_BLOCK: usize = 8;

/// Where draws' rows lie ([`Storage::locate`]), with what that takes copied out of the
/// storage: a sample locates its rows in a loop that also stores their locations, and
/// the compiler, unable to tell those stores from the ring's fields, loaded the ring
/// again for every row. Mujoco `sample` 256, alternating in one process (Intel Xeon,
/// family 6 model 207): the ring looked up each row took 1.027x and 1.015x the time
/// on a million rows, 1.028x and 1.026x on 10,000.
pub(crate) struct Locator<'s> {
    shards: &'s [Shard],
    /// The ring of a storage of one shard.
    one: Option<geometry::Ring>,
    slots_at: usize,
    slot_words: usize,
}

impl Locator<'_> {
    /// Where a draw's row lies: its slot, storage index and lap, from one split of
    /// its sequence number.
    #[inline(always)]
    pub(crate) fn locate(&self, draw: Draw) -> Located {
        let ring = match &self.one {
            Some(ring) => ring,
            None => self.shards[draw.shard as usize].ring(),
        };
        let lane = u64::from(draw.lane);
        let (pos, lap) = ring.pos_lap(draw.seq);
        let slot = ring.slot(pos, lane);
        Located {
            slot,
            index: ring.index(pos, lane),
            lap,
            // As `Storage::slot_offset`.
            offset: (self.slots_at + slot as usize * self.slot_words) * 8,
            shard: draw.shard,
            seq: draw.seq,
        }
    }
}

/// The stream words (`docs/orderings.rs` §6, "Streams") of the shard that a block's
/// last checked row is in, loaded once for that row and kept for the rows after it in
/// the same shard. A row checked against words loaded before its own R1 could miss a
/// stream, so a block loads these only after every row's R1 (for R1') or after the
/// fence R2 (for R2'); each row's check is then one against words loaded at the point
/// the protocol asks for, and a block of one shard's rows loads them once, not per row.
struct StreamWords<'s> {
    shards: &'s [Shard],
    /// Whether appends may stream here at all ([`Storage::may_stream`]).
    on: bool,
    /// The shard whose words are loaded (`u32::MAX` before the first load), its
    /// ring's steps, and the rows its stream words announced.
    shard: u32,
    steps: u64,
    rows: std::ops::Range<u64>,
}

impl<'s> StreamWords<'s> {
    fn new(storage: &'s Storage) -> Self {
        StreamWords {
            shards: &storage.shards,
            on: storage.may_stream(),
            shard: u32::MAX,
            steps: 0,
            rows: 0..0,
        }
    }

    /// Shard `k`'s words, loaded unless they are the ones held.
    #[inline(always)]
    fn of(&mut self, k: u32) {
        if k != self.shard {
            let shard = &self.shards[k as usize];
            self.shard = k;
            self.steps = shard.ring().steps;
            self.rows = shard.stream();
        }
    }

    /// Whether no stream is announced in the shards of the rows `at` (or none may
    /// stream here): then R1' and R2' refuse none of them.
    #[inline(always)]
    fn quiet(&mut self, at: &[Located]) -> bool {
        !self.on
            || at.iter().all(|a| {
                self.of(a.shard);
                self.rows.is_empty()
            })
    }

    /// R1': whether a streaming append is writing the row whose stamp `seen` a read
    /// of `at` found readable.
    #[inline(always)]
    fn writing(&mut self, at: &Located, seen: Stamp) -> bool {
        self.writing_lap(at, seen, 0)
    }

    /// R2': whether a streaming append is writing the next lap of that row.
    #[inline(always)]
    fn writing_next_lap(&mut self, at: &Located, seen: Stamp) -> bool {
        self.writing_lap(at, seen, 1)
    }

    /// Whether a streaming append is writing the row `laps` laps after the one whose
    /// stamp `seen` a read of `at` found; loads nothing where no append may stream.
    #[inline(always)]
    fn writing_lap(&mut self, at: &Located, seen: Stamp, laps: u64) -> bool {
        if !self.on {
            return false;
        }
        self.of(at.shard);
        let seq = seq_seen(at, seen, self.steps) + laps * self.steps;
        self.rows.contains(&seq)
    }
}

/// The sequence number of the row whose stamp `seen` a read of `at` found, in a ring
/// of `steps` steps: the drawn one, or with `Want::AtLeast` a later lap's.
#[inline(always)]
fn seq_seen(at: &Located, seen: Stamp, steps: u64) -> u64 {
    at.seq + u64::from(seen.lap().wrapping_sub(at.lap)) * steps
}

/// Whether a read that began from stamp `seen` may copy the row of lap `lap` (R1's
/// check): published, and the lap `want` accepts.
#[inline(always)]
fn readable(seen: Stamp, lap: u32, want: Want) -> Result<(), Miss> {
    if seen.is_published() && seen.lap() == lap {
        // The common case first, one compare of each: the row drawn, published. Mujoco
        // `sample` 256 by callgrind 8 instructions a row fewer than the match below
        // alone; alternating in one process, 0.98x the time in L2, 0.99x on a million.
        return Ok(());
    }
    if !seen.is_published() {
        // A dropped row (its editor died) will never be published: gone, not busy.
        let dropped = seen.is_dropped() && lap_cmp(seen.lap(), lap) != Cmp::Less;
        return Err(if dropped { Miss::Gone } else { Miss::Busy });
    }
    match (lap_cmp(seen.lap(), lap), want) {
        (Cmp::Less, _) => Err(Miss::Busy),
        (Cmp::Greater, Want::Exact) => Err(Miss::Gone),
        _ => Ok(()),
    }
}

/// The raw priorities an append records in its rows' slots.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Raws<'a> {
    /// One per row of the source batch.
    Each(&'a [f64]),
    /// The same for every row.
    All(f64),
}

impl Raws<'_> {
    /// The raw priority of row `r` of the source batch.
    #[inline]
    fn of(self, r: usize) -> f64 {
        match self {
            Raws::Each(ps) => ps[r],
            Raws::All(p) => p,
        }
    }
}

/// The storage of one buffer.
#[derive(Debug)]
pub(crate) struct Storage {
    /// A shared region's process table, and this process's place in it (`shared/`).
    procs: Option<ProcTable>,
    #[cfg(not(replaybuf_loom))]
    member: Option<Arc<Member>>,
    region: Arc<Region>,
    /// This process's updaters of the region and the freeze bit (`freeze.rs`): one
    /// word for every `Storage` over the region ([`Storage::view`]), so that their
    /// freezes take turns as the occupancy words they share require.
    updaters: Arc<CachePadded<AtomicU64>>,
    /// Set once, while frozen, when a swap replaced this storage (`freeze.rs`): every
    /// writer that enters afterwards leaves again and redoes its write on the buffer's
    /// new state. Read-mostly, beside the fields every append reads anyway.
    retired: AtomicBool,
    /// Set while a swap copies this storage's counters into a new one (`freeze.rs`,
    /// [`Storage::take_count`]), and until it has retired this storage.
    carrying: AtomicBool,
    /// The lap its rings started at: 0, or past every lap of the storage a swap
    /// copied into this one (see [`Storage::start_at_lap`]).
    first_lap: u64,
    layout: RegionLayout,
    shards: Box<[Shard]>,
    geometry: Geometry,
    spec: Arc<Spec>,
    /// The header (the stamp, then with trees the row's raw priority) and the row.
    slot_bytes: usize,
    /// Bytes before the row: the stamp, then the raw priority with trees, then the
    /// trajectory word with slices.
    header_bytes: usize,
    /// Each shard's tree block (prioritized sampling), after all the slots.
    trees: Box<[TreeLayout]>,
    /// Every lane's trajectory block (slice sampling), after the trees, and how rows
    /// say where trajectories end.
    slices: Option<(Lanes, Bounds)>,
    /// Fields stored once a step (`frames.rs`), with their side slots after the lane
    /// blocks.
    frames: Option<Arc<FrameLayout>>,
}

impl Storage {
    /// A storage of `spec` rows shaped by `geometry`, with a tree block per shard when
    /// `trees` is given (`Some(true)`: with a max tree), and lane blocks for slice
    /// sampling when `slices` is, on the heap; its header records `layout_hash`.
    pub(crate) fn new(
        spec: Arc<Spec>,
        geometry: Geometry,
        trees: Option<bool>,
        slices: Option<Bounds>,
        frames: Option<FrameLayout>,
        layout_hash: u64,
    ) -> io::Result<Storage> {
        let parts = StorageParts::new(spec, geometry, trees, slices, frames, 0, 0)?;
        let region = Arc::new(Region::heap(parts.layout.words)?);
        layout::write_header(region.words(), &parts.layout, layout_hash, &[]);
        Ok(parts.into_storage(region))
    }

    /// Writes a file-backed region's changes to its file and the disk.
    pub(crate) fn flush(&self) -> Result<(), crate::error::PersistError> {
        #[cfg(not(replaybuf_loom))]
        if let Some(_file) = self.region.file() {
            return self.region.flush().map_err(|e| {
                crate::error::PersistError::io(std::path::Path::new("storage.bin"), e)
            });
        }
        Ok(())
    }

    /// This process's membership of the shared region, if the region is one.
    #[cfg(not(replaybuf_loom))]
    pub(crate) fn member(&self) -> Option<&Member> {
        self.member.as_deref()
    }

    /// The holder word of this process's freezes: its process-table holder in a
    /// shared region, 1 elsewhere.
    pub(crate) fn freezer_holder(&self) -> u64 {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = &self.member {
            return m.holder().0;
        }
        1
    }

    /// In a shared region: if shard `k`'s lease holder died, takes the lease over,
    /// repairs the shard and gives the lease back. Nothing elsewhere.
    pub(crate) fn reclaim_dead_lease(&self, k: usize) {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = &self.member {
            m.reclaim_dead_lease(self, k);
        }
        #[cfg(replaybuf_loom)]
        let _ = k;
    }

    /// In a shared region: if shard `k`'s editor process died, takes the shard's
    /// `Editor` word over, repairs what it left (`Storage::recover_editor`) and gives
    /// the word back. Nothing elsewhere.
    pub(crate) fn reclaim_dead_editor(&self, k: usize) {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = &self.member {
            m.reclaim_dead_editor(self, k);
        }
        #[cfg(replaybuf_loom)]
        let _ = k;
    }

    /// In a shared region, the shard of this process's `k`-th writer handle (a lease
    /// taken from shard `k` on); `None` elsewhere.
    pub(crate) fn lease_for_writer(
        &self,
        k: usize,
    ) -> Option<Result<usize, crate::shared::procs::NoShard>> {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = &self.member {
            return Some(m.lease(self, k));
        }
        let _ = k;
        None
    }

    /// In a shared region, a shard this process holds the lease of (taking one if it
    /// holds none), for buffer-level extends; `None` elsewhere.
    pub(crate) fn process_lease(&self) -> Option<Result<usize, crate::shared::procs::NoShard>> {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = &self.member {
            return Some(m.any_lease(self));
        }
        None
    }

    /// In a shared region, takes the writer lease of every shard (see
    /// `Member::lease_all`); `Err(k)` if a live process holds shard `k`. `Ok`
    /// elsewhere.
    pub(crate) fn lease_all(&self) -> Result<(), usize> {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = &self.member {
            return m.lease_all(self);
        }
        Ok(())
    }

    /// Joins a shared region's process table (the creator's membership unlinks the
    /// region's name when it goes). `false` if the table is full of live processes.
    #[cfg(not(replaybuf_loom))]
    pub(crate) fn join(&mut self, creator: bool) -> bool {
        let Some(table) = self.procs.clone() else {
            return true;
        };
        let unlink = creator
            .then(|| {
                self.region
                    .shared_object()
                    .map(|(object, id)| (object.to_owned(), id))
            })
            .flatten();
        match Member::join(table, self.shards.clone(), unlink) {
            Some(m) => {
                self.member = Some(Arc::new(m));
                true
            }
            None => false,
        }
    }

    /// The region's process table and this storage's entry in it, if it joined one.
    pub(crate) fn member_entry(&self) -> Option<(ProcTable, crate::shared::procs::Holder)> {
        self.procs.clone().zip(self.holder())
    }

    /// This storage's entry of its shared region's process table, if it joined one.
    fn holder(&self) -> Option<crate::shared::procs::Holder> {
        #[cfg(not(replaybuf_loom))]
        return self.member.as_ref().map(|m| m.holder());
        #[cfg(replaybuf_loom)]
        None
    }

    /// Pids of the live members of a shared region other than this storage's own
    /// membership (none elsewhere): other processes, and other attachments of this
    /// one, whose handles a restore would replace the rows under just the same.
    pub(crate) fn other_members(&self) -> Vec<u32> {
        self.procs
            .as_ref()
            .map(|t| t.live_except(self.holder()))
            .unwrap_or_default()
    }

    /// Whether `holder` names a live process of this shared region (never elsewhere).
    pub(crate) fn holder_alive(&self, holder: u64) -> bool {
        holder != 0 && self.procs.as_ref().is_some_and(|t| t.alive(holder))
    }

    /// Whether the region is shared memory.
    pub(crate) fn is_shared(&self) -> bool {
        self.procs.is_some()
    }

    /// The lap its rings started at: a generation of an older lap names a row of a
    /// storage the buffer had before a swap.
    pub(crate) fn first_lap(&self) -> u64 {
        self.first_lap
    }

    /// Whether the region is a file (a file-backed storage).
    pub(crate) fn is_file_backed(&self) -> bool {
        #[cfg(not(replaybuf_loom))]
        return self.region.file().is_some();
        #[cfg(replaybuf_loom)]
        false
    }

    /// The region's layout.
    pub(crate) fn layout(&self) -> &RegionLayout {
        &self.layout
    }

    /// Global `g` of the region.
    #[inline]
    pub(crate) fn global(&self, g: Global) -> &AtomicU64 {
        &self.words()[self.layout.global(g)]
    }

    /// A shared region's rate-limit block (`rate_limit/shared.rs`).
    pub(crate) fn limiter_block(&self) -> Option<Block> {
        let at = self.layout.limiter_at?;
        Some(Block::new(&self.region, at, layout::LIMITER_WORDS))
    }

    /// The block of the region's globals, for the structures beside the storage.
    pub(crate) fn globals(&self) -> Block {
        let at = self.layout.global(Global::Calls);
        Block::new(&self.region, at, self.layout.procs_at - at)
    }

    /// The lane blocks of a slice buffer.
    pub(crate) fn lanes(&self) -> Option<&Lanes> {
        self.slices.as_ref().map(|(lanes, _)| lanes)
    }

    /// Marks the region as having a checkpoint copied into it, or not (see
    /// [`Header::Restoring`](layout::Header::Restoring)). The mark is stored before
    /// the copy's first word and cleared after its last (`SeqCst` both ways).
    pub(crate) fn set_restoring(&self, restoring: bool) {
        self.words()[layout::Header::Restoring as usize]
            .store(u64::from(restoring), crate::sync::Ordering::SeqCst);
    }

    /// Marks the region as having a checkpoint copied into it ([`Storage::set_restoring`])
    /// if no other member of a shared region lives; else leaves the mark as it was and
    /// returns the others' pids.
    ///
    /// A process attaching meanwhile joins the table and then looks for the mark
    /// ([`Storage::restoring`]), each side with a `SeqCst` fence between its store and
    /// its load, so that one of the two sees the other: the attacher backs out, or
    /// the restore is refused. Looking at the table only, then marking the region,
    /// let a process that joined in between write rows while the checkpoint's went in.
    pub(crate) fn begin_restore(&self) -> Result<(), Vec<u32>> {
        let mark = &self.words()[layout::Header::Restoring as usize];
        let before = mark.swap(1, Ordering::SeqCst);
        crate::sync::fence(Ordering::SeqCst);
        let others = self.other_members();
        if others.is_empty() {
            return Ok(());
        }
        mark.store(before, Ordering::SeqCst);
        Err(others)
    }

    /// Whether the region is marked as having a checkpoint copied into it: read by a
    /// process that just joined a shared region's table (see [`Storage::begin_restore`]).
    #[cfg(not(replaybuf_loom))]
    pub(crate) fn restoring(&self) -> bool {
        crate::sync::fence(Ordering::SeqCst);
        self.words()[layout::Header::Restoring as usize].load(Ordering::SeqCst) != 0
    }

    /// How a slice buffer tells where its trajectories end, if this is one.
    pub(crate) fn slice_bounds(&self) -> Option<&Bounds> {
        self.slices.as_ref().map(|(_, bounds)| bounds)
    }

    /// Each shard's trees, if this storage has them.
    pub(crate) fn trees(&self) -> SmallVec<[Tree<'_>; 8]> {
        self.trees
            .iter()
            .map(|layout| Tree::new(self.words(), layout))
            .collect()
    }

    /// The stamp of the row at slot `leaf` of shard `k` (a tree leaf's row).
    pub(crate) fn stamp_of(&self, k: usize, leaf: u64) -> Stamp {
        let ring = self.shards[k].ring();
        stamp::begin_read(self.stamp(ring.first_slot + leaf))
    }

    /// Starts loading the line holding the stamp and raw priority word of shard `k`'s
    /// slot at position `pos`, lane `lane` ([`Storage::stamp_of`]), for a priority
    /// update that checks the one and sets the other.
    #[inline(always)]
    pub(crate) fn prefetch_stamp(&self, (k, pos, lane): (u64, u64, u64)) {
        let slot = self.shards[k as usize].ring().slot(pos, lane);
        atomic_copy::prefetch(self.words(), self.slot_offset(slot), Intent::Write);
    }

    /// The fields of a row as extends give them and samples return them.
    pub(crate) fn spec(&self) -> &Arc<Spec> {
        &self.spec
    }

    /// The row a slot stores: the spec, or with frames one frame of each stack and no
    /// `next_of` fields.
    pub(crate) fn row_spec(&self) -> &Arc<Spec> {
        self.frames.as_ref().map_or(&self.spec, |f| &f.stored)
    }

    /// Fields stored once a step, if any.
    pub(crate) fn frames(&self) -> Option<&FrameLayout> {
        self.frames.as_deref()
    }

    /// Where field `i` of the spec lies in a stored row, and which of its bytes are
    /// stored there.
    pub(crate) fn place(&self, i: usize) -> plan::Place {
        match &self.frames {
            Some(f) => f.places()[i],
            None => {
                let f = &self.spec.fields()[i];
                plan::Place::whole(f.offset(), f.bytes())
            }
        }
    }

    pub(crate) fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub(crate) fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub(crate) fn reserved_bytes(&self) -> usize {
        self.region.reserved_bytes()
    }

    #[inline]
    pub(crate) fn words(&self) -> &[AtomicU64] {
        self.region.words()
    }

    /// Bytes of one slot: its header and row.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Bytes of a frames buffer's side slots (0 without frames).
    pub(crate) fn side_bytes(&self) -> usize {
        self.frames.as_ref().map_or(0, |f| f.side_bytes())
    }

    /// Bytes of a slot's header: the stamp, and the raw priority and trajectory word
    /// when the sampler keeps them.
    pub(crate) fn header_bytes(&self) -> usize {
        self.header_bytes
    }

    /// The byte of the region where slot `slot` starts.
    pub(crate) fn slot_offset(&self, slot: u64) -> usize {
        self.slot_word(slot) * 8
    }

    /// The byte of the region where slot `slot`'s row starts.
    pub(crate) fn row_offset_of(&self, slot: u64) -> usize {
        self.row_offset(slot)
    }

    /// Slot `slot`'s stamp, as it is now.
    pub(crate) fn stamp_at(&self, slot: u64) -> Stamp {
        stamp::begin_read(self.stamp(slot))
    }

    /// The first word of slot `slot`: its stamp.
    #[inline]
    fn slot_word(&self, slot: u64) -> usize {
        self.layout.slots_at + slot as usize * (self.slot_bytes / 8)
    }

    #[inline]
    fn stamp(&self, slot: u64) -> &AtomicU64 {
        &self.words()[self.slot_word(slot)]
    }

    /// The word of the slot's raw priority (a buffer with trees).
    #[inline]
    fn raw_word(&self, slot: u64) -> usize {
        self.slot_word(slot) + RAW_WORD
    }

    /// The word of the slot's trajectory word (a slice buffer): the header's last.
    #[inline]
    fn traj_word(&self, slot: u64) -> usize {
        self.slot_word(slot) + self.header_bytes / 8 - 1
    }

    #[inline]
    fn row_offset(&self, slot: u64) -> usize {
        self.slot_word(slot) * 8 + self.header_bytes
    }

    /// Appends `steps` steps of rows from `src`, without raw priorities, to shard `k`;
    /// returns the first sequence number (see [`shard::steps_of`] for which steps are
    /// written).
    ///
    /// Refused with [`Retired`], before anything is written, if a swap retired this
    /// storage (`freeze.rs`).
    pub(crate) fn append(&self, k: usize, steps: u64, src: &Source<'_>) -> Result<u64, Retired> {
        let claim = self.enter_append(k)?;
        Ok(self.append_entered(k, claim, steps, src, None).first)
    }

    /// [`Storage::append`] by an appender already inside shard `k` (see
    /// [`Storage::enter_append`]); leaves the shard when done.
    ///
    /// With `raws` (a prioritized buffer), each row's raw priority goes into its slot's
    /// header while the slot is held, before the row is published: the previous lap's
    /// writer published (and so wrote its raw word) before this one began, and an
    /// updater acts on a row only once it sees it published, so the header's plain
    /// store is ordered after both. Such an append also takes the shard's leaf turn if
    /// it is free (`shard.rs`, "Leaf turns"), before any row is published: the caller
    /// gives it back once it has set the rows' leaves.
    pub(crate) fn append_entered(
        &self,
        k: usize,
        claim: Claim,
        steps: u64,
        src: &Source<'_>,
        raws: Option<Raws<'_>>,
    ) -> Appended<'_> {
        let shard = &self.shards[k];
        let ring = *shard.ring();
        let first = shard.claim(steps);
        let appended = Appended {
            first,
            turn: raws
                .filter(|_| steps * ring.width >= LEAF_TURN_MIN_ROWS)
                .and_then(|_| shard.take_leaf_turn(first, steps)),
        };
        let stream = self.streams(k, claim, steps);
        // Rows claimed below this by writers that died: their slots are taken over.
        let abandoned = shard.abandoned().load(Ordering::Acquire);
        let ring_slots = ring.steps * ring.width;
        // An append larger than the caches writes its rows past them (`plan.rs`).
        let streaming = (steps.min(ring.steps) * ring.width) as usize * self.slot_bytes
            >= STREAMING_APPEND_BYTES
            && self.past_caches(&ring);
        if self.frames.is_none() && self.slices.is_none() && steps <= ring.steps {
            if stream {
                self.stream_rows(k, first, steps, src, raws);
            } else {
                self.append_rows(k, claim, first, steps, src, raws, abandoned, streaming);
            }
            shard.leave_append(claim);
            return appended;
        }
        // A slice buffer's lanes: their turns, taken before any row is written.
        let mut turns: SmallVec<[Turn; 8]> = SmallVec::new();
        // A frames buffer's lanes: the last step of each trajectory, walked through
        // the steps an append longer than the ring claims but never writes.
        let mut last = SmallVec::<[Option<StepWord>; 8]>::new();
        if self.frames.is_some() {
            last = self.frames_last(k, first);
            for j in 0..steps.saturating_sub(ring.steps) {
                for lane in 0..ring.width {
                    self.frames_step(k, None, j, lane, src, &mut last[lane as usize]);
                }
            }
        }
        let slices = self.slices.as_ref().map(|(lanes, bounds)| {
            let fresh_from = shard.floor();
            turns.extend((0..ring.width).map(|lane| lanes.begin(self.words(), k, lane, first)));
            let skipped = steps.saturating_sub(ring.steps);
            self.skip_trajectories(&mut turns, bounds, first, skipped, src, fresh_from);
            (bounds, fresh_from)
        });
        for step in shard::steps_of(&ring, first, steps) {
            let prev = match step.prev {
                None => Prev::Empty,
                Some(p) if p < abandoned => Prev::Abandoned,
                Some(p) => Prev::Lap(ring.lap(p)),
            };
            for lane in 0..ring.width {
                let slot = ring.slot(step.pos, lane);
                // The slot `APPEND_AHEAD_SLOTS` on, wrapping (no division: a row's worth
                // of time on small rows).
                let mut ahead = slot - ring.first_slot + APPEND_AHEAD_SLOTS;
                while ahead >= ring_slots {
                    ahead -= ring_slots;
                }
                self.prefetch_slot(self.slot_offset(ring.first_slot + ahead), Intent::Write);
                let stamp = self.stamp(slot);
                stamp::begin_append_or(stamp, prev, step.lap, claim, || {
                    // An editor of another process may have died inside the slot.
                    self.reclaim_dead_editor(k);
                });
                if let Some(raws) = raws {
                    let raw = raws.of(src.order.row(step.j, lane));
                    crate::sync::store_beside_rmw(
                        &self.words()[self.raw_word(slot)],
                        sumtree::raw_bits(step.lap, Some(raw)),
                        Ordering::Release,
                    );
                }
                if self.frames.is_some() {
                    let last = &mut last[lane as usize];
                    let word = self.frames_step(k, Some(step.seq), step.j, lane, src, last);
                    crate::sync::store_beside_rmw(
                        &self.words()[self.frames_word(slot)],
                        word,
                        Ordering::Release,
                    );
                }
                if let Some((bounds, fresh_from)) = slices {
                    let word = turns[lane as usize].advance(
                        self.words(),
                        step.seq,
                        bounds.key(src, step.j, lane),
                        step.seq == fresh_from,
                    );
                    crate::sync::store_beside_rmw(
                        &self.words()[self.traj_word(slot)],
                        word,
                        Ordering::Release,
                    );
                }
                // A slot never written lies on a page the kernel just zeroed, whose
                // lines are cached: cached stores are cheaper there.
                if streaming && step.prev.is_some() {
                    let r = src.order.row(step.j, lane);
                    src.write_rows_streaming(self.words(), self.row_offset(slot), 0, &[r]);
                } else {
                    src.write_row(self.words(), self.row_offset(slot), step.j, lane);
                }
                stamp::publish(stamp, Stamp::published(step.lap, 0));
            }
        }
        for turn in turns {
            turn.finish(self.words(), first + steps);
        }
        shard.leave_append(claim);
        appended
    }

    /// The slot loop of [`Storage::append_entered`] for an append of rows with at most
    /// a raw priority beside them (no frame or trajectory word) and no longer than the
    /// ring: run by run of consecutive positions, with the lap, the predecessor's lap
    /// and the slots' bytes known once a run, and each line of the slots ahead
    /// prefetched once.
    ///
    /// A run goes a group of slots at a time ([`append_group`]): every slot of the
    /// group marked for writing, then the rows' fields copied a field at a time by a
    /// plan checked once (`plan::RowCopies`), then every slot published. A field's
    /// copies then run back to back with its source and moves in registers, where row
    /// by row each row paid for every field's setup.
    #[allow(clippy::too_many_arguments)]
    fn append_rows(
        &self,
        k: usize,
        claim: Claim,
        first: u64,
        steps: u64,
        src: &Source<'_>,
        raws: Option<Raws<'_>>,
        abandoned: u64,
        streaming: bool,
    ) {
        let ring = *self.shards[k].ring();
        let copies = plan::RowCopies::new(src);
        for (start, len) in shard::runs_of(&ring, first, steps) {
            let run = (start, len);
            self.append_rows_run(k, claim, src, &copies, run, raws, abandoned, streaming);
        }
    }

    /// One run of consecutive positions of [`Storage::append_rows`], `len` steps from
    /// `start`.
    #[allow(clippy::too_many_arguments)]
    fn append_rows_run(
        &self,
        k: usize,
        claim: Claim,
        src: &Source<'_>,
        copies: &plan::RowCopies<'_>,
        (start, len): (shard::Step, u64),
        raws: Option<Raws<'_>>,
        abandoned: u64,
        streaming: bool,
    ) {
        let ring = *self.shards[k].ring();
        let words = self.words();
        let (slot_bytes, header_bytes) = (self.slot_bytes, self.header_bytes);
        let group = append_group(slot_bytes);
        let mut rows = [0usize; GROUP_SLOTS];
        // No step of the append is a whole ring after another: each slot's
        // predecessor is one lap back, or there is none in the ring's first lap.
        let fresh = start.prev.is_none();
        let prev_lap = start.lap.wrapping_sub(1);
        let published = Stamp::published(start.lap, 0);
        // The byte of the run's first slot, and past its last.
        let mut at = self.slot_word(ring.slot(start.pos, 0)) * 8;
        let end = at + (len * ring.width) as usize * slot_bytes;
        let mut prefetched = at;
        // Rows over a lap before written past the caches (`plan.rs`).
        let stream_rows = streaming && !fresh;
        // The predecessor of each slot, but for those of the run's first
        // `abandoned_below` slots, which take over an abandoned one.
        let run_prev = if fresh {
            Prev::Empty
        } else {
            Prev::Lap(prev_lap)
        };
        let abandoned_below = if fresh {
            0
        } else {
            (abandoned + ring.steps).saturating_sub(start.seq) * ring.width
        };
        // The next slot's place in the run.
        let mut s = 0;
        while at < end {
            let group_at = at;
            let n = group.min((end - at) / slot_bytes);
            // The group's lines, and `APPEND_AHEAD_BYTES` past it, loading. Of rows
            // that stream, only the lines written through the cache: a line loaded
            // and then overwritten by a non-temporal store costs a read for nothing
            // (`benches/extend.rs` on a Zen 3 host, 256 rows a call: 16 KB rows 323
            // -> 256 us, 56 KB rows 1,140 -> 1,006, beside raw copies of 549 and
            // 2,151 -> 540 and 2,007).
            let ahead = (at + n * slot_bytes + APPEND_AHEAD_BYTES).min(end);
            while prefetched < ahead {
                atomic_copy::prefetch(words, prefetched, Intent::Write);
                if stream_rows {
                    src.prefetch_cached_lines(words, prefetched + header_bytes);
                    prefetched += slot_bytes;
                } else {
                    prefetched += LINE_BYTES;
                }
            }
            src.order.rows_of(start.j, ring.width, s, &mut rows[..n]);
            for &row in &rows[..n] {
                let prev = if s < abandoned_below {
                    Prev::Abandoned
                } else {
                    run_prev
                };
                // The slot's first word is its stamp; its row's predecessor is
                // the step a ring back.
                let pred = start.seq + s / ring.width;
                let pred = pred.wrapping_sub(ring.steps);
                stamp::begin_append_after(
                    &words[at / 8],
                    prev,
                    start.lap,
                    claim,
                    || self.streaming(k, pred),
                    || self.reclaim_dead_editor(k),
                );
                if let Some(raws) = raws {
                    crate::sync::store_beside_rmw(
                        &words[at / 8 + RAW_WORD],
                        sumtree::raw_bits(start.lap, Some(raws.of(row))),
                        Ordering::Release,
                    );
                }
                at += slot_bytes;
                s += 1;
            }
            let (first_row, rows) = (group_at + header_bytes, &rows[..n]);
            if stream_rows {
                src.write_rows_streaming(words, first_row, slot_bytes, rows);
            } else {
                copies.write_rows(words, first_row, slot_bytes, rows);
            }
            for slot in (group_at..at).step_by(slot_bytes) {
                stamp::publish(&words[slot / 8], published);
            }
        }
    }

    /// Whether `ring` is larger than the caches ([`STREAMING_RING_BYTES`]): a learner
    /// reads its rows from memory anyway, and appends write them past the caches.
    pub(crate) fn past_caches(&self, ring: &geometry::Ring) -> bool {
        (ring.steps * ring.width) as usize * self.slot_bytes >= STREAMING_RING_BYTES
    }

    /// Whether an append of `steps` steps that entered shard `k` with `claim` streams
    /// its rows ([`Storage::stream_rows`]): one that [`Storage::stream_sized`], by the
    /// only appender in the shard.
    fn streams(&self, k: usize, claim: Claim, steps: u64) -> bool {
        claim == Claim::Plain && self.stream_sized(k, steps) && self.shards[k].alone()
    }

    /// Whether an append of `steps` steps into shard `k` is one that streams when its
    /// appender is alone in the shard: rows with no frame or trajectory word, of at
    /// most [`STREAM_SLOT_BYTES`], at least [`STREAM_MIN_BYTES`] of them, into a ring
    /// larger than the caches or holding at least [`STREAM_RING_SHARE`] such appends.
    pub(crate) fn stream_sized(&self, k: usize, steps: u64) -> bool {
        let ring = self.shards[k].ring();
        let bytes = (steps * ring.width) as usize * self.slot_bytes;
        let large = if cfg!(replaybuf_loom) {
            steps * ring.width >= 2
        } else {
            bytes >= STREAM_MIN_BYTES
                && (self.past_caches(ring) || steps * STREAM_RING_SHARE <= ring.steps)
        };
        self.may_stream() && steps <= ring.steps && self.slot_bytes <= STREAM_SLOT_BYTES && large
    }

    /// Slots a stage of a streaming append holds: [`STAGE_BYTES`] of them, and never
    /// fewer than a line period, so that a stage's slots can end where a line starts
    /// (slots of 648 to 1,016 bytes that are odd multiples of 8 start a line once in
    /// 8, and 5,120 bytes held 5 to 7 of them; an append that began 6 or 7 slots short
    /// of a line's start overran the stage).
    #[cfg(not(replaybuf_loom))]
    fn stage_slots(&self) -> usize {
        (STAGE_BYTES / self.slot_bytes)
            .max(line_slots(self.slot_bytes))
            .min(STAGE_SLOTS)
    }

    /// [`Storage::append_rows`] for an appender alone in shard `k`, writing its slots
    /// without marking them: the shard's stream words announce the rows instead
    /// (`docs/orderings.rs` §6, "Streams"). Each slot's stamp, raw priority
    /// and row are gathered in L1 ([`stages_in`]), a stage's rows at a time, and the stage
    /// stored whole: into a ring larger than the caches by non-temporal stores, which
    /// do not read the lines first, where marking the slot would have read every line
    /// of it; into a smaller ring through the cache, where the learners that sample
    /// the new rows find them, and where gathering a stage field by field and storing
    /// it in one copy takes half the time of marking each slot and copying each field
    /// into the ring (mujoco rows into 10,000: 17 us against 31 a 1,000-row extend,
    /// on the Intel host of [`STREAM_RING_SHARE`]).
    /// Runs in a ring's first lap, whose slots lie on pages the kernel just zeroed,
    /// go through `append_rows`' cached stores.
    fn stream_rows(
        &self,
        k: usize,
        first: u64,
        steps: u64,
        src: &Source<'_>,
        raws: Option<Raws<'_>>,
    ) {
        let shard = &self.shards[k];
        let ring = *shard.ring();
        shard.begin_stream(first..first + steps);
        // Should anything below panic, the stream's rows are dropped and the stream
        // ended, as for a writer that died: nobody waits on it.
        let guard = EndOnUnwind { storage: self, k };
        // SYNC POINT: pairs with a reader's R2, as a slot's W2 does; and the
        // announcement goes out before any non-temporal store.
        crate::sync::fence(Ordering::Release);
        atomic_copy::streaming_fence();
        let copies = plan::RowCopies::new(src);
        #[cfg(not(replaybuf_loom))]
        let past_caches = self.past_caches(&ring);
        #[cfg(not(replaybuf_loom))]
        let (mut stack, mut heap) = (
            StackStages([std::mem::MaybeUninit::uninit(); 2 * STACK_STAGE_SPAN]),
            Vec::new(),
        );
        #[cfg(not(replaybuf_loom))]
        let mut stages = {
            let span = LINE_BYTES + self.stage_slots() * self.slot_bytes;
            let room = if span <= STACK_STAGE_SPAN {
                &mut stack.0[..]
            } else {
                heap.reserve_exact(2 * span + 2 * LINE_BYTES);
                let spare = heap.spare_capacity_mut();
                let lead = spare.as_ptr().align_offset(LINE_BYTES);
                &mut spare[lead..]
            };
            // The second stage only where one goes out while the next is gathered.
            stages_in(room, span, past_caches)
        };
        for (start, len) in shard::runs_of(&ring, first, steps) {
            if start.prev.is_none() {
                let run = (start, len);
                self.append_rows_run(k, Claim::Plain, src, &copies, run, raws, 0, false);
                continue;
            }
            #[cfg(not(replaybuf_loom))]
            self.stream_run(
                &ring,
                &copies,
                &mut stages,
                start,
                len,
                src,
                raws,
                past_caches,
            );
            #[cfg(replaybuf_loom)]
            self.stream_run_modelled(&ring, &copies, start, len, src, raws);
        }
        // Every row's stores, non-temporal ones included, before the end.
        atomic_copy::streaming_fence();
        std::mem::forget(guard);
        shard.end_stream(first + steps);
    }

    /// One run of consecutive positions of [`Storage::stream_rows`]: [`STAGE_BYTES`]
    /// of slots at a time gathered into a stage, each with its stamp (published) and
    /// raw priority, then stored from it.
    ///
    /// `past_caches`, by [`atomic_copy::store_stage`], whose whole lines go out as
    /// non-temporal stores and whose partial lines at either end as ordinary ones, in
    /// parts, while the next stage is gathered into the other of `stages`: a part
    /// after each field's rows ([`Outgoing`]). A stage stored whole, then the next
    /// gathered, took the sum of the two: stores retire in order, and a burst of
    /// non-temporal stores longer than the core's write-combining buffers holds up the
    /// gather's own stores behind it until they drain to memory. Measured (Intel Xeon,
    /// family 6 model 207, 2026-11-30; one process alternating the two in 30 laps,
    /// the median of the laps' ratios): 1,000 mujoco rows into a million 13.49 against
    /// 15.96 us, 0.852x, and 13.90 against 16.93, 0.862x; 256 rows of 100 bytes (three
    /// fields, so parts of 27 lines) 0.940x and 0.962x. With the stores spread finer,
    /// each field's rows gathered in two to eight pieces with a part after each,
    /// mujoco's extends took 0.904x, 1.144x and 1.822x the unpipelined ones (each
    /// piece costs its own setup); with stages of 2,560 to 16,384 bytes, 0.898x to
    /// 1.139x (5,120 the best, as before). The gather alone (no stores) took 6.2 us
    /// and the stores alone 8.5.
    ///
    /// Otherwise, by [`atomic_copy::store`], through the cache, a stage whole after
    /// it is gathered (`stages[0]`; the second is empty).
    #[cfg(not(replaybuf_loom))]
    #[allow(clippy::too_many_arguments)]
    fn stream_run(
        &self,
        ring: &geometry::Ring,
        copies: &plan::RowCopies<'_>,
        stages: &mut [&mut [u8]; 2],
        start: shard::Step,
        len: u64,
        src: &Source<'_>,
        raws: Option<Raws<'_>>,
        past_caches: bool,
    ) {
        let (words, slot_bytes) = (self.words(), self.slot_bytes);
        let published = Stamp::published(start.lap, 0).to_bits();
        // Slots a whole number of lines long together: chunks of them start and end on
        // line boundaries once one does, so that only a run's first and last lines
        // are stored in part (by ordinary stores, each of which reads its line).
        let period = line_slots(slot_bytes);
        let chunk = self.stage_slots();
        let chunk = chunk - chunk % period;
        // A stage of less than a line period would give chunks of no slots, and the
        // loop below would never end (a stage of 5 slots of 1,000 bytes, before
        // `stage_slots` held a period: tests/stream_sizes.rs then spun).
        assert!(
            chunk > 0,
            "replaybuf internal error: a stage of no line period"
        );
        // A flat source's rows, a lane a step: consecutive.
        let flat = matches!(src.order, plan::RowOrder::Flat) && ring.width == 1;
        let mut rows = [0usize; STAGE_SLOTS];
        // The stage going out while the next is gathered (in `stages[into ^ 1]`), and
        // which of `stages` the next is gathered into.
        let mut outgoing: Option<Outgoing> = None;
        let mut into = 0;
        let mut at = self.slot_word(ring.slot(start.pos, 0)) * 8;
        let end = at + (len * ring.width) as usize * slot_bytes;
        let mut s = 0;
        while at < end {
            // The first chunk ends where a slot starts a line, if one does soon: fewer
            // slots than a stage holds (`stage_slots`, a line period at least).
            let to_line = (0..period).find(|&j| (at + j * slot_bytes).is_multiple_of(LINE_BYTES));
            let n = match to_line {
                Some(j) if j > 0 => j,
                _ => chunk,
            };
            let n = n.min((end - at) / slot_bytes);
            src.order.rows_of(start.j, ring.width, s, &mut rows[..n]);
            // Where the slot starts in its line, and so in the stage.
            let base = at % LINE_BYTES;
            let [zero, one] = &mut *stages;
            let (stage, other): (&mut [u8], &[u8]) =
                if into == 0 { (zero, one) } else { (one, zero) };
            for (i, &row) in rows[..n].iter().enumerate() {
                let slot = base + i * slot_bytes;
                stage[slot..slot + 8].copy_from_slice(&published.to_ne_bytes());
                if let Some(raws) = raws {
                    let raw = sumtree::raw_bits(start.lap, Some(raws.of(row)));
                    let w = slot + RAW_WORD * 8;
                    stage[w..w + 8].copy_from_slice(&raw.to_ne_bytes());
                }
            }
            let staged = if flat {
                plan::StagedRows::Run(rows[0], n)
            } else {
                plan::StagedRows::Listed(&rows[..n])
            };
            let rows_at = base + self.header_bytes;
            if past_caches {
                copies.stage_rows(stage, rows_at, slot_bytes, staged, |part, parts| {
                    if let Some(out) = &mut outgoing {
                        out.store_part(words, other, part, parts);
                    }
                });
                // The callbacks' last part stored the rest; should they have left any,
                // it goes now, before the next stage is gathered over it.
                if let Some(out) = &mut outgoing {
                    out.store_part(words, other, 1, 1);
                }
                outgoing = Some(Outgoing {
                    from: base,
                    len: n * slot_bytes,
                    to: at,
                    done: 0,
                });
                into ^= 1;
            } else {
                copies.stage_rows(stage, rows_at, slot_bytes, staged, |_, _| {});
                atomic_copy::store(words, at, &stage[base..base + n * slot_bytes]);
            }
            at += n * slot_bytes;
            s += n as u64;
        }
        if let Some(mut out) = outgoing {
            out.store_part(words, stages[into ^ 1], 1, 1);
        }
    }

    /// [`Storage::stream_run`] under loom, which has no non-temporal stores to model:
    /// ordinary stores in the orders those could land in, which are any. Even
    /// positions get their published stamp before their row's bytes (a reader may see
    /// the stamp with old bytes: the stream words must turn it away), odd positions
    /// after them (a reader may copy new bytes under the old stamp: the cursor must).
    #[cfg(replaybuf_loom)]
    fn stream_run_modelled(
        &self,
        ring: &geometry::Ring,
        copies: &plan::RowCopies<'_>,
        start: shard::Step,
        len: u64,
        src: &Source<'_>,
        raws: Option<Raws<'_>>,
    ) {
        let words = self.words();
        let published = Stamp::published(start.lap, 0).to_bits();
        let mut rows = [0usize; 1];
        let mut at = self.slot_word(ring.slot(start.pos, 0)) * 8;
        for s in 0..len * ring.width {
            src.order.rows_of(start.j, ring.width, s, &mut rows);
            let stamp_first = (start.pos + s / ring.width).is_multiple_of(2);
            if stamp_first {
                words[at / 8].store(published, Ordering::Relaxed);
            }
            if let Some(raws) = raws {
                // Beside an update's compare-exchange of the old row's raw word: see
                // `sync::store_beside_rmw` for why loom needs it said.
                let raw = sumtree::raw_bits(start.lap, Some(raws.of(rows[0])));
                crate::sync::store_beside_rmw(&words[at / 8 + RAW_WORD], raw, Ordering::Relaxed);
            }
            copies.write_rows(words, at + self.header_bytes, self.slot_bytes, &rows);
            if !stamp_first {
                words[at / 8].store(published, Ordering::Relaxed);
            }
            at += self.slot_bytes;
        }
    }

    /// Gives trajectories to the first `skipped` steps of an append claimed at
    /// `first`, which it claims but never writes (an append longer than the ring
    /// writes only its last `ring.steps`).
    fn skip_trajectories(
        &self,
        turns: &mut [Turn],
        bounds: &Bounds,
        first: u64,
        skipped: u64,
        src: &Source<'_>,
        fresh_from: u64,
    ) {
        for (lane, turn) in turns.iter_mut().enumerate() {
            for j in 0..skipped {
                let key = bounds.key(src, j, lane as u64);
                turn.advance(self.words(), first + j, key, first + j == fresh_from);
            }
        }
    }

    /// Prefetches the cache lines of the first [`PREFETCH_LINES`] * 64 bytes of the slot
    /// that starts at region byte `start`, and of its last byte if it ends sooner: a
    /// 176-byte slot starting 48 bytes into a line spans four lines, and gets all four.
    /// Branch-free: a line prefetched twice costs nothing, and a sample prefetches
    /// every row it reads.
    #[inline(always)]
    fn prefetch_slot(&self, start: usize, intent: Intent) {
        let (words, last) = (self.words(), start + self.slot_bytes - 1);
        for line in 0..PREFETCH_LINES {
            atomic_copy::prefetch(words, (start + line * LINE_BYTES).min(last), intent);
        }
    }

    /// Starts loading the cache lines of a drawn row into L1. Samples prefetch a sliding
    /// window of [`SAMPLE_AHEAD_DRAWS`] rows: all of a batch at once would overflow L1
    /// before the first row is copied.
    #[inline(always)]
    pub(crate) fn prefetch(&self, at: Located) {
        self.prefetch_slot(at.offset, Intent::Read);
    }

    /// Starts loading a drawn row's first line, and the line 128 bytes on, into L2
    /// (the L2's spatial prefetcher completes each to its 128-byte pair). A sample asks
    /// this for all of its rows before copying any, so that memory's latency is paid
    /// once a batch rather than once a window; the window then finds the rest. Mujoco
    /// `sample` 256 of a million rows, on this VM: 13.9 us with the window alone; with
    /// this first, 10.4 us at one line a row, 9.8 at two, 10.1 at three, 11.3 at four.
    #[inline(always)]
    pub(crate) fn prefetch_later(&self, at: Located) {
        let words = self.words();
        for offset in [at.offset, at.offset + 2 * LINE_BYTES] {
            atomic_copy::prefetch(words, offset, Intent::ReadLater);
        }
    }

    /// Where a draw's row lies: its slot, storage index and lap, from one split of its
    /// sequence number (a sample asks for them three times a row: prefetched for L2,
    /// for L1, and read).
    #[inline(always)]
    pub(crate) fn locate(&self, draw: Draw) -> Located {
        self.locator().locate(draw)
    }

    /// A [`Locator`] of this storage's rows, for a loop locating many.
    #[inline(always)]
    pub(crate) fn locator(&self) -> Locator<'_> {
        Locator {
            shards: &self.shards,
            one: match &*self.shards {
                [shard] => Some(*shard.ring()),
                _ => None,
            },
            slots_at: self.layout.slots_at,
            slot_words: self.slot_bytes / 8,
        }
    }

    /// Copies the drawn row into row `k` of `dst`; returns its stamp and index.
    #[inline]
    pub(crate) fn read(
        &self,
        draw: Draw,
        at: Located,
        want: Want,
        dst: &mut Dest<'_>,
        k: usize,
    ) -> Result<(Stamp, u64), Miss> {
        self.read_with(draw, at, want, dst, k, |_| ())
    }

    /// Copies the drawn row of a slice buffer into row `k` of `dst`, exactly the row of
    /// the draw; returns its stamp, index, and trajectory word, read under the same
    /// stamp check as the row.
    #[inline]
    pub(crate) fn read_slice_row(
        &self,
        draw: Draw,
        dst: &mut Dest<'_>,
        k: usize,
    ) -> Result<(Stamp, u64, u64), Miss> {
        let mut word = 0;
        let at = self.locate(draw);
        let (stamp, index) = self.read_with(draw, at, Want::Exact, dst, k, |slot| {
            word = self.words()[self.traj_word(slot)].load(Ordering::Relaxed);
        })?;
        Ok((stamp, index, word))
    }

    #[inline(always)]
    fn read_with(
        &self,
        draw: Draw,
        at: Located,
        want: Want,
        dst: &mut Dest<'_>,
        k: usize,
        mut header: impl FnMut(u64),
    ) -> Result<(Stamp, u64), Miss> {
        let mut word = None;
        let seen = self.read_located(at, want, |slot| {
            header(slot);
            if self.frames.is_some() {
                let word_at = self.frames_word(slot);
                word = Some(StepWord(self.words()[word_at].load(Ordering::Relaxed)));
            }
            dst.read_row(self.words(), self.row_offset(slot), k);
        })?;
        if let Some(word) = word {
            // The row's sequence number: the drawn one, or a later lap's.
            let seq = self.seq_seen(&at, seen);
            // A later lap's row that cannot be rebuilt yet (its lane's newest, whose
            // next step is not written): a draw of it misses for good. Rebuilt, it
            // read a step nobody had claimed, busy, and an epoch's draw of a position
            // the collector had lapped retried it 2^20 times, for 1.4 s, then failed.
            let sampleable = self.sampleable(draw.shard as usize);
            if !(sampleable.lo..sampleable.hi).contains(&seq) {
                return Err(Miss::Gone);
            }
            self.rebuild(draw.shard as usize, u64::from(draw.lane), seq, word, dst, k)?;
        }
        Ok((seen, at.index))
    }

    /// The slot read protocol (`stamp.rs`, R1-R3): runs `copy` on the slot of row
    /// `seq` of a lane of shard `k` if it holds that row (or with `Want::AtLeast` a
    /// later lap's), published, and returns the stamp seen if nothing changed the slot
    /// during the copy.
    #[inline(always)]
    fn read_slot(
        &self,
        k: usize,
        seq: u64,
        lane: u64,
        want: Want,
        copy: impl FnOnce(u64),
    ) -> Result<Stamp, Miss> {
        let draw = Draw {
            shard: k as u32,
            lane: lane as u32,
            seq,
            ..Draw::default()
        };
        self.read_located(self.locate(draw), want, copy)
    }

    /// [`Storage::read_slot`] of a draw's [`Located`] row.
    #[inline(always)]
    fn read_located(&self, at: Located, want: Want, copy: impl FnOnce(u64)) -> Result<Stamp, Miss> {
        let stamp = self.stamp(at.slot);
        let seen = stamp::begin_read(stamp);
        readable(seen, at.lap, want)?;
        // R1': a stream's stamp may be visible before its bytes.
        if StreamWords::new(self).writing(&at, seen) {
            return Err(Miss::Busy);
        }
        copy(at.slot);
        // R2, then the stream words before R3 (R2': a stream marks no slot, so a copy
        // it raced may show the old stamp at R3, but then its words show it).
        stamp::copied();
        if StreamWords::new(self).writing_next_lap(&at, seen) {
            // Being replaced: wait for the stream, as for a slot being written.
            Err(Miss::Busy)
        } else if stamp::still(stamp, seen) {
            Ok(seen)
        } else {
            Err(Miss::Torn)
        }
    }

    /// The sequence number of the row whose stamp `seen` a read of `at` found: the
    /// drawn one, or with `Want::AtLeast` a later lap's.
    #[inline(always)]
    fn seq_seen(&self, at: &Located, seen: Stamp) -> u64 {
        seq_seen(at, seen, self.shards[at.shard as usize].ring().steps)
    }

    /// Whether a streaming append is writing row `seq` of shard `k` (an appender of
    /// its next lap waits: `stamp::begin_append_after`).
    #[inline(always)]
    fn streaming(&self, k: usize, seq: u64) -> bool {
        self.may_stream() && self.shards[k].stream().contains(&seq)
    }

    /// Whether appends may stream here: rows with no frame or trajectory word.
    #[inline(always)]
    fn may_stream(&self) -> bool {
        self.frames.is_none() && self.slices.is_none()
    }

    /// Whether [`Storage::read`] of each row may run as one pass of
    /// [`Storage::read_block`] (a frames buffer rebuilds its rows one by one).
    pub(crate) fn reads_in_blocks(&self) -> bool {
        self.frames.is_none()
    }

    /// [`Storage::read`] of the rows `at[j]` into rows `k + j` of `dst`, for a few
    /// rows at once (at most [`READ_BLOCK`]): the slot protocol's steps taken for all
    /// of them together, each row's R1 before any copy and its R3 after them all, and
    /// the rows copied a field at a time, each field's moves chosen once for the block
    /// (`Dest::read_rows`). Each row is still read as the protocol reads one row: its
    /// R1, then its check against the stream words (R1'), then its bytes, then the
    /// fence (R2), its second check (R2') and its R3; the block loads a shard's stream
    /// words once for each check (see [`StreamWords`]). `out[j]` is row `j`'s stamp, or
    /// the miss that [`Storage::read`] would have given.
    ///
    /// Only where [`Storage::reads_in_blocks`].
    pub(crate) fn read_block(
        &self,
        at: &[Located],
        want: Want,
        dst: &mut Dest<'_>,
        k: usize,
        out: &mut [Result<Stamp, Miss>],
    ) {
        debug_assert!(self.reads_in_blocks() && at.len() <= READ_BLOCK && out.len() == at.len());
        let words = self.words();
        let stamp = |a: &Located| &words[a.offset / 8];
        let header = self.header_bytes;
        // The rows to copy: byte offset in the region, row of `dst`.
        let mut rows = [(0, 0); READ_BLOCK];
        let mut n = 0;
        // R1 for every row, before any row's check against the stream words (R1').
        for (j, (a, o)) in at.iter().zip(out.iter_mut()).enumerate() {
            let seen = stamp::begin_read(stamp(a));
            *o = readable(seen, a.lap, want).map(|()| seen);
            if o.is_ok() {
                rows[n] = (a.offset + header, k + j);
                n += 1;
            }
        }
        let mut streams = StreamWords::new(self);
        if !streams.quiet(at) {
            // A stream is announced in a shard of the block: the rows it is writing
            // are busy (R1'), and only the others are copied.
            n = 0;
            for (j, (a, o)) in at.iter().zip(out.iter_mut()).enumerate() {
                if let Ok(seen) = *o {
                    if streams.writing(a, seen) {
                        *o = Err(Miss::Busy);
                    } else {
                        rows[n] = (a.offset + header, k + j);
                        n += 1;
                    }
                }
            }
        }
        dst.read_rows(words, &rows[..n]);
        // R2 once for the block, after every copy; R2' from stream words loaded after it.
        stamp::copied();
        let mut streams = StreamWords::new(self);
        let quiet = streams.quiet(at);
        for (a, o) in at.iter().zip(out.iter_mut()) {
            if let Ok(seen) = *o {
                if !quiet && streams.writing_next_lap(a, seen) {
                    *o = Err(Miss::Busy);
                } else if !stamp::still(stamp(a), seen) {
                    *o = Err(Miss::Torn);
                }
            }
        }
    }

    /// Whether the drawn row was claimed by a writer that died before publishing it,
    /// or dropped by an editor that died while rewriting it.
    pub(crate) fn is_abandoned(&self, d: Draw) -> bool {
        let shard = &self.shards[d.shard as usize];
        let Located { slot, lap, .. } = self.locate(d);
        let stamp = self.stamp_at(slot);
        if stamp.is_dropped() && stamp.lap() == lap {
            return true;
        }
        if d.seq >= shard.abandoned().load(Ordering::Acquire) {
            return false;
        }
        // A newer row there (a lap after) is a row too: a read by position takes it.
        // So is one being rewritten in place: its editor lives (a dead editor's row is
        // dropped by its recovery), and publishes it again. (It was taken for lost,
        // which a FIFO queue or an epoch would skip.)
        let row = stamp.is_published() || stamp.is_being_edited();
        !(row && lap_cmp(stamp.lap(), lap) != Cmp::Less)
    }

    /// The row currently at storage `index`, as a draw, or `None` if the position is
    /// out of range or holds no live row (never written, emptied, or claimed by a
    /// writer that died before publishing it).
    pub(crate) fn draw_at(&self, index: u64) -> Option<Draw> {
        let (k, pos, lane) = self.geometry.locate(index)?;
        let steps = self.shards[k as usize].ring().steps;
        let seq = self.sampleable(k as usize).seq_at(pos, steps)?;
        let d = Draw {
            shard: k as u32,
            lane: lane as u32,
            seq,
            ..Draw::default()
        };
        (!self.is_abandoned(d)).then_some(d)
    }

    /// The write generation of the row in `draw`'s slot now, from its stamp alone
    /// (that of a row being written: its new one).
    pub(crate) fn generation_at(&self, draw: Draw) -> u64 {
        let slot = self.locate(draw).slot;
        Stamp::from_bits(self.stamp(slot).load(Ordering::Acquire)).generation()
    }

    /// The storage index of `draw`'s position ([`draw_at`](Self::draw_at)'s inverse).
    #[inline]
    pub(crate) fn position_of(&self, draw: Draw) -> u64 {
        self.locate(draw).index
    }

    /// Rewrites the row at `draw`'s position in place with row `step` of `src`. The
    /// caller holds an editor guard on the shard. Returns `false` if the slot holds no
    /// row, or a newer row than the draw's.
    pub(crate) fn edit(&self, draw: Draw, src: &Source<'_>, step: u64) -> bool {
        let Located { slot, lap, .. } = self.locate(draw);
        let stamp = self.stamp(slot);
        // Only the drawn row: a newer one there (a writer lapped the ring since the
        // draw) is not the row the caller checked and means to rewrite.
        let Some(published) = stamp::begin_edit_or(stamp, Some(lap), || {
            // The row's appender may have died inside it (shared mode): its lease is
            // taken over and its unpublished rows abandoned, which this one is then.
            self.reclaim_dead_lease(draw.shard as usize);
            self.is_abandoned(draw)
        }) else {
            return false;
        };
        src.write_row(self.words(), self.row_offset(slot), step, 0);
        stamp::publish(stamp, published);
        true
    }

    /// Fills `out` with every shard's live window.
    /// A frames buffer's windows leave out the rows that cannot be rebuilt yet or
    /// any more (`FrameLayout::trim`).
    pub(crate) fn windows(&self, out: &mut Vec<Window>) {
        out.clear();
        out.extend((0..self.shards.len()).map(|k| self.sampleable(k)));
    }

    /// Whether any shard holds a row a draw can return ([`Storage::sampleable`]).
    pub(crate) fn has_sampleable(&self) -> bool {
        (0..self.shards.len()).any(|k| self.sampleable(k).steps() > 0)
    }

    /// Shard `k`'s live window, less a frames buffer's rows that cannot be rebuilt.
    pub(crate) fn sampleable(&self, k: usize) -> Window {
        let shard = &self.shards[k];
        let w = shard.window();
        match &self.frames {
            Some(f) => {
                let (lo, hi) = f.trim(w.lo, w.hi, shard.ring().steps);
                Window { lo, hi }
            }
            None => w,
        }
    }

    /// Rows stored (claimed and not emptied).
    pub(crate) fn len(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.window().steps() * s.ring().width)
            .sum()
    }

    /// Rows written since creation or the last `empty`.
    pub(crate) fn write_count(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.written() * s.ring().width)
            .sum()
    }

    pub(crate) fn empty(&self) {
        for s in self.shards.iter() {
            s.empty();
        }
    }

    /// A second storage over this one's region, with a retirement flag of its own:
    /// what a swap that keeps the rows where they are publishes, so that retiring the
    /// old storage does not retire the region.
    pub(crate) fn view(&self) -> Storage {
        Storage {
            procs: self.procs.clone(),
            #[cfg(not(replaybuf_loom))]
            member: self.member.clone(),
            region: self.region.clone(),
            updaters: self.updaters.clone(),
            retired: AtomicBool::new(false),
            carrying: AtomicBool::new(false),
            first_lap: self.first_lap,
            layout: self.layout.clone(),
            shards: self.shards.clone(),
            geometry: self.geometry,
            spec: self.spec.clone(),
            slot_bytes: self.slot_bytes,
            header_bytes: self.header_bytes,
            trees: self.trees.clone(),
            slices: self.slices.clone(),
            frames: self.frames.clone(),
        }
    }

    /// Ends the last trajectory of every lane of shard `k`: the next row appended
    /// begins a new one, whatever the last row's flags. For a storage nobody else uses
    /// yet (a swap's copy, which carries several old shards' rows into one ring).
    pub(crate) fn end_trajectories(&self, k: usize) {
        if let Some(lanes) = self.lanes() {
            for lane in 0..self.shards[k].ring().width {
                lanes.end_trajectory(self.words(), k, lane);
            }
        }
    }

    /// Starts a new, empty storage's rings at lap `lap`: every shard's cursor, floor
    /// and abandoned mark at its first sequence number of that lap, and every slice
    /// lane's turn there too. Its rows then have generations no row of a lower lap
    /// had (a swap uses this, so that an index and generation sampled before it never
    /// name a row copied after it). For a storage nobody else uses yet.
    pub(crate) fn start_at_lap(&mut self, lap: u64) {
        self.first_lap = lap;
        for (k, shard) in self.shards.iter().enumerate() {
            let ring = *shard.ring();
            let seq = lap * ring.steps;
            shard.start_at(seq);
            if let Some(lanes) = self.lanes() {
                for lane in 0..ring.width {
                    lanes.recover(self.words(), k, lane, seq, |_| None);
                }
            }
        }
    }
}

/// The shards of `geometry` over a region of their own holding nothing but their
/// blocks and the globals, which it returns too: for the list storage, which keeps
/// its values outside any region.
pub(crate) fn shards_only(geometry: &Geometry) -> io::Result<(Box<[Shard]>, Block)> {
    let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "storage too large");
    let layout = RegionLayout::new(
        0,
        geometry.shards() as usize,
        0,
        0,
        0,
        |_, _| Some(0),
        |_| Some(0),
    )
    .ok_or_else(too_large)?;
    let region = Arc::new(Region::heap(layout.words)?);
    let shards = (0..geometry.shards())
        .map(|k| {
            let at = layout.shard_word(k as usize, ShardWord::Cursor);
            Shard::new(
                geometry.ring(k),
                Block::new(&region, at, layout::SHARD_WORDS),
                None,
            )
        })
        .collect();
    let at = layout.global(Global::Calls);
    Ok((shards, Block::new(&region, at, layout.procs_at - at)))
}

/// What a storage is made of, laid out before its region exists: the region's size
/// comes from here, and the storage is then assembled over whichever region a backing
/// gives.
#[derive(Debug)]
pub(crate) struct StorageParts {
    pub(crate) layout: RegionLayout,
    spec: Arc<Spec>,
    geometry: Geometry,
    slot_bytes: usize,
    header_bytes: usize,
    trees: Vec<TreeLayout>,
    slices: Option<(Lanes, Bounds)>,
    frames: Option<Arc<FrameLayout>>,
}

impl StorageParts {
    /// Lays out a storage (see [`Storage::new`]) with `meta_bytes` of meta and
    /// `procs` process-table entries.
    pub(crate) fn new(
        spec: Arc<Spec>,
        geometry: Geometry,
        trees: Option<bool>,
        slices: Option<Bounds>,
        mut frames: Option<FrameLayout>,
        meta_bytes: usize,
        procs: usize,
    ) -> io::Result<StorageParts> {
        let (with_trees, with_max) = (trees.is_some(), trees == Some(true));
        let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "storage too large");
        let header_bytes = 8
            + 8 * usize::from(with_trees)
            + 8 * usize::from(frames.is_some())
            + 8 * usize::from(slices.is_some());
        let row_bytes = frames
            .as_ref()
            .map_or(spec.row_bytes(), |f| f.stored.row_bytes());
        let slot_bytes = header_bytes + row_bytes;
        let capacity = usize::try_from(geometry.capacity()).map_err(|_| too_large())?;
        let mut tree_layouts = Vec::new();
        let mut lanes = None;
        let layout = RegionLayout::new(
            meta_bytes,
            geometry.shards() as usize,
            procs,
            capacity,
            slot_bytes / 8,
            |slots_at, at| {
                if !with_trees {
                    return Some(0);
                }
                // Raw priorities sit in the slots, after the stamps (`RAW_WORD`).
                let mut next = at;
                // Every tree bounds its leaves as the largest does: a draw picks a
                // shard by its root's mass, so all count masses in one unit, and the
                // unit follows the bound (`mass_scale.rs`). Trees of 4 and 3 leaves
                // each took their own, and a row of the first was drawn twice as
                // often as one of the second at the same priority.
                let largest = (0..geometry.shards())
                    .map(|k| geometry.ring(k))
                    .map(|ring| ring.steps * ring.width)
                    .max()
                    .unwrap_or(0);
                let largest = usize::try_from(largest).ok()?;
                for k in 0..geometry.shards() {
                    let ring = geometry.ring(k);
                    let first_slot = usize::try_from(ring.first_slot).ok()?;
                    let raws = (
                        slots_at + first_slot * (slot_bytes / 8) + RAW_WORD,
                        slot_bytes / 8,
                    );
                    let leaves = usize::try_from(ring.steps * ring.width).ok()?;
                    let tree =
                        TreeLayout::new(leaves, next, with_max, Some(raws)).bounded_as(largest);
                    next = next.checked_add(tree.words())?;
                    tree_layouts.push(tree);
                }
                Some(next - at)
            },
            |at| {
                let mut taken = 0;
                if slices.is_some() {
                    let (l, words) = Lanes::new(&geometry, at)?;
                    lanes = Some(l);
                    taken = words;
                }
                if let Some(f) = &mut frames {
                    taken += f.place_side(geometry.shards() as usize, at + taken)?;
                }
                Some(taken)
            },
        )
        .ok_or_else(too_large)?;
        Ok(StorageParts {
            layout,
            spec,
            geometry,
            slot_bytes,
            header_bytes,
            trees: tree_layouts,
            slices: lanes.zip(slices),
            frames: frames.map(Arc::new),
        })
    }

    /// The storage over `region`, which is at least `layout.words` long.
    pub(crate) fn into_storage(self, region: Arc<Region>) -> Storage {
        let layout = self.layout;
        let procs = (layout.procs > 0).then(|| {
            ProcTable::new(Block::new(
                &region,
                layout.procs_at,
                layout.procs * layout::PROC_WORDS,
            ))
        });
        let shards = (0..self.geometry.shards())
            .map(|k| {
                let at = layout.shard_word(k as usize, ShardWord::Cursor);
                Shard::new(
                    self.geometry.ring(k),
                    Block::new(&region, at, layout::SHARD_WORDS),
                    procs.clone(),
                )
            })
            .collect();
        // Each tree counts its leaf changers in its shard's block.
        let trees = self
            .trees
            .into_iter()
            .enumerate()
            .map(|(k, tree)| {
                tree.counted_at(
                    layout.shard_word(k, ShardWord::LeafChangers),
                    layout.shard_word(k, ShardWord::MarksSet),
                )
            })
            .collect();
        Storage {
            procs,
            #[cfg(not(replaybuf_loom))]
            member: None,
            region,
            updaters: Arc::new(CachePadded::new(AtomicU64::new(0))),
            retired: AtomicBool::new(false),
            carrying: AtomicBool::new(false),
            first_lap: 0,
            layout,
            shards,
            geometry: self.geometry,
            spec: self.spec,
            slot_bytes: self.slot_bytes,
            header_bytes: self.header_bytes,
            trees,
            slices: self.slices,
            frames: self.frames,
        }
    }
}
