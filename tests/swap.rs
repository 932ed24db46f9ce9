//! Swapping a built buffer's sampler, write policy and storage (`set_sampler`,
//! `set_writer`, `set_storage`, `reconfigure`): each kind of swap with the rows checked
//! one by one after it, what is carried over (priorities, random streams, handles),
//! and errors that leave the buffer as it was. The swaps racing collectors and
//! learners are in `tests/swap_concurrent.rs`.

use replaybuf::sampler::{Prioritized, Slice, Uniform, WithoutReplacement};
use replaybuf::swap::StorageConfig;
use replaybuf::typed::TypedBuffer;
use replaybuf::{Batch, DType, ReplayBuffer, Spec, WritePolicy};

mod common;
use common::mix;

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("check", DType::U64, [])
        .field("obs", DType::F32, [3])
        .field("done", DType::Bool, [])
        .field("td", DType::F32, [])
        .build()
        .unwrap()
}

/// Rows `first..first + n`: every field derived from the id; trajectories of 10 steps
/// (`done` on the last); `td` from 1 to 7.
fn rows(rb: &ReplayBuffer, first: u64, n: usize) -> Batch {
    let ids: Vec<u64> = (first..first + n as u64).collect();
    with_ids(rb, &ids, &[n])
}

fn with_ids(rb: &ReplayBuffer, ids: &[u64], shape: &[usize]) -> Batch {
    let mut b = rb.batch(shape);
    b.set("id", ids).unwrap();
    b.set("check", &ids.iter().map(|&i| mix(i)).collect::<Vec<_>>())
        .unwrap();
    let obs: Vec<f32> = ids
        .iter()
        .flat_map(|&i| [i as f32, -(i as f32), 0.5 * i as f32])
        .collect();
    b.set("obs", &obs).unwrap();
    b.set(
        "done",
        &ids.iter().map(|&i| i % 10 == 9).collect::<Vec<_>>(),
    )
    .unwrap();
    b.set(
        "td",
        &ids.iter()
            .map(|&i| (i % 7) as f32 + 1.0)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    b
}

/// The ids of `batch`, every row checked whole.
fn ids(batch: &Batch) -> Vec<u64> {
    let id = batch.column::<u64>("id").unwrap();
    let check = batch.column::<u64>("check").unwrap();
    let obs = batch.column::<f32>("obs").unwrap();
    for (k, &i) in id.iter().enumerate() {
        assert_eq!(check[k], mix(i), "row {k} (id {i}) is torn or foreign");
        assert_eq!(
            obs[3 * k..3 * k + 3],
            [i as f32, -(i as f32), 0.5 * i as f32]
        );
    }
    id.to_vec()
}

/// Every stored row's id, in storage order.
fn stored(rb: &ReplayBuffer) -> Vec<u64> {
    ids(&rb.read_all_in_order(None))
}

fn buffer(capacity: usize) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .seed(5)
        .build()
        .unwrap()
}

#[test]
fn uniform_and_without_replacement_trade_places_with_the_rows_in_place() {
    let rb = buffer(100);
    rb.extend(&rows(&rb, 0, 150)).unwrap(); // wrapped: rows 50..150
    let before = rb.read_all_in_order(None);
    rb.set_sampler(WithoutReplacement::new().shuffle(false))
        .unwrap();
    let after = rb.read_all_in_order(None);
    assert_eq!(ids(&after), ids(&before));
    // In place: indices and generations are those of before.
    assert_eq!(after.index(), before.index());
    assert_eq!(after.generations(), before.generations());
    // A fresh epoch over every row, in storage order.
    let epoch = rb.sample(100).unwrap();
    assert_eq!(ids(&epoch), ids(&before));
    rb.set_sampler(Uniform).unwrap();
    assert!(ids(&rb.sample(500).unwrap())
        .iter()
        .all(|i| (50..150).contains(i)));
}

