//! [`ReplayBuffer`]: a storage and a sampler wired together and shared by every
//! handle, with the paths every handle takes: extend, sample, reads and rewrites by
//! position. Its choices are made and checked in `builder.rs`.
//!
//! The handles share the buffer's current [`Inner`] through `swap/mod.rs`: every
//! operation loads it once and works on that one, and a swap (`set_sampler`, ...)
//! replaces it whole. A write that finds its storage retired by a swap redoes itself
//! on the new one ([`ReplayBuffer::retrying`]).

use std::path::PathBuf;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::batch::{Batch, Column, Scratch};
use crate::builder::ReplayBufferBuilder;
use crate::checkpoint::hooks::Hooks;
use crate::config::Config;
use crate::error::persist::PersistError;
use crate::error::{AccessError, DataError, SampleError};
use crate::learner::Learner;
use crate::policy::{Admit, Policy};
use crate::rng::{self, Rng};
use crate::sampler::prioritized::{self, Masses};
use crate::sampler::slice::Slice;
use crate::sampler::{read_draws, uniform_redraw, Engine, OnMiss};
use crate::spec::Spec;
use crate::storage::freeze::Retired;
use crate::storage::geometry::Geometry;
use crate::storage::layout::Global;
use crate::storage::plan::{Dest, DstCol, RowOrder, Source, SrcCol};
use crate::storage::shard::Shard;
use crate::storage::stamp::Claim;
use crate::storage::{Draw, Miss, Storage, Want, SAMPLE_AHEAD_DRAWS};
use crate::sumtree::tree::Tree;
use crate::swap::{Attempt, Shared};
use crate::sync::{Guard, Ordering};
use crate::transform::Transforms;
use crate::writer::{Writer, Written};

/// A buffer's state: what a swap replaces whole (see `swap/mod.rs`). Every handle
/// reaches the current one through [`ReplayBuffer::inner`].
#[derive(Debug)]
pub(crate) struct Inner {
    /// What the buffer was built with (its seed resolved): for checkpoints.
    pub(crate) config: Config,
    /// The directory of a file-backed storage.
    pub(crate) memmap: Option<PathBuf>,
    /// Save and load hooks of checkpoints, shared by every state of the buffer.
    pub(crate) hooks: Arc<Hooks>,
    pub(crate) storage: Storage,
    pub(crate) sampler: Engine,
    pub(crate) seed: u64,
    pub(crate) batch_size: Option<usize>,
    dim_extend: usize,
    /// The spec field holding priorities (`priority_key`), by position.
    pub(crate) priority_field: Option<usize>,
    /// The write policy and its state: every write passes its gate (`policy.rs`).
    pub(crate) policy: Policy,
    /// Closures on sampled batches, and their inverses on written data, shared by
    /// every state of the buffer.
    pub(crate) transforms: Arc<Transforms>,
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
    pub(crate) shared: Arc<Shared>,
}

impl ReplayBuffer {
    /// Starts a buffer of rows of `spec`.
    pub fn builder(spec: impl Into<Arc<Spec>>) -> ReplayBufferBuilder {
        ReplayBufferBuilder::new(spec.into())
    }

    /// A buffer whose first state is `inner`.
    pub(crate) fn from_inner(inner: Inner) -> ReplayBuffer {
        ReplayBuffer {
            shared: Arc::new(Shared::new(inner)),
        }
    }

    /// The buffer's current state, for one operation: no lock, and no reference count
    /// on the fast path. Everything one operation reads must come from one load.
    #[inline]
    pub(crate) fn inner(&self) -> Guard<Inner> {
        self.shared.current()
    }

    /// The spec of every row.
    pub fn spec(&self) -> &Arc<Spec> {
        self.shared.spec()
    }

    /// Rows the storage holds when full.
    pub fn capacity(&self) -> usize {
        self.inner().storage.geometry().capacity() as usize
    }

