//! Rate limits: a collector and a learner thread kept at a ratio, timeouts, closing,
//! limits changed at run time, and rows that were not stored or drawn given back.

use std::time::Duration;

use replaybuf::error::{DataError, SampleError};
use replaybuf::sampler::WithoutReplacement;
use replaybuf::{
    DType, Destination, RateLimit, RateLimitError, ReplayBuffer, ReplayBufferBuilder, Spec,
    WritePolicy,
};

fn spec() -> Spec {
    Spec::builder().field("id", DType::U64, []).build().unwrap()
}

mod common;

fn builder(capacity: usize) -> ReplayBufferBuilder {
    ReplayBuffer::builder(spec()).capacity(capacity).seed(3)
}

fn rows(rb: &ReplayBuffer, first: u64, n: usize) -> replaybuf::Batch {
    let mut b = rb.batch([n]);
    let ids: Vec<u64> = (first..first + n as u64).collect();
    b.set("id", &ids).unwrap();
    b
}

const SHORT: Option<Duration> = Some(Duration::from_millis(30));

#[test]
fn a_collector_and_a_learner_thread_keep_the_ratio() {
    // Each row sampled 4 times, give or take 256 samples, once 500 rows are in.
    let (spi, min_size, error) = (4.0, 500, 256.0);
    // Timeouts only so that a failing side frees the other instead of hanging it.
    let limit = RateLimit::sample_to_insert_ratio(spi, min_size, error)
        .unwrap()
        .insert_timeout(Some(Duration::from_secs(20)))
        .sample_timeout(Some(Duration::from_secs(20)));
    let rb = builder(4096).rate_limit(limit).build().unwrap();
    let (chunk, batch) = (100, 64);
    let (low, high) = limit.diff_band();
    // One call's overshoot past the band, on either side.
    let (floor, ceiling) = (low - batch as f64, high + chunk as f64 * spi);
    let check = |rb: &ReplayBuffer| {
        let s = rb.rate_limit_stats().unwrap();
        if s.inserts < min_size {
            return; // filling: the diff climbs to the band
        }
        assert!(
            (floor..=ceiling).contains(&s.diff()),
            "diff {} outside {floor}..={ceiling} ({} inserted, {} sampled)",
            s.diff(),
            s.inserts,
            s.samples
        );
    };
    std::thread::scope(|s| {
        let rb_c = &rb;
        s.spawn(move || {
            let writer = rb_c.writer();
            for k in 0..200u64 {
                writer.extend(&rows(rb_c, k * chunk as u64, chunk)).unwrap();
                check(rb_c);
            }
            // Let the learner draw what it is owed, then free it.
            std::thread::sleep(Duration::from_millis(50));
            rb_c.close_rate_limit().unwrap();
        });
        let mut learner = rb.learner();
        loop {
            match learner.sample(batch) {
                Ok(b) => assert_eq!(b.len(), batch),
                Err(SampleError::RateLimited(RateLimitError::Closed)) => break,
                Err(e) => panic!("{e}"),
            }
            check(&rb);
        }
    });
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!(s.inserts, 200 * chunk as u64);
    // The learner drew all it was owed: the diff ended at the band's floor.
    assert!(
        s.diff() <= low && s.diff() > floor,
        "final diff {}",
        s.diff()
    );
    let ratio = s.samples as f64 / s.inserts as f64;
    assert!((ratio - spi).abs() < 0.1, "samples per insert {ratio}");
    assert!(s.insert_waits > 0 && s.sample_waits > 0, "{s:?}");
}

