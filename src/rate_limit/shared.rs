//! The rate limit of a shared buffer: one rule, kept by every process that maps the
//! region.
//!
//! The counts, the limit and the sleepers live in the region's rate-limit block
//! (`storage/layout.rs`), so collector processes and learner processes count into the
//! same `diff` and wake each other. The rule is the heap limiter's ([`super`]): a
//! call is judged by the counts before it, then adds all of its rows. What differs is
//! how the counts are kept: no process may hold a lock another process would have to
//! wait on (it could die holding it), so the counts are two atomic words and a call
//! judges them and then adds its rows with no lock in between. Calls that start at
//! the same moment may all pass on the same counts, so `diff` overshoots the band by
//! at most one call per caller racing (one call in all, in the heap limiter). An
//! insert and a sample still never wait on each other at once: that would take
//! `max_diff <= diff <= min_diff`.
//!
//! # Words
//!
//! ```text
//! line 0  INSERTS                       collectors' line
//! line 1  SAMPLES                       learners' line
//! line 2  WAKE WAITERS INSERT_WAITS INSERT_WAITED_NS SAMPLE_WAITS SAMPLE_WAITED_NS SETTER
//! line 3  VERSION FLAGS MIN_SIZE SPI MIN_DIFF MAX_DIFF INSERT_TIMEOUT_NS SAMPLE_TIMEOUT_NS
//! ```
//!
//! - `WAKE` is a futex ([`Futex`]): a sleeper reads it, checks the counts, and sleeps
//!   while it is unchanged; whoever moves the counts with sleepers about bumps it and
//!   wakes them all, in every process. `WAITERS` counts the sleepers, so that a call
//!   that moves the counts with nobody asleep makes no system call.
//! - The limit (line 3 from `MIN_SIZE` on; `f64` bits, timeouts in nanoseconds with
//!   `u64::MAX` for none) is a seqlock under `VERSION` (odd while it is written).
//!   Setters take turns through `SETTER` (the process-table holder word of the one
//!   writing, 0: none); a setter that finds it held by a process that died (its entry's
//!   lock gone, as a lease's holder is judged) takes it over. A pid named another
//!   process, or none, across PID namespaces: a live setter was taken for dead and two
//!   wrote the limit at once. A reader never
//!   waits on a setter: each handle keeps the last limit it read whole and uses it
//!   while a new one is being written.
//! - `FLAGS`: [`ON`] once the region's creator has put its limit in (a buffer built
//!   without one has none, and every call goes straight through), [`CLOSED`].
//!
//! # Memory ordering
//!
//! The counts, `WAITERS` and `WAKE` are all `SeqCst`. A sleeper increments `WAITERS`,
//! reads `WAKE`, then reads the counts; a mover adds its rows, then reads `WAITERS`,
//! and if it is not zero bumps `WAKE` (the two reads are [`handshake_load`]s: loom
//! needs them to be read-modify-writes to see what the total order guarantees). In
//! their single total order, either the sleeper's read of the counts comes after the
//! mover's add (it sees the move and does not sleep), or the mover's read of
//! `WAITERS` comes after the sleeper's increment (it bumps `WAKE` after the sleeper
//! read it, and the kernel, which compares `WAKE` with what the sleeper read as it
//! queues it, either refuses the sleep or is told to wake it). So no move is missed
//! by a sleeper, and every sleep ends when the other side moves, the limit changes,
//! the limiter is closed, or the call's timeout passes; a sleeper that dies leaves
//! `WAITERS` one too high, which costs later movers a system call and nothing else.
//! A setter and a closer always bump `WAKE` and wake, and a sleeper reads the limit
//! and the flags again after it read `WAKE`: whatever they changed before the bump it
//! then sees, or its sleep is refused or woken. The limit's seqlock: the setter
//! stores an odd `VERSION`, fences (Release), stores the fields and stores the next
//! even `VERSION` with Release; a reader loads `VERSION` (Acquire), the fields, fences
//! (Acquire) and loads `VERSION` again, keeping the fields only if both loads agree
//! and are even.
//!
//! Layer: api.

use std::time::{Duration, Instant};

use super::{may_go, timeout_error, Interrupt, RateLimit, RateLimitStats, Side};
use crate::error::RateLimitError;
use crate::region::Block;
use crate::shared::procs::{runs, Holder, ProcTable};
use crate::sync::{fence, handshake_load, yield_now, AtomicU64, Futex, Mutex, Ordering, Parking};

