//! Prioritized replay in a collector/learner loop, beside uniform replay.
//!
//! A collector thread walks a chain of `STATES` states: stepping right moves on, the
//! other action falls back to the start, and the only reward is for reaching the end.
//! Its walks go right nine times in ten, so few of them ever get there and the
//! rewarding transitions are a small share of what is stored. A learner thread runs
//! tabular Q-learning on sampled batches meanwhile; the collector keeps to a fixed
//! number of transitions per learner step, and the ring is small enough to wrap many
//! times during a run.
//!
//! With prioritized replay the learner scales each update by its importance weight,
//! writes the new absolute TD errors back as priorities from its own thread while the
//! collector keeps overwriting rows, and anneals `beta` towards 1. Updates that arrive
//! for rows the collector has since replaced are dropped by the buffer and counted.
//!
//! The run prints, for both samplers, how far the learned values are from the optimum
//! after a number of steps, and how often the learner saw a rewarding transition.
//!
//! Do not expect prioritized replay to win here. Every transition of this chain recurs
//! thousands of times in the ring, and a copy whose target has just changed keeps the
//! small priority it was given when its TD error was zero, so the values propagate
//! back along the chain more slowly than under uniform replay; a larger `eps` narrows
//! the gap. Prioritized replay pays where informative transitions are rare and do not
//! recur. What the example shows is the loop itself: sampling with weights, writing
//! priorities back and annealing `beta` while a collector overwrites the rows.
//!
//! ```sh
//! cargo run --release --example prioritized_chain
//! ```

// The loom facade rule (atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use replaybuf::bytemuck::{Pod, Zeroable};
use replaybuf::sampler::{Prioritized, Sampler, Uniform};
use replaybuf::typed::{TypedBatch, TypedBuffer};

/// Chain length: the reward is for stepping right from state `STATES - 2`.
const STATES: usize = 32;
const GAMMA: f64 = 0.95;
const LEARNING_RATE: f64 = 0.5;
const BATCH: usize = 32;
/// Rows the ring holds; the collector writes several times as many in a run.
const CAPACITY: usize = 20_000;
/// Transitions the collector adds per learner step.
const STEPS_PER_UPDATE: u64 = 16;
const LEARNER_STEPS: usize = 4_000;
/// Learner steps after which the values are compared with the optimum.
const CHECKPOINTS: [usize; 4] = [250, 500, 1_000, LEARNER_STEPS];

/// One transition, stored as its bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct Step {
    state: u32,
    action: u32,
    next: u32,
    done: u32,
    reward: f32,
}

/// The collector's behaviour: right nine times in ten, from state 0.
struct Walk {
    state: usize,
    rng: u64,
}

impl Walk {
    fn step(&mut self) -> Step {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let action = usize::from(!self.rng.is_multiple_of(10));
        let next = if action == 1 { self.state + 1 } else { 0 };
        let done = next == STATES - 1;
        let step = Step {
            state: self.state as u32,
            action: action as u32,
            next: next as u32,
            done: u32::from(done),
            reward: if done { 1.0 } else { 0.0 },
        };
        self.state = if done { 0 } else { next };
        step
    }
}

/// What one run saw.
struct Outcome {
    sampled: u64,
    sampled_rewarding: u64,
    stored_rewarding: u64,
    written: u64,
    /// The largest distance of a right-step value from its optimum, at each of
    /// `CHECKPOINTS`.
    errors: Vec<f64>,
    applied: usize,
    stale: usize,
}

fn value_error(q: &[[f64; 2]]) -> f64 {
    (0..STATES - 1)
        .map(|s| (q[s][1] - GAMMA.powi((STATES - 2 - s) as i32)).abs())
        .fold(0.0, f64::max)
}

