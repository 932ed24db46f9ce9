//! Where everything of one storage lives in its region, in words.
//!
//! A storage keeps all of its state in one region, not only its rows: the cursors,
//! the prioritized sampler's settings and running maximum, the counters that hand out
//! random streams and shards. So a region is the whole buffer, and the same bytes
//! work on every backing: the heap, a file (persistent storage), or named shared
//! memory that several processes map at once.
//!
//! ```text
//! | header | meta | shard blocks | globals | process table | slots ... | trees | lanes |
//! ```
//!
//! - **header** (`HEADER_WORDS`): magic, format version, layout hash, readiness, sizes
//!   (see [`Header`]). A process that maps a region checks these before anything else.
//! - **meta**: the buffer's configuration as JSON, so that another process can attach
//!   to a shared region by name alone (empty on the heap).
//! - **shard blocks**: one per shard, `SHARD_WORDS` each (two cache lines, so that
//!   collectors on different shards share none): cursor, floor, occupancy, and the
//!   shared-mode writer lease.
//! - **globals**: counters and settings every handle shares, each contended word on a
//!   line of its own ([`Global`]).
//! - **process table**: in shared mode, one line per attached process; then the
//!   rate-limit block, four lines, which the processes' limiters share
//!   (`rate_limit/shared.rs`; zero while the buffer has no limit).
//! - **slots**: from a page boundary on, `slot_words` each (see `storage/mod.rs`).
//! - **trees** and **lanes**: the prioritized and slice samplers' blocks, each section
//!   starting on a cache line, so that a section copied from one region to another
//!   (a checkpoint loaded into a buffer on another backing) keeps its inner layout.
//!
//! Under loom the header and blocks shrink to a word a field: every region word is a
//! model-checked atomic there, and lines mean nothing.
//!
//! Layer: algos.

use crate::sync::{AtomicU64, Ordering};

/// Words of a cache line, or 1 under loom.
const LINE: usize = if cfg!(replaybuf_loom) { 1 } else { 8 };
/// Slots start on a page (4 KiB) boundary.
const SLOTS_ALIGN_WORDS: usize = if cfg!(replaybuf_loom) { 1 } else { 512 };

/// `b"RPLYBUF\0"`: the first word of every region.
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"RPLYBUF\0");
/// The version of this layout; a region of another version is refused. 2: tree leaves
/// and raw priority words carry the row's whole 32-bit lap, and masses follow a scale
/// (`Global::MassScale`). 3: appenders store leaves plainly when no other leaf changer
/// is counted (`ShardWord::LeafTurn`, `ShardWord::LeafChangers`), or none but an
/// updater that marked its leaves elsewhere (`ShardWord::MarksSet`, and the marks
/// after each tree). 4: four sets of marks after each tree, for as many marking
/// updaters at once, each with a bit of `LeafChangers` and of `MarksSet`. 5: the min
/// and max trees start at level 2, each entry there over `ARITY * ARITY` leaves, and
/// their level-1 words are left unused (`sumtree/tree.rs`, "Min and max trees").
pub(crate) const FORMAT_VERSION: u64 = 5;

/// Header words of a region.
pub(crate) const HEADER_WORDS: usize = 16;

/// The header's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Header {
    /// [`MAGIC`].
    Magic = 0,
    /// [`FORMAT_VERSION`].
    Version = 1,
    /// A hash of everything that decides the region's layout (see `config.rs`).
    LayoutHash = 2,
    /// [`READY`] once the creator has laid out every word; zero before.
    State = 3,
    /// Words in the region.
    Words = 4,
    /// Bytes of the meta JSON.
    MetaBytes = 5,
    /// Pid of the process that created the region.
    CreatorPid = 6,
    /// Where the process table starts, in words (shared regions).
    ProcsAt = 7,
    /// Entries of the process table.
    Procs = 8,
    /// Non-zero while a checkpoint is copied into the region (`restore` of a
    /// file-backed or shared buffer): a region whose restore never finished holds
    /// rows part old, part new, and is refused when opened again (zero in regions
    /// made before it).
    Restoring = 9,
}

/// [`Header::State`] of a region whose creator finished laying it out.
pub(crate) const READY: u64 = u64::from_le_bytes(*b"READY\0\0\0");

