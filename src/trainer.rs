//! A trainer-side helper in the spirit of TorchRL's `ReplayBufferTrainer`: what a
//! training loop does with its replay buffer at three of its hooks.
//!
//! - `batch_process` ([`ReplayBufferTrainer::extend`]): a collector's batch of shape
//!   `[E, T]` (E environments, T steps) is flattened into `E * T` transitions, dropping
//!   the steps its mask marks invalid (without a mask, each environment's last step is
//!   marked truncated in `("next", "truncated")`, as TorchRL's), or padded to
//!   `max_dims` as whole trajectories, and extended into the buffer;
//! - `process_optim_batch` ([`ReplayBufferTrainer::sample`]): the optimisation batch
//!   is sampled (through a [`Loader`], so it can be prefetched);
//! - `post_loss` ([`ReplayBufferTrainer::update_priority`]): the batch's new
//!   priorities (its priority field) go back to the buffer.
//!
//! `examples/trainer_hooks.rs` wires the three into a training loop.
//!
//! Layer: faces.

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::core::Written;
use crate::dtype::DType;
use crate::error::{
    BuildError, BuildErrorKind, DataError, PriorityError, PriorityUpdate, SampleError,
};
use crate::key::Key;
use crate::loader::Loader;
use crate::spec::Spec;
use std::sync::Arc;

/// How collector batches become rows.
#[derive(Clone, Debug)]
enum Shape {
    /// `[E, T]` becomes `E * T` rows of the buffer's own spec.
    Flatten,
    /// `[E, T]` becomes `envs` rows, each a trajectory of `steps` steps (the buffer's
    /// fields are the step fields with a leading `steps` dimension), padded; `mask`
    /// marks the real steps. `step_spec` is what a collector batch holds.
    Pad {
        envs: Option<usize>,
        steps: usize,
        mask: usize,
        step_spec: Arc<Spec>,
    },
}

/// The replay-buffer side of a training loop: see the module docs and
/// [`ReplayBufferTrainer::builder`].
#[derive(Debug)]
pub struct ReplayBufferTrainer {
    buffer: ReplayBuffer,
    layout: Shape,
    /// The collector's validity field (`[E, T]` bools), by key.
    mask_key: Option<Key>,
    loader: Loader,
}

/// Builds a [`ReplayBufferTrainer`].
#[derive(Clone, Debug)]
pub struct TrainerBuilder {
    buffer: ReplayBuffer,
    batch_size: Option<usize>,
    max_dims: Option<(Option<usize>, usize)>,
    mask_key: Option<Key>,
    prefetch: usize,
}

impl ReplayBufferTrainer {
    /// The trainer of `buffer`. By default collector batches are flattened
    /// (TorchRL's `flatten_tensordicts=True`) and no step is masked.
    pub fn builder(buffer: ReplayBuffer) -> TrainerBuilder {
        TrainerBuilder {
            buffer,
            batch_size: None,
            max_dims: None,
            mask_key: None,
            prefetch: 0,
        }
    }
}

