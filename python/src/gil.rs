//! Releasing the GIL for native work, and taking it back without a sleep where a wait
//! would be short.
//!
//! Every call that copies rows, draws, or waits runs with the GIL released
//! ([`detach`]), so a collector thread and a learner thread move rows at once. Each
//! call still holds the GIL for a microsecond or two around its native part, and so
//! does the caller's own loop. When a thread's native part ends while the other
//! thread is in such a stretch, CPython's `take_gil` puts it to sleep on a condition
//! variable until the holder lets go; the wake-up that follows costs far more than the
//! wait itself on a machine whose idle cores halt (tens of microseconds on a virtual
//! machine without guest halt-polling, against a hold of one or two). On such a
//! machine a learner beside a collector kept only 60-75% of its solo rate, off its
//! core a quarter of the time.
//!
//! So a thread about to take the GIL back first looks whether another thread went
//! back into Python from one of these calls very recently, and has not yet released
//! the GIL again in its next call: such a thread holds the GIL and will most likely
//! hand it back within microseconds. It spins (with a bound) until that thread
//! releases, and then takes the GIL uncontended. A thread that has been back in Python
//! for longer than [`RECENT`] is doing other work (a training step, its own Python
//! code), and nobody spins for it; nor for threads that hold the GIL without having
//! called in here. A wrong guess costs at most [`SPIN`] of spinning, and never
//! correctness: the GIL itself is taken the usual way.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use pyo3::Python;

/// Threads tracked; a thread beyond these shares a slot with an earlier one, which at
/// worst makes a spin end early or start needlessly.
const SLOTS: usize = 64;

/// How long after going back into Python a thread still counts as about to release
/// the GIL: a few of these calls' own holds.
const RECENT: Duration = Duration::from_micros(20);

/// The longest a thread spins before it takes the GIL the usual way.
const SPIN: Duration = Duration::from_micros(20);

/// Per slot: when its thread last went back into Python from a call here, in
/// nanoseconds after [`epoch`] plus one; 0 while it is inside the call's native part
/// (or has never called).
static BACK_IN_PYTHON: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// Slots handed out so far.
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static SLOT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

fn my_slot() -> usize {
    SLOT.with(|slot| {
        slot.get().unwrap_or_else(|| {
            let k = SLOTS_USED.fetch_add(1, Ordering::Relaxed) % SLOTS;
            slot.set(Some(k));
            k
        })
    })
}

/// Runs `f` with the GIL released (as `Python::detach`), and before taking the GIL
/// back waits, briefly, for a thread that is likely to release it within
/// microseconds (see the module docs).
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    let me = my_slot();
    let out = py.detach(|| {
        // Only once the GIL is released: a thread that sees this and takes the GIL
        // must find it free, or it sleeps after all.
        BACK_IN_PYTHON[me].store(0, Ordering::Release);
        let out = f();
        await_release(me);
        out
    });
    BACK_IN_PYTHON[me].store(now_ns() + 1, Ordering::Release);
    out
}

/// Spins while another thread went back into Python within [`RECENT`] and has not
/// called in again, for at most [`SPIN`].
fn await_release(me: usize) {
    let used = SLOTS_USED.load(Ordering::Relaxed).min(SLOTS);
    if used < 2 {
        return;
    }
    let (recent, spin) = (RECENT.as_nanos() as u64, SPIN.as_nanos() as u64);
    let start = now_ns();
    loop {
        let now = now_ns();
        let holder = (0..used).filter(|&k| k != me).any(|k| {
            let back = BACK_IN_PYTHON[k].load(Ordering::Acquire);
            back != 0 && now < back - 1 + recent
        });
        if !holder || now - start >= spin {
            return;
        }
        std::hint::spin_loop();
    }
}