/// Words of a line.
const LINE: usize = 8;
const INSERTS: usize = 0;
const SAMPLES: usize = LINE;
const WAKE: usize = 2 * LINE;
const WAITERS: usize = 2 * LINE + 1;
const INSERT_WAITS: usize = 2 * LINE + 2;
const INSERT_WAITED_NS: usize = 2 * LINE + 3;
const SAMPLE_WAITS: usize = 2 * LINE + 4;
const SAMPLE_WAITED_NS: usize = 2 * LINE + 5;
const SETTER: usize = 2 * LINE + 6;
const VERSION: usize = 3 * LINE;
const FLAGS: usize = 3 * LINE + 1;
const MIN_SIZE: usize = 3 * LINE + 2;
const SPI: usize = 3 * LINE + 3;
const MIN_DIFF: usize = 3 * LINE + 4;
const MAX_DIFF: usize = 3 * LINE + 5;
const INSERT_TIMEOUT_NS: usize = 3 * LINE + 6;
const SAMPLE_TIMEOUT_NS: usize = 3 * LINE + 7;
// The four lines are the block the region's layout sets aside.
const _: () = assert!(4 * LINE == crate::storage::layout::LIMITER_WORDS);

/// `FLAGS`: the region has a limit.
const ON: u64 = 1;
/// `FLAGS`: the limiter is closed.
const CLOSED: u64 = 2;
/// A timeout word's "none".
const NO_TIMEOUT: u64 = u64::MAX;

/// How long a setter waits for another live process to finish setting a limit
/// before it gives up, and how long a handle that never read the limit whole waits
/// for a setter before it reads the words as they are (their setter died mid-write).
const SETTER_PATIENCE: Duration = Duration::from_secs(2);

/// One process's handle on a shared region's rate limit.
#[derive(Debug)]
pub(crate) struct SharedLimiter {
    block: Block,
    /// The region's process table and this process's entry in it, which name and
    /// judge setters (`None`: a limiter of no process table, judged by pid).
    member: Option<(ProcTable, Holder)>,
    /// The limit as last read whole, and the `VERSION` it was read at (`None`: never).
    read: Mutex<Option<(u64, RateLimit)>>,
    /// Where `WAKE`'s sleepers sleep (the kernel's queue; under loom, its twin).
    parking: Parking,
}

impl SharedLimiter {
    /// The limiter over a region's rate-limit block, of the process whose entry of
    /// the region's process table `member` names.
    pub(crate) fn new(block: Block, member: Option<(ProcTable, Holder)>) -> SharedLimiter {
        SharedLimiter {
            block,
            member,
            read: Mutex::new(None),
            parking: Parking::default(),
        }
    }

    fn word(&self, w: usize) -> &AtomicU64 {
        self.block.word(w)
    }

