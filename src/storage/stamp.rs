//! Per-slot version stamps: how a reader copies a row while writers overwrite rows,
//! and never returns a torn one.
//!
//! Every slot carries one `AtomicU64` stamp beside its row. Three kinds of thread
//! touch a slot:
//!
//! - an **appender** writes the row of ring sequence number `seq` (lap `seq / steps`);
//! - an **editor** rewrites a stored row in place (`write_all`), keeping its lap;
//! - a **reader** copies the row out.
//!
//! # Appenders wait for their predecessor, so plain stores suffice
//!
//! The appender of lap `L` on a slot begins only when the stamp shows the slot's
//! previous row, lap `L - 1` (or `EMPTY` for the first lap), published. Exactly one
//! appender has that predecessor, so in a shard without editors two appenders are never
//! inside one slot at once, and marking the slot needs no read-modify-write: a plain
//! store. That matters: a `lock cmpxchg` per row drains the store buffer and
//! serialises the row writes of an `extend` behind each other's cache misses.
//!
//! A shard with an editor inside (see `shard.rs`, which keeps the two kinds apart)
//! switches appenders to a compare-exchange, and editors always use one, so that an
//! editor and an appender can never both believe they hold a slot.
//!
//! # Memory ordering
//!
//! The writer side (appender or editor) of one row:
//!
//! ```text
//! W0  s = stamp.load(Acquire)              sees the predecessor published (W3 of the
//!                                          previous row), so its data stores happen
//!                                          before ours: no late old byte lands on the
//!                                          new row
//! W1  stamp.store(writing, Relaxed)        (or a CAS, for editors and shared shards)
//! W2  fence(Release)
//!     row data stores (atomic_copy::store)
//! W3  stamp.store(published, Release)      SYNC POINT: pairs with R1
//! ```
//!
//! The reader side:
//!
//! ```text
//! R1  s1 = stamp.load(Acquire)             SYNC POINT: pairs with W3; must be published
//!     row data loads (atomic_copy::load)
//! R2  fence(Acquire)                       SYNC POINT: pairs with W2
//! R3  s2 = stamp.load(Relaxed)             the copy is whole iff s2 == s1
//! ```
//!
//! If R1 reads W3 of row `x`, every store of `x` happens before the loads, so the copy
//! holds all of `x`, unless a later writer `y` overwrote part of it meanwhile. If any
//! load read a store of `y`, then `y`'s W2 synchronises with R2 (fence-to-fence through
//! that load), so `y`'s W1 happens before R3 and R3 reads W1 of `y` or something later
//! in the stamp's modification order. That is never `s1`: stamps only move forward
//! (laps grow; an edit bumps the edit count; both wrap only after 2^32 laps or 2^30
//! edits of one slot, which a reader would have to sleep through inside one row copy).
//! So `s2 != s1` and the copy is discarded. A torn row is never returned.
//!
//! A streaming append (`Storage::stream_rows`, `docs/orderings.rs` §6) writes slots
//! without W1, stamps and bytes in any order; readers and the next lap's appenders
//! then also consult the shard's stream words ([`begin_append_after`]).
//!
//! The argument is checked by loom under `loom-tests/` (every interleaving of a writer
//! lapping a reader on a 4-slot ring), and on hardware by the stress test in
//! `tests/stress.rs`, whose rows are self-checking.
//!
//! Layer: algos.

use std::cmp::Ordering as Cmp;

use crate::sync::{fence, AtomicU64, Backoff, Ordering};

/// One slot's version stamp.
///
/// Bit layout (an empty slot is all zeroes):
///
/// ```text
///  63            32 31                2   1         0
/// +----------------+-------------------+---------+---------+
/// |  lap (32 bits) | edit (30 bits)    | WRITTEN | WRITING |
/// +----------------+-------------------+---------+---------+
/// ```
///
/// - `WRITING`: a writer holds the slot; its row may be half written.
/// - `WRITTEN`: the slot has held (or is receiving) a row.
/// - `edit`: in-place rewrites of this lap's row, wrapping past 0: an appender marks
///   its slot with edit 0 and an editor with 1 or more, so a slot marked as being
///   written says which kind of writer holds it.
/// - neither bit, with a lap or edit: a *dropped* row, whose editor died halfway
///   through rewriting it (shared mode, `Storage::recover_editor`). No reader takes it
///   and no editor rewrites it; the next lap's appender takes its slot over as it
///   would a published row of that lap.
/// - `lap`: `seq / steps` of the row, wrapping; compared with `lap_cmp`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Stamp(u64);

