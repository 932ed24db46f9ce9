//! [`ReplayBufferEnsemble`] (TorchRL's `ReplayBufferEnsemble`): several buffers, each
//! with its own storage, sampler and writers, sampled together.
//!
//! Each sample picks which buffers to read, splits the batch among them, samples each
//! (its own sampler and transforms), and concatenates the rows into one batch that
//! records which buffer every row came from:
//!
//! - by default, `num_buffer_sampled` buffers (default: one) are drawn with
//!   probabilities `p` (default: equal), with replacement, and the batch is split
//!   evenly among the draws (a buffer drawn twice gives twice the rows);
//! - with `sample_from_all`, every buffer gives an even share of the batch.
//!
//! An even split of `n` rows over `k` draws gives the first `n % k` draws one row more.
//! Writing goes to the buffers themselves (TorchRL forbids writing to the ensemble too).
//!
//! Layer: faces.

use std::ops::{Index, Range};

use crossbeam_utils::CachePadded;
use rand::RngExt;

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::error::{BuildError, BuildErrorKind, PriorityError, PriorityUpdate, SampleError};
use crate::rng::{self, Rng};
use crate::settings::Settings;
use crate::spec::Spec;
use crate::sync::{AtomicU64, Ordering};
use std::sync::Arc;

/// Buffers sampled together: see the module docs and [`ReplayBufferEnsemble::builder`].
///
/// ```
/// use replaybuf::{DType, ReplayBuffer, Spec};
/// use replaybuf::ensemble::ReplayBufferEnsemble;
/// use replaybuf::sampler::WithoutReplacement;
///
/// let spec = Spec::builder().field("obs", DType::F32, [4]).build()?;
/// let expert = ReplayBuffer::builder(spec.clone()).capacity(1000).build()?;
/// let online = ReplayBuffer::builder(spec)
///     .capacity(10_000)
///     .sampler(WithoutReplacement::new())
///     .build()?;
/// expert.extend(&expert.batch([100]))?;
/// online.extend(&online.batch([500]))?;
///
/// let both = ReplayBufferEnsemble::builder([expert, online])
///     .sample_from_all(true)
///     .seed(3)
///     .build()?;
/// let batch = both.sample(64)?;
/// assert_eq!(batch.batch().len(), 64);
/// assert_eq!(batch.rows_of(0), 0..32); // the first 32 rows came from `expert`
/// assert!(batch.buffer_ids()[32..].iter().all(|&b| b == 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ReplayBufferEnsemble {
    inner: Arc<Ensemble>,
}

#[derive(Debug)]
struct Ensemble {
    buffers: Vec<ReplayBuffer>,
    /// The spec of the ensemble's batches (the first buffer's).
    spec: Arc<Spec>,
    /// Running sums of the probabilities, for drawing buffers (empty with
    /// `sample_from_all`).
    cumulative: Vec<f64>,
    /// Buffers drawn per sample (`buffers.len()` with `sample_from_all`).
    draws: usize,
    batch_size: Option<usize>,
    seed: u64,
    /// Samples drawn: each gets its own random stream.
    calls: CachePadded<AtomicU64>,
}

/// Builds a [`ReplayBufferEnsemble`]; [`EnsembleBuilder::build`] checks every choice.
#[derive(Clone, Debug)]
pub struct EnsembleBuilder {
    buffers: Vec<ReplayBuffer>,
    p: Option<Vec<f64>>,
    sample_from_all: bool,
    num_buffer_sampled: Option<usize>,
    /// Batch size and seed.
    settings: Settings,
}

impl ReplayBufferEnsemble {
    /// Starts an ensemble of `buffers`: any storages and samplers, but rows of the same
    /// fields (key, dtype, shape; in any order).
    pub fn builder(buffers: impl IntoIterator<Item = ReplayBuffer>) -> EnsembleBuilder {
        EnsembleBuilder {
            buffers: buffers.into_iter().collect(),
            p: None,
            sample_from_all: false,
            num_buffer_sampled: None,
            settings: Settings::default(),
        }
    }
}

impl EnsembleBuilder {
    crate::settings::setters!(batch_size, seed);

    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
    /// The probability of drawing each buffer (normalised; default: equal). Not with
    /// `sample_from_all`.
    pub fn p(mut self, p: impl Into<Vec<f64>>) -> Self {
        self.p = Some(p.into());
        self
    }

