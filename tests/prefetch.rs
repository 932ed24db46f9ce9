//! Prefetch: a loader's workers keep exactly k batches prepared, honour priority
//! updates made before their draws, run under concurrent updates and writes, never
//! hand over an error made before the learner asked, and stop and join when the
//! loader is dropped with batches in flight (no thread left, no deadlock), a panicking
//! stage included.

// The loom-facade rule of .clippy.toml is for the library, not its tests.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use replaybuf::sampler::Prioritized;
use replaybuf::{Batch, ReplayBuffer};

mod common;
use common::rewards::{buffer, rows, spec};

/// Polls `cond` for up to 10 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Threads of this process whose name starts with `prefix` (Linux). Only for
/// threads that should be running: a thread can stay in `/proc/self/task` for a
/// moment after its join has returned, while the kernel reaps it (CI once counted
/// one there), so whether workers have ended is told by a token their preprocess
/// step holds: its count is exact the moment the loader is dropped.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|name| name.starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

/// Runs `f` on a thread and fails if it does not finish in 60 s (a deadlock).
fn within_a_minute(f: impl FnOnce() + Send + 'static) {
    let (done, wait) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    match wait.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: show its panic.
            if let Err(p) = t.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(e) => panic!("deadlock: {e}"),
    }
}

#[test]
fn prefetch_k_keeps_exactly_k_batches_prepared() {
    for k in [1, 2, 3] {
        let rb = buffer(64);
        rb.extend(&rows(&rb, 64, 0)).unwrap();
        let fills = Arc::new(AtomicUsize::new(0));
        let counter = fills.clone();
        let mut loader = rb
            .loader()
            .batch_size(4)
            .prefetch(k)
            .workers(2)
            .preprocess(move |_: &mut Batch| {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
            .build()
            .unwrap();
        assert_eq!(loader.prefetch_depth(), k);
        eventually("k batches ready", || loader.ready() == k);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(loader.ready(), k, "k = {k}: never more than k");
        assert_eq!(
            fills.load(Ordering::SeqCst),
            k,
            "k = {k}: k batches drawn ahead"
        );
        let mut batch = rb.batch([4]);
        for taken in 1..=5 {
            loader.sample_into(&mut batch).unwrap();
            assert_eq!(batch.len(), 4);
            // After a take, the workers prepare one more: k are ready again, the
            // batch taken included none of them.
            eventually("refilled", || loader.ready() == k);
            assert_eq!(fills.load(Ordering::SeqCst), k + taken, "k = {k}");
        }
    }
}

#[test]
fn one_prefetch_worker_gives_the_same_batches_as_sampling_inline() {
    let make = || {
        let rb = buffer(1000);
        rb.extend(&rows(&rb, 1000, 0)).unwrap();
        rb
    };
    let (a, b) = (make(), make());
    let mut inline = a.loader().batch_size(16).build().unwrap();
    let mut ahead = b.loader().batch_size(16).prefetch(2).build().unwrap();
    for _ in 0..50 {
        let (x, y) = (inline.sample().unwrap(), ahead.sample().unwrap());
        assert_eq!(
            x.column::<i64>("id").unwrap(),
            y.column::<i64>("id").unwrap()
        );
    }
}

#[test]
fn an_error_prepared_before_the_learner_asked_is_not_handed_over() {
    for workers in [1, 2] {
        let rb = buffer(8);
        let mut loader = rb
            .loader()
            .batch_size(2)
            .prefetch(2)
            .workers(workers)
            .build()
            .unwrap();
        // The workers find the buffer empty and stop there...
        eventually("an error queued", || loader.ready() >= 1);
        rb.extend(&rows(&rb, 8, 0)).unwrap();
        // ...but the learner asks after the rows arrived: a fresh batch, not `Empty`.
        assert_eq!(loader.sample().unwrap().len(), 2);
        for _ in 0..10 {
            assert_eq!(loader.sample().unwrap().len(), 2);
        }
    }
}

#[test]
fn prefetched_batches_honour_priority_updates_made_before_they_were_drawn() {
    for (k, workers) in [(1, 1), (2, 1), (3, 1), (2, 2), (3, 3)] {
        let rb = ReplayBuffer::builder(spec())
            .capacity(64)
            .sampler(Prioritized::new(1.0, 0.4).eps(0.0))
            .seed(11)
            .build()
            .unwrap();
        rb.extend(&rows(&rb, 64, 0)).unwrap();
        let all = rb.read_all_in_order(None);
        let mut loader = rb
            .loader()
            .batch_size(8)
            .prefetch(k)
            .workers(workers)
            .build()
            .unwrap();
        let mut batch = rb.batch([8]);
        for round in 0..40 {
            let favourite = (round * 7 % 64) as i64;
            let mut p = vec![0.0; 64];
            p[favourite as usize] = 1.0;
            rb.update_priority(all.index(), all.generations(), &p)
                .unwrap();
            // At most k batches were drawn before the update; with one worker they
            // come first, then only the favourite is ever drawn.
            let mut stale = 0;
            for taken in 0..3 * k + 2 {
                loader.sample_into(&mut batch).unwrap();
                let ids = batch.column::<i64>("id").unwrap();
                if ids.iter().any(|&i| i != favourite) {
                    stale += 1;
                    if workers == 1 {
                        assert!(taken < k, "k {k}, round {round}: batch {taken} is stale");
                    }
                } else {
                    assert!(batch.weight().unwrap().iter().all(|&w| w == 1.0));
                }
            }
            assert!(
                stale <= k,
                "k {k}, workers {workers}, round {round}: {stale} stale"
            );
        }
    }
}

#[test]
fn prefetch_under_concurrent_priority_updates_and_writes() {
    within_a_minute(|| {
        let rb = ReplayBuffer::builder(spec())
            .capacity(256)
            .shards(2)
            .sampler(Prioritized::new(0.6, 0.4).eps(1e-6))
            .seed(13)
            .build()
            .unwrap();
        rb.extend(&rows(&rb, 256, 0)).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        std::thread::scope(|s| {
            // A second learner updating the priorities of what it samples.
            let (rb2, stop2) = (rb.clone(), stop.clone());
            s.spawn(move || {
                let mut learner = rb2.learner();
                let mut x = 1u64;
                while !stop2.load(Ordering::Relaxed) {
                    let b = learner.sample(16).unwrap();
                    let p: Vec<f64> = (0..16)
                        .map(|_| {
                            x = x
                                .wrapping_mul(6364136223846793005)
                                .wrapping_add(1442695040888963407);
                            (x >> 40) as f64 / (1u64 << 24) as f64 * 5.0
                        })
                        .collect();
                    rb2.update_priority(b.index(), b.generations(), &p).unwrap();
                }
            });
            // A collector overwriting rows.
            let (rb3, stop3) = (rb.clone(), stop.clone());
            s.spawn(move || {
                let writer = rb3.writer();
                let mut id = 1000;
                while !stop3.load(Ordering::Relaxed) {
                    writer.extend(&rows(&rb3, 16, id)).unwrap();
                    id += 16;
                }
            });
            let mut loader = rb
                .loader()
                .batch_size(32)
                .prefetch(3)
                .workers(2)
                .build()
                .unwrap();
            let mut batch = rb.batch([32]);
            for _ in 0..3000 {
                loader.sample_into(&mut batch).unwrap();
                let ids = batch.column::<i64>("id").unwrap();
                let obs = batch.column::<f32>("obs").unwrap();
                for (r, &id) in ids.iter().enumerate() {
                    assert_eq!(obs[2 * r..2 * r + 2], [id as f32, -(id as f32)], "torn row");
                }
                let w = batch.weight().unwrap();
                assert!(w.iter().all(|&w| w > 0.0 && w <= 1.0), "{w:?}");
                // The learner writes priorities back too, racing the workers' draws.
                let p = vec![0.5; 32];
                rb.update_priority(batch.index(), batch.generations(), &p)
                    .unwrap();
            }
            drop(loader);
            stop.store(true, Ordering::Relaxed);
        });
        assert!(replaybuf::internals::priorities_consistent(&rb));
    });
}

#[test]
fn dropping_a_loader_with_batches_in_flight_stops_and_joins_its_workers() {
    within_a_minute(|| {
        for (case, take) in [(0, 0), (1, 1), (2, 5)] {
            let name = format!("pf-shut-{case}");
            let rb = buffer(64);
            rb.extend(&rows(&rb, 64, 0)).unwrap();
            // Held by the preprocess step, which every worker holds until it returns
            // (see `threads_named` for why the workers are not counted by name).
            let alive = Arc::new(());
            let held = alive.clone();
            let mut loader = rb
                .loader()
                .batch_size(8)
                .prefetch(3)
                .workers(3)
                .thread_name(name.clone())
                .preprocess(move |_: &mut Batch| {
                    let _ = &held;
                    // Long enough that the workers are mid-batch when the loader goes.
                    std::thread::sleep(Duration::from_millis(5));
                    Ok(())
                })
                .build()
                .unwrap();
            // A thread names itself once it runs.
            eventually("three named workers", || threads_named(&name) == 3);
            for _ in 0..take {
                loader.sample().unwrap();
            }
            drop(loader);
            assert_eq!(
                Arc::strong_count(&alive),
                1,
                "case {case}: a worker outlived its loader"
            );
        }
        // Dropping the buffer's other handles leaves the loader working; dropping the
        // loader then ends its workers too.
        let rb = buffer(16);
        rb.extend(&rows(&rb, 16, 0)).unwrap();
        let alive = Arc::new(());
        let held = alive.clone();
        let mut loader = rb
            .loader()
            .batch_size(4)
            .prefetch(2)
            .thread_name("pf-last")
            .preprocess(move |_: &mut Batch| {
                let _ = &held;
                Ok(())
            })
            .build()
            .unwrap();
        drop(rb);
        assert_eq!(loader.sample().unwrap().len(), 4);
        drop(loader);
        assert_eq!(Arc::strong_count(&alive), 1, "a worker outlived its loader");
    });
}

#[test]
fn a_panicking_stage_reaches_the_learner_and_the_loader_still_shuts_down() {
    within_a_minute(|| {
        let rb = buffer(16);
        rb.extend(&rows(&rb, 16, 0)).unwrap();
        let calls = AtomicUsize::new(0);
        let alive = Arc::new(());
        let held = alive.clone();
        let mut loader = rb
            .loader()
            .batch_size(4)
            .prefetch(1)
            .thread_name("pf-panic")
            .preprocess(move |_: &mut Batch| {
                let _ = &held;
                if calls.fetch_add(1, Ordering::SeqCst) == 2 {
                    panic!("augmentation bug");
                }
                Ok(())
            })
            .build()
            .unwrap();
        loader.sample().unwrap();
        loader.sample().unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader.sample()));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"augmentation bug"));
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader.sample())).is_err()
        );
        drop(loader);
        assert_eq!(Arc::strong_count(&alive), 1, "a worker outlived its loader");
    });
}

