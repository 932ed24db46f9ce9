//! Extend of a 1,000-row mujoco chunk into a wrapped 200,000-row buffer: the lock-free
//! `Writer::extend` beside a `Mutex`-guarded row-major ring written with plain copies,
//! alone and while a background thread samples 256-row batches in a loop.
//!
//! Typed extend (`typed_extend_1000`): 1,000 `#[repr(C)]` mujoco transitions of 168
//! bytes through `TypedBuffer::extend`, beside a plain `copy_from_slice` of the same
//! bytes into a ring of the same capacity.
//!
//! And extend by row size (`extend_256_rows_of`): 256-row chunks of rows of 100 B,
//! 1 KB, 3 KB, 16 KB and 56 KB (an id and two equal byte fields, as an observation and
//! the next one) into a wrapped ring, beside the raw-memory floor of run-peers' `limit`:
//! each column's chunk copied with `copy_from_slice` into a column-major ring of the
//! same capacity.

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod common;

use std::hint::black_box;

use common::{Columns, LockedRing, CHUNK_ROWS, SAMPLE_ROWS, SEED};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf_floors::Transition;

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

/// Rows of a row-size ring: 512 MB of rows, larger than any cache.
fn row_size_capacity(row: usize) -> usize {
    (512 << 20) / row
}

fn extend_row_sizes(c: &mut Criterion) {
    const CHUNK: usize = 256;
    let mut group = common::group(c, "extend_256_rows_of", CHUNK);
    for row in [100usize, 1024, 3072, 16_384, 56_448] {
        let half = (row - 8) / 2;
        let spec = replaybuf::Spec::builder()
            .field("id", replaybuf::DType::U64, [])
            .field("obs", replaybuf::DType::U8, [half])
            .field("next_obs", replaybuf::DType::U8, [half])
            .build()
            .expect("a valid spec");
        let capacity = (16 * CHUNK).max(row_size_capacity(row));
        let rb = replaybuf::ReplayBuffer::builder(spec)
            .capacity(capacity)
            .seed(SEED)
            .build()
            .expect("a buffer");
        let mut chunk = rb.batch([CHUNK]);
        chunk.column_mut::<u8>("obs").expect("obs").fill(3);
        chunk
            .column_mut::<u8>("next_obs")
            .expect("next_obs")
            .fill(4);
        let writer = rb.writer();
        for _ in 0..capacity / CHUNK + 1 {
            writer.extend(&chunk).expect("extend");
        }
        group.bench_function(format!("lock_free/{row}B"), |b| {
            b.iter(|| black_box(writer.extend(&chunk).expect("extend")));
        });
        let widths = [8, half, half];
        let src: Vec<Vec<u8>> = widths.iter().map(|&w| vec![2u8; w * CHUNK]).collect();
        let mut copy = column_copy(&src, &widths, capacity);
        group.bench_function(format!("raw_copy/{row}B"), |b| b.iter(&mut copy));
        drop(rb);
    }
    group.finish();
}

/// The raw-memory floor of an extend: each column of `src` (a chunk of rows of
/// `widths[i]` bytes each) copied into a column of its own of `capacity` rows, at the
/// next chunk's rows each call.
fn column_copy<'a>(src: &'a [Vec<u8>], widths: &'a [usize], capacity: usize) -> impl FnMut() + 'a {
    let chunk = src[0].len() / widths[0];
    let mut cols: Vec<Vec<u8>> = widths.iter().map(|&w| vec![1u8; w * capacity]).collect();
    let mut at = 0;
    move || {
        for ((col, s), &w) in cols.iter_mut().zip(src).zip(widths) {
            col[at * w..(at + chunk) * w].copy_from_slice(s);
        }
        at = (at + chunk) % (capacity - chunk + 1);
        black_box(&mut cols);
    }
}

/// Rows of the small ring of [`extend_small_ring`]: 17.6 MB of mujoco slots, inside a
/// last-level cache of 32 MiB.
const SMALL_RING: usize = 100_000;

/// The mujoco extend into a ring smaller than the caches, whose appends stream
/// through the cache (`Storage::stream_rows`), beside the raw copy of the chunk's
/// columns into columns of as many rows.
fn extend_small_ring(c: &mut Criterion) {
    let spec = common::mujoco_spec();
    let rb = replaybuf::ReplayBuffer::builder(spec)
        .capacity(SMALL_RING)
        .shards(1)
        .seed(SEED)
        .build()
        .expect("a buffer");
    let chunk = common::mujoco_chunk(&rb, CHUNK_ROWS);
    let writer = rb.writer();
    for _ in 0..=SMALL_RING / CHUNK_ROWS {
        writer.extend(&chunk).expect("extend");
    }
    let mut group = common::group(c, "extend_1000_rows_into_100k", CHUNK_ROWS);
    group.bench_function("lock_free", |b| {
        b.iter(|| black_box(writer.extend(&chunk).expect("extend")));
    });
    let src = Columns::from_batch(&chunk);
    let widths: Vec<usize> = chunk.spec().fields().iter().map(|f| f.bytes()).collect();
    let mut copy = column_copy(src.columns(), &widths, SMALL_RING);
    group.bench_function("raw_copy", |b| b.iter(&mut copy));
    group.finish();
}

/// Rows of the typed rings: the mujoco workload's million, 168 MB. At
/// [`common::CAPACITY`] the memcpy's 34 MB ring fits most of a 32 MB L3 (2.0 us a
/// chunk, 83 GB/s, on a host with one), so the floor measured the cache and not memory.
const TYPED_CAPACITY: usize = 1_000_000;

fn typed_extend(c: &mut Criterion) {
    let rb = replaybuf::typed::TypedBuffer::<Transition>::builder()
        .capacity(TYPED_CAPACITY)
        .seed(SEED)
        .build()
        .expect("a typed buffer");
    let items = Transition::chunk(CHUNK_ROWS);
    for _ in 0..TYPED_CAPACITY / CHUNK_ROWS + 1 {
        rb.extend(&items).expect("extend");
    }
    let mut group = common::group(c, "typed_extend_1000", CHUNK_ROWS);
    group.bench_function("lock_free", |b| {
        b.iter(|| black_box(rb.extend(&items).expect("extend")));
    });
    // The floor: the same bytes copied into a ring of the same capacity.
    let bytes: &[u8] = bytemuck::cast_slice(&items);
    // Every page written before timing: a zeroed `Vec` comes from pages the kernel
    // backs at their first write, which then cost the copy a fault each (this VM's
    // first touch runs at about 0.5 GB/s; a run too short to lap the ring once
    // measured that and not the copy).
    let mut ring = vec![1u8; TYPED_CAPACITY * std::mem::size_of::<Transition>()];
    let mut at = 0;
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            ring[at..at + bytes.len()].copy_from_slice(bytes);
            at = (at + bytes.len()) % (ring.len() - bytes.len() + 1);
            black_box(&mut ring);
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    extend,
    extend_row_sizes,
    extend_small_ring,
    typed_extend
);
criterion_main!(benches);