#[test]
fn samples_wait_for_the_min_size_and_time_out() {
    let limit = RateLimit::min_size(10).sample_timeout(SHORT);
    let rb = builder(64).rate_limit(limit).build().unwrap();
    rb.extend(&rows(&rb, 0, 9)).unwrap();
    match rb.sample(4) {
        Err(SampleError::RateLimited(RateLimitError::Timeout {
            waited, inserts, ..
        })) => {
            assert!(waited >= Duration::from_millis(30));
            assert_eq!(inserts, 9);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        rb.rate_limit_stats().unwrap().samples,
        0,
        "nothing was drawn"
    );
    rb.extend(&rows(&rb, 9, 1)).unwrap();
    assert_eq!(rb.sample(4).unwrap().len(), 4);
    let mut into = rb.batch([8]);
    rb.sample_into(&mut into).unwrap();
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!((s.inserts, s.samples, s.sample_waits), (10, 12, 0));
}

#[test]
fn calls_of_no_rows_never_wait() {
    // An empty extend into a full queue waited out the insert timeout (or for good
    // without one), and `sample(0)` under a minimum size the sample timeout.
    let limit = RateLimit::queue(1)
        .unwrap()
        .insert_timeout(None)
        .sample_timeout(None);
    let rb = builder(64).rate_limit(limit).build().unwrap();
    rb.extend(&rows(&rb, 0, 1)).unwrap();
    assert_eq!(rb.extend(&rb.batch([0])).unwrap().len(), 0);
    let rb = builder(64)
        .rate_limit(RateLimit::min_size(10).sample_timeout(None))
        .build()
        .unwrap();
    assert_eq!(rb.sample(0).unwrap_err(), SampleError::Empty);
    rb.extend(&rows(&rb, 0, 1)).unwrap();
    assert_eq!(rb.sample(0).unwrap().len(), 0);
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!((s.inserts, s.samples, s.sample_waits), (1, 0, 0));
}

/// A timeout no `Instant` can count waits as none does: adding `Duration::MAX` to
/// the wait's start panicked.
#[test]
fn the_longest_timeout_waits_until_the_limit_lets_it_through() {
    let limit = RateLimit::min_size(2).sample_timeout(Some(Duration::MAX));
    let rb = builder(64).rate_limit(limit).build().unwrap();
    rb.extend(&rows(&rb, 0, 1)).unwrap();
    std::thread::scope(|s| {
        let learner = s.spawn(|| rb.sample(1).map(|b| b.len()));
        std::thread::sleep(Duration::from_millis(50));
        rb.extend(&rows(&rb, 1, 1)).unwrap();
        assert_eq!(learner.join().expect("no panic").unwrap(), 1);
    });
}

#[test]
fn an_insert_waiting_on_learners_is_freed_by_a_sample_a_new_limit_or_closing() {
    let rb = builder(64)
        .rate_limit(RateLimit::queue(4).unwrap())
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 4)).unwrap();
    let wait_for_insert = |free: &dyn Fn()| {
        std::thread::scope(|s| {
            let waiting = s.spawn(|| rb.extend(&rows(&rb, 100, 1)));
            std::thread::sleep(Duration::from_millis(30));
            assert!(!waiting.is_finished(), "the insert went past a full queue");
            free();
            waiting.join().unwrap()
        })
    };
    // A learner takes one: the insert goes.
    wait_for_insert(&|| assert_eq!(rb.sample(1).unwrap().len(), 1)).unwrap();
    // A wider queue, at run time: the insert goes.
    wait_for_insert(&|| rb.set_rate_limit(RateLimit::queue(6).unwrap()).unwrap()).unwrap();
    rb.extend(&rows(&rb, 200, 1)).unwrap(); // 6 unsampled
                                            // Closing: the insert fails, nothing written.
    let before = rb.write_count();
    let e = wait_for_insert(&|| rb.close_rate_limit().unwrap()).unwrap_err();
    assert_eq!(e, DataError::RateLimited(RateLimitError::Closed));
    assert_eq!(rb.write_count(), before);
    // Reopened, a learner is owed rows: it samples; the collector waits again.
    rb.reopen_rate_limit().unwrap();
    assert_eq!(rb.sample(6).unwrap().len(), 6);
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!((s.inserts, s.samples, s.insert_waits), (7, 7, 2));
}

