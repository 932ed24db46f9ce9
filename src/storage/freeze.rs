//! Freezing a storage: holding every writer of its region still, so that the region
//! can be copied whole (a checkpoint, a swap) while learners go on sampling; and
//! retiring it, once a swap has replaced it.
//!
//! Three kinds of thread write a region: appenders and editors, which each shard's
//! occupancy word counts and a freeze waits out (`shard.rs`), and updaters (priority
//! updates, `set_alpha`, `empty`), which the storage's `updaters` word counts the same
//! way here:
//!
//! ```text
//!  63       62                         0
//! +--------+----------------------------+
//! | FROZEN | updaters inside (63 bits)  |
//! +--------+----------------------------+
//! ```
//!
//! An updater adds one, and if it finds `FROZEN` takes it back and waits for the thaw;
//! a freezer sets `FROZEN` and waits for the count to reach zero. Both read-modify-write
//! the same word, so either the updater sees the freezer or the freezer sees the
//! updater. Readers never stop: a sample during a freeze reads rows that do not change.
//!
//! The occupancy words live in the region, so a freeze holds the appenders of every
//! process that maps it. The updaters' word is the process's own: a process that dies
//! inside an update must not leave a count that no freeze can ever wait out. Updates
//! from other processes may therefore change the trees while a shared region is
//! copied; a checkpoint's trees are rebuilt from its raw priorities when it is loaded
//! (`recover.rs`), so what loads is consistent either way.
//!
//! # Retiring
//!
//! A swap (`swap/mod.rs`) freezes the storage it replaces, copies its rows (or keeps
//! its region), publishes the buffer's new state, and then *retires* the old storage
//! before thawing it. Writers that waited on the freeze still hold the old state, and
//! must not write into a storage nobody copies any more: each kind of writer checks
//! the storage's `retired` flag right after it gets in (appenders and editors after
//! their shard's occupancy word, updaters after the updaters' word), and if it is set,
//! leaves again with [`Retired`] before writing anything; its caller then redoes the
//! whole write on the buffer's current state.
//!
//! The flag belongs to the `Storage` value, not to its region: a swap that keeps the
//! rows in place publishes a second `Storage` over the same region
//! ([`Storage::view`]), whose writers must go on. It costs an appender one load of a
//! line it reads anyway; nothing is added to the occupancy word's protocol.
//!
//! # Memory ordering
//!
//! The thaw (`fetch_and` with Release) pairs with the Acquire load of a waiter, and a
//! leaving writer's Release `fetch_sub` with the freezer's Acquire loads: everything
//! a writer did happens before the freezer's copy, and the copy before whatever a
//! waiter does next.
//!
//! Retiring is a store to `retired` made while the storage is frozen, before the
//! thaw. A writer's entry is a read-modify-write of the word the thaw also changes,
//! so either the entry comes first in that word's modification order (and the freeze
//! waited for the writer to leave: its rows are in what the swap copied), or it sees
//! `FROZEN` and waits, or it reads the thaw or a later value: then the thaw's Release
//! synchronises with the entry's Acquire, the retiring store happens before the
//! writer's Acquire load of `retired`, and the writer sees it set.
//!
//! Layer: algos.

use smallvec::SmallVec;

use super::layout::Global;
use super::shard::{
    EditGuard, FreezeGuard as ShardFreeze, IsFrozen, Shard, DEAD_WRITER_CHECK_WAITS,
};
use super::stamp::Claim;
use super::Storage;
use crate::sync::{fence, AtomicU64, Backoff, Ordering};

const FROZEN: u64 = 1 << 63;

#[cfg(not(replaybuf_loom))]
std::thread_local! {
    /// The storage this thread holds frozen, innermost (its updaters' word's
    /// address), or 0: a save's hooks and progress reports run inside its freeze.
    static FROZEN_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A write refused because a swap retired the storage it was made against: nothing
/// was written, and the caller redoes it on the buffer's current state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Retired;

/// An updater inside the gate; leaving is dropping it.
pub(crate) struct Inside<'a> {
    word: &'a AtomicU64,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.word.fetch_sub(1, Ordering::Release);
    }
}

