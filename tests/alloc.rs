//! `sample_into` allocates nothing in steady state: a counting global allocator sees
//! zero allocations across many samples into a reused batch, for a learner handle and
//! for the buffer itself, with and without collectors writing meanwhile, and for a
//! prefetching loader (its worker included). Nor does a prioritized learner's
//! `update_priority`.
#![allow(clippy::disallowed_types)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use replaybuf::sampler::{Prioritized, Slice, SlicePriority};
use replaybuf::typed::{TypedBatch, TypedBuffer};
use replaybuf::{Batch, DType, Learner, ReplayBuffer, ReplayBufferBuilder, Spec};

struct Counting;

thread_local! {
    /// Whether this thread's allocations are being counted, and how many were.
    /// Per thread, so that tests running at once (the harness runs them on threads of
    /// one process) never count each other's allocations.
    static COUNT_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static COUNTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: a thread being torn down has no locals left, and is not counted.
        if COUNT_HERE.try_with(|c| c.get()).unwrap_or(false) {
            let _ = COUNTED.try_with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's obligations are the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    COUNT_HERE.with(|c| c.set(true));
    let before = COUNTED.with(|n| n.get());
    f();
    let after = COUNTED.with(|n| n.get());
    COUNT_HERE.with(|c| c.set(false));
    after - before
}

/// A buffer of two shards from `builder`, and the chunk of 1,000 rows it was filled
/// with, 20 times over.
fn filled(builder: ReplayBufferBuilder) -> (ReplayBuffer, Batch) {
    let rb = builder.shards(2).build().unwrap();
    let chunk = rb.batch([1000]);
    for _ in 0..20 {
        rb.extend(&chunk).unwrap();
    }
    (rb, chunk)
}

/// What `f` returns, run while another thread extends `rb` by `chunk` again and again.
fn beside_a_collector<R>(rb: &ReplayBuffer, chunk: &Batch, f: impl FnOnce() -> R) -> R {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writer = rb.writer();
        let stop = &stop;
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                writer.extend(chunk).unwrap();
            }
        });
        let out = f();
        stop.store(true, Ordering::Relaxed);
        out
    })
}

fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [17])
        .field("action", DType::F32, [6])
        .field("reward", DType::F32, [1])
        .field(("next", "obs"), DType::F32, [17])
        .field("done", DType::Bool, [1])
        .build()
        .unwrap()
}

#[test]
fn sample_into_allocates_nothing_once_warm() {
    // The counter itself works: one Vec is one allocation.
    assert_eq!(
        allocations_in(|| drop(std::hint::black_box(vec![1u8; 64]))),
        1
    );
    let (rb, chunk) = filled(ReplayBuffer::builder(spec()).capacity(10_000).seed(1));
    let mut learner = rb.learner();
    let mut batch = rb.batch([256]);
    learner.sample_into(&mut batch).unwrap();
    rb.sample_into(&mut batch).unwrap();

    let n = beside_a_collector(&rb, &chunk, || {
        allocations_in(|| {
            for _ in 0..2000 {
                learner.sample_into(&mut batch).unwrap();
                rb.sample_into(&mut batch).unwrap();
            }
        })
    });
    assert_eq!(n, 0, "sample_into allocated {n} times");

    let typed = TypedBuffer::<[u64; 8]>::builder()
        .capacity(1000)
        .seed(2)
        .batch_size(64)
        .build()
        .unwrap();
    typed.extend(&[[7u64; 8]; 500]).unwrap();
    let mut out = TypedBatch::new();
    typed.sample_into(&mut out).unwrap();
    assert_eq!(
        allocations_in(|| (0..500).for_each(|_| typed.sample_into(&mut out).unwrap())),
        0
    );
}

