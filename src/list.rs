//! List storage: a replay buffer of any `T: Clone + Send + Sync` (TorchRL's
//! `ListStorage`), for values that are not plain bytes: strings, vectors, trees.
//!
//! Each slot holds an atomically swappable `Arc` of the value and the sequence number
//! it was written at. A writer publishes by swapping in a new `Arc`, a reader takes a
//! reference to whichever `Arc` is there and clones the value out of it, so a value is
//! never torn, whatever its type. The shards, cursors, windows, samplers and the
//! appenders' predecessor order are the row storage's; only the slot differs. Slower
//! than the row storage (an allocation per write, a clone per read), no shared mode.
//!
//! Layer: faces.

use crate::batch;
use crate::builder;
use crate::core::Written;
use crate::error::{AccessError, BuildError, BuildErrorKind, DataError, SampleError};
use crate::policy::WritePolicy;
use crate::region::Block;
use crate::rng::{self, Rng};
use crate::sampler::{read_draws, uniform_redraw, Sampler, SamplerEngine};
use crate::settings::Settings;
use crate::storage::geometry::Geometry;
use crate::storage::layout::Global;
use crate::storage::plan::RowOrder;
use crate::storage::shard::{self, Shard, Window};
use crate::storage::shards_only;
use crate::storage::stamp::Stamp;
use crate::storage::{Draw, Miss, Want};
use crate::sync::{Arc, ArcCell, AtomicU64, Backoff, Ordering};

/// A stored value and the sequence number it was written at.
#[derive(Debug)]
pub(crate) struct Entry<T> {
    pub(crate) seq: u64,
    pub(crate) value: T,
}

#[derive(Debug)]
pub(crate) struct ListInner<T> {
    pub(crate) shards: Box<[Shard]>,
    pub(crate) geometry: Geometry,
    pub(crate) slots: Box<[ArcCell<Entry<T>>]>,
    pub(crate) sampler: SamplerEngine,
    pub(crate) seed: u64,
    /// The globals of the shards' region: the call and round-robin counters.
    pub(crate) globals: Block,
    /// A read-only dataset: `push` and `extend` are refused.
    pub(crate) immutable: bool,
}

/// A replay buffer of arbitrary values.
///
/// ```
/// use replaybuf::list::ListBuffer;
///
/// let rb = ListBuffer::<String>::builder().capacity(3).seed(0).build()?;
/// for word in ["a", "b", "c", "d"] {
///     rb.push(word.to_string())?;
/// }
/// assert_eq!(rb.len(), 3);
/// assert_eq!(rb.get(0)?, "d"); // "a" was evicted, FIFO
/// let batch = rb.sample(5)?;
/// assert!(batch.items().iter().all(|w| ["b", "c", "d"].contains(&w.as_str())));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct ListBuffer<T> {
    pub(crate) inner: Arc<ListInner<T>>,
}

impl<T> Clone for ListBuffer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

/// Builds a [`ListBuffer`].
#[derive(Clone, Debug)]
pub struct ListBuilder<T> {
    /// Capacity, shards, seed, sampler, write policy (a list's values have no field to
    /// rank by, so a max-value writer is refused).
    settings: Settings,
    _items: std::marker::PhantomData<fn(T) -> T>,
}

impl<T: Clone + Send + Sync> ListBuilder<T> {
    crate::settings::setters!(capacity, shards, seed, sampler, write_policy);

    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }

    /// Builds the buffer and writes `values` into it before any handle exists, past the
    /// write policy: how an immutable list dataset gets its values. Spread over the
    /// shards as [`ReplayBufferBuilder::build_from`](crate::ReplayBufferBuilder::build_from)
    /// spreads its rows, so that up to the capacity all stay.
    pub fn build_from(
        self,
        values: impl IntoIterator<Item = T>,
    ) -> Result<ListBuffer<T>, BuildError> {
        let rb = self.build()?;
        let mut values: Vec<T> = values.into_iter().collect();
        let (n, shards) = (values.len(), rb.inner.shards.len());
        // Shard `k` takes values `n * k / shards..n * (k + 1) / shards`: the last
        // shard's first, split off the end.
        for k in (0..shards).rev() {
            let part = values.split_off(n * k / shards);
            if !part.is_empty() {
                rb.append_to(k, part);
            }
        }
        Ok(rb)
    }

    /// Validates the choices and allocates the slots.
    pub fn build(self) -> Result<ListBuffer<T>, BuildError> {
        let geometry =
            builder::geometry(self.settings.capacity(), self.settings.shards(), 1, None)?;
        if matches!(
            self.settings.sampler,
            Sampler::Prioritized(_) | Sampler::Slice(_)
        ) {
            return Err(BuildError::new(BuildErrorKind::Sampler {
                reason: "a list storage samples uniformly, without replacement or in FIFO order; \
                         prioritized sampling needs a row storage (ReplayBuffer or \
                         TypedBuffer), and slice sampling a ReplayBuffer with the keys",
            }));
        }
        let immutable = match self.settings.write_policy {
            WritePolicy::RoundRobin => false,
            WritePolicy::Immutable => true,
            WritePolicy::MaxValue { .. } => {
                return Err(BuildError::new(BuildErrorKind::Writer {
                    reason: "a list buffer's values have no field to rank: a max-value \
                             writer needs a ReplayBuffer",
                }))
            }
        };
        let seed = self.settings.seed.unwrap_or_else(crate::sync::entropy_seed);
        let (shards, globals) =
            shards_only(&geometry).map_err(|e| BuildError::new(BuildErrorKind::Region(e)))?;
        // One slot a value, asked for before it is made: a capacity past the memory
        // is an error, not an abort.
        let capacity = self.settings.capacity();
        let mut slots = Vec::new();
        slots.try_reserve_exact(capacity).map_err(|e| {
            BuildError::new(BuildErrorKind::Region(std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                e,
            )))
        })?;
        slots.extend((0..capacity).map(|_| ArcCell::empty()));
        Ok(ListBuffer {
            inner: Arc::new(ListInner {
                shards,
                geometry,
                slots: slots.into_boxed_slice(),
                sampler: SamplerEngine::new(self.settings.sampler, seed, globals.clone()),
                seed,
                globals,
                immutable,
            }),
        })
    }
}