    /// Sample every buffer each time, each giving an even share of the batch.
    pub fn sample_from_all(mut self, yes: bool) -> Self {
        self.sample_from_all = yes;
        self
    }

    /// Buffers drawn per sample (default 1), with replacement, by `p`. Not with
    /// `sample_from_all`.
    pub fn num_buffer_sampled(mut self, n: usize) -> Self {
        self.num_buffer_sampled = Some(n);
        self
    }

    /// Checks the choices.
    pub fn build(self) -> Result<ReplayBufferEnsemble, BuildError> {
        let err = |reason| Err(BuildError::new(BuildErrorKind::Ensemble { reason }));
        let Some(first) = self.buffers.first() else {
            return err("an ensemble needs at least one buffer");
        };
        let spec = first.spec().clone();
        if self.buffers.iter().any(|b| !b.spec().same_fields(&spec)) {
            return err("every buffer must have the same fields (key, dtype, shape)");
        }
        if self.settings.batch_size == Some(0) {
            return Err(BuildError::new(BuildErrorKind::ZeroBatchSize));
        }
        let n = self.buffers.len();
        let (cumulative, draws) = if self.sample_from_all {
            if self.p.is_some() {
                return err("`p` and `sample_from_all` exclude each other");
            }
            if self.num_buffer_sampled.is_some() {
                return err("`num_buffer_sampled` and `sample_from_all` exclude each other");
            }
            (Vec::new(), n)
        } else {
            let p = self.p.unwrap_or_else(|| vec![1.0; n]);
            if p.len() != n {
                return err("`p` needs one probability per buffer");
            }
            if p.iter().any(|&x| !x.is_finite() || x < 0.0) {
                return err("probabilities must be finite and at least 0");
            }
            // Weights, scaled by the largest first: finite ones whose sum is not (two
            // of `f64::MAX`) still split the draws as they say.
            let top = p.iter().copied().fold(0.0, f64::max);
            if top == 0.0 {
                return err("probabilities must not all be 0");
            }
            let p: Vec<f64> = p.iter().map(|x| x / top).collect();
            let total: f64 = p.iter().sum();
            let draws = self.num_buffer_sampled.unwrap_or(1);
            if draws == 0 {
                return err("`num_buffer_sampled` must be at least 1");
            }
            let mut sum = 0.0;
            let mut cumulative: Vec<f64> = p
                .iter()
                .map(|x| {
                    sum += x / total;
                    sum
                })
                .collect();
            // The last buffer with mass takes whatever rounding leaves below 1.
            if let Some(last) = p.iter().rposition(|&x| x > 0.0) {
                cumulative[last] = f64::INFINITY;
            }
            (cumulative, draws)
        };
        Ok(ReplayBufferEnsemble {
            inner: Arc::new(Ensemble {
                buffers: self.buffers,
                spec,
                cumulative,
                draws,
                batch_size: self.settings.batch_size,
                seed: self.settings.seed.unwrap_or_else(crate::sync::entropy_seed),
                calls: CachePadded::new(AtomicU64::new(0)),
            }),
        })
    }
}

/// A batch sampled from an ensemble: the rows, grouped by the buffer they came from
/// (lowest buffer first), and each row's buffer.
#[derive(Clone, Debug)]
pub struct EnsembleBatch {
    batch: Batch,
    buffer: Vec<usize>,
    /// Rows of each buffer in `batch`.
    rows: Vec<Range<usize>>,
    /// Each buffer's last sample, reused.
    parts: Vec<Batch>,
}

impl EnsembleBatch {
    /// The rows: `index`, `generations` and (when some buffer is prioritized) `weight`
    /// are each row's in its own buffer; rows of an unprioritized buffer weigh 1.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// The rows, to change them in place.
    pub fn batch_mut(&mut self) -> &mut Batch {
        &mut self.batch
    }

    /// Takes the rows out.
    pub fn into_batch(self) -> Batch {
        self.batch
    }

    /// The buffer (its position in the ensemble) each row came from.
    pub fn buffer_ids(&self) -> &[usize] {
        &self.buffer
    }

