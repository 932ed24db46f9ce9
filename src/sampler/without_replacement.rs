//! Sampling without replacement, in epochs (TorchRL `SamplerWithoutReplacement`).
//!
//! An epoch is an order over the rows live when it began (a snapshot of the shard
//! windows), shuffled or in storage order. Learners take consecutive batches of it with
//! one `fetch_add` on the epoch's cursor, so several learners share one epoch without a
//! lock and never draw a row twice within it. When the order runs out (or, with
//! `drop_last`, has less than a batch left), the sample that finds it so gets
//! [`SampleError::EpochEnd`] and the epoch closes; the next sample starts a new one.
//! Only that turnover takes a lock.
//!
//! A position is read as it is when the batch is copied: if collectors have replaced
//! the row since the epoch began, the newer row at the same position is returned.

use rand::seq::SliceRandom;

use crate::error::SampleError;
use crate::rng::{self, Rng};
use crate::storage::shard::{Shard, Window};
use crate::storage::Draw;
use crate::sync::{ArcCell, Arc, AtomicBool, AtomicU64, Mutex, Ordering};

/// Sampling without replacement.
///
/// ```
/// use replaybuf::WithoutReplacement;
/// let sampler = WithoutReplacement::new().drop_last(true).shuffle(false);
/// # let _ = sampler;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WithoutReplacement {
    drop_last: bool,
    shuffle: bool,
}

impl Default for WithoutReplacement {
    fn default() -> Self {
        Self::new()
    }
}

impl WithoutReplacement {
    /// Shuffled epochs that end with a short batch rather than drop it.
    pub fn new() -> Self {
        Self {
            drop_last: false,
            shuffle: true,
        }
    }

    /// End the epoch when less than a full batch is left, instead of returning a short
    /// last batch.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Visit rows in a fresh random order each epoch (`true`) or in storage order.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }
}

/// One epoch: a snapshot of the live rows and the order to visit them in.
#[derive(Debug)]
struct Epoch {
    windows: Vec<Window>,
    /// Live rows at the snapshot.
    rows: u64,
    /// Flat row numbers in visiting order; empty when not shuffling (identity).
    order: Vec<u64>,
    /// The next unvisited entry of the order.
    next: AtomicU64,
    /// Set by the sample that ran out; the next sample starts a new epoch.
    closed: AtomicBool,
}

impl Epoch {
    fn flat_row(&self, i: u64) -> u64 {
        if self.order.is_empty() {
            i
        } else {
            self.order[i as usize]
        }
    }

    /// The draw for flat row `f` of the snapshot.
    fn locate(&self, shards: &[Shard], mut f: u64) -> Draw {
        for (k, (shard, w)) in shards.iter().zip(&self.windows).enumerate() {
            let width = shard.ring().width;
            let rows = w.steps() * width;
            if f < rows {
                return Draw {
                    shard: k as u32,
                    lane: (f % width) as u32,
                    seq: w.lo + f / width,
                };
            }
            f -= rows;
        }
        unreachable!("replaybuf internal error: epoch row past the snapshot")
    }
}

/// The epochs of one buffer.
#[derive(Debug)]
pub(crate) struct Epochs {
    config: WithoutReplacement,
    seed: u64,
    current: ArcCell<Epoch>,
    /// Epochs started so far; held while starting one.
    turnover: Mutex<u64>,
}

impl Epochs {
    pub(super) fn new(config: WithoutReplacement, seed: u64) -> Epochs {
        Epochs {
            config,
            seed,
            current: ArcCell::empty(),
            turnover: Mutex::new(0),
        }
    }

    pub(super) fn draw(
        &self,
        shards: &[Shard],
        windows: &[Window],
        n: usize,
        out: &mut Vec<Draw>,
    ) -> Result<(), SampleError> {
        let n = n as u64;
        let epoch = match self.current.load() {
            Some(e) if !e.closed.load(Ordering::Acquire) => e,
            _ => self.start(shards, windows, n)?,
        };
        if n > epoch.rows {
            return Err(SampleError::NotEnough {
                requested: n as usize,
                available: epoch.rows as usize,
            });
        }
        let start = epoch.next.fetch_add(n, Ordering::AcqRel);
        let left = epoch.rows.saturating_sub(start);
        if left == 0 || (self.config.drop_last && left < n) {
            epoch.closed.store(true, Ordering::Release);
            return Err(SampleError::EpochEnd);
        }
        let end = start + n.min(left);
        out.extend((start..end).map(|i| epoch.locate(shards, epoch.flat_row(i))));
        Ok(())
    }

    /// Starts the next epoch over the live rows (unless another learner just did).
    fn start(&self, shards: &[Shard], windows: &[Window], n: u64) -> Result<Arc<Epoch>, SampleError> {
        let mut started = self.turnover.lock();
        if let Some(e) = self.current.load() {
            if !e.closed.load(Ordering::Acquire) {
                return Ok(e);
            }
        }
        let rows: u64 = shards
            .iter()
            .zip(windows)
            .map(|(s, w)| w.steps() * s.ring().width)
            .sum();
        if rows == 0 {
            return Err(SampleError::Empty);
        }
        if n > rows {
            return Err(SampleError::NotEnough {
                requested: n as usize,
                available: rows as usize,
            });
        }
        let order = if self.config.shuffle {
            let mut rng: Rng = rng::stream(self.seed, rng::Stream::Epoch(*started));
            let mut order: Vec<u64> = (0..rows).collect();
            order.shuffle(&mut rng);
            order
        } else {
            Vec::new()
        };
        *started += 1;
        let epoch = Arc::new(Epoch {
            windows: windows.to_vec(),
            rows,
            order,
            next: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        self.current.store(Some(epoch.clone()));
        Ok(epoch)
    }
}
