//! Where a storage's region lives, and how it is opened: anonymous memory (the
//! storage's own default, `region/heap.rs`), a file in a directory (`file.rs`, with
//! the directory's metadata in `dir.rs`), or a named shared-memory object
//! (`shm.rs`). Each opens or creates the region, checks what it finds against the
//! configuration, and hands back a storage over it.
//!
//! Layer: core.

pub(crate) mod dir;
pub(crate) mod file;
#[cfg(not(replaybuf_loom))]
pub(crate) mod shm;
