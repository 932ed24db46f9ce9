//! Helpers the integration tests share: each test file takes what it needs with
//! `mod common;` (the command's tests too, by path). A helper lives here once two
//! files would otherwise write it twice.

// Each test file uses some of these, never all.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// This test binary run again as a child process that runs its test `test` alone (a
/// test that does nothing unless the environment gives it a role), under `wrapper`
/// (a program and its arguments, such as `unshare --pid --fork`) when there is one.
pub fn child(test: &str, wrapper: &[&str]) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["--exact", test, "--nocapture", "--test-threads", "1"]);
    // A child that outlives its test (one that failed before killing it) would run its
    // role forever: the kernel kills it when the thread that spawned it ends (the
    // death signal follows the spawning thread, not the process).
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: `prctl` is async-signal-safe and touches only this forked child.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// How long a timed race runs: the environment variable `var` in milliseconds, or
/// 1.5 s (`REPLAYBUF_STRESS_MS` for the stress tests, `REPLAYBUF_RACE_MS` for the
/// deadlock races).
pub fn race_duration(var: &str) -> Duration {
    let ms = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    Duration::from_millis(ms)
}

/// A check word derived from a row's id: a row whose check is not `mix(id)` is torn.
pub fn mix(id: u64) -> u64 {
    id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed
}

/// Shared-memory regions of the tests: names unique to one test run, their files,
/// their removal when a test ends, and real regions planted under other names.
pub mod shm {
    use std::fs::{self, OpenOptions, Permissions};
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

    use replaybuf::{DType, ReplayBuffer, ReplayBufferBuilder, Spec};

    use super::PathBuf;

    /// Rows of an id and two floats.
    pub fn spec() -> Spec {
        Spec::builder()
            .field("id", DType::U64, [])
            .field("x", DType::F32, [2])
            .build()
            .unwrap()
    }

    /// A small two-shard buffer in the region `name`.
    pub fn builder(name: &str) -> ReplayBufferBuilder {
        ReplayBuffer::builder(spec())
            .capacity(1024)
            .shards(2)
            .seed(5)
            .shared(name)
    }

    /// The bytes of a real, ready region of `builder`'s layout (named for test `test`
    /// of suite `suite`, removed after): what a user who pre-creates a name would
    /// plant, so that an unchecked attach goes all the way.
    pub fn real_region_bytes(suite: &str, test: &str) -> Vec<u8> {
        let name = name(suite, &format!("{test}-model"));
        let _cleanup = Cleanup(path_of(&name));
        let rb = builder(&name).build().unwrap();
        let mut b = rb.batch([4]);
        b.set("id", &[1u64, 2, 3, 4]).unwrap();
        b.set("x", &[0f32; 8]).unwrap();
        rb.extend(&b).unwrap();
        fs::read(path_of(&name)).unwrap()
    }

    /// Plants `bytes` as the region `name`, with permission bits `mode`.
    pub fn plant(name: &str, bytes: &[u8], mode: u32) -> Cleanup {
        let path = path_of(name);
        let _ = fs::remove_file(&path);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        f.write_all(bytes).unwrap();
        // Past the umask: exactly `mode`.
        fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
        Cleanup(path)
    }

    /// A region name for test `test` of the suite `suite`, unique to this process.
    pub fn name(suite: &str, test: &str) -> String {
        format!("test-{suite}-{test}-{}", std::process::id())
    }

    /// The file of region `name`.
    pub fn path_of(name: &str) -> PathBuf {
        PathBuf::from(format!("/dev/shm/replaybuf.{name}"))
    }

    /// Removes a `/dev/shm` object when the test ends, passed or failed.
    pub struct Cleanup(pub PathBuf);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The learner-pipeline tests' buffer (`tests/pipeline.rs`, `tests/prefetch.rs`):
/// rows with an id, `obs = [id, -id]` and reward 1.
pub mod rewards {
    use replaybuf::{Batch, DType, ReplayBuffer, Spec};

    pub fn spec() -> Spec {
        Spec::builder()
            .field("obs", DType::F32, [2])
            .field("id", DType::I64, [])
            .field("reward", DType::F32, [])
            .build()
            .unwrap()
    }

    pub fn buffer(capacity: usize) -> ReplayBuffer {
        ReplayBuffer::builder(spec())
            .capacity(capacity)
            .seed(5)
            .build()
            .unwrap()
    }

