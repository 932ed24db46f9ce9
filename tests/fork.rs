//! Locks and forked children: a child forked while a buffer holds a lock (an
//! environment worker a trainer starts, `multiprocessing`'s fork) lets go of it as it
//! starts, so that the lock goes with its holder.
//!
//! One test: a fork copies every descriptor of its process, and a test running beside
//! it could have its buffer's lock copied into the child between opening the lock's
//! file and registering it for the child to let go of.

// The loom-facade rules of .clippy.toml are for the library, not its tests.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use replaybuf::{DType, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder().field("id", DType::U64, []).build().unwrap()
}

fn ids(rb: &ReplayBuffer) -> Vec<u64> {
    rb.read_all_in_order(None)
        .column::<u64>("id")
        .unwrap()
        .to_vec()
}

/// Forks a child that sleeps, returning its pid once the child runs (its fork
/// handlers done); the child never returns. A child of a test that fails is killed
/// by [`Reaped`].
fn fork_sleeper() -> Reaped {
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child only writes a byte, sleeps and exits, all async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: as above.
        unsafe {
            libc::write(pipe[1], [1u8].as_ptr().cast(), 1);
            libc::sleep(30);
            libc::_exit(0);
        }
    }
    assert!(pid > 0, "fork failed");
    let mut byte = [0u8];
    // SAFETY: the pipe's descriptors are this process's; `byte` has room for one.
    unsafe {
        libc::close(pipe[1]);
        assert_eq!(libc::read(pipe[0], byte.as_mut_ptr().cast(), 1), 1);
        libc::close(pipe[0]);
    }
    Reaped(pid)
}

/// A forked child, killed and reaped when dropped.
struct Reaped(libc::pid_t);

impl Drop for Reaped {
    fn drop(&mut self) {
        // SAFETY: the pid is this process's child, not yet reaped.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), 0);
        }
    }
}

#[test]
fn a_forked_child_holds_no_lock_of_its_parent() {
    a_file_backed_buffer_is_not_kept_open_for_writing();
    a_save_under_way_does_not_hold_its_directory();
}

/// The file's lock was on the description the mapping holds, which a forked child
/// inherits with the mapping: the buffer's directory stayed "open for writing by
/// another buffer" after the buffer was gone, for as long as the child lived.
fn a_file_backed_buffer_is_not_kept_open_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    let build = || {
        ReplayBuffer::builder(spec())
            .capacity(64)
            .memmap(dir.path())
            .existsok(true)
            .build()
    };
    let rb = build().unwrap();
    let mut rows = rb.batch([10]);
    rows.set("id", &(0..10).collect::<Vec<u64>>()).unwrap();
    rb.extend(&rows).unwrap();
    let _child = fork_sleeper();
    drop(rb);
    let again = build().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ids(&again), (0..10).collect::<Vec<_>>());
}

/// A checkpoint directory's lock was a file description the child inherited and
/// never closed: the next save waited for as long as the child lived.
fn a_save_under_way_does_not_hold_its_directory() {
    let rb = ReplayBuffer::builder(spec()).capacity(64).build().unwrap();
    rb.extend(&rb.batch([8])).unwrap();
    let once = Arc::new(AtomicI32::new(0));
    let forked = Arc::clone(&once);
    let children = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = Arc::clone(&children);
    rb.register_save_hook(move |_| {
        // Once, inside the first save: its thread holds the directory's lock.
        if forked.swap(1, Ordering::Relaxed) == 0 {
            kept.lock().unwrap().push(fork_sleeper());
        }
        Ok(())
    });
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    assert_eq!(children.lock().unwrap().len(), 1, "the hook forked");
    let (done, saved) = mpsc::channel();
    let again = rb.clone();
    let path = dir.path().to_owned();
    std::thread::spawn(move || done.send(again.save(&path).map(drop)));
    let second = saved.recv_timeout(Duration::from_secs(10));
    drop(children.lock().unwrap().drain(..));
    second
        .expect("the second save waited on the child")
        .unwrap();
}
