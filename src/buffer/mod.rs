//! [`ReplayBuffer`]: a storage and a sampler wired together and shared by every
//! handle, with the paths every handle takes: extend, sample, reads and rewrites by
//! position. Its choices are made and checked in `builder.rs`.
//!
//! The handles share the buffer's current state (`state.rs`) through its cell: every
//! operation loads it once and works on that one, and a swap (`set_sampler`, ...)
//! replaces it whole. A write that finds its storage retired by a swap redoes itself
//! on the new one ([`ReplayBuffer::retrying`]).
//!
//! Layer: api. The buffer's methods are grouped by topic: this file (build, write,
//! sample, read), `priorities.rs`, `transforms.rs`; checkpoints in `checkpoint/`,
//! swaps in `swap/`, attaching in `attach.rs` (the region itself: `backing/shm.rs`).

use crate::batch::Batch;
use crate::builder::ReplayBufferBuilder;
use crate::core::Attempt;
use crate::core::Written;
use crate::error::persist::PersistError;
use crate::error::{AccessError, DataError, SampleError, SampleFailed};
use crate::learner::Learner;
use crate::policy::{Admit, PolicyEngine};
use crate::rate_limit::{Limiter, RateLimitStats};
use crate::rng::{self, Rng};
use crate::sampler::slice::Slice;
use crate::sampler::SamplerEngine;
use crate::spec::Spec;
use crate::state::{State, StateCell};
use crate::storage::geometry::Geometry;
use crate::storage::layout::Global;
use crate::storage::{Draw, Storage};
use crate::sync::{Backoff, Guard, MutexGuard};
use crate::writer::Writer;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rate-limited sample looks for the rows of an insert the limit counted
/// before it reports the buffer empty, at most (see `limited_sample`; a shorter
/// sample timeout is the limit).
const QUEUE_GRACE: Duration = Duration::from_secs(1);

#[cfg(not(replaybuf_loom))]
mod attach;
mod limits;
mod priorities;
pub use priorities::PriorityMass;
mod transforms;

/// What a buffer's rows take ([`ReplayBuffer::row_bytes`]). Without
/// [`frames`](crate::ReplayBufferBuilder::frames), a slot is the logical row plus a
/// header of a few words; with frames, a stack keeps only its newest frame and a
/// `next_of` field is not stored, so a slot can be many times smaller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowBytes {
    /// One row of the spec: what an extend takes and a sample returns.
    pub logical: usize,
    /// One slot of the storage: its header (stamp, and the words the sampler and
    /// frames keep) and the row as stored.
    pub slot: usize,
    /// A frames buffer's side slots, all shards together: the next values of the
    /// steps that end episodes (0 without frames).
    pub side: usize,
}

/// A replay buffer: many collectors extend it while many learners sample it, with no
/// lock between them.
///
/// Cloning a `ReplayBuffer` is cheap and gives another handle to the same buffer. For
/// heavy use, give each collector thread a [`Writer`] ([`ReplayBuffer::writer`]) and
/// each learner thread a [`Learner`] ([`ReplayBuffer::learner`]).
///
/// ```
/// use replaybuf::{DType, ReplayBuffer, Spec};
///
/// let spec = Spec::builder()
///     .field("obs", DType::F32, [4])
///     .field("reward", DType::F32, [])
///     .build()?;
/// let rb = ReplayBuffer::builder(spec).capacity(1000).seed(7).build()?;
///
/// let mut chunk = rb.batch([10]);
/// chunk.column_mut::<f32>("reward")?.fill(1.0);
/// let written = rb.extend(&chunk)?;
/// assert_eq!(written.to_vec(), (0..10).collect::<Vec<u64>>());
///
/// let batch = rb.sample(4)?;
/// assert_eq!(batch.column::<f32>("reward")?, &[1.0; 4]);
/// assert!(batch.index().iter().all(|&i| i < 10));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ReplayBuffer {
    pub(crate) cell: Arc<StateCell>,
    /// The rate limit's counts, shared by every handle, if the buffer was built with
    /// one (`rate_limit.rs`). Outside the state: a swap carries it over untouched.
    pub(crate) limiter: Option<Arc<Limiter>>,
}

