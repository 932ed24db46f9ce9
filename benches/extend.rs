//! Extend of a 1,000-row mujoco chunk into a wrapped 200,000-row buffer: the lock-free
//! `Writer::extend` beside a `Mutex`-guarded row-major ring written with plain copies,
//! alone and while a background thread samples 256-row batches in a loop.

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod common;

use std::hint::black_box;

use common::{Columns, LockedRing, CHUNK_ROWS, SAMPLE_ROWS, SEED};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

fn extend(c: &mut Criterion) {
    let spec = common::mujoco_spec();
    let (rb, chunk) = common::lock_free_buffer(spec.clone());
    let columns = Columns::from_batch(&chunk);
    let ring = LockedRing::filled(&spec, &columns);
    let writer = rb.writer();

    let mut group = common::group(c, "extend_1000_rows", CHUNK_ROWS);

    group.bench_function("lock_free/alone", |b| {
        b.iter(|| black_box(writer.extend(&chunk).expect("extend")));
    });
    group.bench_function("locked/alone", |b| {
        b.iter(|| ring.lock().expect("not poisoned").extend(&columns));
    });

    group.bench_function("lock_free/background_sampler", |b| {
        b.iter_custom(|iters| {
            let mut learner = rb.learner();
            let mut batch = rb.batch([SAMPLE_ROWS]);
            common::time_under_load(
                iters,
                || learner.sample_into(&mut batch).expect("sample"),
                || {
                    black_box(writer.extend(&chunk).expect("extend"));
                },
            )
        });
    });
    group.bench_function("locked/background_sampler", |b| {
        b.iter_custom(|iters| {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(SEED);
            let mut out = Columns::zeros(&spec, SAMPLE_ROWS);
            common::time_under_load(
                iters,
                || {
                    ring.lock()
                        .expect("not poisoned")
                        .sample_into(&mut rng, &mut out);
                    black_box(&mut out);
                },
                || ring.lock().expect("not poisoned").extend(&columns),
            )
        });
    });
    group.finish();
}

criterion_group!(benches, extend);
criterion_main!(benches);
