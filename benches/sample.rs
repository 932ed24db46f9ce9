//! Sample of 256 rows from a full 200,000-row mujoco buffer: the lock-free
//! `Learner::sample_into` beside a `Mutex`-guarded row-major ring read with plain
//! copies into columns, alone and while a background thread extends 1,000-row chunks
//! in a loop, and beside its floor alone (`plain_gather`: the same rows gathered from
//! a plain array on one thread, prefetched as the buffer's reads are,
//! `replaybuf_floors::PlainUniform`); and `Learner::sample_to` into memory the caller
//! owns.

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod common;

use std::hint::black_box;

use common::{Columns, LockedRing, SAMPLE_ROWS, SEED};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf::Destination;
use replaybuf_floors::PlainUniform;

fn sample(c: &mut Criterion) {
    let spec = common::mujoco_spec();
    let (rb, chunk) = common::lock_free_buffer(spec.clone());
    let columns = Columns::from_batch(&chunk);
    let ring = LockedRing::filled(&spec, &columns);
    let writer = rb.writer();
    let mut learner = rb.learner();
    let mut batch = rb.batch([SAMPLE_ROWS]);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(SEED);
    let mut out = Columns::zeros(&spec, SAMPLE_ROWS);

    let mut group = common::group(c, "sample_256_rows", SAMPLE_ROWS);

    group.bench_function("lock_free/alone", |b| {
        b.iter(|| {
            learner.sample_into(&mut batch).expect("sample");
            black_box(&mut batch);
        });
    });
    group.bench_function("locked/alone", |b| {
        b.iter(|| {
            ring.lock()
                .expect("not poisoned")
                .sample_into(&mut rng, &mut out);
            black_box(&mut out);
        });
    });

    let mut floor = PlainUniform::new(&common::floor_shape(&spec));
    group.bench_function("plain_gather/alone", |b| b.iter(|| floor.sample()));
    drop(floor);

    group.bench_function("lock_free/background_writer", |b| {
        b.iter_custom(|iters| {
            common::time_under_load(
                iters,
                || {
                    black_box(writer.extend(&chunk).expect("extend"));
                },
                || {
                    learner.sample_into(&mut batch).expect("sample");
                    black_box(&mut batch);
                },
            )
        });
    });
    group.bench_function("locked/background_writer", |b| {
        b.iter_custom(|iters| {
            common::time_under_load(
                iters,
                || ring.lock().expect("not poisoned").extend(&columns),
                || {
                    ring.lock()
                        .expect("not poisoned")
                        .sample_into(&mut rng, &mut out);
                    black_box(&mut out);
                },
            )
        });
    });
    group.finish();
}

/// `sample_to` into memory the caller owns: the rows and copies of
/// `sample_256_rows/lock_free/alone` (a buffer filled alike, a learner of the same
/// seed), written to the caller's columns instead of a batch's.
fn sample_to(c: &mut Criterion) {
    let (rb, _) = common::lock_free_buffer(common::mujoco_spec());
    let spec = rb.spec().clone();
    let mut learner = rb.learner();
    let mut columns: Vec<Vec<u8>> = spec
        .fields()
        .iter()
        .map(|f| vec![0; SAMPLE_ROWS * f.bytes()])
        .collect();
    let (mut index, mut generation) = (vec![0; SAMPLE_ROWS], vec![0; SAMPLE_ROWS]);

    let mut group = common::group(c, "sample_to_256_rows", SAMPLE_ROWS);
    group.bench_function("caller_memory/alone", |b| {
        b.iter(|| {
            let mut dest = Destination::new(
                &spec,
                SAMPLE_ROWS,
                columns.iter_mut().map(|c| &mut c[..]),
                &mut index,
                &mut generation,
            )
            .expect("room for the rows");
            black_box(learner.sample_to(&mut dest).expect("sample"));
        });
    });
    group.finish();
}

criterion_group!(benches, sample, sample_to);
criterion_main!(benches);