/// Sampled values with their storage indices.
#[derive(Clone, Debug)]
pub struct ListBatch<T> {
    items: Vec<T>,
    index: Vec<u64>,
    generation: Vec<u64>,
}

impl<T> ListBatch<T> {
    /// The sampled values.
    pub fn items(&self) -> &[T] {
        &self.items
    }

    crate::batch::draw_accessors!(index, generations);

    /// Takes the values out.
    pub fn into_items(self) -> Vec<T> {
        self.items
    }
}

impl<T: Clone + Send + Sync> ListBuffer<T> {
    /// Starts a list buffer.
    pub fn builder() -> ListBuilder<T> {
        ListBuilder {
            settings: Settings::default(),
            _items: std::marker::PhantomData,
        }
    }

    /// Values the storage holds when full.
    pub fn capacity(&self) -> usize {
        self.inner.geometry.capacity() as usize
    }

    /// Values stored now.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.window().steps())
            .sum::<u64>() as usize
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values written since the buffer was built or last emptied.
    pub fn write_count(&self) -> u64 {
        self.inner.shards.iter().map(Shard::written).sum()
    }

    /// Adds one value and returns its index. Refused with [`DataError::Immutable`] by
    /// an immutable buffer.
    pub fn push(&self, value: T) -> Result<u64, DataError> {
        Ok(self.extend(std::iter::once(value))?.index(0))
    }

    /// Appends values to one shard (round robin across calls). Refused with
    /// [`DataError::Immutable`] by an immutable buffer.
    pub fn extend(&self, values: impl IntoIterator<Item = T>) -> Result<Written, DataError> {
        if self.inner.immutable {
            return Err(DataError::Immutable);
        }
        Ok(self.append(values))
    }

    /// Appends past the write policy.
    ///
    /// No value is dropped inside the claim: a value's drop is the caller's code, and
    /// one that panicked there left the shard's appender unit counted (every save
    /// waited for good) and the claim's later slots unwritten (every append of their
    /// positions, and every read of them, waited for good). The values the append
    /// itself laps go before it claims; the values it replaces, after it leaves.
    fn append(&self, values: impl IntoIterator<Item = T>) -> Written {
        let inner = &self.inner;
        let k = if inner.shards.len() == 1 {
            0
        } else {
            (inner
                .global(Global::NextShard)
                .fetch_add(1, Ordering::Relaxed)
                % inner.shards.len() as u64) as usize
        };
        self.append_to(k, values.into_iter().collect())
    }

    /// [`ListBuffer::append`] into shard `k`.
    fn append_to(&self, k: usize, mut values: Vec<T>) -> Written {
        let inner = &self.inner;
        let shard = &inner.shards[k];
        let ring = *shard.ring();
        let steps = values.len() as u64;
        let skip = steps.saturating_sub(ring.steps) as usize;
        values.drain(..skip);
        let mut replaced = Vec::with_capacity(values.len());
        // As an appender, so that a checkpoint's freeze waits for this append.
        let claim = shard.enter_append(1);
        let first = shard.claim(steps);
        for (step, value) in shard::steps_of(&ring, first, steps).zip(values) {
            let slot = &inner.slots[ring.slot(step.pos, 0) as usize];
            // Wait for the slot's previous value, as the row storage's appenders do, so
            // that a writer that lapped a slower one never has its value replaced by
            // the older one.
            let mut backoff = Backoff::new();
            while slot.load().map(|e| e.seq) != step.prev {
                backoff.snooze();
            }
            replaced.push(slot.swap(Some(Arc::new(Entry {
                seq: step.seq,
                value,
            }))));
        }
        shard.leave_append(claim);
        drop(replaced);
        let mut written = Written::new(steps, RowOrder::Flat);
        written.push(ring, first, 0);
        written
    }

