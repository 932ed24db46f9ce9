//! The one file that names atomics, locks, cells, spin hints and threads.
//!
//! Everything concurrent in the crate is written against this facade so that one cfg
//! flag swaps the whole crate onto loom's model-checked twins (the tokio `src/loom/`
//! and sharded-slab `src/sync.rs` pattern):
//!
//! ```text
//! RUSTFLAGS="--cfg replaybuf_loom -C debug-assertions" cargo test   # in loom-tests/
//! ```
//!
//! The flag is crate specific on purpose: `RUSTFLAGS` reach every crate in the graph
//! and several of them react to a bare `cfg(loom)`.
//!
//! Under loom:
//! - the atomics, `Arc`, `Mutex`, `Condvar` and threads are loom's;
//! - [`ArcCell`] (an `arc_swap::ArcSwapOption` normally) is a `Mutex<Option<Arc<T>>>`,
//!   and [`ArcSwap`] (an `arc_swap::ArcSwap`) a `Mutex<Arc<T>>`, because loom cannot
//!   see inside arc-swap;
//! - [`spin`] yields to loom's scheduler, so that every wait loop is a point where the
//!   model may switch threads instead of an unbounded spin;
//! - sizes shrink (see `storage::LOOM_*` and the tests): rings of 4 slots, 2 shards.
//!
//! Layer: base.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

#[cfg(not(replaybuf_loom))]
mod imp {
    pub(crate) use std::sync::atomic::{fence, Ordering};
    pub(crate) use std::sync::Arc;

    /// `std`'s `AtomicU64` under the crate's own name (tokio's `loom/std` does the
    /// same), so that `.clippy.toml` can forbid the std type everywhere but here. Same
    /// layout: a region of words can be viewed as `&[AtomicU64]`.
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub struct AtomicU64(std::sync::atomic::AtomicU64);

    impl AtomicU64 {
        /// As `std::sync::atomic::AtomicU64::new`.
        #[inline]
        pub const fn new(v: u64) -> Self {
            Self(std::sync::atomic::AtomicU64::new(v))
        }
        /// As `std::sync::atomic::AtomicU64::load`.
        #[inline]
        pub fn load(&self, order: Ordering) -> u64 {
            self.0.load(order)
        }
        /// As `std::sync::atomic::AtomicU64::store`.
        #[inline]
        pub fn store(&self, v: u64, order: Ordering) {
            self.0.store(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::fetch_add`.
        #[inline]
        pub fn fetch_add(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_add(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::fetch_sub`.
        #[inline]
        pub fn fetch_sub(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_sub(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::swap`.
        #[cfg_attr(not(feature = "internals"), allow(dead_code))]
        #[inline]
        pub fn swap(&self, v: u64, order: Ordering) -> u64 {
            self.0.swap(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::fetch_or`.
        #[inline]
        pub fn fetch_or(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_or(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::fetch_and`.
        #[inline]
        pub fn fetch_and(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_and(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::fetch_max`.
        #[inline]
        pub fn fetch_max(&self, v: u64, order: Ordering) -> u64 {
            self.0.fetch_max(v, order)
        }
        /// As `std::sync::atomic::AtomicU64::compare_exchange`.
        #[inline]
        pub fn compare_exchange(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            self.0.compare_exchange(current, new, success, failure)
        }
    }

    /// `std`'s `AtomicBool` under the crate's own name; see [`AtomicU64`].
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct AtomicBool(std::sync::atomic::AtomicBool);

    impl AtomicBool {
        #[inline]
        pub(crate) const fn new(v: bool) -> Self {
            Self(std::sync::atomic::AtomicBool::new(v))
        }
        #[inline]
        pub(crate) fn load(&self, order: Ordering) -> bool {
            self.0.load(order)
        }
        #[inline]
        pub(crate) fn store(&self, v: bool, order: Ordering) {
            self.0.store(v, order)
        }
    }

    /// A mutex for cold paths (epoch turnover, policy swaps); never on the hot path
    /// between collectors and learners.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(parking_lot::Mutex<T>);

    /// What [`Mutex::lock`] returns.
    pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }

        /// The lock if no one holds it; `None` at once otherwise.
        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.0.try_lock()
        }
    }

    /// A condition variable for the cold handoffs (prefetch workers and their
    /// learner), beside [`Mutex`].
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }

        /// Releases the lock, sleeps until notified (or spuriously), retakes it.
        pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }

