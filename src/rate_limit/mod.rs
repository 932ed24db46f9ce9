//! Rate limiting: how far collectors and learners may run ahead of each other
//! (Reverb's rate limiters, in the buffer itself).
//!
//! A buffer built with a [`RateLimit`] counts the rows inserted (`I`) and the rows
//! sampled (`S`), and keeps `diff = I * samples_per_insert - S` in the band
//! `min_diff..max_diff`:
//!
//! - a sample waits while fewer than `min_size_to_sample` rows have been inserted, or
//!   while `diff <= min_diff` (the learners are ahead);
//! - an insert waits while `diff >= max_diff` (the collectors are ahead), once
//!   `min_size_to_sample` rows are in.
//!
//! A call is judged by the counts before it and then adds all of its rows. So an
//! insert and a sample never wait on each other at once, whatever their sizes: that
//! would take `max_diff <= diff <= min_diff`, and `min_diff < max_diff`. The price is
//! one call's overshoot: `diff` stays above `min_diff - (rows of one sample)` and
//! below `max_diff + (rows of one insert) * samples_per_insert`.
//!
//! Waits sleep on a condition variable, using no CPU, and end when the other side
//! moves, the limit changes, the limiter is closed, the side's timeout passes, or the
//! check the caller put in force on its thread says so ([`RateLimit::interruptible`]).
//! The counts live behind one mutex, held for a few instructions per call: the rows
//! themselves still move without a lock.
//!
//! A shared buffer's processes keep one limit together, in the region (`shared.rs`):
//! the same rule over atomic counts, with sleepers on a futex, so that no process
//! ever waits on a lock another could die holding. [`Limiter`] is a buffer's limiter
//! of either kind.
//!
//! Layer: api.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::backing::dir::LimitMeta;
use crate::error::RateLimitError;
use crate::sync::{Condvar, Mutex};

#[cfg(target_os = "linux")]
pub(crate) mod shared;

thread_local! {
    /// The check [`RateLimit::interruptible`] put in force on this thread.
    static INTERRUPT: Cell<Option<fn() -> bool>> = const { Cell::new(None) };
}

/// A waiting call's turns with the check in force on its thread, if any
/// ([`RateLimit::interruptible`]): every [`RateLimit::INTERRUPT_EVERY`] of its wait,
/// however often it wakes meanwhile.
pub(crate) struct Interrupt {
    check: Option<fn() -> bool>,
    /// When the check is next due.
    due: Instant,
}

impl Interrupt {
    /// The check in force on this thread, first due a period from `start`.
    pub(crate) fn new(start: Instant) -> Interrupt {
        Interrupt {
            check: INTERRUPT.with(Cell::get),
            due: start + RateLimit::INTERRUPT_EVERY,
        }
    }

    /// When to stop sleeping: at `deadline` (`None`: never), or earlier, when the
    /// check is due.
    pub(crate) fn wake_at(&self, deadline: Option<Instant>) -> Option<Instant> {
        match self.check {
            None => deadline,
            Some(_) => Some(deadline.map_or(self.due, |d| d.min(self.due))),
        }
    }

    /// Whether there is a check and it is due.
    fn due(&self) -> bool {
        self.check.is_some() && Instant::now() >= self.due
    }

    /// Whether the check, if due, says to stop waiting.
    pub(crate) fn stops(&mut self) -> bool {
        let Some(check) = self.check else {
            return false;
        };
        let now = Instant::now();
        if now < self.due {
            return false;
        }
        self.due = now + RateLimit::INTERRUPT_EVERY;
        check()
    }
}

