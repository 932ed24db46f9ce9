//! A tmrl-style memory over a built [`ReplayBuffer`]: the pieces of tmrl's `Memory`
//! (`nb_steps`, `memory_size`, `batch_size`, `sample_preprocessor`, `append_buffer`,
//! `get_transition`, `collate`), with the buffer's storage and samplers underneath.
//!
//! A tmrl rollout worker sends buffers of *samples*, one per step in order: the action
//! taken, the observation it led to, the reward, and whether the episode ended there
//! (`terminated`) or was cut (`truncated`); the first sample of an episode carries the
//! reset observation. [`TmrlMemory::append_buffer`] turns them into *transitions*
//! `(prev_obs, act, rew, new_obs, terminated, truncated)` by pairing each sample with
//! the one before it, never across an episode's end, and keeps a buffer's last sample
//! so that an episode continued by the next buffer links up. Sampling draws transitions
//! (through a [`Loader`]: preprocessed, collated, optionally prefetched) and collates
//! them into the six arrays tmrl's training agents take, as `f32`.
//!
//! Loading a memory from a dataset directory (tmrl's `dataset_path`) belongs with the
//! buffer's persistence; a memory is made over a buffer built however it was.
//!
//! Layer: faces.

use std::fmt;
use std::sync::Arc;

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::core::Written;
use crate::dtype::DType;
use crate::error::persist::PersistError;
use crate::error::{AccessError, BuildError, BuildErrorKind, DataError, SampleError};
use crate::key::Key;
use crate::loader::{Loader, PreprocessFn};
use crate::spec::{Field, Spec};

/// One array of a collated batch: `f32` values and their shape `[batch, ..field]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tensor {
    /// The values, row after row.
    pub data: Vec<f32>,
    /// `[batch, ..field shape]`.
    pub shape: Vec<usize>,
}

/// A collated batch of transitions: tmrl's six tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TmrlBatch {
    /// The observation before the action.
    pub prev_obs: Tensor,
    /// The action.
    pub act: Tensor,
    /// The reward, `[batch]`.
    pub rew: Tensor,
    /// The observation after the action.
    pub new_obs: Tensor,
    /// 1 where the episode ended at this step, `[batch]`.
    pub terminated: Tensor,
    /// 1 where the episode was cut at this step, `[batch]`.
    pub truncated: Tensor,
}

impl TmrlBatch {
    /// The six tensors, in tmrl's order.
    pub fn into_tuple(self) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor) {
        (
            self.prev_obs,
            self.act,
            self.rew,
            self.new_obs,
            self.terminated,
            self.truncated,
        )
    }
}

/// The keys of the six fields in the buffer's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmrlKeys {
    /// The observation before the action (default `obs`); a collector sample's new
    /// observation goes under this key too.
    pub obs: Key,
    /// The action (default `act`).
    pub act: Key,
    /// The reward (default `rew`).
    pub rew: Key,
    /// The observation after the action (default `("next", "obs")`).
    pub next_obs: Key,
    /// The episode ended (default `terminated`).
    pub terminated: Key,
    /// The episode was cut (default `truncated`).
    pub truncated: Key,
}

impl Default for TmrlKeys {
    fn default() -> Self {
        TmrlKeys {
            obs: "obs".into(),
            act: "act".into(),
            rew: "rew".into(),
            next_obs: ("next", "obs").into(),
            terminated: "terminated".into(),
            truncated: "truncated".into(),
        }
    }
}

/// Positions of the six fields in the buffer's spec.
#[derive(Clone, Copy, Debug)]
struct Fields {
    obs: usize,
    act: usize,
    rew: usize,
    next_obs: usize,
    terminated: usize,
    truncated: usize,
}

/// A tmrl-style memory: see the module docs and [`TmrlMemory::builder`].
pub struct TmrlMemory {
    buffer: ReplayBuffer,
    keys: TmrlKeys,
    fields: Fields,
    /// What a collector's buffer of samples holds.
    sample_spec: Arc<Spec>,
    nb_steps: usize,
    batch_size: usize,
    loader: Loader<TmrlBatch>,
    /// The last sample appended: its observation and whether its episode ended.
    last: Option<(Vec<u8>, bool)>,
}

/// Builds a [`TmrlMemory`].
pub struct TmrlBuilder {
    buffer: ReplayBuffer,
    keys: TmrlKeys,
    nb_steps: usize,
    batch_size: usize,
    prefetch: usize,
    preprocess: Option<Arc<PreprocessFn>>,
}

