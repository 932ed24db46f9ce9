//! Seeded random streams.
//!
//! Every sample draws from its own xoshiro256++ stream, derived from the buffer's seed
//! and a stream number: the buffer's call counter for `ReplayBuffer::sample`, the
//! handle number for a `Learner`, the epoch number for a without-replacement shuffle.
//! Under one seed, one single-threaded sequence of calls therefore draws the same rows
//! every run, and no learner ever waits on another for a shared generator.
//!
//! Layer: base.

use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

/// The generator behind every draw.
pub(crate) type Rng = Xoshiro256PlusPlus;

/// Stream-number spaces, kept apart so that, say, learner 3 and epoch 3 differ.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stream {
    Call(u64),
    Learner(u64),
    Epoch(u64),
}

/// SplitMix64's finaliser: a bijection that scatters nearby inputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The generator of stream `stream` under `seed`.
pub(crate) fn stream(seed: u64, stream: Stream) -> Rng {
    let (space, n) = match stream {
        Stream::Call(n) => (1u64, n),
        Stream::Learner(n) => (2, n),
        Stream::Epoch(n) => (3, n),
    };
    Rng::seed_from_u64(mix(
        seed ^ mix(space.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ mix(n))
    ))
}