        /// [`Condvar::wait`], giving up at `deadline` if there is one: whether it
        /// passed comes back beside the guard.
        pub(crate) fn wait_until<'a, T>(
            &self,
            mut guard: MutexGuard<'a, T>,
            deadline: Option<std::time::Instant>,
        ) -> (MutexGuard<'a, T>, bool) {
            let timed_out = match deadline {
                Some(at) => self.0.wait_until(&mut guard, at).timed_out(),
                None => {
                    self.0.wait(&mut guard);
                    false
                }
            };
            (guard, timed_out)
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// Threads the crate starts itself (prefetch workers).
    pub(crate) mod thread {
        pub(crate) use std::thread::JoinHandle;

        /// Starts a named thread.
        pub(crate) fn spawn<F, T>(name: String, f: F) -> std::io::Result<JoinHandle<T>>
        where
            F: FnOnce() -> T + Send + 'static,
            T: Send + 'static,
        {
            std::thread::Builder::new().name(name).spawn(f)
        }
    }

    /// An atomically replaceable `Option<Arc<T>>`: readers never block and never see a
    /// half-written value.
    #[derive(Debug)]
    pub(crate) struct ArcCell<T>(arc_swap::ArcSwapOption<T>);

    impl<T> ArcCell<T> {
        pub(crate) fn empty() -> Self {
            Self(arc_swap::ArcSwapOption::empty())
        }

        pub(crate) fn load(&self) -> Option<Arc<T>> {
            self.0.load_full()
        }

        pub(crate) fn store(&self, value: Option<Arc<T>>) {
            self.0.store(value)
        }

        /// Stores `value`; the value it replaced.
        pub(crate) fn swap(&self, value: Option<Arc<T>>) -> Option<Arc<T>> {
            self.0.swap(value)
        }
    }

    /// An atomically replaceable `Arc<T>` (`arc_swap::ArcSwap`): a load takes no lock
    /// and, on the fast path, touches no reference count; a store never waits for
    /// readers, and the value it replaces lives on until its last reader lets go.
    pub(crate) struct ArcSwap<T>(arc_swap::ArcSwap<T>);

    /// What [`ArcSwap::load`] returns: the value loaded, kept alive while held.
    pub(crate) type Guard<T> = arc_swap::Guard<std::sync::Arc<T>>;

    impl<T> ArcSwap<T> {
        pub(crate) fn new(value: std::sync::Arc<T>) -> Self {
            Self(arc_swap::ArcSwap::new(value))
        }

        /// The current value, for the length of one operation.
        #[inline]
        pub(crate) fn load(&self) -> Guard<T> {
            self.0.load()
        }

        /// Replaces the value: loads that follow see `value`.
        pub(crate) fn store(&self, value: std::sync::Arc<T>) {
            self.0.store(value)
        }
    }

    impl<T: std::fmt::Debug> std::fmt::Debug for ArcSwap<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_tuple("ArcSwap").field(&**self.0.load()).finish()
        }
    }

    /// A store to a word that other threads also change by read-modify-write; a plain
    /// store (see the loom twin for why it differs there).
    #[inline]
    pub(crate) fn store_beside_rmw(word: &AtomicU64, value: u64, order: Ordering) {
        word.store(value, order);
    }

    /// The load of a store-buffering handshake (each side writes one word, then
    /// reads the other's): a `SeqCst` load, whose single total order with the other
    /// side's `SeqCst` write makes at least one side see the other's write. See the
    /// loom twin for why it differs there.
    #[inline]
    pub(crate) fn handshake_load(word: &AtomicU64) -> u64 {
        word.load(Ordering::SeqCst)
    }

    /// One step of a wait loop: a CPU spin hint.
    #[inline]
    pub(crate) fn spin() {
        std::hint::spin_loop();
    }

    /// Gives up the rest of the time slice: the slow step of a wait loop.
    #[inline]
    pub(crate) fn yield_now() {
        std::thread::yield_now();
    }

    /// Sleeps about `d` (at least; the kernel's timer slack adds tens of
    /// microseconds): a polling step that costs the thread being waited on nothing.
    pub(crate) fn nap(d: std::time::Duration) {
        std::thread::sleep(d);
    }

    /// Seed material for buffers built without an explicit seed.
    pub(crate) fn entropy_seed() -> u64 {
        use std::hash::{BuildHasher, RandomState};
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        RandomState::new().hash_one(nanos)
    }

    /// A word that threads of every process mapping it sleep on until it changes: the
    /// 32-bit half of a region word that holds its low-order bits (what Linux's
    /// `futex` compares), used only through this type. Under loom, a lock and a
    /// condition variable stand in for the kernel's queue.
    #[cfg(target_os = "linux")]
    pub(crate) struct Futex<'a>(&'a std::sync::atomic::AtomicU32);

    /// Where a [`Futex`]'s sleepers sleep: the kernel's queue, nothing of ours (loom's
    /// twin is a lock and a condition variable).
    #[derive(Debug, Default)]
    pub(crate) struct Parking {
        _in_the_kernel: (),
    }

    #[cfg(target_os = "linux")]
    impl<'a> Futex<'a> {
        /// The futex in `word`. The word must be used through `Futex` alone (zero
        /// before that), so that no access to it mixes sizes.
        pub(crate) fn in_word(word: &'a AtomicU64, _: &'a Parking) -> Futex<'a> {
            let low = if cfg!(target_endian = "little") { 0 } else { 4 };
            // SAFETY: (1) `word` is a live 8-byte atomic, 8-aligned, so its bytes
            // `low..low + 4` are a 4-aligned `u32` inside it, alive as long as `word`;
            // (2) `AtomicU32` has the size and alignment of `u32` and, like
            // `AtomicU64`, may be changed by every thread through a shared reference;
            // (3) the caller uses the word through this view only, so no two accesses
            // to it differ in size.
            let half = unsafe {
                &*(word as *const AtomicU64)
                    .cast::<u8>()
                    .add(low)
                    .cast::<std::sync::atomic::AtomicU32>()
            };
            Futex(half)
        }

        /// Its value now.
        pub(crate) fn load(&self) -> u32 {
            self.0.load(Ordering::SeqCst)
        }

        /// Changes its value, so that a sleeper that read the old one does not sleep.
        pub(crate) fn bump(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }

        /// Sleeps while the value is `seen`, at most `timeout` (None: until woken).
        /// Returns early on a wake, a change, or a signal: the caller checks again.
        pub(crate) fn wait(&self, seen: u32, timeout: Option<std::time::Duration>) {
            use rustix::thread::futex;
            let timeout = timeout.map(|d| futex::Timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
                tv_nsec: d.subsec_nanos().into(),
            });
            // Shared, not private: the sleepers are in several processes. Every error
            // (EAGAIN: the value changed; EINTR; ETIMEDOUT) means "check again".
            let _ = futex::wait(self.0, futex::Flags::empty(), seen, timeout.as_ref());
        }

        /// Wakes every sleeper, in every process.
        pub(crate) fn wake_all(&self) {
            use rustix::thread::futex;
            let _ = futex::wake(self.0, futex::Flags::empty(), u32::MAX);
        }
    }
}

