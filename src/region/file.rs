//! The file backing: a file mapped into memory, for storage that outlives the process
//! (TorchRL's `LazyMemmapStorage`) and for read-only datasets.
//!
//! A new file is created at its full length without writing it: the file system keeps
//! it sparse, so it reads as zeroes and takes disk space only as rows are written,
//! and a new buffer never sees another buffer's rows.
//!
//! Layer: algos.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::shared::{own_description, LockFile};
use super::{Backing, Region};

/// How an existing file is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Shared and writable: writes reach the file.
    Write,
    /// Private copy-on-write: the process may write its own copy of a page (counters
    /// that sampling moves), and the file never changes.
    Copy,
}

impl Region {
    /// A new file at `path` of `len` zero words, mapped shared and writable. Fails if
    /// the file exists.
    pub(crate) fn create_file(path: &Path, len: usize) -> io::Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)?;
        file.set_len(super::bytes_of(len)? as u64)?;
        Region::map_file(file, len, Access::Write)
    }

    /// The existing file at `path`, mapped as `access` says; its length must be a whole
    /// number of words.
    pub(crate) fn open_file(path: &Path, access: Access) -> io::Result<Region> {
        let file = OpenOptions::new()
            .read(true)
            .write(access == Access::Write)
            .open(path)?;
        let bytes = file.metadata()?.len();
        if bytes % 8 != 0 || bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is {bytes} bytes long, not a whole number of words",
                    path.display()
                ),
            ));
        }
        let len = usize::try_from(bytes / 8)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too large to map"))?;
        Region::map_file(file, len, access)
    }

    fn map_file(file: File, len: usize, access: Access) -> io::Result<Region> {
        let mut options = memmap2::MmapOptions::new();
        options.len(super::bytes_of(len)?);
        let map = match access {
            Access::Write => options.map_raw(&file)?,
            Access::Copy => {
                // SAFETY: memmap2 asks that nothing else change the file while it is
                // mapped, since a reference to the bytes would then change under it.
                // (1) No reference to the bytes is ever made: the region is read only
                // through atomics and the atomic row copy (`Region::words`), which
                // tolerate concurrent change. (2) The file is held under a shared lock
                // (`backing/file.rs`), so no replaybuf writer has it open. (3) A
                // change by anything else shows through pages this process has not
                // copied yet as rows whose stamps do not validate, or as damaged
                // state the readers bound by the geometry, never as undefined
                // behaviour of this process.
                let map = unsafe { options.map_copy(&file)? };
                memmap2::MmapRaw::from(map)
            }
        };
        // Its locks (`backing/file.rs`) on a description of their own, which a forked
        // child lets go of: the mapping holds `file`'s, and a child inherits the
        // mapping, so that a child (a worker forked by a trainer) kept the directory
        // "in use" after its parent died.
        let lock = LockFile::new(own_description(&file, false)?);
        Ok(Region::mapped(map, len, Backing::File { file, lock }))
    }

    /// Writes the region's dirty pages to its file (nothing for other backings).
    pub(crate) fn flush(&self) -> io::Result<()> {
        match &self.backing {
            Backing::File { file, .. } => {
                self.map.flush()?;
                file.sync_all()
            }
            _ => Ok(()),
        }
    }

    /// The file behind the region, if it has one.
    pub(crate) fn file(&self) -> Option<&File> {
        match &self.backing {
            Backing::File { file, .. } => Some(file),
            _ => None,
        }
    }

    /// The description of the file behind the region that holds its locks, if it has
    /// one: not the mapping's, which a forked child inherits.
    pub(crate) fn lock_file(&self) -> Option<&File> {
        match &self.backing {
            Backing::File { lock, .. } => Some(lock),
            _ => None,
        }
    }
}
