//! `replaybuf` (no subcommand): collectors step pendulums and extend the buffer while
//! learners sample it, fit a reward model, and check that every sampled transition is
//! whole.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use replaybuf::{DType, ReplayBuffer, Spec};

use crate::sim::{self, Pendulum};

/// The demonstration's knobs.
#[derive(Clone, Debug)]
pub struct DemoArgs {
    pub collectors: usize,
    pub learners: usize,
    pub seconds: f64,
    pub capacity: usize,
    pub batch: usize,
}

const CHUNK_STEPS: usize = 256;
const WARMUP_ROWS: usize = 4 * CHUNK_STEPS;

fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [3])
        .field("action", DType::F32, [1])
        .field("reward", DType::F32, [1])
        .field(("next", "obs"), DType::F32, [3])
        .field("truncated", DType::Bool, [1])
        .field("episode", DType::I64, [1])
        .build()
        .expect("the demo spec is valid")
}

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    sampled: AtomicU64,
    batches: AtomicU64,
    torn: AtomicU64,
}

/// What one learner saw.
struct LearnerReport {
    latencies_ns: Vec<u64>,
    first_loss: f32,
    last_loss: f32,
    weights: [f32; 4],
}

/// Scales that bring each feature of the reward model into [0, 1]: theta^2 (up to
/// pi^2), theta_dot^2 (up to 8^2), u^2 (up to 2^2), bias.
const FEATURE_SCALE: [f32; 4] = [std::f32::consts::PI * std::f32::consts::PI, 64.0, 4.0, 1.0];
const LEARNING_RATE: f32 = 0.1;

/// Features of the reward model, each scaled into [0, 1].
fn features(obs: &[f32], u: f32) -> [f32; 4] {
    let theta = obs[1].atan2(obs[0]);
    let raw = [theta * theta, obs[2] * obs[2], u * u, 1.0];
    std::array::from_fn(|i| raw[i] / FEATURE_SCALE[i])
}

pub fn run(args: &DemoArgs) {
    let shards = args.collectors.max(1).next_power_of_two();
    let rb = ReplayBuffer::builder(spec())
        .capacity(args.capacity)
        .shards(shards)
        .seed(2024)
        .build()
        .unwrap_or_else(|e| {
            eprintln!("replaybuf: {e}");
            std::process::exit(2);
        });
    println!(
        "replaybuf demo: {} collectors (pendulum, {CHUNK_STEPS}-step chunks) and {} learners \
         (batches of {}) share one buffer of {} rows in {} shards, for {:.0} s",
        args.collectors, args.learners, args.batch, args.capacity, shards, args.seconds
    );
    let counters = Counters::default();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let progress = ProgressBar::new_spinner();
    progress.set_style(
        ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}")
            .expect("a valid progress template"),
    );

    let reports: Vec<LearnerReport> = std::thread::scope(|s| {
        for c in 0..args.collectors {
            let (writer, counters, stop) = (rb.writer(), &counters, &stop);
            s.spawn(move || collect(c as u64, writer, counters, stop));
        }
        let learners: Vec<_> = (0..args.learners)
            .map(|_| {
                let (learner, counters, stop) = (rb.learner(), &counters, &stop);
                s.spawn(move || learn(learner, args.batch, counters, stop))
            })
            .collect();
        let deadline = started + Duration::from_secs_f64(args.seconds);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let secs = started.elapsed().as_secs_f64();
            let written = counters.written.load(Ordering::Relaxed);
            let sampled = counters.sampled.load(Ordering::Relaxed);
            progress.set_message(format!(
                "written {written} ({:.2} M/s) | sampled {sampled} ({:.2} M/s) | stored {}/{} | torn {}",
                written as f64 / secs / 1e6,
                sampled as f64 / secs / 1e6,
                rb.len(),
                rb.capacity(),
                counters.torn.load(Ordering::Relaxed),
            ));
            progress.tick();
        }
        stop.store(true, Ordering::Relaxed);
        learners
            .into_iter()
            .map(|l| l.join().expect("learner thread"))
            .collect()
    });
    progress.finish_and_clear();
    summarize(
        args,
        &rb,
        &counters,
        started.elapsed().as_secs_f64(),
        reports,
    );
}

