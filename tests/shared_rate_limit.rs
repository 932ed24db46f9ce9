//! A shared buffer's rate limit, kept by all of its processes together: collector
//! processes and a learner held to one ratio, a waiting insert in one process freed by
//! a sample, and by closing, in another, a limit set in one handle in force in
//! another, and a shared buffer without a limit (this test binary runs itself as the
//! children: `limit_child` does nothing unless `REPLAYBUF_LIMIT_ROLE` is set).

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use replaybuf::error::{DataError, SampleError};
use replaybuf::{DType, RateLimit, RateLimitError, ReplayBuffer, ReplayBufferBuilder, Spec};

mod common;

fn name(test: &str) -> String {
    common::shm::name("limit", test)
}

fn spec() -> Spec {
    Spec::builder().field("id", DType::U64, []).build().unwrap()
}

fn builder(name: &str) -> ReplayBufferBuilder {
    ReplayBuffer::builder(spec())
        .capacity(1 << 14)
        .shards(4)
        .seed(3)
        .shared(name)
}

fn rows(rb: &ReplayBuffer, first: u64, n: usize) -> replaybuf::Batch {
    let mut b = rb.batch([n]);
    let ids: Vec<u64> = (first..first + n as u64).collect();
    b.set("id", &ids).unwrap();
    b
}

/// Collectors' chunk and the learner's batch.
const CHUNK: usize = 50;
const BATCH: usize = 32;