/// Words of one shard block: two cache lines, or its fourteen words under loom.
pub(crate) const SHARD_WORDS: usize = if cfg!(replaybuf_loom) { 14 } else { 2 * LINE };

/// A shard block's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum ShardWord {
    /// Sequence numbers claimed so far.
    Cursor = 0,
    /// Rows below it were emptied.
    Floor = 1,
    /// Appenders and editors inside (see `shard.rs`).
    Occupancy = 2,
    /// Rows claimed below it by a writer that died may be left half written; the next
    /// lap's writer takes their slots over (`storage/recover.rs`).
    Abandoned = 3,
    /// Shared mode: the process holding the shard's writer lease (a `Holder`, 0:
    /// none). Only that process appends to the shard.
    Lease = 4,
    /// Shared mode: the process whose freeze holds the shard (0: none or unknown).
    Freezer = 5,
    /// Shared mode: the process whose editors (`write_all`, max-value rewrites) are in
    /// the shard (a `Holder`, 0: none). One process edits a shard at a time, so the
    /// editor units of the occupancy word are all its own.
    Editor = 6,
    /// A frames buffer's rows below it left when their side slot was taken over
    /// (`frames.rs`); unlike the floor, they still count as written.
    Evicted = 7,
    /// A FIFO sampler's rows taken so far, counted as `seq * width + lane`: the next
    /// learner takes the shard's rows from here (`sampler/fifo.rs`). Zero in a region
    /// that never had one; rows below the window are skipped.
    Popped = 8,
    /// The rows `StreamLo..StreamHi` are being written by a streaming append
    /// (`storage/mod.rs`, `stream_rows`), whose stores are ordered by the two words
    /// rather than by each slot's stamp; empty (the two equal) when none is. Zero in a
    /// region that never had one.
    StreamLo = 9,
    /// See [`ShardWord::StreamLo`].
    StreamHi = 10,
    /// A prioritized buffer: the ring positions whose new rows' leaves one appender
    /// may set with plain stores (`shard.rs`, "Leaf turns"); zero when no appender
    /// holds the turn. Zero in a region that never had one.
    LeafTurn = 11,
    /// A prioritized buffer: who is changing the shard's tree leaves now: appenders
    /// from before their rows are published until their leaves are set (high 32
    /// bits), the updaters whose leaves are marked (bit `30 - s` for set `s` of the
    /// marks, bits 27 to 30), and other priority updates, re-masses and clears (low 27
    /// bits; see `sumtree/tree.rs`). Zero in a region that never had one.
    LeafChangers = 12,
    /// A prioritized buffer: bit `30 - s` is set while the marks of the updater
    /// holding set `s` (counted by the same bit of `LeafChangers`) are set in the
    /// shard's tree block (see `sumtree/tree.rs`, "Marked updates").
    MarksSet = 13,
}

/// The globals' words: each contended one on its own line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub(crate) enum Global {
    /// Samples drawn through `ReplayBuffer::sample`: each gets a random stream.
    Calls,
    /// Round-robin shard choice of buffer-level extends.
    NextShard,
    /// Writer handles handed out.
    Writers,
    /// Learner handles handed out.
    Learners,
    /// Prioritized sampling: alpha, as `f64` bits.
    Alpha,
    /// Prioritized sampling: beta, as `f64` bits.
    Beta,
    /// Prioritized sampling: the largest priority seen, as `f64` bits.
    MaxSeen,
    /// Prioritized sampling: the scale of the trees' masses and the epoch of the mass
    /// function (`sampler/mass_scale.rs`). Read with `Alpha`, beside it.
    MassScale,
}

impl Global {
    const ALL: [Global; 8] = [
        Global::Calls,
        Global::NextShard,
        Global::Writers,
        Global::Learners,
        Global::Alpha,
        Global::Beta,
        Global::MaxSeen,
        Global::MassScale,
    ];

    /// The word's offset in the globals block: (cache line, word in it), or just its
    /// place in the list under loom.
    pub(crate) fn offset(self) -> usize {
        if cfg!(replaybuf_loom) {
            return self as usize;
        }
        let (line, word) = match self {
            Global::Calls => (0, 0),
            Global::NextShard => (1, 0),
            Global::Writers => (2, 0),
            Global::Learners => (2, 1),
            Global::Alpha => (3, 0),
            Global::Beta => (3, 1),
            Global::MassScale => (3, 2),
            Global::MaxSeen => (4, 0),
        };
        line * LINE + word
    }
}

