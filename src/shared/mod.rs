//! Shared mode: one buffer mapped by several processes at once, over named shared
//! memory.
//!
//! The region is the buffer (`storage/layout.rs`): header, configuration, cursors,
//! stamps, rows and trees, laid out by offsets only, so collector processes extend
//! while learner processes sample and update priorities with exactly the algorithms
//! of one process. What shared mode adds is for processes that die:
//!
//! - a process table (`procs.rs`) in the region: every process that maps it holds an
//!   entry and keeps a lock on the entry's byte of the region's file, which the kernel
//!   releases when the process dies (`liveness.rs`): that is how the others tell it
//!   still runs, whatever PID namespace each is in;
//! - writer leases: only one process appends to a shard, so everything a writer can
//!   leave half done belongs to its lease holder. When a process takes over the lease
//!   of a dead one (`storage/member.rs`), it repairs the shard first
//!   (`Storage::recover_shard`): the dead writer's occupancy units go, the rows it
//!   claimed become abandoned (readers skip them; the next lap's writer takes their
//!   slots over), the trajectory tables of its lanes are closed, and the tree leaves of
//!   rows it never published are emptied;
//! - freezes (checkpoints) name their process, so a freeze whose process died is
//!   lifted by the writers waiting on it.
//!
//! A learner holds nothing a writer waits for: a dead learner blocks nobody (a rate
//! limit's inserts wait for samples, as they would for a learner that stopped, until
//! their timeout).
//!
//! Each process keeps its own random streams' positions only in the region's shared
//! counters, and its own without-replacement epochs.
//!
//! Layer: api.

#[cfg(not(replaybuf_loom))]
pub(crate) mod liveness;
pub(crate) mod procs;
#[cfg(not(replaybuf_loom))]
mod regions;

#[cfg(not(replaybuf_loom))]
pub use regions::{list, remove, RegionInfo, RECENT};