impl TrainerBuilder {
    /// Rows of the optimisation batch (default: the buffer's `batch_size`).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = Some(rows);
        self
    }

    /// The collector's field marking valid steps (TorchRL's `("collector", "mask")`):
    /// a bool per step; steps marked false are not stored when flattening, and are
    /// padding when padding.
    pub fn mask_key(mut self, key: impl Into<Key>) -> Self {
        self.mask_key = Some(key.into());
        self
    }

    /// Pads instead of flattening (TorchRL's `flatten_tensordicts=False` with
    /// `max_dims`): each environment's steps become one row of the buffer, a trajectory
    /// of `max_dims[1]` steps padded at the end, and a batch of fewer than
    /// `max_dims[0]` environments is padded with empty trajectories. The buffer's spec
    /// is the step fields with a leading `max_dims[1]` dimension, plus a bool field
    /// `[max_dims[1]]` named `pad_mask` marking the real steps.
    pub fn max_dims(mut self, max_dims: [usize; 2]) -> Self {
        self.max_dims = Some((Some(max_dims[0]), max_dims[1]));
        self
    }

    /// Pads each environment's steps to `steps` like [`TrainerBuilder::max_dims`], but
    /// stores only the environments a batch holds.
    pub fn pad_steps(mut self, steps: usize) -> Self {
        self.max_dims = Some((None, steps));
        self
    }

    /// Optimisation batches kept ready by a worker thread (default 0).
    pub fn prefetch(mut self, k: usize) -> Self {
        self.prefetch = k;
        self
    }

    /// Checks the buffer's spec against the layout and builds the sampling loader.
    pub fn build(self) -> Result<ReplayBufferTrainer, BuildError> {
        let err = |reason| Err(BuildError::new(BuildErrorKind::Trainer { reason }));
        let spec = self.buffer.spec().clone();
        if self.buffer.ndim() != 1 {
            return err("the trainer extends an ndim-1 buffer");
        }
        let layout = match self.max_dims {
            None => {
                if let Some(key) = &self.mask_key {
                    match spec.field(key) {
                        Some((_, f)) if f.dtype() == DType::Bool && f.elements() == 1 => {}
                        _ => return err("the mask key must be a bool field of one value"),
                    }
                }
                Shape::Flatten
            }
            Some((envs, steps)) => {
                if steps == 0 || envs == Some(0) {
                    return err("max_dims must be at least 1 in each dimension");
                }
                let Some((mask, f)) = spec.field(PAD_MASK) else {
                    return err(
                        "a padding trainer's buffer needs a bool field `pad_mask` of shape [steps]",
                    );
                };
                if f.dtype() != DType::Bool || f.shape() != [steps] {
                    return err("`pad_mask` must be a bool field of shape [steps]");
                }
                let mut step = Spec::builder();
                for (i, f) in spec.fields().iter().enumerate() {
                    if i == mask {
                        continue;
                    }
                    match f.shape().split_first() {
                        Some((&first, rest)) if first == steps => {
                            step = step.field(f.key().clone(), f.dtype(), rest);
                        }
                        _ => {
                            return err("every field of a padding trainer's buffer has a leading dimension of max_dims[1] steps")
                        }
                    }
                }
                if let Some(key) = &self.mask_key {
                    step = step.field(key.clone(), DType::Bool, []);
                }
                Shape::Pad {
                    envs,
                    steps,
                    mask,
                    step_spec: Arc::new(step.build()?),
                }
            }
        };
        let mut loader = self.buffer.loader().prefetch(self.prefetch);
        if let Some(rows) = self.batch_size {
            loader = loader.batch_size(rows);
        }
        Ok(ReplayBufferTrainer {
            loader: loader.build()?,
            buffer: self.buffer,
            layout,
            mask_key: self.mask_key,
        })
    }
}

/// The bool field of a padding trainer's buffer marking real steps.
pub const PAD_MASK: &str = "pad_mask";

