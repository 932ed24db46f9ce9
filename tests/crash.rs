//! A process killed at any point of `dumps` leaves the previous checkpoint loadable.
//!
//! The test binary runs itself as the child (`dumping_child`, which does nothing
//! unless `REPLAYBUF_CRASH_DIR` is set): it extends a buffer and dumps it over and
//! over into one directory. The parent kills it with SIGKILL after a random number
//! of dumps and a random part of the next, then loads the directory. Every checkpoint the child wrote is a state it can
//! name (extend `i` writes rows `i * CHUNK..`), so the loaded rows must be exactly
//! those of some generation.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use replaybuf::sampler::Prioritized;
use replaybuf::{DType, ReplayBuffer, Spec};

mod common;

const CAPACITY: usize = 20_000;
const CHUNK: usize = 3_000;
const RUNS: usize = 40;

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("payload", DType::F32, [40])
        .build()
        .unwrap()
}

fn buffer() -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(CAPACITY)
        .shards(2)
        .sampler(Prioritized::new(0.6, 0.4))
        .seed(17)
        .build()
        .unwrap()
}

/// Extend `i`: rows `i * CHUNK ..`, each row's payload derived from its id.
fn extend(rb: &ReplayBuffer, i: u64) {
    let mut b = rb.batch([CHUNK]);
    let ids: Vec<u64> = (i * CHUNK as u64..(i + 1) * CHUNK as u64).collect();
    let payload: Vec<f32> = ids
        .iter()
        .flat_map(|&id| (0..40).map(move |k| (id * 40 + k) as f32))
        .collect();
    b.set("id", &ids).unwrap();
    b.set("payload", &payload).unwrap();
    rb.extend(&b).unwrap();
}

#[test]
fn dumping_child() {
    let Ok(dir) = std::env::var("REPLAYBUF_CRASH_DIR") else {
        return;
    };
    let rb = buffer();
    for i in 0.. {
        extend(&rb, i);
        rb.save(&dir).unwrap();
        println!("dumped {i}");
    }
}

/// Checks that `dir` holds the state of the child after some extend, and returns
/// which.
fn check_checkpoint(dir: &Path) -> u64 {
    let rb = ReplayBuffer::from_checkpoint(dir).expect("the previous checkpoint loads");
    let extends = rb.write_count() / CHUNK as u64;
    assert_eq!(rb.write_count(), extends * CHUNK as u64);
    // The same state, rebuilt from scratch.
    let want = buffer();
    for i in 0..extends {
        extend(&want, i);
    }
    let (got, want) = (rb.read_all_in_order(None), want.read_all_in_order(None));
    assert_eq!(
        got.column::<u64>("id").unwrap(),
        want.column::<u64>("id").unwrap()
    );
    assert_eq!(
        got.column::<f32>("payload").unwrap(),
        want.column::<f32>("payload").unwrap()
    );
    assert!(replaybuf::internals::priorities_consistent(&rb));
    extends
}

/// Waits for `done` lines of `child` saying `word` (one a round of its work), then
/// kills it at a random point of the next round: counted in rounds and then in the
/// time the last one took, the kills land at different points however fast this
/// machine runs the child.
fn kill_inside(child: &mut Child, word: &str, done: usize, rng: &mut impl rand::Rng) {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut seen, mut last, mut took) = (0, Instant::now(), Duration::from_millis(1));
    while seen < done {
        // (The harness prints its `test NAME ... ` before the first line.)
        let line = lines.next().expect("the child works").unwrap();
        if line.contains(word) {
            seen += 1;
            took = last.elapsed();
            last = Instant::now();
        }
    }
    std::thread::sleep(took.mul_f64(rng.random_range(0.0..1.0)));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_killed_dump_leaves_the_previous_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..RUNS {
        let mut child = common::child("dumping_child", &[])
            .env("REPLAYBUF_CRASH_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // At least one dump, so that a checkpoint exists.
        kill_inside(&mut child, "dumped", rng.random_range(1..=6), &mut rng);
        seen.insert(check_checkpoint(dir.path()));
    }
    // The kills landed at different points: more than one generation was left.
    assert!(seen.len() > 3, "kills left only generations {seen:?}");
}

