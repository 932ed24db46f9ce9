//! Shared by the benches: the mujoco row and chunk, the locked baseline ring, and the
//! timer of one operation under background load.

// Every bench compiles this module on its own and uses only part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use rand::RngExt;
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf::{Batch, DType, ReplayBuffer, ReplayBufferBuilder, Spec, SpecBuilder};

/// Rows of both buffers.
pub const CAPACITY: usize = 200_000;
/// Rows of one collector's chunk.
pub const CHUNK_ROWS: usize = 1_000;
/// Rows of one learner's batch.
pub const SAMPLE_ROWS: usize = 256;
/// The seed of every draw.
pub const SEED: u64 = 7;

/// The mujoco fields of WORKLOADS.md, for a spec to add to.
pub fn mujoco_fields() -> SpecBuilder {
    Spec::builder()
        .field("obs", DType::F32, [17])
        .field("action", DType::F32, [6])
        .field("reward", DType::F32, [1])
        .field("next_obs", DType::F32, [17])
        .field("done", DType::Bool, [1])
}

/// The mujoco transition of WORKLOADS.md: 165 payload bytes in 168-byte rows.
pub fn mujoco_spec() -> Spec {
    mujoco_fields().build().expect("the mujoco spec is valid")
}

/// The shape of `spec`'s rows in a buffer of [`CAPACITY`] rows and its batches of
/// [`SAMPLE_ROWS`], for a plain floor (`replaybuf_floors`).
pub fn floor_shape(spec: &Spec) -> replaybuf_floors::Shape {
    let fields = spec.fields().iter().map(|f| (f.offset(), f.bytes()));
    replaybuf_floors::Shape::new(spec.row_bytes(), fields, CAPACITY, SAMPLE_ROWS)
}

/// A chunk of `rows` mujoco transitions with distinct values in every float.
pub fn mujoco_chunk(rb: &ReplayBuffer, rows: usize) -> Batch {
    let mut chunk = rb.batch([rows]);
    for key in ["obs", "action", "reward", "next_obs"] {
        let column = chunk.column_mut::<f32>(key).expect("an f32 field");
        for (i, v) in column.iter_mut().enumerate() {
            *v = i as f32 * 0.25;
        }
    }
    let done = chunk.column_mut::<bool>("done").expect("a bool field");
    if let Some(last) = done.last_mut() {
        *last = true;
    }
    chunk
}

/// A one-shard lock-free buffer of [`CAPACITY`] rows, extended with `chunk` until it
/// has wrapped: full, and in the steady state where every extend evicts.
pub fn lock_free_buffer(spec: Spec) -> (ReplayBuffer, Batch) {
    filled(ReplayBuffer::builder(spec))
}

/// The buffer `builder` makes with [`CAPACITY`] rows in one shard, filled as
/// [`lock_free_buffer`]'s is, and its chunk.
pub fn filled(builder: ReplayBufferBuilder) -> (ReplayBuffer, Batch) {
    let rb = builder
        .capacity(CAPACITY)
        .shards(1)
        .seed(SEED)
        .build()
        .expect("a valid buffer");
    let chunk = mujoco_chunk(&rb, CHUNK_ROWS);
    let writer = rb.writer();
    for _ in 0..=CAPACITY / CHUNK_ROWS {
        writer.extend(&chunk).expect("the chunk matches the spec");
    }
    (rb, chunk)
}

/// A benchmark group of `rows` rows per operation, with the settings every bench here
/// uses: 30 samples of 3 s after 1 s of warm-up.
pub fn group<'a>(c: &'a mut Criterion, name: &str, rows: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .throughput(Throughput::Elements(rows as u64))
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group
}

/// The locked baseline's batch: one byte column per field, in spec order.
pub struct Columns {
    rows: usize,
    cols: Vec<Vec<u8>>,
}

impl Columns {
    /// `rows` zeroed rows of `spec`.
    pub fn zeros(spec: &Spec, rows: usize) -> Columns {
        Columns {
            rows,
            cols: spec
                .fields()
                .iter()
                .map(|f| vec![0; rows * f.bytes()])
                .collect(),
        }
    }

