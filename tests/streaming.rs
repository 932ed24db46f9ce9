//! Streaming appends (`Storage::stream_rows`): the only appender in a shard, writing at
//! least 4 KiB of rows into a ring larger than the caches, or into a smaller ring that
//! holds at least 64 such appends, marks no slot. It announces its rows in the shard's
//! stream words, gathers them into a stage in L1 and stores the stage: into the large
//! ring by non-temporal stores of its whole lines, which read nothing first, into the
//! small one through the cache. These tests use such rings (640,000 rows of 120-byte
//! slots, 77 MB; and 64,000, 7.7 MB; and rows of 1 and 3 KB) and check that what the
//! stream writes reads back exactly, priorities included; that readers racing it on
//! the rows it overwrites get whole rows; and that an appender marking its slots
//! behind it waits for it.
//! `scripts/sanitize` runs this file under ThreadSanitizer and AddressSanitizer.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use replaybuf::sampler::Prioritized;
use replaybuf::{Batch, ReplayBuffer, Spec};

mod common;
use common::{fill_payload_rows as fill, payload_priority as priority};

/// Rows of the rings: their slots (an 8-byte stamp and 108 bytes of row, rounded to
/// words) take 77 MB, past the 32 MiB from which appends stream.
const ROWS: u64 = 640_000;
/// Rows of the rings inside the caches (7.7 MB): 64 appends of 1,000 rows, whose
/// appends of up to 1,000 rows stream through the cache.
const SMALL_ROWS: u64 = 64_000;

fn spec() -> Spec {
    spec_of(99)
}

/// [`spec`] with a payload of `bytes`.
fn spec_of(bytes: usize) -> Spec {
    common::payload_spec(bytes)
}

/// Asserts every row of `batch` is the whole row its id names; returns the ids.
fn whole(batch: &Batch) -> Vec<u64> {
    let ids = batch.column::<u64>("id").unwrap().to_vec();
    let mut want = Batch::zeros(batch.spec().clone(), [ids.len()]);
    fill(&mut want, &ids);
    for f in batch.spec().fields() {
        let (got, exp) = (
            batch.column_bytes(f.key()).unwrap(),
            want.column_bytes(f.key()).unwrap(),
        );
        if let Some(r) = (0..ids.len()).find(|&r| {
            got[r * f.bytes()..(r + 1) * f.bytes()] != exp[r * f.bytes()..(r + 1) * f.bytes()]
        }) {
            panic!(
                "torn row at index {}: id {} but field `{}` of another write",
                batch.index()[r],
                ids[r],
                f.key()
            );
        }
    }
    ids
}

/// Extends `rb` by rows `ids`, `chunk` at a time, through one writer.
fn extend(rb: &ReplayBuffer, ids: std::ops::Range<u64>, chunk: u64) {
    let writer = rb.writer();
    let mut first = ids.start;
    while first < ids.end {
        let n = chunk.min(ids.end - first);
        let mut batch = rb.batch([n as usize]);
        fill(&mut batch, &(first..first + n).collect::<Vec<_>>());
        writer.extend(&batch).unwrap();
        first += n;
    }
}

/// A collector: extends `rb` by rows `first..`, `chunk` at a time, until `stop`.
fn collect(rb: &ReplayBuffer, mut first: u64, chunk: u64, stop: &AtomicBool) {
    let writer = rb.writer();
    let mut batch = rb.batch([chunk as usize]);
    while !stop.load(Ordering::Relaxed) {
        fill(&mut batch, &(first..first + chunk).collect::<Vec<_>>());
        writer.extend(&batch).unwrap();
        first += chunk;
    }
}

/// A ring of [`ROWS`] filled once: every later extend laps it, and so streams.
fn lapped(builder: replaybuf::ReplayBufferBuilder) -> ReplayBuffer {
    lapped_of(builder, ROWS)
}

/// A ring of `rows` filled once.
fn lapped_of(builder: replaybuf::ReplayBufferBuilder, rows: u64) -> ReplayBuffer {
    let rb = builder.capacity(rows as usize).seed(5).build().unwrap();
    extend(&rb, 0..rows, 4096);
    rb
}

/// Rows `rows..rows + more` appended to a lapped ring of `rows`, 777 at a time,
/// which stream as `streamed` says (`internals::stream_of`), read back exactly.
fn streamed_rows_read_back(rows: u64, more: u64, streamed: bool) {
    // Chunks that start and end inside lines: the stages' partial lines at either end.
    streamed_rows_of_read_back(spec(), rows, more, 777, streamed);
}