/// A prefetching loader dropped while its workers wait on the buffer's rate limit
/// (samples held back for the min size, no timeout) stops them and returns: the drop
/// waited forever to join a worker whose sample waited for inserts that never came.
#[test]
fn dropping_a_loader_whose_workers_wait_on_the_rate_limit_returns() {
    within_a_minute(|| {
        let spec = replaybuf::Spec::builder()
            .field("x", replaybuf::DType::F32, [])
            .build()
            .unwrap();
        let rb = ReplayBuffer::builder(spec)
            .capacity(100)
            .batch_size(4)
            .rate_limit(replaybuf::RateLimit::min_size(10))
            .build()
            .unwrap();
        for workers in [1, 2] {
            let loader = rb.loader().prefetch(2).workers(workers).build().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            drop(loader);
        }
        // The buffer goes on: the samples the workers gave up counted nothing.
        assert_eq!(rb.rate_limit_stats().unwrap().samples, 0);
    });
}

/// A pipeline stage's error prepared ahead of the learner's ask is handed over, as
/// inline sampling gives it (it was dropped, and with a without-replacement sampler
/// the rows its fill drew vanished from the epoch without a word).
#[test]
fn a_stage_error_prepared_ahead_is_handed_over() {
    use replaybuf::error::{DataError, SampleError};
    use replaybuf::sampler::WithoutReplacement;
    let spec = replaybuf::Spec::builder()
        .field("x", replaybuf::DType::U64, [])
        .build()
        .unwrap();
    for prefetch in [0, 2] {
        let rb = ReplayBuffer::builder(spec.clone())
            .capacity(12)
            .seed(3)
            .sampler(WithoutReplacement::new())
            .build()
            .unwrap();
        let mut b = rb.batch([12]);
        b.set("x", &(0..12u64).collect::<Vec<_>>()).unwrap();
        rb.extend(&b).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let mut loader = rb
            .loader()
            .batch_size(3)
            .prefetch(prefetch)
            .preprocess(move |_: &mut Batch| {
                if counted.fetch_add(1, Ordering::SeqCst) == 1 {
                    return Err(DataError::MissingField {
                        key: "augment".into(),
                    });
                }
                Ok(())
            })
            .build()
            .unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut outcomes = Vec::new();
        loop {
            match loader.sample() {
                Ok(batch) => outcomes.push(Ok(batch.len())),
                Err(SampleError::EpochEnd) => break,
                Err(e) => outcomes.push(Err(e.to_string())),
            }
        }
        assert_eq!(outcomes.len(), 4, "prefetch {prefetch}: {outcomes:?}");
        assert!(
            matches!(&outcomes[1], Err(e) if e.contains("augment")),
            "prefetch {prefetch}: {outcomes:?}"
        );
    }
}