impl TmrlMemory {
    /// A memory initialised from a dataset directory (tmrl's `dataset_path`): a
    /// checkpoint written by [`ReplayBuffer::save`] (loaded into memory) or a
    /// file-backed storage's directory (reopened in place, so what is appended is kept
    /// there). The memory goes on from the transitions it holds.
    pub fn from_dataset(dir: impl AsRef<std::path::Path>) -> Result<TmrlBuilder, PersistError> {
        crate::checkpoint::dataset::open_writable(dir.as_ref(), None).map(TmrlMemory::builder)
    }

    /// [`TmrlMemory::from_dataset`], drawing from `seed` instead of the seed the
    /// directory records: runs resumed from one dataset under different seeds draw
    /// different batches (under the recorded one, every such run draws the same).
    pub fn from_dataset_seeded(
        dir: impl AsRef<std::path::Path>,
        seed: u64,
    ) -> Result<TmrlBuilder, PersistError> {
        crate::checkpoint::dataset::open_writable(dir.as_ref(), Some(seed)).map(TmrlMemory::builder)
    }

    /// A memory over `buffer`, whose spec holds the six fields named by
    /// [`TmrlKeys`] (and may hold others). tmrl's defaults: `nb_steps` 1, `batch_size`
    /// 256; `memory_size` is the buffer's capacity.
    pub fn builder(buffer: ReplayBuffer) -> TmrlBuilder {
        TmrlBuilder {
            buffer,
            keys: TmrlKeys::default(),
            nb_steps: 1,
            batch_size: 256,
            prefetch: 0,
            preprocess: None,
        }
    }
}

impl TmrlBuilder {
    /// Batches per pass of [`TmrlMemory::iter`] (tmrl's `nb_steps`).
    pub fn nb_steps(mut self, n: usize) -> Self {
        self.nb_steps = n;
        self
    }

    /// Transitions per batch.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// The fields' keys (default [`TmrlKeys::default`]).
    pub fn keys(mut self, keys: TmrlKeys) -> Self {
        self.keys = keys;
        self
    }

    /// Runs on every sampled batch of transitions before it is collated (tmrl's
    /// `sample_preprocessor`, e.g. data augmentation), on all its rows at once.
    pub fn sample_preprocessor(
        mut self,
        f: impl Fn(&mut Batch) -> Result<(), DataError> + Send + Sync + 'static,
    ) -> Self {
        self.preprocess = Some(Arc::new(f));
        self
    }

    /// Batches kept ready by a worker thread (default 0).
    pub fn prefetch(mut self, k: usize) -> Self {
        self.prefetch = k;
        self
    }

    /// Checks the buffer's spec for the six fields and builds the sampling loader.
    pub fn build(self) -> Result<TmrlMemory, BuildError> {
        let spec = self.buffer.spec().clone();
        let keys = self.keys.clone();
        let keys = &keys;
        let field = |key: &Key| {
            spec.field(key).map(|(i, _)| i).ok_or_else(|| {
                BuildError::new(BuildErrorKind::Tmrl {
                    key: key.clone(),
                    reason: "no such field in the buffer's spec",
                })
            })
        };
        let fields = Fields {
            obs: field(&keys.obs)?,
            act: field(&keys.act)?,
            rew: field(&keys.rew)?,
            next_obs: field(&keys.next_obs)?,
            terminated: field(&keys.terminated)?,
            truncated: field(&keys.truncated)?,
        };
        let f = |i: usize| &spec.fields()[i];
        let bad = |key: &Key, reason| {
            Err(BuildError::new(BuildErrorKind::Tmrl {
                key: key.clone(),
                reason,
            }))
        };
        if fields.next_obs == fields.obs {
            // One field for both: each transition's second write over its first.
            return bad(&keys.next_obs, "must be another field than the observation");
        }
        if f(fields.obs).dtype() != f(fields.next_obs).dtype()
            || f(fields.obs).shape() != f(fields.next_obs).shape()
        {
            return bad(
                &keys.next_obs,
                "must have the dtype and shape of the observation",
            );
        }
        if f(fields.rew).elements() != 1 || !is_float(f(fields.rew).dtype()) {
            return bad(&keys.rew, "must be one float per transition");
        }
        for (i, key) in [
            (fields.terminated, &keys.terminated),
            (fields.truncated, &keys.truncated),
        ] {
            if f(i).dtype() != DType::Bool || f(i).elements() != 1 {
                return bad(key, "must be one bool per transition");
            }
        }
        if self.buffer.ndim() != 1 {
            // Its transitions are one stream's: an ndim-2 buffer's count every
            // environment's, and `get_transition` read environment 0 alone (every
            // item past its steps an IndexError), while every append was refused.
            return bad(
                &keys.obs,
                "a tmrl memory holds one stream of transitions: an ndim-1 buffer",
            );
        }
        if self.batch_size == 0 {
            return Err(BuildError::new(BuildErrorKind::ZeroBatchSize));
        }
        let mut sample = Spec::builder();
        for i in [
            fields.act,
            fields.obs,
            fields.rew,
            fields.terminated,
            fields.truncated,
        ] {
            sample = sample.field(f(i).key().clone(), f(i).dtype(), f(i).shape());
        }
        let sample_spec = Arc::new(sample.build()?);
        let mut loader = self
            .buffer
            .loader()
            .batch_size(self.batch_size)
            .prefetch(self.prefetch);
        if let Some(pre) = self.preprocess {
            loader = loader.preprocess(move |b: &mut Batch| pre(b));
        }
        let collate_keys = self.keys.clone();
        let loader = loader
            .collate(move |b: &Batch| collate_fields(b, &collate_keys))
            .build()?;
        Ok(TmrlMemory {
            buffer: self.buffer,
            keys: self.keys,
            fields,
            sample_spec,
            nb_steps: self.nb_steps,
            batch_size: self.batch_size,
            loader,
            last: None,
        })
    }
}

