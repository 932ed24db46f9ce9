//! A training loop with hooks, as TorchRL's `Trainer` has them, and the replay buffer's
//! part of it registered at three of them through [`ReplayBufferTrainer`]:
//!
//! - `batch_process`: each collector batch of `[ENVS, STEPS]` steps is flattened into
//!   transitions (steps after an episode ended inside the rollout are marked invalid
//!   by the collector's mask and dropped) and extended into the buffer;
//! - `process_optim_batch`: the optimisation batch is sampled, prepared ahead by a
//!   prefetch worker while the learner works on the previous one;
//! - `post_loss`: the learner's new absolute errors, written into the batch's
//!   `td_error` field, go back to the buffer as priorities.
//!
//! The task: eight environments move a point on a line (`x' = x + 0.1 a`, plus a
//! little noise, episodes of random length) with reward `-x'^2`. The learner fits the
//! reward with a model linear in `[1, x, a, x^2, x a, a^2]` by importance-weighted
//! SGD. The true coefficients are `[0, 0, 0, -1, -0.2, -0.01]`; the run prints the
//! loss falling, what each hook did, and the fitted coefficients.
//!
//! ```sh
//! cargo run --release --example trainer_hooks
//! ```

use std::cell::RefCell;
use std::rc::Rc;

use replaybuf::sampler::Prioritized;
use replaybuf::torchrl::ReplayBufferTrainer;
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

const ENVS: usize = 8;
const STEPS: usize = 32;
const COLLECTIONS: usize = 300;
/// Optimisation steps per collector batch.
const OPTIM_STEPS: usize = 4;
const BATCH: usize = 64;
const LEARNING_RATE: f64 = 0.05;
const FEATURES: usize = 6;

fn features(x: f64, a: f64) -> [f64; FEATURES] {
    [1.0, x, a, x * x, x * a, a * a]
}

/// What the hooks see: a collector batch, or the optimisation batch after the loss.
type BatchHook = Box<dyn FnMut(&Batch) -> Result<(), Box<dyn std::error::Error>>>;
/// What makes the optimisation batch.
type OptimHook = Box<dyn FnMut() -> Result<Batch, Box<dyn std::error::Error>>>;

/// A training loop's hook points (the three the replay buffer uses).
#[derive(Default)]
struct Trainer {
    batch_process: Vec<BatchHook>,
    process_optim_batch: Option<OptimHook>,
    post_loss: Vec<BatchHook>,
}

/// Eight environments, stepped `STEPS` at a time into one collector batch.
struct Collector {
    x: [f64; ENVS],
    left: [u32; ENVS],
    rng: u64,
}

