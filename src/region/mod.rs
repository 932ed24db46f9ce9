//! One contiguous, zero-initialised, word-aligned byte region that holds a storage's
//! stamps and rows, seen as a slice of atomic words.
//!
//! Every backing gives the same thing: memory that reads as zero until written, that
//! only atomic word operations and the crate's atomic row copy (`storage::atomic_copy`)
//! ever touch, and that lives as long as the `Region`. The algorithms above it do not
//! know which backing they run on. The heap backing is the one loom checks: under
//! `replaybuf_loom` it is a boxed slice of loom atomics instead of a mapping.

mod heap;

pub(crate) use heap::Region;