/// Editors inside one or more shards; they leave when this drops (the shards first,
/// then, in a shared region, this process's hold on their `Editor` words).
pub(crate) struct Editing<'a> {
    guards: SmallVec<[EditGuard<'a>; 8]>,
    _held: SmallVec<[EditHold<'a>; 8]>,
}

impl Drop for Editing<'_> {
    fn drop(&mut self) {
        // Out of the occupancy words before the `Editor` words are given back: the
        // next process's editors count on finding none of ours inside.
        self.guards.clear();
    }
}

/// This process's hold on a shard's `Editor` word in a shared region (`None`
/// elsewhere), given back on drop.
pub(crate) struct EditHold<'a>(
    #[cfg(not(replaybuf_loom))] Option<(&'a crate::storage::member::Member, usize)>,
    #[cfg(replaybuf_loom)]
    #[allow(dead_code)] // no shared regions under loom
    Option<(&'a (), usize)>,
);

impl Drop for EditHold<'_> {
    fn drop(&mut self) {
        #[cfg(not(replaybuf_loom))]
        if let Some((m, k)) = self.0 {
            m.end_edit(k);
        }
    }
}

/// A storage whose counters a swap is carrying ([`Storage::begin_carry`]).
pub(crate) struct Carrying<'a> {
    storage: &'a Storage,
}

impl Drop for Carrying<'_> {
    fn drop(&mut self) {
        // SYNC POINT: pairs with the Acquire loads in `take_count`: a taker that
        // reads the flag cleared after a swap then sees the storage retired.
        self.storage.carrying.store(false, Ordering::Release);
    }
}

/// A frozen storage; it thaws when this drops.
pub(crate) struct Frozen<'a> {
    updaters: &'a AtomicU64,
    shards: SmallVec<[ShardFreeze<'a>; 8]>,
    /// What this thread held frozen before.
    #[cfg(not(replaybuf_loom))]
    outer: usize,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        #[cfg(not(replaybuf_loom))]
        FROZEN_HERE.with(|f| f.set(self.outer));
        // The shards thaw first: the updaters' bit is what the next freezer takes
        // turns on, and it must find every shard thawed.
        self.shards.clear();
        // SYNC POINT: pairs with the Acquire load of updaters waiting in `enter_update`
        // (and of the next freezer).
        self.updaters.fetch_and(!FROZEN, Ordering::Release);
    }
}

impl Storage {
    /// Panics if this thread holds this storage frozen: a save's hook or progress
    /// report that writes to the buffer it saves (or saves it again) would wait for
    /// that save's thaw, which only its own return brings. A contract the docs of
    /// `register_save_hook` and `SaveOptions::progress` state; a hang would say
    /// nothing of it.
    pub(crate) fn refuse_reentry(&self) {
        #[cfg(not(replaybuf_loom))]
        if FROZEN_HERE.with(std::cell::Cell::get) == self.freeze_id() {
            panic!(
                "replaybuf: a save hook or progress report wrote to the buffer being \
                 saved (or saved it again); that would wait for the save to end"
            );
        }
    }

    /// This storage's identity for [`FROZEN_HERE`] (views share it).
    #[cfg(not(replaybuf_loom))]
    fn freeze_id(&self) -> usize {
        std::ptr::from_ref::<AtomicU64>(&self.updaters).addr()
    }