#[test]
fn rows_not_stored_or_not_drawn_are_given_back() {
    // Refused data: counted, then given back.
    let limit = RateLimit::queue(100).unwrap();
    let rb = builder(64).rate_limit(limit).build().unwrap();
    let other = Spec::builder().field("x", DType::F32, []).build().unwrap();
    let wrong = replaybuf::Batch::zeros(other, [5]);
    assert!(rb.extend(&wrong).is_err());
    assert_eq!(rb.rate_limit_stats().unwrap().inserts, 0);
    // Rows a max-value writer rejects are not inserts. (No wait from here on: only the
    // counts are looked at.)
    let limit = RateLimit::min_size(1);
    let rb = builder(4)
        .write_policy(WritePolicy::max_value("id"))
        .rate_limit(limit)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 10, 4)).unwrap();
    rb.extend(&rows(&rb, 0, 3)).unwrap(); // all below the kept rows
    assert_eq!(rb.rate_limit_stats().unwrap().inserts, 4);
    // A without-replacement epoch that ends short: the rows not drawn are given back.
    let rb = builder(16)
        .sampler(WithoutReplacement::new())
        .rate_limit(limit)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 10)).unwrap();
    assert_eq!(rb.sample(8).unwrap().len(), 8);
    assert_eq!(rb.sample(8).unwrap().len(), 2);
    assert_eq!(rb.sample(8).unwrap_err(), SampleError::EpochEnd);
    assert_eq!(rb.rate_limit_stats().unwrap().samples, 10);
    // Into memory the caller owns, through a learner.
    let mut learner = rb.learner();
    let (mut ids, mut index, mut generation) = (vec![0u8; 8 * 4], vec![0u64; 4], vec![0u64; 4]);
    let mut dest = Destination::new(
        rb.spec(),
        4,
        [ids.as_mut_slice()],
        &mut index,
        &mut generation,
    )
    .unwrap();
    assert_eq!(learner.sample_to(&mut dest).unwrap(), 4);
    assert_eq!(rb.rate_limit_stats().unwrap().samples, 14);
}

#[test]
fn a_buffer_without_a_limit_refuses_the_controls() {
    let rb = builder(16).build().unwrap();
    assert!(rb.rate_limit_stats().is_none());
    assert_eq!(
        rb.set_rate_limit(RateLimit::min_size(1)),
        Err(RateLimitError::NoLimit)
    );
    assert_eq!(rb.close_rate_limit(), Err(RateLimitError::NoLimit));
}

#[test]
fn a_wait_ends_when_its_check_says_so() {
    let rb = builder(4096)
        .rate_limit(RateLimit::min_size(1000))
        .build()
        .unwrap();
    common::check_interruptible_waits(&rb);
}

/// A clear starts the rate limit's counts over (see the common check).
#[test]
fn a_clear_starts_the_counts_over() {
    let limit = RateLimit::min_size(10).sample_timeout(SHORT);
    let rb = builder(64).rate_limit(limit).build().unwrap();
    common::check_clear_restarts_the_counts(&rb, &rb);
}

#[test]
fn rows_a_checkpoint_or_a_reopened_file_brings_count_as_inserted() {
    let limit = RateLimit::min_size(3).sample_timeout(SHORT);
    let dir = tempfile::tempdir().unwrap();
    let saved = builder(64).build().unwrap();
    saved.extend(&rows(&saved, 0, 8)).unwrap();
    saved.save(dir.path().join("ck")).unwrap();

    // A buffer loaded with 8 rows samples at once, where it waited for 3 more inserts
    // (for good, without a timeout).
    let mut loaded = builder(64).rate_limit(limit).build().unwrap();
    loaded.restore(dir.path().join("ck")).unwrap();
    assert_eq!(loaded.sample(2).unwrap().len(), 2);
    let stats = loaded.rate_limit_stats().unwrap();
    assert_eq!((stats.inserts, stats.samples), (8, 2));

    // A file-backed buffer reopened with its rows, the same.
    let files = dir.path().join("files");
    let first = builder(64).memmap(&files).build().unwrap();
    first.extend(&rows(&first, 0, 5)).unwrap();
    drop(first);
    let reopened = builder(64)
        .memmap(&files)
        .existsok(true)
        .rate_limit(limit)
        .build()
        .unwrap();
    assert_eq!(reopened.sample(2).unwrap().len(), 2);
    assert_eq!(reopened.rate_limit_stats().unwrap().inserts, 5);
}