    /// Rows stored now.
    pub fn len(&self) -> usize {
        self.inner().storage.len() as usize
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows written since the buffer was built or last emptied, evicted ones included
    /// (after a swap into a new storage: the rows carried over, and those written
    /// since).
    pub fn write_count(&self) -> u64 {
        self.inner().storage.write_count()
    }

    /// Shards of the storage.
    pub fn shards(&self) -> usize {
        self.inner().storage.shards().len()
    }

    /// Storage dimensions (1 or 2).
    pub fn ndim(&self) -> usize {
        self.inner().storage.geometry().ndim()
    }

    /// Environments of an ndim-2 storage (1 for ndim 1).
    pub fn envs(&self) -> usize {
        match *self.inner().storage.geometry() {
            Geometry::Flat { .. } => 1,
            Geometry::Grid { envs, .. } => envs as usize,
        }
    }

    /// The slice sampler's settings, if this buffer samples slices.
    pub fn slice_sampler(&self) -> Option<Slice> {
        self.inner().sampler.slice().cloned()
    }

    /// The seed of every draw.
    pub fn seed(&self) -> u64 {
        self.inner().seed
    }

    /// Bytes of address space the storage reserved (pages become resident as written).
    pub fn reserved_bytes(&self) -> usize {
        self.inner().storage.reserved_bytes()
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
    /// In a shared buffer whose every shard is leased to another live process; use
    /// [`try_writer`](Self::try_writer) to get that as an error.
    pub fn writer(&self) -> Writer {
        self.try_writer()
            .unwrap_or_else(|e| panic!("replaybuf: no writer handle: {e}"))
    }

    /// A collector's handle, as [`writer`](Self::writer) gives, or
    /// [`DataError::NoFreeShard`] in a shared buffer whose every shard is leased to
    /// another live process.
    pub fn try_writer(&self) -> Result<Writer, DataError> {
        let inner = self.inner();
        let storage = &inner.storage;
        let k = storage
            .global(Global::Writers)
            .fetch_add(1, Ordering::Relaxed);
        let shards = storage.shards().len();
        let shard = match storage.lease_for_writer(k as usize) {
            Some(leased) => leased.map_err(|_| DataError::NoFreeShard { shards })?,
            None => (k % shards as u64) as usize,
        };
        Ok(Writer::new(self.clone(), shard))
    }

    /// A learner's handle, with its own random stream.
    pub fn learner(&self) -> Learner {
        let inner = self.inner();
        let k = inner
            .storage
            .global(Global::Learners)
            .fetch_add(1, Ordering::Relaxed);
        Learner::new(
            self.clone(),
            rng::stream(inner.seed, rng::Stream::Learner(k)),
        )
    }

    /// Adds one transition (a batch of shape `[1]`) and returns its index.
    /// ndim-1 storages only; extend an ndim-2 storage with whole steps.
    pub fn add(&self, row: &Batch) -> Result<u64, DataError> {
        self.extend_rows(row, true).map(|w| w.index(0))
    }

    /// Appends a batch and returns where its rows went.
    ///
    /// ndim 1: a batch of shape `[n]` goes to one shard (round robin across calls;
    /// always shard 0 with a slice sampler, so that one caller's trajectories stay in
    /// one ring: give each further collector its own [`Writer`]).
    /// ndim 2: a batch of `t` steps of every environment (`[t, envs]`, or `[envs, t]`
    /// with `dim_extend = 1`) appends `t` steps to every environment's column.
    pub fn extend(&self, batch: &Batch) -> Result<Written, DataError> {
        self.extend_rows(batch, false)
    }

    /// Validates first, then takes the round-robin turn: a rejected batch changes
    /// nothing, not even which shard the next extend goes to.
    fn extend_rows(&self, batch: &Batch, one_row: bool) -> Result<Written, DataError> {
        self.retrying(|inner| {
            if one_row {
                inner.check_one_row(batch)?;
            }
            let batch = match inner.admit(None, batch)? {
                Admit::Append(batch) => batch,
                Admit::Placed(written) => return Ok(written),
            };
            let rows = inner.prepare(None, &batch)?;
            let shard = match inner.storage.geometry() {
                Geometry::Flat { .. } => Some(inner.pick_shard()?),
                Geometry::Grid { .. } => None,
            };
            Ok(inner.append(shard, &rows)?)
        })
    }

    /// Samples `n` rows into a new batch, with their `index` and `generations`.
    pub fn sample(&self, n: usize) -> Result<Batch, SampleError> {
        let mut batch = self.batch([0]);
        let inner = self.inner();
        inner.sample_into(&mut inner.call_rng(), n, &mut batch)?;
        inner.transforms.apply(&mut batch)?;
        Ok(batch)
    }

    /// Samples the builder's `batch_size` rows into a new batch.
    pub fn sample_default(&self) -> Result<Batch, SampleError> {
        self.sample(self.inner().batch_size.ok_or(SampleError::NoBatchSize)?)
    }

    /// Samples into `batch`, reusing its buffers: once `batch` has held a batch of this
    /// size, no allocation happens. Draws the builder's `batch_size` rows, or as many
    /// as `batch` holds when none was set.
    pub fn sample_into(&self, batch: &mut Batch) -> Result<(), SampleError> {
        let inner = self.inner();
        let n = inner.batch_size_for(batch)?;
        inner.sample_into(&mut inner.call_rng(), n, batch)?;
        inner.transforms.apply(batch)
    }

    /// The row at storage `index`, as a batch of one.
    pub fn get(&self, index: u64) -> Result<Batch, AccessError> {
        self.get_many(&[index])
    }

    /// The rows at `indices`, in that order.
    pub fn get_many(&self, indices: &[u64]) -> Result<Batch, AccessError> {
        let inner = self.inner();
        let storage = &inner.storage;
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
        Ok(inner.read_positions(&draws))
    }

    /// Every stored row among the first `end` storage positions (all of them when
    /// `None`), in storage order, with their indices (TorchRL's `rb[:end]`).
    pub fn read_all_in_order(&self, end: Option<usize>) -> Batch {
        let inner = self.inner();
        let storage = &inner.storage;
        let end = end.map_or(storage.geometry().capacity(), |e| {
            (e as u64).min(storage.geometry().capacity())
        });
        let draws: Vec<Draw> = (0..end).filter_map(|i| storage.draw_at(i)).collect();
        inner.read_positions(&draws)
    }

    /// Overwrites storage positions `0..end` in place with the first `end` rows of
    /// `data` (all of them when `None`), in storage order (TorchRL's `rb[:end] = data`).
    /// Every position must hold a row; on any error nothing is written.
    pub fn write_all(&self, data: &Batch, end: Option<usize>) -> Result<(), AccessError> {
        self.retrying(|inner| inner.write_all(data, end))
    }

    /// Writes a file-backed storage's changes through to its file and the disk
    /// (`msync` and `fsync`); nothing for other storages. A file-backed buffer's rows
    /// outlive its process without this; it guards against the machine going down.
    pub fn flush(&self) -> Result<(), PersistError> {
        self.inner().storage.flush()
    }

    /// Drops every stored row, and ends the sampler's epoch (TorchRL resets its
    /// sampler too). Rows being written meanwhile are dropped as well.
    pub fn empty(&self) {
        self.retrying::<_, std::convert::Infallible>(|inner| {
            // The policy's lock first, then the updaters' gate: a swap takes them in
            // that order too.
            inner.policy.emptying(|| {
                let _inside = inner.storage.enter_update()?;
                inner.storage.empty();
                inner.sampler.reset();
                inner.clear_emptied();
                Ok(())
            })
        })
        .unwrap_or_else(|never| match never {});
    }
}

impl Inner {
    pub(crate) fn new(
        config: Config,
        storage: Storage,
        sampler: Engine,
        seed: u64,
        batch_size: Option<usize>,
        dim_extend: usize,
        priority_field: Option<usize>,
    ) -> Inner {
        Inner {
            config,
            memmap: None,
            hooks: Arc::default(),
            priority_field,
            storage,
            sampler,
            seed,
            batch_size,
            dim_extend,
            policy: Policy::RoundRobin,
            transforms: Arc::default(),
        }
    }

    /// The shard of the next buffer-level extend: round robin across calls.
    pub(crate) fn pick_shard(&self) -> Result<usize, DataError> {
        if let Some(leased) = self.storage.process_lease() {
            return leased.map_err(|_| DataError::NoFreeShard {
                shards: self.storage.shards().len(),
            });
        }
        let s = self.storage.shards().len() as u64;
        Ok(if s == 1 || self.sampler.slice().is_some() {
            0
        } else {
            (self
                .storage
                .global(Global::NextShard)
                .fetch_add(1, Ordering::Relaxed)
                % s) as usize
        })
    }

    /// The random stream of the next sample call made through the buffer itself.
    pub(crate) fn call_rng(&self) -> Rng {
        let call = self
            .storage
            .global(Global::Calls)
            .fetch_add(1, Ordering::Relaxed);
        rng::stream(self.seed, rng::Stream::Call(call))
    }

    pub(crate) fn batch_size_for(&self, batch: &Batch) -> Result<usize, SampleError> {
        match (self.batch_size, batch.len()) {
            (Some(n), _) => Ok(n),
            (None, 0) => Err(SampleError::NoBatchSize),
            (None, n) => Ok(n),
        }
    }

    /// The copy plan of `batch`'s columns for this storage's rows, or `None` if the
    /// batch has another spec.
    pub(crate) fn source<'a>(
        &self,
        batch: &'a Batch,
        order: RowOrder,
    ) -> Result<Source<'a>, DataError> {
        let spec = self.storage.spec();
        let map = batch.columns_for(spec)?;
        let cols = spec
            .fields()
            .iter()
            .zip(&map)
            .map(|(f, &i)| SrcCol {
                data: batch.columns()[i].as_bytes(),
                bytes: f.bytes(),
                offset: f.offset(),
            })
            .collect();
        Ok(Source { cols, order })
    }

