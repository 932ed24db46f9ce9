//! The workloads of shared/WORKLOADS.md: their specs, sizes and data.

use replaybuf::{Batch, DType, Prioritized, ReplayBuffer, ReplayBufferBuilder, Spec};

/// One benchmark workload.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub name: &'static str,
    pub capacity: usize,
    pub chunk: usize,
    pub batch: usize,
    pub payload_bytes: usize,
    /// Prioritized sampling (alpha 0.6, beta 0.4, eps 1e-8); learners also update.
    pub prioritized: bool,
}

impl Workload {
    pub fn mujoco(quick: bool) -> Workload {
        Workload {
            name: "mujoco",
            capacity: if quick { 200_000 } else { 1_000_000 },
            chunk: 1_000,
            batch: 256,
            payload_bytes: 165,
            prioritized: false,
        }
    }

    pub fn mujoco_prioritized(quick: bool) -> Workload {
        Workload {
            name: "mujoco-prioritized",
            prioritized: true,
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
            prioritized: false,
        }
    }

    /// A builder of this workload's buffer (capacity, sampler, seed).
    pub fn builder(&self, seed: u64) -> ReplayBufferBuilder {
        let b = ReplayBuffer::builder(self.spec())
            .capacity(self.capacity)
            .seed(seed);
        if self.prioritized {
            b.sampler(Prioritized::new(0.6, 0.4).eps(1e-8))
        } else {
            b
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
        b.build().expect("the workload specs are valid")
    }

    /// A chunk of `rows` transitions with varied contents (seeded, so runs compare).
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
        batch
    }
}
