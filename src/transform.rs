//! Transforms (TorchRL's `append_transform` / `insert_transform`): closures run on
//! every sampled batch, in list order, and their inverses run on written data, in
//! reverse list order (as TorchRL's `Compose.inv`).
//!
//! A buffer's transforms are shared by all its handles: every columnar sample (the
//! buffer's, a [`Learner`](crate::Learner)'s, a [`Loader`](crate::loader::Loader)'s workers')
//! runs the forward ones, and every columnar write (`add`, `extend`, a
//! [`Writer`](crate::Writer)'s, `write_all`) runs the inverse ones on a copy of the
//! caller's rows before storing them. The typed and list faces store and return their
//! values as they are.
//!
//! Changing the list is a cold-path operation: the new list is swapped in whole, so a
//! sample running meanwhile uses the old list or the new one, never a mix. With no
//! transform, a sample pays one relaxed load.
//!
//! Layer: gates.

use std::borrow::Cow;
use std::fmt;

use crate::batch::Batch;
use crate::error::SampleFailed;
use crate::error::{DataError, SampleError, Stage};
use crate::sync::{self, ArcCell, AtomicBool, Mutex, Ordering};

/// The closures are shared read-only, never part of a protocol loom checks, and
/// loom's `Arc` cannot hold a `dyn Fn`: `std`'s.
type FnArc<F> = std::sync::Arc<F>;

/// What a transform does to a batch (in place).
pub type TransformFn = dyn Fn(&mut Batch) -> Result<(), DataError> + Send + Sync;

/// A transform: a closure run on sampled batches, one run on written data (its
/// inverse), or both.
///
/// ```
/// use replaybuf::{Batch, DType, ReplayBuffer, Spec, Transform};
///
/// let spec = Spec::builder().field("reward", DType::F32, []).build()?;
/// let rb = ReplayBuffer::builder(spec).capacity(100).build()?;
/// // Rewards are stored scaled down by 10 and read back scaled up.
/// rb.append_transform(
///     Transform::new(|b: &mut Batch| {
///         b.column_mut::<f32>("reward")?.iter_mut().for_each(|r| *r *= 10.0);
///         Ok(())
///     })
///     .with_inverse(|b: &mut Batch| {
///         b.column_mut::<f32>("reward")?.iter_mut().for_each(|r| *r /= 10.0);
///         Ok(())
///     }),
/// );
/// let mut chunk = rb.batch([4]);
/// chunk.column_mut::<f32>("reward")?.fill(5.0);
/// rb.extend(&chunk)?;
/// assert_eq!(rb.get(0)?.column::<f32>("reward")?, &[0.5]); // stored
/// assert_eq!(rb.sample(2)?.column::<f32>("reward")?, &[5.0, 5.0]); // sampled
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Transform {
    forward: Option<FnArc<TransformFn>>,
    inverse: Option<FnArc<TransformFn>>,
}

impl Transform {
    /// A transform of sampled batches.
    pub fn new(f: impl Fn(&mut Batch) -> Result<(), DataError> + Send + Sync + 'static) -> Self {
        Transform {
            forward: Some(FnArc::new(f)),
            inverse: None,
        }
    }

    /// A transform of written data only (TorchRL's `invert=True`).
    pub fn inverse(
        f: impl Fn(&mut Batch) -> Result<(), DataError> + Send + Sync + 'static,
    ) -> Self {
        Transform {
            forward: None,
            inverse: Some(FnArc::new(f)),
        }
    }

    /// Adds the inverse: what written data goes through before it is stored.
    pub fn with_inverse(
        mut self,
        f: impl Fn(&mut Batch) -> Result<(), DataError> + Send + Sync + 'static,
    ) -> Self {
        self.inverse = Some(FnArc::new(f));
        self
    }
}

impl<F> From<F> for Transform
where
    F: Fn(&mut Batch) -> Result<(), DataError> + Send + Sync + 'static,
{
    fn from(f: F) -> Self {
        Transform::new(f)
    }
}

