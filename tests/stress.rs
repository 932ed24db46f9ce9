//! Stress: writers and learners hammer small buffers at once; every field of a row is
//! derived from one counter, and every row a learner gets back must be whole.
//!
//! The rings are tiny, so writers lap readers constantly; there are more writer
//! handles than shards, so writers share cursors and lap each other; some extends are
//! longer than a shard; one test rewrites rows in place (`write_all`) meanwhile; four
//! rebuild stacked frames from several slots while collectors lap them (every sampler
//! but slices). Run longer with `REPLAYBUF_STRESS_MS=20000`; `scripts/sanitize` runs this file under
//! ThreadSanitizer and AddressSanitizer.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use replaybuf::sampler::{Prioritized, Slice, SlicePriority, WithoutReplacement};
use replaybuf::typed::TypedBuffer;
use replaybuf::{Batch, DType, Frames, ReplayBuffer, Spec};

mod common;

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [7])
        .field("tag", DType::U16, [3])
        .field("flag", DType::Bool, [])
        .field(("next", "bytes"), DType::U8, [37])
        .field("neg", DType::I64, [])
        .field("traj", DType::U64, [])
        .build()
        .unwrap()
}

/// Fills `batch` with rows `ids`.
fn fill(batch: &mut Batch, ids: &[u64]) {
    batch.set("id", ids).unwrap();
    let obs: Vec<f32> = ids
        .iter()
        .flat_map(|&i| (0..7).map(move |k| (i * 7 + k) as f32))
        .collect();
    batch.set("obs", &obs).unwrap();
    let tag: Vec<u16> = ids
        .iter()
        .flat_map(|&i| [i as u16, (i >> 16) as u16, (i >> 32) as u16])
        .collect();
    batch.set("tag", &tag).unwrap();
    let flag: Vec<bool> = ids.iter().map(|&i| i.count_ones() % 2 == 1).collect();
    batch.set("flag", &flag).unwrap();
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&i| (0..37u64).map(move |k| (i.wrapping_mul(31) + k) as u8))
        .collect();
    batch.set(("next", "bytes"), &bytes).unwrap();
    let neg: Vec<i64> = ids.iter().map(|&i| -(i as i64)).collect();
    batch.set("neg", &neg).unwrap();
    let traj: Vec<u64> = ids.iter().map(|&i| i / TRAJ_LEN).collect();
    batch.set("traj", &traj).unwrap();
}

/// Each collector's ids run in trajectories of this many steps.
const TRAJ_LEN: u64 = 5;

/// Asserts that every slice of a slice batch is consecutive steps of one trajectory.
fn check_windows(batch: &Batch) {
    let &[_, len] = batch.shape() else {
        panic!("a slice batch is [slices, len], got {:?}", batch.shape())
    };
    for w in batch.column::<u64>("id").unwrap().chunks(len) {
        for p in w.windows(2) {
            assert_eq!(p[1], p[0] + 1, "a window skips or repeats a step: {w:?}");
        }
        assert_eq!(
            w[0] / TRAJ_LEN,
            w[len - 1] / TRAJ_LEN,
            "a window spans trajectories: {w:?}"
        );
    }
}

/// Writes rows `ids` into a batch: every byte of a row derived from its id (and, for
/// frames, from the ids of its trajectory's neighbouring steps).
type Rows = fn(&mut Batch, &[u64]);

/// Asserts every row of `batch` is one whole row; returns how many were checked.
fn check(batch: &Batch) -> u64 {
    check_rows(batch, fill)
}

/// Asserts every row of `batch` is what `rows` writes for its id; returns how many
/// were checked.
fn check_rows(batch: &Batch, rows: Rows) -> u64 {
    let ids = batch.column::<u64>("id").unwrap();
    let mut expected = Batch::zeros(batch.spec().clone(), [ids.len()]);
    rows(&mut expected, ids);
    for f in batch.spec().fields() {
        let (got, want) = (
            batch.column_bytes(f.key()).unwrap(),
            expected.column_bytes(f.key()).unwrap(),
        );
        if got != want {
            let row = (0..ids.len())
                .find(|&r| {
                    got[r * f.bytes()..(r + 1) * f.bytes()]
                        != want[r * f.bytes()..(r + 1) * f.bytes()]
                })
                .unwrap();
            panic!(
                "torn row: index {} claims id {} but field `{}` belongs to another write",
                batch.index()[row],
                ids[row],
                f.key()
            );
        }
    }
    ids.len() as u64
}

