//! Liveness of a shared region's processes, from the kernel: each process-table entry
//! has a byte of the region's file that its holder keeps locked with an
//! open-file-description (OFD) lock for as long as it holds the entry.
//!
//! The kernel ties an OFD lock to the open file description, not to a pid: it is
//! released when the last descriptor of that description closes, which a process that
//! dies does whatever killed it; and it is seen by every process that maps the same
//! object, whatever PID namespace each lives in. A pid and `/proc` start time, which
//! this replaced, name another process (or none) across namespaces: two containers
//! sharing `/dev/shm` took each other for dead.
//!
//! The byte of entry `e` is byte `e` of the file (a lock is advisory: it changes
//! nothing about the mapping). A process locks the byte *before* it claims the entry
//! and unlocks it *after* giving the entry back, so an entry whose byte nobody locks
//! has no live holder. A lock held through this process's own descriptor is not
//! reported by `F_OFD_GETLK` (no lock conflicts with its own description): the table
//! remembers which entries it locked (`ProcTable`).
//!
//! A child that a holder `fork`s would inherit the description, and with it the lock,
//! keeping its parent alive for as long as it ran: the locks are taken through a
//! description of their own, which a child's copy of lets go of as it starts
//! (`region/shared.rs`, `LockFile`).
//!
//! Layer: algos.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// A one-byte lock request on byte `at`.
fn request(kind: libc::c_short, at: usize) -> libc::flock {
    // SAFETY: `flock` is a plain C struct of integers: all zeroes is a valid value
    // (and the value `F_OFD_*` requires for `l_pid`).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = at as libc::off_t;
    lock.l_len = 1;
    lock
}

fn fcntl(file: &File, cmd: libc::c_int, lock: &mut libc::flock) -> io::Result<()> {
    // SAFETY: the descriptor is open for as long as `file` is borrowed, and `lock` is
    // a valid `flock` the call may write (`F_OFD_GETLK`) for its duration.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, lock as *mut libc::flock) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Locks byte `at` through `file`'s description without waiting. `Ok(false)` if
/// another description holds it.
pub(crate) fn try_lock(file: &File, at: usize) -> io::Result<bool> {
    match fcntl(
        file,
        libc::F_OFD_SETLK,
        &mut request(libc::F_WRLCK as _, at),
    ) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Unlocks byte `at` of `file`'s description.
pub(crate) fn unlock(file: &File, at: usize) {
    let _ = fcntl(
        file,
        libc::F_OFD_SETLK,
        &mut request(libc::F_UNLCK as _, at),
    );
}

/// Whether another open file description holds a lock on byte `at`. An error (none
/// expected on a shared-memory object) answers yes: a holder is never taken for dead
/// on a doubt.
pub(crate) fn locked_elsewhere(file: &File, at: usize) -> bool {
    let mut lock = request(libc::F_WRLCK as _, at);
    match fcntl(file, libc::F_OFD_GETLK, &mut lock) {
        Ok(()) => lock.l_type != libc::F_UNLCK as libc::c_short,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_locked_through_one_description_is_seen_through_another() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, [0u8; 8]).unwrap();
        let open = || File::options().read(true).write(true).open(&path).unwrap();
        let (a, b) = (open(), open());
        assert!(try_lock(&a, 3).unwrap());
        assert!(locked_elsewhere(&b, 3));
        assert!(
            !locked_elsewhere(&a, 3),
            "a description's own lock is not reported"
        );
        assert!(!locked_elsewhere(&b, 4));
        assert!(!try_lock(&b, 3).unwrap());
        drop(a); // closing the description releases its locks, as a death does
        assert!(!locked_elsewhere(&b, 3));
        assert!(try_lock(&b, 3).unwrap());
        unlock(&b, 3);
    }
}