/// The restoring child: opens the file-backed buffer in `REPLAYBUF_RESTORE_DIR` and
/// restores the checkpoints in `REPLAYBUF_RESTORE_FROM` (two, `:`-separated) into it
/// by turns, forever.
#[test]
fn restoring_child() {
    let (Ok(dir), Ok(from)) = (
        std::env::var("REPLAYBUF_RESTORE_DIR"),
        std::env::var("REPLAYBUF_RESTORE_FROM"),
    ) else {
        return;
    };
    let mut rb = file_backed(Path::new(&dir));
    let from: Vec<&str> = from.split(':').collect();
    for i in 0.. {
        rb.restore(from[i % from.len()]).unwrap();
        println!("restored {i}");
    }
}

fn file_backed(dir: &Path) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(CAPACITY)
        .shards(2)
        .sampler(Prioritized::new(0.6, 0.4))
        .seed(17)
        .memmap(dir)
        .existsok(true)
        .build()
        .unwrap()
}

/// A process killed while it restores a checkpoint into a file-backed buffer leaves
/// a directory that opens with whole rows (the kill came between restores), or is
/// refused as holding an unfinished restore: never one that opens with torn rows
/// (rows part old, part new, under published stamps: 11 of 20 kills), nor one
/// refused for good as damaged, nor one whose rows no read returns.
#[test]
fn a_killed_restore_into_a_file_backed_buffer_is_refused_not_torn() {
    let tmp = tempfile::tempdir().unwrap();
    // Two checkpoints: a full one, and one of a third of the rows, of other ids.
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let full = buffer();
    for i in 10..17 {
        extend(&full, i);
    }
    full.save(&a).unwrap();
    let third = buffer();
    for i in 20..22 {
        extend(&third, i);
    }
    third.save(&b).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let (mut refused, mut opened) = (0, 0);
    for run in 0..20 {
        let dir = tmp.path().join(format!("mm{run}"));
        {
            let rb = file_backed(&dir);
            for i in 0..4 {
                extend(&rb, i);
            }
        }
        let mut child = common::child("restoring_child", &[])
            .env("REPLAYBUF_RESTORE_DIR", &dir)
            .env(
                "REPLAYBUF_RESTORE_FROM",
                format!("{}:{}", a.display(), b.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        kill_inside(&mut child, "restored", rng.random_range(1..=4), &mut rng);
        let reopened = ReplayBuffer::builder(spec())
            .capacity(CAPACITY)
            .shards(2)
            .sampler(Prioritized::new(0.6, 0.4))
            .memmap(&dir)
            .existsok(true)
            .build();
        match reopened {
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("never finished"), "run {run}: {e}");
                refused += 1;
            }
            Ok(rb) => {
                let rows = rb.read_all_in_order(None);
                let ids = rows.column::<u64>("id").unwrap();
                assert_eq!(ids.len(), rb.len(), "run {run}: every counted row reads");
                let payload = rows.column::<f32>("payload").unwrap();
                for (k, &id) in ids.iter().enumerate() {
                    let want: Vec<f32> = (0..40).map(|j| (id * 40 + j) as f32).collect();
                    assert_eq!(
                        &payload[k * 40..(k + 1) * 40],
                        &want[..],
                        "run {run}: row {id} torn"
                    );
                }
                // The rows of one state, none mixed: the first rows, or A's, or B's.
                let chunk = CHUNK as u64;
                let within = |extends: std::ops::Range<u64>| {
                    let rows = extends.start * chunk..extends.end * chunk;
                    ids.iter().all(|id| rows.contains(id))
                };
                assert!(
                    within(0..4) || within(10..17) || within(20..22),
                    "run {run}: rows of two states"
                );
                opened += 1;
            }
        }
    }
    assert!(
        refused > 0,
        "no kill landed inside a restore ({opened} opened)"
    );
}

/// The extending child: opens the file-backed buffer in `REPLAYBUF_EXTEND_DIR` (its
/// sampler `REPLAYBUF_EXTEND_SAMPLER`) and extends it forever, in chunks of
/// `EXTEND_CHUNK` rows, saying so after each.
#[test]
fn extending_child() {
    let (Ok(dir), Ok(sampler)) = (
        std::env::var("REPLAYBUF_EXTEND_DIR"),
        std::env::var("REPLAYBUF_EXTEND_SAMPLER"),
    ) else {
        return;
    };
    let rb = extended(Path::new(&dir), &sampler);
    for i in 0.. {
        let ids: Vec<u64> = (i * EXTEND_CHUNK..(i + 1) * EXTEND_CHUNK).collect();
        rb.extend(&rows(&rb, &ids)).unwrap();
        println!("extended {i}");
    }
}