/// Words of the globals block.
const GLOBAL_WORDS: usize = if cfg!(replaybuf_loom) {
    Global::ALL.len()
} else {
    5 * LINE
};

/// Words of one process-table entry (shared mode).
pub(crate) const PROC_WORDS: usize = LINE;

/// Words of a shared region's rate-limit block, after its process table: four lines
/// of eight words, which `rate_limit/shared.rs` lays out (eight a line under loom
/// too, where its model runs over a heap region of its own).
pub(crate) const LIMITER_WORDS: usize = 32;

/// Where each part of a storage's region lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RegionLayout {
    pub(crate) meta_at: usize,
    pub(crate) meta_bytes: usize,
    shards_at: usize,
    shards: usize,
    globals_at: usize,
    pub(crate) procs_at: usize,
    pub(crate) procs: usize,
    /// A shared region's rate-limit block (one with a process table has one, used or
    /// not); `None` elsewhere.
    pub(crate) limiter_at: Option<usize>,
    pub(crate) slots_at: usize,
    pub(crate) slot_words: usize,
    pub(crate) capacity: usize,
    /// Where the tree blocks begin (their own layouts place each shard's).
    pub(crate) trees_at: usize,
    /// Where the lane blocks begin.
    pub(crate) lanes_at: usize,
    pub(crate) words: usize,
}

/// The sections of a region that a checkpoint stores, in region order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Section {
    /// Shard blocks and globals.
    Control,
    /// Every slot: stamps, headers and rows.
    Slots,
    /// Tree blocks.
    Trees,
    /// Lane blocks.
    Lanes,
}

impl RegionLayout {
    /// The layout of a region with `meta_bytes` of meta, `shards` shards, `procs`
    /// process-table entries and `capacity` slots of `slot_words` words; the trees
    /// and lanes take the words their own layouts ask for: `trees` is given where the
    /// slots and the trees start, `lanes` where the lanes start, and each returns the
    /// words it takes. `None` if the region would not fit the address space.
    pub(crate) fn new(
        meta_bytes: usize,
        shards: usize,
        procs: usize,
        capacity: usize,
        slot_words: usize,
        trees: impl FnOnce(usize, usize) -> Option<usize>,
        lanes: impl FnOnce(usize) -> Option<usize>,
    ) -> Option<RegionLayout> {
        let meta_at = HEADER_WORDS;
        let shards_at = align(meta_at + meta_bytes.div_ceil(8), LINE)?;
        let globals_at = shards_at.checked_add(shards.checked_mul(SHARD_WORDS)?)?;
        let procs_at = globals_at + GLOBAL_WORDS;
        let procs_end = procs_at.checked_add(procs.checked_mul(PROC_WORDS)?)?;
        let limiter_at = (procs > 0).then_some(procs_end);
        let limiter_words = if procs > 0 { LIMITER_WORDS } else { 0 };
        let slots_at = align(procs_end.checked_add(limiter_words)?, SLOTS_ALIGN_WORDS)?;
        let slots_end = slots_at.checked_add(capacity.checked_mul(slot_words)?)?;
        let trees_at = align(slots_end, LINE)?;
        let lanes_at = align(trees_at.checked_add(trees(slots_at, trees_at)?)?, LINE)?;
        let words = lanes_at.checked_add(lanes(lanes_at)?)?;
        // The region is addressed in bytes too.
        words.checked_mul(8).filter(|&b| b <= isize::MAX as usize)?;
        Some(RegionLayout {
            meta_at,
            meta_bytes,
            shards_at,
            shards,
            globals_at,
            procs_at,
            procs,
            limiter_at,
            slots_at,
            slot_words,
            capacity,
            trees_at,
            lanes_at,
            words,
        })
    }

    /// The word of `w` in shard `k`'s block.
    #[inline]
    pub(crate) fn shard_word(&self, k: usize, w: ShardWord) -> usize {
        debug_assert!(k < self.shards);
        self.shards_at + k * SHARD_WORDS + w as usize
    }

    /// The word of global `g`.
    #[inline]
    pub(crate) fn global(&self, g: Global) -> usize {
        self.globals_at + g.offset()
    }

