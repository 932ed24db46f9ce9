//! Uniform sampling with replacement over every live row.
//!
//! A draw picks a live row uniformly across shards (weighting each shard by its live
//! rows) and names it by its ring sequence number, so that a read can tell the drawn
//! row from a later one written to the same slot: a row replaced between the draw and
//! the copy is redrawn, never returned in its place.
//!
//! Layer: algos.

use rand::RngExt;

use crate::error::SampleError;
use crate::rng::Rng;
use crate::storage::shard::{Shard, Window};
use crate::storage::Draw;

/// Live rows across all shards.
pub(super) fn live_rows(shards: &[Shard], windows: &[Window]) -> u64 {
    shards
        .iter()
        .zip(windows)
        .map(|(s, w)| w.steps() * s.ring().width)
        .sum()
}

/// One uniform draw among `total` live rows; `None` if there are none.
///
/// Always inlined: where the compiler called it instead, its draw came back through
/// the stack and was reloaded 16 bytes at a time from narrower stores, a stall a draw
/// (`replaybuf bench` mujoco `sample` 256 took 11.9-12.8 us so, and 10.5-10.7
/// inlined).
#[inline(always)]
pub(super) fn pick(
    shards: &[Shard],
    windows: &[Window],
    total: u64,
    rng: &mut Rng,
) -> Option<Draw> {
    if total == 0 {
        return None;
    }
    let mut r = rng.random_range(0..total);
    for (k, (shard, w)) in shards.iter().zip(windows).enumerate() {
        let ring = shard.ring();
        let rows = w.steps() * ring.width;
        if r < rows {
            let (step, lane) = ring.step_lane(r);
            return Some(Draw {
                shard: k as u32,
                lane: lane as u32,
                seq: w.lo + step,
                ..Draw::default()
            });
        }
        r -= rows;
    }
    unreachable!("replaybuf internal error: a draw below the live total fell past the last shard")
}

pub(super) fn draw(
    shards: &[Shard],
    windows: &[Window],
    rng: &mut Rng,
    n: usize,
    out: &mut Vec<Draw>,
) -> Result<(), SampleError> {
    let total = live_rows(shards, windows);
    if total == 0 {
        return Err(SampleError::Empty);
    }
    // The generator's state in registers for the loop, not stored back at each draw
    // through `rng` (which the compiler cannot tell from `out`'s memory).
    let mut local = rng.clone();
    if let ([shard], [w]) = (shards, windows) {
        // One shard, the default: no walk across shards, and the draws written by an
        // `extend` of known length, with no capacity check each. Mujoco `sample` 256 by
        // callgrind, 57 -> 44 instructions a draw; laps alternating in one process
        // (Intel Xeon, family 6 model 207), 0.961x and 0.963x the time on 10,000 rows,
        // 0.974x and 0.977x on a million.
        let ring = shard.ring();
        out.extend((0..n).map(|_| {
            let (step, lane) = ring.step_lane(local.random_range(0..total));
            Draw {
                lane: lane as u32,
                seq: w.lo + step,
                ..Draw::default()
            }
        }));
    } else {
        out.reserve(n);
        for _ in 0..n {
            match pick(shards, windows, total, &mut local) {
                Some(d) => out.push(d),
                None => break,
            }
        }
    }
    *rng = local;
    Ok(())
}
