//! ReplayBufferEnsemble: buffers of any storage and sampler sampled together, by
//! probability or from all, with each row's buffer recorded and priorities routed back.

use replaybuf::ensemble::ReplayBufferEnsemble;
use replaybuf::error::{PriorityError, SampleError};
use replaybuf::sampler::{Prioritized, Slice, WithoutReplacement};
use replaybuf::{Batch, DType, ReplayBuffer, Spec, Transform};

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::I64, [])
        .field("traj", DType::I64, [])
        .build()
        .unwrap()
}

/// A buffer of `n` rows with ids `k * 1000..`, built from `b`, in trajectories of 10.
fn member(k: i64, n: usize, b: replaybuf::ReplayBufferBuilder) -> ReplayBuffer {
    let rb = b.capacity(1000).seed(k as u64).build().unwrap();
    let mut rows = rb.batch([n]);
    let ids: Vec<i64> = (0..n as i64).map(|i| k * 1000 + i).collect();
    let traj: Vec<i64> = (0..n as i64).map(|i| i / 10).collect();
    rows.set("id", &ids).unwrap();
    rows.set("traj", &traj).unwrap();
    rb.extend(&rows).unwrap();
    rb
}

fn uniform(k: i64) -> ReplayBuffer {
    member(k, 100, ReplayBuffer::builder(spec()))
}

/// Checks each row's recorded buffer against the id it holds.
fn check_ids(batch: &replaybuf::ensemble::EnsembleBatch) {
    let ids = batch.batch().column::<i64>("id").unwrap();
    for (row, (&id, &k)) in ids.iter().zip(batch.buffer_ids()).enumerate() {
        assert_eq!(id / 1000, k as i64, "row {row}: id {id} from buffer {k}");
    }
}

#[test]
fn sample_from_all_splits_the_batch_evenly_and_records_each_rows_buffer() {
    let e = ReplayBufferEnsemble::builder([uniform(0), uniform(1), uniform(2)])
        .sample_from_all(true)
        .seed(1)
        .build()
        .unwrap();
    assert_eq!(e.len(), 3);
    let b = e.sample(10).unwrap();
    assert_eq!(b.batch().len(), 10);
    assert_eq!(b.batch().shape(), &[10]);
    assert_eq!(
        (b.rows_of(0), b.rows_of(1), b.rows_of(2)),
        (0..4, 4..7, 7..10)
    );
    check_ids(&b);
    assert_eq!(b.batch().index().len(), 10);
    assert!(b.batch().weight().is_none());
    assert_eq!(e[1].len(), 100);
    assert!(e.get(3).is_none());
}

#[test]
fn buffers_are_drawn_by_p() {
    let e = ReplayBufferEnsemble::builder([uniform(0), uniform(1), uniform(2)])
        .p([0.8, 0.2, 0.0])
        .batch_size(4)
        .seed(2)
        .build()
        .unwrap();
    let mut from = [0usize; 3];
    let mut out = e.batch();
    for _ in 0..2000 {
        e.sample_into(&mut out).unwrap();
        check_ids(&out);
        let k = out.buffer_ids()[0];
        assert!(
            out.buffer_ids().iter().all(|&b| b == k),
            "one buffer per draw"
        );
        from[k] += 1;
    }
    assert_eq!(from[2], 0, "a buffer of probability 0 is never drawn");
    // 2000 draws at 0.8: mean 1600, sd 17.9; four sd either way.
    assert!((1528..=1672).contains(&from[0]), "{from:?}");

    // Weights whose sum overflows split the draws as they say: half and half.
    let e = ReplayBufferEnsemble::builder([uniform(0), uniform(1)])
        .p([f64::MAX, f64::MAX])
        .batch_size(4)
        .seed(2)
        .build()
        .unwrap();
    let (mut from, mut out) = ([0usize; 2], e.batch());
    for _ in 0..2000 {
        e.sample_into(&mut out).unwrap();
        from[out.buffer_ids()[0]] += 1;
    }
    // Mean 1000, sd 22.4; four sd either way.
    assert!((910..=1090).contains(&from[0]), "{from:?}");

    // Several draws per sample, with replacement: shares add up.
    let e = ReplayBufferEnsemble::builder([uniform(0), uniform(1)])
        .num_buffer_sampled(3)
        .seed(3)
        .build()
        .unwrap();
    let mut seen = [false; 2];
    for _ in 0..200 {
        let b = e.sample(9).unwrap();
        check_ids(&b);
        let (a, c) = (b.rows_of(0).len(), b.rows_of(1).len());
        assert_eq!(a + c, 9);
        assert!(a % 3 == 0, "three draws of 3 rows: {a}");
        seen[0] |= a == 9;
        seen[1] |= c == 9;
    }
    assert!(
        seen[0] && seen[1],
        "both buffers drawn three times at some point"
    );
}

