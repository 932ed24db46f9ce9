//! The learner's pipeline (TorchRL's `ReplayBuffer(transform, collate_fn, prefetch)`,
//! tmrl's `sample_preprocessor` and `collate`): every batch is sampled, goes through the
//! buffer's transforms, then the loader's sample preprocessor, then its collate step
//! into the learner's own type. A [`Loader`] runs that in the learner's thread, or with
//! `prefetch(k)` in a small pool of workers that keep up to `k` results ready in
//! reusable buffers (`prefetch.rs`), so that `sample` takes a ready one.
//!
//! Layer: faces.

use std::fmt;

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::error::{BuildError, BuildErrorKind, DataError, SampleError, Stage};
use crate::learner::Learner;
use crate::prefetch::{Fill, Prefetch};
use crate::sampler::SamplerEngine;

/// The pipeline's closures are shared read-only, never part of a protocol loom checks,
/// and loom's `Arc` cannot hold a `dyn Fn`: `std`'s.
use std::sync::Arc;

pub use crate::iter::Batches;

/// A sample preprocessor (tmrl's `sample_preprocessor`, e.g. data augmentation): runs
/// on each sampled batch after the buffer's transforms.
pub type PreprocessFn = dyn Fn(&mut Batch) -> Result<(), DataError> + Send + Sync;

/// The default name of a loader's worker threads (`{name}-{i}`).
const DEFAULT_THREAD_NAME: &str = "replaybuf-prefetch";

/// What each fill does before the collate step.
#[derive(Clone)]
struct Stages {
    /// Rows per batch.
    rows: usize,
    preprocess: Option<Arc<PreprocessFn>>,
}

impl Stages {
    /// Samples a batch into `batch` (transforms included), then preprocesses it.
    fn draw(&self, learner: &mut Learner, batch: &mut Batch) -> Result<(), SampleError> {
        learner.sample_n_into(self.rows, batch)?;
        if let Some(preprocess) = &self.preprocess {
            preprocess(batch).map_err(|e| SampleError::Pipeline {
                stage: Stage::Preprocess,
                error: Box::new(e),
            })?;
        }
        Ok(())
    }
}

/// Makes the fill of one worker (or of the inline loader) from its learner handle.
type MakeFill<T> = Arc<dyn Fn(Learner, Stages) -> Fill<T> + Send + Sync>;

/// The most batches a loader keeps ready ([`LoaderBuilder::prefetch`]): a
/// learner's pipeline needs a few; a depth past the memory aborted the process.
pub const MAX_PREFETCH: usize = 1024;

/// Builds a [`Loader`]: see [`ReplayBuffer::loader`].
pub struct LoaderBuilder<T = Batch> {
    buffer: ReplayBuffer,
    batch_size: Option<usize>,
    prefetch: usize,
    workers: usize,
    thread_name: String,
    preprocess: Option<Arc<PreprocessFn>>,
    make_fill: MakeFill<T>,
}

impl ReplayBuffer {
    /// A learner's pipeline over this buffer: batches of the builder's `batch_size`
    /// (or [`LoaderBuilder::batch_size`]), sampled in the learner's thread unless
    /// [`LoaderBuilder::prefetch`] asks for workers.
    ///
    /// ```
    /// use replaybuf::{Batch, DType, ReplayBuffer, Spec};
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [3]).build()?;
    /// let rb = ReplayBuffer::builder(spec).capacity(1000).seed(1).build()?;
    /// rb.extend(&rb.batch([500]))?;
    /// let mut loader = rb
    ///     .loader()
    ///     .batch_size(64)
    ///     .preprocess(|b: &mut Batch| {
    ///         b.column_mut::<f32>("obs")?.iter_mut().for_each(|x| *x += 1.0);
    ///         Ok(())
    ///     })
    ///     .collate(|b: &Batch| Ok(b.column::<f32>("obs")?.to_vec()))
    ///     .prefetch(2)
    ///     .build()?;
    /// let obs: Vec<f32> = loader.sample()?;
    /// assert_eq!(obs, vec![1.0; 64 * 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn loader(&self) -> LoaderBuilder<Batch> {
        LoaderBuilder {
            buffer: self.clone(),
            batch_size: None,
            prefetch: 0,
            workers: 1,
            thread_name: DEFAULT_THREAD_NAME.to_string(),
            preprocess: None,
            make_fill: Arc::new(|mut learner: Learner, stages: Stages| {
                let fill: Fill<Batch> = Box::new(move |slot: &mut Option<Batch>| {
                    // A batch of other fields, given back through `sample_into` or
                    // `recycle`, is not reused: every fill into it failed.
                    let spec = learner.buffer().spec();
                    if slot.as_ref().is_some_and(|b| !b.spec().same_fields(spec)) {
                        *slot = None;
                    }
                    let batch = slot.get_or_insert_with(|| learner.buffer().batch([0]));
                    stages.draw(&mut learner, batch)
                });
                fill
            }),
        }
    }

    /// A learner handle whose `sample` takes a batch prepared ahead by a worker thread,
    /// which keeps `k` batches of the builder's `batch_size` ready (TorchRL's
    /// `prefetch`): `rb.loader().prefetch(k).build()`. Dropping the handle stops and
    /// joins the worker.
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec};
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [3]).build()?;
    /// let rb = ReplayBuffer::builder(spec).capacity(1000).batch_size(32).build()?;
    /// rb.extend(&rb.batch([100]))?;
    /// let mut learner = rb.prefetch(2)?;
    /// let mut batch = rb.batch([32]);
    /// for _ in 0..10 {
    ///     learner.sample_into(&mut batch)?; // a ready batch, swapped in
    ///     assert_eq!(batch.len(), 32);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn prefetch(&self, k: usize) -> Result<Loader<Batch>, BuildError> {
        self.loader().prefetch(k).build()
    }
}

