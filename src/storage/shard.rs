//! One shard: a ring of steps with its own atomic write cursor.
//!
//! Appenders claim ring sequence numbers with one `fetch_add` on the cursor, then write
//! their slots under the stamp protocol (`stamp.rs`). Writers bound to different shards
//! share no cache line; writers sharing a shard share only the cursor line.
//!
//! # Appenders and editors
//!
//! Appenders mark slots with a plain store, which is only sound while no editor (an
//! in-place rewrite, `write_all`) can race them for a slot. The `occupancy` word keeps
//! the two apart without a lock on the appenders' path:
//!
//! - an appender adds 1 to the plain count; if an editor was inside, it moves its unit
//!   to the exchange count and claims its slots by compare-exchange instead;
//! - an editor adds 1 to the editor count, then waits until the plain count is zero: plain
//!   appenders already inside finish their one `extend`, later ones see the editor.
//!
//! Both sides read-modify-write the same word, so its modification order decides who
//! came first: either the appender sees the editor, or the editor sees the appender.
//!
//! # Freezing
//!
//! A checkpoint needs the shard still: no row, cursor or lane changing while it is
//! copied. A freezer sets the word's `FROZEN` bit, then waits until nobody is inside:
//! plain appenders, editors, and the appenders that claim by compare-exchange (which
//! count themselves apart, since editors must not wait for them). An appender or
//! editor that finds the bit set takes its unit back and waits for the thaw. The same
//! modification-order argument applies: either a newcomer sees the bit, or the freezer
//! sees the newcomer and waits for it to leave.
//!
//! # Leaf turns
//!
//! A prioritized buffer's appender sets its new rows' leaves after publishing the
//! rows. One appender at a time may do so with plain stores (`sumtree/tree.rs`, "Plain
//! leaves"), if nobody else changes the shard's leaves meanwhile. Updaters are kept
//! out by the tree's count of leaf changers; an appender of a later lap over the same
//! positions, which may reach them while the first is still setting its leaves (a
//! small ring, or a first appender descheduled), is kept out by the turn:
//!
//! - right after its claim, before any of its rows is published, an appender takes the
//!   turn if nobody holds it: the shard's `LeafTurn` word names its positions
//!   ([`Shard::take_leaf_turn`]); it gives the turn back once its leaves are set;
//! - an appender without the turn waits, before setting its leaves, while the turn
//!   names any of its positions ([`Shard::await_leaf_turn`]). It published its rows
//!   after the rows they replaced were published, so it reads the turn their
//!   appender took before publishing them.
//!
//! The holder never waits for a turn, and waits for no appender that came after it,
//! so the wait ends when the holder has set its leaves; a holder of another process
//! that died is the lease holder of the shard, whose turn a recovery takes back with
//! its appenders' units ([`Shard::clear_appenders`]).
//!
//! # Memory ordering
//!
//! A reader learns whether a row is whole from its stamp, and, while a streaming
//! append writes the row or its next lap, from the shard's stream words
//! ([`Shard::stream`], `docs/orderings.rs` §6), never from the cursor. Claims are
//! AcqRel only so that an appender's check that it is alone in the shard sees every
//! appender that claimed before it. `floor` is stored with Release after reading the
//! cursor (`empty`), and loaded with Acquire before it (`window`), so a reader never
//! sees a floor above the cursor it then reads.
//!
//! Layer: algos.

use super::geometry::Ring;
use super::layout::ShardWord;
use super::stamp::Claim;
use crate::region::Block;
use crate::shared::procs::ProcTable;
use crate::sync::{AtomicU64, Backoff, Ordering};

/// Waits on a shard that does not drain between checks that its writer still lives.
pub(crate) const DEAD_WRITER_CHECK_WAITS: u32 = 4096;

/// The occupancy word (`ShardWord::Occupancy`):
///
/// ```text
///  63       62           48 47               32 31                 0
/// +--------+---------------+-------------------+-------------------+
/// | FROZEN | editors (15)  | exchange apps (16) | plain apps (32)   |
/// +--------+---------------+-------------------+-------------------+
/// ```
const PLAIN: u64 = 1;
const PLAIN_MASK: u64 = (1 << 32) - 1;
const EXCHANGE: u64 = 1 << 32;
const EDITOR: u64 = 1 << 48;
const EDITORS_MASK: u64 = ((1 << 15) - 1) << 48;
const FROZEN: u64 = 1 << 63;