const WRITING: u64 = 1;
const WRITTEN: u64 = 2;
const EDIT_SHIFT: u32 = 2;
const EDIT_BITS: u32 = 30;
const LAP_SHIFT: u32 = 32;
const EDIT_MASK: u32 = (1 << EDIT_BITS) - 1;

impl Stamp {
    /// A slot that never held a row.
    pub const EMPTY: Stamp = Stamp(0);

    fn new(lap: u32, edit: u32, writing: bool) -> Stamp {
        let edit = u64::from(edit) & ((1 << EDIT_BITS) - 1);
        Stamp(
            (u64::from(lap) << LAP_SHIFT)
                | (edit << EDIT_SHIFT)
                | WRITTEN
                | if writing { WRITING } else { 0 },
        )
    }

    /// A published row of `lap`, edited `edit` times.
    pub fn published(lap: u32, edit: u32) -> Stamp {
        Stamp::new(lap, edit, false)
    }

    /// A row of `lap` being written (its `edit`-th version).
    pub fn writing(lap: u32, edit: u32) -> Stamp {
        Stamp::new(lap, edit, true)
    }

    /// The stamp's word.
    pub(crate) fn to_bits(self) -> u64 {
        self.0
    }

    /// The stamp whose word is `bits`.
    pub(crate) fn from_bits(bits: u64) -> Stamp {
        Stamp(bits)
    }

    /// The row's lap (wrapping).
    pub fn lap(self) -> u32 {
        (self.0 >> LAP_SHIFT) as u32
    }

    /// In-place rewrites of the row in its lap (wrapping).
    pub fn edit(self) -> u32 {
        ((self.0 >> EDIT_SHIFT) & ((1 << EDIT_BITS) - 1)) as u32
    }

    /// A writer holds the slot.
    pub fn is_writing(self) -> bool {
        self.0 & WRITING != 0
    }

    /// The row of `lap`, edited `edit` times, dropped half rewritten by an editor
    /// that died.
    pub fn dropped(lap: u32, edit: u32) -> Stamp {
        Stamp(Stamp::new(lap, edit, false).0 & !WRITTEN)
    }

    /// A dropped row (see [`Stamp::dropped`]).
    pub fn is_dropped(self) -> bool {
        self.0 & (WRITTEN | WRITING) == 0 && self != Stamp::EMPTY
    }

    /// Marked as being rewritten in place by an editor (not by an appender).
    pub fn is_being_edited(self) -> bool {
        self.is_writing() && self.edit() != 0
    }

    /// The slot has held, or is receiving, a row.
    pub fn is_written(self) -> bool {
        self.0 & WRITTEN != 0
    }

    /// Holds a whole row that readers may copy.
    pub fn is_published(self) -> bool {
        self.0 & (WRITTEN | WRITING) == WRITTEN
    }

    /// The row's write generation: lap and edit count, without the state bits.
    pub fn generation(self) -> u64 {
        self.0 >> EDIT_SHIFT
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == Stamp::EMPTY {
            return f.write_str("Stamp(empty)");
        }
        write!(
            f,
            "Stamp(lap {}, edit {}{})",
            self.lap(),
            self.edit(),
            if self.is_writing() { ", writing" } else { "" }
        )
    }
}

/// Compares two wrapping laps: `Less` if `a` is older than `b`.
pub fn lap_cmp(a: u32, b: u32) -> Cmp {
    (a.wrapping_sub(b) as i32).cmp(&0)
}

/// Orders two generations ([`Stamp::generation`]) by age: lap first, then edit count,
/// both wrapping.
pub fn generation_cmp(a: u64, b: u64) -> Cmp {
    let lap = |g: u64| (g >> (LAP_SHIFT - EDIT_SHIFT)) as u32;
    match lap_cmp(lap(a), lap(b)) {
        Cmp::Equal => {
            // The edit counts' difference, as a signed 30-bit number.
            let d = a.wrapping_sub(b) & ((1 << EDIT_BITS) - 1);
            match d {
                0 => Cmp::Equal,
                d if d < 1 << (EDIT_BITS - 1) => Cmp::Greater,
                _ => Cmp::Less,
            }
        }
        other => other,
    }
}