/// The rule a rate-limited buffer keeps (see [`ReplayBufferBuilder::rate_limit`]).
///
/// ```
/// use replaybuf::{DType, RateLimit, ReplayBuffer, Spec};
/// use std::time::Duration;
///
/// let spec = Spec::builder().field("obs", DType::F32, [4]).build()?;
/// // Each row sampled about 4 times, give or take 64 samples; samples wait for the
/// // first 100 rows; neither side waits more than a second.
/// let limit = RateLimit::sample_to_insert_ratio(4.0, 100, 64.0)?
///     .insert_timeout(Some(Duration::from_secs(1)))
///     .sample_timeout(Some(Duration::from_secs(1)));
/// let rb = ReplayBuffer::builder(spec).capacity(1000).rate_limit(limit).build()?;
/// rb.extend(&rb.batch([100]))?;
/// rb.sample(256)?; // 400 samples are due for 100 inserts: no wait
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`ReplayBufferBuilder::rate_limit`]: crate::ReplayBufferBuilder::rate_limit
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    min_size_to_sample: u64,
    samples_per_insert: f64,
    min_diff: f64,
    max_diff: f64,
    insert_timeout: Option<Duration>,
    sample_timeout: Option<Duration>,
}

impl RateLimit {
    /// How often a rate-limited wait consults the check in force on its thread
    /// ([`RateLimit::interruptible`]).
    pub const INTERRUPT_EVERY: Duration = Duration::from_millis(50);