/// A leaf turn word (`ShardWord::LeafTurn`): the first ring position of the holder's
/// rows in the low half, how many positions in the high half; zero when nobody holds
/// the turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LeafTurn(u64);

impl LeafTurn {
    /// The turn over the positions of an append claimed at `first`, `steps` steps long,
    /// on `ring`: none for a ring whose positions pass 32 bits.
    fn of(ring: &Ring, first: u64, steps: u64) -> Option<LeafTurn> {
        let pos = u32::try_from(ring.pos(first)).ok()?;
        let count = u32::try_from(steps.min(ring.steps)).ok()?;
        Some(LeafTurn(u64::from(pos) | u64::from(count) << 32))
    }

    /// Its positions: first, count (zero for no turn).
    fn positions(self) -> (u64, u64) {
        (self.0 & u64::from(u32::MAX), self.0 >> 32)
    }

    /// Whether this turn and `other` name a common position of a ring of `steps`.
    fn overlaps(self, other: LeafTurn, steps: u64) -> bool {
        let ((a, m), (b, n)) = (self.positions(), other.positions());
        // Each run is `count` positions on from its first, wrapping: one starts inside
        // the other.
        let after = |from: u64, to: u64| (to + steps - from) % steps;
        m > 0 && n > 0 && (after(a, b) < m || after(b, a) < n)
    }
}

/// The leaf turn of a shard, held until dropped: once the holder has set its rows'
/// leaves, or unwinds.
#[derive(Debug)]
#[must_use = "the turn is given back when the guard drops"]
pub(crate) struct TurnHeld<'a> {
    shard: &'a Shard,
}

impl Drop for TurnHeld<'_> {
    fn drop(&mut self) {
        self.shard.end_leaf_turn();
    }
}

/// The live part of a shard's ring: sequence numbers `lo..hi`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
}

impl Window {
    /// Steps in the window.
    pub(crate) fn steps(&self) -> u64 {
        self.hi - self.lo
    }

    /// The sequence number in the window at ring position `pos` of a ring of
    /// `ring_steps` steps: the latest claimed there, if it is live.
    pub(crate) fn seq_at(&self, pos: u64, ring_steps: u64) -> Option<u64> {
        self.positions(ring_steps).seq_at(pos)
    }

    /// The window's sequence numbers by ring position, with the one division done
    /// up front: for many lookups in one window.
    pub(crate) fn positions(&self, ring_steps: u64) -> Positions {
        let last = self.hi.checked_sub(1);
        Positions {
            last: last.unwrap_or(0),
            last_pos: last.map_or(0, |l| l % ring_steps),
            lo: if last.is_some() { self.lo } else { u64::MAX },
            steps: ring_steps,
        }
    }
}

/// A window's sequence numbers by ring position (see [`Window::positions`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Positions {
    last: u64,
    last_pos: u64,
    /// `u64::MAX` for an empty window.
    lo: u64,
    steps: u64,
}

impl Positions {
    /// The live sequence number at ring position `pos` (`pos < steps`), if any.
    #[inline]
    pub(crate) fn seq_at(&self, pos: u64) -> Option<u64> {
        // Steps back from the last claimed position to `pos`, without a division.
        let mut back = self.last_pos + self.steps - pos;
        if back >= self.steps {
            back -= self.steps;
        }
        let seq = self.last.checked_sub(back)?;
        (seq >= self.lo).then_some(seq)
    }
}

/// One step of an append: where step `j` of the claim goes, and which row must be in
/// its slots first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Step {
    /// Step of the caller's data.
    pub(crate) j: u64,
    pub(crate) seq: u64,
    pub(crate) pos: u64,
    pub(crate) lap: u32,
    /// The sequence number the slots must hold before this step overwrites them
    /// (`None`: the slots were never written).
    pub(crate) prev: Option<u64>,
}

/// The steps an append of `steps` steps claimed at `first` actually writes, in order.
/// An append longer than the ring writes only its last `ring.steps` steps: the earlier
/// ones would be overwritten by the same call. A slot's previous row is the last one
/// before the claim: go back whole laps until leaving it.
pub(crate) fn steps_of(ring: &Ring, first: u64, steps: u64) -> impl Iterator<Item = Step> {
    let ring = *ring;
    written(&ring, steps).map(move |j| step(&ring, first, j))
}