/// A prefetch depth past [`MAX_PREFETCH`](replaybuf::loader::MAX_PREFETCH) is refused
/// by name: a depth of a hundred million aborted the process on its allocation.
#[test]
fn a_prefetch_depth_past_the_bound_is_refused() {
    let rb = buffer(64);
    let at = |k: usize| rb.loader().batch_size(4).prefetch(k).build();
    let e = at(100_000_000).unwrap_err().to_string();
    assert!(e.contains("at most 1,024"), "{e}");
    assert!(at(replaybuf::loader::MAX_PREFETCH).is_ok());
}

/// A worker name holding a NUL byte is refused: the thread's spawn panicked on it.
#[test]
fn a_worker_name_with_a_nul_byte_is_refused() {
    let rb = buffer(64);
    let e = rb
        .loader()
        .batch_size(4)
        .prefetch(1)
        .thread_name("a\0b")
        .build()
        .unwrap_err()
        .to_string();
    assert!(e.contains("NUL"), "{e}");
}

#[test]
fn a_loader_dropped_after_its_epoch_ended_leaves_the_next_epoch_whole() {
    // Once the learner took an epoch's end, the workers drew the next epoch's first
    // batches ahead, and a loader dropped then (one loader per epoch) took those rows
    // out of the next epoch for good.
    use replaybuf::sampler::WithoutReplacement;
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(WithoutReplacement::new())
        .seed(5)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 64, 0)).unwrap();
    for workers in [1, 2] {
        for _ in 0..3 {
            let mut loader = rb
                .loader()
                .batch_size(8)
                .prefetch(2)
                .workers(workers)
                .build()
                .unwrap();
            let mut ids: Vec<i64> = Vec::new();
            for batch in &mut loader {
                ids.extend(batch.unwrap().column::<i64>("id").unwrap());
            }
            ids.sort_unstable();
            assert_eq!(ids, (0..64).collect::<Vec<_>>(), "{workers} workers");
            // Time for the workers to fill, were they free to, before the drop.
            std::thread::sleep(Duration::from_millis(30));
        }
    }
}