/// Checks a prioritized batch's weights and sets new priorities for its rows (zero
/// for some), as a learner does after its loss.
fn update_priorities(rb: &ReplayBuffer, batch: &Batch, round: u64) {
    let weights = batch.weight().expect("a prioritized batch has weights");
    assert!(
        weights
            .iter()
            .all(|&w| w.is_finite() && w > 0.0 && w <= 1.0 + 1e-6),
        "weights out of (0, 1]: {weights:?}"
    );
    let priorities: Vec<f64> = (0..batch.len() as u64)
        .map(|k| ((round * 31 + k * 7) % 13) as f64 / 4.0)
        .collect();
    let done = rb
        .update_priority(batch.index(), batch.generations(), &priorities)
        .expect("valid priorities");
    assert_eq!(done.applied + done.stale, batch.len());
}

/// Runs `writers` collectors and `learners` learners on `rb` for the stress duration,
/// with an optional in-place editor. Returns (rows written, rows checked).
fn hammer(rb: &ReplayBuffer, writers: usize, learners: usize, edit: bool) -> (u64, u64) {
    hammer_rows(rb, writers, learners, edit, fill)
}

/// [`hammer`] with rows written by `rows` and checked against it.
fn hammer_rows(
    rb: &ReplayBuffer,
    writers: usize,
    learners: usize,
    edit: bool,
    rows: Rows,
) -> (u64, u64) {
    let prioritized = rb.alpha().is_some();
    let slices = rb.slice_sampler().is_some();
    let stop = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    let checked = AtomicU64::new(0);
    let envs = rb.envs();
    std::thread::scope(|s| {
        for w in 0..writers as u64 {
            let (writer, stop, written) = (rb.writer(), &stop, &written);
            s.spawn(move || {
                let width = writer.envs().map_or(1, |r| r.len());
                // Each environment's ids run on by one per step (ndim 2: its column).
                let mut next: Vec<u64> = (0..width as u64)
                    .map(|e| ((w + 1) << 40) + (e << 32))
                    .collect();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    // Mostly short extends; every 16th one is longer than a shard.
                    let t = if round.is_multiple_of(16) {
                        70
                    } else {
                        (round % 9 + 1) as usize
                    };
                    let shape = if rb.ndim() == 1 {
                        vec![t]
                    } else {
                        vec![t, width]
                    };
                    let mut batch = rb.batch(&shape);
                    let ids: Vec<u64> = (0..t)
                        .flat_map(|j| next.iter().map(move |&n| n + j as u64))
                        .collect();
                    next.iter_mut().for_each(|n| *n += t as u64);
                    rows(&mut batch, &ids);
                    writer.extend(&batch).unwrap();
                    written.fetch_add(ids.len() as u64, Ordering::Relaxed);
                }
            });
        }
        for _ in 0..learners {
            let (mut learner, stop, checked) = (rb.learner(), &stop, &checked);
            s.spawn(move || {
                let mut batch = rb.batch([16]);
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let n = match round % 8 {
                        0 => check_rows(&rb.read_all_in_order(None), rows),
                        1 => rb
                            .get(round % rb.capacity() as u64)
                            .map_or(0, |b| check_rows(&b, rows)),
                        _ => match learner.sample_into(&mut batch) {
                            Ok(()) => {
                                if prioritized {
                                    update_priorities(rb, &batch, round);
                                }
                                if slices {
                                    check_windows(&batch);
                                }
                                check_rows(&batch, rows)
                            }
                            Err(_) => 0,
                        },
                    };
                    checked.fetch_add(n, Ordering::Relaxed);
                }
            });
        }
        if edit {
            let stop = &stop;
            s.spawn(move || {
                let mut next = 1u64 << 60;
                while !stop.load(Ordering::Relaxed) {
                    let n = (rb.len() / envs).min(8) * envs;
                    let mut batch = rb.batch([n]);
                    let ids: Vec<u64> = (next..next + n as u64).collect();
                    next += n as u64;
                    rows(&mut batch, &ids);
                    // Positions that hold no row yet make this fail cleanly; fine.
                    let _ = rb.write_all(&batch, None);
                    std::thread::yield_now();
                }
            });
        }
        std::thread::sleep(common::race_duration("REPLAYBUF_STRESS_MS"));
        stop.store(true, Ordering::Relaxed);
    });
    (written.into_inner(), checked.into_inner())
}

