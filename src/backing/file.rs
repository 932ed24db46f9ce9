//! File-backed storage (TorchRL's `LazyMemmapStorage`): the region is `storage.bin`
//! under a directory, mapped into memory, and `meta.json` beside it records the
//! configuration. Rows, stamps, cursors, trees and lanes all live in the region, so a
//! buffer reopened from its directory comes back with its contents.
//!
//! - A directory that already holds a buffer is refused unless the caller asks to
//!   reopen it (`existsok`); then its configuration must lay out the same region.
//! - A new buffer's file is created afresh (any leftover of an unfinished creation is
//!   replaced), so it never shows another buffer's rows.
//! - The file is locked while open: a second process cannot map it (an offline
//!   dataset maps it read-only, under a shared lock).
//! - A buffer reopened after its process died is recovered (`storage/recover.rs`).
//!
//! Layer: core.

use std::path::Path;

use crate::config::Config;
use crate::error::persist::PersistError;
use crate::storage::{Storage, StorageParts};
#[cfg(not(replaybuf_loom))]
use {
    super::dir::{DirKind, DirMeta, META, STORAGE},
    crate::error::persist::{IoAt, PersistKind},
    crate::region::{Access, Region},
    crate::storage::layout::{self, HeaderProblem},
    std::fs::{self, TryLockError},
    std::sync::Arc,
};

/// Under loom there are no files: every region is a boxed slice of model atomics.
#[cfg(replaybuf_loom)]
pub(crate) fn open(
    dir: &Path,
    _: &Config,
    _: bool,
    _: impl FnOnce(usize) -> std::io::Result<StorageParts>,
) -> Result<OpenedFile, PersistError> {
    Err(PersistError::new(
        dir,
        crate::error::persist::PersistKind::Unsupported(
            "file-backed storage is not built under loom",
        ),
    ))
}

/// Under loom there are no files (see [`open`]).
#[cfg(replaybuf_loom)]
pub(crate) fn open_copy(
    dir: &Path,
    config: &Config,
    parts: impl FnOnce(usize) -> std::io::Result<StorageParts>,
) -> Result<OpenedFile, PersistError> {
    open(dir, config, false, parts)
}

/// A file-backed storage, whether it was created now, and its seed (the one it was
/// created with, for a reopened storage).
pub(crate) struct OpenedFile {
    pub(crate) storage: Storage,
    pub(crate) fresh: bool,
    pub(crate) seed: u64,
}

#[cfg(not(replaybuf_loom))]
/// Opens the file-backed storage of `config` under `dir`, creating it unless one is
/// there (then reopening it if `existsok`). `parts` lays the storage out, given the
/// bytes of meta the region must hold.
pub(crate) fn open(
    dir: &Path,
    config: &Config,
    existsok: bool,
    parts: impl FnOnce(usize) -> std::io::Result<StorageParts>,
) -> Result<OpenedFile, PersistError> {
    fs::create_dir_all(dir).at(dir)?;
    match DirMeta::read(dir) {
        Ok(found) => {
            if !existsok {
                return Err(PersistError::new(dir, PersistKind::Exists));
            }
            reopen(dir, config, &found, parts, Access::Write).map(|storage| OpenedFile {
                storage,
                fresh: false,
                seed: found.config.seed,
            })
        }
        Err(e) if e.is_missing() => {
            let meta_json = serde_json::to_vec(&DirMeta::new(DirKind::Memmap, config.clone()))
                .expect("a meta always serialises");
            let parts = parts(meta_json.len()).at(dir)?;
            create(dir, config, &meta_json, parts).map(|storage| OpenedFile {
                storage,
                fresh: true,
                seed: config.seed,
            })
        }
        Err(e) => Err(e),
    }
}

#[cfg(not(replaybuf_loom))]
/// Maps the storage under `dir` as a private copy (an offline dataset, an inspection):
/// the process may change its pages (recovery, the counters sampling moves) but the
/// file never changes, and any number of processes may do this at once, though none
/// while a process has the storage open for writing.
pub(crate) fn open_copy(
    dir: &Path,
    config: &Config,
    parts: impl FnOnce(usize) -> std::io::Result<StorageParts>,
) -> Result<OpenedFile, PersistError> {
    let found = DirMeta::read(dir)?;
    reopen(dir, config, &found, parts, Access::Copy).map(|storage| OpenedFile {
        storage,
        fresh: false,
        seed: found.config.seed,
    })
}

