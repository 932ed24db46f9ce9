//! Freezing a storage: holding every writer of its region still, so that the region
//! can be copied whole (a checkpoint) while learners go on sampling.
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
//! # Memory ordering
//!
//! The thaw (`fetch_and` with Release) pairs with the Acquire load of a waiter, and a
//! leaving writer's Release `fetch_sub` with the freezer's Acquire loads: everything
//! a writer did happens before the freezer's copy, and the copy before whatever a
//! waiter does next.

use smallvec::SmallVec;

use super::shard::FreezeGuard as ShardFreeze;
use super::Storage;
use crate::sync::{AtomicU64, Backoff, Ordering};

const FROZEN: u64 = 1 << 63;
/// Waits on a shard that does not drain between checks that its writer still lives.
const DEAD_WRITER_CHECK_WAITS: u32 = 4096;

/// An updater inside the gate; leaving is dropping it.
pub(crate) struct Inside<'a> {
    word: &'a AtomicU64,
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.word.fetch_sub(1, Ordering::Release);
    }
}

/// A frozen storage; it thaws when this drops.
pub(crate) struct Frozen<'a> {
    updaters: &'a AtomicU64,
    _shards: SmallVec<[ShardFreeze<'a>; 8]>,
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        // SYNC POINT: pairs with the Acquire load of updaters waiting in `enter_update`.
        self.updaters.fetch_and(!FROZEN, Ordering::Release);
    }
}

impl Storage {
    /// Enters as an updater (a priority update, `set_alpha`, `empty`), waiting while
    /// the storage is frozen.
    pub(crate) fn enter_update(&self) -> Inside<'_> {
        let word = &*self.updaters;
        loop {
            if word.fetch_add(1, Ordering::AcqRel) & FROZEN == 0 {
                return Inside { word };
            }
            word.fetch_sub(1, Ordering::Release);
            let mut backoff = Backoff::new();
            while word.load(Ordering::Acquire) & FROZEN != 0 {
                backoff.snooze();
            }
        }
    }

    /// Freezes the storage: waits until no appender, editor or priority updater is
    /// inside any shard, and keeps new ones out until the guard drops. Freezers take
    /// turns: the one that sets the updaters' `FROZEN` bit goes first, the others wait
    /// for it to thaw.
    pub(crate) fn freeze(&self) -> Frozen<'_> {
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
                    // A shared region's appender may have died inside: its lease
                    // holder's units would never leave. Take the lease over and repair.
                    self.reclaim_dead_lease(k);
                }
            }
        }
        let mut backoff = Backoff::new();
        while updaters.load(Ordering::Acquire) & !FROZEN != 0 {
            backoff.snooze();
        }
        Frozen {
            updaters,
            _shards: shards,
        }
    }
}
