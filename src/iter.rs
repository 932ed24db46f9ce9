//! Iteration: a buffer read batch by batch (TorchRL's `for batch in rb`), until a
//! without-replacement epoch runs out.
//!
//! Layer: faces.

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::error::SampleError;
use crate::learner::Learner;

/// Batches of a buffer, drawn by a learner handle of their own: see
/// [`ReplayBuffer::batches`].
#[derive(Debug)]
pub struct Batches {
    learner: Learner,
    /// Rows per batch, or why there is no batch size.
    rows: Result<usize, SampleError>,
}

impl ReplayBuffer {
    /// Iterates over batches of `rows` rows (transforms included). With a
    /// without-replacement sampler the iteration ends when the epoch runs out, and the
    /// next one starts the next epoch; with replacement it never ends. Any other
    /// error (an empty buffer, say) is its last item.
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec};
    /// use replaybuf::sampler::WithoutReplacement;
    ///
    /// let spec = Spec::builder().field("x", DType::I64, []).build()?;
    /// let rb = ReplayBuffer::builder(spec)
    ///     .capacity(100)
    ///     .sampler(WithoutReplacement::new())
    ///     .build()?;
    /// rb.extend(&rb.batch([100]))?;
    /// let sizes: Vec<usize> = rb.batches(32).map(|b| b.map(|b| b.len())).collect::<Result<_, _>>()?;
    /// assert_eq!(sizes, [32, 32, 32, 4]); // one epoch
    /// assert_eq!(rb.batches(50).count(), 2); // the next one
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn batches(&self, rows: usize) -> Batches {
        Batches {
            learner: self.learner(),
            // Batches of no rows would never end an epoch: no batch size.
            rows: if rows == 0 {
                Err(SampleError::NoBatchSize)
            } else {
                Ok(rows)
            },
        }
    }
}

impl Iterator for Batches {
    type Item = Result<Batch, SampleError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rows = match &mut self.rows {
            Ok(rows) => *rows,
            // Said once, then the iteration ends (a `for` loop over it would not).
            Err(SampleError::EpochEnd) => return None,
            Err(e) => return Some(Err(std::mem::replace(e, SampleError::EpochEnd))),
        };
        let mut batch = self.learner.buffer().batch([0]);
        match self.learner.sample_n_into(rows, &mut batch) {
            Ok(()) => Some(Ok(batch)),
            Err(SampleError::EpochEnd) => None,
            // Said, then the iteration ends: a loop that skips errors (or `count`)
            // would otherwise spin on one that stays (fewer rows than a batch under
            // `drop_last`, an empty buffer), as TorchRL's loop raises and stops.
            Err(e) => {
                self.rows = Err(SampleError::EpochEnd);
                Some(Err(e))
            }
        }
    }
}

/// Iterates over batches of the builder's `batch_size` (see [`ReplayBuffer::batches`]);
/// without one, the one item is [`SampleError::NoBatchSize`].
impl IntoIterator for &ReplayBuffer {
    type Item = Result<Batch, SampleError>;
    type IntoIter = Batches;

    fn into_iter(self) -> Batches {
        Batches {
            learner: self.learner(),
            rows: self.state().core.batch_size.ok_or(SampleError::NoBatchSize),
        }
    }
}
