//! The FIFO sampler: every row once, oldest first, across threads, shards, handles of
//! a shared region, checkpoints and the rate limit's queue.

use std::collections::BTreeSet;
use std::time::Duration;

use replaybuf::error::SampleError;
use replaybuf::list::ListBuffer;
use replaybuf::sampler::Fifo;
use replaybuf::swap::StorageConfig;
use replaybuf::typed::TypedBuffer;
use replaybuf::{
    DType, RateLimit, RateLimitError, ReplayBuffer, ReplayBufferBuilder, Spec, WritePolicy,
};

mod common;
use common::shm;

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("check", DType::U64, [2])
        .build()
        .unwrap()
}

fn builder(capacity: usize) -> ReplayBufferBuilder {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .sampler(Fifo)
        .seed(11)
}

fn rows(rb: &ReplayBuffer, ids: impl IntoIterator<Item = u64>) -> replaybuf::Batch {
    let ids: Vec<u64> = ids.into_iter().collect();
    shaped(rb, &[ids.len()], ids)
}

fn shaped(rb: &ReplayBuffer, shape: &[usize], ids: Vec<u64>) -> replaybuf::Batch {
    let mut b = rb.batch(shape);
    let check: Vec<u64> = ids.iter().flat_map(|&i| [!i, i.rotate_left(17)]).collect();
    b.set("id", &ids).unwrap();
    b.set("check", &check).unwrap();
    b
}

/// The ids of `batch`, each checked whole.
fn ids(batch: &replaybuf::Batch) -> Vec<u64> {
    let (ids, check) = (
        batch.column::<u64>("id").unwrap(),
        batch.column::<u64>("check").unwrap(),
    );
    for (k, &i) in ids.iter().enumerate() {
        assert_eq!(
            &check[2 * k..2 * k + 2],
            &[!i, i.rotate_left(17)],
            "row {i} torn"
        );
    }
    ids.to_vec()
}

#[test]
fn rows_come_out_once_oldest_first() {
    let rb = builder(64).build().unwrap();
    assert_eq!(rb.sample(4).unwrap_err(), SampleError::Empty);
    rb.extend(&rows(&rb, 0..10)).unwrap();
    assert_eq!(ids(&rb.sample(4).unwrap()), [0, 1, 2, 3]);
    assert_eq!(ids(&rb.sample(4).unwrap()), [4, 5, 6, 7]);
    let short = rb.sample(4).unwrap();
    assert_eq!(ids(&short), [8, 9], "a short batch when fewer rows wait");
    assert_eq!(short.index(), &[8, 9]);
    assert_eq!(rb.sample(4).unwrap_err(), SampleError::Empty);
    rb.extend(&rows(&rb, 10..12)).unwrap();
    assert_eq!(ids(&rb.sample(4).unwrap()), [10, 11]);
    // Rows taken stay stored: reads by index still see them.
    assert_eq!(rb.len(), 12);
    assert_eq!(ids(&rb.get(3).unwrap()), [3]);
}

#[test]
fn rows_overwritten_before_they_were_taken_are_skipped() {
    let rb = builder(4).build().unwrap();
    rb.extend(&rows(&rb, 0..10)).unwrap();
    assert_eq!(ids(&rb.sample(8).unwrap()), [6, 7, 8, 9]);
    rb.extend(&rows(&rb, 10..11)).unwrap();
    rb.clear().unwrap();
    assert_eq!(rb.sample(1).unwrap_err(), SampleError::Empty);
    rb.extend(&rows(&rb, 11..13)).unwrap();
    assert_eq!(
        ids(&rb.sample(8).unwrap()),
        [11, 12],
        "after clear, the new rows"
    );
}

#[test]
fn each_shard_is_a_queue_and_every_row_comes_out_once() {
    let rb = builder(64).shards(4).build().unwrap();
    for first in (0..40).step_by(5) {
        rb.extend(&rows(&rb, first..first + 5)).unwrap();
    }
    let seen = common::pop_all(&rb, 7, ids);
    // Extends go round robin over the shards: shard k holds chunks k, k + 4. Its rows
    // come out in their order.
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..40).collect::<Vec<_>>());
    for k in 0..4u64 {
        let of_shard: Vec<u64> = seen.iter().copied().filter(|i| i / 5 % 4 == k).collect();
        assert!(of_shard.windows(2).all(|w| w[0] < w[1]), "{of_shard:?}");
    }
}

