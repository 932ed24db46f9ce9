//! First in, first out: every row handed out once, oldest first (Reverb's `Fifo`
//! selector with its queue's remover).
//!
//! Each shard keeps a mark in its block (`ShardWord::Popped`): the rows below it were
//! taken. A batch is read first and taken after: a learner reads the rows from the
//! mark on, then moves the mark past them with one compare-and-swap. If another
//! learner moved it first, the rows were that learner's, and the batch is read again
//! from the new mark. So learners (threads, or processes of a shared region) never
//! take the same row, a row is taken only once it was read whole, and the rows of a
//! shard come out in the order they were claimed. Nobody ever waits on the mark.
//!
//! A learner that is slow to read holds the rows back from the others, but not from
//! being counted: until the mark moves they are still the oldest rows of the queue,
//! so a rate limit that keeps the queue shorter than the ring keeps them from being
//! overwritten (taking them first and reading them after would let collectors
//! overwrite rows a descheduled learner had taken and not read yet: they would be
//! lost). A row that is overwritten anyway (a ring smaller than the queue) is lost:
//! the mark skips the rows that left the window, and the batch is read again.
//!
//! A row that will never be read is skipped: one claimed by a writer that died before
//! publishing it (in shared mode, the learner that waited on it takes the dead
//! writer's shard over first), or dropped by an editor that died inside it. A read
//! that meets one ends, and the batch drawn again stops before it; the next finds it
//! at the mark and moves the mark past it.
//!
//! A batch takes its rows from one shard: the first, from one picked at random on,
//! that has any. Each shard is a queue of its own (one per collector in shared mode).
//! A row is counted as `seq * width + lane`, so an ndim-2 shard hands out a step's
//! environments in order before the next step.
//!
//! Layer: algos.

use rand::RngExt;

use crate::error::SampleError;
use crate::rng::Rng;
use crate::storage::shard::{Shard, Window};
use crate::storage::{Draw, Storage};
use crate::sync::Ordering;

/// Rounds a FIFO batch is drawn and read again (another learner took its rows first)
/// before the sample gives up with [`SampleError::Starved`].
const MAX_ROUNDS: u32 = 1 << 20;

/// Every row sampled once, oldest first: a queue (Reverb's `Fifo` selector and its
/// queue's remover, `Table.queue`).
///
/// A batch holds the oldest rows not taken yet of one shard, up to the size asked
/// for: fewer when fewer are waiting there, [`SampleError::Empty`] when no shard has
/// any. Each shard is a queue of its own (one per collector in shared mode); a batch
/// takes its rows from the first that has some, from one picked at random on.
///
/// With [`RateLimit::queue`](crate::RateLimit::queue) it is a bounded queue:
/// collectors wait while `size` rows are waiting, learners while none is. Give each
/// shard room for all of them and for one extend of every collector, which the limit
/// judges by the counts before it (`capacity / shards >= size + collectors * rows
/// per extend`): a row the ring overwrites before a learner takes it is lost, and the
/// limit, which still counts it, then lets samples in that find the queue empty.
///
/// ```
/// use replaybuf::{sampler::Fifo, DType, RateLimit, ReplayBuffer, Spec};
///
/// let spec = Spec::builder().field("x", DType::I64, []).build()?;
/// let rb = ReplayBuffer::builder(spec)
///     .capacity(8)
///     .sampler(Fifo)
///     .rate_limit(RateLimit::queue(8)?)
///     .build()?;
/// let mut rows = rb.batch([5]);
/// rows.set("x", &[0i64, 1, 2, 3, 4])?;
/// rb.extend(&rows)?;
/// assert_eq!(rb.sample(3)?.column::<i64>("x")?, &[0, 1, 2]);
/// assert_eq!(rb.sample(3)?.column::<i64>("x")?, &[3, 4]); // two were left
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fifo;

/// A row's place in its shard's queue (its shard's rings are `width` rows a step).
pub(crate) fn row(d: &Draw, width: u64) -> u64 {
    d.seq * width + u64::from(d.lane)
}

/// Rows of `storage` a FIFO sampler has not taken yet: those of each shard's window
/// past its mark.
pub(crate) fn waiting(storage: &Storage) -> u64 {
    storage
        .shards()
        .iter()
        .map(|shard| {
            let (w, width) = (shard.window(), shard.ring().width);
            let first = shard.popped().load(Ordering::Relaxed).max(w.lo * width);
            (w.hi * width).saturating_sub(first)
        })
        .sum()
}