impl LoaderBuilder<Batch> {
    /// Turns every batch into the learner's own type (TorchRL's `collate_fn`, tmrl's
    /// `collate`), after the preprocessor. With prefetch, it runs in the workers.
    pub fn collate<U: Send + 'static>(
        self,
        collate: impl Fn(&Batch) -> Result<U, DataError> + Send + Sync + 'static,
    ) -> LoaderBuilder<U> {
        let collate = Arc::new(collate);
        LoaderBuilder {
            buffer: self.buffer,
            batch_size: self.batch_size,
            prefetch: self.prefetch,
            workers: self.workers,
            thread_name: self.thread_name,
            preprocess: self.preprocess,
            make_fill: Arc::new(move |mut learner: Learner, stages: Stages| {
                let collate = collate.clone();
                let mut batch = learner.buffer().batch([0]);
                let fill: Fill<U> = Box::new(move |slot: &mut Option<U>| {
                    stages.draw(&mut learner, &mut batch)?;
                    *slot = Some(collate(&batch).map_err(|e| SampleError::Pipeline {
                        stage: Stage::Collate,
                        error: Box::new(e),
                    })?);
                    Ok(())
                });
                fill
            }),
        }
    }
}

impl<T: Send + 'static> LoaderBuilder<T> {
    /// Rows per batch (default: the buffer builder's `batch_size`).
    pub fn batch_size(mut self, rows: usize) -> Self {
        self.batch_size = Some(rows);
        self
    }

    /// Batches kept ready by worker threads (default 0: sample in the learner's
    /// thread). With `k >= 1`, exactly `k` batches are prepared or in preparation
    /// whenever the learner is not taking one. At most [`MAX_PREFETCH`]: `build`
    /// refuses more (each is a batch held in memory).
    pub fn prefetch(mut self, k: usize) -> Self {
        self.prefetch = k;
        self
    }

    /// Worker threads of a prefetching loader (default 1; at most `prefetch` are
    /// used). A without-replacement sampler always gets one, so that its batches and
    /// the end of its epoch arrive in the order they were drawn.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// The name of the worker threads, `{name}-{i}` (default `replaybuf-prefetch`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Runs `preprocess` on every batch after the buffer's transforms (tmrl's
    /// `sample_preprocessor`, e.g. data augmentation). With prefetch, it runs in the
    /// workers.
    pub fn preprocess(
        mut self,
        preprocess: impl Fn(&mut Batch) -> Result<(), DataError> + Send + Sync + 'static,
    ) -> Self {
        self.preprocess = Some(Arc::new(preprocess));
        self
    }

    /// Checks the choices and starts the workers, if any.
    pub fn build(self) -> Result<Loader<T>, BuildError> {
        let err = |reason| Err(BuildError::new(BuildErrorKind::Loader { reason }));
        let inner = self.buffer.state();
        let Some(rows) = self.batch_size.or(inner.core.batch_size) else {
            return err("no batch size: set one on the loader or on the buffer's builder");
        };
        if rows == 0 {
            return Err(BuildError::new(BuildErrorKind::ZeroBatchSize));
        }
        if let Some(slice) = inner.core.sampler.slice() {
            if slice.layout(rows).is_none() {
                return Err(BuildError::new(BuildErrorKind::SliceBatchSize {
                    batch_size: rows,
                    divisor: slice.divisor(),
                }));
            }
        }
        let stages = Stages {
            rows,
            preprocess: self.preprocess,
        };
        let make = &self.make_fill;
        let mode = if self.prefetch == 0 {
            Delivery::Inline {
                fill: make(self.buffer.learner(), stages),
                spare: None,
            }
        } else {
            if self.workers == 0 {
                return err("a prefetching loader needs at least one worker");
            }
            if self.prefetch > MAX_PREFETCH {
                return err("prefetch keeps at most 1,024 batches ready");
            }
            if self.thread_name.contains('\0') {
                // `std::thread::Builder::spawn` panics on one.
                return err("a worker thread's name cannot hold a NUL byte");
            }
            let workers = if has_epochs(&inner.core.sampler) {
                1
            } else {
                self.workers.min(self.prefetch)
            };
            let fills = (0..workers)
                .map(|_| make(self.buffer.learner(), stages.clone()))
                .collect();
            Delivery::Prefetch(
                Prefetch::spawn(self.prefetch, fills, &self.thread_name)
                    .map_err(|e| BuildError::new(BuildErrorKind::Spawn(e)))?,
            )
        };
        Ok(Loader {
            buffer: self.buffer,
            mode,
        })
    }
}

