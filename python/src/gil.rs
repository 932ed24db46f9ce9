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

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use replaybuf::RateLimit;

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

/// Set by an `atexit` handler ([`exiting`]): the interpreter is shutting down, and
/// the threads left are daemon threads, which CPython (before 3.14) ends by
/// `pthread_exit` when they take the GIL back. That exit unwinds through this
/// module's frames, and the unwind aborts the process: a script whose daemon thread
/// was sampling when its main thread returned died with SIGABRT (exit status 134)
/// every time. (PyO3 parks such threads in `PyGILState_Ensure`, but not in the
/// `PyEval_RestoreThread` that ends `Python::detach`.)
static EXITING: AtomicBool = AtomicBool::new(false);

/// Threads between releasing the GIL in [`detach`] and having it back: those the
/// `atexit` handler waits for, so that none is still taking the GIL back once the
/// interpreter is finalizing.
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// The thread that ran the `atexit` handlers: it finalizes the interpreter, and may
/// call in here while it does (a buffer dropped at exit); it must not park.
static FINALIZER: OnceLock<ThreadId> = OnceLock::new();

/// The longest the `atexit` handler waits for threads inside a native call to park
/// or take the GIL back (a rate-limited wait ends within `RateLimit::INTERRUPT_EVERY`
/// of the mark: [`signal_raised`]); a call that takes longer is left where it is.
const EXIT_WAIT: Duration = Duration::from_secs(1);

/// Registered with `atexit` when the module loads. Marks the interpreter as exiting,
/// and then, the GIL released, waits (at most [`EXIT_WAIT`]) until every thread that
/// released it in [`detach`] has parked or has it back: its native part ends in a
/// park from now on, and a thread already taking the GIL back gets it before the
/// interpreter begins finalizing (Python runs `atexit` handlers after joining the
/// non-daemon threads and before it marks itself finalizing).
#[pyfunction]
pub(crate) fn exiting(py: Python<'_>) {
    let _ = FINALIZER.set(std::thread::current().id());
    EXITING.store(true, Ordering::SeqCst);
    let start = Instant::now();
    while RELEASED.load(Ordering::SeqCst) > 0 && start.elapsed() < EXIT_WAIT {
        py.detach(|| std::thread::sleep(Duration::from_micros(200)));
    }
}

/// The interpreter's main thread, the one that runs signal handlers: known when the
/// module was imported on it (as it nearly always is).
static MAIN: OnceLock<ThreadId> = OnceLock::new();

thread_local! {
    /// The exception a signal handler raised while this thread waited inside
    /// [`detach`] (a Ctrl-C's `KeyboardInterrupt`), for the call to raise instead of
    /// the engine's error (see [`take_raised`]).
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// The check a rate-limited wait inside [`detach`] makes every
/// `RateLimit::INTERRUPT_EVERY` (`RateLimit::interruptible`): on the main thread, runs
/// the signal handlers Python has pending (they run nowhere else, and never while
/// the thread waits in native code), and ends the wait if one raised. An exiting
/// interpreter's daemon thread ends its wait too, and then parks ([`detach`]), where
/// it would have kept the `atexit` handler waiting.
fn signal_raised() -> bool {
    if ended() {
        return true;
    }
    if MAIN.get() != Some(&std::thread::current().id()) {
        return false;
    }
    match Python::attach(|py| py.check_signals()) {
        Ok(()) => false,
        Err(e) => {
            RAISED.with(|r| *r.borrow_mut() = Some(e));
            true
        }
    }
}

/// The exception a signal handler raised while this thread's last [`detach`] waited,
/// if any: the error that call returned (`RateLimitError::Interrupted`) is to be
/// raised as it.
pub(crate) fn take_raised() -> Option<PyErr> {
    RAISED.with(|r| r.borrow_mut().take())
}

/// Registers [`exiting`] with `atexit`, and notes the main thread if this is it.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let threading = m.py().import("threading")?;
    let main = threading.call_method0("main_thread")?;
    if threading.call_method0("current_thread")?.is(&main) {
        let _ = MAIN.set(std::thread::current().id());
    }
    let handler = wrap_pyfunction!(exiting, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (handler,))?;
    Ok(())
}

/// Whether this thread is a daemon thread the exiting interpreter would end.
fn ended() -> bool {
    EXITING.load(Ordering::SeqCst) && FINALIZER.get() != Some(&std::thread::current().id())
}

/// Parks this thread until the process ends.
fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

/// Runs `f` with the GIL released (as `Python::detach`), and before taking the GIL
/// back waits, briefly, for a thread that is likely to release it within
/// microseconds (see the module docs). A rate-limited wait inside `f` ends when a
/// signal handler raises (a Ctrl-C; [`signal_raised`]), with the exception kept for
/// the call's error ([`take_raised`]). Once the interpreter is exiting, a daemon
/// thread that calls in, or whose native part ends, never takes the GIL back: it
/// parks until the process ends (as Python 3.14 parks it), rather than be ended by
/// `pthread_exit` through these frames.
pub(crate) fn detach<T, F>(py: Python<'_>, f: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    if ended() {
        py.detach(|| park_forever());
    }
    let me = my_slot();
    RAISED.with(|r| r.borrow_mut().take());
    RELEASED.fetch_add(1, Ordering::SeqCst);
    let out = py.detach(|| {
        // Only once the GIL is released: a thread that sees this and takes the GIL
        // must find it free, or it sleeps after all.
        BACK_IN_PYTHON[me].store(0, Ordering::Release);
        let out = RateLimit::interruptible(signal_raised, f);
        // After the count went up: the handler waits for this thread, or this
        // thread sees the flag (both sequentially consistent).
        if ended() {
            RELEASED.fetch_sub(1, Ordering::SeqCst);
            park_forever();
        }
        await_release(me);
        out
    });
    RELEASED.fetch_sub(1, Ordering::SeqCst);
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