impl Collector {
    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One rollout of `[ENVS, STEPS]`: an environment whose episode ends inside the
    /// rollout waits for the next one; its remaining steps are marked invalid.
    fn rollout(&mut self, batch: &mut Batch) -> Result<(), Box<dyn std::error::Error>> {
        let mut obs = vec![0f32; ENVS * STEPS];
        let mut act = vec![0f32; ENVS * STEPS];
        let mut rew = vec![0f32; ENVS * STEPS];
        let mut valid = vec![false; ENVS * STEPS];
        for e in 0..ENVS {
            for t in 0..STEPS {
                if self.left[e] == 0 {
                    break; // the episode ended: the rest of this rollout is padding
                }
                let a = 2.0 * self.uniform() - 1.0;
                let x = self.x[e];
                let next = x + 0.1 * a + 0.001 * (self.uniform() - 0.5);
                let r = e * STEPS + t;
                (obs[r], act[r], rew[r], valid[r]) =
                    (x as f32, a as f32, -(next * next) as f32, true);
                self.x[e] = next;
                self.left[e] -= 1;
            }
            if self.left[e] == 0 {
                self.x[e] = 2.0 * self.uniform() - 1.0;
                self.left[e] = 10 + (self.uniform() * 40.0) as u32;
            }
        }
        batch.set("obs", &obs)?;
        batch.set("action", &act)?;
        batch.set("reward", &rew)?;
        batch.set("valid", &valid)?;
        // New steps enter with a high priority, so that each is sampled soon.
        batch.column_mut::<f32>("td_error")?.fill(1.0);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = Spec::builder()
        .field("obs", DType::F32, [])
        .field("action", DType::F32, [])
        .field("reward", DType::F32, [])
        .field("valid", DType::Bool, [])
        .field("td_error", DType::F32, [])
        .build()?;
    let rb = ReplayBuffer::builder(spec)
        .capacity(20_000)
        .sampler(Prioritized::new(0.6, 0.4).eps(1e-3))
        .priority_key("td_error")
        .batch_size(BATCH)
        .seed(11)
        .build()?;
    let rb_trainer = Rc::new(RefCell::new(
        ReplayBufferTrainer::builder(rb.clone())
            .mask_key("valid")
            .prefetch(2)
            .build()?,
    ));

    // Register the replay buffer's three operations, as TorchRL's
    // `ReplayBufferTrainer.register(trainer)` does.
    let mut trainer = Trainer::default();
    let (stored, dropped) = (Rc::new(RefCell::new(0)), Rc::new(RefCell::new(0)));
    {
        let (t, stored, dropped) = (rb_trainer.clone(), stored.clone(), dropped.clone());
        trainer.batch_process.push(Box::new(move |collected| {
            let written = t.borrow().extend(collected)?;
            *stored.borrow_mut() += written.len();
            *dropped.borrow_mut() += collected.len() - written.len();
            Ok(())
        }));
    }
    {
        let t = rb_trainer.clone();
        trainer.process_optim_batch = Some(Box::new(move || Ok(t.borrow_mut().sample()?)));
    }
    let (applied, stale) = (Rc::new(RefCell::new(0)), Rc::new(RefCell::new(0)));
    {
        let (t, applied, stale) = (rb_trainer.clone(), applied.clone(), stale.clone());
        trainer.post_loss.push(Box::new(move |batch| {
            let done = t.borrow().update_priority(batch)?;
            *applied.borrow_mut() += done.applied;
            *stale.borrow_mut() += done.stale;
            Ok(())
        }));
    }

    // The loop: collect, process, optimise, post-process.
    let mut collector = Collector {
        x: [0.5; ENVS],
        left: [20; ENVS],
        rng: 0x9e37_79b9_7f4a_7c15,
    };
    let mut collected = rb_trainer.borrow().collector_batch(ENVS, STEPS);
    let mut w = [0.0f64; FEATURES];
    let sample = trainer
        .process_optim_batch
        .as_mut()
        .expect("the replay buffer registered process_optim_batch");
    println!("collections  stored  loss (weighted MSE)  mean |error|");
    for collection in 1..=COLLECTIONS {
        collector.rollout(&mut collected)?;
        for hook in &mut trainer.batch_process {
            hook(&collected)?;
        }
        let (mut loss, mut abs) = (0.0, 0.0);
        for _ in 0..OPTIM_STEPS {
            let mut batch = sample()?;
            let weights = batch
                .weight()
                .expect("prioritized batches carry weights")
                .to_vec();
            let (obs, act, rew) = (
                batch.column::<f32>("obs")?.to_vec(),
                batch.column::<f32>("action")?.to_vec(),
                batch.column::<f32>("reward")?.to_vec(),
            );
            let mut grad = [0.0; FEATURES];
            let errors = batch.column_mut::<f32>("td_error")?;
            for k in 0..obs.len() {
                let phi = features(f64::from(obs[k]), f64::from(act[k]));
                let pred: f64 = phi.iter().zip(&w).map(|(p, w)| p * w).sum();
                let err = pred - f64::from(rew[k]);
                let weight = f64::from(weights[k]);
                loss += weight * err * err / obs.len() as f64;
                abs += err.abs() / obs.len() as f64;
                for (g, p) in grad.iter_mut().zip(&phi) {
                    *g += weight * err * p / obs.len() as f64;
                }
                errors[k] = err.abs() as f32;
            }
            for (w, g) in w.iter_mut().zip(&grad) {
                *w -= LEARNING_RATE * 2.0 * g;
            }
            for hook in &mut trainer.post_loss {
                hook(&batch)?;
            }
        }
        if collection % 50 == 0 || collection == 1 {
            println!(
                "{collection:>11}  {:>6}  {:>19.6}  {:>12.5}",
                rb.len(),
                loss / OPTIM_STEPS as f64,
                abs / OPTIM_STEPS as f64
            );
        }
    }
    println!(
        "batch_process: {} valid steps stored, {} masked steps dropped",
        stored.borrow(),
        dropped.borrow()
    );
    println!(
        "process_optim_batch: {} batches of {BATCH} rows through a loader keeping 2 ready",
        COLLECTIONS * OPTIM_STEPS
    );
    println!(
        "post_loss: {} priorities applied, {} dropped (row replaced since sampling)",
        applied.borrow(),
        stale.borrow()
    );
    let fitted: Vec<String> = w.iter().map(|c| format!("{c:+.3}")).collect();
    println!("fitted [1, x, a, x^2, x a, a^2]: [{}]", fitted.join(", "));
    println!("true                           : [+0.000, +0.000, +0.000, -1.000, -0.200, -0.010]");
    Ok(())
}
