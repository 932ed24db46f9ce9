//! Checkpoints and offline datasets: `dumps` / `load` of a buffer (`dump.rs`,
//! `load.rs`), of a list buffer (`list.rs`), datasets opened read-only from a
//! directory (`dataset.rs`), and `inspect`. File-backed storage itself is a backing
//! (`backing/file.rs`).
//!
//! Layer: api.

pub(crate) mod dataset;
pub(crate) mod dump;
pub(crate) mod epochs;
pub(crate) mod inspect;
pub(crate) mod list;
pub(crate) mod load;