/// What the slot must hold before an appender may overwrite it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prev {
    /// Nothing: this is the slot's first row.
    Empty,
    /// The published row of this lap (any edit count), or that row dropped by an
    /// editor that died.
    Lap(u32),
    /// Whatever the slot holds, once no editor is inside it: its previous appender
    /// died, perhaps halfway through the row (see `storage/recover.rs`), and no other
    /// appender can be inside it. An editor can: the abandoned mark covers every row
    /// claimed before the takeover, published ones included, and editors rewrite
    /// those. Taking its slot would let both write the row, and its late `publish`
    /// would move the stamp back a lap over a torn row. Wait for it to publish (or,
    /// if it died, for its row to be dropped).
    Abandoned,
}

impl Prev {
    fn found_in(self, s: Stamp) -> bool {
        match self {
            Prev::Empty => s == Stamp::EMPTY,
            Prev::Lap(lap) => (s.is_published() || s.is_dropped()) && s.lap() == lap,
            Prev::Abandoned => !s.is_being_edited(),
        }
    }
}

/// How an appender marks a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// A plain store: no editor can be in this shard (see `shard.rs`).
    Plain,
    /// A compare-exchange: an editor may be racing for the slot.
    Exchange,
}

/// W0-W2 for an appender: waits until the slot holds `prev`, then marks it as being
/// written with `lap`. The row's data stores may follow; end with [`publish`].
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
#[inline]
pub fn begin_append(stamp: &AtomicU64, prev: Prev, lap: u32, claim: Claim) {
    begin_append_or(stamp, prev, lap, claim, || {});
}

/// [`begin_append`], calling `stalled` every [`STALLED_WAITS`] waits: the slot's
/// previous writer may be an editor whose process died, which `stalled` can look for
/// and repair (shared mode).
#[inline]
pub fn begin_append_or(
    stamp: &AtomicU64,
    prev: Prev,
    lap: u32,
    claim: Claim,
    stalled: impl FnMut(),
) {
    begin_append_after(stamp, prev, lap, claim, || false, stalled);
}

/// [`begin_append_or`], also waiting while `streaming()`: the predecessor is a row of
/// a streaming append still in flight (`Storage::stream_rows`), whose stamp may show
/// it published before all of its bytes have landed. Called after W0 finds the
/// predecessor, so that a stamp a stream stored brings the stream's words with it
/// (`docs/orderings.rs` §6).
#[inline]
pub fn begin_append_after(
    stamp: &AtomicU64,
    prev: Prev,
    lap: u32,
    claim: Claim,
    streaming: impl Fn() -> bool,
    mut stalled: impl FnMut(),
) {
    let mark = Stamp::writing(lap, 0);
    let mut backoff = Backoff::new();
    let mut waits = 0u32;
    loop {
        // W0. Acquire: the predecessor's row stores happen before ours.
        let cur = Stamp(stamp.load(Ordering::Acquire));
        if prev.found_in(cur) && !streaming() {
            match claim {
                Claim::Plain => {
                    // W1. Only this appender can have `prev` as predecessor, and no
                    // editor is in the shard: nobody else can move the stamp now.
                    stamp.store(mark.0, Ordering::Relaxed);
                    break;
                }
                Claim::Exchange => {
                    if stamp
                        .compare_exchange(cur.0, mark.0, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                    continue;
                }
            }
        }
        debug_assert!(
            !(cur.is_written() && lap_cmp(cur.lap(), lap) != Cmp::Less),
            "replaybuf internal error: slot holds {cur:?} before lap {lap} was written"
        );
        // The predecessor's writer (or an editor) is still inside the slot.
        backoff.snooze();
        waits = waits.wrapping_add(1);
        if waits.is_multiple_of(STALLED_WAITS) {
            stalled();
        }
    }
    // W2. SYNC POINT: pairs with the reader's R2; orders W1 before the data stores.
    fence(Ordering::Release);
}

/// Waits on one slot after which a writer asks whether the slot's holder died.
pub const STALLED_WAITS: u32 = if cfg!(replaybuf_loom) { 4 } else { 1 << 12 };

/// W0-W2 for an editor: marks the published row of the slot as being rewritten, and
/// returns the stamp to [`publish`] afterwards. `None` if the slot holds no row.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn begin_edit(stamp: &AtomicU64) -> Option<Stamp> {
    begin_edit_or(stamp, None, || false)
}

