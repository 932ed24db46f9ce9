//! Offline datasets (tmrl's `dataset_path`): a buffer opened from a directory to be
//! sampled, never written.
//!
//! Layer: api.

use std::path::Path;

use crate::backing::dir::{DirKind, DirMeta};
use crate::buffer::ReplayBuffer;
use crate::builder::ReplayBufferBuilder;
use crate::error::persist::{PersistError, PersistKind};
use crate::policy::WritePolicy;

impl ReplayBuffer {
    /// Opens a dataset directory (tmrl's `dataset_path`) for sampling by any number of
    /// threads, read-only: its write policy is
    /// [`Immutable`](crate::WritePolicy::Immutable), so every write is refused. The
    /// directory is a checkpoint written by [`save`](Self::save) (read whole into
    /// memory), or a file-backed storage's (mapped as a private copy: pages are read
    /// from the file as they are sampled, and the file never changes; other processes
    /// may open it the same way at once, but not while one has it open for writing).
    pub fn open_dataset(dir: impl AsRef<Path>) -> Result<ReplayBuffer, PersistError> {
        let dir = dir.as_ref();
        match DirMeta::read(dir)?.kind {
            DirKind::Checkpoint => {
                super::load::load_built(dir, |b, _| b.write_policy(WritePolicy::Immutable))
            }
            DirKind::Memmap => open_copy(dir),
        }
    }
}

/// The buffer a directory holds, to go on writing: a checkpoint loaded into memory, or
/// a file-backed storage reopened in place. Its draws go on from the directory's
/// seed, or from `seed`'s.
pub(crate) fn open_writable(dir: &Path, seed: Option<u64>) -> Result<ReplayBuffer, PersistError> {
    let meta = DirMeta::read(dir)?;
    let seeded = |b: ReplayBufferBuilder| match seed {
        Some(seed) => b.seed(seed),
        None => b,
    };
    match meta.kind {
        DirKind::Checkpoint => super::load::load_built(dir, |b, limit| {
            let b = seeded(b);
            match limit {
                Some(limit) => b.rate_limit(limit),
                None => b,
            }
        }),
        DirKind::Memmap => {
            let refused = |why: String| {
                PersistError::new(
                    dir,
                    PersistKind::Corrupt(format!("its configuration: {why}")),
                )
            };
            seeded(
                ReplayBufferBuilder::from_config(&meta.config)
                    .map_err(|e| refused(format!("{e:?}")))?,
            )
            .memmap(dir)
            .existsok(true)
            .build()
            .map_err(|e| match e.into_persist() {
                Ok(p) => p,
                Err(e) => refused(e.to_string()),
            })
        }
    }
}

/// A file-backed storage's directory, mapped as a private copy.
pub(crate) fn open_copy(dir: &Path) -> Result<ReplayBuffer, PersistError> {
    let meta = DirMeta::read(dir)?;
    let refused = |why: String| {
        PersistError::new(
            dir,
            PersistKind::Corrupt(format!("its configuration: {why}")),
        )
    };
    let mut builder = ReplayBufferBuilder::from_config(&meta.config)
        .map_err(|e| refused(format!("{e:?}")))?
        .memmap(dir)
        .write_policy(WritePolicy::Immutable);
    builder.private_copy = true;
    builder.build().map_err(|e| match e.into_persist() {
        Ok(p) => p,
        Err(e) => refused(e.to_string()),
    })
}