#[test]
fn a_learner_waiting_on_its_workers_ends_when_its_threads_check_says_so() {
    // The workers wait on the rate limit (no timeout) for rows that have not come:
    // the learner's wait for them did not end on its thread's check (Ctrl-C from
    // Python), where a sample made inline did.
    use replaybuf::error::SampleError;
    use replaybuf::{RateLimit, RateLimitError};
    let rb = ReplayBuffer::builder(spec())
        .capacity(8)
        .rate_limit(RateLimit::min_size(4))
        .seed(5)
        .build()
        .unwrap();
    let mut loader = rb.loader().batch_size(2).prefetch(1).build().unwrap();
    fn stop() -> bool {
        true
    }
    within_a_minute(move || {
        let got = RateLimit::interruptible(stop, || loader.sample());
        assert!(
            matches!(
                got,
                Err(SampleError::RateLimited(RateLimitError::Interrupted))
            ),
            "{got:?}"
        );
        rb.extend(&rows(&rb, 8, 0)).unwrap();
        assert_eq!(loader.sample().unwrap().len(), 2);
    });
}

#[test]
fn batches_prepared_before_a_stage_panicked_are_handed_over_first() {
    // The panic of the third fill came back on the learner's next take, ahead of
    // the second batch, ready since before it (its rows drawn, never seen).
    within_a_minute(|| {
        let rb = buffer(16);
        rb.extend(&rows(&rb, 16, 0)).unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let mut loader = rb
            .loader()
            .batch_size(4)
            .prefetch(2)
            .preprocess(move |_: &mut Batch| {
                if seen.fetch_add(1, Ordering::SeqCst) == 2 {
                    panic!("augmentation bug");
                }
                Ok(())
            })
            .build()
            .unwrap();
        eventually("two batches ready", || loader.ready() == 2);
        loader.sample().unwrap();
        eventually("the third fill ran", || calls.load(Ordering::SeqCst) == 3);
        std::thread::sleep(Duration::from_millis(20)); // its panic stored
        assert_eq!(loader.sample().unwrap().len(), 4);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loader.sample()));
        assert!(caught.is_err());
    });
}

#[test]
fn a_batch_of_other_fields_given_back_is_not_reused() {
    // `sample_into` keeps the caller's batch as a buffer to fill: one of other
    // fields made every later fill fail (SpecMismatch), for good with prefetch.
    use replaybuf::{DType, Spec};
    let rb = buffer(16);
    rb.extend(&rows(&rb, 16, 0)).unwrap();
    let other = Spec::builder().field("z", DType::U8, []).build().unwrap();
    for prefetch in [0, 1] {
        let mut loader = rb
            .loader()
            .batch_size(4)
            .prefetch(prefetch)
            .build()
            .unwrap();
        let mut out = Batch::zeros(other.clone(), [4]);
        loader.sample_into(&mut out).unwrap();
        assert_eq!(out.len(), 4);
        for _ in 0..5 {
            assert_eq!(loader.sample().unwrap().len(), 4, "prefetch {prefetch}");
        }
    }
}