/// [`streamed_rows_read_back`] of rows of `spec`, `chunk` at a time.
fn streamed_rows_of_read_back(spec: Spec, rows: u64, more: u64, chunk: u64, streamed: bool) {
    let rb = lapped_of(ReplayBuffer::builder(spec), rows);
    assert_eq!(replaybuf::internals::stream_of(&rb, chunk), Some(streamed));
    let next = rows + more;
    extend(&rb, rows..next, chunk);
    let ids = whole(&rb.read_all_in_order(None));
    assert_eq!(ids.len() as u64, rows);
    for (pos, &id) in ids.iter().enumerate() {
        let pos = pos as u64;
        let want = if pos < next - rows { rows + pos } else { pos };
        assert_eq!(id, want, "position {pos}");
    }
    for _ in 0..50 {
        whole(&rb.sample(256).unwrap());
    }
}

#[test]
fn streamed_rows_read_back_exactly() {
    streamed_rows_read_back(ROWS, 300_001, true);
}

#[test]
fn rows_streamed_through_the_cache_read_back_exactly() {
    streamed_rows_read_back(SMALL_ROWS, 30_001, false);
}

/// Rows of 992 bytes (a payload of 979), in slots of 1,000: a slot starts a line once
/// in 8. A stream gathers first the slots up to the next one that starts a line, 1 to
/// 7 of them, and its stage holds 8 (it held 5, and an append 6 or 7 slots short of a
/// line's start overran it: an internal-error panic). Appends of 9 rows start at each offset from a line's
/// start in turn, into a ring past the caches (40 MB) and one inside them.
#[test]
fn streams_starting_at_every_offset_in_a_line_read_back_exactly() {
    streamed_rows_of_read_back(spec_of(979), 40_000, 9 * 24, 9, true);
    streamed_rows_of_read_back(spec_of(979), 1_024, 9 * 24, 9, false);
}

/// Rows of 3 KB (a payload of 3,059; slots of 3,080 bytes) stream too, a stage of 8
/// of them at a time (the first lines up with the next slot to start a line), and so
/// do slots of 4 KiB; longer ones do not. Appends of 3 rows, past the caches (37 MB)
/// and inside them.
#[test]
fn streamed_rows_of_3_kb_read_back_exactly() {
    streamed_rows_of_read_back(spec_of(3059), 12_000, 3 * 40, 3, true);
    streamed_rows_of_read_back(spec_of(3059), 256, 3 * 40, 3, false);
    let longest = lapped_of(ReplayBuffer::builder(spec_of(4075)), 256);
    assert_eq!(replaybuf::internals::stream_of(&longest, 3), Some(false));
    let longer = lapped_of(ReplayBuffer::builder(spec_of(4076)), 256);
    assert_eq!(replaybuf::internals::stream_of(&longer, 3), None);
}

/// Which appends stream: into the small ring, those it holds 64 of and no larger
/// ones; none of fewer than 4 KiB of rows (34 of these 120-byte slots).
#[test]
fn small_rings_stream_only_appends_they_hold_64_of() {
    let small = lapped_of(ReplayBuffer::builder(spec()), SMALL_ROWS);
    assert_eq!(replaybuf::internals::stream_of(&small, 1000), Some(false));
    assert_eq!(replaybuf::internals::stream_of(&small, 1001), None);
    assert_eq!(replaybuf::internals::stream_of(&small, 33), None);
    let large = lapped(ReplayBuffer::builder(spec()));
    assert_eq!(replaybuf::internals::stream_of(&large, 300_000), Some(true));
    assert_eq!(replaybuf::internals::stream_of(&large, 33), None);
}

#[test]
fn streamed_rows_keep_their_priorities() {
    let rb = lapped(
        ReplayBuffer::builder(spec())
            .sampler(Prioritized::new(0.6, 0.4))
            .priority_key("prio"),
    );
    extend(&rb, ROWS..ROWS + 50_000, 1000);
    for pos in (0..60_000).step_by(997) {
        let id = if pos < 50_000 { ROWS + pos } else { pos };
        let got = rb.priority(pos).expect("a stored row");
        assert!(
            (got - priority(id)).abs() <= priority(id) * 1e-5,
            "position {pos}: priority {got}, written {}",
            priority(id)
        );
    }
    for _ in 0..50 {
        whole(&rb.sample(256).unwrap());
    }
}