impl ReplayBuffer {
    /// Starts a buffer of rows of `spec`.
    pub fn builder(spec: impl Into<Arc<Spec>>) -> ReplayBufferBuilder {
        ReplayBufferBuilder::new(spec.into())
    }

    /// A buffer whose first state is `inner`.
    pub(crate) fn from_state(state: State) -> ReplayBuffer {
        ReplayBuffer {
            cell: Arc::new(StateCell::new(state)),
            limiter: None,
        }
    }

    /// The buffer's current state, for one operation: no lock, and no reference count
    /// on the fast path. Everything one operation reads must come from one load.
    #[inline]
    pub(crate) fn state(&self) -> Guard<State> {
        self.cell.current()
    }

    /// The spec of every row.
    pub fn spec(&self) -> &Arc<Spec> {
        self.cell.spec()
    }

    /// Rows the storage holds when full.
    pub fn capacity(&self) -> usize {
        self.state().core.storage.geometry().capacity() as usize
    }

    /// Rows stored now.
    pub fn len(&self) -> usize {
        self.state().core.storage.len() as usize
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows written since the buffer was built or last emptied, evicted ones included
    /// (after a swap into a new storage: the rows carried over, and those written
    /// since).
    pub fn write_count(&self) -> u64 {
        self.state().core.storage.write_count()
    }

    /// What is left of the open epoch of a sampler without replacement: the rows (a
    /// slice sampler's: the slices) not yet drawn. `Some(0)` once a sample took the
    /// last of them, and with `drop_last` a count under a batch's, means the epoch
    /// ran out (TorchRL's `sampler.ran_out`): the next sample ends it and starts the
    /// next. `None` for samplers with replacement, or with no epoch open (before the
    /// first sample, after `clear`, or once a sample found the epoch's end).
    ///
    /// ```
    /// use replaybuf::sampler::WithoutReplacement;
    /// use replaybuf::{DType, ReplayBuffer, Spec};
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [4]).build()?;
    /// let rb = ReplayBuffer::builder(spec)
    ///     .capacity(10)
    ///     .sampler(WithoutReplacement::new())
    ///     .build()?;
    /// rb.extend(&rb.batch([10]))?;
    /// assert_eq!(rb.epoch_left(), None);
    /// rb.sample(4)?;
    /// assert_eq!(rb.epoch_left(), Some(6));
    /// rb.sample(4)?;
    /// rb.sample(4)?; // the epoch's last 2 rows
    /// assert_eq!(rb.epoch_left(), Some(0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn epoch_left(&self) -> Option<usize> {
        self.state()
            .core
            .sampler
            .epoch_left()
            .map(|left| left as usize)
    }

    /// Rows a [`Fifo`](crate::sampler::Fifo) sampler has not taken yet (`None` for
    /// other samplers): what the next samples can take without waiting for a
    /// collector. `len` counts the rows taken too, until they are overwritten.
    pub fn queued(&self) -> Option<usize> {
        self.state().core.queued().map(|n| n as usize)
    }

    /// Whether the buffer is a read-only dataset ([`WritePolicy::Immutable`]: what
    /// [`open_dataset`](Self::open_dataset) gives), whose rows no call changes.
    ///
    /// [`WritePolicy::Immutable`]: crate::WritePolicy::Immutable
    pub fn is_read_only(&self) -> bool {
        matches!(self.state().policy, PolicyEngine::Immutable)
    }

    /// Shards of the storage.
    pub fn shards(&self) -> usize {
        self.state().core.storage.shards().len()
    }

    /// Storage dimensions (1 or 2).
    pub fn ndim(&self) -> usize {
        self.state().core.storage.geometry().ndim()
    }

    /// Environments of an ndim-2 storage (1 for ndim 1).
    pub fn envs(&self) -> usize {
        match *self.state().core.storage.geometry() {
            Geometry::Flat { .. } => 1,
            Geometry::Grid { envs, .. } => envs as usize,
        }
    }

    /// The slice sampler's settings, if this buffer samples slices.
    pub fn slice_sampler(&self) -> Option<Slice> {
        self.state().core.sampler.slice().cloned()
    }

    /// The builder's `batch_size`: the rows [`sample_default`](Self::sample_default)
    /// draws, if one was set.
    pub fn batch_size(&self) -> Option<usize> {
        self.state().core.batch_size
    }

    /// The seed of every draw.
    pub fn seed(&self) -> u64 {
        self.state().core.seed
    }

    /// Bytes of address space the storage reserved (pages become resident as written).
    pub fn reserved_bytes(&self) -> usize {
        self.state().core.storage.reserved_bytes()
    }

    /// What a row takes: as extends take it and samples return it, and as the
    /// storage keeps it.
    pub fn row_bytes(&self) -> RowBytes {
        let storage = &self.state().core.storage;
        RowBytes {
            logical: self.spec().row_bytes(),
            slot: storage.slot_bytes(),
            side: storage.side_bytes(),
        }
    }

    /// A zeroed batch of this buffer's spec with batch shape `shape`.
    pub fn batch(&self, shape: impl AsRef<[usize]>) -> Batch {
        Batch::zeros(self.spec().clone(), shape)
    }

    /// A collector's handle. Handle `k` writes shard `k % shards`, so with as many
    /// shards as collectors no two collectors share a cursor. For ndim 2, a handle owns
    /// its shard's environments and extends them with `[t, group]` batches.
    ///
    /// After a swap to fewer shards ([`set_storage`](Self::set_storage)) a handle bound
    /// to shard `k` writes shard `k % shards`; its rows carried over went there too.
    ///
    /// In a [`shared`](crate::ReplayBufferBuilder::shared) buffer, a handle writes a
    /// shard whose lease this process holds: a free one if there is any, else one
    /// another handle of this process writes.
    ///
    /// # Panics
    ///
    /// In a shared buffer whose every shard is leased to another live process (after
    /// waiting half a second for one to come free: a process that met a dead writer's
    /// row holds that writer's lease while it repairs the shard); use
    /// [`try_writer`](Self::try_writer) to get that as an error.
    pub fn writer(&self) -> Writer {
        self.try_writer()
            .unwrap_or_else(|e| panic!("replaybuf: no writer handle: {e}"))
    }

    /// A collector's handle, as [`writer`](Self::writer) gives, or
    /// [`DataError::NoFreeShard`] in a shared buffer whose every shard is leased to
    /// another live process (after the same half-second wait).
    pub fn try_writer(&self) -> Result<Writer, DataError> {
        self.retrying(|inner| {
            let storage = &inner.core.storage;
            // Numbered as `Storage::take_count` says: never a number a swap's copy
            // hands out again (two writers on one shard).
            let k = storage.take_count(Global::Writers)?;
            let shards = storage.shards().len();
            let shard = match storage.lease_for_writer(k as usize) {
                Some(leased) => leased.map_err(|_| DataError::NoFreeShard { shards })?,
                None => (k % shards as u64) as usize,
            };
            Ok(Writer::new(self.clone(), shard))
        })
    }

    /// A learner's handle, with its own random stream.
    pub fn learner(&self) -> Learner {
        let Ok(learner) = self.retrying(|inner| {
            let k = inner.core.storage.take_count(Global::Learners)?;
            let rng = rng::stream(inner.core.seed, rng::Stream::Learner(k));
            Ok::<_, Attempt<std::convert::Infallible>>(Learner::new(self.clone(), Some(rng)))
        });
        learner
    }

    /// A learner's handle that draws as [`ReplayBuffer::sample`] does, from a stream
    /// of the buffer's own for each call, and keeps only its working room: for a
    /// binding that pools handles, so that every draw's randomness lives in the
    /// buffer, which a checkpoint saves (a loaded copy draws what the saved buffer
    /// would have) and which no handle dropped or made changes.
    pub fn learner_on_calls(&self) -> Learner {
        Learner::new(self.clone(), None)
    }

    /// Adds one transition (a batch of shape `[1]`) and returns its index.
    /// ndim-1 storages only; extend an ndim-2 storage with whole steps.
    pub fn add(&self, row: &Batch) -> Result<u64, DataError> {
        self.limited_insert(
            row.len(),
            |inner| inner.precheck(None, row, true),
            || self.extend_rows(row, true),
        )
        .map(|w| w.index(0))
    }

    /// Appends a batch and returns where its rows went.
    ///
    /// ndim 1: a batch of shape `[n]` goes to one shard (round robin across calls;
    /// always shard 0 with a slice sampler, so that one caller's trajectories stay in
    /// one ring: give each further collector its own [`Writer`]).
    /// ndim 2: a batch of `t` steps of every environment (`[t, envs]`, or `[envs, t]`
    /// with `dim_extend = 1`) appends `t` steps to every environment's column.
    pub fn extend(&self, batch: &Batch) -> Result<Written, DataError> {
        self.limited_insert(
            batch.len(),
            |inner| inner.precheck(None, batch, false),
            || self.extend_rows(batch, false),
        )
    }

    /// Validates first, then takes the round-robin turn: a rejected batch changes
    /// nothing, not even which shard the next extend goes to.
    pub(crate) fn extend_rows(&self, batch: &Batch, one_row: bool) -> Result<Written, DataError> {
        self.retrying(|inner| {
            if one_row {
                inner.core.check_one_row(batch)?;
            }
            let batch = match inner.admit(None, batch)? {
                Admit::Append(batch) => batch,
                Admit::Placed(written) => return Ok(written),
            };
            let rows = inner.core.prepare(None, &batch)?;
            let shard = match inner.core.storage.geometry() {
                Geometry::Flat { .. } => Some(inner.core.pick_shard()?),
                Geometry::Grid { .. } => None,
            };
            Ok(inner.core.append(shard, &rows)?)
        })
    }

    /// Samples `n` rows into a new batch, with their `index` and `generations`.
    pub fn sample(&self, n: usize) -> Result<Batch, SampleError> {
        let mut batch = self.batch([0]);
        self.state().core.room_for_sample(n, &mut batch)?;
        self.limited_sample(n, || {
            let (inner, mut rng) = self.call_stream();
            inner.core.sample_into(&mut rng, n, &mut batch)?;
            inner.transforms.apply_drawn(&mut batch)
        })?;
        Ok(batch)
    }

    /// Samples the builder's `batch_size` rows into a new batch.
    pub fn sample_default(&self) -> Result<Batch, SampleError> {
        self.sample(
            self.state()
                .core
                .batch_size
                .ok_or(SampleError::NoBatchSize)?,
        )
    }

    /// Samples into `batch`, reusing its buffers: once `batch` has held a batch of this
    /// size, no allocation happens. Draws the builder's `batch_size` rows, or as many
    /// as `batch` holds when none was set.
    pub fn sample_into(&self, batch: &mut Batch) -> Result<(), SampleError> {
        let n = {
            let core = &self.state().core;
            let n = core.batch_size_for(batch)?;
            core.room_for_sample(n, batch)?;
            n
        };
        self.limited_sample(n, || {
            let (inner, mut rng) = self.call_stream();
            inner.core.sample_into(&mut rng, n, batch)?;
            inner.transforms.apply_drawn(batch)
        })
        .map(drop)
    }

    /// The row at storage `index`, as a batch of one.
    pub fn get(&self, index: u64) -> Result<Batch, AccessError> {
        self.get_many(&[index])
    }

    /// The rows at `indices`, in that order.
    pub fn get_many(&self, indices: &[u64]) -> Result<Batch, AccessError> {
        let inner = self.state();
        let storage = &inner.core.storage;
        let mut draws = Vec::with_capacity(indices.len());
        for &index in indices {
            let capacity = storage.geometry().capacity();
            if index >= capacity {
                return Err(AccessError::OutOfRange { index, capacity });
            }
            draws.push(
                storage
                    .draw_at(index)
                    .ok_or(AccessError::NotWritten { index })?,
            );
        }
        Ok(inner.core.read_positions(&draws))
    }

    /// The write generation of the row at each of `indices` now, as
    /// [`get_many`](Self::get_many) gives them, from the rows' stamps alone (no row is
    /// copied): what a priority update of whatever rows are at `indices` now passes
    /// (TorchRL's update by index alone). A row being written gives its new
    /// generation, which an update then counts as stale. Errors as `get_many`.
    pub fn generations_at(&self, indices: &[u64]) -> Result<Vec<u64>, AccessError> {
        let inner = self.state();
        let storage = &inner.core.storage;
        let capacity = storage.geometry().capacity();
        indices
            .iter()
            .map(|&index| {
                if index >= capacity {
                    return Err(AccessError::OutOfRange { index, capacity });
                }
                let draw = storage
                    .draw_at(index)
                    .ok_or(AccessError::NotWritten { index })?;
                Ok(storage.generation_at(draw))
            })
            .collect()
    }

    /// The storage positions among the first `end` (all of them when `None`) that
    /// hold a row, in storage order: the indices
    /// [`read_all_in_order`](Self::read_all_in_order) gives, without reading the rows.
    /// They are `0..len()` until a buffer of one shard is emptied, not where a buffer
    /// of several shards holds rows in some shards only.
    pub fn stored_positions(&self, end: Option<usize>) -> Vec<u64> {
        let inner = self.state();
        stored_below(&inner.core.storage, end)
            .map(|(i, _)| i)
            .collect()
    }

    /// The storage position of the `k`-th row back from the last stored one (0: the
    /// last): `stored_positions(None)[len - 1 - k]`, found from the end without the
    /// list. `None` when fewer than `k + 1` positions hold a row.
    pub fn stored_position_from_end(&self, k: usize) -> Option<u64> {
        let inner = self.state();
        let storage = &inner.core.storage;
        (0..storage.geometry().capacity())
            .rev()
            .filter(|&i| storage.draw_at(i).is_some())
            .nth(k)
    }

    /// Every stored row among the first `end` storage positions (all of them when
    /// `None`), in storage order, with their indices (TorchRL's `rb[:end]`).
    pub fn read_all_in_order(&self, end: Option<usize>) -> Batch {
        let inner = self.state();
        let draws: Vec<Draw> = stored_below(&inner.core.storage, end)
            .map(|(_, d)| d)
            .collect();
        inner.core.read_positions(&draws)
    }

    /// Overwrites storage positions `0..end` in place with the first `end` rows of
    /// `data` (all of them when `None`), in storage order (TorchRL's `rb[:end] = data`).
    /// Every position must hold a row; on any error nothing is written. A slice
    /// buffer's rows keep their trajectories: a rewrite that changes a row's
    /// trajectory id, or its end or truncation flag, is refused
    /// ([`AccessError::TrajectoryRewrite`]); a buffer with frames rewrites nothing.
    pub fn write_all(&self, data: &Batch, end: Option<usize>) -> Result<(), AccessError> {
        self.retrying(|inner| inner.write_all(data, end))
    }

    /// Overwrites storage position `indices[r]` in place with row `r` of `data`
    /// (TorchRL's `rb[indices] = data`), in order: a position named twice ends with
    /// its last row. `data` has one row for each index; every position must hold a
    /// row; on any error nothing is written. As with [`ReplayBuffer::write_all`], a
    /// slice buffer's rows keep their trajectories and a buffer with frames rewrites
    /// nothing.
    pub fn write_at(&self, indices: &[u64], data: &Batch) -> Result<(), AccessError> {
        if data.len() != indices.len() {
            return Err(DataError::BatchShape {
                expected: "one row for each index",
                found: data.shape().to_vec(),
            }
            .into());
        }
        self.retrying(|inner| inner.write_at(indices, data))
    }

    /// Writes a file-backed storage's changes through to its file and the disk
    /// (`msync` and `fsync`); nothing for other storages. A file-backed buffer's rows
    /// outlive its process without this; it guards against the machine going down.
    pub fn flush(&self) -> Result<(), PersistError> {
        self.state().core.storage.flush()
    }

    /// Drops every stored row, and ends the sampler's epoch (TorchRL resets its
    /// sampler too). Rows being written meanwhile are dropped as well. A rate limit's
    /// counts start over: samples wait for its `min_size_to_sample` rows again
    /// (Reverb's table reset resets its limiter; the sample after a clear found the
    /// buffer empty instead).
    ///
    /// A read-only buffer (an [`Immutable`](crate::WritePolicy::Immutable) writer)
    /// refuses, with [`DataError::Immutable`], as TorchRL's immutable writer does.
    pub fn clear(&self) -> Result<(), DataError> {
        self.retrying(|inner| {
            // Judged on the state the rows are dropped from: a swap to another
            // policy meanwhile retires it, and the clear is judged again.
            if matches!(inner.policy, PolicyEngine::Immutable) {
                return Err(Attempt::Failed(DataError::Immutable));
            }
            // The policy's lock first, then the updaters' gate: a swap takes them in
            // that order too (and a save: a save hook's clear is refused before the
            // lock it holds).
            inner.core.storage.refuse_reentry();
            inner.policy.emptying(|| {
                let _inside = inner.core.storage.enter_update()?;
                inner.core.storage.empty();
                inner.core.sampler.reset();
                inner.core.clear_emptied();
                Ok(())
            })
        })?;
        if let Some(limiter) = &self.limiter {
            limiter.restart(0);
        }
        Ok(())
    }
}

