//! Slice sampling: every window is consecutive steps of one trajectory, across
//! wrap-around, on ndim-2 storage and while collectors write; the distribution and the
//! marks; bad input; epochs without replacement.
// The loom facade rule (atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types)]

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use replaybuf::error::{AccessError, SampleError};
use replaybuf::sampler::{Slice, WithoutReplacement};
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

/// `traj` (id), `step` (within the trajectory), `done`, and `check`, a value derived
/// from both so that a row mixed from two writes shows.
fn spec() -> Spec {
    Spec::builder()
        .field("traj", DType::I64, [])
        .field("step", DType::I64, [])
        .field("done", DType::Bool, [])
        .field("check", DType::F64, [2])
        .build()
        .unwrap()
}

fn check_of(traj: i64, step: i64) -> [f64; 2] {
    [traj as f64 * 1000.0 + step as f64, -(traj as f64)]
}

/// Rows `(traj, step, done)` as a batch of shape `[n]`.
fn rows(rb: &ReplayBuffer, rows: &[(i64, i64, bool)]) -> Batch {
    shaped(rb, rows, &[rows.len()])
}

/// Rows `(traj, step, done)` as a batch of shape `shape`, row-major.
fn shaped(rb: &ReplayBuffer, rows: &[(i64, i64, bool)], shape: &[usize]) -> Batch {
    let mut b = rb.batch(shape);
    let traj: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let step: Vec<i64> = rows.iter().map(|r| r.1).collect();
    let done: Vec<bool> = rows.iter().map(|r| r.2).collect();
    let check: Vec<f64> = rows.iter().flat_map(|r| check_of(r.0, r.1)).collect();
    b.set("traj", &traj).unwrap();
    b.set("step", &step).unwrap();
    b.set("done", &done).unwrap();
    b.set("check", &check).unwrap();
    b
}

/// A trajectory `id` of `len` steps, done at its last.
fn trajectory(id: i64, len: i64) -> Vec<(i64, i64, bool)> {
    (0..len).map(|t| (id, t, t == len - 1)).collect()
}

/// Checks every slice of `batch` (`[slices, len]`): valid rows first, then padding;
/// valid rows whole and consecutive steps of one trajectory; marks consistent with the
/// steps (`ends`: the trajectories whose end the buffer knows, and their lengths).
/// Returns each slice's (traj, first step, rows).
fn check_slices(batch: &Batch, ends: &BTreeMap<i64, i64>) -> Vec<(i64, i64, usize)> {
    let [slices, len] = batch.shape() else {
        panic!("a slice batch is 2-dim, got {:?}", batch.shape())
    };
    let (traj, step) = (
        batch.column::<i64>("traj").unwrap(),
        batch.column::<i64>("step").unwrap(),
    );
    let check = batch.column::<f64>("check").unwrap();
    let marks = batch.marks().expect("slice batches carry marks");
    let mut out = Vec::new();
    for s in 0..*slices {
        let r = s * len..(s + 1) * len;
        let valid = marks[r.clone()].iter().take_while(|m| m.is_valid()).count();
        assert!(valid >= 1, "slice {s} is empty");
        assert!(marks[r.start + valid..r.end].iter().all(|m| !m.is_valid()));
        let (t0, s0) = (traj[r.start], step[r.start]);
        for i in 0..valid {
            let k = r.start + i;
            assert_eq!(traj[k], t0, "slice {s} crosses a trajectory boundary");
            assert_eq!(step[k], s0 + i as i64, "slice {s} is not consecutive");
            assert_eq!(&check[2 * k..2 * k + 2], &check_of(t0, step[k]), "torn row");
            let m = marks[k];
            assert_eq!(m.is_start(), step[k] == 0, "start mark of row {k}");
            if let Some(&l) = ends.get(&t0) {
                assert_eq!(m.is_end(), step[k] == l - 1, "end mark of row {k}");
            }
            let last = i == valid - 1;
            assert_eq!(
                m.is_truncated(),
                last && !m.is_end(),
                "truncated mark of row {k}"
            );
        }
        let padding = r.start + valid..r.end;
        assert!(
            traj[padding.clone()].iter().all(|&t| t == 0),
            "padding is zeroed"
        );
        assert!(batch.index()[padding].iter().all(|&i| i == u64::MAX));
        out.push((t0, s0, valid));
    }
    out
}

fn buffer(capacity: usize, slice: Slice) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .sampler(slice)
        .seed(11)
        .build()
        .unwrap()
}

#[test]
fn windows_stay_in_one_trajectory_across_wrap() {
    for (slice, by_id) in [
        (Slice::slice_len(8).traj_key("traj"), true),
        (Slice::slice_len(8).end_key("done"), false),
    ] {
        let rb = buffer(1000, slice);
        let mut lens = BTreeMap::new();
        // Lengths 5..40 (some shorter than a slice); wraps the ring several times.
        for id in 1..200 {
            let len = 5 + (id * 7) % 36;
            lens.insert(id, len);
            rb.extend(&rows(&rb, &trajectory(id, len))).unwrap();
        }
        // By id, the last trajectory is still open: its end is not known.
        let mut ends = lens.clone();
        if by_id {
            ends.remove(&199);
        }
        for _ in 0..50 {
            let batch = rb.sample(64).unwrap();
            for (traj, first, valid) in check_slices(&batch, &ends) {
                assert_eq!(valid, 8, "strict slices are whole");
                assert!(
                    lens[&traj] >= 8,
                    "a trajectory shorter than a slice was drawn"
                );
                assert!(first + 8 <= lens[&traj]);
            }
            // Indices are consecutive ring positions.
            for w in batch.index().chunks(8) {
                for p in w.windows(2) {
                    assert_eq!(p[1], (p[0] + 1) % 1000);
                }
            }
        }
    }
}