impl fmt::Debug for Transform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transform")
            .field("forward", &self.forward.is_some())
            .field("inverse", &self.inverse.is_some())
            .finish()
    }
}

/// A buffer's transforms.
#[derive(Debug)]
pub(crate) struct Transforms {
    /// Whether any transform has a forward part / an inverse part: the fast check of
    /// every sample and write. Stored after the list (Release), loaded before it
    /// (Acquire).
    forward: AtomicBool,
    inverse: AtomicBool,
    /// The list, swapped in whole by every change.
    list: ArcCell<Vec<Transform>>,
    /// Serialises changes (read, copy, swap).
    edit: Mutex<()>,
}

impl Default for Transforms {
    fn default() -> Self {
        Transforms {
            forward: AtomicBool::new(false),
            inverse: AtomicBool::new(false),
            list: ArcCell::empty(),
            edit: Mutex::new(()),
        }
    }
}

impl Transforms {
    /// [`Transforms::apply`] on a batch just drawn: the rows drawn (counted before
    /// the transforms, which may change the batch's length), or the transforms'
    /// failure after them (the rate limit counts them drawn all the same).
    #[inline]
    pub(crate) fn apply_drawn(&self, batch: &mut Batch) -> Result<usize, SampleFailed> {
        let drawn = batch.len();
        match self.apply(batch) {
            Ok(()) => Ok(drawn),
            Err(error) => Err(SampleFailed { drawn, error }),
        }
    }

    /// Runs the forward transforms on a sampled batch, in order.
    #[inline]
    pub(crate) fn apply(&self, batch: &mut Batch) -> Result<(), SampleError> {
        // SYNC POINT: pairs with the Release store in `change`: the list loaded next
        // is at least the one the flag was set for.
        if !self.forward.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(list) = self.list.load() else {
            return Ok(());
        };
        for (position, t) in list.iter().enumerate() {
            if let Some(f) = &t.forward {
                f(batch).map_err(|error| SampleError::Pipeline {
                    stage: Stage::Transform(position),
                    error: Box::new(error),
                })?;
            }
        }
        Ok(())
    }

    /// Whether a forward transform may change the rows sampled.
    pub(crate) fn transforms_samples(&self) -> bool {
        // SYNC POINT: pairs with the Release store in `change`.
        self.forward.load(Ordering::Acquire)
    }

    /// Whether an inverse transform may change the rows written.
    pub(crate) fn inverts(&self) -> bool {
        // SYNC POINT: pairs with the Release store in `change`.
        self.inverse.load(Ordering::Acquire)
    }

    /// The rows to write: `batch` itself, or a copy through the inverse transforms, in
    /// reverse order.
    #[inline]
    pub(crate) fn invert<'a>(&self, batch: &'a Batch) -> Result<Cow<'a, Batch>, DataError> {
        // SYNC POINT: pairs with the Release store in `change`.
        if !self.inverse.load(Ordering::Acquire) {
            return Ok(Cow::Borrowed(batch));
        }
        let Some(list) = self.list.load() else {
            return Ok(Cow::Borrowed(batch));
        };
        let mut copy = batch.clone();
        for t in list.iter().rev() {
            if let Some(f) = &t.inverse {
                f(&mut copy)?;
            }
        }
        Ok(Cow::Owned(copy))
    }

    /// Replaces the list by `change` of a copy of it.
    pub(crate) fn change<R>(&self, change: impl FnOnce(&mut Vec<Transform>) -> R) -> R {
        let _held = self.edit.lock();
        let mut list = self.list.load().map_or_else(Vec::new, |l| (*l).clone());
        let out = change(&mut list);
        let forward = list.iter().any(|t| t.forward.is_some());
        let inverse = list.iter().any(|t| t.inverse.is_some());
        self.list
            .store((!list.is_empty()).then(|| sync::Arc::new(list)));
        // SYNC POINT: pairs with the Acquire loads in `apply` and `invert`.
        self.forward.store(forward, Ordering::Release);
        self.inverse.store(inverse, Ordering::Release);
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.list.load().map_or(0, |l| l.len())
    }
}
