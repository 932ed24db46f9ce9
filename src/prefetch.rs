//! Prefetch: worker threads keep up to `depth` items (sampled batches, or what a
//! loader's collate step makes of them) ready for one learner, in reusable buffers.
//!
//! # The handoff
//!
//! One mutex guards a small state: the queue of ready items (results, so that a
//! sampler's error reaches the learner in its place), the free buffers, how many
//! workers are filling one, how many times the learner asked, and a few flags. Two condition variables wake the two sides:
//!
//! - a worker starts a fill only while `ready + busy < depth`, so at most `depth`
//!   items are ever prepared or in preparation: with `depth = 1` exactly one batch is
//!   prepared ahead (TorchRL kept one fewer than asked for years, pytorch/rl #3870);
//! - a worker with no room polls for a while (naps of [`POLL_NAP`], for about
//!   [`POLLS_BEFORE_PARK`] naps) before it sleeps on the condition variable: a learner
//!   that takes a batch every step then finds no worker asleep and wakes nobody. Waking
//!   a sleeping thread is a system call and an interrupt to another core (6.5 µs per
//!   wakeup measured on the 2-core development VM), more than the whole budget of a
//!   `sample` that finds its batch ready. A learner that pauses longer pays one
//!   wakeup when it comes back;
//! - the fill itself (the sample, transforms, preprocessor, collate) runs outside the
//!   lock; the learner's take holds it only to pop an item and push back the buffer
//!   it replaces;
//! - a fill that ends a without-replacement epoch pauses every worker until the
//!   learner has taken that end and asks again: no draw of the next epoch starts
//!   before the learner asks for it, and a loader dropped at an epoch's end, before
//!   or after the learner saw it end, has not started the next one (one loader an
//!   epoch loses no row of the next);
//! - any other error pauses the workers too, and is handed over only if its fill
//!   started after the learner asked (each take counts as an ask, and each fill
//!   carries the count it started at): an error prepared ahead is dropped and a fresh
//!   fill made instead. So an error describes the buffer when the learner asked: a
//!   loader started on an empty buffer that has been filled since gives a batch, not
//!   the `Empty` its workers saw at the start. A pipeline stage's error (a user's
//!   preprocess or collate) is handed over whenever prepared, as an epoch's end is:
//!   it says nothing of the buffer, and the rows its fill drew are gone from an
//!   epoch (dropped, the learner never learnt of them);
//! - a fill that panics (a user's closure) stops the workers; once the learner has
//!   taken the items prepared before it, its next take resumes the panic on its own
//!   thread;
//! - the learner's wait for an item ends, as a rate-limited wait does, when the check
//!   its thread put in force says so (`RateLimit::interruptible`), with
//!   [`RateLimitError::Interrupted`];
//! - dropping the handle sets `stop`, wakes everyone and joins every worker: a worker
//!   in the middle of a fill finishes that fill (one waiting on the buffer's rate
//!   limit gives up within 50 ms: `RateLimit::interruptible`) and exits, nothing waits on the
//!   learner, so shutdown cannot deadlock and leaves no thread behind.
//!
//! Priority updates are honoured by every draw that starts after them: a worker draws
//! from the live trees when it starts a fill. So after an update, at most `depth`
//! items drawn before it reach the learner; the next is drawn after it.
//!
//! # Memory ordering
//!
//! Everything shared is behind the mutex (the facade's, so loom sees it, and
//! `loom-tests/tests/prefetch.rs` checks the handoff); items cross threads by moving
//! through the queue under it.
//!
//! Layer: faces.

use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use crate::error::{RateLimitError, SampleError};
use crate::rate_limit::Interrupt;
use crate::sync::{thread, Arc, Condvar, Mutex};

/// How long a worker with no room naps between looks (the kernel adds its timer slack,
/// 50 µs by default).
const POLL_NAP: std::time::Duration = std::time::Duration::from_micros(10);
/// Naps a worker with no room takes before it sleeps until woken: about 2 ms with the
/// default timer slack, several learner steps of the usual sizes.
const POLLS_BEFORE_PARK: u32 = if cfg!(replaybuf_loom) { 1 } else { 32 };

/// What a worker runs to fill one item: the buffer to reuse (`None`: make one), left
/// holding the item.
pub(crate) type Fill<T> = Box<dyn FnMut(&mut Option<T>) -> Result<(), SampleError> + Send>;

/// A filled item, and the learner's ask count when its fill started.
struct Filled<T> {
    ticket: u64,
    item: Result<T, SampleError>,
}

