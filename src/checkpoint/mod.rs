//! Checkpoints: a buffer's whole state saved to a directory and loaded back.

pub(crate) mod meta;