fn run(sampler: Sampler) -> Result<Outcome, Box<dyn std::error::Error>> {
    let prioritized = matches!(sampler, Sampler::Prioritized(_));
    let rb = TypedBuffer::<Step>::builder()
        .capacity(CAPACITY)
        .batch_size(BATCH)
        .sampler(sampler)
        .seed(5)
        .build()?;
    let mut walk = Walk {
        state: 0,
        rng: 0x2545_f491_4f6c_dd1d,
    };
    let warm: Vec<Step> = (0..CAPACITY).map(|_| walk.step()).collect();
    rb.extend(&warm)?;
    let mut stored_rewarding = warm.iter().filter(|t| t.done == 1).count() as u64;

    let stop = AtomicBool::new(false);
    let updates = AtomicU64::new(0);
    std::thread::scope(|s| {
        let collector = s.spawn(|| {
            let mut chunk = Vec::with_capacity(64);
            let mut rewarding = 0;
            while !stop.load(Ordering::Relaxed) {
                // A fixed update-to-data ratio, as training loops keep one.
                let allowed = CAPACITY as u64 + STEPS_PER_UPDATE * updates.load(Ordering::Relaxed);
                if rb.write_count() + 64 > allowed {
                    std::thread::yield_now();
                    continue;
                }
                chunk.clear();
                chunk.extend((0..64).map(|_| walk.step()));
                rewarding += chunk.iter().filter(|t| t.done == 1).count() as u64;
                rb.extend(&chunk).expect("a Step is a valid row");
            }
            rewarding
        });
        let learned = (|| -> Result<Outcome, Box<dyn std::error::Error>> {
            let mut q = vec![[0.0f64; 2]; STATES];
            let mut batch = TypedBatch::new();
            let mut td = vec![0.0; BATCH];
            let mut priorities = vec![0.0; BATCH];
            let mut weights = [1.0f32; BATCH];
            let (mut sampled_rewarding, mut applied, mut stale) = (0, 0, 0);
            let mut errors = Vec::with_capacity(CHECKPOINTS.len());
            for step in 0..LEARNER_STEPS {
                if prioritized {
                    let progress = step as f64 / LEARNER_STEPS as f64;
                    rb.as_untyped().set_beta(0.4 + 0.6 * progress)?;
                }
                rb.sample_into(&mut batch)?;
                if let Some(w) = batch.weight() {
                    weights.copy_from_slice(w);
                }
                for (k, t) in batch.rows().iter().enumerate() {
                    let (s, a, n) = (t.state as usize, t.action as usize, t.next as usize);
                    let future = if t.done == 1 {
                        0.0
                    } else {
                        q[n][0].max(q[n][1])
                    };
                    td[k] = f64::from(t.reward) + GAMMA * future - q[s][a];
                    q[s][a] += LEARNING_RATE * f64::from(weights[k]) * td[k];
                    sampled_rewarding += u64::from(t.done);
                }
                if prioritized {
                    for (p, d) in priorities.iter_mut().zip(&td) {
                        *p = d.abs();
                    }
                    let done =
                        rb.update_priority(batch.index(), batch.generations(), &priorities)?;
                    applied += done.applied;
                    stale += done.stale;
                }
                updates.store(step as u64 + 1, Ordering::Relaxed);
                if CHECKPOINTS.contains(&(step + 1)) {
                    errors.push(value_error(&q));
                }
            }
            Ok(Outcome {
                sampled: (LEARNER_STEPS * BATCH) as u64,
                sampled_rewarding,
                stored_rewarding: 0,
                written: 0,
                errors,
                applied,
                stale,
            })
        })();
        stop.store(true, Ordering::Relaxed);
        stored_rewarding += collector.join().expect("the collector does not panic");
        learned
    })
    .map(|o| Outcome {
        stored_rewarding,
        written: rb.write_count(),
        ..o
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "chain of {STATES} states, reward at the end; {LEARNER_STEPS} learner steps of \
         {BATCH} rows, {STEPS_PER_UPDATE} new transitions per step into {CAPACITY} rows"
    );
    for (name, sampler) in [
        ("uniform", Sampler::from(Uniform)),
        ("prioritized", Prioritized::new(0.6, 0.4).eps(1e-2).into()),
    ] {
        let o = run(sampler)?;
        let share = |part: u64, whole: u64| 100.0 * part as f64 / whole as f64;
        let errors: Vec<String> = CHECKPOINTS
            .iter()
            .zip(&o.errors)
            .map(|(step, e)| format!("{e:.3} after {step}"))
            .collect();
        println!("{name:>11}: largest value error {}", errors.join(", "));
        println!(
            "{:>11}  rewarding transitions: {:.2}% of those written, {:.2}% of those sampled",
            "",
            share(o.stored_rewarding, o.written),
            share(o.sampled_rewarding, o.sampled),
        );
        if o.applied + o.stale > 0 {
            println!(
                "{:>11}  priority updates: {} applied, {} dropped (row overwritten since sampling)",
                "", o.applied, o.stale
            );
        }
    }
    Ok(())
}
