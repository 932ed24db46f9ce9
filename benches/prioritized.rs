//! Prioritized replay on a full 200,000-row mujoco buffer (alpha 0.6, beta 0.4): a
//! sample of 256 rows followed by an update of their priorities, and an extend of
//! 1,000 rows entering with the max priority. The lock-free buffer beside the baseline
//! RL users hand-roll: the row-major ring of `common` plus cpprb-style sum and min
//! segment trees, all behind one `Mutex`. Each alone, and while a background thread
//! runs the other side (a collector extending, or a learner sampling and updating).
//! The step also beside its floor alone (`plain_tree`: the same work done plainly on
//! one thread, tuned as the buffer's step is, `replaybuf_floors::PlainPrioritized`),
//! and the update alone beside the floor's after a flush of the caches, as a learner
//! makes it after its forward and backward passes (`prioritized_update_cold_256_rows`).

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

mod common;

use std::hint::black_box;
use std::sync::Mutex;
use std::time::Duration;

use common::{Columns, LockedRing, CHUNK_ROWS, SAMPLE_ROWS, SEED};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf::internals::sumtree::{Leaf, OwnedTree};
use replaybuf::sampler::Prioritized;
use replaybuf::ReplayBuffer;
use replaybuf_floors::{CacheFlush, PlainPrioritized};

const ALPHA: f64 = 0.6;
const BETA: f64 = 0.4;
const EPS: f64 = 1e-8;

/// A binary sum tree and min tree over `leaves` priorities, as cpprb and most
/// hand-rolled prioritized buffers keep them: `f64`s in two heap-ordered arrays,
/// recomputed from the leaf to the root on every set.
struct SegmentTrees {
    leaves: usize,
    sum: Vec<f64>,
    min: Vec<f64>,
}

impl SegmentTrees {
    fn new(capacity: usize) -> SegmentTrees {
        let leaves = capacity.next_power_of_two();
        SegmentTrees {
            leaves,
            sum: vec![0.0; 2 * leaves],
            min: vec![f64::INFINITY; 2 * leaves],
        }
    }

    fn set(&mut self, i: usize, mass: f64) {
        let mut j = i + self.leaves;
        self.sum[j] = mass;
        self.min[j] = mass;
        while j > 1 {
            j /= 2;
            self.sum[j] = self.sum[2 * j] + self.sum[2 * j + 1];
            self.min[j] = self.min[2 * j].min(self.min[2 * j + 1]);
        }
    }

    /// The leaf holding mass `t` (`0 <= t < total`).
    fn find(&self, mut t: f64) -> usize {
        let mut j = 1;
        while j < self.leaves {
            j *= 2;
            if t >= self.sum[j] {
                t -= self.sum[j];
                j += 1;
            }
        }
        j - self.leaves
    }
}

/// The locked baseline: rows, trees and the max priority behind one lock.
struct LockedPrioritized {
    ring: LockedRing,
    trees: SegmentTrees,
    max_priority: f64,
}

impl LockedPrioritized {
    fn filled(spec: &replaybuf::Spec, chunk: &Columns) -> Mutex<LockedPrioritized> {
        let mut buffer = LockedPrioritized {
            ring: LockedRing::new(spec, common::CAPACITY),
            trees: SegmentTrees::new(common::CAPACITY),
            max_priority: 1.0,
        };
        for _ in 0..=common::CAPACITY / CHUNK_ROWS {
            buffer.extend(chunk);
        }
        Mutex::new(buffer)
    }

    fn extend(&mut self, chunk: &Columns) {
        let first = self.ring.cursor();
        self.ring.extend(chunk);
        let mass = (self.max_priority + EPS).powf(ALPHA);
        for k in 0..CHUNK_ROWS {
            self.trees.set((first + k) % common::CAPACITY, mass);
        }
    }