impl TmrlMemory {
    /// The buffer underneath.
    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }

    /// Batches per pass of [`TmrlMemory::iter`].
    pub fn nb_steps(&self) -> usize {
        self.nb_steps
    }

    /// Transitions per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Transitions the memory holds when full (the buffer's capacity).
    pub fn memory_size(&self) -> usize {
        self.buffer.capacity()
    }

    /// Transitions stored.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether no transition is stored.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// A zeroed collector buffer of `n` samples, of the spec
    /// [`TmrlMemory::append_buffer`] takes: the action, the new observation (under the
    /// observation's key), the reward, `terminated` and `truncated`.
    pub fn collector_buffer(&self, n: usize) -> Batch {
        Batch::zeros(self.sample_spec.clone(), [n])
    }

    /// Appends a rollout worker's buffer of samples (tmrl's `append_buffer`): each
    /// sample after the first of its episode makes one transition with the sample
    /// before it (from this buffer, or the last of the previous one). Returns where
    /// the transitions went.
    pub fn append_buffer(&mut self, samples: &Batch) -> Result<Written, DataError> {
        let n = match *samples.shape() {
            [n] => n,
            _ => {
                return Err(DataError::BatchShape {
                    expected: "[n] samples in order",
                    found: samples.shape().to_vec(),
                })
            }
        };
        let map = samples.columns_for(&self.sample_spec)?;
        let cols = samples.columns();
        // The sample spec lists act, obs, rew, terminated, truncated.
        let (act, obs, rew, term, trunc) = (
            cols[map[0]].as_bytes(),
            cols[map[1]].as_bytes(),
            cols[map[2]].as_bytes(),
            cols[map[3]].as_bytes(),
            cols[map[4]].as_bytes(),
        );
        let spec = self.buffer.spec().clone();
        let bytes = |i: usize| spec.fields()[i].bytes();
        let obs_bytes = bytes(self.fields.obs);
        let ended = |r: usize| term[r] != 0 || trunc[r] != 0;
        // The transitions: each sample whose predecessor's episode goes on.
        let pairs: Vec<usize> = (0..n)
            .filter(|&r| match r {
                0 => self.last.as_ref().is_some_and(|(_, done)| !done),
                r => !ended(r - 1),
            })
            .collect();
        let mut out = Batch::zeros(spec.clone(), [pairs.len()]);
        let parts = out.parts_mut();
        let f = self.fields;
        for (k, &r) in pairs.iter().enumerate() {
            let prev: &[u8] = match r {
                0 => {
                    &self
                        .last
                        .as_ref()
                        .expect("a first pair has a last sample")
                        .0
                }
                r => &obs[(r - 1) * obs_bytes..r * obs_bytes],
            };
            for (i, src) in [
                (f.obs, prev),
                (f.next_obs, &obs[r * obs_bytes..(r + 1) * obs_bytes]),
                (f.act, &act[r * bytes(f.act)..(r + 1) * bytes(f.act)]),
                (f.rew, &rew[r * bytes(f.rew)..(r + 1) * bytes(f.rew)]),
                (f.terminated, &term[r..r + 1]),
                (f.truncated, &trunc[r..r + 1]),
            ] {
                let b = src.len();
                parts.columns[i].as_bytes_mut()[k * b..(k + 1) * b].copy_from_slice(src);
            }
        }
        let written = self.buffer.extend(&out)?;
        if n > 0 {
            self.last = Some((
                obs[(n - 1) * obs_bytes..n * obs_bytes].to_vec(),
                ended(n - 1),
            ));
        }
        Ok(written)
    }

    /// The stored transition `item`, oldest first, as a batch of one row with every
    /// field (tmrl's `get_transition`, whose lists drop their oldest from the front:
    /// once the memory is full, item 0 is the oldest still held, not the row at
    /// storage index 0). A memory over several shards has no one order: there, the
    /// row at storage index `item`.
    pub fn get_transition(&self, item: u64) -> Result<Batch, AccessError> {
        TmrlMemory::transition_in(&self.buffer, item)
    }

    /// [`TmrlMemory::get_transition`] through another handle of a memory's buffer
    /// ([`TmrlMemory::buffer`]), which reads without the memory.
    pub fn transition_in(buffer: &ReplayBuffer, item: u64) -> Result<Batch, AccessError> {
        let index = {
            let inner = buffer.state();
            let storage = &inner.core.storage;
            match storage.shards() {
                [one] => {
                    let window = one.window();
                    let seq = window.lo.saturating_add(item);
                    if seq >= window.hi {
                        return Err(AccessError::NotWritten { index: item });
                    }
                    storage.position_of(crate::storage::Draw {
                        seq,
                        ..crate::storage::Draw::default()
                    })
                }
                _ => item,
            }
        };
        buffer.get(index)
    }

    /// Collates a batch of transitions into tmrl's six tensors (tmrl's `collate`).
    pub fn collate(&self, batch: &Batch) -> Result<TmrlBatch, DataError> {
        collate_fields(batch, &self.keys)
    }

    /// A batch of `batch_size` transitions: sampled, preprocessed, collated.
    pub fn sample(&mut self) -> Result<TmrlBatch, SampleError> {
        self.loader.sample()
    }

    /// `nb_steps` batches (tmrl's `for batch in memory`).
    pub fn iter(&mut self) -> impl Iterator<Item = Result<TmrlBatch, SampleError>> + '_ {
        (0..self.nb_steps).map(|_| self.sample())
    }
}

