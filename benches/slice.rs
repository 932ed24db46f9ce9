//! Slice sampling of 8 windows of 32 consecutive steps (256 rows) from full mujoco-slice
//! buffers of 10^5 and of 10^7 rows (trajectories of 200 steps, told apart by an i64
//! `traj` field). The lock-free buffer keeps trajectory boundaries as rows are written,
//! so its sample costs the same at either size. Beside it, the baseline RL users get
//! from TorchRL's `SliceSampler` without `cache_values`: `common`'s row-major ring
//! behind a `Mutex`, whose sampler finds every trajectory by scanning the stored ids
//! on every sample, a cost that grows with the buffer. Last, the floor under both at
//! each size: the baseline ring copying 8 windows at random with no trajectory lookup
//! at all, which shows what reading the rows alone costs once they are out of cache.

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod common;

use std::hint::black_box;
use std::sync::Mutex;

use common::{Columns, LockedRing, CHUNK_ROWS, SAMPLE_ROWS, SEED};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf::sampler::Slice;
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

/// Windows of one sample.
const SLICES: usize = 8;
/// Steps of one window.
const SLICE_STEPS: usize = SAMPLE_ROWS / SLICES;
/// Steps of every trajectory.
const TRAJ_STEPS: u64 = 200;
/// The trajectory-id field.
const TRAJ_KEY: &str = "traj";
/// Buffer sizes, in rows, and their names in the report.
const SIZES: [(usize, &str); 2] = [(100_000, "1e5_rows"), (10_000_000, "1e7_rows")];

/// The mujoco-slice transition of WORKLOADS.md: the mujoco fields and an i64 `traj`.
fn slice_spec() -> Spec {
    common::mujoco_fields()
        .field(TRAJ_KEY, DType::I64, [1])
        .build()
        .expect("the mujoco-slice spec is valid")
}

/// A chunk of 1,000 transitions with `common`'s mujoco values (a stream gives it its
/// trajectory ids).
fn mujoco_slice_chunk(spec: &Spec) -> Batch {
    let shape_only = ReplayBuffer::builder(spec.clone())
        .capacity(CHUNK_ROWS)
        .build()
        .expect("a valid buffer");
    common::mujoco_chunk(&shape_only, CHUNK_ROWS)
}

/// One collector's stream of 1,000-row chunks: the same transitions every time, with
/// trajectory ids that go on counting, a new one every [`TRAJ_STEPS`] rows. As in
/// `replaybuf bench`, the stream starts half a trajectory in, so that trajectories
/// run on from one chunk into the next.
struct Stream {
    chunk: Batch,
    /// Position of the next row, counted from the first trajectory's start.
    next_step: u64,
}

impl Stream {
    fn new(chunk: Batch) -> Stream {
        Stream {
            chunk,
            next_step: TRAJ_STEPS / 2,
        }
    }

    /// The next chunk of the stream.
    fn next_chunk(&mut self) -> &Batch {
        let ids = self
            .chunk
            .column_mut::<i64>(TRAJ_KEY)
            .expect("an i64 trajectory id");
        for (step, id) in (self.next_step..).zip(ids.iter_mut()) {
            *id = (step / TRAJ_STEPS) as i64;
        }
        self.next_step += ids.len() as u64;
        &self.chunk
    }
}

/// A one-shard lock-free slice buffer of `rows` rows, extended until it has wrapped.
fn lock_free(spec: &Spec, rows: usize, chunk: &Batch) -> ReplayBuffer {
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(rows)
        .shards(1)
        .seed(SEED)
        .sampler(Slice::num_slices(SLICES).traj_key(TRAJ_KEY))
        .build()
        .expect("a valid slice buffer");
    let writer = rb.writer();
    let mut stream = Stream::new(chunk.clone());
    for _ in 0..=rows / CHUNK_ROWS {
        writer
            .extend(stream.next_chunk())
            .expect("the chunk matches the spec");
    }
    rb
}

/// The baseline: `common`'s row-major ring, the trajectory id of every slot also in a
/// contiguous column of its own (as TorchRL's columnar storage holds it: the cheapest
/// scan), and a sampler that keeps nothing between samples.
struct LockedSlices {
    ring: LockedRing,
    /// The `traj` of every slot.
    ids: Vec<i64>,
    /// Scratch of a sample: (age of its first row, rows) of every live trajectory of at
    /// least [`SLICE_STEPS`] rows, ages counted from the oldest live row.
    trajectories: Vec<(usize, usize)>,
}