    fn futex(&self) -> Futex<'_> {
        Futex::in_word(self.word(WAKE), &self.parking)
    }

    /// Whether the region has a limit.
    pub(crate) fn is_on(&self) -> bool {
        self.word(FLAGS).load(Ordering::Acquire) & ON != 0
    }

    /// Puts the region's first limit in: what its creator does, once.
    pub(crate) fn install(&self, limit: RateLimit) -> Result<(), RateLimitError> {
        self.write(limit, ON)
    }

    /// Puts `limit` in force for every process, waking every sleeper to judge itself
    /// by it. [`RateLimitError::NoLimit`] if the region has none.
    pub(crate) fn set(&self, limit: RateLimit) -> Result<(), RateLimitError> {
        if !self.is_on() {
            return Err(RateLimitError::NoLimit);
        }
        self.write(limit, 0)
    }

    /// Writes `limit` under the seqlock, `FLAGS |= flags`, and wakes everyone.
    fn write(&self, limit: RateLimit, flags: u64) -> Result<(), RateLimitError> {
        let me = self
            .member
            .as_ref()
            .map_or(u64::from(std::process::id()), |(_, me)| me.0);
        let alive = |holder: u64| match &self.member {
            Some((table, _)) => table.alive(holder),
            None => runs(holder as u32),
        };
        let setter = self.word(SETTER);
        let start = Instant::now();
        loop {
            match setter.compare_exchange(0, me, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(holder) if !alive(holder) => {
                    // Its holder died: take its turn over (and rewrite every field).
                    if setter
                        .compare_exchange(holder, me, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        break;
                    }
                }
                Err(holder) => {
                    if start.elapsed() > SETTER_PATIENCE {
                        let pid = Holder(holder).pid();
                        return Err(RateLimitError::SetterBusy { pid });
                    }
                    yield_now();
                }
            }
        }
        let version = self.word(VERSION);
        // A setter that died mid-write left it odd: the next even number is ours.
        let v = (version.load(Ordering::Relaxed) | 1) + 1;
        version.store(v - 1, Ordering::Relaxed);
        // SYNC POINT: pairs with the reader's Acquire fence in `limit`.
        fence(Ordering::Release);
        let store = |w: usize, x: u64| self.word(w).store(x, Ordering::Relaxed);
        store(MIN_SIZE, limit.min_size_to_sample);
        store(SPI, limit.samples_per_insert.to_bits());
        store(MIN_DIFF, limit.min_diff.to_bits());
        store(MAX_DIFF, limit.max_diff.to_bits());
        store(INSERT_TIMEOUT_NS, encode(limit.insert_timeout));
        store(SAMPLE_TIMEOUT_NS, encode(limit.sample_timeout));
        // SYNC POINT: pairs with the reader's Acquire load of `VERSION` in `limit`.
        version.store(v, Ordering::Release);
        self.word(FLAGS).fetch_or(flags, Ordering::SeqCst);
        setter.store(0, Ordering::SeqCst);
        self.wake_all();
        Ok(())
    }

    /// The limit in force (`None` if the region has none): the one this handle last
    /// read whole if it has not changed or is being written.
    fn limit(&self) -> Option<RateLimit> {
        if !self.is_on() {
            return None;
        }
        let version = self.word(VERSION);
        let mut read = self.read.lock();
        let start = Instant::now();
        loop {
            let v = version.load(Ordering::Acquire);
            match *read {
                Some((seen, limit)) if seen == v || !v.is_multiple_of(2) => return Some(limit),
                _ => {}
            }
            let load = |w: usize| self.word(w).load(Ordering::Relaxed);
            let limit = RateLimit {
                min_size_to_sample: load(MIN_SIZE),
                samples_per_insert: f64::from_bits(load(SPI)),
                min_diff: f64::from_bits(load(MIN_DIFF)),
                max_diff: f64::from_bits(load(MAX_DIFF)),
                insert_timeout: decode(load(INSERT_TIMEOUT_NS)),
                sample_timeout: decode(load(SAMPLE_TIMEOUT_NS)),
            };
            // SYNC POINT: pairs with the setter's Release fence in `write`.
            fence(Ordering::Acquire);
            let whole = v.is_multiple_of(2) && version.load(Ordering::Relaxed) == v;
            if whole || start.elapsed() > SETTER_PATIENCE {
                // Past the patience, a setter died mid-write and nobody set a limit
                // since: its words are each a whole value, old or new.
                *read = Some((v, limit));
                return Some(limit);
            }
            yield_now();
        }
    }

    /// Waits until `rows` rows of `side` may go, then counts them. `Ok(false)`: the
    /// region has no limit, and nothing was counted.
    pub(super) fn admit(&self, side: Side, rows: u64) -> Result<bool, RateLimitError> {
        let Some(mut limit) = self.limit() else {
            return Ok(false);
        };
        let futex = self.futex();
        let mut since: Option<Instant> = None;
        let mut interrupt: Option<Interrupt> = None;
        loop {
            let (inserts, samples) = self.counts();
            if may_go(&limit, inserts, samples, side) {
                self.count(side).fetch_add(rows, Ordering::SeqCst);
                if let Some(t) = since {
                    let (waits, waited) = match side {
                        Side::Insert => (INSERT_WAITS, INSERT_WAITED_NS),
                        Side::Sample => (SAMPLE_WAITS, SAMPLE_WAITED_NS),
                    };
                    self.word(waits).fetch_add(1, Ordering::Relaxed);
                    let ns = t.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                    self.word(waited).fetch_add(ns, Ordering::Relaxed);
                }
                self.wake_sleepers();
                return Ok(true);
            }
            if self.closed() {
                return Err(RateLimitError::Closed);
            }
            let start = *since.get_or_insert_with(Instant::now);
            let timeout = match side {
                Side::Insert => limit.insert_timeout,
                Side::Sample => limit.sample_timeout,
            };
            let left = match timeout {
                Some(t) => match t.checked_sub(start.elapsed()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(self.timeout_error(limit, start.elapsed())),
                },
                None => None,
            };
            let interrupt = interrupt.get_or_insert_with(|| Interrupt::new(start));
            if interrupt.stops() {
                return Err(RateLimitError::Interrupted);
            }
            let now = Instant::now();
            let left = interrupt
                .wake_at(left.map(|left| now + left))
                .map(|at| at.saturating_duration_since(now));
            let waiters = self.word(WAITERS);
            waiters.fetch_add(1, Ordering::SeqCst);
            let seen = futex.load();
            // Everything a waker changed before the bump `seen` may already hold is
            // read again after it: the counts, the closed flag, and the limit (a
            // setter stores it before it bumps; loom found the sleep that a stale
            // limit here let through).
            limit = self.limit().unwrap_or(limit);
            let (inserts, samples) = (
                handshake_load(self.word(INSERTS)),
                handshake_load(self.word(SAMPLES)),
            );
            if !may_go(&limit, inserts, samples, side) && !self.closed() {
                futex.wait(seen, left);
            }
            waiters.fetch_sub(1, Ordering::SeqCst);
            limit = self.limit().unwrap_or(limit);
        }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.word(INSERTS).load(Ordering::SeqCst),
            self.word(SAMPLES).load(Ordering::SeqCst),
        )
    }

    fn count(&self, side: Side) -> &AtomicU64 {
        self.word(match side {
            Side::Insert => INSERTS,
            Side::Sample => SAMPLES,
        })
    }

    fn closed(&self) -> bool {
        self.word(FLAGS).load(Ordering::SeqCst) & CLOSED != 0
    }

    /// Takes back `rows` of `side`'s count (never below zero), and wakes the sleepers.
    pub(super) fn refund(&self, side: Side, rows: u64) {
        if rows == 0 {
            return;
        }
        let count = self.count(side);
        let mut now = count.load(Ordering::SeqCst);
        while let Err(seen) = count.compare_exchange(
            now,
            now.saturating_sub(rows),
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            now = seen;
        }
        self.wake_sleepers();
    }

    /// Starts the counts over at `inserts` rows inserted and `samples` sampled, and
    /// wakes the sleepers.
    pub(super) fn restart_at(&self, inserts: u64, samples: u64) {
        self.word(INSERTS).store(inserts, Ordering::SeqCst);
        self.word(SAMPLES).store(samples, Ordering::SeqCst);
        self.wake_sleepers();
    }

    /// Wakes the sleepers, if any (see the module's ordering argument).
    fn wake_sleepers(&self) {
        if handshake_load(self.word(WAITERS)) > 0 {
            self.wake_all();
        }
    }

    fn wake_all(&self) {
        let futex = self.futex();
        futex.bump();
        futex.wake_all();
    }

    /// Fails every call that waits now or would wait later, in every process (until
    /// reopened).
    pub(crate) fn close(&self, closed: bool) -> Result<(), RateLimitError> {
        if !self.is_on() {
            return Err(RateLimitError::NoLimit);
        }
        let flags = self.word(FLAGS);
        if closed {
            flags.fetch_or(CLOSED, Ordering::SeqCst);
        } else {
            flags.fetch_and(!CLOSED, Ordering::SeqCst);
        }
        self.wake_all();
        Ok(())
    }

    /// The counts, waits and limit now, all processes together (`None`: no limit).
    pub(crate) fn stats(&self) -> Option<RateLimitStats> {
        let limit = self.limit()?;
        let load = |w: usize| self.word(w).load(Ordering::SeqCst);
        Some(RateLimitStats {
            limit,
            inserts: load(INSERTS),
            samples: load(SAMPLES),
            insert_waits: load(INSERT_WAITS),
            insert_waited: Duration::from_nanos(load(INSERT_WAITED_NS)),
            sample_waits: load(SAMPLE_WAITS),
            sample_waited: Duration::from_nanos(load(SAMPLE_WAITED_NS)),
            closed: self.closed(),
        })
    }

    fn timeout_error(&self, limit: RateLimit, waited: Duration) -> RateLimitError {
        let (inserts, samples) = self.counts();
        timeout_error(&limit, inserts, samples, waited)
    }
}