#[test]
fn flat_rings_shared_by_more_writers_than_shards() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .shards(2)
        .seed(1)
        .build()
        .unwrap();
    let (written, checked) = hammer(&rb, 3, 2, false);
    assert!(
        written > 1000 && checked > 1000,
        "too little happened: {written} written, {checked} checked"
    );
    assert_eq!(rb.write_count(), written);
    check(&rb.read_all_in_order(None));
}

#[test]
fn in_place_rewrites_racing_appends() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(32)
        .seed(2)
        .build()
        .unwrap();
    let (written, checked) = hammer(&rb, 2, 2, true);
    assert!(
        written > 100 && checked > 100,
        "too little happened: {written} written, {checked} checked"
    );
    check(&rb.read_all_in_order(None));
}

#[test]
fn multi_env_columns() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(8 * 6)
        .ndim(2)
        .envs(6)
        .dim_extend(0)
        .shards(2)
        .seed(3)
        .build()
        .unwrap();
    let (written, checked) = hammer(&rb, 2, 2, false);
    assert!(
        written > 1000 && checked > 1000,
        "too little happened: {written} written, {checked} checked"
    );
    check(&rb.read_all_in_order(None));
}

#[test]
fn epochs_shared_by_learners() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(48)
        .sampler(WithoutReplacement::new())
        .seed(4)
        .build()
        .unwrap();
    let (written, checked) = hammer(&rb, 1, 3, false);
    assert!(
        written > 100 && checked > 100,
        "too little happened: {written} written, {checked} checked"
    );
}

#[test]
fn priorities_updated_while_collectors_write() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .shards(2)
        .sampler(Prioritized::new(0.7, 0.5).max_priority_within_buffer(true))
        .seed(6)
        .build()
        .unwrap();
    let (written, checked) = hammer(&rb, 3, 2, true);
    assert!(
        written > 1000 && checked > 1000,
        "too little happened: {written} written, {checked} checked"
    );
    check(&rb.read_all_in_order(None));
    assert!(
        replaybuf::internals::priorities_consistent(&rb),
        "after the run, some tree entry disagrees with its children"
    );
}

#[test]
fn slices_while_collectors_write() {
    enum Mode {
        Uniform,
        Epochs,
        Prioritized,
    }
    for (ndim, writers, mode) in [
        (1, 3, Mode::Uniform),
        (1, 2, Mode::Uniform),
        (2, 2, Mode::Uniform),
        (1, 2, Mode::Epochs),
        (2, 2, Mode::Prioritized),
    ] {
        let slice = Slice::slice_len(4).traj_key("traj");
        let slice = match mode {
            Mode::Uniform => slice,
            Mode::Epochs => slice.without_replacement(WithoutReplacement::new()),
            Mode::Prioritized => {
                slice.prioritized(Prioritized::new(0.7, 0.5), SlicePriority::Window)
            }
        };
        let builder = ReplayBuffer::builder(spec())
            .shards(2)
            .sampler(slice)
            .batch_size(16)
            .seed(7);
        let rb = match ndim {
            1 => builder.capacity(64),
            _ => builder.capacity(16 * 4).ndim(2).envs(4).dim_extend(0),
        }
        .build()
        .unwrap();
        // With more collectors than shards, collectors share rings, so their
        // trajectories interleave in pieces, and a window must stay inside one piece.
        let (written, checked) = hammer(&rb, writers, 2, false);
        assert!(
            written > 1000 && checked > 1000,
            "too little happened: {written} written, {checked} checked"
        );
        check(&rb.read_all_in_order(None));
        if matches!(mode, Mode::Prioritized) {
            assert!(replaybuf::internals::priorities_consistent(&rb));
        }
        if writers == 2 {
            // One collector per ring: whole trajectories of 5 steps are stored.
            // An epoch may have just run out: the next sample starts another.
            let batch = rb
                .sample(16)
                .or_else(|_| rb.sample(16))
                .expect("windows of 4 exist after the run");
            check(&batch);
            check_windows(&batch);
        }
    }
}