/// The child: attaches to `REPLAYBUF_LIMIT_NAME` and plays its role, printing a line
/// at each step for the parent to follow.
#[test]
fn limit_child() {
    let Ok(role) = std::env::var("REPLAYBUF_LIMIT_ROLE") else {
        return;
    };
    let name = std::env::var("REPLAYBUF_LIMIT_NAME").unwrap();
    let rb = ReplayBuffer::attach(&name).unwrap();
    match role.as_str() {
        "collector" => {
            let writer = rb.writer();
            for k in 0..100u64 {
                writer.extend(&rows(&rb, k * CHUNK as u64, CHUNK)).unwrap();
            }
            println!("done");
        }
        "waiter" => {
            // A queue of 10: the first 10 rows go, the next insert waits for a sample.
            rb.extend(&rows(&rb, 0, 10)).unwrap();
            println!("waiting");
            rb.extend(&rows(&rb, 10, 10)).unwrap();
            println!("inserted");
            match rb.extend(&rows(&rb, 20, 10)) {
                Err(DataError::RateLimited(RateLimitError::Closed)) => println!("closed"),
                other => println!("unexpected {other:?}"),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(name: &str, role: &str) -> Child {
    common::child("limit_child", &[])
        .env("REPLAYBUF_LIMIT_ROLE", role)
        .env("REPLAYBUF_LIMIT_NAME", name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// What the child says, a word a line (the harness prints its own lines too, and
/// starts the child's first on the line of its `test limit_child ... `).
fn said(child: &mut Child) -> impl Iterator<Item = String> {
    let known = ["done", "waiting", "inserted", "closed", "unexpected"];
    BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
        .filter_map(move |l| {
            let at = known.iter().filter_map(|k| l.find(k)).min()?;
            Some(l[at..].to_owned())
        })
}

#[test]
fn collector_processes_and_a_learner_keep_one_ratio() {
    let name = name("ratio");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    // Each row sampled twice, give or take 128 samples, once 200 rows are in; the
    // timeouts only free a side whose other side failed, instead of hanging it.
    let (spi, min_size) = (2.0, 200);
    let limit = RateLimit::sample_to_insert_ratio(spi, min_size, 128.0)
        .unwrap()
        .insert_timeout(Some(Duration::from_secs(20)))
        .sample_timeout(Some(Duration::from_secs(20)));
    let rb = builder(&name).rate_limit(limit).build().unwrap();
    let (low, high) = limit.diff_band();
    // Overshoot past the band: one call per caller racing (two collectors, a learner).
    let (floor, ceiling) = (low - BATCH as f64, high + 2.0 * CHUNK as f64 * spi);
    // The learner draws until what the collectors will have written leaves the diff
    // at the band's floor (it waits for them whenever it runs ahead).
    let learn = || {
        let mut learner = rb.learner();
        let mut drawn = 0u64;
        let owed = 2.0 * 100.0 * CHUNK as f64 * spi;
        let mut paused = false;
        while owed - drawn as f64 > low {
            match learner.sample(BATCH) {
                Ok(b) => drawn += b.len() as u64,
                Err(e) => panic!("{e}"),
            }
            if !paused {
                // The first sample waited for the collectors' first rows; a learner
                // that then lags a while makes the collectors run into the band and
                // wait too, however the two sides happen to be scheduled.
                paused = true;
                std::thread::sleep(Duration::from_millis(100));
            }
            let s = rb.rate_limit_stats().unwrap();
            if s.inserts >= min_size {
                assert!(
                    (floor..=ceiling).contains(&s.diff()),
                    "diff {} outside {floor}..={ceiling} ({s:?})",
                    s.diff()
                );
            }
        }
        drawn
    };
    let drawn = std::thread::scope(|scope| {
        let learning = scope.spawn(learn);
        // The collectors start a while after the learner, whose first sample so waits
        // for their rows however the processes are scheduled (started first, they
        // once had 200 rows in before it, under AddressSanitizer, and it never
        // waited). Spawned by this thread, which outlives them: a child is killed
        // when the thread that spawned it ends (`common::child`).
        std::thread::sleep(Duration::from_millis(300));
        let mut collectors: Vec<Child> = (0..2).map(|_| spawn(&name, "collector")).collect();
        let drawn = learning.join().unwrap();
        for c in &mut collectors {
            assert_eq!(said(c).collect::<Vec<_>>(), ["done"]);
            assert!(c.wait().unwrap().success());
        }
        drawn
    });
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!(s.inserts, 2 * 100 * CHUNK as u64);
    assert_eq!(s.samples, drawn);
    // Each side waited on the other, across processes: the collectors ran ahead of
    // the learner's ratio, and the learner caught up with them.
    assert!(s.insert_waits > 0 && s.sample_waits > 0, "{s:?}");
}

#[test]
fn a_waiting_insert_in_another_process_is_freed_by_a_sample_and_by_closing() {
    let name = name("waiter");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    let limit = RateLimit::queue(10)
        .unwrap()
        .insert_timeout(Some(Duration::from_secs(20)));
    let rb = builder(&name).rate_limit(limit).build().unwrap();
    let mut child = spawn(&name, "waiter");
    let mut lines = said(&mut child);
    assert_eq!(lines.next().as_deref(), Some("waiting"));
    // Its second insert waits (10 rows unsampled) until a sample lets it in.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(rb.rate_limit_stats().unwrap().inserts, 10);
    // Woken, not timed out: well within the limit's 20 s.
    let woken = Duration::from_secs(5);
    let t = Instant::now();
    assert_eq!(rb.sample(5).unwrap().len(), 5);
    assert_eq!(lines.next().as_deref(), Some("inserted"));
    assert!(
        t.elapsed() < woken,
        "the insert was not woken by the sample"
    );
    // Its third waits too (15 unsampled), until the limiter is closed.
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    rb.close_rate_limit().unwrap();
    assert_eq!(lines.next().as_deref(), Some("closed"));
    assert!(t.elapsed() < woken, "the insert was not woken by closing");
    assert!(child.wait().unwrap().success());
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!((s.inserts, s.samples), (20, 5));
    assert!(s.closed && s.insert_waits >= 1, "{s:?}");
    // Closed: a sample that may go still goes; one that would wait fails.
    rb.reopen_rate_limit().unwrap();
    assert!(!rb.rate_limit_stats().unwrap().closed);
}

#[test]
fn a_limit_set_through_one_handle_holds_in_another() {
    let name = name("set");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    let zero = Some(Duration::ZERO);
    let rb = builder(&name)
        .rate_limit(RateLimit::queue(2).unwrap().insert_timeout(zero))
        .build()
        .unwrap();
    let other = ReplayBuffer::attach(&name).unwrap();
    assert_eq!(
        other.rate_limit_stats().unwrap().limit,
        rb.rate_limit_stats().unwrap().limit
    );
    other.extend(&rows(&other, 0, 2)).unwrap();
    assert!(matches!(
        rb.extend(&rows(&rb, 2, 1)),
        Err(DataError::RateLimited(RateLimitError::Timeout {
            inserts: 2,
            ..
        }))
    ));
    // A wider queue, set through the first handle: the second's insert goes.
    rb.set_rate_limit(RateLimit::queue(3).unwrap().insert_timeout(zero))
        .unwrap();
    other.extend(&rows(&other, 2, 1)).unwrap();
    assert_eq!(other.rate_limit_stats().unwrap().inserts, 3);
    assert!(matches!(rb.sample(3), Ok(b) if b.len() == 3));
    assert_eq!(other.rate_limit_stats().unwrap().samples, 3);
    // Rows counted and then refused are given back, for every handle: a batch of
    // another spec is counted (3 unsampled rows fewer than 3 now: it goes), fails,
    // and is taken back.
    let foreign =
        ReplayBuffer::builder(Spec::builder().field("x", DType::F32, []).build().unwrap())
            .capacity(4)
            .build()
            .unwrap();
    assert!(other.extend(&foreign.batch([1])).is_err());
    assert_eq!(rb.rate_limit_stats().unwrap().inserts, 3);
}

#[test]
fn a_shared_buffer_without_a_limit_lets_everything_through_and_refuses_the_controls() {
    let name = name("none");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    let rb = builder(&name).build().unwrap();
    let other = ReplayBuffer::attach(&name).unwrap();
    for h in [&rb, &other] {
        assert!(h.rate_limit_stats().is_none());
        assert_eq!(
            h.set_rate_limit(RateLimit::min_size(1)),
            Err(RateLimitError::NoLimit)
        );
        assert_eq!(h.close_rate_limit(), Err(RateLimitError::NoLimit));
    }
    other.extend(&rows(&other, 0, 100)).unwrap();
    assert!(matches!(rb.sample(8), Ok(b) if b.len() == 8));
    assert!(!matches!(rb.sample(8), Err(SampleError::RateLimited(_))));
}

#[test]
fn a_wait_ends_when_its_check_says_so() {
    let name = name("interrupt");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    let rb = builder(&name)
        .rate_limit(RateLimit::min_size(1000))
        .build()
        .unwrap();
    common::check_interruptible_waits(&rb);
}

/// A clear through one handle starts the counts over for every handle.
#[test]
fn a_clear_starts_the_counts_over_for_every_handle() {
    let name = name("clear");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    let short = Some(Duration::from_millis(30));
    let rb = builder(&name)
        .rate_limit(RateLimit::min_size(10).sample_timeout(short))
        .build()
        .unwrap();
    let other = ReplayBuffer::attach(&name).unwrap();
    common::check_clear_restarts_the_counts(&rb, &other);
}