/// A checkpoint records its buffer's limit, and a buffer built from it keeps it (and
/// its counts); a dataset opened from it, read-only, takes none.
/// The typed face of such a buffer goes through the limit too.
#[test]
fn a_buffer_from_a_checkpoint_keeps_the_saved_limit() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    for limit in [
        RateLimit::min_size(4).sample_timeout(SHORT),
        RateLimit::new(2, 1.5, -3.0, 8.0)
            .unwrap()
            .insert_timeout(SHORT)
            .sample_timeout(Some(Duration::from_nanos(1_500_000_001))),
        RateLimit::queue(6).unwrap(),
    ] {
        let saved = builder(64).rate_limit(limit).build().unwrap();
        saved.extend(&rows(&saved, 0, 2)).unwrap();
        saved.save(&ck).unwrap();
        let loaded = ReplayBuffer::from_checkpoint(&ck).unwrap();
        let stats = loaded.rate_limit_stats().expect("the saved limit");
        assert_eq!(stats.limit, limit);
        assert_eq!((stats.inserts, stats.samples), (2, 0));
        let dataset = ReplayBuffer::open_dataset(&ck).unwrap();
        assert!(dataset.rate_limit_stats().is_none());
    }
    // Samples of the loaded buffer wait for the min size, as the saved one's did.
    let saved = builder(64)
        .rate_limit(RateLimit::min_size(4).sample_timeout(SHORT))
        .build()
        .unwrap();
    saved.extend(&rows(&saved, 0, 2)).unwrap();
    saved.save(&ck).unwrap();
    let loaded = ReplayBuffer::from_checkpoint(&ck).unwrap();
    assert!(matches!(
        loaded.sample(1),
        Err(SampleError::RateLimited(RateLimitError::Timeout { .. }))
    ));
    loaded.extend(&rows(&loaded, 2, 2)).unwrap();
    assert_eq!(loaded.sample(3).unwrap().len(), 3);

    // A buffer of 8-byte rows, as a typed buffer of u64s.
    let opaque = Spec::builder()
        .field("row", DType::U8, [8])
        .build()
        .unwrap();
    let saved = ReplayBuffer::builder(opaque)
        .capacity(16)
        .rate_limit(RateLimit::min_size(3).sample_timeout(SHORT))
        .build()
        .unwrap();
    saved.save(&ck).unwrap();
    let typed = replaybuf::typed::TypedBuffer::<u64>::from_checkpoint(&ck).unwrap();
    typed.extend(&[7, 8]).unwrap();
    assert!(matches!(
        typed.sample(1),
        Err(SampleError::RateLimited(RateLimitError::Timeout { .. }))
    ));
    typed.push(&9).unwrap();
    assert_eq!(typed.sample(4).unwrap().len(), 4);
    let stats = typed.as_untyped().rate_limit_stats().unwrap();
    assert_eq!((stats.inserts, stats.samples), (3, 4));
}

#[test]
fn a_batch_an_extend_would_refuse_is_refused_before_it_waits_for_room() {
    let rb = builder(64)
        .rate_limit(RateLimit::queue(4).unwrap())
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 4)).unwrap(); // the queue is full: inserts wait
    let other = Spec::builder().field("id", DType::F32, []).build().unwrap();
    let bad = replaybuf::Batch::zeros(other, [1]);
    let writer = rb.writer();
    let (done, got) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = done.send((rb.extend(&bad).unwrap_err(), writer.add(&bad).unwrap_err()));
        });
        // It waited for room no sample would make (for good: no timeout).
        let (extend, add) = got
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                rb.close_rate_limit().unwrap();
                panic!("a refused batch waited for the rate limit")
            });
        assert!(!matches!(extend, DataError::RateLimited(_)), "{extend}");
        assert!(!matches!(add, DataError::RateLimited(_)), "{add}");
    });
    assert_eq!(rb.rate_limit_stats().unwrap().inserts, 4);
}