#[test]
fn a_prioritized_sampler_moves_the_rows_into_trees() {
    let rb = buffer(100);
    rb.extend(&rows(&rb, 0, 130)).unwrap();
    let before = stored(&rb);
    rb.set_sampler(Prioritized::new(1.0, 0.5)).unwrap();
    assert_eq!(rb.alpha(), Some(1.0));
    // FIFO order kept: the same rows, oldest at the ring's start.
    let mut sorted = before.clone();
    sorted.sort_unstable();
    assert_eq!(stored(&rb), sorted);
    // Rows came in with new rows' priority; every row can be drawn.
    let all = rb.read_all_in_order(None);
    for &i in all.index() {
        assert_eq!(rb.priority(i), Some(1.0));
    }
    let batch = rb.sample(64).unwrap();
    assert!(batch.weight().unwrap().iter().all(|&w| w == 1.0));
    ids(&batch);
    // Priorities set now are kept by a swap to another prioritized sampler (a new eps:
    // new trees, the rows copied).
    let priority_of = |id: u64| 1.0 + (id % 13) as f64;
    let p: Vec<f64> = ids(&all).into_iter().map(priority_of).collect();
    rb.update_priority(all.index(), all.generations(), &p)
        .unwrap();
    rb.set_sampler(Prioritized::new(0.5, 0.5).eps(1e-3))
        .unwrap();
    let after = rb.read_all_in_order(None);
    assert_eq!(ids(&after), sorted);
    for (&i, id) in after.index().iter().zip(ids(&after)) {
        assert_eq!(rb.priority(i), Some(priority_of(id)), "row {id}");
    }
    // Alpha and beta alone change in place.
    rb.set_sampler(Prioritized::new(0.8, 0.9).eps(1e-3))
        .unwrap();
    assert_eq!((rb.alpha(), rb.beta()), (Some(0.8), Some(0.9)));
    assert_eq!(
        rb.read_all_in_order(None).generations(),
        after.generations()
    );
    // Back to uniform: priorities go, rows stay.
    rb.set_sampler(Uniform).unwrap();
    assert_eq!(rb.alpha(), None);
    assert_eq!(stored(&rb), sorted);
}

#[test]
fn updates_sampled_before_a_copy_are_stale_after_it() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(16)
        .sampler(Prioritized::new(1.0, 0.0))
        .seed(1)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 16)).unwrap();
    let sampled = rb.sample(8).unwrap();
    rb.set_storage(StorageConfig::heap()).unwrap();
    // Same indices, but rows of another storage: never given these priorities.
    let done = rb
        .update_priority(sampled.index(), sampled.generations(), &[9.0; 8])
        .unwrap();
    assert_eq!((done.applied, done.stale), (0, 8));
    // Sampled after the swap: applied.
    let fresh = rb.sample(8).unwrap();
    let done = rb
        .update_priority(fresh.index(), fresh.generations(), &[9.0; 8])
        .unwrap();
    assert_eq!(done.stale, 0);
}

#[test]
fn updates_sampled_before_a_shrink_are_stale_at_positions_the_new_storage_has_not() {
    // A row past the new capacity refused the whole update as out of range.
    let rb = ReplayBuffer::builder(spec())
        .capacity(100)
        .sampler(Prioritized::new(1.0, 0.0))
        .seed(1)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 100)).unwrap();
    let sampled = rb.sample(32).unwrap();
    assert!(sampled.index().iter().any(|&i| i >= 10));
    rb.set_storage(StorageConfig::heap().capacity(10)).unwrap();
    let done = rb
        .update_priority(sampled.index(), sampled.generations(), &[5.0; 32])
        .unwrap();
    assert_eq!((done.applied, done.stale), (0, 32));
    let e = rb
        .update_priority_all(sampled.index(), sampled.generations(), &[5.0; 32])
        .unwrap_err();
    assert!(e.to_string().contains("replaced"), "{e}");
    // A position past the capacity with a generation of this storage is still refused.
    let fresh = rb.sample(1).unwrap();
    assert!(rb
        .update_priority(&[10], fresh.generations(), &[1.0])
        .is_err());
}

