//! The shared-memory backing: a named POSIX shared-memory object (`shm_open`), mapped
//! shared, so that every process that maps the name sees the same words.
//!
//! Names are the caller's, prefixed with `replaybuf.` so that the regions of this
//! crate can be listed and told apart from others (`/dev/shm/replaybuf.NAME` on Linux).
//! A region is created with owner-only permissions (0600) and never replaces one that
//! exists. Nothing inside a region is a pointer: every place is an offset into its
//! words (`storage/layout.rs`), so each process may map it at another address.
//!
//! # Ownership
//!
//! The names live in one directory every local user can create in, so a name may be
//! taken by someone else before its buffer is made. An existing object is mapped only
//! if it is the caller's alone: owned by the effective user and with none of the
//! group or other permission bits (`0o077`). Anything else is refused
//! ([`OpenError::Foreign`]) before a word of it is read: another user who can write
//! it could poison its rows or truncate it under us (a `SIGBUS`). The check is made
//! with `fstat` on the descriptor that is then mapped, so there is no window between
//! the check and the open for the name to be swapped; and the open never follows a
//! symbolic link (a link under a region's name is refused as foreign).
//!
//! A creator removes its region's name when it goes, but only if the name still
//! names the object it made ([`ObjectId`], [`unlink_if_same`]): after the name was
//! removed and given to a newer region, the old creator leaves that one alone.
//!
//! Layer: algos.

use std::fs::File;
use std::io;
use std::sync::atomic::Ordering as AtomicOrdering;

use rustix::fs::{Mode, Stat};
use rustix::shm;

use super::{Backing, Region};

/// What every region name starts with.
pub(crate) const PREFIX: &str = "replaybuf.";

/// Permission bits that let anyone but the owner in: a region has none of them.
const GROUP_OTHER_BITS: u32 = 0o077;

/// Which object a name stood for: its device and inode, as `fstat` gives them. A name
/// removed and made again stands for another object, of another inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObjectId {
    dev: u64,
    ino: u64,
}

impl ObjectId {
    // The types of `stat`'s fields differ between targets; the casts are for those
    // where they are not `u64`.
    #[allow(clippy::unnecessary_cast)]
    fn of(stat: &Stat) -> ObjectId {
        ObjectId {
            dev: stat.st_dev as u64,
            ino: stat.st_ino as u64,
        }
    }
}

/// An existing object that is not the caller's alone: what was found, and who asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Foreign {
    /// The uid that owns the object.
    pub(crate) owner: u32,
    /// Its permission bits (`0o7777` at most).
    pub(crate) mode: u32,
    /// The caller's effective uid.
    pub(crate) me: u32,
}

impl Foreign {
    /// `Some` if the object `stat` describes is not the caller's alone.
    #[allow(clippy::unnecessary_cast)] // `st_mode` is not `u32` on every target
    fn of(stat: &Stat) -> Option<Foreign> {
        let found = Foreign {
            owner: stat.st_uid,
            mode: stat.st_mode as u32 & 0o7777,
            me: rustix::process::geteuid().as_raw(),
        };
        (found.owner != found.me || found.mode & GROUP_OTHER_BITS != 0).then_some(found)
    }
}

/// Why an existing shared-memory object was not mapped.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Opening, sizing or mapping it failed: `NotFound` if there is none,
    /// `InvalidData` if it is not a whole number of words long.
    Io(io::Error),
    /// It is not the caller's alone, and was not mapped.
    Foreign(Foreign),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> OpenError {
        OpenError::Io(e)
    }
}

impl From<rustix::io::Errno> for OpenError {
    fn from(e: rustix::io::Errno) -> OpenError {
        OpenError::Io(e.into())
    }
}

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

/// An open shared-memory object whose open file description carries this process's
/// liveness locks (`shared/liveness.rs`), kept from forked children: a child's copy of
/// the descriptor is pointed at `/dev/null` as the child starts (`pthread_atfork`),
/// so that the locks live through the parent alone and its death shows while a child
/// it forked (an environment worker, say) lives on. It kept a killed collector
/// "alive", and a save waiting on its rows, for as long as the child ran. The
/// description is one of its own, not the mapping's: a mapping holds its description
/// too, and a child inherits the mapping. A child uses a shared buffer by attaching to
/// it anew (the Python face does so on its first call); the handle it inherited can no
/// longer lock, and is refused a writer.
#[derive(Debug)]
pub(crate) struct LockFile(File);