fn collect(id: u64, writer: replaybuf::Writer, counters: &Counters, stop: &AtomicBool) {
    let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (id + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut env = Pendulum::new(&mut rng);
    let mut episode = (id << 40) as i64;
    let mut chunk = writer.buffer().batch([CHUNK_STEPS]);
    let (mut obs, mut act, mut rew, mut next, mut trunc, mut ep) = (
        vec![0f32; CHUNK_STEPS * 3],
        vec![0f32; CHUNK_STEPS],
        vec![0f32; CHUNK_STEPS],
        vec![0f32; CHUNK_STEPS * 3],
        vec![false; CHUNK_STEPS],
        vec![0i64; CHUNK_STEPS],
    );
    while !stop.load(Ordering::Relaxed) {
        for i in 0..CHUNK_STEPS {
            let action = sim::policy(env.observe(), &mut rng);
            let step = env.step(action, &mut rng);
            obs[i * 3..i * 3 + 3].copy_from_slice(&step.obs);
            next[i * 3..i * 3 + 3].copy_from_slice(&step.next_obs);
            (act[i], rew[i], trunc[i], ep[i]) = (step.action, step.reward, step.truncated, episode);
            episode += i64::from(step.truncated);
        }
        let filled = chunk
            .set("obs", &obs)
            .and_then(|()| chunk.set("action", &act));
        let filled = filled
            .and_then(|()| chunk.set("reward", &rew))
            .and_then(|()| chunk.set(("next", "obs"), &next))
            .and_then(|()| chunk.set("truncated", &trunc))
            .and_then(|()| chunk.set("episode", &ep));
        filled.expect("the chunk matches the demo spec");
        writer.extend(&chunk).expect("the chunk matches the buffer");
        counters
            .written
            .fetch_add(CHUNK_STEPS as u64, Ordering::Relaxed);
    }
}

fn learn(
    mut learner: replaybuf::Learner,
    batch_size: usize,
    counters: &Counters,
    stop: &AtomicBool,
) -> LearnerReport {
    // A small buffer never holds the warm-up's rows: its learners waited all run. Nor
    // does a full one whose shards are not all written (3 collectors write 3 of its 4
    // shards): more than half of them are, one a collector.
    let warm = WARMUP_ROWS.min(learner.buffer().capacity() / 2).max(1);
    while learner.buffer().len() < warm && !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut batch = learner.buffer().batch([batch_size]);
    let mut w = [0f32; 4];
    let (mut first_loss, mut last_loss) = (f32::NAN, f32::NAN);
    let mut latencies_ns = Vec::with_capacity(1 << 20);
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        learner
            .sample_into(&mut batch)
            .expect("sampling a warm buffer");
        latencies_ns.push(t.elapsed().as_nanos() as u64);

        let columns = (
            batch.column::<f32>("obs"),
            batch.column::<f32>("action"),
            batch.column::<f32>("reward"),
            batch.column::<f32>(("next", "obs")),
        );
        let (Ok(obs), Ok(act), Ok(rew), Ok(next)) = columns else {
            unreachable!("the demo spec has these f32 fields")
        };
        // Every row must be one whole transition: re-derive it from its own obs and
        // action. A row mixing two transitions would not match.
        let mut torn = 0;
        let mut grad = [0f32; 4];
        let mut loss = 0f32;
        for i in 0..batch.len() {
            let o = [obs[i * 3], obs[i * 3 + 1], obs[i * 3 + 2]];
            let (r, n) = Pendulum::dynamics(o, act[i]);
            if r != rew[i] || n[..] != next[i * 3..i * 3 + 3] {
                torn += 1;
            }
            let x = features(&o, act[i]);
            let err = x.iter().zip(&w).map(|(a, b)| a * b).sum::<f32>() - rew[i];
            loss += err * err;
            for (g, xi) in grad.iter_mut().zip(x) {
                *g += err * xi;
            }
        }
        let n = batch.len() as f32;
        for (wi, g) in w.iter_mut().zip(grad) {
            *wi -= LEARNING_RATE * g / n;
        }
        last_loss = loss / n;
        if first_loss.is_nan() {
            first_loss = last_loss;
        }
        counters.torn.fetch_add(torn, Ordering::Relaxed);
        counters.batches.fetch_add(1, Ordering::Relaxed);
        counters
            .sampled
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
    }
    LearnerReport {
        latencies_ns,
        first_loss,
        last_loss,
        // Back in the units of the reward: r = w . [theta^2, theta_dot^2, u^2, 1].
        weights: std::array::from_fn(|i| w[i] / FEATURE_SCALE[i]),
    }
}

fn summarize(
    args: &DemoArgs,
    rb: &ReplayBuffer,
    counters: &Counters,
    secs: f64,
    reports: Vec<LearnerReport>,
) {
    let written = counters.written.load(Ordering::Relaxed);
    let sampled = counters.sampled.load(Ordering::Relaxed);
    let batches = counters.batches.load(Ordering::Relaxed);
    let mut lat: Vec<u64> = reports
        .iter()
        .flat_map(|r| r.latencies_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * p).round() as usize)
            .map_or(0.0, |&ns| ns as f64 / 1000.0)
    };
    println!(
        "ran {secs:.1} s: {} collectors, {} learners",
        args.collectors, args.learners
    );
    println!(
        "  collectors wrote   {written:>12} transitions  {:>8.2} M transitions/s",
        written as f64 / secs / 1e6
    );
    println!(
        "  learners sampled   {sampled:>12} rows         {:>8.2} M rows/s  ({batches} batches of {})",
        sampled as f64 / secs / 1e6,
        args.batch
    );
    println!(
        "  sample latency     p50 {:.1} us  p99 {:.1} us  max {:.1} us",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "  buffer             {} / {} rows stored, {} written in all",
        rb.len(),
        rb.capacity(),
        rb.write_count()
    );
    println!(
        "  integrity          {sampled} sampled rows re-derived from the simulator, {} torn",
        counters.torn.load(Ordering::Relaxed)
    );
    if let Some(r) = reports.iter().find(|r| r.first_loss.is_finite()) {
        println!(
            "  reward model       loss {:.3} -> {:.3}; weights [{:.3}, {:.3}, {:.4}, {:.3}] (truth [-1, -0.1, -0.001, 0])",
            r.first_loss, r.last_loss, r.weights[0], r.weights[1], r.weights[2], r.weights[3]
        );
    }
}
