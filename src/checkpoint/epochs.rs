//! The epochs file of a checkpoint: a without-replacement sampler's open epoch and
//! epoch count, in a small binary format.
//!
//! ```text
//! | magic "RBEPOCH\0" | kind | started | open | next | closed | items | item ... |
//! ```
//!
//! Every field is a little-endian `u64`; `kind` says what an item is: 1 for a row
//! (shard `u32`, lane `u32`, sequence number `u64`: 16 bytes), 2 for a slice window
//! (shard, lane, trajectory, start, next-or-`u64::MAX`, from, to: 48 bytes). Decoding
//! checks every item against the buffer's geometry, so a damaged file is an error,
//! never a draw outside the storage.
//!
//! Layer: api.

use crate::sampler::slice::SliceWindow;
use crate::sampler::without_replacement::{EpochState, OpenEpoch};
use crate::storage::geometry::Geometry;
use crate::storage::Draw;

const MAGIC: &[u8; 8] = b"RBEPOCH\0";
const HEADER_WORDS: usize = 7;

/// An item an epoch hands out, as the epochs file stores it.
pub(crate) trait EpochItem: Sized + Clone {
    const KIND: u64;
    const BYTES: usize;
    fn encode(&self, out: &mut Vec<u8>);
    /// The item in `bytes` (exactly `BYTES` long), if it names a place in `geometry`.
    fn decode(bytes: &[u8], geometry: &Geometry) -> Option<Self>;
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Whether lane `lane` of shard `shard` exists in `geometry`.
fn lane_exists(geometry: &Geometry, shard: u32, lane: u32) -> bool {
    u64::from(shard) < geometry.shards() && u64::from(lane) < geometry.ring(u64::from(shard)).width
}

impl EpochItem for Draw {
    const KIND: u64 = 1;
    const BYTES: usize = 16;

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&self.lane.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
    }

    fn decode(b: &[u8], geometry: &Geometry) -> Option<Draw> {
        let (shard, lane) = (u32_at(b, 0), u32_at(b, 4));
        lane_exists(geometry, shard, lane).then(|| Draw {
            shard,
            lane,
            seq: u64_at(b, 8),
            ..Draw::default()
        })
    }
}

impl EpochItem for SliceWindow {
    const KIND: u64 = 2;
    const BYTES: usize = 48;

    fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(self.drawn.is_none() && self.weight == 1.0);
        out.extend_from_slice(&self.shard.to_le_bytes());
        out.extend_from_slice(&self.lane.to_le_bytes());
        for w in [
            self.traj,
            self.start,
            self.next.unwrap_or(u64::MAX),
            self.from,
            self.to,
        ] {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }

    fn decode(b: &[u8], geometry: &Geometry) -> Option<SliceWindow> {
        let (shard, lane) = (u32_at(b, 0), u32_at(b, 4));
        let next = u64_at(b, 24);
        let w = SliceWindow {
            shard,
            lane,
            traj: u64_at(b, 8),
            start: u64_at(b, 16),
            next: (next != u64::MAX).then_some(next),
            from: u64_at(b, 32),
            to: u64_at(b, 40),
            drawn: None,
            weight: 1.0,
        };
        (lane_exists(geometry, shard, lane) && w.from <= w.to).then_some(w)
    }
}

/// The epochs file of `state`.
pub(crate) fn encode<T: EpochItem>(state: &EpochState<T>) -> Vec<u8> {
    let items = state.open.as_ref().map_or(&[][..], |o| &o.items[..]);
    let mut out = Vec::with_capacity(8 * (HEADER_WORDS + 1) + items.len() * T::BYTES);
    out.extend_from_slice(MAGIC);
    let (next, closed) = state
        .open
        .as_ref()
        .map_or((0, false), |o| (o.next, o.closed));
    for w in [
        T::KIND,
        state.started,
        u64::from(state.open.is_some()),
        next,
        u64::from(closed),
        items.len() as u64,
    ] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    for item in items {
        item.encode(&mut out);
    }
    out
}

/// Decodes an epochs file for a buffer of `geometry`; why not, if it is damaged.
pub(crate) fn decode<T: EpochItem>(
    bytes: &[u8],
    geometry: &Geometry,
) -> Result<EpochState<T>, String> {
    if bytes.len() < 8 * HEADER_WORDS || &bytes[..8] != MAGIC {
        return Err("not an epochs file".to_owned());
    }
    let word = |i: usize| u64_at(bytes, 8 * i);
    if word(1) != T::KIND {
        return Err(format!(
            "epochs of item kind {}, but this sampler's are kind {}",
            word(1),
            T::KIND
        ));
    }
    let (started, open, next, closed, count) = (word(2), word(3), word(4), word(5), word(6));
    let body = &bytes[8 * HEADER_WORDS..];
    let expected = usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(T::BYTES))
        .filter(|&b| b == body.len())
        .ok_or_else(|| format!("{count} items do not fit the file's {} bytes", body.len()))?;
    if open > 1 || closed > 1 || next > count || (open == 0 && count > 0) {
        return Err("inconsistent epoch state".to_owned());
    }
    let mut items = Vec::with_capacity(expected / T::BYTES.max(1));
    for (i, chunk) in body.chunks_exact(T::BYTES).enumerate() {
        items.push(
            T::decode(chunk, geometry)
                .ok_or_else(|| format!("item {i} names no place in the storage"))?,
        );
    }
    Ok(EpochState {
        started,
        open: (open == 1).then_some(OpenEpoch {
            items,
            next,
            closed: closed == 1,
        }),
    })
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;

    #[test]
    fn epochs_round_trip_and_damage_is_an_error() {
        let g = Geometry::grid(10, 4, 2);
        let draws: Vec<Draw> = (0..5)
            .map(|i| Draw {
                shard: i % 2,
                lane: i % 2,
                seq: 100 + u64::from(i),
                ..Draw::default()
            })
            .collect();
        let state = EpochState {
            started: 3,
            open: Some(OpenEpoch {
                items: draws,
                next: 2,
                closed: false,
            }),
        };
        let bytes = encode(&state);
        assert_eq!(decode::<Draw>(&bytes, &g).unwrap(), state);
        assert!(
            decode::<SliceWindow>(&bytes, &g).is_err(),
            "wrong item kind"
        );
        assert!(decode::<Draw>(&bytes[..bytes.len() - 1], &g).is_err());
        let mut bad = bytes.clone();
        bad[8 * HEADER_WORDS] = 7; // shard 7 of 2
        assert!(decode::<Draw>(&bad, &g).is_err());
        let empty = EpochState::<Draw> {
            started: 0,
            open: None,
        };
        assert_eq!(decode::<Draw>(&encode(&empty), &g).unwrap(), empty);
    }
}