#[test]
fn a_slice_sampler_reads_trajectories_of_the_carried_rows() {
    let rb = buffer(200);
    rb.extend(&rows(&rb, 0, 200)).unwrap();
    rb.set_sampler(Slice::slice_len(5).end_key("done")).unwrap();
    let batch = rb.sample(20).unwrap();
    assert_eq!(batch.shape(), &[4, 5]);
    for w in ids(&batch).chunks(5) {
        assert!(w.windows(2).all(|p| p[1] == p[0] + 1), "{w:?}");
        assert_eq!(w[0] / 10, w[4] / 10, "a window crosses an episode: {w:?}");
    }
}

#[test]
fn write_policies_swap_in_place() {
    let rb = buffer(10);
    rb.extend(&rows(&rb, 0, 10)).unwrap();
    let before = rb.read_all_in_order(None);
    rb.set_write_policy(WritePolicy::Immutable).unwrap();
    assert!(rb.extend(&rows(&rb, 10, 1)).is_err());
    assert!(rb.writer().extend(&rows(&rb, 10, 1)).is_err());
    assert_eq!(
        rb.read_all_in_order(None).generations(),
        before.generations()
    );
    // A max-value writer ranks what is stored (td = id % 7 + 1), then keeps the top.
    rb.set_write_policy(WritePolicy::max_value("td")).unwrap();
    let w = rb.extend(&with_ids(&rb, &[20, 26], &[2])).unwrap(); // td 7 and 6
    assert_eq!(w.accepted(), 2);
    let kept = stored(&rb);
    assert!(kept.contains(&20) && kept.contains(&26));
    // The two lowest (td 1: ids 0 and 7) made room.
    assert!(!kept.contains(&0) && !kept.contains(&7), "{kept:?}");
    rb.set_write_policy(WritePolicy::RoundRobin).unwrap();
    rb.extend(&rows(&rb, 30, 3)).unwrap();
    assert_eq!(rb.len(), 10);
}

#[test]
fn capacity_changes_keep_the_newest_rows_in_fifo_order() {
    let rb = buffer(100);
    rb.extend(&rows(&rb, 0, 170)).unwrap(); // 70..170, wrapped at 100
    rb.set_storage(StorageConfig::heap().capacity(1000))
        .unwrap();
    assert_eq!(rb.capacity(), 1000);
    assert_eq!(stored(&rb), (70..170).collect::<Vec<_>>());
    rb.extend(&rows(&rb, 170, 30)).unwrap();
    assert_eq!(stored(&rb), (70..200).collect::<Vec<_>>());
    rb.set_storage(StorageConfig::heap().capacity(50)).unwrap();
    assert_eq!(stored(&rb), (150..200).collect::<Vec<_>>());
    assert_eq!(rb.write_count(), 50);
    rb.extend(&rows(&rb, 200, 10)).unwrap(); // evicts the oldest
    let mut now = stored(&rb);
    now.sort_unstable();
    assert_eq!(now, (160..210).collect::<Vec<_>>());
}

/// The ids of each shard of an ndim-1 buffer, in FIFO order (none has wrapped).
fn by_shard(rb: &ReplayBuffer) -> Vec<Vec<u64>> {
    let per = rb.capacity() / rb.shards();
    let all = rb.read_all_in_order(None);
    let mut shards = vec![Vec::new(); rb.shards()];
    for (&i, id) in all.index().iter().zip(ids(&all)) {
        shards[i as usize / per].push(id);
    }
    shards
}