    /// The rows that came from buffer `k` (empty if it was not sampled).
    pub fn rows_of(&self, k: usize) -> Range<usize> {
        self.rows.get(k).cloned().unwrap_or(0..0)
    }
}

impl ReplayBufferEnsemble {
    /// The buffers, in order.
    pub fn buffers(&self) -> &[ReplayBuffer] {
        &self.inner.buffers
    }

    /// Buffer `k`, if there is one (TorchRL's `rb[k]`; the ensemble also indexes).
    pub fn get(&self, k: usize) -> Option<&ReplayBuffer> {
        self.inner.buffers.get(k)
    }

    /// Buffers in the ensemble.
    pub fn len(&self) -> usize {
        self.inner.buffers.len()
    }

    /// Whether the ensemble has no buffer (never: the builder refuses that).
    pub fn is_empty(&self) -> bool {
        self.inner.buffers.is_empty()
    }

    /// An empty batch to pass to [`ReplayBufferEnsemble::sample_into`].
    pub fn batch(&self) -> EnsembleBatch {
        EnsembleBatch {
            batch: Batch::zeros(self.inner.spec.clone(), [0]),
            buffer: Vec::new(),
            rows: Vec::new(),
            parts: self.inner.buffers.iter().map(|b| b.batch([0])).collect(),
        }
    }

    /// Samples `n` rows.
    pub fn sample(&self, n: usize) -> Result<EnsembleBatch, SampleError> {
        let mut out = self.batch();
        self.sample_n_into(n, &mut out)?;
        Ok(out)
    }

    /// Samples the builder's `batch_size` rows.
    pub fn sample_default(&self) -> Result<EnsembleBatch, SampleError> {
        self.sample(self.inner.batch_size.ok_or(SampleError::NoBatchSize)?)
    }

    /// Samples into `out`, reusing its buffers: the builder's `batch_size` rows, or as
    /// many as `out` holds when none was set.
    pub fn sample_into(&self, out: &mut EnsembleBatch) -> Result<(), SampleError> {
        let n = match (self.inner.batch_size, out.batch.len()) {
            (Some(n), _) => n,
            (None, 0) => return Err(SampleError::NoBatchSize),
            (None, n) => n,
        };
        self.sample_n_into(n, out)
    }

    /// Rows per buffer of one sample of `n` rows.
    fn shares(&self, rng: &mut Rng, n: usize) -> Vec<usize> {
        let e = &self.inner;
        let mut shares = vec![0; e.buffers.len()];
        let (base, extra) = (n / e.draws, n % e.draws);
        for d in 0..e.draws {
            let k = if e.cumulative.is_empty() {
                d
            } else {
                let x: f64 = rng.random();
                e.cumulative
                    .iter()
                    .position(|&c| x < c)
                    .expect("replaybuf internal error: the last cumulative is infinite")
            };
            shares[k] += base + usize::from(d < extra);
        }
        shares
    }