#[test]
fn typed_rows() {
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    struct Row {
        id: u64,
        square: u64,
        bytes: [u8; 24],
    }
    let row = |id: u64| Row {
        id,
        square: id.wrapping_mul(id),
        bytes: [id as u8; 24],
    };
    let rb = TypedBuffer::<Row>::builder()
        .capacity(32)
        .shards(2)
        .seed(5)
        .build()
        .unwrap();
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let checked = std::thread::scope(|s| {
        for w in 0..2u64 {
            let (rb, stop) = (&rb, &stop);
            s.spawn(move || {
                let mut id = w << 40;
                while !stop.load(Ordering::Relaxed) {
                    let rows: Vec<Row> = (0..7).map(|k| row(id + k)).collect();
                    rb.extend(&rows).unwrap();
                    id += 7;
                }
            });
        }
        let reader = s.spawn(|| {
            let mut n = 0u64;
            while start.elapsed() < common::race_duration("REPLAYBUF_STRESS_MS") {
                if let Ok(batch) = rb.sample(8) {
                    for r in batch.rows() {
                        assert_eq!(*r, row(r.id), "torn typed row");
                    }
                    n += batch.len() as u64;
                }
            }
            n
        });
        let n = reader.join();
        stop.store(true, Ordering::Relaxed);
        n.expect("the reader saw only whole rows")
    });
    assert!(checked > 1000);
}

/// Frames of the frames stress: `obs` a stack of [`DEPTH`] frames of [`FRAME`] bytes,
/// `next_obs` by `next_of`, so a sampled row is rebuilt from up to five slots.
const DEPTH: usize = 4;
const FRAME: usize = 192;

fn frames_spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::U8, [DEPTH, FRAME])
        .field("next_obs", DType::U8, [DEPTH, FRAME])
        .field("done", DType::Bool, [])
        .build()
        .unwrap()
}

/// Each stream's ids run from a multiple of 2^32 (`hammer`), and its first step starts
/// an episode.
fn stream_start(id: u64) -> u64 {
    id & !0xffff_ffff
}

/// Whether step `id` ends its episode: about one step in seven, by its id alone.
fn ends(id: u64) -> bool {
    common::mix(id).is_multiple_of(7)
}

/// Frame `id`'s bytes; an episode's last step's own next frame has bytes of its own.
fn push_frame(id: u64, terminal: bool, out: &mut Vec<u8>) {
    let id = id ^ (u64::from(terminal) << 63);
    out.extend((0..FRAME).map(|k| pixel(id, k)));
}

/// Step `id`'s stack: the frames of its episode's steps up to it, the episode's first
/// frame repeated before that.
fn push_stack(id: u64, out: &mut Vec<u8>) {
    let mut since = 0;
    while since < DEPTH as u64 - 1 && id - since > stream_start(id) && !ends(id - since - 1) {
        since += 1;
    }
    for j in 0..DEPTH as u64 {
        push_frame(id - (DEPTH as u64 - 1 - j).min(since), false, out);
    }
}

/// Rows `ids` of the frames stress: each row's stack, its next stack (the next step's,
/// or at an episode's end its own shifted by a terminal frame) and whether it ends.
fn frame_rows(batch: &mut Batch, ids: &[u64]) {
    batch.set("id", ids).unwrap();
    let (mut obs, mut next) = (Vec::new(), Vec::new());
    for &id in ids {
        push_stack(id, &mut obs);
        if ends(id) {
            let mut own = Vec::new();
            push_stack(id, &mut own);
            next.extend_from_slice(&own[FRAME..]);
            push_frame(id, true, &mut next);
        } else {
            push_stack(id + 1, &mut next);
        }
    }
    batch.set("obs", &obs).unwrap();
    batch.set("next_obs", &next).unwrap();
    let done: Vec<bool> = ids.iter().map(|&id| ends(id)).collect();
    batch.set("done", &done).unwrap();
}

/// A frames buffer hammered by one collector a shard: few side slots (episode ends
/// evict rows), tiny rings lapped mid-rebuild; every row returned, by any sampler or
/// read, is its id's stacks, never frames of another lap or trajectory.
fn frames_hammer(builder: replaybuf::ReplayBufferBuilder, writers: usize) {
    let rb = builder
        .frames(
            Frames::new()
                .stack("obs", DEPTH)
                .next_of("obs", "next_obs")
                .terminal_slots(3),
        )
        .build()
        .unwrap();
    let (written, checked) = hammer_rows(&rb, writers, 2, false, frame_rows);
    assert!(
        written > 1000 && checked > 1000,
        "too little happened: {written} written, {checked} checked"
    );
    assert_eq!(rb.write_count(), written);
    check_rows(&rb.read_all_in_order(None), frame_rows);
}