    /// `n` rows with ids `first..`, `obs = [id, -id]`, reward 1.
    pub fn rows(rb: &ReplayBuffer, n: usize, first: i64) -> Batch {
        let mut b = rb.batch([n]);
        let ids: Vec<i64> = (first..first + n as i64).collect();
        let obs: Vec<f32> = ids.iter().flat_map(|&i| [i as f32, -(i as f32)]).collect();
        b.set("id", &ids).unwrap();
        b.set("obs", &obs).unwrap();
        b.column_mut::<f32>("reward").unwrap().fill(1.0);
        b
    }
}

/// Every row a FIFO buffer hands out, `n` at a time, until it says it is empty: each
/// batch's ids as `ids` reads them (checking the rows whole, say). Any other failure
/// fails the test.
pub fn pop_all(
    rb: &replaybuf::ReplayBuffer,
    n: usize,
    ids: impl Fn(&replaybuf::Batch) -> Vec<u64>,
) -> Vec<u64> {
    let mut popped = Vec::new();
    loop {
        match rb.sample(n) {
            Ok(batch) => popped.extend(ids(&batch)),
            Err(replaybuf::error::SampleError::Empty) => return popped,
            Err(e) => panic!("after {} rows: {e}", popped.len()),
        }
    }
}

/// Rows of an id, a payload of `bytes`, a flag and a priority (`prio`): rows of
/// `bytes + 13` bytes, for the streaming tests' rows of any size.
pub fn payload_spec(bytes: usize) -> replaybuf::Spec {
    use replaybuf::DType;
    replaybuf::Spec::builder()
        .field("id", DType::U64, [])
        .field("payload", DType::U8, [bytes])
        .field("flag", DType::Bool, [])
        .field("prio", DType::F32, [])
        .build()
        .unwrap()
}

/// Fills `batch` (of a [`payload_spec`]) with rows `ids`, every byte derived from the
/// row's id, its priority [`payload_priority`].
pub fn fill_payload_rows(batch: &mut replaybuf::Batch, ids: &[u64]) {
    batch.set("id", ids).unwrap();
    let len = batch.spec().field("payload").unwrap().1.bytes() as u64;
    let payload: Vec<u8> = ids
        .iter()
        .flat_map(|&i| (0..len).map(move |k| (i.wrapping_mul(131) + k) as u8))
        .collect();
    batch.set("payload", &payload).unwrap();
    let flag: Vec<bool> = ids.iter().map(|&i| i % 3 == 0).collect();
    batch.set("flag", &flag).unwrap();
    let prio: Vec<f32> = ids.iter().map(|&i| payload_priority(i) as f32).collect();
    batch.set("prio", &prio).unwrap();
}

/// The priority [`fill_payload_rows`] writes row `id` with.
pub fn payload_priority(id: u64) -> f64 {
    (id % 97 + 1) as f64 / 8.0
}

/// `RateLimit::interruptible`, checked on `rb`, a buffer of one `id` column built with
/// `RateLimit::min_size(1000)` and nothing in it: a sample waits, with no timeout.
/// The wait consults the check every period, also while inserts wake it more often
/// than that without letting it go; it ends once the check says so, nothing counted;
/// and with a check that says to go on, it ends as ever, once enough rows are in.
#[allow(clippy::disallowed_types)] // the loom facade rule is for the library
pub fn check_interruptible_waits(rb: &replaybuf::ReplayBuffer) {
    use replaybuf::error::{RateLimitError, SampleError};
    use replaybuf::RateLimit;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::time::Instant;

    static STOP: AtomicBool = AtomicBool::new(false);
    static CHECKS: AtomicUsize = AtomicUsize::new(0);
    fn check() -> bool {
        CHECKS.fetch_add(1, SeqCst);
        STOP.load(SeqCst)
    }
    let insert = |first: u64, n: usize| {
        let mut b = rb.batch([n]);
        b.set("id", &(first..first + n as u64).collect::<Vec<_>>())
            .unwrap();
        rb.extend(&b).unwrap();
    };
    let period = RateLimit::INTERRUPT_EVERY;
    std::thread::scope(|s| {
        // The check is this thread's: one in force on the waiter's thread does not
        // reach the inserter's, nor the other way round.
        let waiter = s.spawn(|| RateLimit::interruptible(check, || rb.sample(1)));
        let mut inserted = 0;
        let start = Instant::now();
        // Woken every 5 ms by an insert that does not let it go.
        while CHECKS.load(SeqCst) < 3 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no check in 30 s"
            );
            insert(inserted, 1);
            inserted += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !waiter.is_finished(),
            "a check that says to go on ends no wait"
        );
        assert!(
            start.elapsed() >= 2 * period,
            "checked more often than each period"
        );
        STOP.store(true, SeqCst);
        let got = waiter.join().unwrap();
        assert!(
            matches!(
                got,
                Err(SampleError::RateLimited(RateLimitError::Interrupted))
            ),
            "{got:?}"
        );
        let stats = rb.rate_limit_stats().unwrap();
        assert_eq!((stats.inserts, stats.samples), (inserted, 0));

        // Going on: it ends when the rows are in.
        STOP.store(false, SeqCst);
        let waiter = s.spawn(|| RateLimit::interruptible(check, || rb.sample(1)));
        std::thread::sleep(2 * period);
        insert(inserted, 1000);
        assert_eq!(waiter.join().unwrap().unwrap().len(), 1);
        assert_eq!(rb.rate_limit_stats().unwrap().samples, 1);
    });
}

/// A clear starts the rate limit's counts over, for every handle: `rb` and `other`
/// (the same buffer, or two handles on one shared region), of one `id` column, built
/// with `RateLimit::min_size(10)` and a short sample timeout, and empty. After 10
/// rows, a sample and a clear through `rb`, a sample through `other` waits for the
/// min size again (it found the buffer empty, the rows before the clear still
/// counted) and times out with nothing counted; once 10 more rows are in, `rb`'s goes.
pub fn check_clear_restarts_the_counts(
    rb: &replaybuf::ReplayBuffer,
    other: &replaybuf::ReplayBuffer,
) {
    use replaybuf::error::{RateLimitError, SampleError};
    let insert = |into: &replaybuf::ReplayBuffer, first: u64| {
        let mut b = into.batch([10]);
        b.set("id", &(first..first + 10).collect::<Vec<_>>())
            .unwrap();
        into.extend(&b).unwrap();
    };
    insert(rb, 0);
    other.sample(4).unwrap();
    rb.clear().unwrap();
    let s = other.rate_limit_stats().unwrap();
    assert_eq!((s.inserts, s.samples), (0, 0));
    assert!(matches!(
        other.sample(4),
        Err(SampleError::RateLimited(RateLimitError::Timeout {
            inserts: 0,
            ..
        }))
    ));
    insert(other, 10);
    assert_eq!(rb.sample(4).unwrap().len(), 4);
}