    /// Samples `n` values (clones).
    pub fn sample(&self, n: usize) -> Result<ListBatch<T>, SampleError> {
        let inner = &self.inner;
        let call = inner.global(Global::Calls).fetch_add(1, Ordering::Relaxed);
        let mut rng: Rng = rng::stream(inner.seed, rng::Stream::Call(call));
        let mut draws = Vec::new();
        batch::room(&mut draws, n, n)?;
        let mut rounds = 0;
        loop {
            let (read, batch) = self.draw_and_read(&mut rng, n, &mut draws);
            if inner
                .sampler
                .settle(&inner.shards, &draws, read, &mut rounds)?
            {
                return Ok(batch);
            }
        }
    }

    /// Draws up to `n` values into `draws` and reads them.
    fn draw_and_read(
        &self,
        rng: &mut Rng,
        n: usize,
        draws: &mut Vec<Draw>,
    ) -> (Result<(), SampleError>, ListBatch<T>) {
        let inner = &self.inner;
        let mut windows: Vec<Window> = inner.shards.iter().map(Shard::window).collect();
        let mut batch = ListBatch {
            items: Vec::new(),
            index: Vec::new(),
            generation: Vec::new(),
        };
        // Room for the items before anything is drawn (an epoch moves with a draw):
        // `vec!` aborted the process on a sample of large items past memory.
        let mut items: Vec<Option<T>> = Vec::new();
        if items.try_reserve_exact(n).is_err() {
            return (Err(SampleError::TooLarge { rows: n }), batch);
        }
        if let Err(e) = inner
            .sampler
            .draw(&inner.shards, &windows, rng, n, draws, None)
        {
            return (Err(e), batch);
        }
        let want = inner.sampler.want();
        let mut redraw = uniform_redraw(&inner.shards, &mut windows, rng);
        items.resize(draws.len(), None);
        batch.index = vec![0; draws.len()];
        batch.generation = vec![0; draws.len()];
        let read = read_draws(
            draws,
            // No process but this one writes a list buffer's items.
            inner.sampler.on_miss(&mut redraw, &|_| false),
            |d, k, _| {
                let (value, g, i) = inner.read(d, want)?;
                items[k] = Some(value);
                Ok((g, i))
            },
            &mut batch.generation,
            &mut batch.index,
        );
        if read.is_ok() {
            batch.items = items
                .into_iter()
                .map(|v| v.expect("every draw was read"))
                .collect();
        }
        (read, batch)
    }

    /// The value at storage `index`.
    pub fn get(&self, index: u64) -> Result<T, AccessError> {
        let inner = &self.inner;
        let capacity = inner.geometry.capacity();
        let (k, pos, _) = inner
            .geometry
            .locate(index)
            .ok_or(AccessError::OutOfRange { index, capacity })?;
        let seq = inner.shards[k as usize]
            .seq_at(pos)
            .ok_or(AccessError::NotWritten { index })?;
        let draw = Draw {
            shard: k as u32,
            seq,
            ..Draw::default()
        };
        let mut backoff = Backoff::new();
        loop {
            match inner.read(draw, Want::AtLeast) {
                Ok((value, _, _)) => return Ok(value),
                Err(_) => backoff.snooze(),
            }
        }
    }

    /// Drops every stored value from view (their memory is freed as slots are reused),
    /// and ends the sampler's epoch. Refused with [`DataError::Immutable`] by an
    /// immutable buffer.
    pub fn clear(&self) -> Result<(), DataError> {
        if self.inner.immutable {
            return Err(DataError::Immutable);
        }
        for s in self.inner.shards.iter() {
            s.empty();
        }
        self.inner.sampler.reset();
        Ok(())
    }
}

impl<T> ListInner<T> {
    pub(crate) fn global(&self, g: Global) -> &AtomicU64 {
        self.globals.word(g.offset())
    }
}

impl<T: Clone> ListInner<T> {
    /// The value of a draw, its generation and its index.
    fn read(&self, d: Draw, want: Want) -> Result<(T, u64, u64), Miss> {
        let ring = self.shards[d.shard as usize].ring();
        let pos = ring.pos(d.seq);
        let entry = self.slots[ring.slot(pos, 0) as usize]
            .load()
            .ok_or(Miss::Busy)?;
        match (entry.seq.cmp(&d.seq), want) {
            (std::cmp::Ordering::Less, _) => Err(Miss::Busy),
            (std::cmp::Ordering::Greater, Want::Exact) => Err(Miss::Gone),
            _ => {
                let lap = ring.lap(entry.seq);
                Ok((
                    entry.value.clone(),
                    Stamp::published(lap, 0).generation(),
                    ring.index(pos, 0),
                ))
            }
        }
    }
}