/// The same steps as [`steps_of`], in runs of consecutive positions (one lap each): the
/// first step of each run and the run's length.
pub(crate) fn runs_of(ring: &Ring, first: u64, steps: u64) -> impl Iterator<Item = (Step, u64)> {
    let ring = *ring;
    let mut j = written(&ring, steps).start;
    std::iter::from_fn(move || {
        (j < steps).then(|| {
            let start = step(&ring, first, j);
            let len = (steps - j).min(ring.steps - start.pos);
            j += len;
            (start, len)
        })
    })
}

/// The steps of an append of `steps` steps that are written: the last `ring.steps`.
fn written(ring: &Ring, steps: u64) -> std::ops::Range<u64> {
    steps.saturating_sub(ring.steps)..steps
}

/// Step `j` of an append claimed at `first`.
fn step(ring: &Ring, first: u64, j: u64) -> Step {
    let ring_steps = ring.steps;
    let seq = first + j;
    let back = (j / ring_steps + 1) * ring_steps;
    Step {
        j,
        seq,
        pos: seq % ring_steps,
        lap: (seq / ring_steps) as u32,
        prev: seq.checked_sub(back),
    }
}

/// One shard of a storage.
#[derive(Clone, Debug)]
pub(crate) struct Shard {
    /// The shard's block in the region (`layout::ShardWord`), of which:
    /// - `Cursor`: sequence numbers claimed so far: the next appender starts here.
    ///   Only grows.
    /// - `Floor`: rows with `seq < floor` were emptied. Only grows; never above the
    ///   cursor.
    /// - `Occupancy`: low 32 bits: plain appenders inside; high 32 bits: editors
    ///   inside.
    block: Block,
    ring: Ring,
    /// A shared region's process table, to tell a dead freezer from a slow one.
    procs: Option<ProcTable>,
}

impl Shard {
    /// The shard of `ring` whose words are `block` (a shard block of the region), and
    /// for a shared region, its process table.
    pub(crate) fn new(ring: Ring, block: Block, procs: Option<ProcTable>) -> Shard {
        Shard { block, ring, procs }
    }

    /// Word `w` of the shard's block.
    #[inline]
    pub(crate) fn word(&self, w: ShardWord) -> &AtomicU64 {
        self.block.word(w as usize)
    }

    #[inline]
    fn cursor(&self) -> &AtomicU64 {
        self.block.word(ShardWord::Cursor as usize)
    }

    #[inline]
    fn floor_word(&self) -> &AtomicU64 {
        self.block.word(ShardWord::Floor as usize)
    }

    /// Sequence numbers below it were claimed by writers that may have died (see
    /// `storage/recover.rs`).
    #[inline]
    pub(crate) fn abandoned(&self) -> &AtomicU64 {
        self.block.word(ShardWord::Abandoned as usize)
    }

    #[inline]
    pub(crate) fn occupancy(&self) -> &AtomicU64 {
        self.block.word(ShardWord::Occupancy as usize)
    }

    pub(crate) fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Claims `steps` sequence numbers; returns the first.
    ///
    /// AcqRel (free on x86, where every read-modify-write is a full barrier): an
    /// appender that claimed before this one entered the shard before its claim, so
    /// this appender's later [`Shard::alone`] sees it, inside or gone.
    #[inline]
    pub(crate) fn claim(&self, steps: u64) -> u64 {
        self.cursor().fetch_add(steps, Ordering::AcqRel)
    }

    /// The live window: the last `ring.steps` claimed sequence numbers at most, none
    /// below the floor.
    #[inline]
    pub(crate) fn window(&self) -> Window {
        let floor = self.floor_word().load(Ordering::Acquire);
        let evicted = self.evicted().load(Ordering::Acquire);
        let hi = self.cursor().load(Ordering::Relaxed);
        Window {
            // Never past the cursor, whatever the words say (a damaged region's
            // floor or eviction mark above it made a window of "negative" length).
            lo: floor
                .max(evicted)
                .max(hi.saturating_sub(self.ring.steps))
                .min(hi),
            hi,
        }
    }

