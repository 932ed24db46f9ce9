//! Persistence: file-backed storage, checkpoints, offline datasets.

pub(crate) mod dataset;
pub(crate) mod dir;
pub(crate) mod dump;
pub(crate) mod epochs;
pub(crate) mod hooks;
pub(crate) mod inspect;
pub(crate) mod list;
pub(crate) mod load;
pub(crate) mod memmap;
