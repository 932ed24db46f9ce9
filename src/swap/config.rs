//! What a swap is asked for: a new storage's shape and backing ([`StorageConfig`]),
//! and several changes made at once ([`Reconfigure`]).
//!
//! Layer: api.

use std::path::PathBuf;

use crate::buffer::ReplayBuffer;
use crate::builder::ReplayBufferBuilder;
use crate::key::Key;
use crate::policy::WritePolicy;
use crate::sampler::Sampler;
use crate::settings::Settings;

/// A new storage for [`ReplayBuffer::set_storage`] (TorchRL's `LazyTensorStorage` and
/// `LazyMemmapStorage`): on the heap or in a file-backed directory, with a shape whose
/// every choice not made here stays as the buffer has it now.
///
/// ```
/// use replaybuf::swap::StorageConfig;
///
/// let bigger = StorageConfig::heap().capacity(2_000_000);
/// let grid = StorageConfig::heap().capacity(8_000).ndim(2).envs(8).shards(2);
/// let on_disk = StorageConfig::memmap("/tmp/replay");
/// # let _ = (bigger, grid, on_disk);
/// ```
#[derive(Clone, Debug, Default)]
pub struct StorageConfig {
    memmap: Option<PathBuf>,
    /// Capacity, shards, ndim, envs, `dim_extend`: those not chosen stay as the buffer
    /// has them (a change of ndim resets `dim_extend` to its default, `ndim - 1`,
    /// unless one is given).
    settings: Settings,
}

impl StorageConfig {
    crate::settings::setters!(capacity, shards, ndim, envs, dim_extend);

    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }

    /// A heap storage (lazily allocated, as the builder makes one).
    pub fn heap() -> StorageConfig {
        StorageConfig::default()
    }

    /// A file-backed storage under `dir` (see
    /// [`ReplayBufferBuilder::memmap`](crate::ReplayBufferBuilder::memmap)). The
    /// directory must not hold a buffer already: a swap never opens an existing one.
    pub fn memmap(dir: impl Into<PathBuf>) -> StorageConfig {
        StorageConfig {
            memmap: Some(dir.into()),
            ..StorageConfig::default()
        }
    }

    /// Writes these choices over `b`, a builder of the buffer's current configuration.
    pub(super) fn apply_to(&self, b: &mut ReplayBufferBuilder) {
        let (mine, theirs) = (&self.settings, &mut b.settings);
        let ndim = mine.ndim.unwrap_or(theirs.ndim());
        if ndim != theirs.ndim() {
            theirs.dim_extend = None;
            if ndim == 1 {
                theirs.envs = None;
            }
        }
        theirs.ndim = Some(ndim);
        theirs.capacity = mine.capacity.or(theirs.capacity);
        theirs.shards = mine.shards.or(theirs.shards);
        if mine.envs.is_some() {
            theirs.envs = mine.envs;
        }
        if mine.dim_extend.is_some() {
            theirs.dim_extend = mine.dim_extend;
        }
        b.memmap = self.memmap.clone();
    }
}

/// Several changes to a built buffer, made by one swap (see
/// [`ReplayBuffer::reconfigure`]); nothing happens until [`apply`](Self::apply).
#[derive(Debug)]
#[must_use = "a reconfiguration does nothing until `apply`"]
pub struct Reconfigure<'a> {
    pub(super) buffer: &'a ReplayBuffer,
    pub(super) change: Change,
}

/// The changes asked for.
#[derive(Clone, Debug, Default)]
pub(super) struct Change {
    pub(super) sampler: Option<Sampler>,
    pub(super) writer: Option<WritePolicy>,
    pub(super) storage: Option<StorageConfig>,
    pub(super) priority_key: Option<Key>,
}

impl<'a> Reconfigure<'a> {
    pub(super) fn new(buffer: &'a ReplayBuffer) -> Self {
        Reconfigure {
            buffer,
            change: Change::default(),
        }
    }

    /// A new sampler (see [`ReplayBuffer::set_sampler`]).
    pub fn sampler(mut self, sampler: impl Into<Sampler>) -> Self {
        self.change.sampler = Some(sampler.into());
        self
    }

    /// A new write policy (see [`ReplayBuffer::set_write_policy`]).
    pub fn write_policy(mut self, writer: WritePolicy) -> Self {
        self.change.writer = Some(writer);
        self
    }

    /// A new storage (see [`ReplayBuffer::set_storage`]).
    pub fn storage(mut self, storage: StorageConfig) -> Self {
        self.change.storage = Some(storage);
        self
    }

    /// The field holding priorities (see
    /// [`ReplayBufferBuilder::priority_key`](crate::ReplayBufferBuilder::priority_key)),
    /// for a prioritized sampler. Without it a swap keeps the buffer's priority key
    /// while the sampler stays prioritized, and drops it otherwise.
    pub fn priority_key(mut self, key: impl Into<Key>) -> Self {
        self.change.priority_key = Some(key.into());
        self
    }
}
