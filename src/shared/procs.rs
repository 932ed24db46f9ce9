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
//!  63        56 55     54             32 31                0
//! +------------+------+-----------------+-------------------+
//! | entry + 1  | INIT | generation (23) | pid (32)          |
//! +------------+------+-----------------+-------------------+
//! ```
//!
//! An entry's `OWNER` word holds its holder (0: free). A process claims a free entry,
//! or one whose holder is dead, by compare-exchange, marked `INIT` until it has stored
//! its start time; the generation grows with every claim, so a holder word names one
//! claim of one entry and never a later process that reuses it.
//!
//! A holder is alive while its entry still names it and its process runs: `kill(pid,
//! 0)` succeeds, and the process's start time (`/proc/PID/stat`) is the one recorded,
//! so that a reused pid is not mistaken for the dead process.
//!
//! # Memory ordering
//!
//! Claims and releases are compare-exchanges on `OWNER` and `Lease` words (AcqRel). The
//! start time is stored before the `INIT` mark is cleared with Release, and read after
//! an Acquire load of `OWNER`; a checker that sees `INIT` judges by the pid alone.
// Under loom there is no shared memory: only the shards' optional table is compiled.
#![cfg_attr(replaybuf_loom, allow(dead_code))]

use crate::region::Block;
use crate::storage::layout::PROC_WORDS;
use crate::sync::{AtomicU64, Ordering};

/// Entries of a shared region's process table: processes that may map it at once.
pub(crate) const PROCS: usize = 64;

/// An entry's words.
const OWNER: usize = 0;
/// The owner's start time, in clock ticks after boot (0 if unknown).
const START: usize = 1;
/// The last generation used in this entry.
const GENERATION: usize = 2;

const PID_MASK: u64 = (1 << 32) - 1;
const GEN_SHIFT: u32 = 32;
const GEN_MASK: u64 = (1 << 23) - 1;
const INIT: u64 = 1 << 55;
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

    fn without_init(self) -> u64 {
        self.0 & !INIT
    }
}

/// The start time of process `pid`, in clock ticks after boot: field 22 of
/// `/proc/PID/stat`. `None` where there is no such file.
pub(crate) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from
    // after its closing parenthesis, which is field 3's start.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` runs (a signal to it would be delivered).
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
}

impl ProcTable {
    /// The table in `block` (`PROCS` entries of `PROC_WORDS`).
    pub(crate) fn new(block: Block) -> ProcTable {
        ProcTable { block }
    }

    fn word(&self, entry: usize, w: usize) -> &AtomicU64 {
        self.block.word(entry * PROC_WORDS + w)
    }

    /// Whether `holder` (a word read from a lease, a freezer or an entry) names a live
    /// process. Zero names nobody: not alive.
    pub(crate) fn alive(&self, holder: u64) -> bool {
        let h = Holder(holder);
        let Some(entry) = h.entry().filter(|&e| e < PROCS) else {
            return false;
        };
        // SYNC POINT: pairs with the Release store that cleared INIT in `register`.
        let owner = self.word(entry, OWNER).load(Ordering::Acquire);
        if owner & !INIT != h.without_init() {
            // The entry was claimed again since, which happens only once its holder
            // was found dead.
            return false;
        }
        if !runs(h.pid()) {
            return false;
        }
        if owner & INIT != 0 {
            return true;
        }
        let recorded = self.word(entry, START).load(Ordering::Relaxed);
        match start_time(h.pid()) {
            Some(now) if recorded != 0 => now == recorded,
            _ => true,
        }
    }

    /// Claims an entry for this process; `None` if every entry is held by a live one.
    pub(crate) fn register(&self) -> Option<Holder> {
        let pid = std::process::id();
        for entry in 0..PROCS {
            let cur = self.word(entry, OWNER).load(Ordering::Acquire);
            if cur != 0 && self.alive(cur) {
                continue;
            }
            let generation = self.word(entry, GENERATION).fetch_add(1, Ordering::AcqRel) + 1;
            let me = Holder::new(entry, generation, pid);
            if self
                .word(entry, OWNER)
                .compare_exchange(cur, me.0 | INIT, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            self.word(entry, START)
                .store(start_time(pid).unwrap_or(0), Ordering::Relaxed);
            // SYNC POINT: pairs with the Acquire load of `OWNER` in `alive`.
            self.word(entry, OWNER).store(me.0, Ordering::Release);
            return Some(me);
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
        }
    }

    /// The live processes in the table, by pid.
    pub(crate) fn live(&self) -> Vec<u32> {
        (0..PROCS)
            .map(|e| self.word(e, OWNER).load(Ordering::Acquire))
            .filter(|&o| o != 0 && self.alive(o))
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

/// Gives the lease back if `me` holds it.
pub(crate) fn release_lease(lease: &AtomicU64, me: Holder) {
    let _ = lease.compare_exchange(me.0, 0, Ordering::AcqRel, Ordering::Relaxed);
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_runs() {
        let me = std::process::id();
        assert!(start_time(me).is_some_and(|t| t > 0));
        assert!(runs(me));
        assert!(!runs(u32::MAX >> 1));
    }

    #[test]
    fn holders_pack_their_parts() {
        let h = Holder::new(5, 77, 4242);
        assert_eq!((h.entry(), h.pid()), (Some(5), 4242));
        assert_eq!(Holder(0).entry(), None);
    }
}
