//! A learner held to a fixed replay ratio by the buffer's rate limit.
//!
//! Off-policy agents are tuned by their replay ratio: how many times, on average, each
//! collected transition is sampled. Left alone, a fast learner overfits the few rows it
//! has and a slow one lets collected data go unused; the usual fix is a sleep in one
//! loop or the other, which drifts with the machine's load. Here the buffer keeps the
//! ratio itself (Reverb's `SampleToInsertRatio`): the learner waits when it is ahead,
//! the collectors wait when they are, and neither spins.
//!
//! Two collector threads step noisy random walks and extend chunks of transitions; a
//! learner thread samples batches for a fixed number of steps. Each collector's step
//! costs a different amount of time, and the learner's step costs yet another: the
//! printed ratio of rows sampled to rows inserted stays at the target however the
//! costs are set (`--learner-us`, `--collector-us`), and the counts of waits say who
//! waited on whom.
//!
//! ```sh
//! cargo run --release --example replay_ratio -- --ratio 8 --learner-us 50
//! ```

// The loom facade rule (spin hints only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use replaybuf::error::{DataError, SampleError};
use replaybuf::{DType, RateLimit, RateLimitError, ReplayBuffer, Spec};

struct Args {
    ratio: f64,
    learner_us: u64,
    collector_us: u64,
    seconds: f64,
}

fn args() -> Args {
    let mut a = Args {
        ratio: 8.0,
        learner_us: 20,
        collector_us: 5,
        seconds: 3.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--ratio" => a.ratio = value.parse().expect("--ratio takes a number"),
            "--learner-us" => a.learner_us = value.parse().expect("--learner-us takes µs"),
            "--collector-us" => a.collector_us = value.parse().expect("--collector-us takes µs"),
            "--seconds" => a.seconds = value.parse().expect("--seconds takes a number"),
            _ => panic!("flags: --ratio R --learner-us N --collector-us N --seconds S"),
        }
    }
    a
}

/// Busy work standing in for a simulator step or a gradient step.
fn work(us: u64) {
    let until = Instant::now() + Duration::from_micros(us);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

const CHUNK: usize = 64;
const BATCH: usize = 256;
const MIN_SIZE: u64 = 2_000;

fn main() {
    let a = args();
    let spec = Spec::builder()
        .field("obs", DType::F32, [4])
        .field("action", DType::I64, [])
        .field("reward", DType::F32, [])
        .field("next_obs", DType::F32, [4])
        .build()
        .expect("a valid spec");
    // Each row sampled `ratio` times, give or take two batches; samples wait for
    // MIN_SIZE rows first.
    let limit = RateLimit::sample_to_insert_ratio(a.ratio, MIN_SIZE, 2.0 * BATCH as f64)
        .expect("a valid limit");
    let rb = ReplayBuffer::builder(spec)
        .capacity(100_000)
        .shards(2)
        .seed(1)
        .rate_limit(limit)
        .build()
        .expect("a valid buffer");

    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(a.seconds);
    let mut learner_steps = 0u64;
    std::thread::scope(|s| {
        for c in 0..2u64 {
            let (rb, cost) = (&rb, a.collector_us * (c + 1));
            s.spawn(move || {
                let writer = rb.writer();
                let mut state = [0f32; 4];
                let mut chunk = rb.batch([CHUNK]);
                let mut k = 0u64;
                loop {
                    // A noisy walk: the next observation follows from the action.
                    let (mut obs, mut next, mut act, mut rew) = (vec![], vec![], vec![], vec![]);
                    for _ in 0..CHUNK {
                        work(cost);
                        k += 1;
                        let action = (k.wrapping_mul(0x9e37_79b9) >> 7) % 2;
                        obs.extend_from_slice(&state);
                        for (i, x) in state.iter_mut().enumerate() {
                            *x += if action == 1 { 0.1 } else { -0.1 } * (i + 1) as f32;
                        }
                        next.extend_from_slice(&state);
                        act.push(action as i64);
                        rew.push(-state[0].abs());
                    }
                    chunk.set("obs", &obs).unwrap();
                    chunk.set("next_obs", &next).unwrap();
                    chunk.set("action", &act).unwrap();
                    chunk.set("reward", &rew).unwrap();
                    match writer.extend(&chunk) {
                        Ok(_) => {}
                        // The learner is done and closed the limiter.
                        Err(DataError::RateLimited(RateLimitError::Closed)) => return,
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
        let mut learner = rb.learner();
        let mut last_print = Instant::now();
        while Instant::now() < deadline {
            match learner.sample(BATCH) {
                Ok(batch) => {
                    // A gradient step would use the batch here.
                    assert_eq!(batch.len(), BATCH);
                    work(a.learner_us);
                    learner_steps += 1;
                }
                Err(SampleError::RateLimited(e)) => panic!("{e}"),
                Err(e) => panic!("{e}"),
            }
            if last_print.elapsed() >= Duration::from_secs(1) {
                last_print = Instant::now();
                report(&rb, started);
            }
        }
        // Stop the collectors: any of them waiting on the learner returns now.
        rb.close_rate_limit().expect("the buffer has a rate limit");
    });
    report(&rb, started);
    let s = rb.rate_limit_stats().expect("the buffer has a rate limit");
    let ratio = s.samples as f64 / s.inserts as f64;
    println!(
        "{learner_steps} learner steps; {} rows inserted, {} sampled: {ratio:.2} samples per insert (target {})",
        s.inserts, s.samples, a.ratio
    );
}

fn report(rb: &ReplayBuffer, started: Instant) {
    let s = rb.rate_limit_stats().expect("the buffer has a rate limit");
    println!(
        "{:5.1}s  inserted {:>9}  sampled {:>10}  ratio {:6.2}  collector waits {:>6} ({:>7.1?})  learner waits {:>6} ({:>7.1?})",
        started.elapsed().as_secs_f64(),
        s.inserts,
        s.samples,
        s.samples as f64 / s.inserts.max(1) as f64,
        s.insert_waits,
        s.insert_waited,
        s.sample_waits,
        s.sample_waited,
    );
}