    /// Draws `out.rows` rows by priority into `out`, their indices into `index` and
    /// their normalised importance weights into `weight`.
    fn sample_into(
        &self,
        rng: &mut Xoshiro256PlusPlus,
        out: &mut Columns,
        index: &mut [usize],
        weight: &mut [f32],
    ) {
        let total = self.trees.sum[1];
        let n = self.ring.rows() as f64;
        let max_weight = (n * self.trees.min[1] / total).powf(-BETA);
        for k in 0..index.len() {
            let i = self.trees.find(rng.random_range(0.0..total));
            self.ring.copy_row(i, out, k);
            let p = self.trees.sum[i + self.trees.leaves] / total;
            index[k] = i;
            weight[k] = ((n * p).powf(-BETA) / max_weight) as f32;
        }
    }

    fn update(&mut self, index: &[usize], priority: &[f64]) {
        for (&i, &p) in index.iter().zip(priority) {
            self.max_priority = self.max_priority.max(p);
            self.trees.set(i, (p + EPS).powf(ALPHA));
        }
    }
}

/// Fresh priorities in [0.1, 1.1) for every update, as WORKLOADS.md's sample+update.
fn fresh(rng: &mut Xoshiro256PlusPlus, out: &mut [f64]) {
    for p in out {
        *p = 0.1 + rng.random::<f64>();
    }
}

fn prioritized(c: &mut Criterion) {
    let spec = common::mujoco_spec();
    let (rb, chunk) = common::filled(
        ReplayBuffer::builder(spec.clone()).sampler(Prioritized::new(ALPHA, BETA).eps(EPS)),
    );
    let columns = Columns::from_batch(&chunk);
    let locked = LockedPrioritized::filled(&spec, &columns);
    let writer = rb.writer();
    let mut learner = rb.learner();
    let mut batch = rb.batch([SAMPLE_ROWS]);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(SEED);
    let mut priorities = vec![0.0; SAMPLE_ROWS];
    let mut out = Columns::zeros(&spec, SAMPLE_ROWS);
    let mut index = vec![0; SAMPLE_ROWS];
    let mut weight = vec![0.0f32; SAMPLE_ROWS];

    let mut lock_free_step = |rng: &mut Xoshiro256PlusPlus| {
        learner.sample_into(&mut batch).expect("sample");
        fresh(rng, &mut priorities);
        black_box(
            rb.update_priority(batch.index(), batch.generations(), &priorities)
                .expect("update"),
        );
    };
    let mut locked_step = |rng: &mut Xoshiro256PlusPlus| {
        locked
            .lock()
            .expect("not poisoned")
            .sample_into(rng, &mut out, &mut index, &mut weight);
        black_box((&mut out, &mut weight));
        let mut priorities = [0.0; SAMPLE_ROWS];
        fresh(rng, &mut priorities);
        locked
            .lock()
            .expect("not poisoned")
            .update(&index, &priorities);
    };

    let mut group = common::group(c, "prioritized_sample_update_256_rows", SAMPLE_ROWS);
    group.bench_function("lock_free/alone", |b| b.iter(|| lock_free_step(&mut rng)));
    group.bench_function("locked/alone", |b| b.iter(|| locked_step(&mut rng)));
    let mut floor =
        PlainPrioritized::new(&common::floor_shape(&spec), ALPHA as f32, BETA as f32, EPS);
    group.bench_function("plain_tree/alone", |b| b.iter(|| floor.step()));
    drop(floor);
    group.bench_function("lock_free/background_writer", |b| {
        b.iter_custom(|iters| {
            common::time_under_load(
                iters,
                || {
                    black_box(writer.extend(&chunk).expect("extend"));
                },
                || lock_free_step(&mut rng),
            )
        });
    });
    group.bench_function("locked/background_writer", |b| {
        b.iter_custom(|iters| {
            common::time_under_load(
                iters,
                || locked.lock().expect("not poisoned").extend(&columns),
                || locked_step(&mut rng),
            )
        });
    });
    group.finish();

    let mut group = common::group(c, "prioritized_extend_1000_rows", CHUNK_ROWS);
    group.bench_function("lock_free/alone", |b| {
        b.iter(|| black_box(writer.extend(&chunk).expect("extend")));
    });
    group.bench_function("locked/alone", |b| {
        b.iter(|| locked.lock().expect("not poisoned").extend(&columns));
    });
    let mut background_rng = Xoshiro256PlusPlus::seed_from_u64(SEED + 1);
    group.bench_function("lock_free/background_learner", |b| {
        b.iter_custom(|iters| {
            common::time_under_load(
                iters,
                || lock_free_step(&mut background_rng),
                || {
                    black_box(writer.extend(&chunk).expect("extend"));
                },
            )
        });
    });
    group.bench_function("locked/background_learner", |b| {
        b.iter_custom(|iters| {
            common::time_under_load(
                iters,
                || locked_step(&mut background_rng),
                || locked.lock().expect("not poisoned").extend(&columns),
            )
        });
    });
    group.finish();

    // The update alone, after its sample and a flush of the caches, as a learner's
    // forward and backward passes leave them between the two; beside the floor's
    // update after the same. Only the update is timed, but each iteration also writes
    // over `CacheFlush::BYTES` (10 ms on this host), which criterion counts in its
    // warm-up and its plan of each sample's iterations: about a hundred iterations.
    let mut group = common::group(c, "prioritized_update_cold_256_rows", SAMPLE_ROWS);
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));
    let mut flush = CacheFlush::new();
    let mut state = (learner, batch, rng, priorities);
    group.bench_function("lock_free/cold", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    flush.time_after(
                        &mut state,
                        |(learner, batch, rng, priorities)| {
                            learner.sample_into(batch).expect("sample");
                            fresh(rng, priorities);
                        },
                        |(_, batch, _, priorities)| {
                            black_box(
                                rb.update_priority(batch.index(), batch.generations(), priorities)
                                    .expect("update"),
                            );
                        },
                    )
                })
                .sum()
        });
    });
    let mut floor =
        PlainPrioritized::new(&common::floor_shape(&spec), ALPHA as f32, BETA as f32, EPS);
    group.bench_function("plain_tree/cold", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| flush.time_after(&mut floor, |f| f.sample(), |f| f.update()))
                .sum()
        });
    });
    group.finish();
}