#[test]
fn members_keep_their_own_samplers_and_transforms() {
    let prioritized = member(
        0,
        100,
        ReplayBuffer::builder(spec()).sampler(Prioritized::new(1.0, 1.0).eps(0.0)),
    );
    let epochs = member(
        1,
        8,
        ReplayBuffer::builder(spec()).sampler(WithoutReplacement::new().drop_last(true)),
    );
    let slices = member(
        2,
        100,
        ReplayBuffer::builder(spec()).sampler(Slice::num_slices(2).traj_key("traj")),
    );
    slices.append_transform(Transform::new(|b: &mut Batch| {
        b.column_mut::<i64>("traj")?.fill(-1);
        Ok(())
    }));
    let e = ReplayBufferEnsemble::builder([prioritized.clone(), epochs, slices])
        .sample_from_all(true)
        .seed(4)
        .build()
        .unwrap();
    let b = e.sample(12).unwrap();
    check_ids(&b);
    let w = b.batch().weight().expect("one member is prioritized");
    assert!(w[b.rows_of(0)].iter().all(|&w| w > 0.0 && w <= 1.0));
    assert!(
        w[4..].iter().all(|&w| w == 1.0),
        "rows of other buffers weigh 1"
    );
    // The slice member gave 2 windows of 2 steps of one trajectory each, transformed.
    let traj = b.batch().column::<i64>("traj").unwrap();
    assert_eq!(traj[8..], [-1; 4]);
    let ids = b.batch().column::<i64>("id").unwrap();
    assert_eq!(ids[9], ids[8] + 1);
    assert_eq!(ids[11], ids[10] + 1);
    // The epoch member runs out after two samples of 4 of its 8 rows.
    e.sample(12).unwrap();
    assert_eq!(e.sample(12).unwrap_err(), SampleError::EpochEnd);
    // Priorities go back to the prioritized member only, and only there.
    assert_eq!(
        e.update_priority(&b, &[1.0; 12]).unwrap_err(),
        PriorityError::NotPrioritized
    );
}

#[test]
fn priority_updates_are_routed_to_each_rows_buffer() {
    let p = || ReplayBuffer::builder(spec()).sampler(Prioritized::new(1.0, 0.0).eps(0.0));
    let (a, b) = (member(0, 50, p()), member(1, 50, p()));
    let e = ReplayBufferEnsemble::builder([a.clone(), b.clone()])
        .sample_from_all(true)
        .seed(5)
        .build()
        .unwrap();
    let batch = e.sample(20).unwrap();
    let ids = batch.batch().column::<i64>("id").unwrap().to_vec();
    let priorities: Vec<f64> = ids.iter().map(|&id| (id % 1000) as f64 + 0.5).collect();
    let done = e.update_priority(&batch, &priorities).unwrap();
    assert_eq!(done.applied + done.stale, 20);
    for (row, &id) in ids.iter().enumerate() {
        let k = batch.buffer_ids()[row];
        let index = batch.batch().index()[row];
        assert_eq!(e[k].priority(index), Some((id % 1000) as f64 + 0.5));
    }
    assert!(matches!(
        e.update_priority(&batch, &[1.0; 3]),
        Err(PriorityError::Lengths { .. })
    ));
    assert!(matches!(
        e.update_priority(&batch, &[f64::NAN; 20]),
        Err(PriorityError::Invalid { position: 0, .. })
    ));
}