#[cfg(replaybuf_loom)]
mod imp {
    pub use loom::sync::atomic::AtomicU64;
    pub(crate) use loom::sync::atomic::{fence, AtomicBool, Ordering};
    pub(crate) use loom::sync::Arc;

    /// loom's mutex behind the same `lock()` signature as the normal build.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// What [`Mutex::lock`] returns.
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0
                .lock()
                .expect("a replaybuf lock was poisoned by a panic")
        }
    }

    /// loom's condition variable behind the normal build's signatures.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }

        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0
                .wait(guard)
                .expect("a replaybuf lock was poisoned by a panic")
        }

        /// Under loom a wait never times out (loom has no clock): a model whose
        /// threads could only be freed by a timeout deadlocks, and loom reports it.
        pub(crate) fn wait_until<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            _deadline: Option<std::time::Instant>,
        ) -> (MutexGuard<'a, T>, bool) {
            (self.wait(guard), false)
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// loom's threads: the model explores their interleavings.
    pub(crate) mod thread {
        pub(crate) use loom::thread::JoinHandle;

        pub(crate) fn spawn<F, T>(name: String, f: F) -> std::io::Result<JoinHandle<T>>
        where
            F: FnOnce() -> T + Send + 'static,
            T: Send + 'static,
        {
            loom::thread::Builder::new().name(name).spawn(f)
        }
    }

    /// Under loom an `ArcSwapOption` becomes a mutex around the `Option<Arc<T>>`:
    /// loom cannot look inside arc-swap, and the lock gives the same guarantees the
    /// protocol relies on (a reader sees a whole value, old or new).
    #[derive(Debug)]
    pub(crate) struct ArcCell<T>(loom::sync::Mutex<Option<Arc<T>>>);

    impl<T> ArcCell<T> {
        pub(crate) fn empty() -> Self {
            Self(loom::sync::Mutex::new(None))
        }

        pub(crate) fn load(&self) -> Option<Arc<T>> {
            self.0.lock().expect("poisoned").clone()
        }

        pub(crate) fn store(&self, value: Option<Arc<T>>) {
            *self.0.lock().expect("poisoned") = value;
        }

        pub(crate) fn swap(&self, value: Option<Arc<T>>) -> Option<Arc<T>> {
            std::mem::replace(&mut *self.0.lock().expect("poisoned"), value)
        }
    }

    /// Under loom an `ArcSwap` is a mutex around the `Arc<T>` (loom cannot look inside
    /// arc-swap): a load clones the `Arc` under the lock, so a reader holds a whole
    /// value, old or new, exactly as with arc-swap.
    pub(crate) struct ArcSwap<T>(loom::sync::Mutex<std::sync::Arc<T>>);

    /// What [`ArcSwap::load`] returns under loom: the loaded `Arc`.
    pub(crate) struct Guard<T>(std::sync::Arc<T>);

    impl<T> std::ops::Deref for Guard<T> {
        type Target = std::sync::Arc<T>;

        fn deref(&self) -> &std::sync::Arc<T> {
            &self.0
        }
    }

    impl<T> ArcSwap<T> {
        pub(crate) fn new(value: std::sync::Arc<T>) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn load(&self) -> Guard<T> {
            Guard(self.0.lock().expect("poisoned").clone())
        }

        pub(crate) fn store(&self, value: std::sync::Arc<T>) {
            let old = std::mem::replace(&mut *self.0.lock().expect("poisoned"), value);
            // The old value is dropped outside the lock, as arc-swap does.
            drop(old);
        }
    }

    impl<T> std::fmt::Debug for ArcSwap<T> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("ArcSwap")
        }
    }

    /// Under loom, a `swap`. loom 0.7 can place a plain store between the read and the
    /// write of another thread's read-modify-write on the same word (tokio-rs/loom#389,
    /// fixed by the unmerged tokio-rs/loom#391), an execution neither the memory model
    /// nor hardware allows; it then reports failures that cannot happen. A `swap` is a
    /// read-modify-write, which loom orders correctly, and writes the same value.
    #[inline]
    pub(crate) fn store_beside_rmw(word: &AtomicU64, value: u64, order: Ordering) {
        word.swap(value, order);
    }

    /// Under loom, a `fetch_add(0)`. loom models `SeqCst` as acquire-release, without
    /// the single total order, so it lets both sides of a store-buffering handshake
    /// read the other's word stale, which neither the memory model nor hardware
    /// allows. A read-modify-write reads the latest value in the word's modification
    /// order, and with the other side's read-modify-write of its own word gives loom
    /// what the total order gives the real build.
    #[inline]
    pub(crate) fn handshake_load(word: &AtomicU64) -> u64 {
        word.fetch_add(0, Ordering::SeqCst)
    }

    /// Under loom a spin is a yield to the model scheduler.
    #[inline]
    pub(crate) fn spin() {
        loom::thread::yield_now();
    }

    #[inline]
    pub(crate) fn yield_now() {
        loom::thread::yield_now();
    }

    /// Under loom, time is not modelled: a nap is a yield to the model scheduler.
    pub(crate) fn nap(_: std::time::Duration) {
        loom::thread::yield_now();
    }

    /// Loom runs must be deterministic: a fixed seed.
    pub(crate) fn entropy_seed() -> u64 {
        0x5eed_1005
    }

    /// The futex's twin: the word itself, and sleepers on a condition variable whose
    /// lock makes "check the word, then sleep" one step against a waker's "change the
    /// word, then wake", as the kernel's queue does. Timeouts are not modelled.
    pub(crate) struct Futex<'a> {
        word: &'a AtomicU64,
        parking: &'a Parking,
    }

    /// Where a [`Futex`]'s sleepers sleep.
    #[derive(Debug, Default)]
    pub(crate) struct Parking {
        lock: Mutex<()>,
        woken: Condvar,
    }

    impl<'a> Futex<'a> {
        pub(crate) fn in_word(word: &'a AtomicU64, parking: &'a Parking) -> Futex<'a> {
            Futex { word, parking }
        }

        pub(crate) fn load(&self) -> u32 {
            self.word.load(Ordering::SeqCst) as u32
        }

        pub(crate) fn bump(&self) {
            self.word.fetch_add(1, Ordering::SeqCst);
        }

        pub(crate) fn wait(&self, seen: u32, _timeout: Option<std::time::Duration>) {
            let guard = self.parking.lock.lock();
            if self.load() == seen {
                drop(self.parking.woken.wait(guard));
            }
        }

        pub(crate) fn wake_all(&self) {
            drop(self.parking.lock.lock());
            self.parking.woken.notify_all();
        }
    }
}

pub use imp::AtomicU64;
pub(crate) use imp::*;

/// Waits with bounded politeness: spins a few times, then yields to the scheduler.
///
/// Used by the rare waits in the crate (a writer waiting for the previous lap's writer
/// of the same slot, an editor waiting for plain writers to leave a shard). Readers
/// never wait in a loop on a writer: they redraw.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    const SPIN_LIMIT: u32 = 6;

    pub(crate) fn new() -> Self {
        Self { step: 0 }
    }

    pub(crate) fn snooze(&mut self) {
        if self.step < Self::SPIN_LIMIT && cfg!(not(replaybuf_loom)) {
            for _ in 0..(1u32 << self.step) {
                spin();
            }
            self.step += 1;
        } else {
            yield_now();
        }
    }
}
