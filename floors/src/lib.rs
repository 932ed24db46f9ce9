//! What replaybuf's benchmarks time the buffer against, shared by `replaybuf bench`
//! (the command line, `cli/`) and the library's criterion benches (`benches/`).
//!
//! - [`rows`]: a workload's rows in one plain array, and a uniform sample of them
//!   gathered plainly ([`PlainUniform`]): the raw-memory floor of the buffer's `sample`.
//! - [`tree`]: a prioritized learner's `sample+update` done plainly on one thread
//!   ([`PlainPrioritized`]), tuned as the buffer's step is: its floor.
//! - [`CacheFlush`]: pushes every line a bench touched out of the caches, as a
//!   learner's forward and backward passes do between its sample and its update.
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

/// The buffer's powers (`src/powers.rs`), built here too: the plain step raises its
/// weights and masses as the buffer does.
#[path = "../../src/powers.rs"]
mod powers;

use std::time::{Duration, Instant};

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

/// Memory to write over between a learner's sample and its update, so that the update
/// starts with the batch's lines out of every cache, as it does after a learner's
/// forward and backward passes over a network: twice the last-level cache's bytes
/// ([`CacheFlush::BYTES`]), written a byte a line.
pub struct CacheFlush {
    lines: Vec<u8>,
    pass: u8,
}

impl CacheFlush {
    /// Bytes written over: twice the 32 MiB last-level cache of the hosts these benches
    /// have run on, so that whatever replacement policy it has keeps no line of before.
    pub const BYTES: usize = 64 << 20;

    /// The memory, written once (a first touch of its pages would otherwise cost the
    /// first flush many times a later one's).
    pub fn new() -> CacheFlush {
        CacheFlush {
            lines: vec![1; Self::BYTES],
            pass: 1,
        }
    }

    /// Runs `before` on `state`, flushes, then runs `timed` on it: how long `timed`
    /// took (a learner's sample, its passes, and its update, timing the update).
    pub fn time_after<S: ?Sized>(
        &mut self,
        state: &mut S,
        before: impl FnOnce(&mut S),
        timed: impl FnOnce(&mut S),
    ) -> Duration {
        before(state);
        self.flush();
        let start = Instant::now();
        timed(state);
        start.elapsed()
    }

    /// Writes a byte of every line (a new value each pass, so none is a no-op).
    pub fn flush(&mut self) {
        self.pass = self.pass.wrapping_add(1);
        for line in self.lines.chunks_exact_mut(64) {
            line[0] = self.pass;
        }
        std::hint::black_box(&mut self.lines);
    }
}

impl Default for CacheFlush {
    fn default() -> CacheFlush {
        CacheFlush::new()
    }
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