/// The positions among the first `end` of `storage` (all of them when `None`) that
/// hold a row, in storage order, each with its draw.
fn stored_below(storage: &Storage, end: Option<usize>) -> impl Iterator<Item = (u64, Draw)> + '_ {
    let capacity = storage.geometry().capacity();
    let end = end.map_or(capacity, |e| (e as u64).min(capacity));
    (0..end).filter_map(|i| storage.draw_at(i).map(|d| (i, d)))
}

/// Running an operation against the current state, and through the rate limit.
impl ReplayBuffer {
    /// Runs `insert`, of `rows` rows, through the rate limit if there is one: `check`s
    /// the rows against the current state first (a batch `insert` would refuse must
    /// not wait for its turn), waits for its turn, counts the rows, and takes back
    /// those it did not store (all of them if it failed; those a write policy
    /// rejected).
    #[inline]
    pub(crate) fn limited_insert<T: Stored>(
        &self,
        rows: usize,
        check: impl FnOnce(&State) -> Result<(), DataError>,
        insert: impl FnOnce() -> Result<T, DataError>,
    ) -> Result<T, DataError> {
        // A call of no rows changes no count: nothing to wait for (it waited out the
        // insert timeout, or for good without one, on a full queue).
        let Some(limiter) = self.limiter.as_ref().filter(|_| rows > 0) else {
            return insert();
        };
        check(&self.state())?;
        let counted = limiter.insert(rows as u64)?;
        // A panic inside (a user's inverse transform, run before anything is
        // written) gives the rows back as it unwinds: they were counted for good.
        let refund = OnUnwind(Some(|| {
            if counted {
                limiter.refund_inserts(rows as u64);
            }
        }));
        let out = insert();
        refund.disarm();
        if counted {
            let stored = out.as_ref().map_or(0, Stored::stored);
            limiter.refund_inserts(rows.saturating_sub(stored) as u64);
        }
        out
    }