    /// Runs `f` with `check` in force on this thread: each rate-limited wait `f`
    /// makes calls it every [`INTERRUPT_EVERY`](Self::INTERRUPT_EVERY), and ends with
    /// [`RateLimitError::Interrupted`], nothing counted, once it returns `true`. For
    /// a host whose thread must come back while it waits: Python runs a Ctrl-C's
    /// handler only once its main thread is back in the interpreter, and a wait with
    /// no timeout would keep it out for good. The check in force before is put back
    /// after, whether `f` returns or unwinds.
    ///
    /// ```
    /// use replaybuf::error::{RateLimitError, SampleError};
    /// use replaybuf::{DType, RateLimit, ReplayBuffer, Spec};
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [4]).build()?;
    /// // Samples wait for 10 rows, with no timeout.
    /// let rb = ReplayBuffer::builder(spec)
    ///     .capacity(100)
    ///     .rate_limit(RateLimit::min_size(10))
    ///     .build()?;
    /// let got = RateLimit::interruptible(|| true, || rb.sample(1));
    /// assert!(matches!(got, Err(SampleError::RateLimited(RateLimitError::Interrupted))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn interruptible<T>(check: fn() -> bool, f: impl FnOnce() -> T) -> T {
        struct Restore(Option<fn() -> bool>);
        impl Drop for Restore {
            fn drop(&mut self) {
                INTERRUPT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(INTERRUPT.with(|c| c.replace(Some(check))));
        f()
    }

    /// The general form: samples wait for `min_size_to_sample` inserted rows and while
    /// `diff <= min_diff`; inserts wait while `diff >= max_diff` (see the module's
    /// docs). `samples_per_insert` must be finite and positive, and `min_diff <
    /// max_diff` (either may be infinite).
    pub fn new(
        min_size_to_sample: u64,
        samples_per_insert: f64,
        min_diff: f64,
        max_diff: f64,
    ) -> Result<RateLimit, RateLimitError> {
        let invalid = |reason| Err(RateLimitError::Invalid { reason });
        if !(samples_per_insert.is_finite() && samples_per_insert > 0.0) {
            return invalid("samples_per_insert must be finite and positive");
        }
        if min_diff.partial_cmp(&max_diff) != Some(std::cmp::Ordering::Less) {
            return invalid("min_diff must be below max_diff (neither NaN)");
        }
        Ok(RateLimit {
            min_size_to_sample,
            samples_per_insert,
            min_diff,
            max_diff,
            insert_timeout: None,
            sample_timeout: None,
        })
    }

    /// Samples wait until `min_size_to_sample` rows have been inserted; nothing else
    /// waits (Reverb's `MinSize`).
    pub fn min_size(min_size_to_sample: u64) -> RateLimit {
        RateLimit::new(min_size_to_sample, 1.0, f64::NEG_INFINITY, f64::INFINITY)
            .expect("a valid limit")
    }

    /// Each inserted row is sampled about `samples_per_insert` times, give or take
    /// `error_buffer` samples, once `min_size_to_sample` rows are in (Reverb's
    /// `SampleToInsertRatio`): the band is centred on `min_size_to_sample *
    /// samples_per_insert`, so neither side waits while the buffer fills.
    /// `error_buffer` must be at least `2 * max(1, samples_per_insert)`, as Reverb
    /// asks, so that single rows can always alternate.
    pub fn sample_to_insert_ratio(
        samples_per_insert: f64,
        min_size_to_sample: u64,
        error_buffer: f64,
    ) -> Result<RateLimit, RateLimitError> {
        if error_buffer.is_nan() || error_buffer < 2.0 * samples_per_insert.max(1.0) {
            return Err(RateLimitError::Invalid {
                reason: "error_buffer must be at least 2 * max(1, samples_per_insert)",
            });
        }
        let centre = min_size_to_sample as f64 * samples_per_insert;
        RateLimit::new(
            min_size_to_sample,
            samples_per_insert,
            centre - error_buffer,
            centre + error_buffer,
        )
    }

    /// A queue of `size` rows (Reverb's `Queue` limit): every row sampled once,
    /// collectors waiting while `size` rows are unsampled, learners while none are.
    /// With the [`Fifo`](crate::sampler::Fifo) sampler it is Reverb's `Table.queue`:
    /// each row handed out once, oldest first.
    pub fn queue(size: u64) -> Result<RateLimit, RateLimitError> {
        if size == 0 {
            return Err(RateLimitError::Invalid {
                reason: "a queue holds at least one row",
            });
        }
        RateLimit::new(1, 1.0, 0.0, size as f64)
    }

    /// How long an insert may wait before it fails with [`RateLimitError::Timeout`]
    /// (`None`, the default: as long as it takes).
    pub fn insert_timeout(mut self, timeout: Option<Duration>) -> RateLimit {
        self.insert_timeout = timeout;
        self
    }

    /// How long a sample may wait before it fails with [`RateLimitError::Timeout`]
    /// (`None`, the default: as long as it takes).
    pub fn sample_timeout(mut self, timeout: Option<Duration>) -> RateLimit {
        self.sample_timeout = timeout;
        self
    }

    /// Rows inserted before any sample may go.
    pub fn min_size_to_sample(&self) -> u64 {
        self.min_size_to_sample
    }

    /// The target ratio of sampled rows to inserted rows.
    pub fn samples_per_insert(&self) -> f64 {
        self.samples_per_insert
    }

    /// The band `diff` is kept near: `(min_diff, max_diff)`.
    pub fn diff_band(&self) -> (f64, f64) {
        (self.min_diff, self.max_diff)
    }

    /// The timeouts of inserts and samples.
    pub fn timeouts(&self) -> (Option<Duration>, Option<Duration>) {
        (self.insert_timeout, self.sample_timeout)
    }
}

/// What a rate limiter has counted (see [`ReplayBuffer::rate_limit_stats`]).
///
/// [`ReplayBuffer::rate_limit_stats`]: crate::ReplayBuffer::rate_limit_stats
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimitStats {
    /// The limit in force.
    pub limit: RateLimit,
    /// Rows inserted through the limiter.
    pub inserts: u64,
    /// Rows sampled through the limiter.
    pub samples: u64,
    /// Inserts that had to wait, and then went in (a wait that timed out, or that
    /// closing or an interrupt ended, counts nowhere: it changed nothing).
    pub insert_waits: u64,
    /// The total time those inserts waited.
    pub insert_waited: Duration,
    /// Samples that had to wait, and then went in.
    pub sample_waits: u64,
    /// The total time those samples waited.
    pub sample_waited: Duration,
    /// Whether the limiter is closed.
    pub closed: bool,
}