/// [`begin_edit`] of the row of lap `lap` only (`None` if the slot holds another
/// lap's: a writer that lapped the ring put a newer row there), calling `gone` every
/// [`STALLED_WAITS`] waits for the slot's writer: `true` if that writer died and its
/// row is not to be had (shared mode), which ends the wait with `None`.
pub fn begin_edit_or(
    stamp: &AtomicU64,
    lap: Option<u32>,
    mut gone: impl FnMut() -> bool,
) -> Option<Stamp> {
    let mut backoff = Backoff::new();
    let mut waits = 0u32;
    loop {
        let cur = Stamp(stamp.load(Ordering::Acquire));
        if !cur.is_written() || lap.is_some_and(|lap| cur.lap() != lap) {
            return None;
        }
        if cur.is_writing() {
            backoff.snooze();
            waits = waits.wrapping_add(1);
            if waits.is_multiple_of(STALLED_WAITS) && gone() {
                return None;
            }
            continue;
        }
        // Edit counts wrap past 0, which marks appenders (see `Stamp`).
        let edit = match cur.edit().wrapping_add(1) & EDIT_MASK {
            0 => 1,
            e => e,
        };
        let mark = Stamp::writing(cur.lap(), edit);
        if stamp
            .compare_exchange(cur.0, mark.0, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // W2. SYNC POINT: pairs with the reader's R2.
            fence(Ordering::Release);
            return Some(Stamp::published(mark.lap(), mark.edit()));
        }
    }
}

/// W3: publishes the row.
#[inline]
pub fn publish(stamp: &AtomicU64, published: Stamp) {
    debug_assert!(published.is_published());
    // SYNC POINT: pairs with the reader's R1 and with the next writer's W0.
    stamp.store(published.0, Ordering::Release);
}

/// R1: the stamp a reader starts from. Copy only if it is published (and the lap the
/// caller wants), then call [`validate`].
#[inline]
pub fn begin_read(stamp: &AtomicU64) -> Stamp {
    // SYNC POINT: pairs with W3.
    Stamp(stamp.load(Ordering::Acquire))
}

/// R2-R3: whether the bytes copied since [`begin_read`] returned `seen` are one whole row.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
#[inline]
pub fn validate(stamp: &AtomicU64, seen: Stamp) -> bool {
    copied();
    still(stamp, seen)
}

/// R2 alone: a reader of several rows that copies them all before checking any
/// takes it once after the copies, then [`still`] for each row.
#[inline]
pub fn copied() {
    // SYNC POINT: pairs with W2 of any writer whose data the copies observed.
    fence(Ordering::Acquire);
}