#[test]
fn shard_changes_merge_and_split_fifos() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(400)
        .shards(4)
        .build()
        .unwrap();
    let writers: Vec<_> = (0..4).map(|_| rb.writer()).collect();
    for (k, w) in writers.iter().enumerate() {
        w.extend(&rows(&rb, 1000 * k as u64, 20 + k)).unwrap();
    }
    // 4 -> 2: shards 0 and 2 meet in 0, 1 and 3 in 1, the writer's own shard last.
    rb.set_storage(StorageConfig::heap().shards(2)).unwrap();
    let run = |k: u64, n: u64| (1000 * k..1000 * k + n).collect::<Vec<_>>();
    assert_eq!(
        by_shard(&rb),
        [
            [run(2, 22), run(0, 20)].concat(),
            [run(3, 23), run(1, 21)].concat()
        ]
    );
    // Writer 3 now writes shard 1, after the rows there.
    assert_eq!(writers[3].shard(), 1);
    writers[3].extend(&rows(&rb, 3023, 2)).unwrap();
    let one = [run(3, 23), run(1, 21), run(3, 25)[23..].to_vec()].concat();
    assert_eq!(by_shard(&rb)[1], one);
    // 2 -> 8: each shard cut into four runs, as two halvings would: oldest to newest
    // in shards s + 6, s + 2, s + 4, s.
    rb.set_storage(StorageConfig::heap().shards(8).capacity(800))
        .unwrap();
    let shards = by_shard(&rb);
    let zero = [run(2, 22), run(0, 20)].concat();
    assert_eq!(
        [&shards[6][..], &shards[2], &shards[4], &shards[0]].concat(),
        zero
    );
    // Merging back restores both shards as they were.
    rb.set_storage(StorageConfig::heap().shards(2).capacity(400))
        .unwrap();
    assert_eq!(by_shard(&rb), [zero.clone(), one.clone()]);
    rb.set_storage(StorageConfig::heap().shards(4)).unwrap();
    rb.set_storage(StorageConfig::heap().shards(8).capacity(800))
        .unwrap();
    let shards = by_shard(&rb);
    assert!(shards.iter().all(|s| s.len() <= 11 + 1), "{shards:?}");
    assert_eq!(rb.len(), 20 + 21 + 22 + 25);
    // Fewer rows of room than rows: the oldest go.
    rb.set_storage(StorageConfig::heap().shards(1).capacity(10))
        .unwrap();
    assert_eq!(stored(&rb).len(), 10);
}

#[test]
fn ndim_and_environment_changes_lay_rows_out_step_by_step() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(40)
        .ndim(2)
        .envs(4)
        .dim_extend(0)
        .shards(2)
        .build()
        .unwrap();
    // Steps 0..5 of 4 environments: id = 100 * env + step.
    let ids_of = |steps: std::ops::Range<u64>, envs: u64| -> Vec<u64> {
        steps
            .flat_map(|t| (0..envs).map(move |e| 100 * e + t))
            .collect()
    };
    rb.extend(&with_ids(&rb, &ids_of(0..5, 4), &[5, 4]))
        .unwrap();
    // Same environments, one shard, more steps: every column as it was.
    rb.set_storage(StorageConfig::heap().capacity(80).shards(1))
        .unwrap();
    assert_eq!(stored(&rb), ids_of(0..5, 4));
    rb.extend(&with_ids(&rb, &ids_of(5..6, 4), &[1, 4]))
        .unwrap();
    assert_eq!(stored(&rb), ids_of(0..6, 4));
    // ndim 1: the rows in time order, step by step.
    rb.set_storage(StorageConfig::heap().ndim(1).capacity(100))
        .unwrap();
    assert_eq!((rb.ndim(), rb.envs()), (1, 1));
    assert_eq!(stored(&rb), ids_of(0..6, 4));
    // Back to ndim 2 with 8 environments: 24 rows fill 3 whole steps of 8.
    rb.set_storage(
        StorageConfig::heap()
            .ndim(2)
            .envs(8)
            .capacity(80)
            .dim_extend(0),
    )
    .unwrap();
    assert_eq!(rb.envs(), 8);
    assert_eq!(stored(&rb), ids_of(0..6, 4));
    // 5 environments: 24 rows make 4 steps of 5, the 4 oldest rows dropped.
    rb.set_storage(StorageConfig::heap().envs(5).capacity(50))
        .unwrap();
    assert_eq!(stored(&rb), ids_of(0..6, 4)[4..].to_vec());
}

