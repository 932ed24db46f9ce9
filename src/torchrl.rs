//! TorchRL's vocabulary, for code coming from `torchrl.data.ReplayBuffer`.
//!
//! The buffer's own methods speak Rust; [`TorchRl`] gives a [`ReplayBuffer`] or a
//! [`TypedBuffer`] TorchRL's names for the same operations, and the trainer adapter
//! ([`ReplayBufferTrainer`]) does a TorchRL trainer's replay-buffer hooks. The names
//! map one to one:
//!
//! | TorchRL | replaybuf |
//! |---|---|
//! | `rb.empty()` | [`ReplayBuffer::clear`] |
//! | `rb.dumps(path)` | [`ReplayBuffer::save`] |
//! | `rb.loads(path)` | [`ReplayBuffer::restore`] |
//! | `ReplayBuffer(...)` then `loads(path)` | [`ReplayBuffer::from_checkpoint`] |
//! | `rb.set_writer(writer)` | [`ReplayBuffer::set_write_policy`] |
//! | `rb.set_sampler(s)`, `rb.set_storage(s)` | the same names |
//! | `rb.extend(td)`, `rb.add(td)`, `rb.sample()` | `extend`, `add`, [`ReplayBuffer::sample_default`] |
//! | `rb.update_priority(index, priority)` | [`ReplayBuffer::update_priority`] (with generations) |
//! | `rb[:]`, `rb[:] = data` | [`ReplayBuffer::read_all_in_order`], [`ReplayBuffer::write_all`] |
//! | `rb[index]`, `rb[index] = data` | [`ReplayBuffer::get_many`], [`ReplayBuffer::write_at`] |
//! | `RoundRobinWriter`, `ImmutableDatasetWriter`, `TensorDictMaxValueWriter` | [`WritePolicy`] |
//! | `LazyMemmapStorage`, `ListStorage` | [`ReplayBufferBuilder::memmap`](crate::ReplayBufferBuilder::memmap), [`ListBuffer`](crate::list::ListBuffer) |
//!
//! Layer: faces.
//!
//! ```
//! use replaybuf::torchrl::TorchRl;
//! use replaybuf::{DType, ReplayBuffer, Spec};
//!
//! let spec = Spec::builder().field("obs", DType::F32, [2]).build()?;
//! let rb = ReplayBuffer::builder(spec).capacity(100).build()?;
//! rb.extend(&rb.batch([10]))?;
//! rb.empty();
//! assert!(rb.is_empty());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;

use bytemuck::Pod;

use crate::buffer::ReplayBuffer;
use crate::error::{DataError, PersistError, SwapError};
use crate::policy::WritePolicy;
use crate::typed::TypedBuffer;

pub use crate::trainer::{ReplayBufferTrainer, TrainerBuilder, PAD_MASK};

/// TorchRL's names for a buffer's operations (see the module's table).
pub trait TorchRl {
    /// Drops every stored row: [`ReplayBuffer::clear`] (refused by an immutable
    /// buffer, as TorchRL's `empty` is).
    fn empty(&self) -> Result<(), DataError>;

    /// Saves the buffer's whole state under `dir`: [`ReplayBuffer::save`].
    fn dumps(&self, dir: impl AsRef<Path>) -> Result<(), PersistError>;

    /// Loads a checkpoint into this buffer: [`ReplayBuffer::restore`].
    fn loads(&mut self, dir: impl AsRef<Path>) -> Result<(), PersistError>;

    /// Replaces the write policy: [`ReplayBuffer::set_write_policy`].
    fn set_writer(&self, writer: WritePolicy) -> Result<(), SwapError>;
}

impl TorchRl for ReplayBuffer {
    fn empty(&self) -> Result<(), DataError> {
        self.clear()
    }

    fn dumps(&self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.save(dir)
    }

    fn loads(&mut self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.restore(dir)
    }

    fn set_writer(&self, writer: WritePolicy) -> Result<(), SwapError> {
        self.set_write_policy(writer)
    }
}

impl<T: Pod + Send + Sync> TorchRl for TypedBuffer<T> {
    fn empty(&self) -> Result<(), DataError> {
        self.clear()
    }

    fn dumps(&self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.save(dir)
    }

    fn loads(&mut self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.restore(dir)
    }

    fn set_writer(&self, writer: WritePolicy) -> Result<(), SwapError> {
        self.set_write_policy(writer)
    }
}