#[test]
fn stacked_rows_rebuilt_while_collectors_lap_them() {
    frames_hammer(
        ReplayBuffer::builder(frames_spec())
            .capacity(64)
            .shards(2)
            .seed(11),
        2,
    );
}

#[test]
fn stacked_rows_of_env_columns() {
    frames_hammer(
        ReplayBuffer::builder(frames_spec())
            .capacity(8 * 6)
            .ndim(2)
            .envs(6)
            .dim_extend(0)
            .shards(2)
            .seed(12),
        2,
    );
}

#[test]
fn stacked_rows_in_epochs() {
    frames_hammer(
        ReplayBuffer::builder(frames_spec())
            .capacity(64)
            .shards(2)
            .sampler(WithoutReplacement::new())
            .seed(14),
        2,
    );
}

#[test]
fn stacked_rows_with_priorities_updated() {
    frames_hammer(
        ReplayBuffer::builder(frames_spec())
            .capacity(64)
            .shards(2)
            .sampler(Prioritized::new(0.7, 0.5))
            .seed(13),
        2,
    );
}

/// Rows of a streaming append: two large pixel fields (written with non-temporal
/// stores) around small fields, every byte derived from the row's id.
fn pixel_spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::U8, [2048])
        .field("check", DType::U64, [])
        .field("next_obs", DType::U8, [1032])
        .build()
        .unwrap()
}

fn pixel(id: u64, k: usize) -> u8 {
    (id.wrapping_mul(0x9e37_79b9).wrapping_add(k as u64 * 131) >> 3) as u8
}

fn pixel_rows(rb: &ReplayBuffer, ids: &[u64]) -> Batch {
    let mut b = rb.batch([ids.len()]);
    b.set("id", ids).unwrap();
    b.set(
        "check",
        &ids.iter().map(|&i| common::mix(i)).collect::<Vec<_>>(),
    )
    .unwrap();
    let obs: Vec<u8> = ids
        .iter()
        .flat_map(|&i| (0..2048).map(move |k| pixel(i, k)))
        .collect();
    b.set("obs", &obs).unwrap();
    let next: Vec<u8> = ids
        .iter()
        .flat_map(|&i| (0..1032).map(move |k| pixel(i + 1, k)))
        .collect();
    b.set("next_obs", &next).unwrap();
    b
}

/// Appends of 12 MB lap a ring of 76 MB (both past the streaming thresholds of
/// `storage/mod.rs`: appends from the second lap on stream) while learners sample: the
/// non-temporal stores sit between fences, so no learner ever gets a row whose pixels
/// are not its id's.
#[test]
fn streaming_appends_of_large_rows_are_never_torn() {
    let rb = ReplayBuffer::builder(pixel_spec())
        .capacity(6 * 4096)
        .seed(9)
        .build()
        .unwrap();
    let chunk = 4096;
    rb.extend(&pixel_rows(&rb, &(0..chunk as u64).collect::<Vec<_>>()))
        .unwrap();
    let stop = AtomicBool::new(false);
    let checked = AtomicU64::new(0);
    let deadline = Instant::now() + common::race_duration("REPLAYBUF_STRESS_MS");
    std::thread::scope(|s| {
        s.spawn(|| {
            let writer = rb.writer();
            let mut next = chunk as u64;
            while Instant::now() < deadline {
                let ids: Vec<u64> = (next..next + chunk as u64).collect();
                writer.extend(&pixel_rows(&rb, &ids)).unwrap();
                next += chunk as u64;
            }
            stop.store(true, Ordering::Relaxed);
        });
        for _ in 0..2 {
            s.spawn(|| {
                let mut learner = rb.learner();
                while !stop.load(Ordering::Relaxed) {
                    let b = learner.sample(64).unwrap();
                    let ids = b.column::<u64>("id").unwrap();
                    let check = b.column::<u64>("check").unwrap();
                    let obs = b.column::<u8>("obs").unwrap();
                    let next = b.column::<u8>("next_obs").unwrap();
                    for (r, &id) in ids.iter().enumerate() {
                        assert_eq!(check[r], common::mix(id), "torn row {id}");
                        for k in 0..2048 {
                            assert_eq!(obs[r * 2048 + k], pixel(id, k), "torn obs {id}");
                        }
                        for k in 0..1032 {
                            assert_eq!(next[r * 1032 + k], pixel(id + 1, k), "torn next {id}");
                        }
                    }
                    checked.fetch_add(ids.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    assert!(checked.load(Ordering::Relaxed) > 0);
}
