//! # replaybuf
//!
//! A replay buffer for reinforcement learning: collector threads extend it while
//! learner threads sample it, with no lock between them, and a sampled row is never
//! torn.
//!
//! - Rows are stored row-major in sharded rings ([`ReplayBufferBuilder::shards`]); each
//!   shard has its own atomic cursor, so collectors on different shards never share a
//!   cache line.
//! - Every slot carries a version stamp. Readers copy rows with race-free atomic loads
//!   and re-check the stamp; a row overwritten mid-copy is redrawn, never returned.
//!   The ordering argument is in [`docs::orderings`]; loom checks it.
//! - Batches are columnar ([`Batch`]): one contiguous typed slice per field.
//! - `#[repr(C)]` [`bytemuck::Pod`] transitions use [`TypedBuffer`](typed::TypedBuffer), any
//!   `T: Clone + Send + Sync` uses [`ListBuffer`](list::ListBuffer); one engine under all three.
//!
//! ```
//! use replaybuf::{DType, ReplayBuffer, Spec};
//!
//! let spec = Spec::builder()
//!     .field("obs", DType::F32, [3])
//!     .field("action", DType::I64, [])
//!     .field(("next", "obs"), DType::F32, [3])
//!     .field("done", DType::Bool, [])
//!     .build()?;
//! let rb = ReplayBuffer::builder(spec).capacity(10_000).seed(0).build()?;
//!
//! // A collector thread:
//! let writer = rb.writer();
//! let mut chunk = rb.batch([100]);
//! chunk.column_mut::<i64>("action")?.fill(2);
//! writer.extend(&chunk)?;
//!
//! // A learner thread:
//! let mut learner = rb.learner();
//! let batch = learner.sample(32)?;
//! assert_eq!(batch.column::<i64>("action")?, &[2; 32]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod docs;

// The layers, lowest first (see `docs::architecture`). Public modules group the
// surface as rayon groups its own: the core types at the root, everything else in
// the module of its topic.

// base
mod cpu;
mod dtype;
pub mod error;
mod key;
mod powers;
mod rng;
mod spec;
mod sync;
// algos
mod batch;
mod region;
pub mod sampler;
pub mod shared;
mod storage;
mod sumtree;
// core
mod backing;
mod config;
mod core;
// gates
mod max_value;
mod policy;
mod transform;
// state
mod hooks;
mod state;
// api
mod buffer;
mod builder;
pub mod checkpoint;
mod frames;
mod learner;
mod rate_limit;
mod settings;
pub mod swap;
mod writer;
// faces
pub mod ensemble;
mod iter;
pub mod list;
pub mod loader;
mod prefetch;
#[cfg(feature = "reference")]
pub mod reference;
pub mod tmrl;
pub mod torchrl;
mod trainer;
pub mod trajectories;
pub mod typed;

pub use batch::{Batch, Destination, View, PADDING_INDEX};
pub use buffer::{PriorityMass, ReplayBuffer, RowBytes};
pub use builder::{ReplayBufferBuilder, MAX_SHARDS};
pub use core::Written;
pub use dtype::{DType, Element};
pub use error::PriorityUpdate;
pub use error::RateLimitError;
pub use frames::{Frames, StackFill};
pub use key::{Key, KeyLike};
pub use learner::Learner;
pub use policy::WritePolicy;
pub use rate_limit::{RateLimit, RateLimitStats};
pub use spec::{Field, Spec, SpecBuilder, MAX_ROW_BYTES};
pub use transform::{Transform, TransformFn};
pub use writer::Writer;