/// A timeout as its word.
fn encode(t: Option<Duration>) -> u64 {
    t.map_or(NO_TIMEOUT, |d| {
        d.as_nanos().min(u128::from(NO_TIMEOUT - 1)) as u64
    })
}

/// A timeout word as the timeout.
fn decode(w: u64) -> Option<Duration> {
    (w != NO_TIMEOUT).then(|| Duration::from_nanos(w))
}

/// A shared region's limiter over a heap region of its own: the algorithm above,
/// without processes, for its loom model (`loom-tests/tests/rate_limit.rs`).
#[cfg(feature = "internals")]
#[derive(Debug)]
pub struct RegionRateLimiter(SharedLimiter);

#[cfg(feature = "internals")]
impl RegionRateLimiter {
    /// A limiter keeping `limit`, nothing counted yet.
    pub fn new(limit: RateLimit) -> RegionRateLimiter {
        let region = std::sync::Arc::new(
            crate::region::Region::heap(crate::storage::layout::LIMITER_WORDS)
                .expect("a region of a few words"),
        );
        let l = SharedLimiter::new(
            Block::new(&region, 0, crate::storage::layout::LIMITER_WORDS),
            None,
        );
        l.install(limit).expect("nobody else sets it");
        RegionRateLimiter(l)
    }