#[test]
fn same_seed_same_samples_and_errors_pass_through() {
    let make = || {
        ReplayBufferEnsemble::builder([uniform(0), uniform(1)])
            .p([0.5, 0.5])
            .num_buffer_sampled(2)
            .batch_size(6)
            .seed(9)
            .build()
            .unwrap()
    };
    let (x, y) = (make(), make());
    for _ in 0..20 {
        let (a, b) = (x.sample_default().unwrap(), y.sample_default().unwrap());
        assert_eq!(
            a.batch().column::<i64>("id").unwrap(),
            b.batch().column::<i64>("id").unwrap()
        );
        assert_eq!(a.buffer_ids(), b.buffer_ids());
    }
    let empty = ReplayBuffer::builder(spec()).capacity(4).build().unwrap();
    let e = ReplayBufferEnsemble::builder([uniform(0), empty])
        .sample_from_all(true)
        .build()
        .unwrap();
    assert_eq!(e.sample(4).unwrap_err(), SampleError::Empty);
    let e = ReplayBufferEnsemble::builder([uniform(0), uniform(1)])
        .sample_from_all(true)
        .build()
        .unwrap();
    for n in [usize::MAX, 1 << 40] {
        assert_eq!(e.sample(n).unwrap_err(), SampleError::TooLarge { rows: n });
    }
    let e = ReplayBufferEnsemble::builder([uniform(0)]).build().unwrap();
    assert_eq!(e.sample_default().unwrap_err(), SampleError::NoBatchSize);
    assert_eq!(
        e.sample_into(&mut e.batch()).unwrap_err(),
        SampleError::NoBatchSize
    );
}

#[test]
fn ensemble_build_errors() {
    let msg = |b: replaybuf::ensemble::EnsembleBuilder| b.build().unwrap_err().to_string();
    assert!(msg(ReplayBufferEnsemble::builder([])).contains("at least one"));
    let other = ReplayBuffer::builder(Spec::builder().field("x", DType::U8, []).build().unwrap())
        .capacity(4)
        .build()
        .unwrap();
    assert!(msg(ReplayBufferEnsemble::builder([uniform(0), other])).contains("same fields"));
    let two = || ReplayBufferEnsemble::builder([uniform(0), uniform(1)]);
    assert!(msg(two().p([1.0])).contains("one probability per buffer"));
    assert!(msg(two().p([1.0, -1.0])).contains("finite"));
    assert!(msg(two().p([0.0, 0.0])).contains("all be 0"));
    assert!(msg(two().p([f64::NAN, 1.0])).contains("finite"));
    assert!(msg(two().sample_from_all(true).p([1.0, 1.0])).contains("exclude"));
    assert!(msg(two().sample_from_all(true).num_buffer_sampled(2)).contains("exclude"));
    assert!(msg(two().num_buffer_sampled(0)).contains("at least 1"));
    assert!(msg(two().batch_size(0)).contains("batch_size"));
}

/// A member's rate limit holds the ensemble's draws from it as it holds its own
/// learners' (the ensemble drew past it): samples wait for its min size, and time out
/// with nothing counted.
#[test]
fn members_keep_their_rate_limits() {
    use replaybuf::error::RateLimitError;
    use replaybuf::RateLimit;
    let limit = RateLimit::min_size(50).sample_timeout(Some(std::time::Duration::from_millis(50)));
    let limited = member(
        1,
        5,
        ReplayBuffer::builder(spec())
            .capacity(100)
            .rate_limit(limit),
    );
    let e = ReplayBufferEnsemble::builder([limited.clone()])
        .seed(1)
        .build()
        .unwrap();
    assert!(matches!(
        e.sample(2),
        Err(SampleError::RateLimited(RateLimitError::Timeout {
            inserts: 5,
            ..
        }))
    ));
    assert_eq!(limited.rate_limit_stats().unwrap().samples, 0);
    let more = member(1, 45, ReplayBuffer::builder(spec()).capacity(100));
    limited.extend(&more.read_all_in_order(None)).unwrap();
    assert_eq!(e.sample(2).unwrap().batch().len(), 2);
    assert_eq!(limited.rate_limit_stats().unwrap().samples, 2);
}