#[test]
fn an_id_change_ends_a_trajectory_without_a_done_flag() {
    let rb = buffer(100, Slice::num_slices(4).traj_key("traj"));
    let mut data = Vec::new();
    for id in 1..=5 {
        data.extend((0..10).map(|t| (id, t, false)));
    }
    rb.extend(&rows(&rb, &data)).unwrap();
    let lens: BTreeMap<i64, i64> = (1..=4).map(|id| (id, 10)).collect();
    let mut seen = BTreeSet::new();
    for _ in 0..200 {
        let batch = rb.sample(4 * 10).unwrap();
        for (traj, first, valid) in check_slices(&batch, &lens) {
            assert_eq!((first, valid), (0, 10));
            seen.insert(traj);
        }
    }
    // Trajectory 5 is still open: a whole slice of it ends in truncation, not an end.
    assert_eq!(seen, (1..=5).collect());
}

#[test]
fn strict_length_errors_when_no_trajectory_is_long_enough() {
    // With replacement and without (an epoch of no window said "empty").
    for slice in [
        Slice::slice_len(16).end_key("done"),
        Slice::slice_len(16)
            .end_key("done")
            .without_replacement(WithoutReplacement::new()),
    ] {
        let rb = buffer(100, slice);
        assert_eq!(rb.sample(32).unwrap_err(), SampleError::Empty);
        rb.extend(&rows(&rb, &trajectory(1, 5))).unwrap();
        rb.extend(&rows(&rb, &trajectory(2, 9))).unwrap();
        assert_eq!(
            rb.sample(32).unwrap_err(),
            SampleError::TrajectoriesTooShort {
                slice_len: 16,
                longest: 9
            }
        );
    }
    let rb = buffer(100, Slice::slice_len(16).end_key("done"));
    assert_eq!(
        rb.sample(20).unwrap_err(),
        SampleError::SliceBatchSize {
            batch: 20,
            divisor: 16
        }
    );
}

#[test]
fn short_trajectories_give_padded_slices_without_strict_length() {
    let rb = buffer(
        100,
        Slice::slice_len(16).end_key("done").strict_length(false),
    );
    rb.extend(&rows(&rb, &trajectory(1, 5))).unwrap();
    rb.extend(&rows(&rb, &trajectory(2, 9))).unwrap();
    let lens = BTreeMap::from([(1, 5), (2, 9)]);
    let mut counts = BTreeMap::new();
    for _ in 0..500 {
        let batch = rb.sample(32).unwrap();
        for (traj, first, valid) in check_slices(&batch, &lens) {
            assert_eq!((first, valid as i64), (0, lens[&traj]));
            *counts.entry(traj).or_insert(0) += 1;
        }
    }
    // Trajectories are drawn uniformly, not by length: about 500 each.
    assert!(
        counts.values().all(|&c| (400..600).contains(&c)),
        "{counts:?}"
    );
}

#[test]
fn span_lets_slices_hang_over_both_ends() {
    let rb = buffer(
        100,
        Slice::slice_len(4)
            .end_key("done")
            .strict_length(false)
            .span(usize::MAX, usize::MAX),
    );
    rb.extend(&rows(&rb, &trajectory(1, 10))).unwrap();
    let lens = BTreeMap::from([(1, 10)]);
    let mut firsts = BTreeSet::new();
    let mut lengths = BTreeSet::new();
    for _ in 0..300 {
        let batch = rb.sample(8).unwrap();
        for (_, first, valid) in check_slices(&batch, &lens) {
            firsts.insert(first);
            lengths.insert(valid);
        }
    }
    // Windows start anywhere from 3 steps before the trajectory to its last step.
    assert_eq!(firsts, (0..10).collect());
    assert_eq!(lengths, (1..=4).collect());
}

#[test]
fn ndim2_columns_are_trajectories_of_their_own() {
    let envs = 4;
    let rb = ReplayBuffer::builder(spec())
        .capacity(64 * envs)
        .ndim(2)
        .envs(envs)
        .dim_extend(0)
        .shards(2)
        .sampler(Slice::slice_len(6).end_key("done"))
        .seed(3)
        .build()
        .unwrap();
    let writers = [rb.writer(), rb.writer()];
    // Environment e runs trajectories of length 7 + e; ids are unique per environment.
    let mut lens = BTreeMap::new();
    let mut t = [0i64; 4];
    let mut id = [0i64; 4];
    for _ in 0..100 {
        for (w, group) in writers.iter().zip([0..2, 2..4]) {
            let mut data = Vec::new();
            for _step in 0..3 {
                for e in group.clone() {
                    let len = 7 + e as i64;
                    let traj = (e as i64) * 100_000 + id[e] + 1;
                    lens.insert(traj, len);
                    data.push((traj, t[e], t[e] == len - 1));
                    t[e] += 1;
                    if t[e] == len {
                        t[e] = 0;
                        id[e] += 1;
                    }
                }
            }
            w.extend(&shaped(&rb, &data, &[3, 2])).unwrap();
        }
    }
    for _ in 0..50 {
        let batch = rb.sample(60).unwrap();
        for (traj, _, valid) in check_slices(&batch, &lens) {
            assert_eq!(valid, 6);
            assert!(traj / 100_000 < 4);
        }
        // Every slice's rows are one environment's column: index % envs is constant.
        for w in batch.index().chunks(6) {
            assert!(w.iter().all(|&i| i % envs as u64 == w[0] % envs as u64));
        }
    }
}