impl RateLimitStats {
    /// `inserts * samples_per_insert - samples`: what the limit keeps in its band.
    pub fn diff(&self) -> f64 {
        self.inserts as f64 * self.limit.samples_per_insert - self.samples as f64
    }
}

/// The limit as a checkpoint records it.
impl From<RateLimit> for LimitMeta {
    fn from(limit: RateLimit) -> LimitMeta {
        LimitMeta {
            min_size_to_sample: limit.min_size_to_sample,
            samples_per_insert: limit.samples_per_insert,
            min_diff: Some(limit.min_diff).filter(|d| d.is_finite()),
            max_diff: Some(limit.max_diff).filter(|d| d.is_finite()),
            insert_timeout: limit.insert_timeout,
            sample_timeout: limit.sample_timeout,
        }
    }
}

impl RateLimit {
    /// The limit `meta` records, checked as [`RateLimit::new`] checks one.
    pub(crate) fn recorded(meta: &LimitMeta) -> Result<RateLimit, RateLimitError> {
        Ok(RateLimit::new(
            meta.min_size_to_sample,
            meta.samples_per_insert,
            meta.min_diff.unwrap_or(f64::NEG_INFINITY),
            meta.max_diff.unwrap_or(f64::INFINITY),
        )?
        .insert_timeout(meta.insert_timeout)
        .sample_timeout(meta.sample_timeout))
    }
}

/// A buffer's limiter: its process's own, or a shared buffer's, which every process
/// attached to the region keeps together (`shared.rs`).
#[derive(Debug)]
pub(crate) enum Limiter {
    Local(RateLimiter),
    #[cfg(target_os = "linux")]
    Shared(shared::SharedLimiter),
}

impl Limiter {
    /// Waits until `rows` rows may be inserted, then counts them; `Ok(false)` if
    /// there is no limit after all (a shared buffer built without one) and nothing
    /// was counted.
    pub(crate) fn insert(&self, rows: u64) -> Result<bool, RateLimitError> {
        self.admit(Side::Insert, rows)
    }

    /// As [`insert`](Self::insert), for sampled rows.
    pub(crate) fn sample(&self, rows: u64) -> Result<bool, RateLimitError> {
        self.admit(Side::Sample, rows)
    }

    fn admit(&self, side: Side, rows: u64) -> Result<bool, RateLimitError> {
        match self {
            Limiter::Local(l) => match side {
                Side::Insert => l.insert(rows),
                Side::Sample => l.sample(rows),
            }
            .map(|()| true),
            #[cfg(target_os = "linux")]
            Limiter::Shared(l) => l.admit(side, rows),
        }
    }

    /// Takes back `rows` counted inserts that were not written.
    pub(crate) fn refund_inserts(&self, rows: u64) {
        self.refund(Side::Insert, rows);
    }

    /// Takes back `rows` counted samples that were not drawn.
    pub(crate) fn refund_samples(&self, rows: u64) {
        self.refund(Side::Sample, rows);
    }

    fn refund(&self, side: Side, rows: u64) {
        match self {
            Limiter::Local(l) => match side {
                Side::Insert => l.refund_inserts(rows),
                Side::Sample => l.refund_samples(rows),
            },
            #[cfg(target_os = "linux")]
            Limiter::Shared(l) => l.refund(side, rows),
        }
    }

    /// Starts the counts over at `inserts` rows inserted and none sampled, and wakes
    /// every waiter to judge itself again: at 0 for a buffer whose rows were dropped
    /// (samples wait for `min_size_to_sample` rows anew; Reverb's table reset resets
    /// its limiter), at the rows stored for one that a checkpoint filled.
    pub(crate) fn restart(&self, inserts: u64) {
        self.restart_at(inserts, 0);
    }

    /// Starts the counts over at `inserts` rows inserted and `samples` sampled (a
    /// checkpoint's), waking every waiter to judge itself again.
    pub(crate) fn restart_at(&self, inserts: u64, samples: u64) {
        match self {
            Limiter::Local(l) => l.restart_at(inserts, samples),
            #[cfg(target_os = "linux")]
            Limiter::Shared(l) => l.restart_at(inserts, samples),
        }
    }