/// The crate's own internals, for its loom tests, benches, fuzz targets and the
/// tests that look inside: only with the `internals` feature, and not part of the
/// API (anything here may change in any release).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    /// A shared region's rate limiter (`rate_limit/shared.rs`), over a heap region of
    /// its own (its loom model).
    #[cfg(target_os = "linux")]
    pub use crate::rate_limit::shared::RegionRateLimiter;
    /// The rate limiter of `rate_limit.rs`, on its own (its loom model).
    pub use crate::rate_limit::RateLimiter;
    pub use crate::storage::atomic_copy::{load, store};
    /// The atomic word of the crate's regions (`std`'s, or loom's under loom).
    pub use crate::sync::AtomicU64;
    /// The concurrent trees of `sumtree/` and their locked twin.
    pub mod sumtree {
        pub use crate::sumtree::reference::ReferenceTree;
        pub use crate::sumtree::{leaf_mass, quantize, value_max, Leaf, OwnedTree};
    }
    /// Whether every tree entry of a prioritized buffer equals what its children give
    /// (true whenever no update is in flight): the stress tests' final check.
    pub fn priorities_consistent(rb: &crate::ReplayBuffer) -> bool {
        rb.state()
            .core
            .storage
            .trees()
            .iter()
            .all(|t| t.is_consistent())
    }
    /// The leaf and raw word (lap, priority) of shard 0's slot `i` (debugging aid).
    pub fn leaf_and_raw(
        rb: &crate::ReplayBuffer,
        i: usize,
    ) -> Option<(crate::sumtree::Leaf, (u32, Option<f64>))> {
        let inner = rb.state();
        let trees = inner.core.storage.trees();
        trees.first().map(|t| (t.leaf(i), t.raw_tagged(i)))
    }
    /// Whether every leaf of a prioritized buffer holds the mass of its raw priority
    /// under the buffer's mass function now (true whenever no write is in flight): a
    /// leaf whose raw word names another row, or none, is skipped.
    pub fn masses_current(rb: &crate::ReplayBuffer) -> bool {
        let inner = rb.state();
        let Some(state) = inner.core.sampler.prioritized() else {
            return true;
        };
        let trees = inner.core.storage.trees();
        let current = trees.iter().all(|t| {
            let f = state.mass_fn(t);
            (0..t.layout().leaves).all(|i| {
                let leaf = t.leaf(i);
                match t.raw_tagged(i) {
                    (lap, Some(p)) if leaf.is_of(lap) => f
                        .mass(p)
                        .is_ok_and(|m| crate::sumtree::leaf_mass(m) == leaf.value()),
                    (lap, None) if leaf.is_of(lap) => leaf.value() == 0,
                    _ => true,
                }
            })
        });
        current
    }
    /// How an append of `steps` rows into shard 0, by its only appender, stores them:
    /// `None` if it marks its slots, `Some(true)` if it streams them past the caches
    /// (non-temporal stores), `Some(false)` if it streams them through the cache
    /// (`Storage::stream_rows`).
    pub fn stream_of(rb: &crate::ReplayBuffer, steps: u64) -> Option<bool> {
        let inner = rb.state();
        let storage = &inner.core.storage;
        storage
            .stream_sized(0, steps)
            .then(|| storage.past_caches(storage.shards()[0].ring()))
    }
    /// What a frozen storage looks like (see `storage/freeze.rs`): taken while the
    /// storage is frozen, so no writer can be inside.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct FrozenView {
        /// Sequence numbers claimed, over all shards.
        pub claimed: u64,
        /// Slots holding a published row.
        pub published: u64,
        /// Slots marked as being written.
        pub writing: u64,
        /// Whether every tree entry equals what its children give.
        pub trees_consistent: bool,
    }
    /// Freezes the buffer's storage, looks at it, and thaws it.
    pub fn frozen_view(rb: &crate::ReplayBuffer) -> FrozenView {
        let inner = rb.state();
        let storage = &inner.core.storage;
        let _frozen = storage.freeze();
        let mut view = FrozenView {
            claimed: storage.shards().iter().map(|s| s.window().hi).sum(),
            published: 0,
            writing: 0,
            trees_consistent: storage.trees().iter().all(|t| t.is_consistent()),
        };
        for slot in 0..storage.geometry().capacity() {
            let stamp = storage.stamp_at(slot);
            view.published += u64::from(stamp.is_published());
            view.writing += u64::from(stamp.is_writing());
        }
        view
    }
    /// The slot protocol of `storage/stamp.rs`.
    pub mod stamp {
        pub use crate::storage::stamp::{
            begin_append, begin_edit, begin_read, publish, validate, Claim, Prev, Stamp,
        };
    }
}

/// Re-exported so that users derive [`bytemuck::Pod`] for [`TypedBuffer`](typed::TypedBuffer) rows with
/// the same version the crate uses.
pub use bytemuck;
/// Re-exported for [`DType::F16`] / [`DType::BF16`] views.
pub use half;
