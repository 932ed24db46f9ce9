//! The typed face: push and sample a user's `#[repr(C)]` [`bytemuck::Pod`] transition
//! type directly. The same engine as [`ReplayBuffer`]: the row is the value's bytes,
//! one field, so no per-field work happens on either side.
//!
//! Layer: faces.

use std::marker::PhantomData;
use std::path::Path;
use std::sync::Arc;

use bytemuck::Pod;
use smallvec::smallvec;

use crate::batch::{self, Scratch};
use crate::buffer::ReplayBuffer;
use crate::builder::ReplayBufferBuilder;
use crate::checkpoint::dump::SaveOptions;
use crate::core::Prepared;
use crate::core::Written;
use crate::core::{Attempt, Core};
use crate::error::persist::PersistError;
use crate::error::{AccessError, BuildError, BuildErrorKind, DataError, SampleError, SwapError};
use crate::policy::WritePolicy;
use crate::rng::Rng;
use crate::sampler::Sampler;
use crate::settings::Settings;
use crate::spec::{Spec, OPAQUE_ROW};
use crate::state::State;
use crate::storage::geometry::Geometry;
use crate::storage::plan::{Dest, DstCol, RowOrder, Source, SrcCol};
use crate::swap::StorageConfig;

/// Why a typed buffer refuses a max-value writer.
const MAX_VALUE_TYPED: &str =
    "a typed buffer's rows have no field to rank: a max-value writer needs a ReplayBuffer";

/// Why a typed buffer refuses a slice sampler, at build and in `set_sampler`.
fn slice_refused() -> BuildError {
    BuildError::new(BuildErrorKind::Sampler {
        reason: "a typed buffer's rows have no fields to tell trajectories by: slice \
                 sampling needs a ReplayBuffer with the keys",
    })
}

/// A replay buffer of `T`s.
///
/// ```
/// use replaybuf::typed::TypedBuffer;
/// use replaybuf::bytemuck::{Pod, Zeroable};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
/// struct Step { obs: [f32; 4], action: u32, reward: f32 }
///
/// let rb = TypedBuffer::<Step>::builder().capacity(1024).seed(1).build()?;
/// let step = Step { obs: [1.0; 4], action: 2, reward: 0.5 };
/// rb.extend(&[step; 10])?;
/// let batch = rb.sample(4)?;
/// assert_eq!(batch.rows(), &[step; 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TypedBuffer<T> {
    buffer: ReplayBuffer,
    _rows: PhantomData<fn(T) -> T>,
}

impl<T> Clone for TypedBuffer<T> {
    fn clone(&self) -> Self {
        Self {
            buffer: self.buffer.clone(),
            _rows: PhantomData,
        }
    }
}

/// Builds a [`TypedBuffer`]: the [`ReplayBufferBuilder`] choices, minus the spec.
#[derive(Debug)]
pub struct TypedBuilder<T> {
    inner: ReplayBufferBuilder,
    _rows: PhantomData<fn(T) -> T>,
}