struct Slots<T> {
    /// Items ready for the learner, oldest first.
    ready: VecDeque<Filled<T>>,
    /// Takes the learner has started: a fill records it as its ticket.
    asks: u64,
    /// Buffers to reuse (at most `depth`).
    free: Vec<T>,
    /// Workers filling an item now.
    busy: usize,
    /// The handle is gone: workers exit.
    stop: bool,
    /// An error (an epoch's end, say) is queued: no fill starts until the learner
    /// takes it (an epoch's end: until it asks again after).
    paused: bool,
    /// The learner took an epoch's end: its next ask lifts the pause.
    resume_on_ask: bool,
    /// A fill panicked with this payload; the learner's next take resumes it.
    panic: Option<Box<dyn Any + Send>>,
    /// A fill panicked (and the learner was told): nothing more will come.
    poisoned: bool,
}

struct Handoff<T> {
    slots: Mutex<Slots<T>>,
    /// Wakes the learner: an item is ready.
    ready: Condvar,
    /// Wakes a worker: there is room for a fill, or it must stop.
    room: Condvar,
    depth: usize,
    /// Set with `stop`, read without the lock by a worker's fill waiting on the
    /// buffer's rate limit ([`stopped`]).
    #[cfg(not(replaybuf_loom))]
    stopping: Arc<crate::sync::AtomicBool>,
}

#[cfg(not(replaybuf_loom))]
std::thread_local! {
    /// The stop flag of the pool this worker thread fills for.
    static STOPPING: std::cell::RefCell<Option<Arc<crate::sync::AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether this worker's pool is being dropped: the check of a fill's rate-limited
/// wait (`RateLimit::interruptible`), which would otherwise wait, with no timeout,
/// for inserts that may never come while the drop waits to join it.
#[cfg(not(replaybuf_loom))]
fn stopped() -> bool {
    STOPPING.with(|s| {
        s.borrow()
            .as_ref()
            .is_some_and(|f| f.load(crate::sync::Ordering::Acquire))
    })
}

/// A learner's pool of prefetch workers.
pub(crate) struct Prefetch<T: Send + 'static> {
    handoff: Arc<Handoff<T>>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl<T: Send + 'static> Prefetch<T> {
    /// Starts one worker per fill, named `{name}-{i}`, keeping up to `depth` items
    /// (`depth >= 1`) ready.
    pub(crate) fn spawn(depth: usize, fills: Vec<Fill<T>>, name: &str) -> io::Result<Self> {
        debug_assert!(depth >= 1 && !fills.is_empty());
        let handoff = Arc::new(Handoff {
            slots: Mutex::new(Slots {
                ready: VecDeque::with_capacity(depth),
                asks: 0,
                free: Vec::with_capacity(depth),
                busy: 0,
                stop: false,
                paused: false,
                resume_on_ask: false,
                panic: None,
                poisoned: false,
            }),
            ready: Condvar::new(),
            room: Condvar::new(),
            depth,
            #[cfg(not(replaybuf_loom))]
            stopping: Default::default(),
        });
        let mut pool = Prefetch {
            handoff,
            workers: Vec::with_capacity(fills.len()),
        };
        for (i, fill) in fills.into_iter().enumerate() {
            let handoff = pool.handoff.clone();
            // On an error the workers started so far are stopped and joined by `pool`'s
            // drop.
            pool.workers
                .push(thread::spawn(format!("{name}-{i}"), move || {
                    work(&handoff, fill)
                })?);
        }
        Ok(pool)
    }

    /// Items ready now.
    pub(crate) fn ready(&self) -> usize {
        self.handoff.slots.lock().ready.len()
    }

    /// The most items prepared ahead.
    pub(crate) fn depth(&self) -> usize {
        self.handoff.depth
    }

    /// Waits for the oldest ready item and moves it into `out`; `out`'s previous item
    /// becomes a buffer to reuse. A fill's error comes back in its place (and `out` is
    /// left as it was).
    pub(crate) fn take_into(&self, out: &mut T) -> Result<(), SampleError> {
        let item = self.take_with(|st, item| {
            let mut item = item?;
            std::mem::swap(out, &mut item);
            keep(st, item, self.handoff.depth);
            Ok(())
        });
        self.handoff.room.notify_one();
        item
    }

    /// Waits for the oldest ready item and hands it over.
    pub(crate) fn take(&self) -> Result<T, SampleError> {
        let item = self.take_with(|_, item| item);
        self.handoff.room.notify_one();
        item
    }

    /// Gives a buffer back for reuse.
    pub(crate) fn recycle(&self, item: T) {
        keep(&mut self.handoff.slots.lock(), item, self.handoff.depth);
    }

    /// Pops the oldest ready item under the lock and runs `with` on it there, dropping
    /// errors prepared before this ask.
    fn take_with<R>(&self, with: impl FnOnce(&mut Slots<T>, Result<T, SampleError>) -> R) -> R {
        let mut st = self.handoff.slots.lock();
        st.asks += 1;
        let ask = st.asks;
        let mut interrupt = None;
        if std::mem::take(&mut st.resume_on_ask) {
            st.paused = false;
            self.handoff.room.notify_all();
        }
        loop {
            // Items prepared before a fill panicked come first: their rows were drawn.
            let ready = st.ready.pop_front();
            if ready.is_none() {
                if let Some(payload) = st.panic.take() {
                    st.poisoned = true;
                    drop(st);
                    panic::resume_unwind(payload);
                }
                assert!(
                    !st.poisoned,
                    "replaybuf: a prefetch worker panicked earlier; this loader delivers nothing more"
                );
            }
            if let Some(Filled { ticket, item }) = ready {
                let Err(e) = &item else {
                    return with(&mut st, item);
                };
                // The learner has seen the error (or it was dropped): fills may start
                // again; after an epoch's end, at the learner's next ask, so that
                // nothing of the next epoch is drawn before it is asked for.
                if matches!(e, SampleError::EpochEnd) {
                    st.resume_on_ask = true;
                } else {
                    st.paused = false;
                }
                // An epoch's end, and a pipeline stage's failure (a user's closure:
                // it says nothing of the buffer that asking again would change, and
                // its rows were drawn), are handed over whenever prepared.
                let kept = matches!(e, SampleError::EpochEnd | SampleError::Pipeline { .. });
                if kept || ticket >= ask {
                    return with(&mut st, item);
                }
                // Prepared before the learner asked: ask again.
                self.handoff.room.notify_one();
                continue;
            }
            // A wait for the workers, who may wait on the buffer's rate limit with no
            // timeout: it ends as that wait would, when the thread's check says so
            // (`RateLimit::interruptible`: Python's Ctrl-C).
            let interrupt = interrupt.get_or_insert_with(|| Interrupt::new(Instant::now()));
            if interrupt.stops() {
                return with(&mut st, Err(RateLimitError::Interrupted.into()));
            }
            st = self.handoff.ready.wait_until(st, interrupt.wake_at(None)).0;
        }
    }
}