#[test]
fn bad_keys_and_batch_sizes_are_refused_at_build() {
    let build = |slice: Slice| {
        ReplayBuffer::builder(spec())
            .capacity(100)
            .sampler(slice)
            .batch_size(32)
            .build()
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let e = build(Slice::slice_len(8)).unwrap_err();
    assert!(
        e.contains("next.done") && e.contains("no such field"),
        "{e}"
    );
    let e = build(Slice::slice_len(8).traj_key("check")).unwrap_err();
    assert!(e.contains("one value per row"), "{e}");
    let e = build(Slice::slice_len(8).traj_key("missing")).unwrap_err();
    assert!(e.contains("missing"), "{e}");
    let e = build(Slice::slice_len(5).end_key("done")).unwrap_err();
    assert!(e.contains("not a multiple"), "{e}");
    let e = build(Slice::num_slices(0).end_key("done")).unwrap_err();
    assert!(e.contains("at least 1"), "{e}");
    assert!(build(Slice::num_slices(4).end_key("done")).is_ok());
}

/// The reference: every window a strict slice sampler may return, found by scanning
/// the whole storage in ring order.
fn reference_windows(rb: &ReplayBuffer, len: usize) -> BTreeSet<(i64, i64)> {
    let all = rb.read_all_in_order(None);
    let (traj, step) = (
        all.column::<i64>("traj").unwrap().to_vec(),
        all.column::<i64>("step").unwrap().to_vec(),
    );
    // Storage order starting at the oldest row (the write point).
    let cap = rb.capacity();
    let n = traj.len();
    let start = if n < cap {
        0
    } else {
        (rb.write_count() as usize) % cap
    };
    let order: Vec<usize> = (0..n).map(|i| (start + i) % n).collect();
    let mut runs: Vec<Vec<(i64, i64)>> = Vec::new();
    for &i in &order {
        match runs.last_mut() {
            Some(run) if run.last().unwrap().0 == traj[i] => run.push((traj[i], step[i])),
            _ => runs.push(vec![(traj[i], step[i])]),
        }
    }
    runs.iter()
        .filter(|r| r.len() >= len)
        .flat_map(|r| r.windows(len).map(|w| w[0]))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Against the reference scan: every sampled window is one the reference allows,
    /// and sampling fails exactly when the reference has none.
    #[test]
    fn matches_a_reference_that_scans_the_storage(
        lens in proptest::collection::vec(1i64..30, 1..40),
        capacity in 20usize..120,
        len in 1usize..12,
    ) {
        let rb = buffer(capacity, Slice::slice_len(len).traj_key("traj"));
        for (id, &l) in lens.iter().enumerate() {
            // Trajectories arrive in pieces of up to 7 steps.
            let t = trajectory(id as i64 + 1, l);
            for piece in t.chunks(7) {
                rb.extend(&rows(&rb, piece)).unwrap();
            }
        }
        let allowed = reference_windows(&rb, len);
        match rb.sample(len * 4) {
            Ok(batch) => {
                prop_assert!(!allowed.is_empty());
                let traj = batch.column::<i64>("traj").unwrap();
                let step = batch.column::<i64>("step").unwrap();
                for s in 0..4 {
                    prop_assert!(allowed.contains(&(traj[s * len], step[s * len])),
                        "window {:?} not allowed", (traj[s * len], step[s * len]));
                }
            }
            Err(SampleError::TrajectoriesTooShort { .. }) => prop_assert!(allowed.is_empty()),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}

/// A sampled slice: its trajectory, first step, and rows.
type SliceSeen = (i64, i64, usize);

/// Every window an epoch hands out, as (traj, first step, rows), sampling `n` rows at
/// a time until the epoch ends; also the batch shapes seen.
fn drain_epoch(rb: &ReplayBuffer, n: usize) -> (Vec<SliceSeen>, Vec<Vec<usize>>) {
    let (mut windows, mut shapes) = (Vec::new(), Vec::new());
    loop {
        match rb.sample(n) {
            Ok(batch) => {
                shapes.push(batch.shape().to_vec());
                windows.extend(check_slices(&batch, &BTreeMap::new()));
            }
            Err(SampleError::EpochEnd) => return (windows, shapes),
            Err(e) => panic!("unexpected {e}"),
        }
    }
}

/// Trajectories 1..=5 of lengths 10, 7, 4, 12, 3 in one ring.
fn epoch_buffer(slice: Slice) -> (ReplayBuffer, BTreeMap<i64, i64>) {
    let rb = buffer(100, slice);
    let lens = BTreeMap::from([(1, 10), (2, 7), (3, 4), (4, 12), (5, 3)]);
    for (&id, &len) in &lens {
        rb.extend(&rows(&rb, &trajectory(id, len))).unwrap();
    }
    (rb, lens)
}

/// The windows of 4 steps an epoch must cover: every trajectory cut from its start.
fn expected_windows(lens: &BTreeMap<i64, i64>, strict: bool) -> BTreeSet<(i64, i64, usize)> {
    let mut out = BTreeSet::new();
    for (&id, &len) in lens {
        let mut from = 0;
        while from < len && (!strict || len - from >= 4) {
            out.insert((id, from, (len - from).min(4) as usize));
            from += 4;
        }
    }
    out
}

#[test]
fn without_replacement_visits_every_window_once_per_epoch() {
    use replaybuf::sampler::WithoutReplacement;
    for strict in [true, false] {
        let epochs = WithoutReplacement::new();
        let slice = Slice::slice_len(4)
            .end_key("done")
            .strict_length(strict)
            .without_replacement(epochs);
        let (rb, lens) = epoch_buffer(slice);
        let want = expected_windows(&lens, strict);
        for _epoch in 0..3 {
            let (got, shapes) = drain_epoch(&rb, 8);
            let set: BTreeSet<_> = got.iter().copied().collect();
            assert_eq!(set.len(), got.len(), "a window came twice in one epoch");
            assert_eq!(set, want, "strict {strict}");
            // Two windows a batch; the last batch is short when the count is odd.
            let full = want.len() / 2;
            assert!(shapes[..full].iter().all(|s| s == &[2, 4]));
            if want.len() % 2 == 1 {
                assert_eq!(shapes.last().unwrap(), &[1, 4]);
            }
        }
    }
}

#[test]
fn without_replacement_drop_last_and_storage_order() {
    use replaybuf::sampler::WithoutReplacement;
    let epochs = WithoutReplacement::new().drop_last(true).shuffle(false);
    let slice = Slice::slice_len(4)
        .end_key("done")
        .without_replacement(epochs);
    let (rb, lens) = epoch_buffer(slice);
    let want = expected_windows(&lens, true); // 2 + 1 + 1 + 3 = 7 windows
    assert_eq!(want.len(), 7);
    let (got, shapes) = drain_epoch(&rb, 8);
    // Three full batches; the seventh window is dropped with the short batch.
    assert_eq!(shapes, vec![vec![2, 4]; 3]);
    // Unshuffled: trajectory by trajectory, in the order they were written.
    let ordered: Vec<_> = want.iter().copied().collect();
    assert_eq!(got, ordered[..6]);
    // Emptying ends the epoch; an empty buffer has none to start.
    rb.clear().unwrap();
    assert_eq!(rb.sample(8).unwrap_err(), SampleError::Empty);
}

#[test]
fn an_epoch_whose_windows_were_all_overwritten_ends_once() {
    use replaybuf::sampler::WithoutReplacement;
    let slice = Slice::slice_len(4)
        .end_key("done")
        .without_replacement(WithoutReplacement::new().shuffle(false));
    let (rb, _) = epoch_buffer(slice);
    // Open an epoch and take its first window, then overwrite every row it listed.
    rb.sample(4).unwrap();
    for id in 10..20 {
        rb.extend(&rows(&rb, &trajectory(id, 10))).unwrap();
    }
    // Every window left in the epoch is stale: this sample ends the epoch...
    assert_eq!(rb.sample(4).unwrap_err(), SampleError::EpochEnd);
    // ...and the next starts a new one over the new trajectories, not the old one again.
    let batch = rb.sample(4).expect("a new epoch over the new rows");
    let windows = check_slices(&batch, &BTreeMap::new());
    assert!(
        windows.iter().all(|&(traj, _, _)| traj >= 10),
        "{windows:?}"
    );
}

#[test]
fn learners_share_one_epoch_of_windows() {
    use replaybuf::sampler::WithoutReplacement;
    use std::sync::atomic::Ordering::SeqCst;
    let slice = Slice::slice_len(4)
        .end_key("done")
        .without_replacement(WithoutReplacement::new());
    let rb = buffer(4000, slice);
    let mut lens = BTreeMap::new();
    for id in 1..300 {
        let len = 4 + id % 13;
        lens.insert(id, len);
        rb.extend(&rows(&rb, &trajectory(id, len))).unwrap();
    }
    let want = expected_windows(&lens, true);
    // Exactly the calls one epoch serves (3 windows each, the last short): a call
    // past it would start the next epoch.
    let calls = std::sync::atomic::AtomicUsize::new(want.len().div_ceil(3));
    let got: Vec<(i64, i64, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (mut learner, calls) = (rb.learner(), &calls);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    let turn = || {
                        calls
                            .fetch_update(SeqCst, SeqCst, |c| c.checked_sub(1))
                            .is_ok()
                    };
                    while turn() {
                        let b = learner.sample(12).expect("the epoch has windows left");
                        mine.extend(check_slices(&b, &BTreeMap::new()));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let set: BTreeSet<_> = got.iter().copied().collect();
    assert_eq!(set.len(), got.len(), "two learners got the same window");
    assert_eq!(set, want);
}

/// A prioritized slice buffer holding trajectories 1..=3 of 12 steps, with row `i`'s
/// priority `prio(i)`; alpha 1 and beta 1, so masses are priorities.
fn prioritized_buffer(
    over: replaybuf::sampler::SlicePriority,
    prio: impl Fn(u64) -> f64,
) -> ReplayBuffer {
    use replaybuf::sampler::Prioritized;
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(
            Slice::slice_len(4)
                .end_key("done")
                .prioritized(Prioritized::new(1.0, 1.0).eps(0.0), over),
        )
        .seed(5)
        .build()
        .unwrap();
    for id in 1..=3 {
        rb.extend(&rows(&rb, &trajectory(id, 12))).unwrap();
    }
    let all = rb.read_all_in_order(None);
    let priorities: Vec<f64> = all.index().iter().map(|&i| prio(i)).collect();
    let done = rb
        .update_priority(all.index(), all.generations(), &priorities)
        .unwrap();
    assert_eq!(done.applied, 36);
    rb
}

#[test]
fn prioritized_slices_start_in_proportion_to_priority() {
    // Row i (trajectory i / 12 + 1, step i % 12) has priority 1 + i % 5.
    let prio = |i: u64| 1.0 + (i % 5) as f64;
    let rb = prioritized_buffer(replaybuf::sampler::SlicePriority::Start, prio);
    // Valid starts: steps 0..=8 of each trajectory; P(start i) = p_i / sum.
    let starts: Vec<u64> = (0..3u64)
        .flat_map(|t| (0..9).map(move |s| t * 12 + s))
        .collect();
    let total: f64 = starts.iter().map(|&i| prio(i)).sum();
    let mut counts = BTreeMap::new();
    let draws = 20_000;
    for _ in 0..draws / 4 {
        let batch = rb.sample(16).unwrap();
        check_slices(&batch, &BTreeMap::new());
        let weight = batch.weight().expect("prioritized slices are weighted");
        for (s, w) in batch.index().chunks(4).enumerate() {
            *counts.entry(w[0]).or_insert(0u32) += 1;
            // Every row carries the slice's weight: (min / p_start)^beta, min = 1.
            let want = (1.0 / prio(w[0])) as f32;
            assert!(weight[s * 4..s * 4 + 4]
                .iter()
                .all(|&x| (x - want).abs() < 1e-5));
        }
    }
    assert!(
        counts.keys().all(|i| starts.contains(i)),
        "a slice started too late"
    );
    // Chi-square over the 27 valid starts (26 degrees of freedom; 1e-3 critical
    // value 54.05), with a fixed seed.
    let chi2: f64 = starts
        .iter()
        .map(|&i| {
            let expected = draws as f64 * prio(i) / total;
            let seen = f64::from(*counts.get(&i).unwrap_or(&0));
            (seen - expected).powi(2) / expected
        })
        .sum();
    assert!(chi2 < 54.05, "chi-square {chi2}");
}

#[test]
fn prioritized_windows_hold_the_heavy_row() {
    // One row, step 6 of trajectory 2 (index 18), outweighs the rest 1000 to 1.
    let rb = prioritized_buffer(replaybuf::sampler::SlicePriority::Window, |i| {
        if i == 18 {
            1000.0
        } else {
            1e-3
        }
    });
    let batch = rb.sample(400).unwrap();
    check_slices(&batch, &BTreeMap::new());
    let holding = batch.index().chunks(4).filter(|w| w.contains(&18)).count();
    assert!(
        holding >= 95,
        "only {holding} of 100 windows hold the heavy row"
    );
    // The windows holding it start anywhere from step 3 to step 6.
    let firsts: BTreeSet<u64> = batch
        .index()
        .chunks(4)
        .filter(|w| w.contains(&18))
        .map(|w| w[0])
        .collect();
    assert_eq!(firsts, (15..=18).collect());
}

/// A row whose truncation flag is set ends its trajectory, and its marks say so (end
/// and truncated) at once: not only once a later row of its lane is written. Slices
/// never run past it.
#[test]
fn a_truncated_row_ends_its_trajectory_in_the_marks_before_and_after_later_rows() {
    let spec = Spec::builder()
        .field("step", DType::I64, [])
        .field("done", DType::Bool, [])
        .field("trunc", DType::Bool, [])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec)
        .capacity(16)
        .seed(1)
        .sampler(Slice::slice_len(3).end_key("done").truncated_key("trunc"))
        .build()
        .unwrap();
    let append = |steps: &[i64], trunc: &[bool]| {
        let mut b = rb.batch([steps.len()]);
        b.set("step", steps).unwrap();
        b.set("trunc", trunc).unwrap();
        rb.extend(&b).unwrap();
    };
    // Steps 0..=2 of a trajectory cut off by a time limit at step 2.
    append(&[0, 1, 2], &[false, false, true]);
    let check = |when: &str| {
        for _ in 0..20 {
            let batch = rb.sample(3).unwrap();
            let (step, marks) = (batch.column::<i64>("step").unwrap(), batch.marks().unwrap());
            if step[0] != 0 {
                continue; // a slice of the later trajectory
            }
            assert_eq!(
                step,
                &[0, 1, 2],
                "{when}: the slice of the first trajectory"
            );
            let last = marks[2];
            assert!(last.is_end() && last.is_truncated(), "{when}: {last:?}");
            assert!(!marks[1].is_end() && !marks[1].is_truncated(), "{when}");
            return;
        }
        panic!("{when}: the first trajectory was never drawn");
    };
    check("alone");
    append(&[10, 11, 12], &[false; 3]);
    check("after a later trajectory");
}

/// A padded batch of a prioritized slice sampler (`strict_length(false)`) goes back
/// to `update_priority` whole: its padding rows (index `PADDING_INDEX`) are skipped,
/// its rows updated; through the priority field too, as a trainer's hook does.
#[test]
fn a_padded_slice_batch_updates_its_rows_and_skips_its_padding() {
    use replaybuf::sampler::{Prioritized, SlicePriority};
    let spec = Spec::builder()
        .field("traj", DType::I64, [])
        .field("td", DType::F32, [])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec)
        .capacity(32)
        .seed(7)
        .priority_key("td")
        .sampler(
            Slice::slice_len(4)
                .traj_key("traj")
                .strict_length(false)
                .prioritized(Prioritized::new(1.0, 1.0), SlicePriority::Start),
        )
        .build()
        .unwrap();
    let mut b = rb.batch([3]);
    b.set("traj", &[1i64, 1, 2]).unwrap();
    b.set("td", &[1f32; 3]).unwrap();
    rb.extend(&b).unwrap();
    let mut sampled = rb.sample(8).unwrap();
    let marks = sampled.marks().unwrap().to_vec();
    let padding = marks.iter().filter(|m| !m.is_valid()).count();
    assert!(padding > 0, "short trajectories give padded slices");
    for (&i, m) in sampled.index().iter().zip(&marks) {
        assert_eq!(i == replaybuf::PADDING_INDEX, !m.is_valid());
    }
    let done = rb
        .update_priority(sampled.index(), sampled.generations(), &[5.0; 8])
        .unwrap();
    assert_eq!((done.applied, done.stale), (8 - padding, 0));
    let rows: BTreeSet<u64> = sampled
        .index()
        .iter()
        .copied()
        .filter(|&i| i != replaybuf::PADDING_INDEX)
        .collect();
    for &i in &rows {
        assert_eq!(rb.priority(i), Some(5.0), "row {i}");
    }
    sampled.column_mut::<f32>("td").unwrap().fill(2.0);
    let done = rb.update_priority_from(&sampled).unwrap();
    assert_eq!(done.applied, 8 - padding);
    for &i in &rows {
        assert_eq!(rb.priority(i), Some(2.0), "row {i}");
    }
}

#[test]
fn prioritized_and_without_replacement_do_not_mix() {
    use replaybuf::sampler::{Prioritized, SlicePriority, WithoutReplacement};
    let e = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(
            Slice::slice_len(4)
                .end_key("done")
                .prioritized(Prioritized::new(0.6, 0.4), SlicePriority::Start)
                .without_replacement(WithoutReplacement::new()),
        )
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("not both"), "{e}");
}

#[test]
fn other_faces_refuse_slices_with_a_clear_error() {
    let e = replaybuf::list::ListBuffer::<String>::builder()
        .capacity(10)
        .sampler(Slice::slice_len(2))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("slice sampling"), "{e}");
    // A typed buffer's rows have no fields to tell trajectories by, even where its
    // one opaque field (`row`) would pass for a key: a `u8`'s, which a typed sample
    // then read as plain rows and panicked.
    let e = replaybuf::typed::TypedBuffer::<[u64; 2]>::builder()
        .capacity(10)
        .sampler(Slice::slice_len(2).traj_key("traj"))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("slice sampling"), "{e}");
    let e = replaybuf::typed::TypedBuffer::<u8>::builder()
        .capacity(8)
        .sampler(Slice::slice_len(2).traj_key("row"))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("slice sampling"), "{e}");
    let typed = replaybuf::typed::TypedBuffer::<u8>::builder()
        .capacity(8)
        .build()
        .unwrap();
    typed.extend(&[0; 8]).unwrap();
    let e = typed
        .set_sampler(Slice::slice_len(2).end_key("row"))
        .unwrap_err();
    assert!(e.to_string().contains("slice sampling"), "{e}");
    assert_eq!(typed.sample(4).unwrap().rows(), [0; 4]);
}

