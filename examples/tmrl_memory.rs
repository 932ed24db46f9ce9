//! A tmrl-style training loop over the tmrl adapter: a rollout worker thread steps an
//! environment and sends buffers of samples, as tmrl's workers do; the trainer appends
//! each to a [`TmrlMemory`] (which pairs consecutive samples into transitions, never
//! across an episode's end, and links episodes that continue in the next buffer), then
//! runs epochs of `nb_steps` batches, each preprocessed (a data augmentation) and
//! collated into tmrl's six tensors `(prev_obs, act, rew, new_obs, terminated,
//! truncated)` by a prefetch worker.
//!
//! The environment: a cart on a line, `v' = 0.9 v + 0.1 a`, `x' = x + 0.1 v'`, reward
//! `-x'^2`; an episode ends (`terminated`) when the cart leaves `[-2, 2]` and is cut
//! (`truncated`) after 60 steps. The augmentation shifts both observations' positions
//! by one random offset per row (the dynamics do not depend on where the cart is). The
//! trainer fits the velocity model `v' = w . [v, a]` on the collated tensors by SGD and
//! counts transitions the dynamics do not explain: a transition paired across an
//! episode's end (a reset between its two observations) would be one.
//!
//! ```sh
//! cargo run --release --example tmrl_memory
//! ```

// The loom facade rule (threads and atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::mpsc;

use replaybuf::tmrl::{TmrlBatch, TmrlMemory};
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

/// Samples per buffer a rollout worker sends (tmrl's `update_buffer_interval`).
const BUFFER_SAMPLES: usize = 250;
const BUFFERS: usize = 40;
const EPISODE_STEPS: u32 = 60;
const NB_STEPS: usize = 20;
const BATCH: usize = 128;
const LEARNING_RATE: f32 = 0.5;

struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// One rollout worker's environment and its buffers of samples.
struct Worker {
    x: f32,
    v: f32,
    steps: u32,
    rng: Rng,
    /// The next sample starts an episode: it carries the reset observation.
    reset: bool,
}

