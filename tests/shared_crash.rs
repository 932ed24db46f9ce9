//! Shared mode under crashes: real processes (this test binary running itself as the
//! children; `crash_child` does nothing unless `REPLAYBUF_CRASH_ROLE` is set), killed
//! with SIGKILL inside `extend`, inside `write_all` and inside a freeze (`dumps`), many
//! times at random points; and a live writer in another PID namespace. Afterwards the
//! buffer keeps working, `dumps` completes, every row read self-checks, and nothing but
//! a killed writer's unpublished rows is lost. Waits are bounded by a watchdog.
// Test threads, not the crate's: the loom facade is for the library.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead, BufReader, Lines, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use replaybuf::sampler::{Fifo, Prioritized, Uniform};
use replaybuf::{DType, ReplayBuffer, ReplayBufferBuilder, Spec};

mod common;

fn name(test: &str) -> String {
    common::shm::name("crash", test)
}

/// Words of each row's self-check: enough that a kill often lands mid-row.
const CHECK: usize = 64;

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("check", DType::U64, [CHECK])
        .build()
        .unwrap()
}

fn check_of(id: u64) -> impl Iterator<Item = u64> {
    (0..CHECK as u64).map(move |k| id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k)
}

fn builder(name: &str, capacity: usize, shards: usize) -> ReplayBufferBuilder {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .shards(shards)
        .sampler(Prioritized::new(0.6, 0.4))
        .seed(11)
        .shared(name)
}

fn rows(rb: &ReplayBuffer, ids: &[u64]) -> replaybuf::Batch {
    let mut b = rb.batch([ids.len()]);
    b.set("id", ids).unwrap();
    let check: Vec<u64> = ids.iter().flat_map(|&i| check_of(i)).collect();
    b.set("check", &check).unwrap();
    b
}

/// Asserts every row of `batch` is whole; returns the ids.
fn whole(batch: &replaybuf::Batch) -> Vec<u64> {
    let ids = batch.column::<u64>("id").unwrap();
    let check = batch.column::<u64>("check").unwrap();
    for (k, &id) in ids.iter().enumerate() {
        let want: Vec<u64> = check_of(id).collect();
        assert_eq!(
            &check[k * CHECK..(k + 1) * CHECK],
            &want[..],
            "torn row {id}"
        );
    }
    ids.to_vec()
}

/// The child: attaches to `REPLAYBUF_CRASH_NAME` and plays its role until killed.
#[test]
fn crash_child() {
    let Ok(role) = std::env::var("REPLAYBUF_CRASH_ROLE") else {
        return;
    };
    let name = std::env::var("REPLAYBUF_CRASH_NAME").unwrap();
    let base: u64 = std::env::var("REPLAYBUF_CRASH_BASE")
        .unwrap()
        .parse()
        .unwrap();
    let rb = ReplayBuffer::attach(&name).unwrap();
    match role.as_str() {
        "writer" => {
            let writer = writer_within(&rb, Duration::from_secs(60));
            println!("shard {}", writer.shard());
            for c in 0u64.. {
                let ids: Vec<u64> = (0..32).map(|i| base + c * 32 + i).collect();
                writer.extend(&rows(&rb, &ids)).unwrap();
                if c == 0 {
                    println!("writing");
                }
            }
        }
        "editor" => {
            println!("editing");
            for c in 0u64.. {
                let n = rb.len();
                let ids: Vec<u64> = (0..n as u64).map(|i| base + c * 1_000_000 + i).collect();
                rb.write_all(&rows(&rb, &ids), None).unwrap();
            }
        }
        "dumper" => {
            let dir = std::env::var("REPLAYBUF_CRASH_DIR").unwrap();
            println!("dumping");
            for c in 0u64.. {
                rb.save(std::path::Path::new(&dir).join(format!("d{}", c % 2)))
                    .unwrap();
            }
        }
        other => panic!("unknown role {other}"),
    }
}

/// A writer handle, waiting up to `limit` for a shard to come free. The parent holds
/// one of the two shards (its buffer-level extends), and a process that meets the last
/// round's killed writer's row holds that writer's lease while it repairs the shard.
/// (The failures once put down to a slow repair under a sanitizer were a reclaim that
/// kept a lease it found free: `shared::procs::take_from_dead`.)
fn writer_within(rb: &ReplayBuffer, limit: Duration) -> replaybuf::Writer {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match rb.try_writer() {
            Ok(writer) => return writer,
            Err(e) if std::time::Instant::now() >= deadline => {
                panic!("no writer handle within {limit:?}: {e}")
            }
            // `try_writer` waited half a second itself.
            Err(_) => {}
        }
    }
}