    /// The live sequence number at ring position `pos`: the latest claimed one there,
    /// if it is in the window.
    pub(crate) fn seq_at(&self, pos: u64) -> Option<u64> {
        self.window().seq_at(pos, self.ring.steps)
    }

    /// Sequence numbers claimed since the last `empty` (or ever).
    pub(crate) fn written(&self) -> u64 {
        let w = self.window();
        w.hi - self.floor_word().load(Ordering::Acquire).min(w.hi)
    }

    /// Sequence numbers below this were emptied.
    #[inline]
    pub(crate) fn floor(&self) -> u64 {
        self.floor_word().load(Ordering::Acquire)
    }

    /// Puts a floor or eviction mark above the cursor (a damaged region) back at the
    /// cursor, so that windows stay ordered. For a region nobody else uses.
    pub(crate) fn sanitize(&self) {
        let hi = self.cursor().load(Ordering::Acquire);
        for word in [self.floor_word(), self.evicted()] {
            if word.load(Ordering::Acquire) > hi {
                word.store(hi, Ordering::Release);
            }
        }
        // So is a FIFO sampler's mark above the last row claimed.
        let rows = hi.saturating_mul(self.ring.width);
        if self.popped().load(Ordering::Acquire) > rows {
            self.popped().store(rows, Ordering::Release);
        }
    }

    /// Takes back the claims at and past `seq`, none of them published: the cursor
    /// goes back to `seq` (never below the rows that left the window), and a FIFO
    /// sampler's mark with it. For a recovery alone in the region
    /// (`storage/recover.rs`), which first makes the slots of those claims what the
    /// next claim of each expects.
    pub(crate) fn take_back_claims(&self, seq: u64) {
        let w = self.window();
        debug_assert!((w.lo..=w.hi).contains(&seq), "{seq} outside {w:?}");
        self.cursor()
            .store(seq.clamp(w.lo, w.hi), Ordering::Release);
        self.sanitize();
    }

    /// A FIFO sampler's rows taken so far (`ShardWord::Popped`, `sampler/fifo.rs`).
    #[inline]
    pub(crate) fn popped(&self) -> &AtomicU64 {
        self.block.word(ShardWord::Popped as usize)
    }

    /// Moves an unused shard's cursor, floor and abandoned mark to `seq`: an empty
    /// shard whose first append claims `seq` and takes its slots over whatever they
    /// hold (`Prev::Abandoned`). For a region nobody else uses yet.
    pub(crate) fn start_at(&self, seq: u64) {
        self.cursor().store(seq, Ordering::Relaxed);
        self.floor_word().store(seq, Ordering::Release);
        self.abandoned().store(seq, Ordering::Release);
    }

    /// Forgets every row claimed so far.
    #[inline]
    fn evicted(&self) -> &AtomicU64 {
        self.block.word(ShardWord::Evicted as usize)
    }

    /// The rows before `seq` leave the window (a frames buffer's rows whose side slot
    /// was taken over, `frames.rs`), as `empty` would take them out, but still count
    /// as written. Never past the cursor; ordered as the floor is.
    pub(crate) fn evict_below(&self, seq: u64) {
        let hi = self.cursor().load(Ordering::Acquire);
        self.evicted().fetch_max(seq.min(hi), Ordering::Release);
    }

    /// Rows below this left the window: emptied or evicted.
    #[inline]
    pub(crate) fn gone_below(&self) -> u64 {
        self.floor().max(self.evicted().load(Ordering::Acquire))
    }

    pub(crate) fn empty(&self) {
        let hi = self.cursor().load(Ordering::Acquire);
        self.floor_word().fetch_max(hi, Ordering::Release);
    }

    /// The streaming append in flight: the rows it writes, `lo..hi` (empty when
    /// none is). Both loads Acquire: a reader that saw any store of a stream sees
    /// that stream's range here, or its end, which its rows' stores happen before
    /// (see `docs/orderings.rs` §6, "Streams").
    #[inline]
    pub(crate) fn stream(&self) -> std::ops::Range<u64> {
        let lo = self.word(ShardWord::StreamLo).load(Ordering::Acquire);
        let hi = self.word(ShardWord::StreamHi).load(Ordering::Acquire);
        lo..hi
    }

