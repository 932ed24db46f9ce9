//! Samplers: which stored rows a batch draws.
//!
//! A sampler sees the storage only through its shards' live windows (a read-only
//! snapshot of `lo..hi` per ring) and a seeded generator; it returns `Draw`s, which
//! the buffer then copies out. It never writes the storage, so any number of learners
//! sample while collectors write.
//!
//! - [`Uniform`]: with replacement, every live row equally likely.
//! - [`WithoutReplacement`]: epochs over the rows live when the epoch began.
//! - [`Prioritized`]: in proportion to priority, on the concurrent segment trees.
//! - [`Slice`]: windows of consecutive steps of one trajectory, with replacement,
//!   without (in epochs), or by priority.
//! - [`Fifo`]: every row once, oldest first (a queue).
//!
//! Layer: algos.

pub(crate) mod fifo;
pub(crate) mod leaf_writes;
pub(crate) mod mass_scale;
pub(crate) mod prioritized;
pub(crate) mod slice;
mod uniform;
pub(crate) mod without_replacement;

pub use fifo::Fifo;
pub use prioritized::{Prioritized, Reduction};
pub use slice::{Marks, Slice, SlicePriority};
pub use without_replacement::WithoutReplacement;

use crate::error::SampleError;
use crate::region::Block;
use crate::rng::Rng;
use crate::storage::shard::{Shard, Window};
use crate::storage::{Draw, Miss, Storage, Want};
use crate::sync::Backoff;

/// Draws tried for one row before a sample gives up with [`SampleError::Starved`].
const MAX_ATTEMPTS_PER_ROW: u32 = 1 << 20;
/// Misses after which a redrawing read reloads the shard windows: the writers have
/// moved on since the snapshot.
const REFRESH_AFTER_MISSES: u32 = 8;
/// Misses of a row being written after which a FIFO or epoch read asks whether the row
/// is lost ([`OnMiss::Exact`], [`OnMiss::Retry`]): its writer may have died. About a
/// millisecond of waiting.
const LOST_CHECK_MISSES: u32 = 256;

/// Uniform sampling with replacement (TorchRL `RandomSampler`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uniform;

/// Which sampler a buffer uses.
#[derive(Clone, Debug, PartialEq)]
pub enum Sampler {
    /// See [`Uniform`].
    Uniform(Uniform),
    /// See [`WithoutReplacement`].
    WithoutReplacement(WithoutReplacement),
    /// See [`Prioritized`].
    Prioritized(Prioritized),
    /// See [`Slice`].
    Slice(Slice),
    /// See [`Fifo`].
    Fifo(Fifo),
}

impl From<Fifo> for Sampler {
    fn from(f: Fifo) -> Self {
        Sampler::Fifo(f)
    }
}

impl From<Slice> for Sampler {
    fn from(s: Slice) -> Self {
        Sampler::Slice(s)
    }
}

impl From<Prioritized> for Sampler {
    fn from(p: Prioritized) -> Self {
        Sampler::Prioritized(p)
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::Uniform(Uniform)
    }
}

impl From<Uniform> for Sampler {
    fn from(u: Uniform) -> Self {
        Sampler::Uniform(u)
    }
}

impl From<WithoutReplacement> for Sampler {
    fn from(w: WithoutReplacement) -> Self {
        Sampler::WithoutReplacement(w)
    }
}

/// A sampler with its running state.
#[derive(Debug)]
pub(crate) enum SamplerEngine {
    Uniform,
    WithoutReplacement(without_replacement::Epochs),
    Prioritized(prioritized::Priorities),
    Slice(slice::SliceState),
    Fifo,
}