/// The descents alone: 256 draws through the lock-free trees of a million leaves (a
/// batch at a time, AVX2 where the CPU has it), beside the baseline's binary sum tree.
fn descend(c: &mut Criterion) {
    const LEAVES: usize = 1 << 20;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(SEED);
    let tree = OwnedTree::new(LEAVES);
    let masses: Vec<u64> = (0..LEAVES).map(|_| rng.random_range(1..100_000)).collect();
    let leaves: Vec<(Leaf, f64)> = masses.iter().map(|&m| (Leaf::new(1, m), 1.0)).collect();
    tree.set_run(0, &leaves);
    let mut baseline = SegmentTrees::new(LEAVES);
    for (i, &m) in masses.iter().enumerate() {
        baseline.set(i, m as f64);
    }
    let (total, baseline_total) = (tree.total(), baseline.sum[1]);
    let mut targets = vec![0u64; SAMPLE_ROWS];
    let mut landings = Vec::with_capacity(SAMPLE_ROWS);
    let mut group = common::group(c, "prioritized_descend_256", SAMPLE_ROWS);
    group.bench_function("lock_free", |b| {
        b.iter(|| {
            for t in &mut targets {
                *t = rng.random_range(0..total);
            }
            tree.descend_many(&targets, &mut landings);
            black_box(&landings);
        })
    });
    group.bench_function("binary_tree", |b| {
        b.iter(|| {
            for t in &mut targets {
                *t = baseline.find(rng.random::<f64>() * baseline_total) as u64;
            }
            black_box(&targets);
        })
    });
    group.finish();
}

criterion_group!(benches, prioritized, descend);
criterion_main!(benches);