impl fmt::Debug for TmrlMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TmrlMemory")
            .field("len", &self.len())
            .field("memory_size", &self.memory_size())
            .field("nb_steps", &self.nb_steps)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for TmrlBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TmrlBuilder")
            .field("keys", &self.keys)
            .field("nb_steps", &self.nb_steps)
            .field("batch_size", &self.batch_size)
            .field("prefetch", &self.prefetch)
            .finish_non_exhaustive()
    }
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// The six fields of `batch` as `f32` tensors: the reward and the two flags `[batch]`,
/// the observations and the action `[batch, ..shape]`.
fn collate_fields(batch: &Batch, keys: &TmrlKeys) -> Result<TmrlBatch, DataError> {
    let spec = batch.spec().clone();
    let tensor = |key: &Key, scalar: bool| -> Result<Tensor, DataError> {
        let (_, field) = spec
            .field(key)
            .ok_or_else(|| DataError::MissingField { key: key.clone() })?;
        let mut shape = vec![batch.len()];
        if !scalar {
            shape.extend_from_slice(field.shape());
        }
        Ok(Tensor {
            data: to_f32(batch, field)?,
            shape,
        })
    };
    Ok(TmrlBatch {
        prev_obs: tensor(&keys.obs, false)?,
        act: tensor(&keys.act, false)?,
        rew: tensor(&keys.rew, true)?,
        new_obs: tensor(&keys.next_obs, false)?,
        terminated: tensor(&keys.terminated, true)?,
        truncated: tensor(&keys.truncated, true)?,
    })
}

/// A column of any dtype as `f32`s (bools as 0 and 1).
fn to_f32(batch: &Batch, field: &Field) -> Result<Vec<f32>, DataError> {
    fn all<T: crate::dtype::Element + Copy>(
        batch: &Batch,
        key: &Key,
        f: impl Fn(T) -> f32,
    ) -> Result<Vec<f32>, DataError> {
        Ok(batch.column::<T>(key)?.iter().map(|&v| f(v)).collect())
    }
    let key = field.key();
    match field.dtype() {
        DType::F32 => all(batch, key, |v: f32| v),
        DType::F64 => all(batch, key, |v: f64| v as f32),
        DType::F16 => all(batch, key, |v: half::f16| v.to_f32()),
        DType::BF16 => all(batch, key, |v: half::bf16| v.to_f32()),
        DType::Bool => all(batch, key, |v: bool| f32::from(u8::from(v))),
        DType::U8 => all(batch, key, |v: u8| f32::from(v)),
        DType::I8 => all(batch, key, |v: i8| f32::from(v)),
        DType::I16 => all(batch, key, |v: i16| f32::from(v)),
        DType::U16 => all(batch, key, |v: u16| f32::from(v)),
        DType::I32 => all(batch, key, |v: i32| v as f32),
        DType::U32 => all(batch, key, |v: u32| v as f32),
        DType::I64 => all(batch, key, |v: i64| v as f32),
        DType::U64 => all(batch, key, |v: u64| v as f32),
    }
}