    /// The words of section `s`.
    pub(crate) fn section(&self, s: Section) -> std::ops::Range<usize> {
        match s {
            Section::Control => self.shards_at..self.procs_at,
            Section::Slots => self.slots_at..self.slots_at + self.capacity * self.slot_words,
            Section::Trees => self.trees_at..self.lanes_at,
            Section::Lanes => self.lanes_at..self.words,
        }
    }
}

/// `x` rounded up to a multiple of `to`.
fn align(x: usize, to: usize) -> Option<usize> {
    Some(x.checked_add(to - 1)? / to * to)
}

/// Reads header word `h` of a region.
pub(crate) fn header(words: &[AtomicU64], h: Header) -> u64 {
    words[h as usize].load(Ordering::Acquire)
}

/// Writes a new region's header and meta, then marks it ready: the last store, with
/// Release, so that a process that sees `READY` (Acquire) sees every word before it.
pub(crate) fn write_header(
    words: &[AtomicU64],
    layout: &RegionLayout,
    layout_hash: u64,
    meta: &[u8],
) {
    assert!(
        meta.len() <= layout.meta_bytes,
        "replaybuf internal error: meta larger than its section"
    );
    let set = |h: Header, v: u64| words[h as usize].store(v, Ordering::Relaxed);
    set(Header::Magic, MAGIC);
    set(Header::Version, FORMAT_VERSION);
    set(Header::LayoutHash, layout_hash);
    set(Header::Words, layout.words as u64);
    set(Header::MetaBytes, meta.len() as u64);
    set(Header::CreatorPid, u64::from(std::process::id()));
    set(Header::ProcsAt, layout.procs_at as u64);
    set(Header::Procs, layout.procs as u64);
    crate::storage::atomic_copy::store(words, layout.meta_at * 8, meta);
    // SYNC POINT: pairs with the Acquire load of `State` in `read_header`.
    words[Header::State as usize].store(READY, Ordering::Release);
}

/// What a region's header says, read by a process about to use it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(replaybuf_loom, allow(dead_code))] // read only from files
pub(crate) struct HeaderInfo {
    /// A restore into the region began and never finished ([`Header::Restoring`]).
    pub(crate) restoring: bool,
    pub(crate) layout_hash: u64,
    pub(crate) words: u64,
    pub(crate) creator_pid: u64,
    /// The process table: first word and entries.
    pub(crate) procs: (u64, u64),
    /// The meta JSON.
    pub(crate) meta: Vec<u8>,
}

/// Why a region's header was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(replaybuf_loom, allow(dead_code))] // read only from files
pub(crate) enum HeaderProblem {
    /// Too short to hold a header.
    TooShort { words: usize },
    /// Not a replaybuf region.
    Magic { found: u64 },
    /// Another format version.
    Version { found: u64 },
    /// Its creator has not finished laying it out (or died doing so).
    NotReady,
    /// Its header names a size other than the region's, or meta past its end.
    Size { header: u64, region: usize },
}

impl std::fmt::Display for HeaderProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderProblem::TooShort { words } => {
                write!(f, "{} bytes is too short for a replaybuf header", words * 8)
            }
            HeaderProblem::Magic { found } => write!(
                f,
                "not a replaybuf region (magic {found:#018x}, expected {MAGIC:#018x})"
            ),
            HeaderProblem::Version { found } => write!(
                f,
                "format version {found}, but this build reads version {FORMAT_VERSION}"
            ),
            HeaderProblem::NotReady => f.write_str(
                "its creator has not finished initialising it (still starting, or died \
                 while creating it)",
            ),
            HeaderProblem::Size { header, region } => write!(
                f,
                "its header says {header} words but the region holds {region}"
            ),
        }
    }
}

