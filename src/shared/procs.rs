//! The process table of a shared region, and the shards' writer leases.
//!
//! Every process that maps a shared region holds one entry of its process table (one
//! cache line each), and every shard a process appends to is leased to it: only the
//! lease holder's threads append there. That is what makes a dead process's damage
//! repairable without stopping anyone: whatever a shard's occupancy count holds, a
//! half-written slot, a trajectory table mid-append, all belong to its lease holder,
//! so the process that takes over the lease of a dead holder knows it may take them
//! over too (`Storage::recover_shard`).
//!
//! # Holders
//!
//! A process is named in the region by a `Holder` word:
//!
//! ```text
//!  63        56 55 54             32 31                0
//! +------------+--+-----------------+-------------------+
//! | entry + 1  |0 | generation (23) | pid (32)          |
//! +------------+--+-----------------+-------------------+
//! ```
//!
//! An entry's `OWNER` word holds its holder (0: free); the generation grows with every
//! claim, so a holder word names one claim of one entry and never a later process that
//! reuses it. The pid is for people (`replaybuf shm list`): it says nothing about
//! liveness, since in another PID namespace it names another process.
//!
//! # Liveness
//!
//! A holder is alive while its entry's `OWNER` still names it and the entry's byte of
//! the region's file is locked (`liveness.rs`). A process takes the byte's lock before
//! it claims the entry (so a free lock means no live holder), and gives it back after
//! it gave the entry back; the kernel gives it back for a process that dies. A
//! process that takes an entry whose byte is unlocked owns it: whoever `OWNER` named
//! is dead.
//!
//! # Memory ordering
//!
//! Claims and releases are compare-exchanges on `OWNER` and `Lease` words (AcqRel).
//! The lock orders nothing in memory: it only says who lives.
//!
//! Layer: algos.
// Under loom there is no shared memory: only the shards' optional table is compiled.
#![cfg_attr(replaybuf_loom, allow(dead_code))]

use std::sync::Arc;

use crate::region::{Block, Region};
use crate::storage::layout::PROC_WORDS;
use crate::sync::{AtomicU64, Ordering};

/// Entries of a shared region's process table: processes that may map it at once.
/// At most 64: [`ProcTable`] keeps its own entries as bits of one word.
pub(crate) const PROCS: usize = 64;

/// An entry's words.
const OWNER: usize = 0;
/// The last generation used in this entry.
const GENERATION: usize = 2;

const PID_MASK: u64 = (1 << 32) - 1;
const GEN_SHIFT: u32 = 32;
const GEN_MASK: u64 = (1 << 23) - 1;
const ENTRY_SHIFT: u32 = 56;

/// One process's claim of one entry (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder(pub(crate) u64);

impl Holder {
    fn new(entry: usize, generation: u64, pid: u32) -> Holder {
        Holder(
            ((entry as u64 + 1) << ENTRY_SHIFT)
                | ((generation & GEN_MASK) << GEN_SHIFT)
                | u64::from(pid),
        )
    }

    pub(crate) fn pid(self) -> u32 {
        (self.0 & PID_MASK) as u32
    }

    /// The entry of the table this holder claimed, if the word names one.
    fn entry(self) -> Option<usize> {
        match (self.0 >> ENTRY_SHIFT) as usize {
            0 => None,
            e => Some(e - 1),
        }
    }
}

/// Whether process `pid` of this PID namespace runs (a signal to it would be
/// delivered). Only a hint, for people: liveness in a region is judged by its locks.
pub(crate) fn runs(pid: u32) -> bool {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::PERM,
    }
}

/// A shared region's process table.
#[derive(Clone, Debug)]
pub(crate) struct ProcTable {
    block: Block,
    /// The entries whose liveness byte this process locked through this mapping's file
    /// (bit `e`: entry `e`). The kernel does not report a description's own locks to
    /// it, so these are known here. Shared by every clone over the same mapping.
    held: Arc<AtomicU64>,
}

impl ProcTable {
    /// The table in `block` (`PROCS` entries of `PROC_WORDS`).
    pub(crate) fn new(block: Block) -> ProcTable {
        ProcTable {
            block,
            held: Arc::default(),
        }
    }

    /// The table of `region` at `procs` (its words' offset and entries, as the
    /// region's header says), if the header's numbers fit: the table's walks cover
    /// `PROCS` entries, and one of another size was read past (a panic, or words
    /// beyond the region).
    pub(crate) fn in_region(region: &Arc<Region>, (at, n): (u64, u64)) -> Option<ProcTable> {
        let (at, n) = (usize::try_from(at).ok()?, usize::try_from(n).ok()?);
        let fits = n
            .checked_mul(PROC_WORDS)
            .and_then(|w| w.checked_add(at))
            .is_some_and(|end| end <= region.words().len());
        (n == PROCS && fits).then(|| ProcTable::new(Block::new(region, at, n * PROC_WORDS)))
    }

    fn word(&self, entry: usize, w: usize) -> &AtomicU64 {
        self.block.word(entry * PROC_WORDS + w)
    }

    /// Whether entry `entry`'s liveness byte is locked, by this process or another.
    fn locked(&self, entry: usize) -> bool {
        if self.held.load(Ordering::Acquire) & (1 << entry) != 0 {
            return true;
        }
        #[cfg(not(replaybuf_loom))]
        if let Some(file) = self.block.region().shared_file() {
            return super::liveness::locked_elsewhere(file, entry);
        }
        // No file to ask: never take a holder for dead on a doubt.
        true
    }

