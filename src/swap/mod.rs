//! Swapping a built buffer's sampler, write policy or storage (TorchRL's
//! `set_sampler`, `set_writer`, `set_storage`) while other threads use it.
//!
//! Every handle of a buffer (clones, [`Writer`](crate::Writer)s,
//! [`Learner`](crate::Learner)s, loaders' workers, ensembles) reaches the buffer's
//! state, a `State` (storage, sampler engine, write policy, configuration), through
//! one `ArcSwap` in the `StateCell` they share. An operation loads it once (no lock,
//! no reference count on the fast path) and works on that state to the end. A swap
//! builds a new state and publishes it whole; operations that loaded the old one
//! finish on it.
//!
//! # A swap, step by step
//!
//! 1. It takes the buffer's reconfiguration lock (swaps, `set_alpha` and `set_beta`
//!    take turns) and checks the new configuration as the builder would: a bad one is
//!    an error, and nothing has changed.
//! 2. It makes the new storage, if there is to be one (memory, or a file-backed
//!    directory): what can fail happens before anything is held.
//! 3. It holds the old write policy's lock (a max-value writer's placements are then
//!    never half done) and freezes the old storage (`storage/freeze.rs`): it waits
//!    until no appender, editor or priority update is inside, and keeps new ones
//!    waiting. Learners go on sampling the old state meanwhile. (A sample call
//!    through the buffer itself that meets step 4 copying the counters, from one of
//!    which it numbers its random stream, waits for the copy and is redone on the new
//!    state: `Storage::take_count`.)
//! 4. It copies the old rows into the new storage (`carry.rs`), or, when the layout
//!    does not change (uniform <-> without replacement, a new write policy, new alpha
//!    or beta), keeps them where they are: the new state is a second `Storage` over
//!    the same region (`Storage::view`).
//! 5. It publishes the new state, *retires* the old storage, and thaws it.
//!
//! A writer that waited on the freeze gets in after the thaw, finds its storage
//! retired, leaves without writing, and redoes its whole write on the new state
//! (`ReplayBuffer::retrying`; its inverse transforms then run again on the caller's
//! rows). So a write racing a swap lands either in the old
//! storage before it is copied, or in the new one; never in a storage nobody reads
//! any more, never twice, never torn. The ordering argument is in `freeze.rs` and in
//! [`docs::orderings`](crate::docs::orderings); loom checks it
//! (`loom-tests/tests/swap.rs`).
//!
//! # What a swap keeps
//!
//! - Rows: all of them when the layout does not change. Into a new storage, each
//!   shard's rows in FIFO order, as many of the newest as fit (see `carry.rs`).
//! - Priorities: kept when the old and the new sampler are both prioritized (each
//!   row's raw priority; masses recomputed with the new `alpha`, the running maximum
//!   kept); otherwise rows enter with the new sampler's priority for new rows.
//! - Epochs (without replacement) restart; random streams go on (the counters of
//!   sample calls, learner and writer handles are carried over); transforms and
//!   save/load hooks stay.
//! - Indices and generations: kept when the rows stay in place. Rows copied into a
//!   new storage start at a lap beyond any the old storage reached, so an index and
//!   generation sampled before the swap never name a row after it: a priority update
//!   for it counts as stale.
//!
//! Layer: api.

mod apply;
mod carry;
mod config;

pub use config::{Reconfigure, StorageConfig};

use crate::buffer::ReplayBuffer;
use crate::error::SwapError;
use crate::policy::WritePolicy;
use crate::sampler::Sampler;