fn spawn(wrapper: &[&str], name: &str, role: &str, base: u64, dir: &str) -> Child {
    common::child("crash_child", wrapper)
        .env("REPLAYBUF_CRASH_ROLE", role)
        .env("REPLAYBUF_CRASH_NAME", name)
        .env("REPLAYBUF_CRASH_BASE", base.to_string())
        .env("REPLAYBUF_CRASH_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the child's stderr on a thread of its own, so that it never blocks on the
/// pipe, and keeps it for [`wait_for`]'s failure message (a child that ends early,
/// under a sanitizer say, tells why there).
fn keep_stderr(child: &mut Child) -> Option<JoinHandle<String>> {
    let mut pipe = child.stderr.take()?;
    Some(std::thread::spawn(move || {
        let mut said = String::new();
        let _ = pipe.read_to_string(&mut said);
        said
    }))
}

/// Waits for the child to print a line starting with `prefix`; returns the line. If
/// the child ends first, fails with what it wrote to stderr ([`keep_stderr`]).
fn wait_for(
    lines: &mut Lines<BufReader<ChildStdout>>,
    prefix: &str,
    stderr: &mut Option<JoinHandle<String>>,
) -> String {
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(at) = line.find(prefix) {
            return line[at..].to_owned();
        }
    }
    let said = stderr.take().map_or_else(String::new, |reader| {
        within(30, "reading the child's stderr", move || {
            reader.join().unwrap_or_default()
        })
    });
    panic!("the child ended before saying {prefix:?}; its stderr:\n{said}");
}

/// Runs `f` on another thread and fails if it has not returned within `secs`: a hang
/// is a failure, not a test runner that never ends.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(answer) => answer,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("hung: {what} did not finish within {secs} s")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} failed (above)"),
    }
}

/// A small random-ish delay in microseconds, different every round.
fn jitter(round: u64, max_us: u64) -> Duration {
    let x = (round + 1).wrapping_mul(0x2545_f491_4f6c_dd1d) ^ u64::from(std::process::id());
    Duration::from_micros(x % max_us)
}

/// After the crashes: the buffer still takes writes, `dumps` completes, and every row
/// read whole.
fn still_works(rb: &ReplayBuffer, dir: &std::path::Path, base: u64) {
    let rb = rb.clone();
    let dir = dir.to_owned();
    within(120, "recovery after the kills", move || {
        let writer = rb.writer();
        for c in 0..8u64 {
            let ids: Vec<u64> = (0..64).map(|i| base + c * 64 + i).collect();
            writer.extend(&rows(&rb, &ids)).unwrap();
        }
        rb.save(dir.join("after")).unwrap();
        let all = rb.read_all_in_order(None);
        whole(&all);
        let mut learner = rb.learner();
        for _ in 0..20 {
            whole(&learner.sample(64).unwrap());
        }
        let loaded = ReplayBuffer::from_checkpoint(dir.join("after")).unwrap();
        whole(&loaded.read_all_in_order(None));
    });
}