impl SamplerEngine {
    /// The engine of `sampler`, whose shared state lives in the region's `globals`.
    pub(crate) fn new(sampler: Sampler, seed: u64, globals: Block) -> SamplerEngine {
        match sampler {
            Sampler::Uniform(_) => SamplerEngine::Uniform,
            Sampler::WithoutReplacement(w) => {
                SamplerEngine::WithoutReplacement(without_replacement::Epochs::new(w, seed))
            }
            Sampler::Prioritized(p) => {
                SamplerEngine::Prioritized(prioritized::Priorities::new(p, globals))
            }
            Sampler::Slice(s) => SamplerEngine::Slice(slice::SliceState::new(s, seed, globals)),
            Sampler::Fifo(_) => SamplerEngine::Fifo,
        }
    }

    /// What is wrong with the engine's shared state in a region made before (opened
    /// again or attached to), if anything.
    pub(crate) fn damage(&self) -> Option<String> {
        self.prioritized().and_then(prioritized::Priorities::damage)
    }

    /// Writes the engine's initial shared state into a new region.
    pub(crate) fn initialize(&self) {
        if let Some(state) = self.prioritized() {
            state.initialize();
        }
    }

    /// The slice sampler's settings, if this is one.
    pub(crate) fn slice(&self) -> Option<&Slice> {
        self.slice_state().map(|s| &s.cfg)
    }

    /// The slice sampler's state, if this is one.
    pub(crate) fn slice_state(&self) -> Option<&slice::SliceState> {
        match self {
            SamplerEngine::Slice(s) => Some(s),
            _ => None,
        }
    }

    /// The priorities' state of a prioritized sampler, slices included.
    pub(crate) fn prioritized(&self) -> Option<&prioritized::Priorities> {
        match self {
            SamplerEngine::Prioritized(state) => Some(state),
            SamplerEngine::Slice(slice::SliceState {
                priorities: Some(state),
                ..
            }) => Some(state),
            _ => None,
        }
    }

    /// Recovers `storage` after a crash, a reopening or a load (`storage/recover.rs`),
    /// then rebuilds a prioritized buffer's trees from its live rows' raw priorities.
    pub(crate) fn recover(&self, storage: &Storage) {
        storage.recover();
        if let Some(state) = self.prioritized() {
            let live = storage.live_priorities();
            state.rebuild(&storage.trees(), |k, leaf| {
                live(k, leaf).filter(|&(_, p)| prioritized::valid(p))
            });
        }
    }

    /// Forgets the running state that refers to stored rows (after `empty`): the open
    /// without-replacement epoch ends, and new rows' priority is the initial one again,
    /// not the largest seen before (TorchRL's `PrioritizedSampler._empty`).
    pub(crate) fn reset(&self) {
        if let Some(state) = self.prioritized() {
            state.forget_seen();
        }
        match self {
            SamplerEngine::WithoutReplacement(epochs) => epochs.close(),
            SamplerEngine::Slice(slice::SliceState {
                epochs: Some(epochs),
                ..
            }) => epochs.close(),
            _ => {}
        }
    }

    /// The open without-replacement epoch's items not yet handed out (rows, or a
    /// slice sampler's windows); `None` for other samplers, or with no epoch open.
    pub(crate) fn epoch_left(&self) -> Option<u64> {
        match self {
            SamplerEngine::WithoutReplacement(epochs) => epochs.left(),
            SamplerEngine::Slice(slice::SliceState {
                epochs: Some(epochs),
                ..
            }) => epochs.left(),
            _ => None,
        }
    }

    /// What a read of this sampler's draws accepts at the slot.
    pub(crate) fn want(&self) -> Want {
        match self {
            SamplerEngine::WithoutReplacement(_) => Want::AtLeast,
            _ => Want::Exact,
        }
    }