/// Lists up to `rows` of shard `k`'s rows not taken yet, as far as the window `w`
/// shows them, into `out`, without taking them; returns how many. Rows that left the
/// window untaken are skipped for good, and so are the rows `lost`, if given, says
/// will never be read (claimed by a writer that died before publishing them, or
/// dropped by an editor that died inside them): the mark moves past those at its
/// head, and a batch ends before any other, which the next batch then finds at its
/// head. (They held the queue up until the ring lapped them: every batch drawn again
/// and again.) The caller asks only for a batch drawn again after a read that missed,
/// so that a batch's first draw loads no row's stamp.
fn peek(
    shards: &[Shard],
    k: usize,
    w: Window,
    rows: u64,
    out: &mut Vec<Draw>,
    lost: Option<&dyn Fn(Draw) -> bool>,
) -> u64 {
    let shard = &shards[k];
    let width = shard.ring().width;
    let (lo, end) = (w.lo * width, w.hi * width);
    let draw = |r: u64| {
        let (seq, lane) = shard.ring().step_lane(r);
        Draw {
            shard: k as u32,
            lane: lane as u32,
            seq,
            ..Draw::default()
        }
    };
    let mark = shard.popped();
    let mut first = mark.load(Ordering::Relaxed);
    if first < lo {
        first = mark.fetch_max(lo, Ordering::Relaxed).max(lo);
    }
    let lost = |r: u64| lost.is_some_and(|lost| lost(draw(r)));
    // Such a row stays lost (a lap's writer that takes its slot over makes a row of
    // the next lap), so every learner may move the mark past it.
    while first < end && lost(first) {
        first = mark.fetch_max(first + 1, Ordering::Relaxed).max(first + 1);
    }
    if first >= end {
        return 0;
    }
    let n = rows.min(end - first);
    let n = (first + 1..first + n)
        .position(lost)
        .map_or(n, |i| i as u64 + 1);
    out.extend((first..first + n).map(draw));
    n
}

/// Lists up to `n` rows of the first shard with rows not taken yet, from one picked
/// at random on, leaving out the rows `lost` says will never be read ([`peek`]);
/// [`SampleError::Empty`] if none has any.
pub(super) fn draw(
    shards: &[Shard],
    windows: &[Window],
    rng: &mut Rng,
    n: usize,
    out: &mut Vec<Draw>,
    lost: Option<&dyn Fn(Draw) -> bool>,
) -> Result<(), SampleError> {
    if n == 0 {
        return Ok(());
    }
    let start = rng.random_range(0..shards.len());
    let found = (0..shards.len())
        .map(|i| (start + i) % shards.len())
        .any(|k| peek(shards, k, windows[k], n as u64, out, lost) > 0);
    if found {
        Ok(())
    } else {
        Err(SampleError::Empty)
    }
}

/// Takes the rows `draws` listed and that were read whole: moves their shard's mark
/// past them, unless another learner moved it first (then they were that learner's,
/// and `false` asks for the batch to be drawn and read again).
fn take(shards: &[Shard], draws: &[Draw]) -> bool {
    let (Some(first), Some(last)) = (draws.first(), draws.last()) else {
        return true;
    };
    let shard = &shards[first.shard as usize];
    let width = shard.ring().width;
    // Only the mark's atomicity matters: exactly one learner moves it past a row. The
    // rows were read, and checked whole, through their stamps.
    shard
        .popped()
        .compare_exchange(
            row(first, width),
            row(last, width) + 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        )
        .is_ok()
}

/// Whether a FIFO batch read from `draws` stands (`read`: how the read went), after
/// `rounds` earlier tries: once its rows are taken. `Ok(false)` asks for the batch to
/// be drawn and read again: another learner took the rows first, or one was
/// overwritten before it was read, or found lost (the read then ends `Empty`).
pub(crate) fn settle(
    shards: &[Shard],
    draws: &[Draw],
    read: Result<(), SampleError>,
    rounds: &mut u32,
) -> Result<bool, SampleError> {
    match read {
        Ok(()) if take(shards, draws) => return Ok(true),
        Ok(()) => {}
        // Rows were listed, so the queue was not empty: one was overwritten.
        Err(SampleError::Empty) if !draws.is_empty() => {}
        Err(e) => return Err(e),
    }
    *rounds += 1;
    if *rounds >= MAX_ROUNDS {
        return Err(SampleError::Starved { attempts: *rounds });
    }
    Ok(false)
}