/// Rounds of killing; `REPLAYBUF_CRASH_ROUNDS` sets it (more in scripts/stress).
fn rounds() -> u64 {
    std::env::var("REPLAYBUF_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

#[test]
fn writers_editors_and_dumpers_killed_at_random_points_leave_a_working_buffer() {
    let name = name("kills");
    let rb = builder(&name, 4096, 2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap().to_owned();
    let seeded: Vec<u64> = (0..2048).collect();
    rb.extend(&rows(&rb, &seeded)).unwrap();
    for round in 0..rounds() {
        let base = (round + 1) << 40;
        // One of each, racing; all killed at a random point of their work.
        let mut children: Vec<Child> = ["writer", "editor", "dumper"]
            .iter()
            .enumerate()
            .map(|(k, role)| spawn(&[], &name, role, base + ((k as u64) << 36), &dir_s))
            .collect();
        for (child, says) in children.iter_mut().zip(["writing", "editing", "dumping"]) {
            let mut stderr = keep_stderr(child);
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            wait_for(&mut lines, says, &mut stderr);
            // Keep reading (and dropping) its output so it never blocks on a pipe.
            std::thread::spawn(move || lines.for_each(drop));
        }
        std::thread::sleep(jitter(round, 30_000));
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        // The survivors (this process) go on, every round.
        let rb2 = rb.clone();
        let at = dir.path().join("round");
        within(120, "dumps after a round of kills", move || {
            rb2.save(&at).unwrap();
            whole(&rb2.read_all_in_order(None));
        });
    }
    still_works(&rb, dir.path(), 1 << 60);
}

#[test]
fn a_live_writer_in_another_pid_namespace_is_not_taken_for_dead() {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        println!("skipped: this kernel or user may not make a PID namespace (unshare --pid)");
        return;
    }
    let name = name("pidns");
    let rb = builder(&name, 4096, 2).build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn(
        &["unshare", "--pid", "--fork", "--kill-child=SIGKILL"],
        &name,
        "writer",
        1 << 40,
        dir.path().to_str().unwrap(),
    );
    let mut stderr = keep_stderr(&mut child);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let said = wait_for(&mut lines, "shard ", &mut stderr);
    let theirs: usize = said["shard ".len()..].trim().parse().unwrap();
    wait_for(&mut lines, "writing", &mut stderr);
    let drain = std::thread::spawn(move || lines.for_each(drop));
    // Two writer handles here: the free shard, then (none left) the same one again.
    // The child's shard must not be taken over while the child writes.
    let (a, b) = (rb.writer(), rb.writer());
    assert_ne!(a.shard(), theirs, "a live process's lease was taken over");
    assert_ne!(b.shard(), theirs, "a live process's lease was taken over");
    // This process sees it as live, whatever pid it has in its own namespace.
    let live = replaybuf::shared::list()
        .into_iter()
        .find(|r| r.name == name)
        .map(|r| r.live.len())
        .unwrap_or(0);
    assert_eq!(live, 2, "both processes are live members of the region");
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    drop(drain);
    // The kill reached `unshare`, which (`--kill-child`) kills the namespace's init, the
    // writer, with it.
    let rb2 = rb.clone();
    within(60, "taking the dead namespace's shard over", move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while replaybuf::shared::list()
            .into_iter()
            .find(|r| r.name == name)
            .is_some_and(|r| r.live.len() > 1)
        {
            assert!(std::time::Instant::now() < deadline, "the child never died");
            std::thread::sleep(Duration::from_millis(20));
        }
        let c = rb2.writer();
        assert_eq!(c.shard(), theirs, "a dead process's shard is taken over");
        let ids: Vec<u64> = (0..64).map(|i| (9 << 40) + i).collect();
        c.extend(&rows(&rb2, &ids)).unwrap();
        whole(&rb2.read_all_in_order(None));
    });
    still_works(&rb, dir.path(), 1 << 61);
}

/// A FIFO queue in shared memory whose writer process is killed inside an `extend`
/// hands out every row that writer published, once and in order, and then the rows
/// written after: the rows it claimed and never published are skipped, not waited
/// for.
#[test]
fn a_shared_fifo_queue_whose_writer_was_killed_hands_out_every_published_row() {
    let name = name("fifo");
    let rb = builder(&name, 1 << 18, 2).sampler(Fifo).build().unwrap();
    // This process's own shard, leased for good; each child writes the other, taking
    // it over from the child before.
    let writer = rb.writer();
    for round in 0..rounds().min(6) {
        let base = (round + 1) << 40;
        kill_a_writer_inside_an_extend(&name, base, round);
        // The queue: the dead writer's published rows, oldest first, with none left
        // out (a chunk took a few µs: the ring, 2^17 rows a shard, did not lap).
        let popped = within(60, "popping after a kill", {
            let rb = rb.clone();
            move || common::pop_all(&rb, 4096, whole)
        });
        assert!(popped.len() >= 32, "round {round}: {} popped", popped.len());
        assert!(
            popped.iter().copied().eq(base..base + popped.len() as u64),
            "round {round}: {} rows popped, {:?}..={:?}",
            popped.len(),
            popped.first(),
            popped.last()
        );
        // And the queue goes on.
        let more: Vec<u64> = (0..100).map(|i| base + (1 << 36) + i).collect();
        writer.extend(&rows(&rb, &more)).unwrap();
        let popped = within(60, "popping new rows after a kill", {
            let rb = rb.clone();
            move || common::pop_all(&rb, 4096, whole)
        });
        assert_eq!(popped, more, "round {round}");
    }
}

/// A rewrite after a collector process was killed inside an `extend` rewrites: the
/// editor waits for the appenders inside the shard to leave, and the dead one's
/// shard is taken over (it waited for good, the dead appender counted inside).
#[test]
fn a_rewrite_after_a_collector_was_killed_inside_an_extend_goes_through() {
    let name = name("rewrite");
    let rb = builder(&name, 1 << 16, 1).sampler(Uniform).build().unwrap();
    for round in 0..rounds().min(6) {
        let base = (round + 1) << 40;
        kill_a_writer_inside_an_extend(&name, base, round);
        let new = base + (1 << 36);
        let first = within(60, "a rewrite after a kill", {
            let rb = rb.clone();
            move || {
                rb.write_at(&[0], &rows(&rb, &[new])).unwrap();
                whole(&rb.read_all_in_order(None))[0]
            }
        });
        assert_eq!(first, new, "round {round}");
    }
}

/// Starts a writer child on the shared buffer `name`, writing ids from `base` on, and
/// kills it a moment (up to 2 ms, varying with `round`) after its first extend:
/// most often inside one.
fn kill_a_writer_inside_an_extend(name: &str, base: u64, round: u64) {
    let mut child = spawn(&[], name, "writer", base, "");
    let mut stderr = keep_stderr(&mut child);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    wait_for(&mut lines, "writing", &mut stderr);
    std::thread::spawn(move || lines.for_each(drop));
    std::thread::sleep(jitter(round, 2_000));
    child.kill().unwrap();
    child.wait().unwrap();
}