/// A sample whose transform fails after the draw counts its rows as sampled: a FIFO
/// queue gave them up. Given back, the limit counted 4 rows in an empty queue, and an
/// extend waited for learners that had nothing to take.
#[test]
fn a_sample_whose_transform_fails_counts_the_rows_it_took() {
    let rb = builder(64)
        .sampler(replaybuf::sampler::Fifo)
        .rate_limit(
            RateLimit::queue(4)
                .unwrap()
                .insert_timeout(Some(Duration::from_secs(5))),
        )
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 4)).unwrap();
    rb.append_transform(replaybuf::Transform::new(|_: &mut replaybuf::Batch| {
        Err(DataError::Immutable)
    }));
    assert!(rb.sample(4).is_err());
    assert_eq!(rb.rate_limit_stats().unwrap().samples, 4);
    rb.extend(&rows(&rb, 4, 1)).unwrap();
}

#[test]
fn a_sample_too_large_to_hold_is_refused_before_it_counts() {
    let limit = RateLimit::min_size(1).sample_timeout(SHORT);
    let rb = builder(64).rate_limit(limit).build().unwrap();
    rb.extend(&rows(&rb, 0, 10)).unwrap();
    let before = rb.rate_limit_stats().unwrap();
    for n in [usize::MAX, usize::MAX / 2, 1 << 62] {
        let err = rb.sample(n).unwrap_err();
        assert!(matches!(err, SampleError::TooLarge { .. }), "{n}: {err}");
    }
    // Past what the allocator gives, short of overflowing a size: a terabyte of rows.
    let err = rb.sample(1 << 40).unwrap_err();
    assert!(matches!(err, SampleError::TooLarge { .. }), "{err}");
    assert_eq!(rb.rate_limit_stats().unwrap(), before);
    assert_eq!(rb.sample(4).unwrap().len(), 4);
    // The same, at the builder's batch size.
    let rb = builder(64)
        .rate_limit(limit)
        .batch_size(1 << 40)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 10)).unwrap();
    let before = rb.rate_limit_stats().unwrap();
    let err = rb.sample_into(&mut rb.batch([0])).unwrap_err();
    assert!(matches!(err, SampleError::TooLarge { .. }), "{err}");
    let err = rb.sample_default().unwrap_err();
    assert!(matches!(err, SampleError::TooLarge { .. }), "{err}");
    assert_eq!(rb.rate_limit_stats().unwrap(), before);
    assert_eq!(rb.sample(4).unwrap().len(), 4);
}

#[test]
fn a_sample_counts_the_rows_drawn_whatever_its_transforms_keep() {
    // A transform that makes a batch of one row out of four: four were drawn (a
    // queue popped them), and the count said one.
    let rb = builder(64)
        .sampler(replaybuf::sampler::Fifo)
        .rate_limit(RateLimit::queue(8).unwrap())
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 8)).unwrap();
    rb.append_transform(replaybuf::Transform::new(|b: &mut replaybuf::Batch| {
        *b = replaybuf::Batch::zeros(b.spec().clone(), [1]);
        Ok(())
    }));
    assert_eq!(rb.sample(4).unwrap().len(), 1);
    assert_eq!(rb.rate_limit_stats().unwrap().samples, 4);
}