    fn check_one_row(&self, row: &Batch) -> Result<(), DataError> {
        if self.storage.geometry().ndim() != 1 || row.len() != 1 {
            return Err(DataError::BatchShape {
                expected: "one row ([1]) on an ndim-1 storage",
                found: row.shape().to_vec(),
            });
        }
        Ok(())
    }

    pub(crate) fn add(&self, shard: usize, row: &Batch) -> Result<u64, Attempt<DataError>> {
        self.check_one_row(row)?;
        Ok(self.extend(Some(shard), row)?.index(0))
    }

    pub(crate) fn order_for(&self, t: u64, envs: u64) -> RowOrder {
        if self.dim_extend == 0 {
            RowOrder::TimeMajor { envs, env0: 0 }
        } else {
            RowOrder::EnvMajor { steps: t, env0: 0 }
        }
    }

    /// Checks the batch shape against the storage and returns (steps, envs on the
    /// batch's env axis, row order).
    fn extent(&self, shard: Option<usize>, batch: &Batch) -> Result<(u64, RowOrder), DataError> {
        let shape = batch.shape();
        match (*self.storage.geometry(), shard) {
            (Geometry::Flat { .. }, _) => match shape {
                [n] => Ok((*n as u64, RowOrder::Flat)),
                _ => Err(DataError::BatchShape {
                    expected: "[n] for an ndim-1 storage",
                    found: shape.to_vec(),
                }),
            },
            (Geometry::Grid { envs, .. }, group) => {
                let want = match group {
                    Some(k) => self.storage.shards()[k].ring().width,
                    None => envs,
                };
                let (expected, dims) = match self.dim_extend {
                    0 => (
                        "[t, envs] (dim_extend 0), envs of the storage or the writer's group",
                        [1, 0],
                    ),
                    _ => (
                        "[envs, t] (dim_extend 1), envs of the storage or the writer's group",
                        [0, 1],
                    ),
                };
                match shape {
                    [a, b] if [*a, *b][dims[0]] as u64 == want => {
                        let t = [*a, *b][dims[1]] as u64;
                        Ok((t, self.order_for(t, want)))
                    }
                    _ => Err(DataError::BatchShape {
                        expected,
                        found: shape.to_vec(),
                    }),
                }
            }
        }
    }