/// Keeps `item` as a buffer to reuse, unless `depth` are kept already.
fn keep<T>(st: &mut Slots<T>, item: T, depth: usize) {
    if st.free.len() < depth {
        st.free.push(item);
    }
}

/// A worker: fills items while there is room, until stopped.
fn work<T>(handoff: &Handoff<T>, mut fill: Fill<T>) {
    #[cfg(not(replaybuf_loom))]
    STOPPING.with(|s| *s.borrow_mut() = Some(handoff.stopping.clone()));
    let mut st = handoff.slots.lock();
    let mut polls = 0;
    loop {
        if st.stop {
            return;
        }
        if st.paused || st.ready.len() + st.busy >= handoff.depth {
            // No room: look again after a nap, and after enough of them sleep until
            // the learner (or the drop) wakes this worker.
            if polls < POLLS_BEFORE_PARK {
                polls += 1;
                drop(st);
                crate::sync::nap(POLL_NAP);
                st = handoff.slots.lock();
            } else {
                st = handoff.room.wait(st);
            }
            continue;
        }
        polls = 0;
        st.busy += 1;
        let ticket = st.asks;
        let mut slot = st.free.pop();
        drop(st);
        #[cfg(not(replaybuf_loom))]
        let filled = panic::catch_unwind(AssertUnwindSafe(|| {
            crate::RateLimit::interruptible(stopped, || fill(&mut slot))
        }));
        #[cfg(replaybuf_loom)]
        let filled = panic::catch_unwind(AssertUnwindSafe(|| fill(&mut slot)));
        st = handoff.slots.lock();
        st.busy -= 1;
        match filled {
            Ok(Ok(())) => {
                let item = slot.expect("replaybuf internal error: a fill left no item");
                st.ready.push_back(Filled {
                    ticket,
                    item: Ok(item),
                });
            }
            Ok(Err(e)) => {
                st.paused = true;
                if let Some(buffer) = slot {
                    keep(&mut st, buffer, handoff.depth);
                }
                st.ready.push_back(Filled {
                    ticket,
                    item: Err(e),
                });
            }
            Err(payload) => {
                st.panic = Some(payload);
                st.stop = true;
                handoff.room.notify_all();
                handoff.ready.notify_all();
                return;
            }
        }
        handoff.ready.notify_one();
    }
}

impl<T: Send + 'static> Drop for Prefetch<T> {
    fn drop(&mut self) {
        self.handoff.slots.lock().stop = true;
        #[cfg(not(replaybuf_loom))]
        self.handoff
            .stopping
            .store(true, crate::sync::Ordering::Release);
        self.handoff.room.notify_all();
        for worker in self.workers.drain(..) {
            // A worker's own panics are caught in `work`; a join error cannot carry
            // anything the learner has not been given already.
            let _ = worker.join();
        }
    }
}

impl<T: Send + 'static> std::fmt::Debug for Prefetch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetch")
            .field("depth", &self.handoff.depth)
            .field("workers", &self.workers.len())
            .finish()
    }
}