    /// Announces a streaming append of the rows `rows`; the caller then fences
    /// (Release, and `sfence` before non-temporal stores) before writing any of them.
    /// Only by an appender alone in the shard ([`Shard::alone`]).
    pub(crate) fn begin_stream(&self, rows: std::ops::Range<u64>) {
        self.word(ShardWord::StreamHi)
            .store(rows.end, Ordering::Relaxed);
        self.word(ShardWord::StreamLo)
            .store(rows.start, Ordering::Relaxed);
    }

    /// Ends the streaming append of rows up to `end`, after every store of its rows
    /// (and an `sfence` behind non-temporal ones). SYNC POINT: pairs with the
    /// Acquire loads of [`Shard::stream`].
    pub(crate) fn end_stream(&self, end: u64) {
        self.word(ShardWord::StreamLo).store(end, Ordering::Release);
    }

    /// Whether the calling appender, inside the shard as a plain appender, is the
    /// only appender or editor in it: then it may stream (nobody else enters as a
    /// streamer while it is inside, since everyone else then sees two).
    #[inline]
    pub(crate) fn alone(&self) -> bool {
        self.occupancy().load(Ordering::Acquire) == PLAIN
    }

    /// Enters the shard as an appender; pass the claim to [`Shard::leave_append`].
    /// Waits while the shard is frozen (`me`: see [`Shard::wait_thawed`]).
    #[inline]
    pub(crate) fn enter_append(&self, me: u64) -> Claim {
        loop {
            match self.try_enter_append() {
                Ok(claim) => return claim,
                Err(IsFrozen) => self.wait_thawed(me),
            }
        }
    }

    /// Enters the shard as an appender, unless it is frozen: then nothing is counted
    /// and the caller, before waiting for the thaw, leaves every other shard it
    /// entered (see [`IsFrozen`]).
    #[inline]
    pub(crate) fn try_enter_append(&self) -> Result<Claim, IsFrozen> {
        let before = self.occupancy().fetch_add(PLAIN, Ordering::AcqRel);
        if before & (EDITORS_MASK | FROZEN) == 0 {
            return Ok(Claim::Plain);
        }
        if before & FROZEN == 0 {
            // An editor is inside: count this appender among those claiming by
            // compare-exchange, which editors do not wait for (a freeze does).
            self.occupancy()
                .fetch_add(EXCHANGE.wrapping_sub(PLAIN), Ordering::AcqRel);
            return Ok(Claim::Exchange);
        }
        self.occupancy().fetch_sub(PLAIN, Ordering::Release);
        Err(IsFrozen)
    }

    #[inline]
    pub(crate) fn leave_append(&self, claim: Claim) {
        let unit = match claim {
            Claim::Plain => PLAIN,
            Claim::Exchange => EXCHANGE,
        };
        self.occupancy().fetch_sub(unit, Ordering::Release);
    }