#[test]
fn an_insert_whose_inverse_transform_panics_gives_its_rows_back() {
    // Counted, never written, never given back: a queue's samples then passed the
    // limit for rows that did not exist.
    let rb = builder(64)
        .rate_limit(RateLimit::min_size(1))
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 4)).unwrap();
    rb.append_transform(replaybuf::Transform::inverse(|_: &mut replaybuf::Batch| {
        panic!("inverse bug")
    }));
    let before = rb.rate_limit_stats().unwrap();
    let batch = rows(&rb, 4, 3);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rb.extend(&batch)));
    assert!(caught.is_err());
    assert_eq!(rb.rate_limit_stats().unwrap(), before);
}

#[test]
fn an_emptied_fifo_buffer_says_so_at_once() {
    // Its rows all taken, nothing counted in and not drawn: the sample looked for
    // rows on their way for a second before it said the buffer was empty.
    let rb = builder(64)
        .sampler(replaybuf::sampler::Fifo)
        .rate_limit(RateLimit::min_size(1))
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 4)).unwrap();
    assert_eq!(rb.sample(4).unwrap().len(), 4);
    let started = std::time::Instant::now();
    assert!(matches!(rb.sample(1), Err(SampleError::Empty)));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
}

#[test]
#[allow(clippy::disallowed_methods)]
fn a_sample_looks_for_rows_on_their_way_no_longer_than_its_timeout() {
    // An insert counted by the limit and held in its inverse transform: the empty
    // buffer's sample waited out the whole second's grace, past its 100 ms timeout.
    let limit = RateLimit::min_size(1).sample_timeout(Some(Duration::from_millis(100)));
    let rb = builder(64).rate_limit(limit).build().unwrap();
    rb.append_transform(replaybuf::Transform::inverse(|_: &mut replaybuf::Batch| {
        std::thread::sleep(Duration::from_millis(1500));
        Ok(())
    }));
    let batch = rows(&rb, 0, 4);
    std::thread::scope(|s| {
        let collector = s.spawn(|| rb.extend(&batch).map(|_| ()));
        while rb.rate_limit_stats().unwrap().inserts == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let started = std::time::Instant::now();
        assert!(matches!(rb.sample(1), Err(SampleError::Empty)));
        assert!(
            started.elapsed() < Duration::from_millis(700),
            "{:?}",
            started.elapsed()
        );
        collector.join().unwrap().unwrap();
    });
    assert_eq!(rb.sample(1).unwrap().len(), 1);
}

/// A loaded buffer's limit goes on from the saved one's counts, as Reverb's
/// checkpoints keep their limiter's: counted afresh, with the rows loaded as inserts
/// and none sampled, a learner held to 1 sample per insert was let through 100 more
/// samples of the old rows at once.
#[test]
fn a_loaded_limit_goes_on_from_the_saved_counts() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let limit = RateLimit::new(1, 1.0, -8.0, 8.0)
        .unwrap()
        .insert_timeout(SHORT)
        .sample_timeout(SHORT);
    let saved = builder(256).rate_limit(limit).build().unwrap();
    saved.extend(&rows(&saved, 0, 100)).unwrap();
    let mut drawn = 0;
    while saved.sample(1).is_ok() {
        drawn += 1;
    }
    assert_eq!(drawn, 108, "held at inserts + 8");
    saved.save(&ck).unwrap();
    let counts = |rb: &ReplayBuffer| {
        let s = rb.rate_limit_stats().unwrap();
        (s.inserts, s.samples)
    };
    let loaded = ReplayBuffer::from_checkpoint(&ck).unwrap();
    assert_eq!(counts(&loaded), (100, 108));
    assert!(matches!(
        loaded.sample(1),
        Err(SampleError::RateLimited(RateLimitError::Timeout { .. }))
    ));
    // Into a buffer of its own, the same.
    let mut other = builder(256).rate_limit(limit).build().unwrap();
    other.restore(&ck).unwrap();
    assert_eq!(counts(&other), (100, 108));
    assert!(other.sample(1).is_err());
    other.extend(&rows(&other, 100, 1)).unwrap();
    assert_eq!(other.sample(1).unwrap().len(), 1);
}