    /// The counts, waits and limit now (`None`: no limit).
    pub(crate) fn stats(&self) -> Option<RateLimitStats> {
        match self {
            Limiter::Local(l) => Some(l.stats()),
            #[cfg(target_os = "linux")]
            Limiter::Shared(l) => l.stats(),
        }
    }

    /// Puts `limit` in force, waking every waiter to judge itself by it.
    pub(crate) fn set(&self, limit: RateLimit) -> Result<(), RateLimitError> {
        match self {
            Limiter::Local(l) => {
                l.set(limit);
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Limiter::Shared(l) => l.set(limit),
        }
    }

    /// Closes or reopens the limiter.
    pub(crate) fn close(&self, closed: bool) -> Result<(), RateLimitError> {
        match self {
            Limiter::Local(l) => {
                l.close(closed);
                Ok(())
            }
            #[cfg(target_os = "linux")]
            Limiter::Shared(l) => l.close(closed),
        }
    }
}

/// Which side of the limiter a call is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Insert,
    Sample,
}

impl Side {
    fn other(self) -> Side {
        match self {
            Side::Insert => Side::Sample,
            Side::Sample => Side::Insert,
        }
    }
}

/// A buffer's limiter: the counts and the two queues of waiters.
#[derive(Debug)]
pub struct RateLimiter {
    counts: Mutex<RateLimitStats>,
    /// Waited on by inserts; notified when samples move the diff down (or a limit
    /// change, a refund or closing may have let them go).
    inserts_may_go: Condvar,
    /// Waited on by samples; notified when inserts move the diff up.
    samples_may_go: Condvar,
}

impl RateLimiter {
    /// A limiter keeping `limit`, nothing counted yet.
    pub fn new(limit: RateLimit) -> RateLimiter {
        RateLimiter {
            counts: Mutex::new(RateLimitStats {
                limit,
                inserts: 0,
                samples: 0,
                insert_waits: 0,
                insert_waited: Duration::ZERO,
                sample_waits: 0,
                sample_waited: Duration::ZERO,
                closed: false,
            }),
            inserts_may_go: Condvar::new(),
            samples_may_go: Condvar::new(),
        }
    }

    /// Waits until `rows` rows may be inserted, then counts them.
    pub fn insert(&self, rows: u64) -> Result<(), RateLimitError> {
        self.admit(Side::Insert, rows)
    }

    /// Waits until `rows` rows may be sampled, then counts them.
    pub fn sample(&self, rows: u64) -> Result<(), RateLimitError> {
        self.admit(Side::Sample, rows)
    }

    /// Takes back `rows` counted inserts that were not written (the write failed, or a
    /// write policy rejected them).
    pub fn refund_inserts(&self, rows: u64) {
        self.refund(Side::Insert, rows);
    }

    /// Takes back `rows` counted samples that were not drawn.
    pub fn refund_samples(&self, rows: u64) {
        self.refund(Side::Sample, rows);
    }

    /// Takes back `rows` of `side`'s count, and wakes that side: fewer inserts lower
    /// the diff, which lets inserts go; fewer samples raise it, which lets samples go.
    fn refund(&self, side: Side, rows: u64) {
        if rows == 0 {
            return;
        }
        let mut c = self.counts.lock();
        let count = match side {
            Side::Insert => &mut c.inserts,
            Side::Sample => &mut c.samples,
        };
        *count = count.saturating_sub(rows);
        drop(c);
        self.queue(side).notify_all();
    }

    /// Where calls of `side` wait.
    fn queue(&self, side: Side) -> &Condvar {
        match side {
            Side::Insert => &self.inserts_may_go,
            Side::Sample => &self.samples_may_go,
        }
    }

