//! Sampling without replacement, in epochs (TorchRL `SamplerWithoutReplacement`).
//!
//! An epoch is an order over the rows live when it began (a snapshot of the shard
//! windows): shuffled, or in storage index order as TorchRL's `shuffle=False`. Learners take consecutive batches of it with
//! one `fetch_add` on the epoch's cursor, so several learners share one epoch without a
//! lock and never draw a row twice within it. When the order runs out (or, with
//! `drop_last`, has less than a batch left), the sample that finds it so gets
//! [`SampleError::EpochEnd`] and the epoch closes; the next sample starts a new one.
//! Only that turnover takes a lock.
//!
//! A position is read as it is when the batch is copied: if collectors have replaced
//! the row since the epoch began, the newer row at the same position is returned. A
//! row that will never be read (dropped, or claimed by a writer that died before
//! publishing it) is replaced in the batch by the epoch's next row.
//!
//! Layer: algos.

use rand::seq::SliceRandom;

use crate::error::SampleError;
use crate::rng::{self, Rng};
use crate::storage::shard::{Shard, Window};
use crate::storage::Draw;
use crate::sync::{Arc, ArcCell, AtomicBool, AtomicU64, Mutex, Ordering};

/// Sampling without replacement.
///
/// ```
/// use replaybuf::sampler::WithoutReplacement;
/// let sampler = WithoutReplacement::new().drop_last(true).shuffle(false);
/// # let _ = sampler;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WithoutReplacement {
    pub(crate) drop_last: bool,
    pub(crate) shuffle: bool,
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

/// One epoch: the items (rows, or a slice sampler's windows) live when it began, in
/// the order to visit them.
#[derive(Debug)]
struct Epoch<T> {
    items: Vec<T>,
    /// The next unvisited entry.
    next: AtomicU64,
    /// Set by the sample that ran out; the next sample starts a new epoch.
    closed: AtomicBool,
}

/// Every live row of the snapshot, in storage index order (TorchRL's unshuffled
/// order): shard after shard for ndim 1, step after step for ndim 2, where an index is
/// `step * envs + env`.
fn live_in_index_order(shards: &[Shard], windows: &[Window], out: &mut Vec<Draw>) {
    out.clear();
    let draw = |k: usize, lane: u64, seq: u64| Draw {
        shard: k as u32,
        lane: lane as u32,
        seq,
        ..Draw::default()
    };
    let grid = shards.first().is_some_and(|s| s.ring().index_stride != 1);
    if grid {
        let steps = shards[0].ring().steps;
        for pos in 0..steps {
            for (k, (shard, w)) in shards.iter().zip(windows).enumerate() {
                if let Some(seq) = w.seq_at(pos, steps) {
                    out.extend((0..shard.ring().width).map(|lane| draw(k, lane, seq)));
                }
            }
        }
    } else {
        for (k, (shard, w)) in shards.iter().zip(windows).enumerate() {
            let steps = shard.ring().steps;
            out.extend(
                (0..steps).filter_map(|pos| w.seq_at(pos, steps).map(|seq| draw(k, 0, seq))),
            );
        }
    }
}

/// What a checkpoint keeps of a buffer's epochs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct EpochState<T> {
    /// Epochs begun so far (the next one's shuffle stream).
    pub(crate) started: u64,
    pub(crate) open: Option<OpenEpoch<T>>,
}

/// The epoch open when a checkpoint was taken.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OpenEpoch<T> {
    pub(crate) items: Vec<T>,
    /// Items handed out.
    pub(crate) next: u64,
    pub(crate) closed: bool,
}

/// The epochs of one buffer, over rows (`Draw`s) or any other items.
#[derive(Debug)]
pub(crate) struct Epochs<T = Draw> {
    config: WithoutReplacement,
    seed: u64,
    current: ArcCell<Epoch<T>>,
    /// Epochs started so far; held while starting one.
    turnover: Mutex<u64>,
}

impl Epochs<Draw> {
    pub(super) fn draw(
        &self,
        shards: &[Shard],
        windows: &[Window],
        n: usize,
        out: &mut Vec<Draw>,
    ) -> Result<(), SampleError> {
        self.take(n, |draws| live_in_index_order(shards, windows, draws), out)
    }
}

impl<T: Clone> Epochs<T> {
    pub(crate) fn new(config: WithoutReplacement, seed: u64) -> Epochs<T> {
        Epochs {
            config,
            seed,
            current: ArcCell::empty(),
            turnover: Mutex::new(0),
        }
    }