impl ReplayBuffer {
    /// Replaces the sampler (TorchRL's `set_sampler`), keeping the rows and the write
    /// policy: a cold-path operation, safe while other threads hold handles and use
    /// them. Priorities are kept from one prioritized sampler to another; epochs
    /// restart. A sampler that does not fit the buffer (a slice sampler's key the
    /// spec lacks, a prioritized one beside a max-value writer, a slice layout that
    /// does not divide the batch size) is refused and nothing changes. A priority key
    /// stays while the sampler is prioritized (see [`Reconfigure::priority_key`]).
    ///
    /// Uniform and without-replacement samplers trade places with the rows where they
    /// are. A sampler with trees or trajectory tables moves the rows into a new
    /// storage of the same shape (see [`ReplayBuffer::set_storage`] for what a copy
    /// keeps); a file-backed buffer can only do that into a new directory, in one
    /// [`reconfigure`](Self::reconfigure) with the storage.
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec};
    /// use replaybuf::sampler::{Prioritized, WithoutReplacement};
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [3]).build()?;
    /// let rb = ReplayBuffer::builder(spec).capacity(100).seed(1).build()?;
    /// rb.extend(&rb.batch([10]))?;
    /// rb.set_sampler(WithoutReplacement::new())?;
    /// assert_eq!(rb.sample(10)?.len(), 10);
    /// rb.set_sampler(Prioritized::new(0.6, 0.4))?;
    /// assert_eq!(rb.len(), 10);
    /// assert!(rb.sample(4)?.weight().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_sampler(&self, sampler: impl Into<Sampler>) -> Result<(), SwapError> {
        self.reconfigure().sampler(sampler).apply()
    }

    /// Replaces the write policy (TorchRL's `set_writer`), keeping the rows where they
    /// are: a cold-path operation, safe while other threads write. A max-value writer
    /// ranks the stored rows when it takes over. A policy that does not fit the buffer
    /// (a max-value writer beside a prioritized or slice sampler, or on an ndim-2
    /// storage; a rank key the spec lacks) is refused and nothing changes.
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec, WritePolicy};
    /// use replaybuf::error::DataError;
    ///
    /// let spec = Spec::builder().field("reward", DType::F32, []).build()?;
    /// let rb = ReplayBuffer::builder(spec).capacity(100).build()?;
    /// rb.extend(&rb.batch([10]))?;
    /// rb.set_write_policy(WritePolicy::Immutable)?;
    /// assert_eq!(rb.extend(&rb.batch([1])).unwrap_err(), DataError::Immutable);
    /// rb.set_write_policy(WritePolicy::max_value("reward"))?;
    /// rb.extend(&rb.batch([1]))?;
    /// assert_eq!(rb.len(), 11);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_write_policy(&self, writer: WritePolicy) -> Result<(), SwapError> {
        self.reconfigure().write_policy(writer).apply()
    }

    /// Moves the buffer into a new storage (TorchRL's `set_storage`): another
    /// capacity, shard count, ndim and environments, on the heap or in a file-backed
    /// directory. A cold-path operation, safe while other threads hold handles: a
    /// collector's `extend` racing it lands in the old storage before the copy, or in
    /// the new one, never lost and never torn.
    ///
    /// The rows are copied, each shard's in FIFO order, as many of the newest as the
    /// new storage holds:
    ///
    /// - ndim 1 to ndim 1: every shard's rows keep their order. With more shards, each
    ///   old shard `s` is cut into consecutive runs over shards `s`, `s + old`,
    ///   `s + 2 * old`, ..., the newest run staying in shard `s`, where a
    ///   [`Writer`](crate::Writer) bound to it goes on appending; with fewer, shard `s`
    ///   goes to shard `s % shards`, after the shards that meet there and hold older
    ///   runs. Splitting in two sends the older half to the upper shard, and every
    ///   change of shard count orders runs as such halvings would, so merging back
    ///   what a split made restores each shard as it was: a writer whose shard stays
    ///   its own keeps its rows in the order it wrote them. Each shard keeps the
    ///   newest rows it has room for. A writer bound to shard `s` writes shard
    ///   `s % shards` afterwards. With a slice sampler, an old shard's run is its
    ///   own trajectories: one left open at the end of a run ends there (it does not
    ///   go on into the next run's rows, nor, in a split's older run, into what the
    ///   upper shard's writer appends next), except in each shard's newest run,
    ///   which its writer goes on with.
    /// - ndim 2 with the same environments: every environment's column keeps its
    ///   steps in time order. A new shard's columns share one cursor, so when shards
    ///   that wrote different numbers of steps merge, the new shard keeps the newest
    ///   steps all of its columns have.
    /// - Otherwise (ndim or environments change): the rows in time order (ndim 1:
    ///   the shards one after another; ndim 2: step by step from the oldest, every
    ///   environment of a step in order, columns aligned at their newest step), laid
    ///   out as ndim 1 does with one old shard, or for ndim 2 step after step across
    ///   the new environments (`[t, envs]` row-major), dropping the oldest rows that do
    ///   not fill a whole step.
    ///
    /// Priorities are kept from one prioritized sampler to another (each row's raw
    /// priority, and the running maximum); otherwise rows enter with the new
    /// sampler's priority for new rows. Epochs restart; the random streams go on (the
    /// counters of sample calls and of learner and writer handles carry over);
    /// transforms and hooks stay. Copied rows start at a lap beyond any of the old
    /// storage's, so an index and generation sampled before the swap never name a row
    /// after it (a priority update for one counts as stale), and `write_count` counts
    /// the rows carried over. The old storage's memory is released when the last
    /// operation using it ends; an old file-backed directory is left as it is, closed.
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec};
    /// use replaybuf::swap::StorageConfig;
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [3]).build()?;
    /// let rb = ReplayBuffer::builder(spec).capacity(100).shards(2).build()?;
    /// let (a, b) = (rb.writer(), rb.writer());
    /// a.extend(&rb.batch([30]))?;
    /// b.extend(&rb.batch([30]))?;
    /// rb.set_storage(StorageConfig::heap().capacity(1000).shards(1))?;
    /// assert_eq!((rb.capacity(), rb.shards(), rb.len()), (1000, 1, 60));
    /// a.extend(&rb.batch([5]))?; // the handles go on, into the new storage
    /// assert_eq!(rb.len(), 65);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_storage(&self, storage: StorageConfig) -> Result<(), SwapError> {
        self.reconfigure().storage(storage).apply()
    }

    /// Several changes in one swap (one copy at most): a sampler, a write policy, a
    /// storage, a priority key. What a single change cannot do alone, such as a
    /// prioritized sampler in place of a max-value writer's uniform one, or a new
    /// sampler for a file-backed buffer together with its new directory.
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec, WritePolicy};
    /// use replaybuf::sampler::Prioritized;
    /// use replaybuf::swap::StorageConfig;
    ///
    /// let spec = Spec::builder()
    ///     .field("obs", DType::F32, [3])
    ///     .field("td", DType::F32, [])
    ///     .build()?;
    /// let rb = ReplayBuffer::builder(spec)
    ///     .capacity(100)
    ///     .write_policy(WritePolicy::max_value("td"))
    ///     .build()?;
    /// rb.reconfigure()
    ///     .sampler(Prioritized::new(0.7, 0.5))
    ///     .write_policy(WritePolicy::RoundRobin)
    ///     .priority_key("td")
    ///     .storage(StorageConfig::heap().capacity(1000))
    ///     .apply()?;
    /// assert_eq!(rb.alpha(), Some(0.7));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reconfigure(&self) -> Reconfigure<'_> {
        Reconfigure::new(self)
    }
}
