//! Checkpoints and offline datasets: `save`, `from_checkpoint` and `restore` of a buffer (`dump.rs`,
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

pub use crate::hooks::HookResult;
pub use dump::{ProgressFn, SaveOptions};
pub use inspect::{inspect, Inspection};