/// `write_all` of a slice buffer rewrites rows within their trajectories, and refuses
/// (changing nothing) a rewrite that would move a trajectory's bounds: the sampler
/// knows them from the rows as appended, and windows crossed two trajectories after
/// such a rewrite (62 of 100).
#[test]
fn a_rewrite_keeps_each_row_in_its_trajectory() {
    let before: Vec<_> = trajectory(1, 6)
        .into_iter()
        .chain(trajectory(2, 6))
        .collect();
    let by_id = Slice::slice_len(4).traj_key("traj");
    let by_end = Slice::slice_len(4).end_key("done");
    // Another id (by id), or another end flag (by end), for one row. By id, the last
    // trajectory is still open: its end is not known.
    let changes = [
        (
            by_id,
            [(4, (2, 4, false)), (6, (1, 0, false))],
            vec![(1, 6)],
        ),
        (
            by_end,
            [(2, (1, 2, true)), (5, (1, 5, false))],
            vec![(1, 6), (2, 6)],
        ),
    ];
    for (slice, changes, ends) in changes {
        let ends = BTreeMap::from_iter(ends);
        let rb = buffer(16, slice);
        rb.extend(&rows(&rb, &before)).unwrap();
        // The same trajectories, other payloads: rewritten.
        let mut same = rows(&rb, &before);
        same.column_mut::<i64>("step").unwrap()[3] = 3;
        rb.write_all(&same, None).unwrap();
        for (index, row) in changes {
            let mut changed = before.clone();
            changed[index] = row;
            let e = rb.write_all(&rows(&rb, &changed), None).unwrap_err();
            assert!(
                matches!(e, AccessError::TrajectoryRewrite { index: i } if i == index as u64),
                "{e}"
            );
            // The row alone at its position (after one that keeps its trajectory).
            let e = rb
                .write_at(&[0, index as u64], &rows(&rb, &[before[0], row]))
                .unwrap_err();
            assert!(
                matches!(e, AccessError::TrajectoryRewrite { index: i } if i == index as u64),
                "{e}"
            );
        }
        let stored = rb.read_all_in_order(None);
        let want = rows(&rb, &before);
        for key in ["traj", "step"] {
            assert_eq!(
                stored.column::<i64>(key).unwrap(),
                want.column::<i64>(key).unwrap()
            );
        }
        assert_eq!(
            stored.column::<bool>("done").unwrap(),
            want.column::<bool>("done").unwrap()
        );
        for _ in 0..20 {
            check_slices(&rb.sample(8).unwrap(), &ends);
        }
    }
}