#[test]
fn an_ndim2_buffer_hands_out_a_step_s_environments_in_order() {
    let rb = builder(16).ndim(2).envs(2).dim_extend(0).build().unwrap();
    // Three steps of two environments, `[t, envs]`.
    rb.extend(&shaped(&rb, &[3, 2], (0..6).collect())).unwrap();
    assert_eq!(ids(&rb.sample(3).unwrap()), [0, 1, 2]);
    assert_eq!(ids(&rb.sample(3).unwrap()), [3, 4, 5]);
}

#[test]
fn learners_on_many_threads_share_one_queue_with_collectors_held_by_its_limit() {
    const QUEUE: u64 = 64;
    const PER_COLLECTOR: u64 = 4000;
    let limit = RateLimit::queue(QUEUE)
        .unwrap()
        .insert_timeout(Some(Duration::from_secs(20)))
        .sample_timeout(Some(Duration::from_secs(20)));
    // Room for the whole queue in the shard: nothing is overwritten before it is taken.
    let rb = builder(2 * QUEUE as usize)
        .rate_limit(limit)
        .build()
        .unwrap();
    let total = 2 * PER_COLLECTOR;
    // Each learner sends its batches here; once every row is in, the limit is closed
    // and the learners waiting on it return.
    let (send, batches) = std::sync::mpsc::channel::<(usize, Vec<u64>)>();
    let got = std::thread::scope(|s| {
        for c in 0..2u64 {
            let rb = &rb;
            s.spawn(move || {
                for first in (0..PER_COLLECTOR).step_by(8) {
                    let ids = (first..first + 8).map(|i| c << 32 | i);
                    rb.extend(&rows(rb, ids)).unwrap();
                }
            });
        }
        for l in 0..3 {
            let (rb, send) = (&rb, send.clone());
            s.spawn(move || loop {
                match rb.sample(5) {
                    Ok(b) => send.send((l, ids(&b))).unwrap(),
                    Err(SampleError::RateLimited(RateLimitError::Closed)) => break,
                    Err(e) => panic!("a rate-limited queue sample failed: {e}"),
                }
            });
        }
        let mut got = vec![Vec::new(); 3];
        let mut taken = 0;
        while taken < total {
            let (l, ids) = batches.recv_timeout(Duration::from_secs(20)).unwrap();
            taken += ids.len() as u64;
            got[l].push(ids);
        }
        rb.close_rate_limit().unwrap();
        got
    });
    let mut all = BTreeSet::new();
    for batches in &got {
        // Within one learner, each collector's rows come out in the order written.
        let mut last = [None::<u64>; 2];
        for id in batches.iter().flatten() {
            let c = (id >> 32) as usize;
            assert!(last[c] < Some(*id), "collector {c}'s rows out of order");
            last[c] = Some(*id);
            assert!(all.insert(*id), "row {id:#x} came out twice");
        }
    }
    assert_eq!(all.len() as u64, total, "every row came out");
    let stats = rb.rate_limit_stats().unwrap();
    assert_eq!(
        stats.samples, total,
        "short batches were given back to the limit"
    );
    assert!(
        stats.insert_waits > 0,
        "the collectors were held by the queue"
    );
}

#[test]
fn a_short_batch_is_counted_as_the_rows_it_took() {
    let rb = builder(16)
        .rate_limit(RateLimit::queue(16).unwrap())
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 0..5)).unwrap();
    assert_eq!(ids(&rb.sample(8).unwrap()), [0, 1, 2, 3, 4]);
    let stats = rb.rate_limit_stats().unwrap();
    assert_eq!((stats.inserts, stats.samples), (5, 5));
}