    /// The counts, waits and limit now.
    pub fn stats(&self) -> RateLimitStats {
        *self.counts.lock()
    }

    /// Puts `limit` in force, waking every waiter to judge itself by it.
    pub fn set(&self, limit: RateLimit) {
        self.counts.lock().limit = limit;
        self.wake_all();
    }

    /// Starts the counts over at `inserts` rows inserted (0, or rows that were there
    /// before the limiter: a reopened file's, a checkpoint's) and none sampled, waking
    /// every waiter.
    pub fn restart(&self, inserts: u64) {
        self.restart_at(inserts, 0);
    }

    /// Starts the counts over at `inserts` rows inserted and `samples` sampled (a
    /// checkpoint's), waking every waiter.
    pub(crate) fn restart_at(&self, inserts: u64, samples: u64) {
        let mut c = self.counts.lock();
        c.inserts = inserts;
        c.samples = samples;
        drop(c);
        self.wake_all();
    }

    /// Fails every call that waits now or would wait later (until reopened).
    pub fn close(&self, closed: bool) {
        self.counts.lock().closed = closed;
        self.wake_all();
    }

    fn wake_all(&self) {
        self.inserts_may_go.notify_all();
        self.samples_may_go.notify_all();
    }

    fn admit(&self, side: Side, rows: u64) -> Result<(), RateLimitError> {
        let mut c = self.counts.lock();
        let mut since: Option<Instant> = None;
        let mut interrupt: Option<Interrupt> = None;
        loop {
            if may_go(&c.limit, c.inserts, c.samples, side) {
                match side {
                    Side::Insert => c.inserts += rows,
                    Side::Sample => c.samples += rows,
                }
                if let Some(t) = since {
                    let waited = t.elapsed();
                    if side == Side::Insert {
                        c.insert_waits += 1;
                        c.insert_waited += waited;
                    } else {
                        c.sample_waits += 1;
                        c.sample_waited += waited;
                    }
                }
                drop(c);
                // The other side may go now.
                self.queue(side.other()).notify_all();
                return Ok(());
            }
            if c.closed {
                return Err(RateLimitError::Closed);
            }
            let start = *since.get_or_insert_with(Instant::now);
            let (insert_timeout, sample_timeout) = c.limit.timeouts();
            let timeout = match side {
                Side::Insert => insert_timeout,
                Side::Sample => sample_timeout,
            };
            // A timeout past what an `Instant` can count (`Duration::MAX`) waits as
            // none does: the sum panicked.
            let deadline = timeout.and_then(|t| start.checked_add(t));
            let interrupt = interrupt.get_or_insert_with(|| Interrupt::new(start));
            (c, _) = self.queue(side).wait_until(c, interrupt.wake_at(deadline));
            if may_go(&c.limit, c.inserts, c.samples, side) || c.closed {
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timeout_error(
                    &c.limit,
                    c.inserts,
                    c.samples,
                    start.elapsed(),
                ));
            }
            if interrupt.due() {
                // The check runs without the counts' lock (it may take another).
                drop(c);
                if interrupt.stops() {
                    return Err(RateLimitError::Interrupted);
                }
                c = self.counts.lock();
            }
        }
    }
}

/// Whether a call of `side` may go under `limit` with these counts.
fn may_go(limit: &RateLimit, inserts: u64, samples: u64, side: Side) -> bool {
    let filling = inserts < limit.min_size_to_sample;
    let diff = inserts as f64 * limit.samples_per_insert - samples as f64;
    match side {
        Side::Insert => filling || diff < limit.max_diff,
        Side::Sample => !filling && diff > limit.min_diff,
    }
}