/// A prioritized slice sampler whose priority sits almost all on rows that cannot
/// start a strict slice (per-step errors of a sparse reward, on each trajectory's last
/// step) draws the starts by the mass of the rows that can, as TorchRL's zeroes the
/// others' for its draw: every slice whole, each start about as often as its mass
/// says. It failed (`Starved`, "draws landed on slots being written") once picks by
/// the whole mass kept landing on the last steps.
#[test]
fn prioritized_starts_draw_by_the_mass_of_rows_that_can_start() {
    use replaybuf::sampler::{Prioritized, SlicePriority};
    let slice = Slice::slice_len(4)
        .traj_key("traj")
        .prioritized(Prioritized::new(1.0, 0.5).eps(1e-12), SlicePriority::Start);
    let rb = buffer(64, slice);
    let before: Vec<_> = trajectory(1, 10)
        .into_iter()
        .chain(trajectory(2, 10))
        .collect();
    rb.extend(&rows(&rb, &before)).unwrap();
    // The last step of each trajectory 1.0; rows 2 and 13 (steps 2 and 3) 1e-6 and
    // 3e-6; the rest 0 (eps): one pick by the whole mass in 500,000 can start a slice.
    let index: Vec<u64> = (0..20).collect();
    let generation = rb.get_many(&index).unwrap().generations().to_vec();
    let priority: Vec<f64> = (0..20)
        .map(|i| match i {
            9 | 19 => 1.0,
            2 => 1e-6,
            13 => 3e-6,
            _ => 0.0,
        })
        .collect();
    rb.update_priority(&index, &generation, &priority).unwrap();
    let ends = BTreeMap::from([(1, 10)]);
    let mut starts = BTreeMap::new();
    for _ in 0..50 {
        let batch = rb.sample(40).unwrap();
        for (traj, first, valid) in check_slices(&batch, &ends) {
            assert_eq!(valid, 4);
            *starts.entry((traj, first)).or_insert(0) += 1;
        }
    }
    // 500 slices: about 125 from step 2 of trajectory 1 and 375 from step 3 of
    // trajectory 2 (eps's share: under one in a thousand).
    let (a, b) = (starts[&(1, 2)], starts[&(2, 3)]);
    assert!(a + b >= 495, "{starts:?}");
    assert!((75..=175).contains(&a), "{starts:?}");
}