/// R3 alone, after [`copied`]: whether the stamp still holds `seen`.
#[inline]
pub fn still(stamp: &AtomicU64, seen: Stamp) -> bool {
    stamp.load(Ordering::Relaxed) == seen.0
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    #[test]
    fn stamp_fields_round_trip() {
        let s = Stamp::writing(u32::MAX, (1 << 30) - 1);
        assert_eq!(s.lap(), u32::MAX);
        assert_eq!(s.edit(), (1 << 30) - 1);
        assert!(s.is_writing() && s.is_written() && !s.is_published());
        let p = Stamp::published(7, 3);
        assert!(p.is_published());
        assert_eq!((p.lap(), p.edit()), (7, 3));
        assert_ne!(p, Stamp::published(7, 4));
        assert!(!Stamp::EMPTY.is_written());
    }

    #[test]
    fn laps_compare_across_the_wrap() {
        assert_eq!(lap_cmp(1, 2), Cmp::Less);
        assert_eq!(lap_cmp(u32::MAX, 0), Cmp::Less);
        assert_eq!(lap_cmp(0, u32::MAX), Cmp::Greater);
        assert_eq!(lap_cmp(5, 5), Cmp::Equal);
    }

    #[test]
    fn generations_compare_by_lap_then_edit_across_the_wrap() {
        let g = |lap, edit| Stamp::published(lap, edit).generation();
        assert_eq!(generation_cmp(g(3, 9), g(4, 0)), Cmp::Less);
        assert_eq!(generation_cmp(g(4, 1), g(4, 0)), Cmp::Greater);
        assert_eq!(
            generation_cmp(g(4, 0), g(4, (1 << EDIT_BITS) - 1)),
            Cmp::Greater
        );
        assert_eq!(generation_cmp(g(u32::MAX, 7), g(0, 0)), Cmp::Less);
        assert_eq!(generation_cmp(g(5, 5), g(5, 5)), Cmp::Equal);
    }

    #[test]
    fn append_edit_and_read_move_the_stamp_forward() {
        let stamp = AtomicU64::new(0);
        begin_append(&stamp, Prev::Empty, 0, Claim::Plain);
        assert!(begin_read(&stamp).is_writing());
        publish(&stamp, Stamp::published(0, 0));
        let seen = begin_read(&stamp);
        assert!(seen.is_published() && validate(&stamp, seen));

        let edited = begin_edit(&stamp).unwrap();
        assert!(
            !validate(&stamp, seen),
            "an edit must invalidate a read in flight"
        );
        publish(&stamp, edited);
        assert_eq!(begin_read(&stamp), Stamp::published(0, 1));

        begin_append(&stamp, Prev::Lap(0), 1, Claim::Exchange);
        publish(&stamp, Stamp::published(1, 0));
        assert_eq!(begin_read(&stamp).lap(), 1);
        assert!(begin_edit(&AtomicU64::new(0)).is_none());
    }

    #[test]
    fn an_appender_taking_over_an_abandoned_slot_waits_for_an_editor_inside() {
        let stamp = AtomicU64::new(Stamp::published(3, 0).0);
        let edited = begin_edit(&stamp).unwrap();
        let taken = crate::sync::AtomicBool::new(false);
        let (taken_early, held) = std::thread::scope(|s| {
            s.spawn(|| {
                begin_append(&stamp, Prev::Abandoned, 4, Claim::Exchange);
                taken.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            let seen = (taken.load(Ordering::SeqCst), begin_read(&stamp));
            // Published before asserting, so that a failure never leaves the appender
            // waiting.
            publish(&stamp, edited);
            seen
        });
        assert!(
            !taken_early,
            "the appender took the slot while the editor was inside"
        );
        assert_eq!(held, Stamp::writing(3, 1));
        assert_eq!(begin_read(&stamp), Stamp::writing(4, 0));
        // A dead appender's mark, a dropped row and a published one are taken at once.
        for held in [
            Stamp::writing(3, 0),
            Stamp::dropped(3, 1),
            Stamp::published(3, 2),
        ] {
            let stamp = AtomicU64::new(held.0);
            begin_append(&stamp, Prev::Abandoned, 4, Claim::Plain);
            assert_eq!(begin_read(&stamp), Stamp::writing(4, 0));
        }
    }

    #[test]
    fn edits_wrap_past_zero_and_a_dropped_row_is_taken_over_by_the_next_lap() {
        let stamp = AtomicU64::new(Stamp::published(3, EDIT_MASK).0);
        let edited = begin_edit(&stamp).unwrap();
        assert_eq!(edited.edit(), 1, "0 marks appenders");
        assert!(begin_read(&stamp).is_being_edited());
        let dropped = Stamp::dropped(3, 1);
        assert!(dropped.is_dropped() && !dropped.is_written() && !dropped.is_published());
        assert!(!Stamp::EMPTY.is_dropped() && !Stamp::published(3, 1).is_dropped());
        assert_eq!((dropped.lap(), dropped.edit()), (3, 1));
        stamp.store(dropped.0, Ordering::Relaxed);
        assert!(
            begin_edit(&stamp).is_none(),
            "a dropped row is not rewritten"
        );
        begin_append(&stamp, Prev::Lap(3), 4, Claim::Plain);
        assert_eq!(begin_read(&stamp), Stamp::writing(4, 0));
    }
}
