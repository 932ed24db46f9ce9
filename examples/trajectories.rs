//! Collectors that each own their environments' columns, and a learner that samples
//! windows of trajectories for n-step returns.
//!
//! The storage is `[T, E]` (`ndim(2)`, 8 environments). Two collector threads each take
//! a [`Writer`](replaybuf::Writer), which owns half of the environments, and step
//! their environments together: every extend is `[t, 4]`, `t` steps of each. Episodes
//! end at random lengths, with a `done` flag. A learner thread meanwhile samples
//! batches of 16 windows of 8 steps and computes each window's discounted n-step
//! return from the window's first step, stopping at the episode's end using the
//! batch's marks. It checks that every window is consecutive steps of one episode of
//! one environment: the count of bad windows it prints is always 0.
//!
//! At the end, one collector batch is cut into padded episodes with
//! `split_trajectories`.
//!
//! ```sh
//! cargo run --release --example trajectories
//! ```

// The loom facade rule (atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use replaybuf::sampler::Slice;
use replaybuf::trajectories::{split_trajectories, Split};
use replaybuf::{Batch, DType, ReplayBuffer, Spec, Writer};

const ENVS: usize = 8;
const STEPS_PER_EXTEND: usize = 16;
const GAMMA: f32 = 0.9;

fn spec() -> Result<Spec, replaybuf::error::SpecError> {
    Spec::builder()
        .field("env", DType::I64, [])
        .field("episode", DType::I64, [])
        .field("t", DType::I64, [])
        .field("reward", DType::F32, [])
        .field("done", DType::Bool, [])
        .build()
}

/// One environment: episodes of 5 to 40 steps, reward 1 on the last step.
struct Env {
    id: i64,
    episode: i64,
    t: i64,
    len: i64,
    rng: u64,
}

impl Env {
    fn new(id: i64) -> Env {
        let mut env = Env {
            id,
            episode: 0,
            t: 0,
            len: 0,
            rng: 0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1).wrapping_mul(0x2545_f491),
        };
        env.len = env.episode_len();
        env
    }

    fn episode_len(&mut self) -> i64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        5 + (self.rng % 36) as i64
    }

    /// The next step: (episode, t, reward, done).
    fn step(&mut self) -> (i64, i64, f32, bool) {
        let done = self.t == self.len - 1;
        let step = (self.episode, self.t, if done { 1.0 } else { 0.0 }, done);
        self.t += 1;
        if done {
            self.t = 0;
            self.episode += 1;
            self.len = self.episode_len();
        }
        step
    }
}

/// `STEPS_PER_EXTEND` steps of `envs`, laid out `[t, envs]`.
fn collect(rb: &ReplayBuffer, envs: &mut [Env]) -> Result<Batch, replaybuf::error::DataError> {
    let mut batch = rb.batch([STEPS_PER_EXTEND, envs.len()]);
    let (mut env, mut episode, mut t, mut reward, mut done) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..STEPS_PER_EXTEND {
        for e in envs.iter_mut() {
            let (ep, step, r, d) = e.step();
            env.push(e.id);
            episode.push(ep);
            t.push(step);
            reward.push(r);
            done.push(d);
        }
    }
    batch.set("env", &env)?;
    batch.set("episode", &episode)?;
    batch.set("t", &t)?;
    batch.set("reward", &reward)?;
    batch.set("done", &done)?;
    Ok(batch)
}

fn run_collector(writer: Writer, stop: &AtomicBool) -> Result<u64, replaybuf::error::DataError> {
    let group = writer.envs().unwrap_or(0..ENVS);
    let mut envs: Vec<Env> = group.map(|e| Env::new(e as i64)).collect();
    let mut written = 0;
    while !stop.load(Ordering::Relaxed) {
        let batch = collect(writer.buffer(), &mut envs)?;
        writer.extend(&batch)?;
        written += batch.len() as u64;
    }
    Ok(written)
}

/// What the learner saw.
#[derive(Default)]
struct Seen {
    windows: u64,
    bad: u64,
    ending: u64,
    mean_return: f64,
}