#[test]
fn handles_of_a_shared_region_take_from_one_queue() {
    let name = shm::name("fifo", "handles");
    let _cleanup = shm::Cleanup(shm::path_of(&name));
    let a = builder(64).shards(2).shared(&name).build().unwrap();
    let b = ReplayBuffer::attach(&name).unwrap();
    a.extend(&rows(&a, 0..6)).unwrap();
    let first = ids(&a.sample(3).unwrap());
    let second = ids(&b.sample(3).unwrap());
    let mut both: Vec<u64> = first.iter().chain(&second).copied().collect();
    both.sort_unstable();
    assert_eq!(both, [0, 1, 2, 3, 4, 5]);
    assert_eq!(b.sample(1).unwrap_err(), SampleError::Empty);
}

#[test]
fn a_checkpoint_keeps_the_queue_s_place() {
    let dir = tempfile::tempdir().unwrap();
    let rb = builder(64).build().unwrap();
    rb.extend(&rows(&rb, 0..10)).unwrap();
    assert_eq!(ids(&rb.sample(3).unwrap()), [0, 1, 2]);
    rb.save(dir.path()).unwrap();
    let back = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
    assert_eq!(ids(&back.sample(3).unwrap()), [3, 4, 5]);
    let mut other = builder(64).build().unwrap();
    other.restore(dir.path()).unwrap();
    assert_eq!(ids(&other.sample(100).unwrap()), [3, 4, 5, 6, 7, 8, 9]);
}

#[test]
fn a_storage_swap_keeps_the_queue_s_place() {
    let rb = builder(64).build().unwrap();
    rb.extend(&rows(&rb, 0..10)).unwrap();
    assert_eq!(ids(&rb.sample(4).unwrap()), [0, 1, 2, 3]);
    // Larger: every row carried, the taken ones still taken.
    rb.set_storage(StorageConfig::heap().capacity(128)).unwrap();
    assert_eq!(rb.len(), 10);
    assert_eq!(ids(&rb.sample(3).unwrap()), [4, 5, 6]);
    // Smaller: the newest four carried (6 of them taken).
    rb.set_storage(StorageConfig::heap().capacity(4)).unwrap();
    assert_eq!(ids(&rb.sample(8).unwrap()), [7, 8, 9]);
    assert_eq!(rb.sample(1).unwrap_err(), SampleError::Empty);
}

#[test]
fn typed_and_list_buffers_take_rows_in_order_too() {
    let typed = TypedBuffer::<[u64; 2]>::builder()
        .capacity(8)
        .sampler(Fifo)
        .build()
        .unwrap();
    typed.extend(&[[1, 1], [2, 2], [3, 3]]).unwrap();
    assert_eq!(typed.sample(2).unwrap().rows(), &[[1, 1], [2, 2]]);
    assert_eq!(typed.sample(2).unwrap().rows(), &[[3, 3]]);
    assert_eq!(typed.sample(2).unwrap_err(), SampleError::Empty);

    let list = ListBuffer::<String>::builder()
        .capacity(8)
        .shards(2)
        .sampler(Fifo)
        .build()
        .unwrap();
    list.extend(["a", "b", "c", "d"].map(String::from)).unwrap();
    let mut out: Vec<String> = list.sample(3).unwrap().into_items();
    out.extend(list.sample(3).unwrap().into_items());
    out.sort();
    assert_eq!(out, ["a", "b", "c", "d"]);
    assert_eq!(list.sample(1).unwrap_err(), SampleError::Empty);
}

#[test]
fn a_max_value_writer_is_refused_beside_a_queue() {
    let e = builder(8)
        .write_policy(WritePolicy::max_value("id"))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
}

#[test]
fn queued_counts_the_rows_not_taken_yet() {
    let rb = builder(8).shards(2).build().unwrap();
    assert_eq!(rb.queued(), Some(0));
    rb.extend(&rows(&rb, 0..3)).unwrap();
    rb.extend(&rows(&rb, 3..6)).unwrap(); // the other shard
    assert_eq!(rb.queued(), Some(6));
    let taken = rb.sample(4).unwrap().len();
    assert_eq!((rb.queued(), rb.len()), (Some(6 - taken), 6));
    while rb.queued() != Some(0) {
        rb.sample(4).unwrap();
    }
    assert_eq!(rb.len(), 6, "taken rows stay until overwritten");
    let uniform = ReplayBuffer::builder(spec()).capacity(8).build().unwrap();
    assert_eq!(uniform.queued(), None);
}