    /// Waits until `rows` rows may be inserted, then counts them.
    pub fn insert(&self, rows: u64) -> Result<(), RateLimitError> {
        self.0.admit(Side::Insert, rows).map(drop)
    }

    /// Waits until `rows` rows may be sampled, then counts them.
    pub fn sample(&self, rows: u64) -> Result<(), RateLimitError> {
        self.0.admit(Side::Sample, rows).map(drop)
    }

    /// Puts `limit` in force.
    pub fn set(&self, limit: RateLimit) -> Result<(), RateLimitError> {
        self.0.set(limit)
    }

    /// Closes or reopens the limiter.
    pub fn close(&self, closed: bool) -> Result<(), RateLimitError> {
        self.0.close(closed)
    }

    /// The counts now.
    pub fn stats(&self) -> RateLimitStats {
        self.0.stats().expect("installed")
    }
}

#[cfg(all(test, not(replaybuf_loom), target_os = "linux"))]
mod tests {
    use super::SETTER;
    use crate::rate_limit::Limiter;
    use crate::sync::Ordering;
    use crate::{DType, RateLimit, ReplayBuffer, Spec};

    /// A setter is judged by its entry of the process table, as a lease's holder is:
    /// one whose entry nobody holds is dead, whatever process its pid names now (a
    /// dead setter's pid, run again by another process, made every later set wait
    /// and fail as busy), and a live member is waited for.
    #[test]
    fn a_setter_is_judged_by_its_table_entry_not_its_pid() {
        let name = format!("test-limit-setter-{}", std::process::id());
        let spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
        let rb = ReplayBuffer::builder(spec)
            .capacity(64)
            .shared(&name)
            .rate_limit(RateLimit::min_size(1))
            .build()
            .unwrap();
        let Some(Limiter::Shared(limiter)) = rb.limiter.as_deref() else {
            panic!("a shared buffer's limiter");
        };
        let setter = limiter.word(SETTER);
        // Entry 63, never claimed, with this (running) process's pid.
        let dead = (64 << 56) | (1 << 32) | u64::from(std::process::id());
        setter.store(dead, Ordering::SeqCst);
        rb.set_rate_limit(RateLimit::min_size(2)).unwrap();
        assert_eq!(rb.rate_limit_stats().unwrap().limit.min_size_to_sample, 2);
        let other = ReplayBuffer::attach(&name).unwrap();
        let (_, live) = other.state().core.storage.member_entry().unwrap();
        setter.store(live.0, Ordering::SeqCst);
        let e = rb.set_rate_limit(RateLimit::min_size(3)).unwrap_err();
        assert!(
            matches!(e, crate::RateLimitError::SetterBusy { .. }),
            "{e:?}"
        );
        setter.store(0, Ordering::SeqCst);
        drop(other);
    }
}