    /// Appends the open epoch's next `n` items to `out` (fewer at its end, unless
    /// `drop_last`), starting an epoch over what `collect` lists when none is open.
    pub(crate) fn take(
        &self,
        n: usize,
        collect: impl FnOnce(&mut Vec<T>),
        out: &mut Vec<T>,
    ) -> Result<(), SampleError> {
        let n = n as u64;
        let epoch = match self.current.load() {
            Some(e) if !e.closed.load(Ordering::Acquire) => e,
            _ => self.start(collect, n)?,
        };
        let rows = epoch.items.len() as u64;
        // More than an epoch holds: without `drop_last`, the epoch's one batch is all
        // of it (TorchRL's `SamplerWithoutReplacement`); with it, no batch ever is.
        if n > rows && self.config.drop_last {
            return Err(SampleError::NotEnough {
                requested: n as usize,
                available: rows as usize,
            });
        }
        let start = epoch.next.fetch_add(n, Ordering::AcqRel);
        let left = rows.saturating_sub(start);
        if left == 0 || (self.config.drop_last && left < n) {
            epoch.closed.store(true, Ordering::Release);
            return Err(SampleError::EpochEnd);
        }
        let end = start + n.min(left);
        out.extend_from_slice(&epoch.items[start as usize..end as usize]);
        Ok(())
    }

    /// Appends the open epoch's next `n` items (fewer at its end) to `out`; `false`
    /// if none is open or it has none left. Neither starts nor ends an epoch: the
    /// sample that next finds it empty ends it.
    pub(crate) fn take_more(&self, n: usize, out: &mut Vec<T>) -> bool {
        let Some(epoch) = self
            .current
            .load()
            .filter(|e| !e.closed.load(Ordering::Acquire))
        else {
            return false;
        };
        let rows = epoch.items.len() as u64;
        let start = epoch.next.fetch_add(n as u64, Ordering::AcqRel);
        let end = (start + n as u64).min(rows);
        if start >= end {
            return false;
        }
        out.extend_from_slice(&epoch.items[start as usize..end as usize]);
        true
    }

    /// Items of the open epoch not yet handed out, or `None` when none is open (none
    /// began yet, or the last one ended: the next sample starts one).
    pub(crate) fn left(&self) -> Option<u64> {
        let epoch = self
            .current
            .load()
            .filter(|e| !e.closed.load(Ordering::Acquire))?;
        let taken = epoch.next.load(Ordering::Acquire);
        Some((epoch.items.len() as u64).saturating_sub(taken))
    }

    /// The epochs' state, for a checkpoint: how many began, and the open one.
    pub(crate) fn state(&self) -> EpochState<T> {
        // Held while the open epoch is read: an epoch started in between was saved
        // with the count before it, and the loaded buffer's next epoch shuffled as
        // that one had (its order again).
        let started = self.turnover.lock();
        let open = self.current.load().map(|e| OpenEpoch {
            items: e.items.clone(),
            next: e.next.load(Ordering::Acquire).min(e.items.len() as u64),
            closed: e.closed.load(Ordering::Acquire),
        });
        EpochState {
            started: *started,
            open,
        }
    }

    /// Puts back a state [`Epochs::state`] gave.
    pub(crate) fn restore(&self, state: EpochState<T>) {
        let mut started = self.turnover.lock();
        *started = state.started;
        self.current.store(state.open.map(|o| {
            Arc::new(Epoch {
                items: o.items,
                next: AtomicU64::new(o.next),
                closed: AtomicBool::new(o.closed),
            })
        }));
    }

    /// The settings of these epochs.
    pub(crate) fn config(&self) -> WithoutReplacement {
        self.config
    }

    /// Whether an epoch ends rather than give a short last batch.
    pub(crate) fn drop_last(&self) -> bool {
        self.config.drop_last
    }

    /// Ends the open epoch if it has nothing left to hand out: for a sample that
    /// returns [`SampleError::EpochEnd`] after its items all failed to read, so that
    /// the next sample starts a new epoch rather than find this one empty again. An
    /// epoch another learner started meanwhile, with items left, stays open.
    pub(crate) fn close_exhausted(&self) {
        if let Some(epoch) = self.current.load() {
            if epoch.next.load(Ordering::Acquire) >= epoch.items.len() as u64 {
                epoch.closed.store(true, Ordering::Release);
            }
        }
    }

    /// Ends the open epoch, if any; the next sample starts a new one.
    pub(crate) fn close(&self) {
        if let Some(epoch) = self.current.load() {
            epoch.closed.store(true, Ordering::Release);
        }
    }

    /// Starts the next epoch over the items `collect` lists (unless another learner
    /// just did).
    fn start(
        &self,
        collect: impl FnOnce(&mut Vec<T>),
        n: u64,
    ) -> Result<Arc<Epoch<T>>, SampleError> {
        let mut started = self.turnover.lock();
        if let Some(e) = self.current.load() {
            if !e.closed.load(Ordering::Acquire) {
                return Ok(e);
            }
        }
        let mut items = Vec::new();
        collect(&mut items);
        if items.is_empty() {
            return Err(SampleError::Empty);
        }
        if n > items.len() as u64 && self.config.drop_last {
            return Err(SampleError::NotEnough {
                requested: n as usize,
                available: items.len(),
            });
        }
        if self.config.shuffle {
            let mut rng: Rng = rng::stream(self.seed, rng::Stream::Epoch(*started));
            items.shuffle(&mut rng);
        }
        *started += 1;
        let epoch = Arc::new(Epoch {
            items,
            next: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        self.current.store(Some(epoch.clone()));
        Ok(epoch)
    }
}
