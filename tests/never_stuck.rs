//! Writes that span every shard racing freezes (swaps and checkpoints), in one
//! process: nobody waits forever. Before the fix, a buffer-level extend of an ndim-2
//! buffer held the shards it had entered while it waited for a frozen one to thaw, and
//! the freezer waited for those shards to drain: both threads hung within seconds.
//! Hangs are caught by a watchdog, not by the test runner hanging.
// Test threads, not the crate's: the loom facade is for the library.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use replaybuf::sampler::{Uniform, WithoutReplacement};
use replaybuf::{DType, ReplayBuffer, Spec};

mod common;

const ENVS: usize = 32;

fn spec() -> Spec {
    Spec::builder()
        .field("a", DType::U64, [])
        .field("b", DType::U64, [])
        .build()
        .unwrap()
}

/// 32 environments in 32 shards: every buffer-level extend enters all of them.
fn buffer() -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(ENVS * 64)
        .ndim(2)
        .envs(ENVS)
        .dim_extend(0)
        .shards(ENVS)
        .seed(7)
        .build()
        .unwrap()
}

/// A `[1, ENVS]` step whose rows all carry `id` in both fields.
fn step(rb: &ReplayBuffer, id: u64) -> replaybuf::Batch {
    let mut batch = rb.batch([1, ENVS]);
    batch.set("a", &[id; ENVS]).unwrap();
    batch.set("b", &[id; ENVS]).unwrap();
    batch
}

/// Runs `writer` and `freezer` against each other for `common::race_duration("REPLAYBUF_RACE_MS")`, each in a loop on
/// its own thread, and fails (rather than hanging) if either is stuck when the time is
/// up: both must have finished within `patience` after being told to stop.
fn race(
    rb: &ReplayBuffer,
    writer: impl Fn(&ReplayBuffer, u64) + Send + 'static,
    freezer: impl Fn(&ReplayBuffer, u64) + Send + 'static,
) -> (u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let counts = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    type Job = Box<dyn Fn(&ReplayBuffer, u64) + Send>;
    let jobs: [Job; 2] = [Box::new(writer), Box::new(freezer)];
    for (job, count) in jobs.into_iter().zip(&counts) {
        let (rb, stop, done, count) = (rb.clone(), stop.clone(), done_tx.clone(), count.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                job(&rb, i);
                i += 1;
                count.store(i, Ordering::Relaxed);
            }
            let _ = done.send(());
        });
    }
    std::thread::sleep(common::race_duration("REPLAYBUF_RACE_MS"));
    stop.store(true, Ordering::Relaxed);
    let patience = Duration::from_secs(20);
    let deadline = Instant::now() + patience;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            done_rx.recv_timeout(left).is_ok(),
            "deadlock: a writer and a freezer still stuck {patience:?} after being told \
             to stop ({} writes, {} freezes done)",
            counts[0].load(Ordering::Relaxed),
            counts[1].load(Ordering::Relaxed),
        );
    }
    let c = (
        counts[0].load(Ordering::Relaxed),
        counts[1].load(Ordering::Relaxed),
    );
    assert!(c.0 > 0 && c.1 > 0, "both sides made progress: {c:?}");
    c
}

fn swap_sampler(rb: &ReplayBuffer, i: u64) {
    if i.is_multiple_of(2) {
        rb.set_sampler(WithoutReplacement::new()).unwrap();
    } else {
        rb.set_sampler(Uniform).unwrap();
    }
}

/// Every row of the buffer is whole (both fields from one write).
fn assert_whole(rb: &ReplayBuffer) {
    let all = rb.read_all_in_order(None);
    let a = all.column::<u64>("a").unwrap();
    let b = all.column::<u64>("b").unwrap();
    assert_eq!(a, b, "a torn row");
}

#[test]
fn a_multi_shard_extend_racing_sampler_swaps_never_hangs() {
    let rb = buffer();
    race(
        &rb,
        |rb, i| {
            rb.extend(&step(rb, i)).unwrap();
        },
        swap_sampler,
    );
    assert_whole(&rb);
}

#[test]
fn a_multi_shard_extend_racing_checkpoints_never_hangs() {
    let rb = buffer();
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("ckpt");
    race(
        &rb,
        |rb, i| {
            rb.extend(&step(rb, i)).unwrap();
        },
        move |rb, _| rb.save(&at).unwrap(),
    );
    assert_whole(&rb);
}

#[test]
fn write_all_over_every_shard_racing_swaps_and_checkpoints_never_hangs() {
    let rb = buffer();
    for t in 0..64 {
        rb.extend(&step(&rb, t)).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("ckpt");
    race(
        &rb,
        |rb, i| {
            let mut all = rb.batch([rb.len()]);
            let ids = vec![1_000_000 + i; rb.len()];
            all.set("a", &ids).unwrap();
            all.set("b", &ids).unwrap();
            rb.write_all(&all, None).unwrap();
        },
        move |rb, i| {
            if i.is_multiple_of(3) {
                rb.save(&at).unwrap();
            } else {
                swap_sampler(rb, i);
            }
        },
    );
    assert_whole(&rb);
}

#[test]
fn extends_and_write_all_together_racing_a_reconfigure_never_hang() {
    let rb = buffer();
    for t in 0..64 {
        rb.extend(&step(&rb, t)).unwrap();
    }
    let editor = {
        let rb = rb.clone();
        std::thread::spawn(move || {
            for i in 0..50 {
                let mut all = rb.batch([rb.len()]);
                let ids = vec![2_000_000u64 + i; rb.len()];
                all.set("a", &ids).unwrap();
                all.set("b", &ids).unwrap();
                rb.write_all(&all, None).unwrap();
            }
        })
    };
    race(
        &rb,
        |rb, i| {
            rb.extend(&step(rb, i)).unwrap();
        },
        |rb, i| {
            swap_sampler(rb, i);
        },
    );
    editor.join().unwrap();
    assert_whole(&rb);
}
