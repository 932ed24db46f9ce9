//! The choices the crate's builders share, and one definition of each setter.
//!
//! A builder ([`ReplayBufferBuilder`](crate::ReplayBufferBuilder),
//! [`TypedBuilder`](crate::typed::TypedBuilder),
//! [`ListBuilder`](crate::list::ListBuilder),
//! [`StorageConfig`](crate::swap::StorageConfig),
//! [`EnsembleBuilder`](crate::ensemble::EnsembleBuilder)) holds a [`Settings`] and
//! names the setters it offers with [`setters!`]; each setter is written once, here.
//! A choice not made is `None`, and each builder says what that means: the defaults
//! below for a new buffer, the buffer's current value for a [`StorageConfig`].
//!
//! Layer: api.
//!
//! [`StorageConfig`]: crate::swap::StorageConfig

use crate::policy::WritePolicy;
use crate::sampler::Sampler;

/// The choices of a builder.
#[derive(Clone, Debug, Default)]
pub(crate) struct Settings {
    pub(crate) capacity: Option<usize>,
    pub(crate) shards: Option<usize>,
    pub(crate) ndim: Option<usize>,
    pub(crate) envs: Option<usize>,
    pub(crate) dim_extend: Option<usize>,
    pub(crate) batch_size: Option<usize>,
    pub(crate) seed: Option<u64>,
    pub(crate) sampler: Sampler,
    pub(crate) write_policy: WritePolicy,
}

impl Settings {
    /// Rows of a new buffer: none until chosen (a build then refuses it).
    pub(crate) fn capacity(&self) -> usize {
        self.capacity.unwrap_or(0)
    }

    /// Shards of a new buffer: 1 unless chosen.
    pub(crate) fn shards(&self) -> usize {
        self.shards.unwrap_or(1)
    }

    /// Storage dimensions of a new buffer: 1 unless chosen.
    pub(crate) fn ndim(&self) -> usize {
        self.ndim.unwrap_or(1)
    }
}

/// Setters over the builder's `settings` field (reached through
/// `settings_mut(&mut self) -> &mut Settings`), one definition each:
/// `setters!(capacity, shards, seed);` in a builder's `impl` block.
macro_rules! setters {
    ($($name:ident),* $(,)?) => {
        $($crate::settings::setters!(@ $name);)*
    };
    (@ capacity) => {
        /// Rows the storage holds (for ndim 2: `steps * envs`).
        pub fn capacity(mut self, capacity: usize) -> Self {
            self.settings_mut().capacity = Some(capacity);
            self
        }
    };
    (@ shards) => {
        /// Shards (a power of two). One shard evicts in exact FIFO order; with
        /// several, each shard is its own FIFO and collectors on different shards share
        /// no cache line. For ndim 2, shards split the environments.
        pub fn shards(mut self, shards: usize) -> Self {
            self.settings_mut().shards = Some(shards);
            self
        }
    };
    (@ ndim) => {
        /// Storage dimensions: 1, or 2 (shape `[capacity / envs, envs]`).
        pub fn ndim(mut self, ndim: usize) -> Self {
            self.settings_mut().ndim = Some(ndim);
            self
        }
    };
    (@ envs) => {
        /// Parallel environments of an ndim-2 storage.
        pub fn envs(mut self, envs: usize) -> Self {
            self.settings_mut().envs = Some(envs);
            self
        }
    };
    (@ dim_extend) => {
        /// Which dimension of an extended batch is time (TorchRL's `dim_extend`;
        /// default `ndim - 1`). For ndim 2: 0 takes `[t, envs]` batches, 1 takes
        /// `[envs, t]`.
        pub fn dim_extend(mut self, dim: usize) -> Self {
            self.settings_mut().dim_extend = Some(dim);
            self
        }
    };
    (@ batch_size) => {
        /// The default batch size of `sample_into` and `sample_default`.
        pub fn batch_size(mut self, batch_size: usize) -> Self {
            self.settings_mut().batch_size = Some(batch_size);
            self
        }
    };
    (@ seed) => {
        /// The seed of every draw. Without one the buffer seeds itself from entropy.
        pub fn seed(mut self, seed: u64) -> Self {
            self.settings_mut().seed = Some(seed);
            self
        }
    };
    (@ sampler) => {
        /// The sampler (default [`Uniform`](crate::sampler::Uniform)).
        pub fn sampler(mut self, sampler: impl Into<$crate::sampler::Sampler>) -> Self {
            self.settings_mut().sampler = sampler.into();
            self
        }
    };
    (@ write_policy) => {
        /// The write policy (default round robin).
        pub fn write_policy(mut self, policy: $crate::policy::WritePolicy) -> Self {
            self.settings_mut().write_policy = policy;
            self
        }
    };
}

pub(crate) use setters;