macro_rules! forward {
    ($($(#[$doc:meta])* $name:ident($ty:ty)),* $(,)?) => {
        $($(#[$doc])* pub fn $name(self, value: $ty) -> Self {
            TypedBuilder { inner: self.inner.$name(value), _rows: PhantomData }
        })*
    };
}

impl<T: Pod + Send + Sync> TypedBuilder<T> {
    crate::settings::setters!(
        capacity,
        shards,
        ndim,
        envs,
        dim_extend,
        batch_size,
        seed,
        sampler,
        write_policy
    );

    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.inner.settings
    }

    forward! {
        /// See [`ReplayBufferBuilder::existsok`].
        existsok(bool),
    }

    /// See [`ReplayBufferBuilder::memmap`].
    pub fn memmap(self, dir: impl Into<std::path::PathBuf>) -> Self {
        TypedBuilder {
            inner: self.inner.memmap(dir),
            _rows: PhantomData,
        }
    }

    /// See [`ReplayBufferBuilder::shared`]: `T` is plain bytes, so it may live in
    /// shared memory.
    pub fn shared(self, name: impl Into<String>) -> Self {
        TypedBuilder {
            inner: self.inner.shared(name),
            _rows: PhantomData,
        }
    }

    /// Validates and reserves the storage. A zero-sized `T` is refused.
    pub fn build(self) -> Result<TypedBuffer<T>, BuildError> {
        if std::mem::size_of::<T>() == 0 {
            return Err(BuildError::new(BuildErrorKind::ZeroSizedRow));
        }
        Spec::opaque(std::mem::size_of::<T>()).map_err(BuildError::from)?;
        if let WritePolicy::MaxValue { .. } = self.inner.chosen_write_policy() {
            return Err(BuildError::new(BuildErrorKind::Writer {
                reason: MAX_VALUE_TYPED,
            }));
        }
        if let Sampler::Slice(_) = self.inner.chosen_sampler() {
            return Err(slice_refused());
        }
        Ok(TypedBuffer {
            buffer: self.inner.build()?,
            _rows: PhantomData,
        })
    }

    /// Builds the buffer and writes `items` into it before any handle exists, past the
    /// write policy: how an immutable typed dataset gets its rows. Spread over the
    /// shards as [`ReplayBufferBuilder::build_from`] spreads its rows, so that up to the
    /// capacity all stay.
    pub fn build_from(self, items: &[T]) -> Result<TypedBuffer<T>, BuildError> {
        let rb = self.build()?;
        let state = rb.buffer.state();
        let written = match state.core.storage.geometry() {
            // Spread over the shards as the untyped buffer's rows are, so that up to
            // the capacity all stay (one shard's append kept only its ring's share).
            Geometry::Flat { .. } => {
                let mut rows = rb.buffer.batch([items.len()]);
                rows.set(OPAQUE_ROW, bytemuck::cast_slice::<T, u8>(items))
                    .and_then(|()| state.write_initial(&rows))
            }
            Geometry::Grid { .. } => rb.append(items).map(drop),
        };
        drop(state);
        written.map_err(|e| BuildError::new(BuildErrorKind::Rows(e)))?;
        Ok(rb)
    }
}

/// Sampled `T`s with their storage indices and write generations.
#[derive(Clone, Debug, Default)]
pub struct TypedBatch<T> {
    rows: Vec<T>,
    index: Vec<u64>,
    generation: Vec<u64>,
    weight: Option<Vec<f32>>,
    scratch: Scratch,
}

impl<T> TypedBatch<T> {
    /// An empty batch to pass to [`TypedBuffer::sample_into`].
    pub fn new() -> Self {
        TypedBatch {
            rows: Vec::new(),
            index: Vec::new(),
            generation: Vec::new(),
            weight: None,
            scratch: Scratch::default(),
        }
    }

    /// Makes room for a sample of `rows` values (with weights when `weighted`) and its
    /// draws, or refuses one past memory, as `Batch::room_for_sample` does.
    fn room(&mut self, rows: usize, weighted: bool) -> Result<(), SampleError> {
        batch::room(&mut self.rows, rows, rows)?;
        batch::room(&mut self.index, rows, rows)?;
        batch::room(&mut self.generation, rows, rows)?;
        if weighted {
            batch::room(self.weight.get_or_insert_with(Vec::new), rows, rows)?;
        }
        self.scratch.room(rows)
    }

    /// The sampled values.
    pub fn rows(&self) -> &[T] {
        &self.rows
    }

    crate::batch::draw_accessors!(index, generations, weight);

    /// Rows in the batch.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Takes the sampled values out.
    pub fn into_rows(self) -> Vec<T> {
        self.rows
    }
}

impl<T: Pod + Send + Sync> TypedBuffer<T> {
    /// Starts a buffer of `T`s.
    pub fn builder() -> TypedBuilder<T> {
        // A `T` no row can hold (over a gigabyte) is refused by `build`, which lays
        // the row out again: this one stands in meanwhile. It panicked here.
        let spec = Spec::opaque(std::mem::size_of::<T>())
            .or_else(|_| Spec::opaque(1))
            .expect("a one-byte row lays out");
        TypedBuilder {
            inner: ReplayBuffer::builder(Arc::new(spec)),
            _rows: PhantomData,
        }
    }

    /// See [`ReplayBuffer::save`].
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.buffer.save(dir)
    }

    /// See [`ReplayBuffer::save_with`].
    pub fn save_with(
        &self,
        dir: impl AsRef<Path>,
        options: &SaveOptions,
    ) -> Result<(), PersistError> {
        self.buffer.save_with(dir, options)
    }

    /// See [`ReplayBuffer::from_checkpoint`]; the checkpoint must be of a buffer of `T`s (of
    /// `T`'s size).
    pub fn from_checkpoint(dir: impl AsRef<Path>) -> Result<TypedBuffer<T>, PersistError> {
        Self::of_rows(ReplayBuffer::from_checkpoint(dir.as_ref())?, dir.as_ref())
    }

    /// See [`ReplayBuffer::attach`]; the region must hold rows of `T`'s size.
    #[cfg(not(replaybuf_loom))]
    pub fn attach(name: &str) -> Result<TypedBuffer<T>, PersistError> {
        Self::of_rows(
            ReplayBuffer::attach(name)?,
            &crate::backing::shm::shown(name),
        )
    }

    /// `buffer` as a buffer of `T`s, if its rows are `T`'s size (`path` names where it
    /// came from, for the error).
    fn of_rows(buffer: ReplayBuffer, path: &Path) -> Result<TypedBuffer<T>, PersistError> {
        let mismatch = |why: String| {
            PersistError::new(path, crate::error::persist::PersistKind::Mismatch(why))
        };
        let want = Spec::opaque(std::mem::size_of::<T>())
            .map_err(|e| mismatch(format!("no buffer holds rows of this type: {e}")))?;
        if !buffer.spec().same_fields(&want) {
            let size = std::mem::size_of::<T>();
            return Err(mismatch(format!("not a buffer of {size}-byte rows")));
        }
        Ok(TypedBuffer {
            buffer,
            _rows: PhantomData,
        })
    }

    /// See [`ReplayBuffer::restore`].
    pub fn restore(&mut self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.buffer.restore(dir)
    }

    /// The untyped buffer underneath (one `u8` field named `row`).
    pub fn as_untyped(&self) -> &ReplayBuffer {
        &self.buffer
    }

    /// Replaces the sampler: see [`ReplayBuffer::set_sampler`].
    pub fn set_sampler(&self, sampler: impl Into<Sampler>) -> Result<(), SwapError> {
        let sampler = sampler.into();
        if let Sampler::Slice(_) = sampler {
            return Err(SwapError::build(slice_refused()));
        }
        self.buffer.set_sampler(sampler)
    }

    /// Replaces the write policy: see [`ReplayBuffer::set_write_policy`]. Round robin or
    /// immutable: a typed row has no field to rank by.
    pub fn set_write_policy(&self, writer: WritePolicy) -> Result<(), SwapError> {
        if let WritePolicy::MaxValue { .. } = writer {
            return Err(SwapError::build(BuildError::new(BuildErrorKind::Writer {
                reason: MAX_VALUE_TYPED,
            })));
        }
        self.buffer.set_write_policy(writer)
    }

    /// Moves the buffer into a new storage: see [`ReplayBuffer::set_storage`].
    ///
    /// ```
    /// use replaybuf::swap::StorageConfig;
    /// use replaybuf::typed::TypedBuffer;
    ///
    /// let rb = TypedBuffer::<[f32; 4]>::builder().capacity(100).build()?;
    /// rb.extend(&[[1.0; 4]; 60])?;
    /// rb.set_storage(StorageConfig::heap().capacity(50))?;
    /// assert_eq!(rb.len(), 50); // the newest 50
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_storage(&self, storage: StorageConfig) -> Result<(), SwapError> {
        self.buffer.set_storage(storage)
    }

    /// Rows the storage holds when full.
    pub fn capacity(&self) -> usize {
        self.buffer.capacity()
    }

    /// Rows stored now.
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether no row is stored.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Rows written since the buffer was built or last emptied.
    pub fn write_count(&self) -> u64 {
        self.buffer.write_count()
    }

    fn source(items: &[T], order: RowOrder) -> Source<'_> {
        Source {
            cols: smallvec![SrcCol::whole(
                bytemuck::cast_slice(items),
                std::mem::size_of::<T>(),
                0,
            )],
            order,
        }
    }

    /// Adds one value (ndim-1 storages) and returns its index.
    pub fn push(&self, item: &T) -> Result<u64, DataError> {
        Ok(self.extend(std::slice::from_ref(item))?.index(0))
    }

    /// Appends values: any number for ndim 1 (one shard, round robin across calls);
    /// for ndim 2, `t * envs` values laid out as `dim_extend` says. Through the rate
    /// limit, if the buffer has one (a shared region's, or a checkpoint's).
    pub fn extend(&self, items: &[T]) -> Result<Written, DataError> {
        self.buffer.limited_insert(
            items.len(),
            |inner| {
                inner.admit_typed()?;
                Self::steps(inner, items).map(drop)
            },
            || self.extend_rows(items),
        )
    }

    /// [`extend`](Self::extend) once the limit let it through.
    fn extend_rows(&self, items: &[T]) -> Result<Written, DataError> {
        let appended = self.buffer.retrying(|inner| match inner.admit_typed()? {
            true => Self::append_to(inner, items).map(Some),
            false => Ok(None),
        })?;
        match appended {
            Some(written) => Ok(written),
            // A max-value writer ranks the rows by their bytes, as the untyped buffer's
            // rows (the way it does whatever policy the buffer has by then).
            None => {
                let mut rows = self.buffer.batch([items.len()]);
                rows.set(OPAQUE_ROW, bytemuck::cast_slice::<T, u8>(items))?;
                self.buffer.extend_rows(&rows, false)
            }
        }
    }

    /// Appends past the write policy's gate.
    fn append(&self, items: &[T]) -> Result<Written, DataError> {
        self.buffer.retrying(|inner| Self::append_to(inner, items))
    }

    /// The steps `items` make in `inner`'s storage: one a value for ndim 1, one per
    /// `envs` values for ndim 2.
    fn steps(inner: &State, items: &[T]) -> Result<u64, DataError> {
        match *inner.core.storage.geometry() {
            Geometry::Flat { .. } => Ok(items.len() as u64),
            Geometry::Grid { envs, .. } if (items.len() as u64).is_multiple_of(envs) => {
                Ok(items.len() as u64 / envs)
            }
            Geometry::Grid { .. } => Err(DataError::BatchShape {
                expected: "a multiple of envs values for an ndim-2 storage",
                found: vec![items.len()],
            }),
        }
    }

    /// Appends to the buffer state `inner`.
    fn append_to(inner: &State, items: &[T]) -> Result<Written, Attempt<DataError>> {
        let steps = Self::steps(inner, items)?;
        let (shard, order) = match *inner.core.storage.geometry() {
            Geometry::Flat { .. } => (Some(inner.core.pick_shard()?), RowOrder::Flat),
            Geometry::Grid { envs, .. } => (None, inner.core.order_for(steps, envs)),
        };
        let rows = Prepared {
            steps,
            src: Self::source(items, order),
            priorities: None,
        };
        Ok(inner.core.append(shard, &rows)?)
    }

    /// Samples `n` values.
    pub fn sample(&self, n: usize) -> Result<TypedBatch<T>, SampleError> {
        let mut batch = TypedBatch::new();
        self.sample_n_into(n, &mut batch)?;
        Ok(batch)
    }

    /// Samples into `batch`, reusing its buffers (no allocation once warm): the
    /// builder's `batch_size` values, or as many as `batch` holds when none was set.
    pub fn sample_into(&self, batch: &mut TypedBatch<T>) -> Result<(), SampleError> {
        let n = match (self.buffer.state().core.batch_size, batch.len()) {
            (Some(n), _) => n,
            (None, 0) => return Err(SampleError::NoBatchSize),
            (None, n) => n,
        };
        self.sample_n_into(n, batch)
    }

    /// Samples `n` values into `batch`, through the rate limit if there is one.
    fn sample_n_into(&self, n: usize, batch: &mut TypedBatch<T>) -> Result<(), SampleError> {
        let weighted = self.buffer.state().core.sampler.prioritized().is_some();
        batch.room(n, weighted)?;
        self.buffer.limited_sample(n, || {
            let (inner, mut rng) = self.buffer.call_stream();
            let mut rounds = 0;
            loop {
                let read = Self::draw_and_read(&inner.core, &mut rng, n, batch, rounds > 0);
                let (shards, draws) = (inner.core.storage.shards(), &batch.scratch.draws);
                if inner
                    .core
                    .sampler
                    .settle(shards, draws, read, &mut rounds)?
                {
                    return Ok(batch.len());
                }
            }
        })?;
        Ok(())
    }

    /// Draws up to `n` rows and reads them into `batch`, `again` after a read that
    /// missed ([`Core::draw`]).
    fn draw_and_read(
        core: &Core,
        rng: &mut Rng,
        n: usize,
        batch: &mut TypedBatch<T>,
        again: bool,
    ) -> Result<(), SampleError> {
        let scratch = &mut batch.scratch;
        core.draw(rng, n, scratch, again)?;
        let m = scratch.draws.len();
        batch.rows.resize(m, T::zeroed());
        batch.index.resize(m, 0);
        batch.generation.resize(m, 0);
        if let Some(w) = &mut batch.weight {
            w.resize(m, 0.0);
        } else if core.sampler.prioritized().is_some() {
            batch.weight = Some(vec![0.0; m]);
        }
        let mut dest = Dest::new(smallvec![DstCol::whole(
            bytemuck::cast_slice_mut(&mut batch.rows),
            std::mem::size_of::<T>(),
            0,
        )]);
        let weight = match (&mut batch.weight, core.sampler.prioritized()) {
            (w, Some(_)) => Some(&mut w.get_or_insert_with(Vec::new)[..]),
            (w, None) => {
                *w = None;
                None
            }
        };
        core.gather_sampled(
            rng,
            scratch,
            &mut dest,
            &mut batch.generation,
            &mut batch.index,
            weight,
        )
    }

    /// The value at storage `index`.
    pub fn get(&self, index: u64) -> Result<T, AccessError> {
        let row = self.buffer.get(index)?;
        let bytes = row
            .column_bytes(OPAQUE_ROW)
            .expect("a typed buffer's spec has one field named `row`");
        Ok(bytemuck::pod_read_unaligned(bytes))
    }

    /// Every stored value among the first `end` positions, in storage order, with its
    /// index.
    pub fn read_all_in_order(&self, end: Option<usize>) -> (Vec<T>, Vec<u64>) {
        let batch = self.buffer.read_all_in_order(end);
        let bytes = batch
            .column_bytes(OPAQUE_ROW)
            .expect("a typed buffer's spec has one field named `row`");
        let size = std::mem::size_of::<T>().max(1);
        let rows = bytes
            .chunks_exact(size)
            .take(batch.len())
            .map(bytemuck::pod_read_unaligned)
            .collect();
        (rows, batch.index().to_vec())
    }

    /// Drops every stored value; refused by an immutable buffer
    /// ([`ReplayBuffer::clear`]).
    pub fn clear(&self) -> Result<(), DataError> {
        self.buffer.clear()
    }

    /// Sets the priorities of sampled values; see [`ReplayBuffer::update_priority`].
    pub fn update_priority(
        &self,
        index: &[u64],
        generation: &[u64],
        priority: &[f64],
    ) -> Result<crate::PriorityUpdate, crate::error::PriorityError> {
        self.buffer.update_priority(index, generation, priority)
    }

    /// Sets the priorities of sampled values, all or none; see
    /// [`ReplayBuffer::update_priority_all`].
    pub fn update_priority_all(
        &self,
        index: &[u64],
        generation: &[u64],
        priority: &[f64],
    ) -> Result<crate::PriorityUpdate, crate::error::PriorityError> {
        self.buffer.update_priority_all(index, generation, priority)
    }
}