    /// Runs `sample`, of `rows` rows, through the rate limit if there is one: waits
    /// for its turn, counts the rows, and takes back those it did not draw (`sample`
    /// returns how many it did, or failing, how many it drew first).
    ///
    /// A buffer the limit lets a sample into may still find no row to take: the
    /// insert the limit counted has not claimed its rows yet (a FIFO queue's, or a
    /// learner's first rows past the min size: a uniform sample said "the buffer is
    /// empty" once in a CI run). Its writer is about to, so the sample looks again,
    /// for up to [`QUEUE_GRACE`], before it reports the buffer empty.
    #[inline]
    pub(crate) fn limited_sample(
        &self,
        rows: usize,
        mut sample: impl FnMut() -> Result<usize, SampleFailed>,
    ) -> Result<usize, SampleError> {
        let Some(limiter) = self.limiter.as_ref().filter(|_| rows > 0) else {
            return sample().map_err(|f| f.error);
        };
        let mut grace: Option<(Instant, Backoff)> = None;
        loop {
            let counted = limiter.sample(rows as u64)?;
            let out = sample();
            let drawn = match &out {
                Ok(n) => *n,
                Err(f) => f.drawn,
            };
            let out = out.map_err(|f| f.error);
            if !counted {
                return out;
            }
            limiter.refund_samples(rows.saturating_sub(drawn) as u64);
            if !matches!(out, Err(SampleError::Empty)) {
                return out;
            }
            // Empty, with inserts counted: their rows are on their way. A FIFO
            // buffer's rows are taken as they are drawn, so it waits only for rows
            // counted in and not drawn yet (one its learners emptied says so at
            // once). Looked for no longer than the sample's own timeout.
            let fifo = matches!(self.state().core.sampler, SamplerEngine::Fifo);
            let in_flight = |s: &RateLimitStats| {
                if fifo {
                    s.inserts > s.samples
                } else {
                    s.inserts > 0
                }
            };
            let Some(stats) = limiter.stats().filter(in_flight) else {
                return out;
            };
            let wait = stats
                .limit
                .timeouts()
                .1
                .map_or(QUEUE_GRACE, |t| t.min(QUEUE_GRACE));
            let (since, backoff) = grace.get_or_insert_with(|| (Instant::now(), Backoff::new()));
            if since.elapsed() >= wait {
                return out;
            }
            backoff.snooze();
        }
    }