    /// The same bytes as `batch`.
    pub fn from_batch(batch: &Batch) -> Columns {
        Columns {
            rows: batch.len(),
            cols: batch
                .spec()
                .fields()
                .iter()
                .map(|f| batch.column_bytes(f.key()).expect("own field").to_vec())
                .collect(),
        }
    }

    /// The columns, one per field in spec order.
    pub fn columns(&self) -> &[Vec<u8>] {
        &self.cols
    }
}

/// The baseline: the replay buffer RL users hand-roll today. A row-major ring of plain
/// bytes, written and read with one `copy_from_slice` per field, shared behind a
/// `Mutex`.
pub struct LockedRing {
    /// (offset in the row, bytes) of every field, in spec order.
    fields: Vec<(usize, usize)>,
    row_bytes: usize,
    capacity: usize,
    data: Vec<u8>,
    cursor: usize,
    len: usize,
}

impl LockedRing {
    /// An empty ring of `capacity` rows of `spec`.
    pub fn new(spec: &Spec, capacity: usize) -> LockedRing {
        LockedRing {
            fields: spec
                .fields()
                .iter()
                .map(|f| (f.offset(), f.bytes()))
                .collect(),
            row_bytes: spec.row_bytes(),
            capacity,
            data: vec![0; capacity * spec.row_bytes()],
            cursor: 0,
            len: 0,
        }
    }

    /// A ring of [`CAPACITY`] rows behind a mutex, extended with `chunk` until it has
    /// wrapped, as [`lock_free_buffer`] is.
    pub fn filled(spec: &Spec, chunk: &Columns) -> Mutex<LockedRing> {
        let mut ring = LockedRing::new(spec, CAPACITY);
        for _ in 0..=CAPACITY / chunk.rows {
            ring.extend(chunk);
        }
        Mutex::new(ring)
    }

    /// Appends the rows of `chunk` at the cursor, overwriting the oldest rows.
    pub fn extend(&mut self, chunk: &Columns) {
        for r in 0..chunk.rows {
            let row = &mut self.data[self.cursor * self.row_bytes..][..self.row_bytes];
            for (&(offset, bytes), col) in self.fields.iter().zip(&chunk.cols) {
                row[offset..offset + bytes].copy_from_slice(&col[r * bytes..][..bytes]);
            }
            self.cursor += 1;
            if self.cursor == self.capacity {
                self.cursor = 0;
            }
        }
        self.len = (self.len + chunk.rows).min(self.capacity);
    }

    /// Copies `out.rows` uniformly drawn rows into `out`, field by field.
    pub fn sample_into(&self, rng: &mut Xoshiro256PlusPlus, out: &mut Columns) {
        for k in 0..out.rows {
            self.copy_row(rng.random_range(0..self.len), out, k);
        }
    }

    /// Copies row `i` into row `k` of `out`, field by field.
    pub fn copy_row(&self, i: usize, out: &mut Columns, k: usize) {
        let row = &self.data[i * self.row_bytes..][..self.row_bytes];
        for (&(offset, bytes), col) in self.fields.iter().zip(&mut out.cols) {
            col[k * bytes..][..bytes].copy_from_slice(&row[offset..offset + bytes]);
        }
    }

    /// The slot the next appended row goes to.
    pub fn cursor(&self) -> usize {
        self.cursor
    }

    /// Rows stored.
    pub fn rows(&self) -> usize {
        self.len
    }
}

/// Times `iters` calls of `op` while another thread calls `background` in a loop. The
/// two threads start together at a barrier; the background thread stops once the
/// timing is taken.
pub fn time_under_load(
    iters: u64,
    mut background: impl FnMut() + Send,
    mut op: impl FnMut(),
) -> Duration {
    let start = Barrier::new(2);
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            start.wait();
            while !stop.load(Ordering::Relaxed) {
                background();
            }
        });
        start.wait();
        let t0 = Instant::now();
        for _ in 0..iters {
            op();
        }
        let elapsed = t0.elapsed();
        stop.store(true, Ordering::Relaxed);
        elapsed
    })
}