fn timeout_error(
    limit: &RateLimit,
    inserts: u64,
    samples: u64,
    waited: Duration,
) -> RateLimitError {
    RateLimitError::Timeout {
        waited,
        samples_per_insert: limit.samples_per_insert,
        inserts,
        samples,
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    #[test]
    fn presets_are_reverbs() {
        let r = RateLimit::sample_to_insert_ratio(4.0, 100, 64.0).unwrap();
        assert_eq!(r.diff_band(), (400.0 - 64.0, 400.0 + 64.0));
        assert_eq!(r.min_size_to_sample(), 100);
        let q = RateLimit::queue(10).unwrap();
        assert_eq!((q.diff_band(), q.samples_per_insert()), ((0.0, 10.0), 1.0));
        let m = RateLimit::min_size(5);
        assert_eq!(m.diff_band(), (f64::NEG_INFINITY, f64::INFINITY));
    }

    #[test]
    fn limits_that_cannot_be_kept_are_refused() {
        for bad in [
            RateLimit::new(0, 0.0, 0.0, 1.0),
            RateLimit::new(0, f64::NAN, 0.0, 1.0),
            RateLimit::new(0, f64::INFINITY, 0.0, 1.0),
            RateLimit::new(0, 1.0, 2.0, 1.0),
            RateLimit::new(0, 1.0, 1.0, 1.0),
            RateLimit::new(0, 1.0, f64::NAN, 1.0),
            RateLimit::sample_to_insert_ratio(4.0, 10, 7.9),
            RateLimit::sample_to_insert_ratio(0.5, 10, 1.9),
            RateLimit::sample_to_insert_ratio(1.0, 10, f64::NAN),
            RateLimit::queue(0),
        ] {
            assert!(
                matches!(bad, Err(RateLimitError::Invalid { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn each_side_goes_by_the_counts_before_it() {
        // Queue of 2: inserts go while fewer than 2 rows are unsampled, samples while
        // any is.
        let zero = Some(Duration::ZERO);
        let limit = RateLimit::queue(2).unwrap();
        let l = RateLimiter::new(limit.insert_timeout(zero).sample_timeout(zero));
        assert!(matches!(l.sample(1), Err(RateLimitError::Timeout { .. })));
        l.insert(1).unwrap();
        l.insert(5).unwrap(); // judged by diff 1 < 2: goes, and overshoots to 6
        assert!(matches!(
            l.insert(1),
            Err(RateLimitError::Timeout { inserts: 6, .. })
        ));
        l.sample(5).unwrap(); // diff 6 > 0
        l.insert(1).unwrap(); // diff 1 < 2
        assert_eq!(l.stats().diff(), 2.0);
        l.sample(2).unwrap();
        assert!(matches!(
            l.sample(1),
            Err(RateLimitError::Timeout { samples: 7, .. })
        ));
        let s = l.stats();
        assert_eq!((s.inserts, s.samples), (7, 7));
        // A wider limit, put in force at run time: the insert goes.
        l.set(RateLimit::queue(3).unwrap().insert_timeout(zero));
        l.insert(1).unwrap();
    }

    #[test]
    fn refunds_and_closing_wake_waiters() {
        let l = std::sync::Arc::new(RateLimiter::new(RateLimit::queue(1).unwrap()));
        l.insert(1).unwrap(); // diff 1: inserts now wait
        let waiter = {
            let l = l.clone();
            crate::sync::thread::spawn("waiter".into(), move || l.insert(1)).unwrap()
        };
        // A refund takes the row back: the waiting insert goes.
        std::thread::sleep(Duration::from_millis(20));
        l.refund_inserts(1);
        waiter.join().unwrap().unwrap();
        let waiter = {
            let l = l.clone();
            crate::sync::thread::spawn("waiter".into(), move || l.insert(1)).unwrap()
        };
        std::thread::sleep(Duration::from_millis(20));
        l.close(true);
        assert_eq!(waiter.join().unwrap(), Err(RateLimitError::Closed));
        let s = l.stats();
        assert!(s.closed && s.insert_waits == 1 && s.insert_waited > Duration::ZERO);
        // Closed: what would wait fails; what may go still goes.
        assert_eq!(l.insert(1), Err(RateLimitError::Closed));
        l.sample(1).unwrap();
    }
}
