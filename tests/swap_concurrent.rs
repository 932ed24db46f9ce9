//! Swaps racing collectors and learners: writers bound to shards, a buffer-level
//! collector, learners sampling (and updating priorities) and a prefetching loader
//! keep going while another thread swaps samplers, write policies and storages (heap
//! and file-backed, shards merged and split). Afterwards every row any collector
//! wrote is in the buffer exactly once, whole, and in each shard every collector's
//! rows are in the order it wrote them. Longer: `REPLAYBUF_STRESS_MS=20000`.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use replaybuf::error::{PriorityError, SampleError};
use replaybuf::sampler::{Prioritized, Uniform, WithoutReplacement};
use replaybuf::swap::StorageConfig;
use replaybuf::{Batch, DType, ReplayBuffer, Spec, WritePolicy};

mod common;
use common::mix;

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("check", DType::U64, [])
        .field("obs", DType::F32, [5])
        .build()
        .unwrap()
}

fn rows(rb: &ReplayBuffer, ids: &[u64]) -> Batch {
    shaped(rb, ids, &[ids.len()])
}

/// Rows `ids` in a batch of `shape`.
fn shaped(rb: &ReplayBuffer, ids: &[u64], shape: &[usize]) -> Batch {
    let mut b = rb.batch(shape);
    b.set("id", ids).unwrap();
    b.set("check", &ids.iter().map(|&i| mix(i)).collect::<Vec<_>>())
        .unwrap();
    let obs: Vec<f32> = ids
        .iter()
        .flat_map(|&i| (0..5).map(move |k| (i % 100_000) as f32 + k as f32))
        .collect();
    b.set("obs", &obs).unwrap();
    b
}

/// The ids of `batch`, every row checked whole.
fn whole(batch: &Batch) -> Vec<u64> {
    let id = batch.column::<u64>("id").unwrap();
    let check = batch.column::<u64>("check").unwrap();
    let obs = batch.column::<f32>("obs").unwrap();
    for (k, &i) in id.iter().enumerate() {
        assert_eq!(check[k], mix(i), "a torn row: id {i}, check {}", check[k]);
        for j in 0..5 {
            assert_eq!(
                obs[5 * k + j],
                (i % 100_000) as f32 + j as f32,
                "torn row {i}"
            );
        }
    }
    id.to_vec()
}

/// Collector `c`'s `n`-th row.
fn id(c: u64, n: u64) -> u64 {
    (c << 40) | n
}

/// One swap of the cycle, given the buffer and the swap's number.
type Swap = Box<dyn Fn(&ReplayBuffer, usize)>;

/// Rows each collector writes at most: all of them fit in every storage swapped in.
const MAX_ROWS: u64 = 20_000;
const CAPACITY: usize = 1 << 17;