/// The descriptors of every [`LockFile`] open (-1: a free slot). Past [`FORK_SLOTS`]
/// at once, a child keeps its copy of the rest, as before.
static HELD_FDS: [std::sync::atomic::AtomicI32; FORK_SLOTS] =
    [const { std::sync::atomic::AtomicI32::new(-1) }; FORK_SLOTS];
const FORK_SLOTS: usize = 256;

impl LockFile {
    /// `file`, whose descriptor a child forked from now on has pointed at `/dev/null`.
    /// The file's own description holds its locks, so it must be one nothing else
    /// holds (no mapping: [`own_description`]).
    pub(crate) fn new(file: File) -> LockFile {
        use std::os::fd::AsRawFd;
        static AT_FORK: std::sync::Once = std::sync::Once::new();
        // SAFETY: `in_child` is an `extern "C"` function that lives for the whole
        // process and does only what a freshly forked child may (see it).
        AT_FORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
        let fd = file.as_raw_fd();
        let _ = HELD_FDS.iter().find(|slot| {
            slot.compare_exchange(-1, fd, AtomicOrdering::AcqRel, AtomicOrdering::Relaxed)
                .is_ok()
        });
        LockFile(file)
    }
}

impl std::ops::Deref for LockFile {
    type Target = File;

    fn deref(&self) -> &File {
        &self.0
    }
}

impl Drop for LockFile {
    /// Forgets the descriptor before it closes: its number may name another file next.
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        let fd = self.0.as_raw_fd();
        let _ = HELD_FDS.iter().find(|slot| {
            slot.compare_exchange(fd, -1, AtomicOrdering::AcqRel, AtomicOrdering::Relaxed)
                .is_ok()
        });
    }
}

/// A second open file description of `file`'s object (opened again through
/// `/proc/self/fd`, writable if `write`), for locks alone; where there is no `/proc`,
/// a descriptor of `file`'s own description (a forked child then keeps the locks, as
/// it holds the mapping of that description).
pub(crate) fn own_description(file: &File, write: bool) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let id = ObjectId::of(&rustix::fs::fstat(file)?);
    let again = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()));
    match again {
        Ok(again) if ObjectId::of(&rustix::fs::fstat(&again)?) == id => Ok(again),
        _ => file.try_clone(),
    }
}