/// A collector streams over the ring while one learner reads the positions it is
/// about to overwrite (rows whose stamps may land before their bytes, and rows lapped
/// under the copy) and another samples: every row comes back whole.
#[test]
fn readers_racing_a_stream_get_whole_rows() {
    readers_race_a_stream(ROWS);
}

/// [`readers_racing_a_stream_get_whole_rows`] on a ring inside the caches, whose
/// stream stores through the cache.
#[test]
fn readers_racing_a_stream_through_the_cache_get_whole_rows() {
    readers_race_a_stream(SMALL_ROWS);
}

/// The race of [`readers_racing_a_stream_get_whole_rows`] on a ring of `rows`.
fn readers_race_a_stream(rows: u64) {
    let rb = lapped_of(ReplayBuffer::builder(spec()), rows);
    assert!(replaybuf::internals::stream_of(&rb, 1000).is_some());
    let stop = AtomicBool::new(false);
    let (read, sampled) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| collect(&rb, rows, 1000, &stop));
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                // The next rows to be overwritten: 500 on from the writer's position.
                let at = rb.write_count() % rows;
                let positions: Vec<u64> = (at..at + 500).map(|p| p % rows).collect();
                let batch = rb.get_many(&positions).unwrap();
                for (&id, &p) in whole(&batch).iter().zip(&positions) {
                    assert_eq!(id % rows, p, "position {p} held row {id}");
                }
                read.fetch_add(500, Ordering::Relaxed);
            }
        });
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                whole(&rb.sample(256).unwrap());
                sampled.fetch_add(256, Ordering::Relaxed);
            }
        });
        std::thread::sleep(common::race_duration("REPLAYBUF_STRESS_MS"));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(read.into_inner() > 0 && sampled.into_inner() > 0);
    // Every extend after the fill laps the ring: so much streamed.
    assert!(rb.write_count() > rows, "the collector streamed");
}

/// Two collectors on one shard: one streams when it finds itself alone, the other
/// appends single rows, marking their slots, and must wait for any stream over the
/// rows its own overwrite. Neither hangs, and every row is whole.
#[test]
fn a_collector_marking_slots_waits_behind_a_stream() {
    let rb = lapped(ReplayBuffer::builder(spec()));
    let stop = AtomicBool::new(false);
    let singles = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| collect(&rb, 1 << 40, 2000, &stop));
        s.spawn(|| {
            let writer = rb.writer();
            let mut id = 1 << 50;
            let mut batch = rb.batch([1]);
            while !stop.load(Ordering::Relaxed) {
                fill(&mut batch, &[id]);
                writer.extend(&batch).unwrap();
                id += 1;
                singles.fetch_add(1, Ordering::Relaxed);
            }
        });
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                whole(&rb.sample(256).unwrap());
            }
        });
        std::thread::sleep(common::race_duration("REPLAYBUF_STRESS_MS"));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(singles.into_inner() > 0);
    whole(&rb.read_all_in_order(None));
}

/// Environment columns (ndim 2): a stream's slots hold a step of every lane in turn,
/// their rows taken from the batch a lane at a time (not one run of rows). Every row
/// comes back whole, and the ring holds exactly the last lap's rows.
#[test]
fn streamed_environment_columns_read_back_exactly() {
    const ENVS: u64 = 4;
    let rb = ReplayBuffer::builder(spec())
        .capacity(ROWS as usize)
        .ndim(2)
        .envs(ENVS as usize)
        .dim_extend(0)
        .seed(7)
        .build()
        .unwrap();
    let writer = rb.writer();
    let steps = ROWS / ENVS;
    // Step t of env e is row id t * ENVS + e; batches of 300 steps.
    let mut t = 0;
    while t < steps + steps / 2 + 7 {
        let n = 300.min(steps + steps / 2 + 7 - t);
        let mut batch = rb.batch([n as usize, ENVS as usize]);
        let ids: Vec<u64> = (t..t + n)
            .flat_map(|t| (0..ENVS).map(move |e| t * ENVS + e))
            .collect();
        fill(&mut batch, &ids);
        writer.extend(&batch).unwrap();
        t += n;
    }
    let mut ids = whole(&rb.read_all_in_order(None));
    ids.sort_unstable();
    let last = (t - steps) * ENVS..t * ENVS;
    assert_eq!(ids, last.collect::<Vec<_>>());
}
