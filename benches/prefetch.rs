//! `sample` latency of a learner that spends 100 µs on each batch (its loss and
//! gradient step, busy on its core), on a full 200,000-row mujoco buffer: a loader with
//! prefetch 2, whose worker prepares the next batches during the learner's step, beside
//! the same loop sampling inline through a learner handle, and through a
//! `Mutex`-guarded row-major ring. Only the `sample` calls are timed.

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{Columns, LockedRing, SAMPLE_ROWS, SEED};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf::ReplayBuffer;

/// What the learner does with each batch before it asks for the next.
const LEARNER_STEP: Duration = Duration::from_micros(100);
/// Batches the loader keeps ready.
const PREFETCH: usize = 2;

fn learn() {
    let t = Instant::now();
    while t.elapsed() < LEARNER_STEP {
        std::hint::spin_loop();
    }
}

/// The time of `iters` calls of `sample`, each after one learner step (not timed).
fn timed(iters: u64, mut sample: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        learn();
        let t = Instant::now();
        sample();
        total += t.elapsed();
    }
    total
}

fn prefetch(c: &mut Criterion) {
    let spec = common::mujoco_spec();
    let (rb, chunk) = common::filled(ReplayBuffer::builder(spec.clone()).batch_size(SAMPLE_ROWS));
    let ring = LockedRing::filled(&spec, &Columns::from_batch(&chunk));
    let mut learner = rb.learner();
    let mut loader = rb.prefetch(PREFETCH).expect("a prefetching loader");
    let mut batch = rb.batch([SAMPLE_ROWS]);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(SEED);
    let mut out = Columns::zeros(&spec, SAMPLE_ROWS);

    let mut group = common::group(c, "sample_256_rows_beside_a_100us_learner", SAMPLE_ROWS);
    group.bench_function("lock_free/prefetch_2", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                loader.sample_into(&mut batch).expect("sample");
                black_box(&mut batch);
            })
        });
    });
    group.bench_function("lock_free/no_prefetch", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                learner.sample_into(&mut batch).expect("sample");
                black_box(&mut batch);
            })
        });
    });
    group.bench_function("locked/no_prefetch", |b| {
        b.iter_custom(|iters| {
            timed(iters, || {
                ring.lock()
                    .expect("not poisoned")
                    .sample_into(&mut rng, &mut out);
                black_box(&mut out);
            })
        });
    });
    group.finish();
}

criterion_group!(benches, prefetch);
criterion_main!(benches);
