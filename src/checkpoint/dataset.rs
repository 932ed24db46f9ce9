//! Offline datasets (tmrl's `dataset_path`): a buffer opened from a directory to be
//! sampled, never written.

use std::path::Path;

use super::dir::{DirKind, DirMeta};
use super::error::{Kind, PersistError};
use crate::buffer::ReplayBuffer;

impl ReplayBuffer {
    /// Opens a dataset directory for sampling by any number of threads: a checkpoint
    /// written by [`dumps`](Self::dumps) (read whole into memory), or a file-backed
    /// storage's directory (mapped as a private copy: pages are read from the file as
    /// they are sampled, and the file is never changed; other processes may open it
    /// the same way at once, but not while one has it open for writing).
    pub fn open_dataset(dir: impl AsRef<Path>) -> Result<ReplayBuffer, PersistError> {
        let dir = dir.as_ref();
        match DirMeta::read(dir)?.kind {
            DirKind::Checkpoint => ReplayBuffer::load(dir),
            DirKind::Memmap => open_copy(dir),
        }
    }
}

/// A file-backed storage's directory, mapped as a private copy.
pub(crate) fn open_copy(dir: &Path) -> Result<ReplayBuffer, PersistError> {
    let meta = DirMeta::read(dir)?;
    let refused =
        |why: String| PersistError::new(dir, Kind::Corrupt(format!("its configuration: {why}")));
    let mut builder = meta
        .config
        .builder()
        .map_err(|e| refused(format!("{e:?}")))?
        .memmap(dir);
    builder.private_copy = true;
    builder.build().map_err(|e| match e.into_persist() {
        Ok(p) => p,
        Err(e) => refused(e.to_string()),
    })
}
