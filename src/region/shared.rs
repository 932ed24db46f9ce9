//! The shared-memory backing: a named POSIX shared-memory object (`shm_open`), mapped
//! shared, so that every process that maps the name sees the same words.
//!
//! Names are the caller's, prefixed with `replaybuf.` so that the regions of this
//! crate can be listed and told apart from others (`/dev/shm/replaybuf.NAME` on Linux).
//! A region is created with owner-only permissions (0600) and never replaces one that
//! exists. Nothing inside a region is a pointer: every place is an offset into its
//! words (`storage/layout.rs`), so each process may map it at another address.

use std::fs::File;
use std::io;

use rustix::fs::Mode;
use rustix::shm;

use super::{Backing, Region};

/// What every region name starts with.
pub(crate) const PREFIX: &str = "replaybuf.";

/// The shared-memory object's name for a region called `name`, or why `name` cannot
/// be one: empty, too long, or holding a `/` or a NUL.
pub(crate) fn object_name(name: &str) -> Result<String, &'static str> {
    if name.is_empty() {
        return Err("a shared region's name must not be empty");
    }
    if name.contains('/') || name.contains('\0') {
        return Err("a shared region's name must not hold '/' or NUL");
    }
    if name.len() + PREFIX.len() > 250 {
        return Err("a shared region's name must be under 240 bytes");
    }
    Ok(format!("/{PREFIX}{name}"))
}

impl Region {
    /// Creates the shared-memory object `object` of `len` zero words, owner-only, and
    /// maps it. Fails with `AlreadyExists` if the name is taken.
    pub(crate) fn create_shared(object: &str, len: usize) -> io::Result<Region> {
        let fd = shm::open(
            object,
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::RUSR | Mode::WUSR,
        )?;
        // The umask may only have narrowed the mode; make it exactly owner-only.
        rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)?;
        let file = File::from(fd);
        let made = file
            .set_len(super::bytes_of(len)? as u64)
            .and_then(|()| Region::map_shared(file, len, object));
        if made.is_err() {
            let _ = shm::unlink(object);
        }
        made
    }

    /// Maps the existing shared-memory object `object` whole. Fails with `NotFound` if
    /// there is none.
    pub(crate) fn open_shared(object: &str) -> io::Result<Region> {
        let fd = shm::open(object, shm::OFlags::RDWR, Mode::empty())?;
        let file = File::from(fd);
        let bytes = file.metadata()?.len();
        if bytes % 8 != 0 || bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the shared region is {bytes} bytes long, not a whole number of words"),
            ));
        }
        let len = usize::try_from(bytes / 8)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "region too large to map"))?;
        Region::map_shared(file, len, object)
    }

    fn map_shared(file: File, len: usize, object: &str) -> io::Result<Region> {
        let map = memmap2::MmapOptions::new()
            .len(super::bytes_of(len)?)
            .map_raw(&file)?;
        // As for the heap: huge pages where the kernel gives them to shared memory
        // (`shmem_enabled` of `advise` or `always`); best effort.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(Region::mapped(
            map,
            len,
            Backing::Shared {
                _file: file,
                object: object.to_owned(),
            },
        ))
    }

    /// The open shared-memory object behind the region, if it has one: its process
    /// table's liveness locks are taken through it (`shared/liveness.rs`).
    pub(crate) fn shared_file(&self) -> Option<&File> {
        match &self.backing {
            Backing::Shared { _file: file, .. } => Some(file),
            _ => None,
        }
    }

    /// The shared-memory object behind the region, if it has one.
    pub(crate) fn shared_object(&self) -> Option<&str> {
        match &self.backing {
            Backing::Shared { object, .. } => Some(object),
            _ => None,
        }
    }
}

/// Removes the name `object` (processes that mapped it keep their mapping).
pub(crate) fn unlink(object: &str) -> io::Result<()> {
    shm::unlink(object).map_err(io::Error::from)
}

/// The names of this crate's shared regions on this machine (Linux lists them under
/// `/dev/shm`; elsewhere the list is empty).
pub(crate) fn list() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_prefix(PREFIX).map(str::to_owned))
        .collect();
    names.sort();
    names
}