impl Worker {
    /// `n` samples: (action, new observation, reward, terminated, truncated).
    fn buffer(&mut self, memory_spec: &Batch) -> Batch {
        let n = memory_spec.len();
        let mut b = memory_spec.clone();
        let (mut act, mut obs, mut rew) = (vec![0f32; n], vec![0f32; 2 * n], vec![0f32; n]);
        let (mut term, mut trunc) = (vec![false; n], vec![false; n]);
        for k in 0..n {
            if self.reset {
                // tmrl's reset sample: the first observation, a default action.
                self.x = 4.0 * self.rng.uniform() - 2.0;
                self.v = 0.0;
                self.steps = 0;
                self.reset = false;
            } else {
                let a = 2.0 * self.rng.uniform() - 1.0;
                self.v = 0.9 * self.v + 0.1 * a;
                self.x += 0.1 * self.v;
                self.steps += 1;
                act[k] = a;
                rew[k] = -self.x * self.x;
                term[k] = self.x.abs() > 2.0;
                trunc[k] = !term[k] && self.steps == EPISODE_STEPS;
                self.reset = term[k] || trunc[k];
            }
            obs[2 * k..2 * k + 2].copy_from_slice(&[self.x, self.v]);
        }
        b.set("act", &act).expect("act");
        b.set("obs", &obs).expect("obs");
        b.set("rew", &rew).expect("rew");
        b.set("terminated", &term).expect("terminated");
        b.set("truncated", &trunc).expect("truncated");
        b
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = Spec::builder()
        .field("obs", DType::F32, [2])
        .field("act", DType::F32, [])
        .field("rew", DType::F32, [])
        .field(("next", "obs"), DType::F32, [2])
        .field("terminated", DType::Bool, [])
        .field("truncated", DType::Bool, [])
        .build()?;
    let rb = ReplayBuffer::builder(spec)
        .capacity(5_000)
        .seed(21)
        .build()?;
    let mut memory = TmrlMemory::builder(rb)
        .nb_steps(NB_STEPS)
        .batch_size(BATCH)
        .prefetch(2)
        .sample_preprocessor(|b: &mut Batch| {
            // Shift each row's two positions by one offset: x is the first of [x, v].
            let shifts: Vec<f32> = (0..b.len())
                .map(|r| ((r * 7919) % 100) as f32 / 10.0)
                .collect();
            for key in [replaybuf::Key::from("obs"), ("next", "obs").into()] {
                for (row, s) in b.column_mut::<f32>(&key)?.chunks_mut(2).zip(&shifts) {
                    row[0] += s;
                }
            }
            Ok(())
        })
        .build()?;
    println!(
        "memory_size {}, batch_size {}, nb_steps {}",
        memory.memory_size(),
        memory.batch_size(),
        memory.nb_steps()
    );

    // The rollout worker, on its own thread, sends buffers of samples.
    let (send, buffers) = mpsc::sync_channel::<Batch>(2);
    let template = memory.collector_buffer(BUFFER_SAMPLES);
    let rollout = std::thread::spawn(move || {
        let mut worker = Worker {
            x: 0.0,
            v: 0.0,
            steps: 0,
            rng: Rng(0x2545_f491_4f6c_dd1d),
            reset: true,
        };
        for _ in 0..BUFFERS {
            if send.send(worker.buffer(&template)).is_err() {
                break;
            }
        }
    });

    let mut w = [0f32; 2];
    let (mut samples, mut transitions, mut unexplained) = (0, 0, 0);
    println!("epoch  memory  transitions  mean reward  terminated  truncated  model loss");
    for (epoch, buffer) in buffers.iter().enumerate() {
        samples += buffer.len();
        transitions += memory.append_buffer(&buffer)?.len();
        if memory.len() < 2 * BATCH {
            continue;
        }
        let (mut reward, mut ended, mut cut, mut loss) = (0.0, 0.0, 0.0, 0.0);
        for batch in memory.iter() {
            let TmrlBatch {
                prev_obs,
                act,
                rew,
                new_obs,
                terminated,
                truncated,
            } = batch?;
            let rows = rew.data.len() as f32;
            let mut grad = [0f32; 2];
            for r in 0..rew.data.len() {
                let (x, v) = (prev_obs.data[2 * r], prev_obs.data[2 * r + 1]);
                let (x2, v2) = (new_obs.data[2 * r], new_obs.data[2 * r + 1]);
                if (x2 - (x + 0.1 * v2)).abs() > 1e-4 {
                    unexplained += 1;
                }
                let features = [v, act.data[r]];
                let err = w[0] * features[0] + w[1] * features[1] - v2;
                loss += err * err / rows;
                for (g, f) in grad.iter_mut().zip(features) {
                    *g += 2.0 * err * f / rows;
                }
            }
            for (w, g) in w.iter_mut().zip(grad) {
                *w -= LEARNING_RATE * g;
            }
            reward += rew.data.iter().sum::<f32>() / rows;
            ended += terminated.data.iter().sum::<f32>() / rows;
            cut += truncated.data.iter().sum::<f32>() / rows;
        }
        if epoch % 5 == 4 || epoch + 1 == BUFFERS {
            let n = NB_STEPS as f32;
            println!(
                "{:>5}  {:>6}  {transitions:>11}  {:>11.3}  {:>9.1}%  {:>8.1}%  {:>10.6}",
                epoch + 1,
                memory.len(),
                reward / n,
                100.0 * ended / n,
                100.0 * cut / n,
                loss / n,
            );
        }
    }
    rollout.join().expect("the rollout worker does not panic");
    println!(
        "{samples} samples became {transitions} transitions ({} episode starts paired with nothing)",
        samples - transitions
    );
    println!(
        "sampled transitions the dynamics do not explain (paired across an episode): {unexplained}"
    );
    let first = memory.get_transition(0)?;
    println!(
        "get_transition(0): obs {:?} act {:?} -> next obs {:?}",
        first.column::<f32>("obs")?,
        first.column::<f32>("act")?,
        first.column::<f32>(("next", "obs"))?
    );
    println!(
        "fitted v' = {:.3} v + {:.3} a  (true: 0.900 v + 0.100 a)",
        w[0], w[1]
    );
    Ok(())
}