#[test]
fn moving_to_a_file_backed_directory_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rb");
    let rb = buffer(100);
    rb.extend(&rows(&rb, 0, 60)).unwrap();
    rb.set_storage(StorageConfig::memmap(&path)).unwrap();
    assert_eq!(stored(&rb), (0..60).collect::<Vec<_>>());
    rb.extend(&rows(&rb, 60, 5)).unwrap();
    // A sampler or policy change that keeps the layout stays in the directory.
    rb.set_write_policy(WritePolicy::Immutable).unwrap();
    rb.set_write_policy(WritePolicy::RoundRobin).unwrap();
    // One that changes what the file lays out needs a new directory...
    let refused = rb.set_sampler(WithoutReplacement::new()).unwrap_err();
    assert!(refused.to_string().contains("file-backed"), "{refused}");
    // ...in the same swap.
    let moved = dir.path().join("rb2");
    rb.reconfigure()
        .sampler(WithoutReplacement::new())
        .storage(StorageConfig::memmap(&moved))
        .apply()
        .unwrap();
    rb.flush().unwrap();
    let rows_now = stored(&rb);
    assert_eq!(rows_now, (0..65).collect::<Vec<_>>());
    // Back to the heap; the directory then opens as the buffer it held.
    rb.set_storage(StorageConfig::heap()).unwrap();
    let reopened = ReplayBuffer::builder(spec())
        .capacity(100)
        .sampler(WithoutReplacement::new())
        .memmap(&moved)
        .existsok(true)
        .build()
        .unwrap();
    assert_eq!(stored(&reopened), rows_now);
    // A directory that holds a buffer is never opened by a swap.
    let err = rb.set_storage(StorageConfig::memmap(&path)).unwrap_err();
    assert!(err.build_error().is_some(), "{err}");
}

/// Everything a caller can see of a buffer, to compare before and after a refusal.
fn state(rb: &ReplayBuffer) -> (Vec<u64>, Vec<u64>, usize, usize, usize, Option<f64>) {
    let all = rb.read_all_in_order(None);
    (
        ids(&all),
        all.generations().to_vec(),
        rb.capacity(),
        rb.shards(),
        rb.ndim(),
        rb.alpha(),
    )
}

#[test]
fn refused_swaps_change_nothing() {
    let rb = buffer(64);
    rb.extend(&rows(&rb, 0, 40)).unwrap();
    let before = state(&rb);
    let refusals = [
        rb.set_sampler(Slice::slice_len(4).traj_key("episode")),
        rb.set_storage(StorageConfig::heap().shards(3)),
        rb.set_storage(StorageConfig::heap().capacity(0)),
        rb.set_storage(StorageConfig::heap().ndim(2)), // no envs
        rb.set_storage(StorageConfig::heap().ndim(2).envs(7)), // 64 % 7
        rb.set_write_policy(WritePolicy::max_value("nope")),
        rb.set_sampler(Prioritized::new(-1.0, 0.5)),
        rb.reconfigure()
            .sampler(Prioritized::new(0.6, 0.4))
            .write_policy(WritePolicy::max_value("td"))
            .apply(),
        rb.reconfigure().priority_key("td").apply(), // not prioritized
    ];
    for (k, r) in refusals.into_iter().enumerate() {
        let e = r.expect_err("refused");
        assert!(e.build_error().is_some(), "refusal {k}: {e}");
        assert!(!e.to_string().is_empty());
        assert_eq!(state(&rb), before, "refusal {k} changed the buffer");
    }
    // A max-value writer refuses a prioritized sampler, and the other way round.
    rb.set_write_policy(WritePolicy::max_value("td")).unwrap();
    let before = state(&rb);
    assert!(rb.set_sampler(Prioritized::new(0.6, 0.4)).is_err());
    assert_eq!(state(&rb), before);
    // A typed buffer refuses a max-value writer.
    let typed = TypedBuffer::<[u64; 2]>::builder()
        .capacity(8)
        .build()
        .unwrap();
    typed.extend(&[[1, 2]; 3]).unwrap();
    assert!(typed
        .set_write_policy(WritePolicy::max_value("row"))
        .is_err());
    assert_eq!(typed.len(), 3);
}

#[test]
fn random_streams_go_on_across_a_copy() {
    let (a, b) = (buffer(64), buffer(64));
    for rb in [&a, &b] {
        rb.extend(&rows(rb, 0, 50)).unwrap();
        for _ in 0..3 {
            rb.sample(8).unwrap();
        }
    }
    // Same shape, rows at the same positions: the fourth call draws the same rows.
    a.set_storage(StorageConfig::heap()).unwrap();
    assert_eq!(ids(&a.sample(16).unwrap()), ids(&b.sample(16).unwrap()));
    let (la, lb) = (a.learner(), b.learner());
    let (mut la, mut lb) = (la, lb);
    assert_eq!(ids(&la.sample(16).unwrap()), ids(&lb.sample(16).unwrap()));
}