#[cfg(not(replaybuf_loom))]
/// Maps the storage of a directory whose `meta.json` is `found`, checking it holds a
/// region of `config`'s layout. `parts` lays it out given the bytes of meta its header
/// records: the blocks after the meta start where its creator put them, whatever the
/// length of the meta `config` would write now (another seed's digits, a field a
/// later version adds).
pub(crate) fn reopen(
    dir: &Path,
    config: &Config,
    found: &DirMeta,
    parts: impl FnOnce(usize) -> std::io::Result<StorageParts>,
    access: Access,
) -> Result<Storage, PersistError> {
    if found.kind != DirKind::Memmap {
        return Err(PersistError::new(
            dir,
            PersistKind::Unsupported(
                "this directory holds a checkpoint written by `save`; load it with \
                 `ReplayBuffer::from_checkpoint` or `restore`",
            ),
        ));
    }
    if let Some(what) = config.layout_difference(&found.config) {
        return Err(PersistError::new(dir, PersistKind::Mismatch(what)));
    }
    let path = dir.join(STORAGE);
    let region = match Region::open_file(&path, access) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(PersistError::new(&path, PersistKind::Missing))
        }
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(PersistError::new(
                &path,
                PersistKind::Corrupt(e.to_string()),
            ))
        }
        Err(e) => return Err(PersistError::io(&path, e)),
    };
    lock(&region, &path, access)?;
    let info = layout::read_header(region.words()).map_err(|p| header_error(&path, p))?;
    if info.restoring {
        return Err(PersistError::new(
            &path,
            PersistKind::Corrupt(INTERRUPTED_RESTORE.to_owned()),
        ));
    }
    if info.layout_hash != found.layout_hash {
        return Err(PersistError::new(
            &path,
            PersistKind::Corrupt(format!(
                "its layout hash {:016x} is not the one {META} records ({:016x})",
                info.layout_hash, found.layout_hash
            )),
        ));
    }
    let parts = parts(info.meta.len()).at(dir)?;
    if info.words != parts.layout.words as u64 {
        return Err(PersistError::new(
            &path,
            PersistKind::Length {
                expected: parts.layout.words as u64 * 8,
                found: info.words * 8,
            },
        ));
    }
    Ok(parts.into_storage(Arc::new(region)))
}

#[cfg(not(replaybuf_loom))]
/// Creates a new file-backed storage: the region first, then `meta.json`, which
/// makes it a buffer.
fn create(
    dir: &Path,
    config: &Config,
    meta_json: &[u8],
    parts: StorageParts,
) -> Result<Storage, PersistError> {
    let path = dir.join(STORAGE);
    // Left by a creation that never wrote its meta: not a buffer, replace it.
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(PersistError::io(&path, e)),
    }
    let region = Region::create_file(&path, parts.layout.words).at(&path)?;
    lock(&region, &path, Access::Write)?;
    layout::write_header(
        region.words(),
        &parts.layout,
        config.layout_hash(),
        meta_json,
    );
    region.flush().at(&path)?;
    let storage = parts.into_storage(Arc::new(region));
    DirMeta::new(DirKind::Memmap, config.clone()).write(dir)?;
    Ok(storage)
}

#[cfg(not(replaybuf_loom))]
/// Locks the region's file for as long as it is open: exclusively to write it, shared
/// to read a copy of it.
fn lock(region: &Region, path: &Path, access: Access) -> Result<(), PersistError> {
    let file = region
        .lock_file()
        .expect("replaybuf internal error: a file region without its file");
    let locked = match access {
        Access::Write => file.try_lock(),
        Access::Copy => file.try_lock_shared(),
    };
    match locked {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(PersistError::new(path, PersistKind::InUse)),
        Err(TryLockError::Error(e)) => Err(PersistError::io(path, e)),
    }
}

/// Why a region whose restore never finished is refused.
#[cfg(not(replaybuf_loom))]
pub(crate) const INTERRUPTED_RESTORE: &str = "a restore of a checkpoint into it began and \
    never finished (its process died, or the restore failed): its rows are part the \
    checkpoint's, part the ones before, some torn. Remove it (a shared region: `replaybuf \
    shm remove NAME`), and restore the checkpoint into a new buffer";

#[cfg(not(replaybuf_loom))]
/// A header problem as a persistence error.
pub(crate) fn header_error(path: &Path, problem: HeaderProblem) -> PersistError {
    match problem {
        HeaderProblem::Version { found } => PersistError::new(
            path,
            PersistKind::Version {
                found,
                expected: layout::FORMAT_VERSION,
            },
        ),
        HeaderProblem::Magic { .. } => {
            PersistError::new(path, PersistKind::NotOurs(problem.to_string()))
        }
        other => PersistError::new(path, PersistKind::Corrupt(other.to_string())),
    }
}