#[test]
fn no_row_is_lost_or_torn_when_swaps_race_collectors_and_learners() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(CAPACITY)
        .shards(2)
        .seed(11)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let dir = tempfile::tempdir().unwrap();
    let written: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    let mut threads = Vec::new();
    // Collectors 0 and 1 hold writer handles (shards 0 and 1); collector 2 extends
    // through the buffer (round robin over the shards), sometimes one row at a time.
    let pace = common::race_duration("REPLAYBUF_STRESS_MS") / 1200;
    for c in 0..3u64 {
        let (rb, stop, count) = (rb.clone(), stop.clone(), written[c as usize].clone());
        let writer = (c < 2).then(|| rb.writer());
        threads.push(std::thread::spawn(move || {
            let mut n = 0u64;
            let mut chunk = 1u64;
            while !stop.load(Ordering::Relaxed) && n < MAX_ROWS {
                chunk = (chunk * 7 + c + 3) % 37 + 1;
                let len = chunk.min(MAX_ROWS - n);
                let ids: Vec<u64> = (n..n + len).map(|k| id(c, k)).collect();
                let batch = rows(&rb, &ids);
                match (&writer, len) {
                    (Some(w), _) => {
                        w.extend(&batch).unwrap();
                    }
                    (None, 1) => {
                        rb.add(&batch).unwrap();
                    }
                    (None, _) => {
                        rb.extend(&batch).unwrap();
                    }
                }
                n += len;
                count.store(n as usize, Ordering::Release);
                // Paced so that the writes span most of the swaps.
                std::thread::sleep(pace);
            }
        }));
    }
    // Learners: a learner handle that updates priorities when it can, and a
    // prefetching loader.
    {
        let (rb, stop) = (rb.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut learner = rb.learner();
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match learner.sample(64) {
                    Ok(batch) => {
                        whole(&batch);
                        if batch.weight().is_some() {
                            k += 1;
                            let p: Vec<f64> = (0..batch.len())
                                .map(|j| (j as u64 + k) as f64 % 5.0)
                                .collect();
                            // Rows replaced by a swap meanwhile count as stale; a
                            // swap to a sampler without priorities refuses updates.
                            match rb.update_priority(batch.index(), batch.generations(), &p) {
                                Ok(_) | Err(PriorityError::NotPrioritized) => {}
                                Err(e) => panic!("update: {e}"),
                            }
                        }
                    }
                    Err(
                        SampleError::EpochEnd | SampleError::NotEnough { .. } | SampleError::Empty,
                    ) => {}
                    Err(e) => panic!("sample: {e}"),
                }
            }
        }));
    }
    {
        let (rb, stop) = (rb.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut loader = rb.loader().batch_size(32).prefetch(2).build().unwrap();
            while !stop.load(Ordering::Relaxed) {
                match loader.sample() {
                    Ok(batch) => {
                        whole(&batch);
                    }
                    Err(
                        SampleError::EpochEnd | SampleError::NotEnough { .. } | SampleError::Empty,
                    ) => {}
                    Err(e) => panic!("loader: {e}"),
                }
            }
        }));
    }
    // The swapper: a cycle of every kind of swap, for the test's duration.
    // Shards stay at 2 or more, so that each writer handle's shard stays its own.
    let swaps: Vec<Swap> = vec![
        Box::new(|rb, _| rb.set_sampler(WithoutReplacement::new()).unwrap()),
        Box::new(|rb, _| rb.set_sampler(Prioritized::new(0.6, 0.4)).unwrap()),
        Box::new(|rb, _| rb.set_storage(StorageConfig::heap().shards(4)).unwrap()),
        Box::new(|rb, _| rb.set_sampler(Prioritized::new(0.8, 0.5)).unwrap()),
        Box::new(|rb, _| {
            let bigger = StorageConfig::heap().shards(8).capacity(2 * CAPACITY);
            rb.set_storage(bigger).unwrap()
        }),
        Box::new(|rb, _| rb.set_sampler(Uniform).unwrap()),
        Box::new(|rb, _| rb.set_write_policy(WritePolicy::RoundRobin).unwrap()),
        Box::new(move |rb, i| {
            let at = dir.path().join(format!("swap-{i}"));
            let on_disk = StorageConfig::memmap(at).shards(2).capacity(CAPACITY);
            rb.set_storage(on_disk).unwrap()
        }),
        Box::new(|rb, _| rb.set_storage(StorageConfig::heap().shards(4)).unwrap()),
        Box::new(|rb, _| rb.set_storage(StorageConfig::heap().shards(2)).unwrap()),
    ];
    let start = Instant::now();
    let mut done = 0;
    while done < 2 * swaps.len() || start.elapsed() < common::race_duration("REPLAYBUF_STRESS_MS") {
        swaps[done % swaps.len()](&rb, done);
        done += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }

    // Every row written, exactly once, whole.
    let all = rb.read_all_in_order(None);
    let ids = whole(&all);
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for &i in &ids {
        *seen.entry(i).or_default() += 1;
    }
    let mut total = 0;
    for (c, count) in written.iter().enumerate() {
        let n = count.load(Ordering::Acquire) as u64;
        assert!(n > 0, "collector {c} wrote nothing");
        for k in 0..n {
            assert_eq!(
                seen.get(&id(c as u64, k)).copied().unwrap_or(0),
                1,
                "collector {c}'s row {k} of {n} after {done} swaps"
            );
        }
        total += n as usize;
    }
    assert_eq!(ids.len(), total, "rows nobody wrote");
    assert_eq!(rb.len(), total);
    // Within each shard, each writer handle's rows in the order it wrote them (no
    // shard has wrapped since its storage was made, so storage order is FIFO order).
    // The buffer-level collector's rows go to every shard in turn: shards merged
    // keep their own orders, not the order across them.
    let per_shard = rb.capacity() / rb.shards();
    let mut last: HashMap<(usize, u64), u64> = HashMap::new();
    for (&index, &i) in all.index().iter().zip(&ids).filter(|(_, &i)| i >> 40 < 2) {
        let key = (index as usize / per_shard, i >> 40);
        if let Some(&prev) = last.get(&key) {
            assert!(i > prev, "shard {} holds row {i:#x} after {prev:#x}", key.0);
        }
        last.insert(key, i);
    }
    eprintln!("{done} swaps, {total} rows");
}