impl ReplayBufferTrainer {
    /// The buffer.
    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }

    /// A zeroed collector batch of `envs` environments and `steps` steps, of the spec
    /// [`ReplayBufferTrainer::extend`] takes.
    pub fn collector_batch(&self, envs: usize, steps: usize) -> Batch {
        match &self.layout {
            Shape::Flatten => self.buffer.batch([envs, steps]),
            Shape::Pad { step_spec, .. } => Batch::zeros(step_spec.clone(), [envs, steps]),
        }
    }

    /// The `batch_process` hook: flattens (or pads) a collector batch of shape `[E, T]`
    /// (or `[n]`, already flat, when flattening) and extends the buffer with it.
    /// Returns where the rows went.
    pub fn extend(&self, collected: &Batch) -> Result<Written, DataError> {
        let rows = match &self.layout {
            Shape::Flatten => self.flatten(collected)?,
            Shape::Pad {
                envs,
                steps,
                mask,
                step_spec,
            } => self.pad(collected, *envs, *steps, *mask, step_spec)?,
        };
        self.buffer.extend(&rows)
    }

    /// The `process_optim_batch` hook: the next optimisation batch. A
    /// without-replacement epoch's end is not an error here: the batch comes from the
    /// next epoch, as TorchRL's hook's does (its sampler starts the next one).
    pub fn sample(&mut self) -> Result<Batch, SampleError> {
        match self.loader.sample() {
            Err(SampleError::EpochEnd) => self.loader.sample(),
            out => out,
        }
    }

    /// Like [`ReplayBufferTrainer::sample`], reusing `batch`'s buffers.
    pub fn sample_into(&mut self, batch: &mut Batch) -> Result<(), SampleError> {
        match self.loader.sample_into(batch) {
            Err(SampleError::EpochEnd) => self.loader.sample_into(batch),
            out => out,
        }
    }

    /// The `post_loss` hook: writes the priorities the loss put in the batch's
    /// priority field back to the buffer (TorchRL's `update_tensordict_priority`).
    pub fn update_priority(&self, batch: &Batch) -> Result<PriorityUpdate, PriorityError> {
        self.buffer.update_priority_from(batch)
    }

    /// The `post_loss` hook with priorities computed apart from the batch: one per row
    /// (or `k` per row).
    pub fn update_priority_with(
        &self,
        batch: &Batch,
        priority: &[f64],
    ) -> Result<PriorityUpdate, PriorityError> {
        self.buffer
            .update_priority(batch.index(), batch.generations(), priority)
    }

    /// The steps' validity: the collector's mask, or all valid.
    fn valid(&self, collected: &Batch) -> Result<Vec<bool>, DataError> {
        Ok(match &self.mask_key {
            Some(key) => collected.column::<bool>(key)?.to_vec(),
            None => vec![true; collected.len()],
        })
    }

    /// `[E, T]` (or `[n]`) rows of the buffer's spec as `[n]` rows, masked steps out.
    fn flatten(&self, collected: &Batch) -> Result<Batch, DataError> {
        if collected.shape().len() > 2 {
            return Err(DataError::BatchShape {
                expected: "[envs, steps] or [n] collector batches",
                found: collected.shape().to_vec(),
            });
        }
        let spec = self.buffer.spec();
        let map = collected.columns_for(spec)?;
        let valid = self.valid(collected)?;
        let keep: Vec<usize> = (0..collected.len()).filter(|&r| valid[r]).collect();
        let mut out = Batch::zeros(spec.clone(), [keep.len()]);
        let parts = out.parts_mut();
        for ((f, &i), dst) in spec.fields().iter().zip(&map).zip(parts.columns.iter_mut()) {
            let (src, bytes) = (collected.columns()[i].as_bytes(), f.bytes());
            let dst = dst.as_bytes_mut();
            for (k, &r) in keep.iter().enumerate() {
                dst[k * bytes..(k + 1) * bytes].copy_from_slice(&src[r * bytes..(r + 1) * bytes]);
            }
        }
        if self.mask_key.is_none() {
            // As TorchRL's: without a mask, each environment's last step is marked
            // truncated before the rows are laid end to end, so that no trajectory
            // runs from one environment's last step into the next one's first.
            let truncated = Key::from(("next", "truncated"));
            if spec
                .field(&truncated)
                .is_some_and(|(_, f)| f.dtype() == DType::Bool && f.elements() == 1)
            {
                let steps = collected.shape().last().copied().unwrap_or(0);
                let marks = out.column_mut::<bool>(&truncated)?;
                for last in marks.chunks_mut(steps.max(1)).filter_map(|c| c.last_mut()) {
                    *last = true;
                }
            }
        }
        Ok(out)
    }

    /// `[E, T]` step rows as padded trajectories of `steps` steps.
    fn pad(
        &self,
        collected: &Batch,
        envs: Option<usize>,
        steps: usize,
        mask: usize,
        step_spec: &Spec,
    ) -> Result<Batch, DataError> {
        let (e, t) = match *collected.shape() {
            [e, t] if t <= steps && envs.is_none_or(|max| e <= max) => (e, t),
            _ => {
                return Err(DataError::BatchShape {
                    expected: "[envs, steps] with at most max_dims environments and steps",
                    found: collected.shape().to_vec(),
                })
            }
        };
        let map = collected.columns_for(step_spec)?;
        let valid = self.valid(collected)?;
        let spec = self.buffer.spec();
        let mut out = Batch::zeros(spec.clone(), [envs.unwrap_or(e)]);
        let parts = out.parts_mut();
        let mut steps_of = step_spec.fields().iter().zip(&map);
        for (i, (f, dst)) in spec
            .fields()
            .iter()
            .zip(parts.columns.iter_mut())
            .enumerate()
        {
            let dst = dst.as_bytes_mut();
            if i == mask {
                for env in 0..e {
                    for step in 0..t {
                        dst[env * steps + step] = u8::from(valid[env * t + step]);
                    }
                }
                continue;
            }
            let (_, &c) = steps_of
                .next()
                .expect("replaybuf internal error: a buffer field without its step field");
            // One step's bytes; a row holds `steps` of them.
            let bytes = f.bytes() / steps;
            let src = collected.columns()[c].as_bytes();
            for env in 0..e {
                let (from, to) = (env * t * bytes, env * f.bytes());
                dst[to..to + t * bytes].copy_from_slice(&src[from..from + t * bytes]);
            }
        }
        Ok(out)
    }
}