    /// Locks entry `entry`'s liveness byte for this process; `false` if another holds
    /// it (or this process does, through this mapping).
    fn lock(&self, entry: usize) -> bool {
        if self.held.load(Ordering::Acquire) & (1 << entry) != 0 {
            return false;
        }
        #[cfg(not(replaybuf_loom))]
        if let Some(file) = self.block.region().shared_file() {
            if super::liveness::try_lock(file, entry).unwrap_or(false) {
                self.held.fetch_or(1 << entry, Ordering::AcqRel);
                return true;
            }
        }
        false
    }

    fn unlock(&self, entry: usize) {
        #[cfg(not(replaybuf_loom))]
        if let Some(file) = self.block.region().shared_file() {
            super::liveness::unlock(file, entry);
        }
        self.held.fetch_and(!(1 << entry), Ordering::AcqRel);
    }

    /// Whether `holder` (a word read from a lease, a freezer or an entry) names a live
    /// process. Zero names nobody: not alive.
    pub(crate) fn alive(&self, holder: u64) -> bool {
        let Some(entry) = Holder(holder).entry().filter(|&e| e < PROCS) else {
            return false;
        };
        // The entry was claimed again since (only ever once its holder died), or given
        // back: its holder is gone.
        if self.word(entry, OWNER).load(Ordering::Acquire) != holder {
            return false;
        }
        self.locked(entry)
    }

    /// Claims an entry for this process; `None` if every entry is held by a live one.
    pub(crate) fn register(&self) -> Option<Holder> {
        let pid = std::process::id();
        for entry in 0..PROCS {
            // The lock first: with it, nobody else lives in this entry.
            if !self.lock(entry) {
                continue;
            }
            let cur = self.word(entry, OWNER).load(Ordering::Acquire);
            let generation = self.word(entry, GENERATION).fetch_add(1, Ordering::AcqRel) + 1;
            let me = Holder::new(entry, generation, pid);
            if self
                .word(entry, OWNER)
                .compare_exchange(cur, me.0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some(me);
            }
            self.unlock(entry);
        }
        None
    }

    /// Gives `me`'s entry back.
    pub(crate) fn deregister(&self, me: Holder) {
        if let Some(entry) = me.entry() {
            let _ = self.word(entry, OWNER).compare_exchange(
                me.0,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            self.unlock(entry);
        }
    }

    /// The live processes in the table, by pid (as each registered it: a pid of its
    /// own PID namespace).
    pub(crate) fn live(&self) -> Vec<u32> {
        self.live_except(None)
    }

    /// [`ProcTable::live`] but for the entry of `me`: the other members, among them
    /// another attachment of `me`'s own process.
    pub(crate) fn live_except(&self, me: Option<Holder>) -> Vec<u32> {
        (0..PROCS)
            .map(|e| self.word(e, OWNER).load(Ordering::Acquire))
            .filter(|&o| o != 0 && Some(Holder(o)) != me && self.alive(o))
            .map(|o| Holder(o).pid())
            .collect()
    }

    /// Entries held by processes that are gone.
    pub(crate) fn dead(&self) -> usize {
        (0..PROCS)
            .map(|e| self.word(e, OWNER).load(Ordering::Acquire))
            .filter(|&o| o != 0 && !self.alive(o))
            .count()
    }
}

/// No shard's lease could be taken: every one is held by another live process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NoShard;

/// How a lease was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leased {
    /// It was free.
    Free,
    /// Its holder had died: the shard must be recovered before it is written.
    FromDead,
}

/// Takes the lease word `lease` for `me`: free, or held by a dead process. `None`
/// if a live process holds it.
pub(crate) fn take_lease(table: &ProcTable, lease: &AtomicU64, me: Holder) -> Option<Leased> {
    loop {
        let cur = lease.load(Ordering::Acquire);
        let how = match cur {
            0 => Leased::Free,
            c if c == me.0 => return Some(Leased::Free),
            c if !table.alive(c) => Leased::FromDead,
            _ => return None,
        };
        if lease
            .compare_exchange(cur, me.0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return Some(how);
        }
    }
}

/// Takes the lease word `lease` for `me` only from a dead holder: `true` if it did,
/// and the caller repairs what the holder left and gives the word back. A free word,
/// `me`'s own or a live holder's is left as it is: a reclaim in passing (a dump, a
/// read or an edit that met a dead writer's row) must not keep a lease nobody asked
/// for, which [`take_lease`] would take from a free word.
pub(crate) fn take_from_dead(table: &ProcTable, lease: &AtomicU64, me: Holder) -> bool {
    let cur = lease.load(Ordering::Acquire);
    cur != 0
        && cur != me.0
        && !table.alive(cur)
        && lease
            .compare_exchange(cur, me.0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

/// Gives the lease back if `me` holds it.
pub(crate) fn release_lease(lease: &AtomicU64, me: Holder) {
    let _ = lease.compare_exchange(me.0, 0, Ordering::AcqRel, Ordering::Relaxed);
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs() {
        assert!(runs(std::process::id()));
        assert!(!runs(u32::MAX >> 1));
    }

    #[test]
    fn holders_pack_their_parts() {
        let h = Holder::new(5, 77, 4242);
        assert_eq!((h.entry(), h.pid()), (Some(5), 4242));
        assert_eq!(Holder(0).entry(), None);
    }
}