    /// Enters the shard as an editor, waiting for plain appenders inside to leave
    /// (`stalled`: see [`EditGuard::wait_for_plain_appenders`]). Waits while the shard
    /// is frozen.
    pub(crate) fn enter_edit(&self, me: u64, stalled: impl FnMut()) -> EditGuard<'_> {
        let guard = loop {
            match self.try_enter_edit() {
                Ok(guard) => break guard,
                Err(IsFrozen) => self.wait_thawed(me),
            }
        };
        guard.wait_for_plain_appenders(stalled);
        guard
    }

    /// Counts an editor in, unless the shard is frozen (see [`IsFrozen`]). The editor
    /// may not touch a slot before [`EditGuard::wait_for_plain_appenders`] returns.
    pub(crate) fn try_enter_edit(&self) -> Result<EditGuard<'_>, IsFrozen> {
        let before = self.occupancy().fetch_add(EDITOR, Ordering::AcqRel);
        if before & FROZEN == 0 {
            return Ok(EditGuard { shard: self });
        }
        self.occupancy().fetch_sub(EDITOR, Ordering::Release);
        Err(IsFrozen)
    }

    /// Takes the leaf turn for the rows of an append claimed at `first`, `steps` steps
    /// long, unless another appender holds it; whether it did (see "Leaf turns").
    /// Before any of the rows is published.
    pub(crate) fn take_leaf_turn(&self, first: u64, steps: u64) -> Option<TurnHeld<'_>> {
        let turn = LeafTurn::of(&self.ring, first, steps)?;
        self.word(ShardWord::LeafTurn)
            .compare_exchange(0, turn.0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
            // Built only when taken: the guard's drop gives the turn back.
            .then(|| TurnHeld { shard: self })
    }

    /// Gives the leaf turn back. SYNC POINT: pairs with the Acquire load of
    /// [`Shard::await_leaf_turn`]: the holder's leaves are set before.
    fn end_leaf_turn(&self) {
        self.word(ShardWord::LeafTurn).store(0, Ordering::Release);
    }

    /// Waits while another appender's leaf turn names a position of the append claimed
    /// at `first`, `steps` steps long: the caller, without the turn, is about to set
    /// its leaves (see "Leaf turns").
    pub(crate) fn await_leaf_turn(&self, first: u64, steps: u64) {
        let mine = LeafTurn::of(&self.ring, first, steps);
        let mut backoff = Backoff::new();
        loop {
            let word = self.word(ShardWord::LeafTurn).load(Ordering::Acquire);
            let overlaps = match mine {
                // An append past the counts a turn word holds: every position.
                None => word != 0,
                Some(mine) => LeafTurn(word).overlaps(mine, self.ring.steps),
            };
            if !overlaps {
                return;
            }
            backoff.snooze();
        }
    }

    /// Takes back every appender unit of the occupancy word (a dead lease holder's:
    /// only its threads appended here), keeping the editors' and the freeze bit, and
    /// gives back the leaf turn, which only they could hold.
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // no shared regions under loom
    pub(crate) fn clear_appenders(&self) {
        self.end_leaf_turn();
        let occupancy = self.occupancy();
        let mut cur = occupancy.load(Ordering::Acquire);
        loop {
            let kept = cur & (EDITORS_MASK | FROZEN);
            match occupancy.compare_exchange(cur, kept, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Takes back every editor unit of the occupancy word (a dead editor process's: the
    /// shard's `Editor` word named it, so they are all its own), keeping the rest.
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // no shared regions under loom
    pub(crate) fn clear_editors(&self) {
        let occupancy = self.occupancy();
        let mut cur = occupancy.load(Ordering::Acquire);
        loop {
            let kept = cur & !EDITORS_MASK;
            match occupancy.compare_exchange(cur, kept, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Starts a freeze by `holder` (this process's holder word in a shared region, 1
    /// elsewhere): takes the shard's freezer word, then sets the `FROZEN` bit. Freezers
    /// take turns through the freezer word, across processes; one that died holding it
    /// is passed over. Then [`Shard::drained`] tells when everybody inside has left.
    pub(crate) fn begin_freeze(&self, holder: u64) -> FreezeGuard<'_> {
        let freezer = self.word(ShardWord::Freezer);
        let mut backoff = Backoff::new();
        loop {
            match freezer.compare_exchange(0, holder, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(other) if self.is_dead(other) => {
                    // Its freeze goes on under the new holder (the bit stays set).
                    if freezer
                        .compare_exchange(other, holder, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        break;
                    }
                }
                Err(_) => backoff.snooze(),
            }
        }
        self.occupancy().fetch_or(FROZEN, Ordering::AcqRel);
        FreezeGuard { shard: self }
    }

    /// Whether nobody is inside the shard but its freezer.
    pub(crate) fn drained(&self) -> bool {
        self.occupancy().load(Ordering::Acquire) & !FROZEN == 0
    }

    /// Whether `holder` names a process that is gone (never, outside shared mode).
    fn is_dead(&self, holder: u64) -> bool {
        self.procs.as_ref().is_some_and(|t| !t.alive(holder))
    }

    /// Waits until no freeze holds the shard. In a shared region, a freeze whose
    /// process died is lifted by `me` (this process's holder word; see
    /// [`Shard::begin_freeze`]).
    ///
    /// Lifting takes the freezer word over from the dead holder *before* clearing
    /// `FROZEN`, and gives it back after: while the word names a live process no other
    /// freezer can take it, so the bit cleared is the dead freeze's and never a new
    /// freezer's (one that took a word already zero would have its freeze erased, and
    /// a checkpoint would copy rows being written as if they were published).
    pub(crate) fn wait_thawed(&self, me: u64) {
        let mut backoff = Backoff::new();
        let mut waits = 0u32;
        while self.occupancy().load(Ordering::Acquire) & FROZEN != 0 {
            backoff.snooze();
            waits += 1;
            if waits.is_multiple_of(DEAD_FREEZER_CHECK_WAITS) {
                let freezer = self.word(ShardWord::Freezer);
                let holder = freezer.load(Ordering::Acquire);
                if holder != 0
                    && holder != me
                    && self.is_dead(holder)
                    && freezer
                        .compare_exchange(holder, me, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    // SYNC POINT: as a thaw (`FreezeGuard::drop`), pairs with the
                    // Acquire loads of waiting appenders and editors.
                    self.occupancy().fetch_and(!FROZEN, Ordering::Release);
                    freezer.store(0, Ordering::Release);
                }
            }
        }
    }
}

/// A shard found frozen on entry: nothing was counted.
///
/// A thread that enters several shards for one write (a buffer-level extend of an
/// ndim-2 storage, `write_all`) must never wait for a thaw while it is counted in
/// another shard: a freezer sets `FROZEN` on every shard before it waits for each to
/// drain, so it would wait for that thread while the thread waits for it. Such a
/// thread tries each shard, and on `IsFrozen` leaves every shard it entered, waits for
/// the thaw ([`Shard::wait_thawed`]) and starts over (`Storage::enter_all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IsFrozen;

/// Waits on a frozen shard between checks that its freezer still lives.
const DEAD_FREEZER_CHECK_WAITS: u32 = 4096;

/// A freezer's hold on a shard; thawing is dropping it.
pub(crate) struct FreezeGuard<'a> {
    shard: &'a Shard,
}

impl Drop for FreezeGuard<'_> {
    fn drop(&mut self) {
        // SYNC POINT: pairs with the Acquire loads of waiting appenders and editors:
        // whatever the freezer wrote happens before their writes.
        self.shard.occupancy().fetch_and(!FROZEN, Ordering::Release);
        self.shard
            .word(ShardWord::Freezer)
            .store(0, Ordering::Release);
    }
}

/// An editor's presence in a shard; leaving is dropping it.
pub(crate) struct EditGuard<'a> {
    shard: &'a Shard,
}

impl EditGuard<'_> {
    /// Waits until no plain appender is inside the shard: those inside finish their
    /// one extend (they wait for nothing but their own slots' predecessors), and those
    /// that come later see the editor and claim by compare-exchange. Calls `stalled`
    /// every [`DEAD_WRITER_CHECK_WAITS`] waits: in a shared region the appender may be
    /// a process that died inside, whose unit would never leave (the caller takes its
    /// lease over, which clears its units).
    pub(crate) fn wait_for_plain_appenders(&self, mut stalled: impl FnMut()) {
        let mut backoff = Backoff::new();
        let mut waits = 0u32;
        while self.shard.occupancy().load(Ordering::Acquire) & PLAIN_MASK != 0 {
            backoff.snooze();
            waits = waits.wrapping_add(1);
            if waits.is_multiple_of(DEAD_WRITER_CHECK_WAITS) {
                stalled();
            }
        }
    }
}

impl Drop for EditGuard<'_> {
    fn drop(&mut self) {
        self.shard.occupancy().fetch_sub(EDITOR, Ordering::Release);
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use crate::sync::Ordering;
    use crate::{DType, ReplayBuffer, Spec};

    /// A floor or eviction mark above the cursor (a damaged file's) makes an empty
    /// window, not one whose length underflowed (a panic with overflow checks, a huge
    /// `len` without), and a recovery puts the words back at the cursor.
    #[test]
    fn marks_above_the_cursor_make_an_empty_window() {
        let spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
        let rb = ReplayBuffer::builder(spec).capacity(8).build().unwrap();
        rb.extend(&rb.batch([5])).unwrap();
        let state = rb.state();
        let shard = &state.core.storage.shards()[0];
        for word in [shard.floor_word(), shard.evicted()] {
            word.store(40, Ordering::Release);
            assert_eq!(shard.window().steps(), 0);
            assert_eq!(rb.len(), 0);
            shard.sanitize();
            assert_eq!(word.load(Ordering::Acquire), 5);
        }
    }
}