    /// Enters as an updater (a priority update, `set_alpha`, `empty`), waiting while
    /// the storage is frozen; refused if the storage is retired.
    pub(crate) fn enter_update(&self) -> Result<Inside<'_>, Retired> {
        self.refuse_reentry();
        let word = &*self.updaters;
        loop {
            if word.fetch_add(1, Ordering::AcqRel) & FROZEN == 0 {
                let inside = Inside { word };
                self.check_retired()?;
                return Ok(inside);
            }
            word.fetch_sub(1, Ordering::Release);
            let mut backoff = Backoff::new();
            while word.load(Ordering::Acquire) & FROZEN != 0 {
                backoff.snooze();
            }
        }
    }

    /// Enters shard `k` as an appender (see `Shard::enter_append`), waiting while it
    /// is frozen; refused if the storage is retired. Pass the claim to
    /// [`Storage::append_entered`].
    #[inline]
    pub(crate) fn enter_append(&self, k: usize) -> Result<Claim, Retired> {
        self.refuse_reentry();
        let shard = &self.shards()[k];
        let claim = shard.enter_append(self.freezer_holder());
        if self.is_retired() {
            shard.leave_append(claim);
            return Err(Retired);
        }
        Ok(claim)
    }

    /// Enters shard `k` as an editor (see `Shard::enter_edit`), waiting while it is
    /// frozen; refused if the storage is retired.
    pub(crate) fn enter_edit(&self, k: usize) -> Result<Editing<'_>, Retired> {
        self.refuse_reentry();
        let held = self.hold_edit(k);
        let guard =
            self.shards()[k].enter_edit(self.freezer_holder(), || self.reclaim_dead_lease(k));
        let editing = Editing {
            guards: smallvec::smallvec![guard],
            _held: smallvec::smallvec![held],
        };
        self.check_retired()?;
        Ok(editing)
    }

    /// Enters every shard as an appender, for one write that spans them all (a
    /// buffer-level extend of an ndim-2 storage): pass claim `k` to
    /// [`Storage::append_entered`] for shard `k`. Waits while any shard is frozen,
    /// but never while counted in another (see [`IsFrozen`]); refused if the storage
    /// is retired.
    pub(crate) fn enter_append_all(&self) -> Result<SmallVec<[Claim; 8]>, Retired> {
        self.enter_all(Shard::try_enter_append, Shard::leave_append)
    }

    /// Enters every shard as an editor (`write_all`), as
    /// [`Storage::enter_append_all`] enters them as an appender, then waits for the
    /// plain appenders inside each to leave.
    pub(crate) fn enter_edit_all(&self) -> Result<Editing<'_>, Retired> {
        // In a shared region, every shard's `Editor` word first, in order (so two
        // processes' editors never wait for each other in a cycle), and before any
        // occupancy word: they are waited for, and a wait here must not hold a freeze.
        let held: SmallVec<[EditHold<'_>; 8]> = (0..self.shards().len())
            .map(|k| self.hold_edit(k))
            .collect();
        let guards = self.enter_all(Shard::try_enter_edit, |_, guard| drop(guard))?;
        for (k, guard) in guards.iter().enumerate() {
            guard.wait_for_plain_appenders(|| self.reclaim_dead_lease(k));
        }
        Ok(Editing {
            guards,
            _held: held,
        })
    }

    /// In a shared region, this process's hold on shard `k`'s `Editor` word (see
    /// `Member::begin_edit`); nothing elsewhere.
    fn hold_edit(&self, k: usize) -> EditHold<'_> {
        #[cfg(not(replaybuf_loom))]
        if let Some(m) = self.member() {
            m.begin_edit(self, k);
            return EditHold(Some((m, k)));
        }
        let _ = k;
        EditHold(None)
    }

    /// Enters every shard with `try_enter`, in order. A shard found frozen sends the
    /// thread out of every shard it entered to wait for the thaw, and back to the
    /// first: a freezer that froze them all waits for each to drain, so waiting while
    /// counted in one would wait for it forever.
    fn enter_all<'s, T>(
        &'s self,
        try_enter: impl Fn(&'s Shard) -> Result<T, IsFrozen>,
        leave: impl Fn(&'s Shard, T),
    ) -> Result<SmallVec<[T; 8]>, Retired> {
        self.refuse_reentry();
        let shards = self.shards();
        'again: loop {
            let mut entered: SmallVec<[T; 8]> = SmallVec::new();
            for shard in shards.iter() {
                match try_enter(shard) {
                    Ok(unit) => entered.push(unit),
                    Err(IsFrozen) => {
                        for (s, unit) in shards.iter().zip(entered) {
                            leave(s, unit);
                        }
                        shard.wait_thawed(self.freezer_holder());
                        continue 'again;
                    }
                }
            }
            if self.is_retired() {
                for (s, unit) in shards.iter().zip(entered) {
                    leave(s, unit);
                }
                return Err(Retired);
            }
            return Ok(entered);
        }
    }

    /// Whether a swap has retired this storage.
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        // SYNC POINT: pairs with the thaw's Release (see the module docs): a writer
        // that got in after the thaw sees the flag set.
        self.retired.load(Ordering::Acquire)
    }

    fn check_retired(&self) -> Result<(), Retired> {
        if self.is_retired() {
            Err(Retired)
        } else {
            Ok(())
        }
    }

    /// Retires the storage: every writer that gets in from now on leaves again with
    /// [`Retired`]. Call it while holding the storage frozen, before thawing.
    pub(crate) fn retire(&self, _frozen: &Frozen<'_>) {
        self.retired.store(true, Ordering::Release);
    }

    /// Marks the storage as having its counters carried into a new one, until the
    /// guard drops: after [`Storage::retire`], or on a swap that unwinds. Call it
    /// while holding the storage frozen, before reading any counter.
    pub(crate) fn begin_carry(&self, _frozen: &Frozen<'_>) -> Carrying<'_> {
        self.carrying.store(true, Ordering::SeqCst);
        // SYNC POINT: pairs with the fence in `take_count` (a store-load pair each
        // side, as in Dekker's protocol): the copy's reads of the counters come after.
        fence(Ordering::SeqCst);
        Carrying { storage: self }
    }

    /// The next number of counter `counter` (sample calls through the buffer itself:
    /// their random streams; handles: a learner's stream, a writer's shard), or
    /// [`Retired`] if a swap may have carried the counter to a new storage before this
    /// took it: the new storage would hand the number out again. A taker that meets a
    /// swap waits for its copy to end (not for a freeze alone: a checkpoint's freeze
    /// copies no counter) and is then redone on the state the swap published.
    ///
    /// The taker counts, then (after a `SeqCst` fence) reads `carrying`; the swap sets
    /// `carrying`, then (after its fence) reads the counters. Of the two fences one
    /// comes first: if the taker's does, the copy reads its count; if the swap's does,
    /// the taker sees `carrying` set. A taker that reads `carrying` cleared after the
    /// swap reads `retired` set: the swap retires the storage before it clears.
    pub(crate) fn take_count(&self, counter: Global) -> Result<u64, Retired> {
        let n = self.global(counter).fetch_add(1, Ordering::Relaxed);
        // SYNC POINT: pairs with the fence in `begin_carry`.
        fence(Ordering::SeqCst);
        // SYNC POINT: Acquire pairs with the Release of `Carrying`'s drop, which
        // comes after the swap's `retire`.
        if !self.carrying.load(Ordering::Acquire) && !self.is_retired() {
            return Ok(n);
        }
        let mut backoff = Backoff::new();
        while self.carrying.load(Ordering::Acquire) {
            backoff.snooze();
        }
        Err(Retired)
    }

    /// Freezes the storage: waits until no appender, editor or priority updater is
    /// inside any shard, and keeps new ones out until the guard drops. Freezers take
    /// turns: the one that sets the updaters' `FROZEN` bit goes first, the others wait
    /// for it to thaw.
    pub(crate) fn freeze(&self) -> Frozen<'_> {
        self.refuse_reentry();
        let updaters = &*self.updaters;
        while updaters.fetch_or(FROZEN, Ordering::AcqRel) & FROZEN != 0 {
            let mut backoff = Backoff::new();
            while updaters.load(Ordering::Acquire) & FROZEN != 0 {
                backoff.snooze();
            }
        }
        let holder = self.freezer_holder();
        let shards: SmallVec<[ShardFreeze<'_>; 8]> = self
            .shards()
            .iter()
            .map(|s| s.begin_freeze(holder))
            .collect();
        for (k, shard) in self.shards().iter().enumerate() {
            let mut backoff = Backoff::new();
            let mut waits = 0u32;
            while !shard.drained() {
                backoff.snooze();
                waits += 1;
                if waits.is_multiple_of(DEAD_WRITER_CHECK_WAITS) {
                    // A shared region's appender or editor may have died inside: its
                    // units would never leave. Take its lease or editor word over and
                    // repair.
                    self.reclaim_dead_lease(k);
                    self.reclaim_dead_editor(k);
                }
            }
        }
        let mut backoff = Backoff::new();
        while updaters.load(Ordering::Acquire) & !FROZEN != 0 {
            backoff.snooze();
        }
        Frozen {
            updaters,
            shards,
            #[cfg(not(replaybuf_loom))]
            outer: FROZEN_HERE.with(|f| f.replace(self.freeze_id())),
        }
    }
}
