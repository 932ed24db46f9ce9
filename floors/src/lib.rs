//! What replaybuf's benchmarks time the buffer against, shared by `replaybuf bench`
//! (the command line, `cli/`) and the library's criterion benches (`benches/`).
//!
//! - [`rows`]: a workload's rows in one plain array, and a uniform sample of them
//!   gathered plainly ([`PlainUniform`]): the raw-memory floor of the buffer's `sample`.
//! - [`tree`]: a prioritized learner's `sample+update` done plainly on one thread
//!   ([`PlainPrioritized`]), tuned as the buffer's step is: its floor.
//! - [`Transition`]: the mujoco row as one `#[repr(C)]` value, which the typed face's
//!   benches push.
//!
//! Each floor does the buffer's work with nothing shared and nothing checked: no
//! stamps, laps, atomics, retries or landing checks, one thread, its memory on huge
//! pages as the buffer's is. Timed in the same process as the buffer, alternating
//! with it, a floor says what the buffer's protocol costs on the machine at hand, in
//! the same spell of a noisy host.

pub mod rows;
pub mod tree;

pub use rows::{PlainRows, PlainUniform, Shape};
pub use tree::PlainPrioritized;

/// The mujoco transition of WORKLOADS.md as one `#[repr(C)]` value: 168 bytes, like
/// the buffer's row (`done` widened to four bytes).
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct Transition {
    pub obs: [f32; 17],
    pub action: [f32; 6],
    pub reward: f32,
    pub next_obs: [f32; 17],
    pub done: u32,
}

impl Transition {
    /// `n` copies of one transition, a typed bench's chunk.
    pub fn chunk(n: usize) -> Vec<Transition> {
        vec![
            Transition {
                obs: [1.0; 17],
                action: [0.5; 6],
                reward: 1.0,
                next_obs: [2.0; 17],
                done: 0,
            };
            n
        ]
    }
}

/// `bytes` of memory for a floor: on huge pages where the kernel gives them, as the
/// buffer's storage asks, and written first, since untouched pages would all read one
/// cached zero page (and a copy into them would pay their first touch).
pub fn huge_pages(bytes: usize) -> memmap2::MmapMut {
    let mut map = memmap2::MmapMut::map_anon(bytes).expect("floor memory");
    let _ = map.advise(memmap2::Advice::HugePage);
    map.fill(1);
    map
}

/// The next number of a xorshift64 stream (`state` never 0).
pub fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Fresh priorities in [0.1, 1.1) for each row of a batch, as WORKLOADS.md's
/// `sample+update` gives them.
pub struct FreshPriorities {
    state: u64,
    values: Vec<f64>,
}

impl FreshPriorities {
    /// A stream of batches of `n` priorities, from `seed`.
    pub fn new(n: usize, seed: u64) -> FreshPriorities {
        FreshPriorities {
            state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            values: vec![0.0; n],
        }
    }

    /// The next batch.
    pub fn next_batch(&mut self) -> &[f64] {
        for v in &mut self.values {
            *v = 0.1 + (xorshift(&mut self.state) >> 11) as f64 / (1u64 << 53) as f64;
        }
        &self.values
    }
}