/// A prioritized learner's whole step, `sample_into` and then `update_priority` with
/// fresh priorities, allocates nothing once warm: on two shards, with a collector
/// writing meanwhile (so that some rows of most batches are replaced, and skipped),
/// and again after a batch larger than a thread's room keeps.
#[test]
fn a_prioritized_step_allocates_nothing_once_warm() {
    let (rb, chunk) = filled(
        ReplayBuffer::builder(spec())
            .capacity(20_000)
            .sampler(Prioritized::new(0.6, 0.4))
            .seed(4),
    );
    let mut learner = rb.learner();
    let mut batch = rb.batch([256]);
    let mut priorities = vec![0.0f64; 256];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut step = |learner: &mut Learner, batch: &mut Batch| {
        learner.sample_into(batch).unwrap();
        for p in priorities.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *p = 0.01 + (x >> 40) as f64 / (1u64 << 24) as f64;
        }
        rb.update_priority(batch.index(), batch.generations(), &priorities)
            .unwrap()
    };
    step(&mut learner, &mut batch);

    let (mut applied, mut stale) = (0, 0);
    let n = beside_a_collector(&rb, &chunk, || {
        allocations_in(|| {
            for _ in 0..2000 {
                let done = step(&mut learner, &mut batch);
                applied += done.applied;
                stale += done.stale;
            }
        })
    });
    assert_eq!(n, 0, "a prioritized step allocated {n} times");
    assert_eq!(applied + stale, 2000 * 256);
    assert!(applied > 0, "every update was stale");

    // A batch past what a thread's room keeps lets its room go; the next small batch
    // grows one again (allocating), and then allocates nothing more.
    let mut big = rb.batch([16_384]);
    learner.sample_into(&mut big).unwrap();
    let ones = vec![1.0; 16_384];
    rb.update_priority(big.index(), big.generations(), &ones)
        .unwrap();
    step(&mut learner, &mut batch);
    let n = allocations_in(|| {
        for _ in 0..100 {
            step(&mut learner, &mut batch);
        }
    });
    assert_eq!(
        n, 0,
        "a prioritized step after a large one allocated {n} times"
    );
}

#[test]
fn slice_sample_into_allocates_nothing_once_warm() {
    let spec = Spec::builder()
        .field("obs", DType::F32, [17])
        .field("traj", DType::I64, [])
        .build()
        .unwrap();
    for sampler in [
        Slice::num_slices(8).traj_key("traj"),
        Slice::num_slices(8)
            .traj_key("traj")
            .prioritized(Prioritized::new(0.6, 0.4), SlicePriority::Start),
    ] {
        let rb = ReplayBuffer::builder(spec.clone())
            .capacity(10_000)
            .sampler(sampler)
            .batch_size(256)
            .seed(3)
            .build()
            .unwrap();
        let mut chunk = rb.batch([1000]);
        let ids: Vec<i64> = (0..1000).map(|i| i / 200).collect();
        chunk.set("traj", &ids).unwrap();
        for _ in 0..5 {
            rb.extend(&chunk).unwrap();
        }
        let mut batch = rb.batch([256]);
        rb.sample_into(&mut batch).unwrap();
        let n = allocations_in(|| {
            for _ in 0..1000 {
                rb.sample_into(&mut batch).unwrap();
            }
        });
        assert_eq!(n, 0, "a slice sample_into allocated {n} times");
    }
}

#[test]
fn prefetched_sample_into_allocates_nothing_once_warm_on_either_side() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(10_000)
        .seed(4)
        .build()
        .unwrap();
    let chunk = rb.batch([1000]);
    for _ in 0..10 {
        rb.extend(&chunk).unwrap();
    }
    // The worker counts its own allocations from its first batch on, and publishes its
    // total at the end of every batch.
    static WORKER_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
    let mut loader = rb
        .loader()
        .batch_size(256)
        .prefetch(2)
        // Runs on the worker thread, last in each batch.
        .preprocess(|_| {
            COUNT_HERE.with(|c| c.set(true));
            WORKER_ALLOCATIONS.store(COUNTED.with(|n| n.get()), Ordering::SeqCst);
            Ok(())
        })
        .build()
        .unwrap();
    let mut batch = rb.batch([256]);
    // Warm: every buffer in circulation (two in the pool, one here) has been filled.
    for _ in 0..20 {
        loader.sample_into(&mut batch).unwrap();
    }
    let worker_before = WORKER_ALLOCATIONS.load(Ordering::SeqCst);
    let n = allocations_in(|| {
        for _ in 0..2000 {
            loader.sample_into(&mut batch).unwrap();
        }
    });
    // Two more: the worker has published the totals of every batch taken above.
    for _ in 0..2 {
        loader.sample_into(&mut batch).unwrap();
    }
    let worker = WORKER_ALLOCATIONS.load(Ordering::SeqCst) - worker_before;
    assert_eq!(
        n, 0,
        "the learner's prefetched sample_into allocated {n} times"
    );
    assert_eq!(worker, 0, "the prefetch worker allocated {worker} times");
    assert_eq!(batch.len(), 256);
}