fn run_learner(
    rb: &ReplayBuffer,
    stop: &AtomicBool,
) -> Result<Seen, replaybuf::error::SampleError> {
    let mut learner = rb.learner();
    let mut batch = rb.batch([16 * 8]);
    let mut seen = Seen::default();
    let mut total_return = 0.0;
    while !stop.load(Ordering::Relaxed) {
        match learner.sample_into(&mut batch) {
            Ok(()) => {}
            // Early on, before any row is written (the learner may start first) or
            // any episode is 8 steps long.
            Err(
                replaybuf::error::SampleError::Empty
                | replaybuf::error::SampleError::TrajectoriesTooShort { .. },
            ) => continue,
            Err(e) => return Err(e),
        }
        let (env, episode, t) = (
            batch.column::<i64>("env").expect("field env"),
            batch.column::<i64>("episode").expect("field episode"),
            batch.column::<i64>("t").expect("field t"),
        );
        let reward = batch.column::<f32>("reward").expect("field reward");
        let marks = batch.marks().expect("slice batches carry marks");
        for w in 0..16 {
            let rows = w * 8..w * 8 + 8;
            let first = rows.start;
            let consecutive = rows.clone().all(|k| {
                !marks[k].is_valid()
                    || (env[k] == env[first]
                        && episode[k] == episode[first]
                        && t[k] == t[first] + (k - first) as i64)
            });
            seen.bad += u64::from(!consecutive);
            // The n-step return from the window's first step, up to the episode's end.
            let (mut ret, mut discount) = (0.0, 1.0);
            for k in rows {
                ret += discount * reward[k];
                discount *= GAMMA;
                if marks[k].is_end() {
                    seen.ending += 1;
                    break;
                }
            }
            total_return += f64::from(ret);
            seen.windows += 1;
        }
    }
    seen.mean_return = total_return / seen.windows.max(1) as f64;
    Ok(seen)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rb = ReplayBuffer::builder(spec()?)
        .capacity(4096 * ENVS) // [4096, 8]
        .ndim(2)
        .envs(ENVS)
        .dim_extend(0) // collectors extend [t, envs]
        .shards(2) // two env groups: one per collector
        .sampler(Slice::num_slices(16).end_key("done"))
        .seed(3)
        .build()?;
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let (written, seen) = std::thread::scope(|s| {
        let collectors: Vec<_> = (0..2)
            .map(|_| {
                let (writer, stop) = (rb.writer(), &stop);
                s.spawn(move || run_collector(writer, stop))
            })
            .collect();
        let learner = s.spawn(|| run_learner(&rb, &stop));
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        let written: Result<u64, replaybuf::error::DataError> = collectors
            .into_iter()
            .map(|c| c.join().expect("a collector does not panic"))
            .sum();
        (written, learner.join().expect("the learner does not panic"))
    });
    let (written, seen) = (written?, seen?);
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "2 collectors wrote {written} steps of {ENVS} environments in {seconds:.1} s \
         ({:.1} M steps/s)",
        written as f64 / seconds / 1e6
    );
    println!(
        "the learner sampled {} windows of 8 steps ({:.1} M steps/s); {} reached their \
         episode's end; mean 8-step return {:.3}",
        seen.windows,
        (seen.windows * 8) as f64 / seconds / 1e6,
        seen.ending,
        seen.mean_return
    );
    println!(
        "windows that were not consecutive steps of one episode: {}",
        seen.bad
    );

    // A collector batch of [t, envs] cut into padded episodes.
    let mut envs: Vec<Env> = (0..4).map(Env::new).collect();
    let batch = collect(&rb, &mut envs)?;
    let episodes = split_trajectories(&batch, &Split::by_end_key("done").time_first(true))?;
    println!(
        "one collector batch of {:?} steps: {} episode pieces, padded to {:?}, lengths {:?}",
        batch.shape(),
        episodes.count(),
        episodes.batch().shape(),
        episodes.lengths()
    );
    Ok(())
}
