//! The workloads of shared/WORKLOADS.md: their specs, sizes and data.

use replaybuf::sampler::{Prioritized, Slice};
use replaybuf::{Batch, DType, Frames, ReplayBuffer, ReplayBufferBuilder, Spec};
use replaybuf_floors::{xorshift, Shape};

/// Steps after which a frames workload's stream repeats itself: a multiple of the
/// chunk and of [`EPISODE_STEPS`].
pub const FRAME_CYCLE: usize = 1024;
/// Steps of every episode of a frames workload.
pub const EPISODE_STEPS: usize = 512;
/// Frames in a frames workload's `obs` stack, and bytes of one frame.
pub const STACK_DEPTH: usize = 4;
pub const FRAME_BYTES: usize = 84 * 84;
/// Steps of every trajectory of the slice workload.
pub const TRAJ_STEPS: u64 = 200;
/// Slices in one sampled batch of the slice workload (256 rows: 8 windows of 32 steps).
pub const SLICES_PER_BATCH: usize = 8;
/// The slice workload's trajectory-id field (i64, shape `[1]`).
pub const TRAJ_KEY: &str = "traj";
/// The prioritized workloads' sampler: priorities to the power `ALPHA` as masses,
/// weights to the power `BETA`, `EPS` added to every priority (WORKLOADS.md).
pub const ALPHA: f64 = 0.6;
pub const BETA: f64 = 0.4;
pub const EPS: f64 = 1e-8;

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
    /// Frame stacks stored once a step, `next_obs` by `next_of` (atari-1m).
    pub frames: bool,
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
            frames: false,
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
            frames: false,
        }
    }

    /// The atari fields at a million rows, each step's frame stored once: `obs` a
    /// stack of the last 4 frames, `next_obs` the next step's `obs`.
    pub fn atari_1m(quick: bool) -> Workload {
        Workload {
            name: "atari-1m",
            capacity: if quick { 100_000 } else { 1_000_000 },
            frames: true,
            ..Workload::atari(quick)
        }
    }

    /// Whether learners update the priorities of what they sample.
    pub fn prioritized(&self) -> bool {
        self.sampling == Sampling::Prioritized
    }

    /// A builder of this workload's buffer (capacity, sampler, seed).
    pub fn builder(&self, seed: u64) -> ReplayBufferBuilder {
        let mut b = ReplayBuffer::builder(self.spec())
            .capacity(self.capacity)
            .seed(seed);
        if self.frames {
            b = b.frames(
                Frames::new()
                    .stack("obs", STACK_DEPTH)
                    .next_of("obs", "next_obs"),
            );
        }
        match self.sampling {
            Sampling::Uniform => b,
            Sampling::Prioritized => b.sampler(Prioritized::new(ALPHA, BETA).eps(EPS)),
            Sampling::Slice => b.sampler(Slice::num_slices(SLICES_PER_BATCH).traj_key(TRAJ_KEY)),
        }
    }

    /// The shape of this workload's rows and batches, for the plain floors
    /// (`replaybuf_floors`).
    pub fn shape(&self) -> Shape {
        let spec = self.spec();
        let fields = spec.fields().iter().map(|f| (f.offset(), f.bytes()));
        Shape::new(spec.row_bytes(), fields, self.capacity, self.batch)
    }

    pub fn spec(&self) -> Spec {
        let b = Spec::builder();
        let b = match self.name {
            "atari" | "atari-1m" => b
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
        let mut next = move || xorshift(&mut x);
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

    /// The chunks a collector of this workload extends in turn: one, or for a frames
    /// workload the [`FRAME_CYCLE`] steps of a stream that repeats itself: each step
    /// one new frame, stacks that follow their trajectory, an episode end every
    /// [`EPISODE_STEPS`] steps (the next stack then starts from its fill).
    pub fn chunks(&self, rb: &ReplayBuffer, seed: u64) -> Vec<Batch> {
        if !self.frames {
            return vec![self.chunk_data(rb, self.chunk, seed)];
        }
        const DEPTH: usize = STACK_DEPTH;
        const PIXELS: usize = FRAME_BYTES;
        let pool = self.chunk_data(rb, FRAME_CYCLE / 4, seed);
        let pool = pool.column::<u8>("obs").expect("u8 obs");
        let frame = |i: usize| &pool[(i % FRAME_CYCLE) * PIXELS..][..PIXELS];
        // The stack at stream step `i`: the episode's first frame repeated before it.
        let stack = |i: usize, out: &mut [u8]| {
            let since = i % EPISODE_STEPS;
            for j in 0..DEPTH {
                let back = (DEPTH - 1 - j).min(since);
                out[j * PIXELS..][..PIXELS].copy_from_slice(frame(i - back));
            }
        };
        (0..FRAME_CYCLE / self.chunk)
            .map(|c| {
                let mut batch = self.chunk_data(rb, self.chunk, seed + 1 + c as u64);
                let first = FRAME_CYCLE + c * self.chunk;
                let done: Vec<bool> = (0..self.chunk)
                    .map(|r| (first + r) % EPISODE_STEPS == EPISODE_STEPS - 1)
                    .collect();
                let obs = batch.column_mut::<u8>("obs").expect("u8 obs");
                for (r, out) in obs.chunks_exact_mut(DEPTH * PIXELS).enumerate() {
                    stack(first + r, out);
                }
                let next = batch.column_mut::<u8>("next_obs").expect("u8 next_obs");
                for (r, out) in next.chunks_exact_mut(DEPTH * PIXELS).enumerate() {
                    let i = first + r;
                    if done[r] {
                        // The episode's last observation: its stack, shifted, and a
                        // final frame of its own.
                        stack(i, out);
                        out.copy_within(PIXELS.., 0);
                        out[(DEPTH - 1) * PIXELS..].copy_from_slice(frame(i + 1 + FRAME_CYCLE / 2));
                    } else {
                        stack(i + 1, out);
                    }
                }
                batch.set("done", &done).expect("bool done");
                batch
            })
            .collect()
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