/// The fork handler of a child: points its copy of every [`LockFile`]'s descriptor
/// at `/dev/null` (`dup2` replaces it in one step, so the number stays open for the
/// `File` that owns it). Only async-signal-safe calls: `open`, `dup2`, `close`.
extern "C" fn in_child() {
    // SAFETY: a NUL-terminated path; the descriptors are this process's own.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null < 0 {
            return;
        }
        for slot in &HELD_FDS {
            let fd = slot.load(AtomicOrdering::Acquire);
            if fd >= 0 {
                libc::dup2(null, fd);
            }
        }
        libc::close(null);
    }
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
        let made = (|| {
            // The umask may only have narrowed the mode; make it exactly owner-only.
            rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)?;
            let id = ObjectId::of(&rustix::fs::fstat(&fd)?);
            let file = File::from(fd);
            file.set_len(super::bytes_of(len)? as u64)?;
            Region::map_shared(file, len, object, id)
        })();
        if made.is_err() {
            // The name was made exclusively a moment ago, and no buffer was laid out in
            // it: nobody can have used it yet.
            let _ = shm::unlink(object);
        }
        made
    }

    /// Maps the existing shared-memory object `object` whole, if it is the caller's
    /// alone (see the module's `# Ownership`). Fails with `NotFound` if there is none.
    pub(crate) fn open_shared(object: &str) -> Result<Region, OpenError> {
        let fd = match shm::open(object, shm::OFlags::RDWR | no_follow(), Mode::empty()) {
            Ok(fd) => fd,
            Err(e @ (rustix::io::Errno::ACCESS | rustix::io::Errno::LOOP)) => {
                return Err(refused_by_path(object, e))
            }
            Err(e) => return Err(e.into()),
        };
        // The object as this descriptor holds it: swapping the name afterwards
        // changes nothing of what is checked and mapped.
        let stat = rustix::fs::fstat(&fd)?;
        if let Some(foreign) = Foreign::of(&stat) {
            return Err(OpenError::Foreign(foreign));
        }
        let bytes = u64::try_from(stat.st_size).unwrap_or(0);
        if bytes == 0 {
            // Made (`O_EXCL`) but not yet sized: its creator is on its way, and an
            // attacher waits for it as for the header (`WouldBlock`).
            return Err(OpenError::Io(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the shared region is not sized yet",
            )));
        }
        if bytes % 8 != 0 {
            return Err(OpenError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the shared region is {bytes} bytes long, not a whole number of words"),
            )));
        }
        let len = usize::try_from(bytes / 8)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "region too large to map"))?;
        Ok(Region::map_shared(
            File::from(fd),
            len,
            object,
            ObjectId::of(&stat),
        )?)
    }

    fn map_shared(file: File, len: usize, object: &str, id: ObjectId) -> io::Result<Region> {
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
                lock: LockFile::new(own_description(&file, true)?),
                _file: file,
                object: object.to_owned(),
                id,
            },
        ))
    }

    /// The open shared-memory object behind the region, if it has one: its process
    /// table's liveness locks are taken through it (`shared/liveness.rs`).
    pub(crate) fn shared_file(&self) -> Option<&File> {
        match &self.backing {
            Backing::Shared { lock, .. } => Some(lock),
            _ => None,
        }
    }

    /// The shared-memory object behind the region, if it has one: its name, and the
    /// object the name stood for when it was created or opened.
    pub(crate) fn shared_object(&self) -> Option<(&str, ObjectId)> {
        match &self.backing {
            Backing::Shared { object, id, .. } => Some((object, *id)),
            _ => None,
        }
    }
}

/// Removes the name `object` (processes that mapped it keep their mapping).
pub(crate) fn unlink(object: &str) -> io::Result<()> {
    shm::unlink(object).map_err(io::Error::from)
}

/// The flag that keeps an open of an existing object off symbolic links. glibc's
/// `shm_open` adds `O_NOFOLLOW` itself, but rustix opens `/dev/shm/NAME` directly on
/// Linux and does not: without it, a link another user plants under a region's name
/// would be followed to whatever it points at, and the owner check would see that.
fn no_follow() -> shm::OFlags {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    return shm::OFlags::from_bits_retain(rustix::fs::OFlags::NOFOLLOW.bits());
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    shm::OFlags::empty()
}

/// The refusal of an object that could not be opened at all (`denied`: no permission,
/// or a symbolic link): `Foreign` if its owner and mode, read by path (Linux's
/// `/dev/shm`, the link itself rather than what it points at), say it is not the
/// caller's alone (only to say so: nothing is opened by that path), else `denied`.
fn refused_by_path(object: &str, denied: rustix::io::Errno) -> OpenError {
    match rustix::fs::lstat(format!("/dev/shm{object}")) {
        Ok(stat) => Foreign::of(&stat).map_or(OpenError::Io(denied.into()), OpenError::Foreign),
        Err(_) => OpenError::Io(denied.into()),
    }
}

/// Removes the name `object` if it still stands for the object `id`; whether it did.
/// A creator's region goes this way, so that a creator whose name was removed and
/// given to a newer region leaves the newer one alone. The caller still maps the
/// object `id`, so its inode is alive and no newer object can have its number.
///
/// A race remains: another process may remove the name and make it again between the
/// check here and the unlink. `shm_unlink` takes a name, never an inode, so it cannot
/// be closed from here; the window is two system calls wide, where without the check
/// it was the old creator's whole remaining life.
pub(crate) fn unlink_if_same(object: &str, id: ObjectId) -> io::Result<bool> {
    let fd = match shm::open(object, shm::OFlags::RDONLY | no_follow(), Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if ObjectId::of(&rustix::fs::fstat(&fd)?) != id {
        return Ok(false);
    }
    match shm::unlink(object) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
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