    /// What a read of this sampler's draws does with a draw that misses, for the
    /// samplers that draw without trees or lanes: a uniform draw is replaced by a
    /// fresh one (`redraw`), a read by position waits for the row there, and a FIFO
    /// read waits for its row, or ends if it was overwritten or is `lost` (see
    /// [`Self::settle`], [`OnMiss::Exact`]); an epoch's read waits for its row, or
    /// takes the epoch's next one in place of a `lost` row.
    pub(crate) fn on_miss<'a>(
        &'a self,
        redraw: &'a mut dyn FnMut(bool) -> Option<Draw>,
        lost: &'a dyn Fn(Draw) -> bool,
    ) -> OnMiss<'a> {
        match self {
            SamplerEngine::WithoutReplacement(epochs) => OnMiss::Retry { lost, epochs },
            SamplerEngine::Fifo => OnMiss::Exact(lost),
            _ => OnMiss::Redraw(redraw),
        }
    }

    /// Whether the batch read from `draws` stands (`read`: how the read went; `rounds`:
    /// the tries before this one, which the caller keeps from 0). Every batch does but
    /// a FIFO one whose rows another learner took first, or one of whose rows was
    /// overwritten before it was read: `Ok(false)` asks for it to be drawn and read
    /// again (`fifo.rs`).
    pub(crate) fn settle(
        &self,
        shards: &[Shard],
        draws: &[Draw],
        read: Result<(), SampleError>,
        rounds: &mut u32,
    ) -> Result<bool, SampleError> {
        match self {
            SamplerEngine::Fifo => fifo::settle(shards, draws, read, rounds),
            _ => read.map(|()| true),
        }
    }

    /// Draws up to `n` rows into `out` (exactly `n`, except for the last batch of a
    /// without-replacement epoch without `drop_last`, or of a FIFO queue with fewer
    /// rows waiting). A FIFO queue skips the rows `lost`, if given, says will never be
    /// read.
    pub(crate) fn draw(
        &self,
        shards: &[Shard],
        windows: &[Window],
        rng: &mut Rng,
        n: usize,
        out: &mut Vec<Draw>,
        lost: Option<&dyn Fn(Draw) -> bool>,
    ) -> Result<(), SampleError> {
        out.clear();
        match self {
            SamplerEngine::Uniform => uniform::draw(shards, windows, rng, n, out),
            SamplerEngine::WithoutReplacement(epochs) => epochs.draw(shards, windows, n, out),
            SamplerEngine::Fifo => fifo::draw(shards, windows, rng, n, out, lost),
            SamplerEngine::Prioritized(_) => {
                unreachable!("replaybuf internal error: prioritized draws need the trees")
            }
            SamplerEngine::Slice(_) => {
                unreachable!("replaybuf internal error: slices are drawn and read together")
            }
        }
    }
}

/// How [`read_draws`] handles a draw that misses.
pub(crate) enum OnMiss<'a> {
    /// Replace it by a fresh draw (sampling with replacement). The closure is told
    /// when to reload its snapshot of the shards first: the writers have moved on.
    Redraw(&'a mut dyn FnMut(bool) -> Option<Draw>),
    /// Read the same position again until its row is whole: an epoch's draw, which
    /// takes a later lap's row there too. A row that is gone (dropped), or being
    /// written and `lost`, asked every [`LOST_CHECK_MISSES`] misses, says will never
    /// be (as for `Exact`), is replaced by the epoch's next row; the read ends with
    /// [`SampleError::EpochEnd`] if none is left.
    Retry {
        lost: &'a dyn Fn(Draw) -> bool,
        epochs: &'a without_replacement::Epochs<Draw>,
    },
    /// As `Retry`, giving up with [`SampleError::Starved`] after this many misses of
    /// one row (a read by position that may meet a dead process's row).
    RetryUpTo(u32),
    /// As `Retry`, but a row that is gone ends the read with [`SampleError::Empty`]:
    /// a FIFO batch, which is drawn again. So does a row being written that the
    /// closure, asked every [`LOST_CHECK_MISSES`] misses, says is lost: its writer
    /// died (the closure takes the dead writers' shards over first). The next draw
    /// skips it.
    Exact(&'a dyn Fn(Draw) -> bool),
}

/// The uniform redraw: a fresh pick among the live rows of `windows`, reloaded from
/// the shards when asked.
pub(crate) fn uniform_redraw<'a>(
    shards: &'a [Shard],
    windows: &'a mut Vec<Window>,
    rng: &'a mut Rng,
) -> impl FnMut(bool) -> Option<Draw> + 'a {
    move |refresh| {
        if refresh {
            windows.clear();
            windows.extend(shards.iter().map(Shard::window));
        }
        uniform::pick(shards, windows, uniform::live_rows(shards, windows), rng)
    }
}