/// Whether the sampler hands out epochs, whose order and end must reach the learner as
/// drawn.
fn has_epochs(sampler: &SamplerEngine) -> bool {
    match sampler {
        // A queue's rows, too, reach the learner in the order they were taken.
        SamplerEngine::WithoutReplacement(_) | SamplerEngine::Fifo => true,
        SamplerEngine::Slice(state) => state.epochs.is_some(),
        SamplerEngine::Uniform | SamplerEngine::Prioritized(_) => false,
    }
}

impl<T> fmt::Debug for LoaderBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoaderBuilder")
            .field("batch_size", &self.batch_size)
            .field("prefetch", &self.prefetch)
            .field("workers", &self.workers)
            .field("thread_name", &self.thread_name)
            .field("preprocess", &self.preprocess.is_some())
            .finish_non_exhaustive()
    }
}

enum Delivery<T: Send + 'static> {
    /// Samples in the caller's thread; `spare` is the buffer the next sample reuses.
    Inline { fill: Fill<T>, spare: Option<T> },
    /// Takes what the workers prepared.
    Prefetch(Prefetch<T>),
}

/// A learner's pipeline: sampled batches through the buffer's transforms, a sample
/// preprocessor and a collate step, prepared inline or ahead by worker threads (see
/// [`ReplayBuffer::loader`]).
///
/// Iterating a loader yields batches until a without-replacement epoch runs out (a
/// sampler with replacement never runs out); other errors are yielded as items. The
/// next iteration starts the next epoch.
///
/// Dropping a prefetching loader stops its workers and waits for them: a worker in the
/// middle of a batch finishes it first. Batches prepared but not taken are dropped;
/// with a without-replacement sampler, their rows count as drawn in the epoch.
pub struct Loader<T: Send + 'static = Batch> {
    buffer: ReplayBuffer,
    mode: Delivery<T>,
}

impl<T: Send + 'static> Loader<T> {
    /// The next result: a ready one from the workers (waiting if none is ready yet), or
    /// one made now without prefetch.
    pub fn sample(&mut self) -> Result<T, SampleError> {
        match &mut self.mode {
            Delivery::Inline { fill, spare } => {
                fill(spare)?;
                Ok(spare
                    .take()
                    .expect("replaybuf internal error: a fill left no item"))
            }
            Delivery::Prefetch(pool) => pool.take(),
        }
    }

    /// Like [`Loader::sample`], moving the result into `out`; `out`'s previous
    /// contents become a buffer the pipeline reuses, so a loop over `sample_into` with
    /// one `Batch` allocates nothing once warm. On an error `out` is left as it was.
    pub fn sample_into(&mut self, out: &mut T) -> Result<(), SampleError> {
        match &mut self.mode {
            Delivery::Inline { fill, spare } => {
                fill(spare)?;
                let fresh = spare
                    .as_mut()
                    .expect("replaybuf internal error: a fill left no item");
                std::mem::swap(out, fresh);
                Ok(())
            }
            Delivery::Prefetch(pool) => pool.take_into(out),
        }
    }

    /// Gives a result back for its buffers to be reused.
    pub fn recycle(&mut self, item: T) {
        match &mut self.mode {
            Delivery::Inline { spare, .. } => {
                spare.get_or_insert(item);
            }
            Delivery::Prefetch(pool) => pool.recycle(item),
        }
    }

    /// Results ready now (always 0 without prefetch).
    pub fn ready(&self) -> usize {
        match &self.mode {
            Delivery::Inline { .. } => 0,
            Delivery::Prefetch(pool) => pool.ready(),
        }
    }

    /// How many results are kept ready (0: no prefetch).
    pub fn prefetch_depth(&self) -> usize {
        match &self.mode {
            Delivery::Inline { .. } => 0,
            Delivery::Prefetch(pool) => pool.depth(),
        }
    }

    /// The buffer this loader samples.
    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }
}

impl<T: Send + 'static> Iterator for Loader<T> {
    type Item = Result<T, SampleError>;

    /// The next result; `None` when a without-replacement epoch runs out.
    fn next(&mut self) -> Option<Self::Item> {
        match self.sample() {
            Err(SampleError::EpochEnd) => None,
            other => Some(other),
        }
    }
}

impl<T: Send + 'static> fmt::Debug for Loader<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("prefetch", &self.prefetch_depth())
            .field("ready", &self.ready())
            .finish_non_exhaustive()
    }
}