#[test]
fn handles_outlive_swaps() {
    let rb = buffer(64);
    rb.extend(&rows(&rb, 0, 10)).unwrap();
    let writer = rb.writer();
    let mut learner = rb.learner();
    let mut loader = rb.loader().batch_size(4).prefetch(2).build().unwrap();
    let typed_view = rb.clone();
    rb.set_storage(StorageConfig::heap().capacity(128).shards(2))
        .unwrap();
    writer.extend(&rows(&rb, 10, 5)).unwrap();
    typed_view.extend(&rows(&rb, 15, 5)).unwrap();
    assert_eq!(rb.len(), 20);
    ids(&learner.sample(8).unwrap());
    for _ in 0..5 {
        ids(&loader.sample().unwrap());
    }
    rb.set_sampler(WithoutReplacement::new()).unwrap();
    ids(&loader.sample().unwrap());
    // Transforms stay with the buffer.
    rb.append_transform(|b: &mut Batch| {
        b.column_mut::<f32>("td")?.fill(-1.0);
        Ok(())
    });
    rb.set_storage(StorageConfig::heap()).unwrap();
    let s = rb.sample(4).unwrap();
    assert!(s.column::<f32>("td").unwrap().iter().all(|&t| t == -1.0));
}

/// A buffer with frames refuses every swap that would copy its rows into a new
/// storage, and is left as it was; swaps in place still go. The copy broke its
/// stacks: a row came back as an episode's start, the newest step was lost, and the
/// collector's next step was refused for good as not following it.
#[test]
fn a_buffer_with_frames_keeps_its_storage() {
    use replaybuf::Frames;
    let spec = Spec::builder()
        .field("obs", DType::U8, [2])
        .field("next_obs", DType::U8, [2])
        .field("done", DType::Bool, [])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec)
        .capacity(8)
        .seed(1)
        .frames(Frames::new().stack("obs", 2).next_of("obs", "next_obs"))
        .build()
        .unwrap();
    // One episode; the frame of step t is t: obs [t-1, t], next_obs [t, t+1].
    let steps = |from: u8, to: u8| {
        let mut b = rb.batch([usize::from(to - from)]);
        let obs: Vec<u8> = (from..to).flat_map(|t| [t.saturating_sub(1), t]).collect();
        let next: Vec<u8> = (from..to).flat_map(|t| [t, t + 1]).collect();
        b.set("obs", &obs).unwrap();
        b.set("next_obs", &next).unwrap();
        b
    };
    rb.extend(&steps(0, 12)).unwrap();
    let stacks = |rb: &ReplayBuffer| {
        let all = rb.read_all_in_order(None);
        let obs = all.column::<u8>("obs").unwrap().to_vec();
        (obs, all.column::<u8>("next_obs").unwrap().to_vec())
    };
    let before = stacks(&rb);
    for e in [
        rb.set_storage(StorageConfig::heap().capacity(64)),
        rb.set_storage(StorageConfig::heap().shards(2)),
        rb.set_sampler(Prioritized::new(0.6, 0.4)),
    ] {
        let e = e.unwrap_err().to_string();
        assert!(
            e.contains("a buffer with frames cannot move its rows"),
            "{e}"
        );
    }
    assert_eq!(stacks(&rb), before);
    // In place, and the collector goes on: its step 12 brings step 11 in.
    rb.set_sampler(WithoutReplacement::new()).unwrap();
    rb.extend(&steps(12, 13)).unwrap();
    let (obs, next) = stacks(&rb);
    assert!(obs.chunks(2).any(|s| s == [10, 11]), "{obs:?}");
    assert!(obs.chunks(2).all(|s| s[0] + 1 == s[1]), "{obs:?}");
    assert!(next.chunks(2).all(|s| s[0] + 1 == s[1]), "{next:?}");
}