/// Reads every draw with `read`, which copies the row of a draw into output row `k`
/// and returns its (generation, index); it is told whether the draw is `draws[k]`
/// itself (the first attempt) or a redraw. A draw that misses is redrawn or retried as
/// `on_miss` says ([`read_after_miss`]); the generations and indices of the rows read
/// land in the outputs.
pub(crate) fn read_draws(
    draws: &[Draw],
    mut on_miss: OnMiss<'_>,
    mut read: impl FnMut(Draw, usize, bool) -> Result<(u64, u64), Miss>,
    generation: &mut [u64],
    index: &mut [u64],
) -> Result<(), SampleError> {
    for (k, &first) in draws.iter().enumerate() {
        let (g, i) = match read(first, k, true) {
            Ok(read) => read,
            Err(miss) => read_after_miss(first, k, miss, &mut on_miss, &mut read)?,
        };
        generation[k] = g;
        index[k] = i;
    }
    Ok(())
}

/// Output row `k`'s read after its first, of `first`, missed with `miss`: the draw
/// redrawn or retried as `on_miss` says, and read with `read` (told it is not the
/// first attempt) until a read lands, or the misses reach the limit.
#[cold]
#[inline(never)]
pub(crate) fn read_after_miss(
    first: Draw,
    k: usize,
    mut miss: Miss,
    on_miss: &mut OnMiss<'_>,
    read: &mut impl FnMut(Draw, usize, bool) -> Result<(u64, u64), Miss>,
) -> Result<(u64, u64), SampleError> {
    let mut draw = first;
    let mut misses = 0u32;
    let mut backoff = Backoff::new();
    loop {
        misses += 1;
        let limit = match on_miss {
            OnMiss::RetryUpTo(n) => *n,
            _ => MAX_ATTEMPTS_PER_ROW,
        };
        if misses >= limit {
            return Err(SampleError::Starved { attempts: misses });
        }
        match (&mut *on_miss, miss) {
            (OnMiss::Redraw(redraw), _) => {
                let refresh = misses.is_multiple_of(REFRESH_AFTER_MISSES);
                if refresh {
                    backoff.snooze();
                }
                draw = redraw(refresh).ok_or(SampleError::Empty)?;
            }
            (OnMiss::Exact(_), Miss::Gone) => return Err(SampleError::Empty),
            (OnMiss::Retry { lost, epochs }, miss)
                if matches!(miss, Miss::Gone)
                    || misses.is_multiple_of(LOST_CHECK_MISSES) && lost(draw) =>
            {
                // A row dropped (its editor died), or a writer that died inside it.
                let mut next = Vec::with_capacity(1);
                if !epochs.take_more(1, &mut next) {
                    return Err(SampleError::EpochEnd);
                }
                draw = next[0];
            }
            (OnMiss::Exact(lost), Miss::Busy)
                if misses.is_multiple_of(LOST_CHECK_MISSES) && lost(draw) =>
            {
                return Err(SampleError::Empty)
            }
            // A torn copy retries at once; a row being written is waited for: its
            // writer is inside one extend. A gone row will not come back: a read
            // by position looks at the position again.
            (OnMiss::Retry { .. } | OnMiss::RetryUpTo(_) | OnMiss::Exact(_), Miss::Torn) => {}
            (OnMiss::RetryUpTo(_), Miss::Gone) => {
                return Err(SampleError::Starved { attempts: misses })
            }
            (OnMiss::Retry { .. } | OnMiss::RetryUpTo(_) | OnMiss::Exact(_), _) => backoff.snooze(),
        }
        match read(draw, k, false) {
            Ok(read) => return Ok(read),
            Err(m) => miss = m,
        }
    }
}
