//! [`PersistError`]: why a buffer could not be saved, loaded, or opened from disk or
//! shared memory. It always names the file (or region) and the problem.
//!
//! Layer: base.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Why a checkpoint, a file-backed storage or a shared region could not be used.
///
/// Nothing changed when this is returned: a failed `save` leaves the previous
/// checkpoint in place, a failed `restore` leaves the buffer as it was.
#[derive(Debug)]
pub struct PersistError {
    path: PathBuf,
    kind: PersistKind,
    source: Option<io::Error>,
}

#[derive(Debug)]
#[cfg_attr(replaybuf_loom, allow(dead_code))] // no files under loom
pub(crate) enum PersistKind {
    /// Reading, writing or mapping failed (see `source`).
    Io,
    /// The directory or region already holds a buffer and `existsok` was not given.
    Exists,
    /// There is no buffer there.
    Missing,
    /// Another process holds the storage.
    InUse,
    /// A shared region that is not the caller's alone: owned by another uid than the
    /// caller's effective one (`me`), or with group or other permission bits set. It
    /// was not mapped.
    Foreign { owner: u32, mode: u32, me: u32 },
    /// Not a replaybuf checkpoint or region.
    NotOurs(String),
    /// Another format version.
    Version { found: u64, expected: u64 },
    /// Shorter or longer than its metadata says.
    Length { expected: u64, found: u64 },
    /// Its checksum does not match.
    Checksum { expected: u64, found: u64 },
    /// Damaged or inconsistent contents.
    Corrupt(String),
    /// A buffer of another layout (spec, capacity, shards, sampler).
    Mismatch(String),
    /// The buffer has other handles (or processes) that a load would pull the rows
    /// from under.
    Busy(&'static str),
    /// The operation does not apply to this buffer.
    Unsupported(&'static str),
    /// The options given do not fit this buffer (a compact format over fields it lacks).
    Options(String),
    /// A save or load hook failed.
    Hook(String),
}

impl PersistError {
    pub(crate) fn new(path: impl AsRef<Path>, kind: PersistKind) -> PersistError {
        PersistError {
            path: path.as_ref().to_path_buf(),
            kind,
            source: None,
        }
    }

    pub(crate) fn io(path: impl AsRef<Path>, source: io::Error) -> PersistError {
        PersistError {
            path: path.as_ref().to_path_buf(),
            kind: PersistKind::Io,
            source: Some(source),
        }
    }

    /// The file, directory or region the problem is in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a buffer already existed where a new one was to be created.
    pub fn is_exists(&self) -> bool {
        matches!(self.kind, PersistKind::Exists)
    }

    /// Whether the stored buffer has another layout than the one asked for (spec,
    /// capacity, shards, ndim, sampler or priority key).
    pub fn is_mismatch(&self) -> bool {
        matches!(self.kind, PersistKind::Mismatch(_))
    }

    /// Whether the data is damaged: truncated, failing its checksum, or inconsistent.
    pub fn is_corrupt(&self) -> bool {
        matches!(
            self.kind,
            PersistKind::Length { .. }
                | PersistKind::Checksum { .. }
                | PersistKind::Corrupt(_)
                | PersistKind::NotOurs(_)
        )
    }

    /// Whether the data is of another format version.
    pub fn is_version(&self) -> bool {
        matches!(self.kind, PersistKind::Version { .. })
    }

    /// Whether nothing was there to open.
    pub fn is_missing(&self) -> bool {
        matches!(self.kind, PersistKind::Missing)
    }

    /// Whether another buffer, in this process or another, holds the storage.
    pub fn is_in_use(&self) -> bool {
        matches!(self.kind, PersistKind::InUse)
    }

    /// Whether a shared region was refused, unread, because it is not this user's
    /// alone: another user owns it, or its mode lets group or others open it (anyone
    /// who can write it could change the rows or truncate it under the buffer).
    pub fn is_foreign(&self) -> bool {
        matches!(self.kind, PersistKind::Foreign { .. })
    }
}

impl fmt::Display for PersistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.path.display();
        match &self.kind {
            PersistKind::Io => write!(f, "{p}: I/O failed"),
            PersistKind::Exists => write!(
                f,
                "{p} already holds a buffer; set existsok to open it (Rust: \
                 `.existsok(true)`, Python: `existsok=True`), or choose another place"
            ),
            PersistKind::Missing => write!(f, "{p}: no buffer there"),
            PersistKind::InUse => write!(
                f,
                "{p} is open for writing by another buffer (in this process or another): \
                 close that one first"
            ),
            PersistKind::Foreign { owner, mode, me } if owner != me => write!(
                f,
                "{p} is owned by uid {owner} (mode {mode:04o}), not by this user (uid \
                 {me}): a shared region is opened only by its owner, since whoever owns \
                 it can change or truncate it under the buffer. It was not opened; choose \
                 another name, or have it removed (`replaybuf shm remove`, as its owner \
                 or root)"
            ),
            PersistKind::Foreign { owner, mode, .. } => write!(
                f,
                "{p} (owned by uid {owner}) has mode {mode:04o}: group or others may \
                 open it, and could read, change or truncate the buffer. It was not \
                 opened; if it is yours, `chmod 600` it, else remove it (`replaybuf shm \
                 remove`) or choose another name"
            ),
            PersistKind::NotOurs(why) => write!(f, "{p}: not a replaybuf buffer: {why}"),
            PersistKind::Version { found, expected } => write!(
                f,
                "{p}: format version {found}, but this build reads version {expected}"
            ),
            PersistKind::Length { expected, found } => write!(
                f,
                "{p}: {found} bytes, but the checkpoint says {expected} (truncated or \
                 overwritten)"
            ),
            PersistKind::Checksum { expected, found } => write!(
                f,
                "{p}: checksum {found:016x} does not match the recorded {expected:016x} \
                 (the file is damaged)"
            ),
            PersistKind::Corrupt(why) => write!(f, "{p}: damaged: {why}"),
            PersistKind::Mismatch(what) => write!(f, "{p}: a buffer of another layout ({what})"),
            PersistKind::Busy(why) => write!(f, "{p}: {why}"),
            PersistKind::Unsupported(why) => write!(f, "{p}: {why}"),
            PersistKind::Options(why) => write!(f, "{p}: {why}"),
            PersistKind::Hook(why) => write!(f, "{p}: a hook failed: {why}"),
        }
    }
}

impl std::error::Error for PersistError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// `path` attached to an I/O error.
pub(crate) trait IoAt<T> {
    fn at(self, path: &Path) -> Result<T, PersistError>;
}

impl<T> IoAt<T> for io::Result<T> {
    fn at(self, path: &Path) -> Result<T, PersistError> {
        self.map_err(|e| PersistError::io(path, e))
    }
}
