//! The workloads of shared/WORKLOADS.md: their specs, sizes and data.

use replaybuf::sampler::{Prioritized, Slice};
use replaybuf::{Batch, DType, ReplayBuffer, ReplayBufferBuilder, Spec};

/// Steps of every trajectory of the slice workload.
pub const TRAJ_STEPS: u64 = 200;
/// Slices in one sampled batch of the slice workload (256 rows: 8 windows of 32 steps).
pub const SLICES_PER_BATCH: usize = 8;
/// The slice workload's trajectory-id field (i64, shape [1]).
pub const TRAJ_KEY: &str = "traj";

/// How a workload's buffer draws its batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sampling {
    /// Uniform, with replacement.
    Uniform,
    /// Prioritized (alpha 0.6, beta 0.4, eps 1e-8); learners also update priorities.
    Prioritized,
    /// [`SLICES_PER_BATCH`] windows of consecutive steps of one trajectory each,
    /// trajectories told apart by the [`TRAJ_KEY`] field.
    Slice,
}

/// One benchmark workload.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub capacity: usize,
    pub chunk: usize,
    pub batch: usize,
    pub payload_bytes: usize,
    pub sampling: Sampling,
}

impl Workload {
    pub fn mujoco(quick: bool) -> Workload {
        Workload {
            name: "mujoco",
            capacity: if quick { 200_000 } else { 1_000_000 },
            chunk: 1_000,
            batch: 256,
            payload_bytes: 165,
            sampling: Sampling::Uniform,
        }
    }

    pub fn mujoco_prioritized(quick: bool) -> Workload {
        Workload {
            name: "mujoco-prioritized",
            sampling: Sampling::Prioritized,
            ..Workload::mujoco(quick)
        }
    }

    /// The mujoco fields plus an i64 trajectory id; 200-step trajectories, sampled as
    /// 8 windows of 32 steps.
    pub fn mujoco_slice(quick: bool) -> Workload {
        Workload {
            name: "mujoco-slice",
            payload_bytes: 165 + 8,
            sampling: Sampling::Slice,
            ..Workload::mujoco(quick)
        }
    }

    pub fn atari(quick: bool) -> Workload {
        Workload {
            name: "atari",
            capacity: if quick { 10_000 } else { 50_000 },
            chunk: 256,
            batch: 32,
            payload_bytes: 56_461,
            sampling: Sampling::Uniform,
        }
    }

    /// Whether learners update the priorities of what they sample.
    pub fn prioritized(&self) -> bool {
        self.sampling == Sampling::Prioritized
    }

    /// A builder of this workload's buffer (capacity, sampler, seed).
    pub fn builder(&self, seed: u64) -> ReplayBufferBuilder {
        let b = ReplayBuffer::builder(self.spec())
            .capacity(self.capacity)
            .seed(seed);
        match self.sampling {
            Sampling::Uniform => b,
            Sampling::Prioritized => b.sampler(Prioritized::new(0.6, 0.4).eps(1e-8)),
            Sampling::Slice => b.sampler(Slice::num_slices(SLICES_PER_BATCH).traj_key(TRAJ_KEY)),
        }
    }

    pub fn spec(&self) -> Spec {
        let b = Spec::builder();
        let b = match self.name {
            "atari" => b
                .field("obs", DType::U8, [4, 84, 84])
                .field("action", DType::I64, [1])
                .field("reward", DType::F32, [1])
                .field("next_obs", DType::U8, [4, 84, 84])
                .field("done", DType::Bool, [1]),
            _ => b
                .field("obs", DType::F32, [17])
                .field("action", DType::F32, [6])
                .field("reward", DType::F32, [1])
                .field("next_obs", DType::F32, [17])
                .field("done", DType::Bool, [1]),
        };
        let b = match self.sampling {
            Sampling::Slice => b.field(TRAJ_KEY, DType::I64, [1]),
            Sampling::Uniform | Sampling::Prioritized => b,
        };
        b.build().expect("the workload specs are valid")
    }

    /// A chunk of `rows` transitions with varied contents (seeded, so runs compare). A
    /// slice workload's chunk holds the first `rows` steps of the trajectory stream
    /// ([`TrajIds`]).
    pub fn chunk_data(&self, rb: &ReplayBuffer, rows: usize, seed: u64) -> Batch {
        let mut batch = rb.batch([rows]);
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for field in rb.spec().fields().to_vec() {
            match field.dtype() {
                DType::F32 => batch
                    .column_mut::<f32>(field.key())
                    .expect("f32 field")
                    .iter_mut()
                    .for_each(|v| *v = (next() % 2000) as f32 / 1000.0 - 1.0),
                DType::U8 => batch
                    .column_mut::<u8>(field.key())
                    .expect("u8 field")
                    .iter_mut()
                    .for_each(|v| *v = next() as u8),
                DType::I64 => batch
                    .column_mut::<i64>(field.key())
                    .expect("i64 field")
                    .iter_mut()
                    .for_each(|v| *v = (next() % 18) as i64),
                DType::Bool => batch
                    .column_mut::<bool>(field.key())
                    .expect("bool field")
                    .iter_mut()
                    .for_each(|v| *v = next() % 100 == 0),
                other => unreachable!("workloads use no {other} field"),
            }
        }
        if self.sampling == Sampling::Slice {
            TrajIds::default().stamp(&mut batch);
        }
        batch
    }

    /// The trajectory ids of the stream a collector of this workload extends, for
    /// workloads whose rows carry one.
    pub fn traj_ids(&self) -> Option<TrajIds> {
        (self.sampling == Sampling::Slice).then(TrajIds::default)
    }
}

/// The trajectory ids of one collector's stream of rows: every [`TRAJ_STEPS`] rows
/// start a new trajectory, whatever the chunk boundaries.
///
/// The stream starts half a trajectory in, so that with 1,000-row chunks (a multiple
/// of 200) every chunk ends inside a trajectory that the next chunk continues, as a
/// collector's chunks do when episodes and chunks are not aligned.
#[derive(Clone, Debug)]
pub struct TrajIds {
    /// Stream position of the next row, counted from the first trajectory's start.
    next_step: u64,
}

impl Default for TrajIds {
    fn default() -> TrajIds {
        TrajIds {
            next_step: TRAJ_STEPS / 2,
        }
    }
}

impl TrajIds {
    /// Writes the ids of the stream's next `chunk.len()` rows into `chunk`'s
    /// [`TRAJ_KEY`] column, and moves past them.
    pub fn stamp(&mut self, chunk: &mut Batch) {
        let ids = chunk
            .column_mut::<i64>(TRAJ_KEY)
            .expect("a slice workload's chunk has an i64 trajectory id");
        for (step, id) in (self.next_step..).zip(ids.iter_mut()) {
            *id = (step / TRAJ_STEPS) as i64;
        }
        self.next_step += ids.len() as u64;
    }
}