/// A `num_slices` sampler's slice length follows the batch size, and an epoch is cut at
/// one length: a sample of another length starts a new epoch cut at its own. The
/// open epoch's longer windows overran a shorter slice (a panic), and its shorter ones
/// made a strict slice short (8 rows of 16, padded).
#[test]
fn an_epoch_of_slices_follows_a_change_of_batch_size() {
    for first in [32, 16] {
        let rb = buffer(
            1000,
            Slice::num_slices(2)
                .traj_key("traj")
                .without_replacement(WithoutReplacement::new()),
        );
        rb.extend(&rows(&rb, &trajectory(1, 100))).unwrap();
        let ends = BTreeMap::new();
        let b = rb.sample(first).unwrap();
        assert_eq!(b.shape(), [2, first / 2]);
        check_slices(&b, &ends);
        for n in [48 - first, first, 48 - first] {
            let b = rb.sample(n).unwrap();
            assert_eq!(b.shape(), [2, n / 2], "after {first}");
            for (_, _, valid) in check_slices(&b, &ends) {
                assert_eq!(valid, n / 2, "strict slices are whole, after {first}");
            }
        }
    }
}

/// `span` applies to prioritized slices as to uniform ones (it was ignored): a strict
/// slice drawn by its start may start up to the right span nearer its trajectory's
/// end, cut off there; a window holding the drawn row may hang over both ends.
#[test]
fn prioritized_slices_take_the_span() {
    use replaybuf::sampler::{Prioritized, SlicePriority};
    for (over, span, firsts, lengths) in [
        // Trajectories of 12, slices of 4: starts 0..=8 without the span, to 10 with
        // a right span of 2 (slices of 3 and 2 rows).
        (SlicePriority::Start, (0, 0), 0..=8, 4..=4),
        (SlicePriority::Start, (usize::MAX, 2), 0..=10, 2..=4),
        (SlicePriority::Window, (0, 0), 0..=8, 4..=4),
        (
            SlicePriority::Window,
            (usize::MAX, usize::MAX),
            0..=11,
            1..=4,
        ),
    ] {
        let rb = ReplayBuffer::builder(spec())
            .capacity(64)
            .sampler(
                Slice::slice_len(4)
                    .end_key("done")
                    .span(span.0, span.1)
                    .prioritized(Prioritized::new(1.0, 1.0), over),
            )
            .seed(5)
            .build()
            .unwrap();
        for id in 1..=3 {
            rb.extend(&rows(&rb, &trajectory(id, 12))).unwrap();
        }
        let ends = BTreeMap::from([(1, 12), (2, 12), (3, 12)]);
        let (mut seen_firsts, mut seen_lengths) = (BTreeSet::new(), BTreeSet::new());
        for _ in 0..200 {
            for (_, first, valid) in check_slices(&rb.sample(16).unwrap(), &ends) {
                seen_firsts.insert(first);
                seen_lengths.insert(valid);
            }
        }
        assert_eq!(seen_firsts, firsts.collect(), "{over:?} {span:?}");
        assert_eq!(seen_lengths, lengths.collect(), "{over:?} {span:?}");
    }

    // The starts' scan, once picks by the whole mass keep landing where no slice can
    // start: with a right span of 2, step 8 of 10 can (two rows), step 9 cannot.
    let slice = Slice::slice_len(4)
        .traj_key("traj")
        .span(0, 2)
        .prioritized(Prioritized::new(1.0, 0.5).eps(1e-12), SlicePriority::Start);
    let rb = buffer(64, slice);
    rb.extend(&rows(&rb, &trajectory(1, 10))).unwrap();
    let index: Vec<u64> = (0..10).collect();
    let generation = rb.get_many(&index).unwrap().generations().to_vec();
    let priority: Vec<f64> = (0..10)
        .map(|i| match i {
            9 => 1.0,
            8 => 1e-6,
            _ => 0.0,
        })
        .collect();
    rb.update_priority(&index, &generation, &priority).unwrap();
    let batch = rb.sample(40).unwrap();
    let slices = check_slices(&batch, &BTreeMap::new());
    let from_step_8 = slices.iter().filter(|&&s| s == (1, 8, 2)).count();
    assert!(from_step_8 >= 9, "{slices:?}");
}