    fn sample_n_into(&self, n: usize, out: &mut EnsembleBatch) -> Result<(), SampleError> {
        let e = &self.inner;
        if out.parts.len() != e.buffers.len() || !out.batch.spec().same_fields(&e.spec) {
            return Err(SampleError::SpecMismatch);
        }
        let call = e.calls.fetch_add(1, Ordering::Relaxed);
        let mut rng = rng::stream(e.seed, rng::Stream::Call(call));
        let shares = self.shares(&mut rng, n);
        // A member with no row to give, or one that would refuse its share, fails the
        // sample: found before any member draws, as a draw moves a member's epoch and
        // rate-limit counts, which a failed sample must leave alone. (A rate-limited
        // member waits for rows.)
        // So does a sample past memory.
        out.batch.room_for_sample(n, false)?;
        let members = e.buffers.iter().zip(&mut out.parts).zip(&shares);
        for ((b, part), &share) in members.filter(|(_, &s)| s > 0) {
            let core = &b.state().core;
            // Rows a draw can return: a frames member's `len` counts the steps whose
            // next one is not written yet, and passed here with none.
            if b.limiter.is_none() && !core.storage.has_sampleable() {
                return Err(SampleError::Empty);
            }
            core.check_sample(share)?;
            core.room_for_sample(share, part)?;
        }
        for ((buffer, part), &share) in e.buffers.iter().zip(&mut out.parts).zip(&shares) {
            if share > 0 {
                // Through the member's rate limit, as its own learners sample (its
                // limit was passed by).
                buffer.limited_sample(share, || {
                    let inner = buffer.state();
                    inner.core.sample_into(&mut rng, share, part)?;
                    inner.transforms.apply_drawn(part)
                })?;
            }
        }
        // Concatenate: every member's rows in buffer order.
        let total: usize = shares
            .iter()
            .zip(&out.parts)
            .map(|(&s, p)| if s > 0 { p.len() } else { 0 })
            .sum();
        let weighted = shares
            .iter()
            .zip(&out.parts)
            .any(|(&s, p)| s > 0 && p.weight().is_some());
        out.batch.reshape_for_sample(total, weighted);
        out.buffer.clear();
        out.rows.clear();
        let spec = e.spec.clone();
        let fields = spec.fields();
        let mut at = 0;
        for (k, (part, &share)) in out.parts.iter().zip(&shares).enumerate() {
            let rows = if share > 0 { part.len() } else { 0 };
            out.rows.push(at..at + rows);
            if rows == 0 {
                continue;
            }
            let map = part
                .columns_for(&spec)
                .map_err(|_| SampleError::SpecMismatch)?;
            let parts = out.batch.parts_mut();
            for ((f, &i), col) in fields.iter().zip(&map).zip(parts.columns.iter_mut()) {
                let bytes = f.bytes();
                col.as_bytes_mut()[at * bytes..(at + rows) * bytes]
                    .copy_from_slice(part.columns()[i].as_bytes());
            }
            parts.index[at..at + rows].copy_from_slice(part.index());
            parts.generation[at..at + rows].copy_from_slice(part.generations());
            if let Some(w) = parts.weight {
                match part.weight() {
                    Some(pw) => w[at..at + rows].copy_from_slice(pw),
                    None => w[at..at + rows].fill(1.0),
                }
            }
            out.buffer.extend(std::iter::repeat_n(k, rows));
            at += rows;
        }
        Ok(())
    }

    /// Sets the priorities of a sampled ensemble batch's rows, each in its own buffer
    /// (see [`ReplayBuffer::update_priority`]): one priority per row, or `k` per row.
    /// Every buffer a row came from must be prioritized. The lengths, the values and the
    /// buffers are checked before any is updated; a buffer refusing its rows afterwards
    /// (an index it never held) leaves the buffers before it updated.
    pub fn update_priority(
        &self,
        batch: &EnsembleBatch,
        priority: &[f64],
    ) -> Result<PriorityUpdate, PriorityError> {
        let rows = batch.batch.len();
        let lengths = PriorityError::Lengths {
            indices: rows,
            generations: batch.batch.generations().len(),
            priorities: priority.len(),
        };
        if rows == 0 || priority.is_empty() || !priority.len().is_multiple_of(rows) {
            return if rows == 0 && priority.is_empty() {
                Ok(PriorityUpdate::default())
            } else {
                Err(lengths)
            };
        }
        let per_row = priority.len() / rows;
        if let Some(position) = priority.iter().position(|p| !(p.is_finite() && *p >= 0.0)) {
            return Err(PriorityError::Invalid {
                position,
                value: priority[position],
            });
        }
        let used = |k: usize| !batch.rows_of(k).is_empty();
        if (0..self.len()).any(|k| used(k) && self.inner.buffers[k].alpha().is_none()) {
            return Err(PriorityError::NotPrioritized);
        }
        let mut done = PriorityUpdate::default();
        for (k, buffer) in self.inner.buffers.iter().enumerate() {
            let r = batch.rows_of(k);
            if r.is_empty() {
                continue;
            }
            let got = buffer.update_priority(
                &batch.batch.index()[r.clone()],
                &batch.batch.generations()[r.clone()],
                &priority[r.start * per_row..r.end * per_row],
            )?;
            done.applied += got.applied;
            done.stale += got.stale;
        }
        Ok(done)
    }
}

impl Index<usize> for ReplayBufferEnsemble {
    type Output = ReplayBuffer;

    /// Buffer `k`. Panics if there is none; [`ReplayBufferEnsemble::get`] does not.
    fn index(&self, k: usize) -> &ReplayBuffer {
        &self.inner.buffers[k]
    }
}
