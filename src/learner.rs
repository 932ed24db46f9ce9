//! The learner's handle: sampling with a random stream of its own.
//!
//! Layer: api.

use crate::batch::{Batch, Destination, Scratch};
use crate::buffer::ReplayBuffer;
use crate::error::SampleError;
use crate::rng::Rng;

/// A learner's handle (see [`ReplayBuffer::learner`]): samples with its own random
/// stream, so learners never contend for a generator, and one learner's sequence of
/// samples is reproducible under a seed whatever the others do. A clone, like a
/// clone of a random generator, goes on with a copy of this one's stream and draws
/// the very rows this one draws next (two paths compared on one sequence); a learner
/// for another thread takes a handle of its own from [`ReplayBuffer::learner`].
#[derive(Clone, Debug)]
pub struct Learner {
    buffer: ReplayBuffer,
    /// Its own stream, or `None` for the buffer's per-call ones
    /// ([`ReplayBuffer::learner_on_calls`]).
    rng: Option<Rng>,
    /// The working room of [`sample_to`](Self::sample_to) (a batch keeps its own).
    scratch: Scratch,
}

impl Learner {
    pub(crate) fn new(buffer: ReplayBuffer, rng: Option<Rng>) -> Learner {
        Learner {
            buffer,
            rng,
            scratch: Scratch::default(),
        }
    }

    /// Runs one sampling attempt on the buffer's state now, with the handle's stream
    /// or, for a handle on calls, the stream of a call numbered in that state.
    fn attempt<R>(
        buffer: &ReplayBuffer,
        rng: &mut Option<Rng>,
        f: impl FnOnce(&crate::state::State, &mut Rng) -> R,
    ) -> R {
        match rng {
            Some(rng) => f(&buffer.state(), rng),
            None => {
                let (inner, mut call) = buffer.call_stream();
                f(&inner, &mut call)
            }
        }
    }

    /// The buffer this handle samples.
    pub fn buffer(&self) -> &ReplayBuffer {
        &self.buffer
    }

    /// Samples `n` rows into a new batch.
    pub fn sample(&mut self, n: usize) -> Result<Batch, SampleError> {
        let mut batch = self.buffer.batch([0]);
        self.sample_n_into(n, &mut batch)?;
        Ok(batch)
    }

    /// Samples into `batch`, reusing its buffers (no allocation once warm). Draws the
    /// builder's `batch_size` rows, or as many as `batch` holds when none was set.
    pub fn sample_into(&mut self, batch: &mut Batch) -> Result<(), SampleError> {
        let n = self.buffer.state().core.batch_size_for(batch)?;
        self.sample_n_into(n, batch)
    }

    /// Samples up to `dest.rows()` rows straight into `dest` (memory the caller owns:
    /// no intermediate [`Batch`], and no allocation once this learner is warm) and
    /// returns how many rows were written: fewer than asked only when a
    /// without-replacement epoch ends short, as [`sample`](Self::sample) would return
    /// a shorter batch. A slice sampler writes whole slices, so `dest.rows()` must
    /// split into them as a batch size must.
    ///
    /// Refused before anything is drawn: a destination of another spec
    /// ([`SampleError::SpecMismatch`]), a prioritized sample into one without room for
    /// weights ([`SampleError::NoWeightRoom`]), and a buffer with forward transforms,
    /// which run on a [`Batch`] ([`SampleError::TransformsNeedBatch`]).
    pub fn sample_to(&mut self, dest: &mut Destination<'_>) -> Result<usize, SampleError> {
        // Inverse transforms run on writes only: no batch needed for them.
        if self.buffer.state().transforms.transforms_samples() {
            return Err(SampleError::TransformsNeedBatch);
        }
        let rows = dest.rows();
        let (buffer, rng, scratch) = (&self.buffer, &mut self.rng, &mut self.scratch);
        // The state is loaded after the rate limit's wait, as every sample path does:
        // one loaded before a long wait may have been swapped out meanwhile.
        buffer.limited_sample(rows, || {
            Learner::attempt(buffer, rng, |inner, rng| {
                Ok(inner.core.sample_to(rng, rows, dest, scratch)?)
            })
        })
    }

    /// Samples `n` rows into `batch`, reusing its buffers, transforms included.
    pub(crate) fn sample_n_into(&mut self, n: usize, batch: &mut Batch) -> Result<(), SampleError> {
        self.buffer.state().core.room_for_sample(n, batch)?;
        let (buffer, rng) = (&self.buffer, &mut self.rng);
        buffer
            .limited_sample(n, || {
                Learner::attempt(buffer, rng, |inner, rng| {
                    inner.core.sample_into(rng, n, batch)?;
                    inner.transforms.apply_drawn(batch)
                })
            })
            .map(drop)
    }
}