/// A sample that fails on an empty member leaves the members before it as they were:
/// a member's epoch without replacement gave up the rows drawn for it (3 failed
/// samples took 12 of its 20 rows out of the epoch).
#[test]
fn a_sample_failed_by_an_empty_member_draws_nothing_from_the_others() {
    let epochs = member(
        0,
        20,
        ReplayBuffer::builder(spec()).sampler(WithoutReplacement::new()),
    );
    let empty = ReplayBuffer::builder(spec()).capacity(10).build().unwrap();
    let e = ReplayBufferEnsemble::builder([epochs.clone(), empty])
        .sample_from_all(true)
        .seed(1)
        .build()
        .unwrap();
    for _ in 0..3 {
        assert_eq!(e.sample(8).unwrap_err(), SampleError::Empty);
    }
    assert_eq!(epochs.epoch_left(), None, "no epoch was opened");
    let mut seen = 0;
    while let Ok(b) = epochs.sample(4) {
        seen += b.len();
    }
    assert_eq!(seen, 20, "the whole epoch is still there");
}

/// Nor does a member that refuses its share: a slice member given a share its slices
/// do not divide, or a prioritized member whose rows all weigh nothing. Its refusal
/// came after the members before it drew (the epoch gave up 4 of its 8 rows).
#[test]
fn a_sample_refused_by_a_later_member_draws_nothing_from_the_others() {
    let no_mass = member(
        2,
        10,
        ReplayBuffer::builder(spec()).sampler(Prioritized::new(0.6, 0.4).eps(0.0)),
    );
    let all = no_mass.read_all_in_order(None);
    no_mass
        .update_priority(all.index(), all.generations(), &[0.0; 10])
        .unwrap();
    let refusing = [
        (
            member(
                1,
                20,
                ReplayBuffer::builder(spec()).sampler(Slice::slice_len(2).traj_key("traj")),
            ),
            7,
        ),
        (no_mass, 8),
    ];
    for (later, n) in refusing {
        let epochs = member(
            0,
            8,
            ReplayBuffer::builder(spec()).sampler(WithoutReplacement::new()),
        );
        let e = ReplayBufferEnsemble::builder([epochs.clone(), later])
            .sample_from_all(true)
            .seed(1)
            .build()
            .unwrap();
        let err = e.sample(n).unwrap_err();
        assert!(
            matches!(
                err,
                SampleError::SliceBatchSize { .. } | SampleError::NoMass { .. }
            ),
            "{err:?}"
        );
        assert_eq!(epochs.epoch_left(), None, "no epoch was opened ({err:?})");
        assert_eq!(epochs.sample(8).unwrap().len(), 8, "{err:?}");
    }
}

#[test]
fn a_frames_member_with_no_row_to_rebuild_fails_the_sample_before_any_member_draws() {
    // Its `len` counts its newest step, which waits for the next: the check passed it,
    // and its refusal came after the member before it had drawn from its epoch.
    let spec = Spec::builder()
        .field("obs", DType::U8, [2])
        .field("next_obs", DType::U8, [2])
        .field("done", DType::Bool, [])
        .build()
        .unwrap();
    let rows = |rb: &ReplayBuffer, n: usize| {
        let mut b = rb.batch([n]);
        let obs: Vec<u8> = (0..n as u8).flat_map(|i| [i.max(1), i + 1]).collect();
        let next: Vec<u8> = (0..n as u8).flat_map(|i| [i + 1, i + 2]).collect();
        b.set("obs", &obs).unwrap();
        b.set("next_obs", &next).unwrap();
        b
    };
    let a = ReplayBuffer::builder(spec.clone())
        .capacity(16)
        .sampler(WithoutReplacement::new().shuffle(false))
        .build()
        .unwrap();
    a.extend(&rows(&a, 4)).unwrap();
    let b = ReplayBuffer::builder(spec)
        .capacity(8)
        .frames(
            replaybuf::Frames::new()
                .stack("obs", 2)
                .next_of("obs", "next_obs"),
        )
        .build()
        .unwrap();
    b.extend(&rows(&b, 1)).unwrap();
    assert_eq!(b.len(), 1);
    let e = ReplayBufferEnsemble::builder([a.clone(), b])
        .sample_from_all(true)
        .seed(2)
        .build()
        .unwrap();
    assert_eq!(e.sample(4).unwrap_err(), SampleError::Empty);
    assert_eq!(a.sample(4).unwrap().len(), 4, "a's epoch is whole");
}