/// Reads and checks a region's header.
#[cfg_attr(replaybuf_loom, allow(dead_code))] // read only from files
pub(crate) fn read_header(words: &[AtomicU64]) -> Result<HeaderInfo, HeaderProblem> {
    if words.len() < HEADER_WORDS {
        return Err(HeaderProblem::TooShort { words: words.len() });
    }
    let magic = header(words, Header::Magic);
    if magic != MAGIC {
        return Err(HeaderProblem::Magic { found: magic });
    }
    let version = header(words, Header::Version);
    if version != FORMAT_VERSION {
        return Err(HeaderProblem::Version { found: version });
    }
    // SYNC POINT: pairs with the Release store of `State` in `write_header`.
    if header(words, Header::State) != READY {
        return Err(HeaderProblem::NotReady);
    }
    let total = header(words, Header::Words);
    let meta_bytes = header(words, Header::MetaBytes);
    let meta_end = (HEADER_WORDS as u64 * 8).checked_add(meta_bytes);
    if total != words.len() as u64 || meta_end.is_none_or(|e| e > total * 8) {
        return Err(HeaderProblem::Size {
            header: total,
            region: words.len(),
        });
    }
    let mut meta = vec![0; meta_bytes as usize];
    crate::storage::atomic_copy::load(words, HEADER_WORDS * 8, &mut meta);
    Ok(HeaderInfo {
        restoring: header(words, Header::Restoring) != 0,
        layout_hash: header(words, Header::LayoutHash),
        words: total,
        creator_pid: header(words, Header::CreatorPid),
        procs: (header(words, Header::ProcsAt), header(words, Header::Procs)),
        meta,
    })
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    #[test]
    fn sections_start_where_they_should_and_do_not_overlap() {
        let l = RegionLayout::new(100, 4, 2, 1000, 22, |_, _| Some(333), |_| Some(77)).unwrap();
        assert_eq!(l.meta_at, HEADER_WORDS);
        assert!(l.shards_at >= l.meta_at + 13 && l.shards_at.is_multiple_of(LINE));
        assert_eq!(l.slots_at % SLOTS_ALIGN_WORDS, 0);
        assert!(l.slots_at >= l.procs_at + 2 * PROC_WORDS);
        assert_eq!(l.trees_at % LINE, 0);
        assert_eq!(l.lanes_at % LINE, 0);
        assert!(l.lanes_at >= l.trees_at + 333);
        assert_eq!(l.words, l.lanes_at + 77);
        let words: Vec<usize> = (0..4)
            .flat_map(|k| {
                [ShardWord::Cursor, ShardWord::Floor, ShardWord::Occupancy]
                    .map(|w| l.shard_word(k, w))
            })
            .collect();
        let mut sorted = words.clone();
        sorted.dedup();
        assert_eq!(words, sorted);
        let globals: std::collections::BTreeSet<usize> =
            Global::ALL.iter().map(|&g| l.global(g)).collect();
        assert_eq!(globals.len(), Global::ALL.len(), "two globals share a word");
        assert!(globals.iter().all(|&w| w >= l.globals_at && w < l.procs_at));
        assert!(
            RegionLayout::new(0, 1, 0, usize::MAX / 4, 8, |_, _| Some(0), |_| Some(0)).is_none()
        );
    }

    #[test]
    fn a_written_header_reads_back_and_damage_is_named() {
        let meta = br#"{"hello":"world"}"#;
        let l = RegionLayout::new(meta.len(), 1, 0, 4, 2, |_, _| Some(0), |_| Some(0)).unwrap();
        let words: Vec<AtomicU64> = (0..l.words).map(|_| AtomicU64::new(0)).collect();
        assert_eq!(read_header(&words), Err(HeaderProblem::Magic { found: 0 }));
        write_header(&words, &l, 0xabc, meta);
        let info = read_header(&words).unwrap();
        assert_eq!(info.layout_hash, 0xabc);
        assert_eq!(info.meta, meta);
        assert_eq!(info.words, l.words as u64);
        assert!(read_header(&words[..l.words - 1]).is_err());
        words[Header::Version as usize].store(99, Ordering::Relaxed);
        assert_eq!(
            read_header(&words),
            Err(HeaderProblem::Version { found: 99 })
        );
        words[Header::Version as usize].store(FORMAT_VERSION, Ordering::Relaxed);
        words[Header::State as usize].store(0, Ordering::Relaxed);
        assert_eq!(read_header(&words), Err(HeaderProblem::NotReady));
        words[Header::State as usize].store(READY, Ordering::Relaxed);
        words[Header::MetaBytes as usize].store(u64::MAX, Ordering::Relaxed);
        assert!(matches!(
            read_header(&words),
            Err(HeaderProblem::Size { .. })
        ));
    }
}