#[test]
fn max_value_placements_and_ndim2_columns_survive_racing_swaps() {
    // A max-value buffer with room for everything: every row is placed, whichever
    // policy and storage it meets.
    let rb = ReplayBuffer::builder(spec())
        .capacity(1 << 14)
        .shards(2)
        .write_policy(WritePolicy::max_value("check"))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let collectors: Vec<_> = (0..2u64)
        .map(|c| {
            let (rb, stop) = (rb.clone(), stop.clone());
            std::thread::spawn(move || {
                let w = rb.writer();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) && n < 3000 {
                    let ids: Vec<u64> = (n..n + 10).map(|k| id(c, k)).collect();
                    let written = w.extend(&rows(&rb, &ids)).unwrap();
                    assert_eq!(written.accepted(), 10);
                    n += 10;
                    std::thread::sleep(Duration::from_micros(200));
                }
                n
            })
        })
        .collect();
    let start = Instant::now();
    let mut k = 0;
    while start.elapsed() < common::race_duration("REPLAYBUF_STRESS_MS") / 2 {
        match k % 4 {
            0 => rb.set_write_policy(WritePolicy::RoundRobin).unwrap(),
            1 => rb.set_storage(StorageConfig::heap().shards(4)).unwrap(),
            2 => rb
                .set_write_policy(WritePolicy::max_value("check"))
                .unwrap(),
            _ => rb.set_storage(StorageConfig::heap().shards(2)).unwrap(),
        }
        k += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let counts: Vec<u64> = collectors.into_iter().map(|t| t.join().unwrap()).collect();
    let ids = whole(&rb.read_all_in_order(None));
    let mut seen: HashMap<u64, usize> = HashMap::new();
    for &i in &ids {
        *seen.entry(i).or_default() += 1;
    }
    for (c, &n) in counts.iter().enumerate() {
        for r in 0..n {
            assert_eq!(
                seen.get(&id(c as u64, r)),
                Some(&1),
                "row {r} of {c} ({k} swaps)"
            );
        }
    }
    assert_eq!(ids.len() as u64, counts.iter().sum::<u64>());

    // ndim 2: two collectors, each owning two environments' columns, racing storage
    // swaps of the same environments: every column keeps its steps in time order.
    let rb = ReplayBuffer::builder(spec())
        .capacity(4 * 8192)
        .ndim(2)
        .envs(4)
        .dim_extend(0)
        .shards(2)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let collectors: Vec<_> = (0..2)
        .map(|_| {
            let (rb, stop) = (rb.clone(), stop.clone());
            std::thread::spawn(move || {
                let w = rb.writer();
                let mut t = 0;
                while !stop.load(Ordering::Relaxed) && t < 2000 {
                    let envs = w.envs().unwrap();
                    // Steps t..t + 5 of this writer's two environments, time-major.
                    let ids: Vec<u64> = (t..t + 5)
                        .flat_map(|s| envs.clone().map(move |e| id(e as u64, s)))
                        .collect();
                    w.extend(&shaped(&rb, &ids, &[5, 2])).unwrap();
                    t += 5;
                    std::thread::sleep(Duration::from_micros(200));
                }
                // The environments this writer owned, and its steps of each: which
                // collector got which depends on which asked for its handle first.
                (w.envs().unwrap(), t)
            })
        })
        .collect();
    let start = Instant::now();
    let mut k = 0;
    while start.elapsed() < common::race_duration("REPLAYBUF_STRESS_MS") / 2 {
        let capacity = if k % 2 == 0 { 4 * 16384 } else { 4 * 8192 };
        rb.set_storage(StorageConfig::heap().capacity(capacity))
            .unwrap();
        if k % 3 == 0 {
            rb.set_sampler(WithoutReplacement::new()).unwrap();
        }
        k += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    stop.store(true, Ordering::Relaxed);
    let mut steps = [0u64; 4];
    for collector in collectors {
        let (envs, t) = collector.join().unwrap();
        for e in envs {
            steps[e] = t;
        }
    }
    let all = rb.read_all_in_order(None);
    let ids = whole(&all);
    // Index `step * 4 + env`: each environment's column, in storage order.
    let mut columns = vec![Vec::new(); 4];
    for (&index, &i) in all.index().iter().zip(&ids) {
        assert_eq!(
            i >> 40,
            index % 4,
            "row {i:#x} in another environment's column"
        );
        columns[(index % 4) as usize].push(i & ((1 << 40) - 1));
    }
    for (e, col) in columns.iter().enumerate() {
        let want: Vec<u64> = (0..steps[e]).collect();
        assert_eq!(col, &want, "environment {e}'s column after {k} swaps");
    }
}

#[test]
fn dumps_racing_swaps_save_whole_buffers() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(1 << 10)
        .shards(2)
        .seed(3)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, &(0..500).collect::<Vec<_>>()))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Two dumpers freeze whatever state they loaded while swaps replace it, in place
    // (the same region under a new state) or by copy.
    let dumpers: Vec<_> = (0..2)
        .map(|d| {
            let (rb, stop) = (rb.clone(), stop.clone());
            let at = dir.path().join(format!("ckpt-{d}"));
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) || n == 0 {
                    rb.save(&at).unwrap();
                    let loaded = ReplayBuffer::from_checkpoint(&at).unwrap();
                    let mut ids = whole(&loaded.read_all_in_order(None));
                    ids.sort_unstable();
                    assert_eq!(ids, (0..500).collect::<Vec<_>>());
                    n += 1;
                }
            })
        })
        .collect();
    let start = Instant::now();
    let mut k = 0;
    while start.elapsed() < common::race_duration("REPLAYBUF_STRESS_MS") / 3 {
        match k % 3 {
            0 => rb.set_sampler(WithoutReplacement::new()).unwrap(),
            1 => rb.set_sampler(Uniform).unwrap(),
            _ => rb
                .set_storage(StorageConfig::heap().shards(1 << (k % 2)))
                .unwrap(),
        }
        k += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for d in dumpers {
        d.join().unwrap();
    }
}
