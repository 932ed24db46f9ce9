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
use std::process::Stdio;
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
        // Wait for a few dumps of this run (at least one, so that a checkpoint
        // exists), then kill at a random point of the next: counted in dumps and
        // then in the time the last one took, the kills land at different points
        // however fast this machine runs the child.
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let dumps = rng.random_range(1..=6);
        let (mut done, mut last, mut took) = (0, Instant::now(), Duration::from_millis(1));
        while done < dumps {
            // (The harness prints its `test dumping_child ... ` before the first line.)
            let line = lines.next().expect("the child dumps").unwrap();
            if line.contains("dumped") {
                done += 1;
                took = last.elapsed();
                last = Instant::now();
            }
        }
        std::thread::sleep(took.mul_f64(rng.random_range(0.0..1.0)));
        child.kill().unwrap();
        child.wait().unwrap();
        seen.insert(check_checkpoint(dir.path()));
    }
    // The kills landed at different points: more than one generation was left.
    assert!(seen.len() > 3, "kills left only generations {seen:?}");
}
