//! Frames stored once: a buffer with frame stacks and `next_of` returns exactly what a
//! buffer without them, fed the same stream, returns, across wrap-around, episode
//! ends, truncation, ndim-2 environments, several collectors and every sampler; it
//! refuses stacks that do not follow their trajectory; checkpoints keep it.
// The loom facade rule (atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use replaybuf::error::{AccessError, DataError};
use replaybuf::sampler::{Prioritized, Slice, WithoutReplacement};
use replaybuf::{Batch, DType, Frames, ReplayBuffer, ReplayBufferBuilder, Spec, StackFill};

fn spec(depth: usize) -> Spec {
    Spec::builder()
        .field("obs", DType::U8, [depth, 2, 2])
        .field("action", DType::I64, [])
        .field("reward", DType::F32, [1])
        .field("next_obs", DType::U8, [depth, 2, 2])
        .field("done", DType::Bool, [])
        .field("truncated", DType::Bool, [])
        .build()
        .unwrap()
}

fn frames(depth: usize, fill: StackFill) -> Frames {
    Frames::new()
        .stack("obs", depth)
        .next_of("obs", "next_obs")
        .fill(fill)
}

/// One step of one environment.
#[derive(Clone, Debug, PartialEq)]
struct Step {
    obs: Vec<u8>,
    id: i64,
    next_obs: Vec<u8>,
    done: bool,
    truncated: bool,
}

/// One environment's stream of 2x2-byte frames, each a unique little-endian id
/// (never 0): stacks of the last `depth` frames, episodes that end by
/// `done` or `truncated` at random.
struct Env {
    depth: usize,
    fill: StackFill,
    stack: Vec<u32>,
}

impl Env {
    fn new(depth: usize, fill: StackFill, ids: &mut u32) -> Env {
        let mut env = Env {
            depth,
            fill,
            stack: Vec::new(),
        };
        env.reset(ids);
        env
    }

    fn reset(&mut self, ids: &mut u32) {
        *ids += 1;
        let first = match self.fill {
            StackFill::Repeat => *ids,
            StackFill::Zeros => 0,
        };
        self.stack = vec![first; self.depth];
        self.stack[self.depth - 1] = *ids;
    }

    fn bytes(stack: &[u32]) -> Vec<u8> {
        stack.iter().flat_map(|f| f.to_le_bytes()).collect()
    }

    fn step(&mut self, ids: &mut u32, rng: &mut impl FnMut() -> u32) -> Step {
        let obs = Env::bytes(&self.stack);
        *ids += 1;
        let mut next = self.stack[1..].to_vec();
        next.push(*ids);
        let roll = rng() % 100;
        let (done, truncated) = (roll < 12, (12..16).contains(&roll));
        let step = Step {
            obs,
            id: i64::from(*ids),
            next_obs: Env::bytes(&next),
            done,
            truncated,
        };
        if done || truncated {
            self.reset(ids);
        } else {
            self.stack = next;
        }
        step
    }
}

/// `steps` as a batch of `shape` (row-major: `[t, envs]` is step-major).
fn batch_of(spec: &Arc<Spec>, steps: &[Step], shape: &[usize]) -> Batch {
    let mut b = Batch::zeros(spec.clone(), shape);
    let cat =
        |f: fn(&Step) -> &Vec<u8>| steps.iter().flat_map(|s| f(s).clone()).collect::<Vec<_>>();
    b.set("obs", &cat(|s| &s.obs)).unwrap();
    b.set("next_obs", &cat(|s| &s.next_obs)).unwrap();
    let ids: Vec<i64> = steps.iter().map(|s| s.id).collect();
    b.set("action", &ids).unwrap();
    let rewards: Vec<f32> = steps.iter().map(|s| s.id as f32 * 0.5).collect();
    b.set("reward", &rewards).unwrap();
    b.set("done", &steps.iter().map(|s| s.done).collect::<Vec<_>>())
        .unwrap();
    b.set(
        "truncated",
        &steps.iter().map(|s| s.truncated).collect::<Vec<_>>(),
    )
    .unwrap();
    b
}