    /// Runs `op` on the current state until it is not refused as
    /// [`Retired`](crate::storage::freeze::Retired): a write that raced a swap and
    /// found its storage retired is redone, whole, on the state the swap published.
    /// It wrote nothing the first time.
    #[inline]
    pub(crate) fn retrying<T, E>(
        &self,
        mut op: impl FnMut(&State) -> Result<T, Attempt<E>>,
    ) -> Result<T, E> {
        loop {
            match op(&self.state()) {
                Ok(v) => return Ok(v),
                Err(Attempt::Failed(e)) => return Err(e),
                Err(Attempt::Retired) => continue,
            }
        }
    }

    /// The state now, and the random stream of a sample call made through the buffer
    /// itself, numbered inside that state's storage (`Core::call_rng`).
    pub(crate) fn call_stream(&self) -> (Guard<State>, Rng) {
        loop {
            let inner = self.state();
            if let Ok(rng) = inner.core.call_rng() {
                return (inner, rng);
            }
        }
    }

    /// Holds the reconfiguration lock: no swap runs until the guard drops.
    pub(crate) fn reconfiguring(&self) -> MutexGuard<'_, ()> {
        self.cell.reconfigure.lock()
    }
}

/// What an insert stored, for the rate limit's count.
pub(crate) trait Stored {
    /// Rows stored.
    fn stored(&self) -> usize;
}

impl Stored for Written {
    fn stored(&self) -> usize {
        self.accepted()
    }
}

/// A one-row insert's index: `u64::MAX` when a write policy rejected the row.
impl Stored for u64 {
    fn stored(&self) -> usize {
        usize::from(*self != u64::MAX)
    }
}

/// Runs its closure if dropped armed: as a panic unwinds past it.
struct OnUnwind<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnUnwind<F> {
    /// The code it guards returned: nothing to run.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnUnwind<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}