const EXTEND_CHUNK: u64 = 20_000;
const EXTEND_CAPACITY: usize = 100_000;

fn extended(dir: &Path, sampler: &str) -> ReplayBuffer {
    let builder = ReplayBuffer::builder(spec()).capacity(EXTEND_CAPACITY);
    match sampler {
        "prioritized" => builder.sampler(Prioritized::new(0.6, 0.4)),
        "fifo" => builder.sampler(replaybuf::sampler::Fifo),
        _ => builder,
    }
    .seed(5)
    .memmap(dir)
    .existsok(true)
    .build()
    .unwrap()
}

fn rows(rb: &ReplayBuffer, ids: &[u64]) -> replaybuf::Batch {
    let mut b = rb.batch([ids.len()]);
    let payload: Vec<f32> = ids
        .iter()
        .flat_map(|&id| (0..40).map(move |k| (id * 40 + k) as f32))
        .collect();
    b.set("id", ids).unwrap();
    b.set("payload", &payload).unwrap();
    b
}

/// Checks every row of `batch` is whole; its ids.
fn whole_ids(batch: &replaybuf::Batch) -> Vec<u64> {
    let ids = batch.column::<u64>("id").unwrap();
    let payload = batch.column::<f32>("payload").unwrap();
    for (k, &id) in ids.iter().enumerate() {
        let want: Vec<f32> = (0..40).map(|j| (id * 40 + j) as f32).collect();
        assert_eq!(&payload[k * 40..(k + 1) * 40], &want[..], "row {id} torn");
    }
    ids.to_vec()
}

/// A process killed inside an `extend` of a file-backed buffer loses the rows it had
/// not published, and only those: the reopened buffer counts the rows it can read
/// (it counted every row the dead extend had claimed), samples (a uniform sample
/// failed once most of its window was such rows, every draw "landing on slots being
/// written"), and a FIFO queue hands out every row (it stopped at the first such row,
/// for good), the next writes' included.
#[test]
fn a_killed_extend_of_a_file_backed_buffer_leaves_only_readable_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut short = 0;
    for run in 0..12 {
        let sampler = ["uniform", "prioritized", "fifo"][run % 3];
        let dir = tmp.path().join(format!("mm{run}"));
        let mut child = common::child("extending_child", &[])
            .env("REPLAYBUF_EXTEND_DIR", &dir)
            .env("REPLAYBUF_EXTEND_SAMPLER", sampler)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let done: usize = rng.random_range(1..=7);
        kill_inside(&mut child, "extended", done, &mut rng);
        let done = done as u64;
        let rb = extended(&dir, sampler);
        let mut ids = whole_ids(&rb.read_all_in_order(None));
        assert_eq!(
            ids.len(),
            rb.len(),
            "run {run} ({sampler}): every counted row reads"
        );
        // One appender: the rows written are the first `write_count`, and the buffer
        // holds the last of them, none missing. Once the ring has lapped, the rows a
        // lap back whose slots the dead extend had begun to overwrite are gone too:
        // at most the one chunk it was writing.
        let written = rb.write_count();
        assert!(
            written >= done * EXTEND_CHUNK,
            "run {run}: {written} rows written"
        );
        ids.sort_unstable();
        let held = rb.len() as u64;
        assert!(
            written.min(EXTEND_CAPACITY as u64) - held <= EXTEND_CHUNK,
            "run {run}: {held} rows held of {written} written"
        );
        assert!(
            ids.iter().copied().eq(written - held..written),
            "run {run}: held {} rows, {:?}..={:?}, for the last {held} of {written}",
            ids.len(),
            ids.first(),
            ids.last()
        );
        short += usize::from(written < (done + 1) * EXTEND_CHUNK);
        let more: Vec<u64> = (1_000_000..1_000_000 + 500).collect();
        rb.extend(&rows(&rb, &more)).unwrap();
        if sampler == "fifo" {
            let popped = common::pop_all(&rb, 4096, whole_ids);
            let held = (ids.len() + more.len()).min(EXTEND_CAPACITY);
            assert_eq!(popped.len(), held, "run {run}: every row popped");
            assert!(popped.ends_with(&more), "run {run}: the new rows last");
        } else {
            for _ in 0..20 {
                whole_ids(&rb.sample(256).unwrap());
            }
        }
    }
    assert!(short > 0, "no kill landed inside an extend");
}