/// Row `k` of `batch`, every field's bytes.
fn row_of(batch: &Batch, k: usize) -> Vec<Vec<u8>> {
    batch
        .spec()
        .fields()
        .iter()
        .map(|f| batch.column_bytes(f.key()).unwrap()[k * f.bytes()..][..f.bytes()].to_vec())
        .collect()
}

/// The expected row of step `s`.
fn expected(spec: &Arc<Spec>, s: &Step) -> Vec<Vec<u8>> {
    row_of(&batch_of(spec, std::slice::from_ref(s), &[1]), 0)
}

fn xorshift(seed: u64) -> impl FnMut() -> u32 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 16) as u32
    }
}

/// Feeds `rounds` extends of random length to a frames buffer and a plain one built
/// alike; after each, every row the frames buffer returns by index is the plain
/// buffer's row there, and all but the rows it cannot rebuild yet or any more are
/// returned; samples return the rows of the stream.
fn compare(
    depth: usize,
    fill: StackFill,
    capacity: usize,
    envs: Option<usize>,
    chunks: &[usize],
    seed: u64,
) {
    let spec = Arc::new(spec(depth));
    let build = |b: ReplayBufferBuilder| match envs {
        Some(e) => b.ndim(2).envs(e).dim_extend(0),
        None => b,
    };
    let plain = build(
        ReplayBuffer::builder(spec.clone())
            .capacity(capacity)
            .seed(seed),
    )
    .build()
    .unwrap();
    let packed = build(
        ReplayBuffer::builder(spec.clone())
            .capacity(capacity)
            .seed(seed)
            .frames(frames(depth, fill).terminal_slots(capacity)),
    )
    .build()
    .unwrap();
    let width = envs.unwrap_or(1);
    let mut ids = 0u32;
    let mut rng = xorshift(seed);
    let mut world: Vec<Env> = (0..width)
        .map(|_| Env::new(depth, fill, &mut ids))
        .collect();
    let mut by_id = HashMap::new();
    for &t in chunks {
        let steps: Vec<Step> = (0..t)
            .flat_map(|_| {
                world
                    .iter_mut()
                    .map(|e| e.step(&mut ids, &mut rng))
                    .collect::<Vec<_>>()
            })
            .collect();
        for s in &steps {
            by_id.insert(s.id, s.clone());
        }
        let shape: Vec<usize> = match envs {
            Some(e) => vec![t, e],
            None => vec![t],
        };
        plain.extend(&batch_of(&spec, &steps, &shape)).unwrap();
        packed.extend(&batch_of(&spec, &steps, &shape)).unwrap();
        assert_eq!(packed.len(), plain.len());

        let mut returned = 0;
        for i in 0..capacity as u64 {
            match packed.get(i) {
                Ok(row) => {
                    returned += 1;
                    let want = plain.get(i).unwrap();
                    assert_eq!(row_of(&row, 0), row_of(&want, 0), "index {i}");
                }
                Err(AccessError::NotWritten { .. }) => {}
                Err(e) => panic!("get({i}): {e}"),
            }
        }
        // Left out: each lane's newest step (its next is not written yet) and, once
        // the ring has wrapped, the oldest steps whose stacks reach past it.
        let lanes_steps = plain.len() / width;
        let left_out = (1 + depth - 1).min(lanes_steps) * width;
        assert!(
            returned >= plain.len() - left_out,
            "{returned} of {} rows returned",
            plain.len()
        );
        if returned > 0 {
            let sample = packed.sample(16).unwrap();
            let action = sample.column::<i64>("action").unwrap();
            for (k, id) in action.iter().enumerate() {
                assert_eq!(row_of(&sample, k), expected(&spec, &by_id[id]), "id {id}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn rebuilt_rows_are_the_uncompressed_buffers(
        depth in 1usize..5,
        zeros in any::<bool>(),
        capacity in 6usize..40,
        envs in prop::option::of(1usize..4),
        chunks in prop::collection::vec(1usize..12, 1..14),
        seed in any::<u64>(),
    ) {
        let fill = if zeros { StackFill::Zeros } else { StackFill::Repeat };
        let capacity = envs.map_or(capacity, |e| capacity.div_ceil(e) * e);
        // A lane must hold more steps than a row reads (refused at build otherwise).
        prop_assume!(capacity / envs.unwrap_or(1) > depth);
        compare(depth, fill, capacity, envs, &chunks, seed);
    }
}

#[test]
fn one_row_chunks_across_many_wraps() {
    compare(4, StackFill::Repeat, 16, None, &[1; 100], 7);
    compare(3, StackFill::Zeros, 12, Some(3), &[1; 60], 9);
}

/// A stream of `n` steps of one environment.
fn stream(depth: usize, n: usize, seed: u64, ids: &mut u32) -> Vec<Step> {
    stream_filled(depth, StackFill::Repeat, n, seed, ids)
}

fn stream_filled(depth: usize, fill: StackFill, n: usize, seed: u64, ids: &mut u32) -> Vec<Step> {
    let mut rng = xorshift(seed);
    let mut env = Env::new(depth, fill, ids);
    (0..n).map(|_| env.step(ids, &mut rng)).collect()
}

#[test]
fn stacks_that_do_not_follow_their_trajectory_are_refused_and_change_nothing() {
    let spec = Arc::new(spec(4));
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(64)
        .frames(frames(4, StackFill::Repeat))
        .build()
        .unwrap();
    let mut ids = 0;
    let steps = stream(4, 20, 3, &mut ids);
    rb.extend(&batch_of(&spec, &steps[..10], &[10])).unwrap();
    let before = rb.len();

    // A step skipped: the next chunk's first stack does not follow the stored steps.
    let skipped = &steps[11..20];
    let err = rb.extend(&batch_of(&spec, skipped, &[9])).unwrap_err();
    let DataError::Frames { key, .. } = &err else {
        panic!("expected a frames error, got {err}");
    };
    assert_eq!(key.to_string(), "obs");
    assert_eq!(rb.len(), before);

    // Inside one chunk: two steps swapped.
    let mut swapped = steps[10..20].to_vec();
    if !(swapped[3].done || swapped[3].truncated || swapped[4].done || swapped[4].truncated) {
        swapped.swap(3, 4);
        assert!(rb.extend(&batch_of(&spec, &swapped, &[10])).is_err());
        assert_eq!(rb.len(), before);
    }

    // A next stack whose older frames are not the step's newer ones.
    let mut bad = steps[10..20].to_vec();
    bad[2].next_obs[0] ^= 0xff;
    let err = rb.extend(&batch_of(&spec, &bad, &[10])).unwrap_err();
    assert!(matches!(&err, DataError::Frames { key, .. } if key.to_string() == "next_obs"));
    assert_eq!(rb.len(), before);

    // The right chunk goes in; unchecked stacks go in as given.
    rb.extend(&batch_of(&spec, &steps[10..20], &[10])).unwrap();
    assert_eq!(rb.len(), 20);
    let unchecked = ReplayBuffer::builder(spec.clone())
        .capacity(64)
        .frames(frames(4, StackFill::Repeat).unchecked())
        .build()
        .unwrap();
    unchecked.extend(&batch_of(&spec, skipped, &[9])).unwrap();
}

#[test]
fn bad_frames_are_refused_at_build() {
    let spec = Arc::new(spec(4));
    let refused = |f: Frames| {
        let err = ReplayBuffer::builder(spec.clone())
            .capacity(16)
            .frames(f)
            .build()
            .unwrap_err();
        err.to_string()
    };
    assert!(refused(Frames::new().stack("obs", 3)).contains("shape [3, ..]"));
    assert!(refused(Frames::new().stack("nope", 4)).contains("no field"));
    assert!(refused(Frames::new().next_of("obs", "action")).contains("one dtype and shape"));
    assert!(
        refused(Frames::new().next_of("obs", "next_obs").terminal_slots(0)).contains("at least 1")
    );
    // 16 rows over 4 environments: 4 steps a lane, one too few for stacks 4 deep.
    let err = ReplayBuffer::builder(spec.clone())
        .capacity(16)
        .ndim(2)
        .envs(4)
        .frames(frames(4, StackFill::Repeat))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("need at least 5"), "{err}");
    let no_done = Spec::builder()
        .field("obs", DType::U8, [2, 2])
        .field("next_obs", DType::U8, [2, 2])
        .build()
        .unwrap();
    let err = ReplayBuffer::builder(no_done)
        .capacity(16)
        .frames(Frames::new().next_of("obs", "next_obs"))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("done field"), "{err}");
}

#[test]
fn a_stack_of_84x84_frames_stores_one_frame_a_step() {
    let spec = Spec::builder()
        .field("obs", DType::U8, [4, 84, 84])
        .field("action", DType::I64, [1])
        .field("reward", DType::F32, [1])
        .field("next_obs", DType::U8, [4, 84, 84])
        .field("done", DType::Bool, [1])
        .build()
        .unwrap();
    let capacity = 4096;
    let rb = ReplayBuffer::builder(spec)
        .capacity(capacity)
        .frames(Frames::new().stack("obs", 4).next_of("obs", "next_obs"))
        .build()
        .unwrap();
    let per_row = rb.reserved_bytes() as f64 / capacity as f64;
    // 7,056 bytes of pixels, 13 of the rest, the stamp and frames word, a side slot per
    // 128 steps; and the region's fixed blocks over 4,096 rows.
    assert!(per_row < 7_200.0, "{per_row} bytes a row");
    let bytes = rb.row_bytes();
    assert_eq!(bytes.logical, rb.spec().row_bytes());
    assert!(bytes.logical > 2 * 4 * 84 * 84 + 8 + 4);
    // The newest frame and the small fields, after a stamp and the frames word.
    assert!(
        (84 * 84 + 13 + 16..84 * 84 + 13 + 24).contains(&bytes.slot),
        "{bytes:?}"
    );
    assert!(bytes.side >= 64 * 84 * 84, "{bytes:?}");
}

/// Several collectors, each its own writer and shard, and learners sampling while they
/// write: every sampled row is a step of the streams, whole (its stacks and next
/// stack are that step's, never frames of another lap).
#[test]
fn collectors_and_learners_never_see_a_mixed_row() {
    let depth = 4;
    let spec = Arc::new(spec(depth));
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(256)
        .shards(2)
        .frames(frames(depth, StackFill::Repeat).terminal_slots(128))
        .build()
        .unwrap();
    let mut ids = 0;
    let streams: Vec<Vec<Step>> = (0..2)
        // Long enough that the writers do not run out before the learners have
        // checked their rows: with 100,000 steps each, a CI run on 2 cores once saw
        // the writers finish first (the learners had checked fewer than 20,000).
        .map(|w| stream(depth, 300_000, 11 + w, &mut ids))
        .collect();
    let by_id: HashMap<i64, Step> = streams
        .iter()
        .flatten()
        .map(|s| (s.id, s.clone()))
        .collect();
    let stop = AtomicBool::new(false);
    let checked = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let writers: Vec<_> = streams
            .iter()
            .map(|s| {
                let writer = rb.writer();
                let (spec, checked) = (spec.clone(), &checked);
                scope.spawn(move || {
                    // Until the learners have checked enough rows written meanwhile.
                    for chunk in s.chunks(37) {
                        if checked.load(Ordering::Relaxed) >= 20_000 {
                            break;
                        }
                        writer
                            .extend(&batch_of(&spec, chunk, &[chunk.len()]))
                            .unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..2 {
            let rb = &rb;
            let (spec, by_id, stop, checked) = (&spec, &by_id, &stop, &checked);
            scope.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(batch) = rb.sample(32) else { continue };
                    let action = batch.column::<i64>("action").unwrap();
                    for (k, id) in action.iter().enumerate() {
                        assert_eq!(row_of(&batch, k), expected(spec, &by_id[id]), "id {id}");
                    }
                    checked.fetch_add(action.len(), Ordering::Relaxed);
                }
            });
        }
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(checked.load(Ordering::Relaxed) >= 20_000);
    assert!(
        rb.write_count() > 256,
        "the writers lapped the ring while learners sampled"
    );
}

#[test]
fn every_sampler_returns_rows_of_the_stream() {
    let depth = 3;
    let spec = Arc::new(spec(depth));
    let mut ids = 0;
    let steps = stream(depth, 300, 5, &mut ids);
    let by_id: HashMap<i64, Step> = steps.iter().map(|s| (s.id, s.clone())).collect();
    let samplers: Vec<replaybuf::sampler::Sampler> = vec![
        WithoutReplacement::new().into(),
        Prioritized::new(0.7, 0.5).into(),
        Slice::slice_len(4)
            .end_key("done")
            .truncated_key("truncated")
            .into(),
    ];
    for sampler in samplers {
        let rb = ReplayBuffer::builder(spec.clone())
            .capacity(128)
            .sampler(sampler.clone())
            .frames(frames(depth, StackFill::Repeat).terminal_slots(128))
            .build()
            .unwrap();
        rb.extend(&batch_of(&spec, &steps, &[steps.len()])).unwrap();
        let mut seen = 0;
        for _ in 0..8 {
            let batch = rb.sample(16).unwrap();
            let action = batch.column::<i64>("action").unwrap();
            for (k, id) in action.iter().enumerate() {
                if *id == 0 {
                    continue; // a slice's padding
                }
                assert_eq!(
                    row_of(&batch, k),
                    expected(&spec, &by_id[id]),
                    "{sampler:?}"
                );
                seen += 1;
            }
        }
        assert!(seen > 0, "{sampler:?}");
    }
}

/// A slice sampler reads the rows a frames buffer can rebuild: the newest row waits
/// for its successor's frame, and a window reading it failed, so a buffer of one short
/// trajectory was picked from 2^20 times and ended `Starved`.
#[test]
fn slices_leave_out_the_row_that_cannot_be_rebuilt_yet() {
    let depth = 2;
    let spec = Arc::new(spec(depth));
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(64)
        .sampler(
            Slice::slice_len(4)
                .end_key("done")
                .truncated_key("truncated")
                .strict_length(false),
        )
        .frames(frames(depth, StackFill::Repeat))
        .build()
        .unwrap();
    let mut ids = 0;
    let mut rng = || 99u32; // no episode ends
    let mut env = Env::new(depth, StackFill::Repeat, &mut ids);
    let steps: Vec<Step> = (0..3).map(|_| env.step(&mut ids, &mut rng)).collect();
    rb.extend(&batch_of(&spec, &steps, &[3])).unwrap();
    let batch = rb.sample(8).unwrap();
    let action = batch.column::<i64>("action").unwrap();
    for slice in 0..2 {
        let rows = &action[slice * 4..slice * 4 + 4];
        assert_eq!(rows[..2], [steps[0].id, steps[1].id], "{action:?}");
        assert_eq!(rows[2..], [0, 0], "{action:?}");
        for (k, step) in steps[..2].iter().enumerate() {
            assert_eq!(row_of(&batch, slice * 4 + k), expected(&spec, step));
        }
    }
}

#[test]
fn a_checkpoint_keeps_the_compact_rows() {
    let depth = 4;
    let spec = Arc::new(spec(depth));
    let build = || {
        ReplayBuffer::builder(spec.clone())
            .capacity(100)
            .frames(frames(depth, StackFill::Zeros))
            .build()
            .unwrap()
    };
    let rb = build();
    let mut ids = 0;
    let steps = stream_filled(depth, StackFill::Zeros, 250, 13, &mut ids);
    rb.extend(&batch_of(&spec, &steps, &[steps.len()])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    let mut back = build();
    back.restore(dir.path()).unwrap();
    // `inspect` tells the compact row from the logical one.
    let found = replaybuf::checkpoint::inspect(dir.path()).unwrap();
    assert_eq!(found.row_bytes(), Some(rb.row_bytes()));
    assert!(rb.row_bytes().slot < rb.row_bytes().logical);
    let shown = found.to_string();
    assert!(
        shown.contains("obs stacked 4 deep; next_obs the next step's obs"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("row: {} bytes as sampled", rb.row_bytes().logical)),
        "{shown}"
    );
    for i in 0..100 {
        match (rb.get(i), back.get(i)) {
            (Ok(a), Ok(b)) => assert_eq!(row_of(&a, 0), row_of(&b, 0)),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("index {i}: {:?} vs {:?}", a.is_ok(), b.is_ok()),
        }
    }
    // Hooks see the rows as stored, one frame a stack (a hook, even one that did
    // nothing, panicked: the hooked rows were written back by the logical spec).
    let scramble = |b: &mut Batch| {
        assert_eq!(b.spec().fields().len(), 5, "no next_obs in the stored form");
        for x in b.column_mut::<u8>("obs")? {
            *x ^= 0x5a;
        }
        Ok(())
    };
    rb.register_save_hook(scramble);
    let hooked = dir.path().join("hooked");
    rb.save(&hooked).unwrap();
    let mut raw = build();
    raw.restore(&hooked).unwrap();
    assert_ne!(
        all_rows(&raw),
        all_rows(&rb),
        "the save hook changed what is stored"
    );
    let mut back = build();
    back.register_load_hook(scramble);
    back.restore(&hooked).unwrap();
    assert_eq!(all_rows(&back), all_rows(&rb));
    // A buffer without frames is another layout: refused, saying so.
    let mut plain = ReplayBuffer::builder(spec.clone())
        .capacity(100)
        .build()
        .unwrap();
    let e = plain.restore(dir.path()).unwrap_err().to_string();
    assert!(e.contains("(no frames vs frames)"), "{e}");
}

/// Without `next_of` fields, episode ends take no side slot, and so no rows out: 200
/// steps of short episodes kept 128 rows of 200.
#[test]
fn stacks_alone_keep_every_row_whatever_the_episode_ends() {
    let depth = 2;
    let spec = Arc::new(spec(depth));
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(200)
        .frames(Frames::new().stack("obs", depth).terminal_slots(4))
        .build()
        .unwrap();
    let mut ids = 0;
    let steps = stream(depth, 200, 17, &mut ids);
    assert!(steps.iter().filter(|s| s.done || s.truncated).count() > 8);
    rb.extend(&batch_of(&spec, &steps, &[200])).unwrap();
    // The newest row waits for its successor's frame (`trim`): 199 of 200.
    let by_id: HashMap<i64, Step> = steps.iter().map(|s| (s.id, s.clone())).collect();
    let rows: Vec<_> = all_rows(&rb).into_iter().flatten().collect();
    assert_eq!(rows.len(), 199);
    let obs = |row: &[Vec<u8>]| row[0].clone();
    for row in &rows {
        let id = i64::from_le_bytes(row[1].clone().try_into().unwrap());
        assert_eq!(obs(row), by_id[&id].obs);
    }
}

/// A dataset of a frames buffer of two shards goes into one ring, as its extends do:
/// spread, the second shard's first rows stacked copies of their own frame.
#[test]
fn build_from_keeps_a_frames_dataset_in_one_ring() {
    let depth = 4;
    let spec = Arc::new(spec(depth));
    let mut ids = 0;
    let steps = stream(depth, 40, 5, &mut ids);
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(128)
        .shards(2)
        .frames(frames(depth, StackFill::Repeat))
        .build_from(&batch_of(&spec, &steps, &[40]))
        .unwrap();
    let by_id: HashMap<i64, Step> = steps.iter().map(|s| (s.id, s.clone())).collect();
    let rows: Vec<_> = all_rows(&rb).into_iter().flatten().collect();
    assert!(rows.len() >= 39, "{} rows", rows.len());
    for row in &rows {
        let id = i64::from_le_bytes(row[1].clone().try_into().unwrap());
        assert_eq!(row, &expected(&spec, &by_id[&id]), "row of step {id}");
    }
}

/// A stack whose frames hold no bytes is refused at build: its extend panicked.
#[test]
fn a_stack_of_empty_frames_is_refused() {
    let spec = Spec::builder()
        .field("obs", DType::U8, [4, 0])
        .field("done", DType::Bool, [])
        .build()
        .unwrap();
    let err = ReplayBuffer::builder(spec)
        .capacity(16)
        .frames(Frames::new().stack("obs", 4))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("no bytes"), "{err}");
}

#[test]
fn episode_ends_past_the_side_slots_take_their_rows_out() {
    let depth = 2;
    let spec = Arc::new(spec(depth));
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(200)
        .frames(frames(depth, StackFill::Repeat).terminal_slots(4))
        .build()
        .unwrap();
    let mut ids = 0;
    let steps = stream(depth, 200, 17, &mut ids);
    let ends = steps.iter().filter(|s| s.done || s.truncated).count();
    assert!(ends > 8, "the stream has {ends} episode ends");
    rb.extend(&batch_of(&spec, &steps, &[200])).unwrap();
    // The rows from the fifth-last episode end on.
    let kept_from = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.done || s.truncated)
        .rev()
        .nth(4)
        .map(|(i, _)| i + 1)
        .unwrap();
    assert_eq!(rb.len(), 200 - kept_from);
    let by_id: HashMap<i64, Step> = steps.iter().map(|s| (s.id, s.clone())).collect();
    for _ in 0..10 {
        let batch = rb.sample(16).unwrap();
        for (k, id) in batch.column::<i64>("action").unwrap().iter().enumerate() {
            assert_eq!(row_of(&batch, k), expected(&spec, &by_id[id]));
        }
    }
    assert!(matches!(
        rb.write_all(&rb.batch([1]), None),
        Err(AccessError::FramesRewrite)
    ));
}

/// The rows of `rb` by index, `None` where it returns none.
fn all_rows(rb: &ReplayBuffer) -> Vec<Option<Vec<Vec<u8>>>> {
    (0..rb.capacity() as u64)
        .map(|i| rb.get(i).ok().map(|b| row_of(&b, 0)))
        .collect()
}

#[test]
fn a_file_backed_buffer_with_frames_reopens_with_its_rows() {
    let depth = 3;
    let spec = Arc::new(spec(depth));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rb");
    let build = || {
        ReplayBuffer::builder(spec.clone())
            .capacity(64)
            .frames(frames(depth, StackFill::Repeat))
            .memmap(&path)
            .existsok(true)
            .build()
            .unwrap()
    };
    let mut ids = 0;
    let steps = stream(depth, 150, 19, &mut ids);
    let rows = {
        let rb = build();
        rb.extend(&batch_of(&spec, &steps[..100], &[100])).unwrap();
        rb.flush().unwrap();
        all_rows(&rb)
    };
    let rb = build();
    assert_eq!(all_rows(&rb), rows);
    // Its trajectory goes on where it stopped: the stacks are checked against it.
    rb.extend(&batch_of(&spec, &steps[100..], &[50])).unwrap();
    let by_id: HashMap<i64, Step> = steps.iter().map(|s| (s.id, s.clone())).collect();
    let batch = rb.sample(32).unwrap();
    for (k, id) in batch.column::<i64>("action").unwrap().iter().enumerate() {
        assert_eq!(row_of(&batch, k), expected(&spec, &by_id[id]));
    }
}

#[test]
fn a_shared_buffer_with_frames_serves_an_attached_handle() {
    let depth = 2;
    let spec = Arc::new(spec(depth));
    let name = format!("test-frames-shared-{}", std::process::id());
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(64)
        .frames(frames(depth, StackFill::Zeros))
        .shared(&name)
        .build()
        .unwrap();
    let mut ids = 0;
    let steps = stream_filled(depth, StackFill::Zeros, 90, 23, &mut ids);
    rb.extend(&batch_of(&spec, &steps, &[90])).unwrap();
    let other = ReplayBuffer::attach(&name).unwrap();
    assert_eq!(all_rows(&other), all_rows(&rb));
    assert!(all_rows(&other).iter().flatten().count() >= 60);
}

/// One endless episode's steps `range` with stacks of 2 one-byte frames (frame of step
/// `i` is `i + 1`), for the sampler checks below.
fn endless(range: std::ops::Range<u8>) -> Batch {
    let spec = Arc::new(
        Spec::builder()
            .field("obs", DType::U8, [2, 1])
            .field("next_obs", DType::U8, [2, 1])
            .field("done", DType::Bool, [])
            .build()
            .unwrap(),
    );
    let n = range.len();
    let mut b = Batch::zeros(spec, [n]);
    let (mut obs, mut next) = (Vec::new(), Vec::new());
    for i in range {
        obs.extend([i.max(1), i + 1]);
        next.extend([i + 1, i + 2]);
    }
    b.set("obs", &obs).unwrap();
    b.set("next_obs", &next).unwrap();
    b.set("done", &vec![false; n]).unwrap();
    b
}

fn endless_buffer(sampler: Option<replaybuf::sampler::Sampler>) -> ReplayBuffer {
    let spec = endless(0..1).spec().clone();
    let mut b = ReplayBuffer::builder((*spec).clone())
        .capacity(8)
        .seed(1)
        .frames(Frames::new().stack("obs", 2).next_of("obs", "next_obs"));
    if let Some(s) = sampler {
        b = b.sampler(s);
    }
    b.build().unwrap()
}

#[test]
fn an_epoch_whose_position_holds_the_newest_step_moves_on() {
    // The position held a later lap's row, the lane's newest, which cannot be rebuilt
    // yet: read as busy, it was retried 2^20 times (1.4 s), and the sample failed.
    let rb = endless_buffer(Some(WithoutReplacement::new().shuffle(false).into()));
    rb.extend(&endless(0..8)).unwrap();
    rb.sample(1).unwrap();
    rb.extend(&endless(8..10)).unwrap();
    let started = std::time::Instant::now();
    let row = rb.sample(1).unwrap();
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
    let obs = row.column::<u8>("obs").unwrap();
    assert_eq!(row.column::<u8>("next_obs").unwrap(), [obs[1], obs[1] + 1]);
}

#[test]
fn a_prioritized_buffer_with_no_row_to_rebuild_is_empty_at_once() {
    // Uniform said so at once; prioritized drew rows left out 2^20 times (0.45 s) and
    // failed as starved.
    for sampler in [None, Some(Prioritized::new(0.6, 0.4).into())] {
        let rb = endless_buffer(sampler);
        rb.extend(&endless(0..1)).unwrap();
        let started = std::time::Instant::now();
        assert_eq!(
            rb.sample(4).unwrap_err(),
            replaybuf::error::SampleError::Empty
        );
        assert!(started.elapsed() < std::time::Duration::from_millis(100));
        rb.extend(&endless(1..2)).unwrap();
        assert_eq!(rb.sample(4).unwrap().len(), 4);
    }
}