#[test]
fn loose_prioritized_slices_start_where_a_whole_slice_fits_or_a_short_trajectory_begins() {
    // As TorchRL's `PrioritizedSliceSampler(strict_length=False)`: rows 4 and 5 of a
    // 6-step trajectory started short slices a third of the time, and a 2-step
    // trajectory's second row started one too.
    use replaybuf::sampler::{Prioritized, SlicePriority};
    let rb = ReplayBuffer::builder(spec())
        .capacity(16)
        .sampler(
            Slice::slice_len(3)
                .traj_key("traj")
                .strict_length(false)
                .prioritized(Prioritized::new(1.0, 1.0), SlicePriority::Start),
        )
        .seed(3)
        .build()
        .unwrap();
    let mut all = trajectory(0, 6);
    all.extend(trajectory(1, 2));
    rb.extend(&rows(&rb, &all)).unwrap();
    let mut starts = BTreeSet::new();
    for _ in 0..200 {
        let batch = rb.sample(30).unwrap();
        let traj = batch.column::<i64>("traj").unwrap();
        let step = batch.column::<i64>("step").unwrap();
        for s in 0..10 {
            starts.insert((traj[3 * s], step[3 * s]));
        }
    }
    let expected: BTreeSet<_> = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)].into();
    assert_eq!(starts, expected);
}

#[test]
fn an_epoch_window_cut_from_an_open_trajectory_ends_where_the_next_began() {
    // Cut while trajectory 0 was the lane's last, its window [2, 3] kept no end: row
    // 3 read as truncated (the trajectory going on) after trajectory 1 had begun at
    // row 4, where a uniform slice sampler marked it the end.
    let rb = ReplayBuffer::builder(spec())
        .capacity(16)
        .sampler(
            Slice::slice_len(2)
                .traj_key("traj")
                .without_replacement(WithoutReplacement::new().shuffle(false)),
        )
        .seed(3)
        .build()
        .unwrap();
    let open: Vec<_> = (0..4).map(|t| (0, t, false)).collect();
    rb.extend(&rows(&rb, &open)).unwrap();
    rb.sample(2).unwrap(); // the epoch: windows [0, 1] and [2, 3]
    rb.extend(&rows(&rb, &[(1, 0, false), (1, 1, false)]))
        .unwrap();
    let batch = rb.sample(2).unwrap();
    assert_eq!(batch.column::<i64>("step").unwrap(), [2, 3]);
    let last = batch.marks().unwrap()[1];
    assert!(last.is_end() && !last.is_truncated(), "{last:?}");
}