    /// Appends `batch` to shard `shard` (ndim 1, or one env group of ndim 2), or to
    /// every shard (`None`, ndim 2 only).
    pub(crate) fn extend(
        &self,
        shard: Option<usize>,
        batch: &Batch,
    ) -> Result<Written, Attempt<DataError>> {
        let batch = match self.admit(shard, batch)? {
            Admit::Append(batch) => batch,
            Admit::Placed(written) => return Ok(written),
        };
        let rows = self.prepare(shard, &batch)?;
        if shard.is_none() {
            // Every shard is written: in a shared region, only by its lease holder, so
            // that a dead process's damage is its lease's (`shared/procs.rs`).
            self.storage
                .lease_all()
                .map_err(|shard| DataError::ShardLeased { shard })?;
        }
        Ok(self.append(shard, &rows)?)
    }

    /// Checks `batch` for an extend of `shard` (or of the whole buffer) and returns what
    /// `append` needs: its steps, copy plan, and the priorities of its priority field.
    pub(crate) fn prepare<'a>(
        &self,
        shard: Option<usize>,
        batch: &'a Batch,
    ) -> Result<Prepared<'a>, DataError> {
        let (steps, order) = self.extent(shard, batch)?;
        Ok(Prepared {
            steps,
            src: self.source(batch, order)?,
            priorities: self.batch_priorities(batch)?,
        })
    }

    /// Appends validated rows. `shard: None` writes every env group of an ndim-2 storage.
    /// Refused, with nothing written, if a swap retired the storage.
    pub(crate) fn append(
        &self,
        shard: Option<usize>,
        rows: &Prepared<'_>,
    ) -> Result<Written, Retired> {
        let storage = &self.storage;
        let (steps, src) = (rows.steps, &rows.src);
        let mut written = Written::new(steps, src.order);
        let priorities = rows.priorities.as_deref();
        match shard {
            Some(k) => {
                let claim = storage.enter_append(k)?;
                let first = self.append_shard(k, claim, steps, src, priorities);
                written.push(*storage.shards()[k].ring(), first, 0);
            }
            None => {
                // Every shard is entered before any is written, so that a swap finds
                // the whole extend in the storage it copies, or none of it.
                let claims = storage.enter_append_all()?;
                for ((k, shard), claim) in storage.shards().iter().enumerate().zip(claims) {
                    let ring = *shard.ring();
                    let group = src.for_group(ring.index_offset);
                    let first = self.append_shard(k, claim, steps, &group, priorities);
                    written.push(ring, first, ring.index_offset);
                }
            }
        }
        Ok(written)
    }

    /// Appends to shard `k`, entered with `claim`; for a prioritized buffer, records
    /// the rows' raw priorities once they are claimed and gives them their leaves once
    /// they are published (see `priority.rs`).
    fn append_shard(
        &self,
        k: usize,
        claim: Claim,
        steps: u64,
        src: &Source<'_>,
        priorities: Option<&[f64]>,
    ) -> u64 {
        let Some(raws) = self.new_raws(priorities) else {
            return self.storage.append_entered(k, claim, steps, src, None);
        };
        let first = self
            .storage
            .append_entered(k, claim, steps, src, Some(raws));
        self.set_leaves(k, first, steps, src, raws);
        first
    }

    pub(crate) fn sample_into(
        &self,
        rng: &mut Rng,
        n: usize,
        batch: &mut Batch,
    ) -> Result<(), SampleError> {
        if let Some(slice) = self.sampler.slice_state() {
            return self.sample_slices(slice, rng, n, batch);
        }
        // The batch may list the same fields in another order: pair them by key.
        let map = batch
            .columns_for(self.storage.spec())
            .map_err(|_| SampleError::SpecMismatch)?;
        let mut scratch = std::mem::take(batch.scratch_mut());
        let result = self.draw(rng, n, &mut scratch).and_then(|()| {
            let weighted = self.sampler.prioritized().is_some();
            batch.reshape_for_sample(scratch.draws.len(), weighted);
            let parts = batch.parts_mut();
            let mut dest = dest_for(self.storage.spec(), &map, parts.columns);
            self.gather_sampled(
                rng,
                &mut scratch,
                &mut dest,
                parts.generation,
                parts.index,
                parts.weight,
            )
        });
        *batch.scratch_mut() = scratch;
        result
    }

    /// Draws up to `n` rows into `scratch.draws`.
    pub(crate) fn draw(
        &self,
        rng: &mut Rng,
        n: usize,
        scratch: &mut Scratch,
    ) -> Result<(), SampleError> {
        let storage = &self.storage;
        storage.windows(&mut scratch.windows);
        if self.sampler.prioritized().is_none() {
            return self.sampler.draw(
                storage.shards(),
                &scratch.windows,
                rng,
                n,
                &mut scratch.draws,
            );
        }
        let trees = storage.trees();
        let masses = Masses::new(&trees);
        if masses.is_empty() {
            return Err(SampleError::Empty);
        }
        prioritized::draw(
            &trees,
            storage.shards(),
            &scratch.windows,
            &masses,
            rng,
            n,
            &mut scratch.draws,
        );
        Ok(())
    }

    /// Copies the rows drawn into `scratch.draws` into rows `0..` of `dest`, replacing
    /// draws that miss as the sampler says, with importance weights when prioritized.
    pub(crate) fn gather_sampled(
        &self,
        rng: &mut Rng,
        scratch: &mut Scratch,
        dest: &mut Dest<'_>,
        generation: &mut [u64],
        index: &mut [u64],
        weight: Option<&mut [f32]>,
    ) -> Result<(), SampleError> {
        let shards = self.storage.shards();
        let Scratch { windows, draws, .. } = scratch;
        match (self.sampler.prioritized(), weight) {
            (Some(state), Some(weight)) => {
                let trees = self.storage.trees();
                let min = trees.iter().map(Tree::min).min().unwrap_or(u64::MAX);
                let mut masses = Masses::new(&trees);
                let mut redraw = |refresh: bool| {
                    if refresh {
                        windows.clear();
                        windows.extend(shards.iter().map(Shard::window));
                        masses = Masses::new(&trees);
                    }
                    prioritized::redraw(&trees, shards, windows, &masses, rng)
                };
                let weigh = Weigh {
                    state,
                    min,
                    out: weight,
                };
                self.gather(
                    draws,
                    Want::Exact,
                    OnMiss::Redraw(&mut redraw),
                    dest,
                    generation,
                    index,
                    Some(weigh),
                )
            }
            _ if self.sampler.redraws() => {
                let mut redraw = uniform_redraw(shards, windows, rng);
                self.gather(
                    draws,
                    Want::Exact,
                    OnMiss::Redraw(&mut redraw),
                    dest,
                    generation,
                    index,
                    None,
                )
            }
            _ => self.gather(
                draws,
                Want::AtLeast,
                OnMiss::Retry,
                dest,
                generation,
                index,
                None,
            ),
        }
    }

    /// Copies the drawn rows into rows `0..draws.len()` of `dest`. With `weigh`, the
    /// draws are prioritized: a draw must name the row its leaf belongs to, and each
    /// row read gets its importance weight.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gather(
        &self,
        draws: &[Draw],
        want: Want,
        on_miss: OnMiss<'_>,
        dest: &mut Dest<'_>,
        generation: &mut [u64],
        index: &mut [u64],
        mut weigh: Option<Weigh<'_>>,
    ) -> Result<(), SampleError> {
        let storage = &self.storage;
        for &d in draws.iter().take(SAMPLE_AHEAD_DRAWS) {
            storage.prefetch(d);
        }
        read_draws(
            draws,
            on_miss,
            |d, k| {
                if let Some(&ahead) = draws.get(k + SAMPLE_AHEAD_DRAWS) {
                    storage.prefetch(ahead);
                }
                if weigh.is_some() && d.mass == 0 {
                    return Err(Miss::Gone);
                }
                let (stamp, at) = storage.read(d, want, dest, k)?;
                if let Some(w) = &mut weigh {
                    // The leaf's mass is this row's only if its lap is this row's.
                    if stamp.lap() != d.lap {
                        return Err(Miss::Gone);
                    }
                    w.out[k] = w.state.weight(d.mass, w.min.min(d.mass));
                }
                Ok((stamp.generation(), at))
            },
            generation,
            index,
        )
    }

    /// Every live row, as a draw, in storage order.
    pub(crate) fn live_draws(&self) -> Vec<Draw> {
        (0..self.storage.geometry().capacity())
            .filter_map(|i| self.storage.draw_at(i))
            .collect()
    }

    /// The rows at the drawn positions, as they are now.
    ///
    /// A read by position waits for a row being written: its writer is inside one
    /// extend. If it waits long, the writer may be a process that died (shared mode):
    /// the shards of dead lease holders are taken over and repaired, and rows such a
    /// writer never published are left out.
    pub(crate) fn read_positions(&self, draws: &[Draw]) -> Batch {
        let mut draws = std::borrow::Cow::Borrowed(draws);
        loop {
            let mut batch = Batch::zeros(self.storage.spec().clone(), [0]);
            batch.reshape_for_sample(draws.len(), false);
            let identity: SmallVec<[usize; 8]> = (0..self.storage.spec().fields().len()).collect();
            let parts = batch.parts_mut();
            let mut dest = dest_for(self.storage.spec(), &identity, parts.columns);
            let read = self.gather(
                &draws,
                Want::AtLeast,
                OnMiss::RetryUpTo(POSITION_READ_PATIENCE),
                &mut dest,
                parts.generation,
                parts.index,
                None,
            );
            drop(dest);
            if read.is_ok() {
                return batch;
            }
            for k in 0..self.storage.shards().len() {
                self.storage.reclaim_dead_lease(k);
                self.storage.reclaim_dead_editor(k);
            }
            draws.to_mut().retain(|&d| !self.storage.is_abandoned(d));
        }
    }

    fn write_all(&self, data: &Batch, end: Option<usize>) -> Result<(), Attempt<AccessError>> {
        let rewrite = self.admit_rewrite(data)?;
        let data = &*rewrite.data;
        let storage = &self.storage;
        let rows = data.len() as u64;
        let end = end.map_or(rows, |e| e as u64);
        let capacity = storage.geometry().capacity();
        if end > rows {
            return Err(AccessError::from(DataError::BatchShape {
                expected: "at least `end` rows",
                found: data.shape().to_vec(),
            })
            .into());
        }
        if end > capacity {
            return Err(AccessError::OutOfRange {
                index: end - 1,
                capacity,
            }
            .into());
        }
        let src = self
            .source(data, RowOrder::Flat)
            .map_err(AccessError::from)?;
        let draws = (0..end)
            .map(|i| {
                storage
                    .draw_at(i)
                    .ok_or(AccessError::NotWritten { index: i })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Every shard is entered before any row is rewritten: all or nothing.
        let _guards = storage.enter_edit_all()?;
        for (i, d) in draws.into_iter().enumerate() {
            // A row emptied after the check above has nothing to rewrite: skip it.
            let _ = storage.edit(d, &src, i as u64);
        }
        drop(src);
        rewrite.finish(self, end);
        Ok(())
    }
}

/// Misses of one row after which a read by position looks for dead writers.
const POSITION_READ_PATIENCE: u32 = 1 << 14;

/// Rows checked for an extend, ready to append.
pub(crate) struct Prepared<'a> {
    pub(crate) steps: u64,
    pub(crate) src: Source<'a>,
    /// One priority per batch row, from the priority field.
    pub(crate) priorities: Option<Vec<f64>>,
}

/// What a prioritized gather needs to weigh the rows it reads.
pub(crate) struct Weigh<'a> {
    state: &'a prioritized::Priorities,
    /// The smallest mass of any stored row, read before the draws.
    min: u64,
    out: &'a mut [f32],
}

/// The copy plan from rows of `spec` into a batch's columns: field `i` of `spec` goes
/// to column `map[i]` (see `Batch::columns_for`).
pub(crate) fn dest_for<'a>(spec: &Spec, map: &[usize], columns: &'a mut [Column]) -> Dest<'a> {
    let mut columns: SmallVec<[Option<&'a mut Column>; 8]> = columns.iter_mut().map(Some).collect();
    Dest {
        cols: spec
            .fields()
            .iter()
            .zip(map)
            .map(|(f, &i)| DstCol {
                data: columns[i]
                    .take()
                    .expect("replaybuf internal error: a column mapped twice")
                    .as_bytes_mut(),
                bytes: f.bytes(),
                offset: f.offset(),
            })
            .collect(),
    }
}