impl LockedSlices {
    /// A ring of `rows` rows extended from `chunk`'s stream until it has wrapped, as
    /// [`lock_free`]'s buffer is.
    fn filled(spec: &Spec, rows: usize, chunk: &Batch) -> LockedSlices {
        let mut ring = LockedSlices {
            ring: LockedRing::new(spec, rows),
            ids: vec![0; rows],
            trajectories: Vec::new(),
        };
        let mut stream = Stream::new(chunk.clone());
        for _ in 0..=rows / CHUNK_ROWS {
            ring.extend(stream.next_chunk());
        }
        ring
    }

    fn extend(&mut self, chunk: &Batch) {
        let first = self.ring.cursor();
        self.ring.extend(&Columns::from_batch(chunk));
        let capacity = self.ids.len();
        let ids = chunk.column::<i64>(TRAJ_KEY).expect("an i64 trajectory id");
        for (k, &id) in ids.iter().enumerate() {
            self.ids[(first + k) % capacity] = id;
        }
    }

    /// Finds every live trajectory by scanning the ids oldest first, then draws
    /// [`SLICES`] windows into `out` as the lock-free sampler does: a trajectory
    /// uniformly among those long enough, a window uniformly inside it.
    fn sample_into(&mut self, rng: &mut Xoshiro256PlusPlus, out: &mut Columns) {
        let (rows, oldest) = (self.ring.rows(), self.oldest());
        let (newer, older) = self.ids[..rows].split_at(oldest);
        self.trajectories.clear();
        let mut first = 0;
        let mut last_id = None;
        for (age, &id) in older.iter().chain(newer).enumerate() {
            if last_id != Some(id) {
                if age - first >= SLICE_STEPS {
                    self.trajectories.push((first, age - first));
                }
                (first, last_id) = (age, Some(id));
            }
        }
        if rows - first >= SLICE_STEPS {
            self.trajectories.push((first, rows - first));
        }
        for s in 0..SLICES {
            let (start, len) = self.trajectories[rng.random_range(0..self.trajectories.len())];
            let from = start + rng.random_range(0..=len - SLICE_STEPS);
            self.copy_window(from, out, s);
        }
    }

    /// Copies [`SLICES`] windows that start anywhere among the live rows into `out`,
    /// trajectories ignored: the memory traffic of a sample and nothing else.
    fn copy_only(&self, rng: &mut Xoshiro256PlusPlus, out: &mut Columns) {
        for s in 0..SLICES {
            let from = rng.random_range(0..=self.ring.rows() - SLICE_STEPS);
            self.copy_window(from, out, s);
        }
    }

    /// The slot of the oldest live row.
    fn oldest(&self) -> usize {
        if self.ring.rows() < self.ids.len() {
            0
        } else {
            self.ring.cursor()
        }
    }

    /// Copies the [`SLICE_STEPS`] rows from age `from` on into window `s` of `out`.
    fn copy_window(&self, from: usize, out: &mut Columns, s: usize) {
        let oldest = self.oldest();
        for t in 0..SLICE_STEPS {
            let slot = (oldest + from + t) % self.ids.len();
            self.ring.copy_row(slot, out, s * SLICE_STEPS + t);
        }
    }
}

fn slice(c: &mut Criterion) {
    let spec = slice_spec();
    let chunk = mujoco_slice_chunk(&spec);
    let mut group = common::group(c, "slice_sample_8x32", SAMPLE_ROWS);
    for (rows, name) in SIZES {
        // One buffer at a time: at 10^7 rows each takes about 2 GB.
        let rb = lock_free(&spec, rows, &chunk);
        let mut learner = rb.learner();
        let mut batch = rb.batch([SAMPLE_ROWS]);
        group.bench_function(format!("lock_free/{name}"), |b| {
            b.iter(|| {
                learner.sample_into(&mut batch).expect("sample");
                black_box(&mut batch);
            });
        });
        drop((learner, rb));

        let locked = Mutex::new(LockedSlices::filled(&spec, rows, &chunk));
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(SEED);
        let mut out = Columns::zeros(&spec, SAMPLE_ROWS);
        group.bench_function(format!("locked_scan/{name}"), |b| {
            b.iter(|| {
                locked
                    .lock()
                    .expect("not poisoned")
                    .sample_into(&mut rng, &mut out);
                black_box(&mut out);
            });
        });
        group.bench_function(format!("locked_copy_only/{name}"), |b| {
            b.iter(|| {
                locked
                    .lock()
                    .expect("not poisoned")
                    .copy_only(&mut rng, &mut out);
                black_box(&mut out);
            });
        });
    }
    group.finish();
}

criterion_group!(benches, slice);
criterion_main!(benches);