/// The windows of `batch` (slices of 5), each checked to be consecutive steps of one
/// episode (`rows` ends one every 10 ids).
fn check_windows(batch: &Batch) {
    for w in ids(batch).chunks(5) {
        assert!(w.windows(2).all(|p| p[1] == p[0] + 1), "{w:?}");
        assert_eq!(w[0] / 10, w[4] / 10, "a window crosses an episode: {w:?}");
    }
}

#[test]
fn merged_shards_keep_each_ones_open_trajectory_apart() {
    // Each shard ends on an episode still open (ids 10..13 and 110..113): merged into
    // one ring, one ran on into the next shard's rows as one trajectory.
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .shards(2)
        .sampler(Slice::slice_len(5).end_key("done"))
        .seed(5)
        .build()
        .unwrap();
    let (w0, w1) = (rb.writer(), rb.writer());
    assert_ne!(w0.shard(), w1.shard());
    w0.extend(&rows(&rb, 0, 13)).unwrap();
    w1.extend(&rows(&rb, 100, 13)).unwrap();
    rb.set_storage(StorageConfig::heap().shards(1)).unwrap();
    for _ in 0..50 {
        check_windows(&rb.sample(40).unwrap());
    }
    // The newest shard's writer goes on with its episode (no break between its rows
    // and what it appends next): 10..15 is a window.
    let w = rb.writer();
    w.extend(&rows(&rb, if w0.shard() == 0 { 13 } else { 113 }, 7))
        .unwrap();
    let mut seen_joined = false;
    for _ in 0..50 {
        let batch = rb.sample(40).unwrap();
        check_windows(&batch);
        seen_joined |= ids(&batch)
            .chunks(5)
            .any(|w| w[0] % 100 == 10 && w[4] % 100 == 14);
    }
    assert!(
        seen_joined,
        "the carried episode and its continuation are one trajectory"
    );
}

#[test]
fn a_split_shards_older_run_ends_its_trajectory() {
    // Splitting one shard in two sends the older rows (0..15, the episode 10..20 cut
    // in the middle) to shard 1: a collector bound to shard 1 then wrote its episode
    // on as the cut one's continuation.
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(Slice::slice_len(5).end_key("done"))
        .seed(5)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 30)).unwrap();
    rb.set_storage(StorageConfig::heap().shards(2)).unwrap();
    let writers: Vec<_> = (0..2).map(|_| rb.writer()).collect();
    for w in &writers {
        w.extend(&rows(&rb, 200 + 100 * w.shard() as u64, 10))
            .unwrap();
    }
    for _ in 0..50 {
        check_windows(&rb.sample(40).unwrap());
    }
}

#[test]
fn a_queue_shrunk_by_a_swap_takes_back_the_inserts_of_the_rows_it_dropped() {
    // The limit went on counting the 24 rows the swap left behind as waiting: no
    // collector was held back again, and each sample of an empty queue waited out a
    // second's grace for them and failed.
    let limit = replaybuf::RateLimit::queue(32)
        .unwrap()
        .insert_timeout(Some(std::time::Duration::from_millis(300)))
        .sample_timeout(Some(std::time::Duration::from_millis(300)));
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(replaybuf::sampler::Fifo)
        .rate_limit(limit)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0, 32)).unwrap();
    rb.set_storage(StorageConfig::heap().capacity(8)).unwrap();
    let s = rb.rate_limit_stats().unwrap();
    assert_eq!(
        s.inserts - s.samples,
        8,
        "the rows kept wait, and no others"
    );
    assert_eq!(ids(&rb.sample(8).unwrap()), (24..32).collect::<Vec<_>>());
    let started = std::time::Instant::now();
    assert!(matches!(
        rb.sample(1).unwrap_err(),
        replaybuf::error::SampleError::RateLimited(_)
    ));
    assert!(started.elapsed() < std::time::Duration::from_millis(900));
    // The queue takes 32 new rows before it holds a collector back.
    rb.extend(&rows(&rb, 100, 8)).unwrap();
    assert_eq!(rb.sample(8).unwrap().len(), 8);
}
