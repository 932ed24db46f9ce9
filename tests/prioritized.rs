//! Prioritized replay: sampling frequencies match `p^alpha` (a chi-square test under a
//! fixed seed), weights match the formula, zero-priority rows are never drawn, new rows
//! take the max priority, stale updates are dropped, and bad input changes nothing.

use replaybuf::error::{DataError, PriorityError, SampleError};
use replaybuf::sampler::{Prioritized, Reduction};
use replaybuf::typed::TypedBuffer;
use replaybuf::{Batch, DType, PriorityUpdate, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::I64, [])
        .field("td_error", DType::F32, [])
        .build()
        .unwrap()
}

fn buffer(capacity: usize, sampler: Prioritized) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .sampler(sampler)
        .seed(11)
        .build()
        .unwrap()
}

fn rows(rb: &ReplayBuffer, n: usize, first: i64) -> Batch {
    let mut b = rb.batch([n]);
    let ids: Vec<i64> = (first..first + n as i64).collect();
    b.set("id", &ids).unwrap();
    b
}

/// Sets row `index`'s priority, reading its generation from the buffer.
fn set(rb: &ReplayBuffer, index: u64, p: f64) -> PriorityUpdate {
    let g = rb.get(index).unwrap().generations()[0];
    rb.update_priority(&[index], &[g], &[p]).unwrap()
}

#[test]
fn frequencies_follow_priority_to_the_alpha() {
    let (alpha, eps) = (0.6, 1e-6);
    let rb = buffer(20, Prioritized::new(alpha, 0.4).eps(eps));
    rb.extend(&rows(&rb, 20, 0)).unwrap();
    let priorities: Vec<f64> = (0..20).map(|i| 0.05 + (i * i) as f64 * 0.3).collect();
    for (i, &p) in priorities.iter().enumerate() {
        assert_eq!(set(&rb, i as u64, p).applied, 1);
    }
    let mass: Vec<f64> = priorities.iter().map(|p| (p + eps).powf(alpha)).collect();
    let total: f64 = mass.iter().sum();
    let mut counts = [0u64; 20];
    let batches = 800;
    for _ in 0..batches {
        for &i in rb.sample(256).unwrap().index() {
            counts[i as usize] += 1;
        }
    }
    let draws = (batches * 256) as f64;
    let chi2: f64 = counts
        .iter()
        .zip(&mass)
        .map(|(&o, m)| {
            let e = draws * m / total;
            (o as f64 - e).powi(2) / e
        })
        .sum();
    // 19 degrees of freedom: the 0.1% critical value is 43.82. Under a fixed seed the
    // statistic is the same every run.
    assert!(
        chi2 < 43.82,
        "chi-square {chi2:.2} over 19 df: frequencies do not follow p^alpha"
    );
}

#[test]
fn weights_match_the_formula() {
    let (alpha, beta) = (0.7, 0.5);
    let rb = buffer(50, Prioritized::new(alpha, beta).eps(0.0));
    rb.extend(&rows(&rb, 50, 0)).unwrap();
    for i in 0..50u64 {
        set(&rb, i, 0.1 + i as f64 / 7.0);
    }
    let mass = |i: u64| rb.priority(i).unwrap().powf(alpha);
    let total: f64 = (0..50).map(mass).sum();
    let n = rb.len() as f64;
    let max_weight = (0..50)
        .map(|i| (n * mass(i) / total).powf(-beta))
        .fold(0.0, f64::max);
    let batch = rb.sample(256).unwrap();
    let weights = batch.weight().expect("prioritized batches carry weights");
    for (&i, &w) in batch.index().iter().zip(weights) {
        let expected = (n * mass(i) / total).powf(-beta) / max_weight;
        assert!(
            (f64::from(w) - expected).abs() < 1e-5 * expected,
            "row {i}: weight {w}, formula {expected}"
        );
    }
    // Annealing beta changes the next samples' weights.
    rb.set_beta(1.0).unwrap();
    assert_eq!(rb.beta(), Some(1.0));
    let batch = rb.sample(8).unwrap();
    for (&i, &w) in batch.index().iter().zip(batch.weight().unwrap()) {
        let expected = mass(0) / mass(i);
        assert!((f64::from(w) - expected).abs() < 1e-5 * expected);
    }
}

#[test]
fn zero_priority_rows_are_never_drawn() {
    let rb = buffer(10, Prioritized::new(1.0, 0.4).eps(0.0));
    rb.extend(&rows(&rb, 10, 0)).unwrap();
    for i in 0..10u64 {
        set(&rb, i, if i % 3 == 0 { 0.0 } else { 1.0 });
    }
    for _ in 0..200 {
        let b = rb.sample(256).unwrap();
        assert!(
            b.index().iter().all(|i| i % 3 != 0),
            "a zero-priority row was drawn"
        );
        assert!(b
            .weight()
            .unwrap()
            .iter()
            .all(|w| w.is_finite() && *w > 0.0));
    }
    for i in 0..10u64 {
        set(&rb, i, 0.0);
    }
    assert_eq!(
        rb.sample(1).unwrap_err(),
        SampleError::NoMass { rows: 10 },
        "no row has mass"
    );
    assert_eq!(
        rb.sample(1).unwrap_err().to_string(),
        "the buffer's 10 rows all have priority 0 (and eps 0): none can be drawn"
    );
    // One row back at a positive priority, and it is the only one drawn.
    set(&rb, 4, 2.0);
    assert!(rb.sample(32).unwrap().index().iter().all(|&i| i == 4));
    rb.clear().unwrap();
    assert_eq!(rb.sample(1).unwrap_err(), SampleError::Empty);
}

#[test]
fn new_rows_enter_with_the_max_priority() {
    let rb = buffer(8, Prioritized::new(0.6, 0.4));
    rb.extend(&rows(&rb, 2, 0)).unwrap();
    assert_eq!(rb.priority(0), Some(1.0), "TorchRL's initial maximum");
    set(&rb, 0, 5.0);
    set(&rb, 1, 0.5);
    rb.extend(&rows(&rb, 1, 2)).unwrap();
    assert_eq!(rb.priority(2), Some(5.0));
    set(&rb, 0, 0.1);
    rb.extend(&rows(&rb, 1, 3)).unwrap();
    assert_eq!(rb.priority(3), Some(5.0), "the largest ever seen");

    let within = buffer(
        8,
        Prioritized::new(0.6, 0.4).max_priority_within_buffer(true),
    );
    within.extend(&rows(&within, 2, 0)).unwrap();
    set(&within, 0, 5.0);
    set(&within, 1, 2.0);
    set(&within, 0, 0.1);
    within.extend(&rows(&within, 1, 2)).unwrap();
    assert_eq!(within.priority(2), Some(2.0), "the largest stored now");

    // With alpha 0 every mass is one, and the heaviest leaf (the first) gave its
    // priority, 0.5, not the largest.
    let flat = buffer(
        8,
        Prioritized::new(0.0, 0.4).max_priority_within_buffer(true),
    );
    flat.extend(&rows(&flat, 3, 0)).unwrap();
    for (i, p) in [(0, 0.5), (1, 3.0), (2, 1.0)] {
        set(&flat, i, p);
    }
    flat.extend(&rows(&flat, 1, 3)).unwrap();
    assert_eq!(flat.priority(3), Some(3.0));
}

/// `clear` forgets the largest priority seen: new rows after it enter at 1 again, as
/// TorchRL's sampler starts over when its buffer is emptied.
#[test]
fn new_rows_after_a_clear_enter_with_the_initial_priority() {
    let rb = buffer(8, Prioritized::new(1.0, 0.5));
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    set(&rb, 3, 100.0);
    rb.clear().unwrap();
    let written = rb.extend(&rows(&rb, 3, 4)).unwrap();
    for i in written.iter() {
        assert_eq!(rb.priority(i), Some(1.0), "row at {i}");
    }
    set(&rb, written.index(0), 7.0);
    let next = rb.extend(&rows(&rb, 1, 7)).unwrap().index(0);
    assert_eq!(
        rb.priority(next),
        Some(7.0),
        "the largest seen since the clear"
    );
}

/// A negative zero is a priority of zero: it must not become the largest seen (its
/// bits, sign set, order above every positive priority's).
#[test]
fn a_negative_zero_priority_is_zero_and_not_the_largest_seen() {
    let rb = buffer(8, Prioritized::new(0.6, 0.4));
    rb.extend(&rows(&rb, 2, 0)).unwrap();
    set(&rb, 0, -0.0);
    assert_eq!(rb.priority(0), Some(0.0));
    set(&rb, 1, 3.0);
    rb.extend(&rows(&rb, 1, 2)).unwrap();
    assert_eq!(rb.priority(2), Some(3.0), "the largest ever seen");
}

#[test]
fn updates_for_replaced_rows_are_dropped() {
    let rb = buffer(4, Prioritized::new(0.6, 0.4));
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    let sampled = rb.get_many(&[0, 1]).unwrap();
    // A collector laps slot 0 (and only slot 0).
    rb.extend(&rows(&rb, 1, 4)).unwrap();
    let done = rb
        .update_priority(sampled.index(), sampled.generations(), &[9.0, 3.0])
        .unwrap();
    assert_eq!(
        done,
        PriorityUpdate {
            applied: 1,
            stale: 1
        }
    );
    assert_eq!(
        rb.priority(0),
        Some(1.0),
        "the new row keeps its own priority"
    );
    assert_eq!(rb.priority(1), Some(3.0));

    // An emptied row takes no update either, and is never drawn again.
    let g = rb.get(2).unwrap().generations()[0];
    rb.clear().unwrap();
    assert_eq!(rb.update_priority(&[2], &[g], &[1.0]).unwrap().stale, 1);
    assert_eq!(rb.sample(1).unwrap_err(), SampleError::Empty);
    rb.extend(&rows(&rb, 2, 10)).unwrap();
    let mut ids: Vec<i64> = (0..20)
        .flat_map(|_| rb.sample(8).unwrap().column::<i64>("id").unwrap().to_vec())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids, [10, 11], "only rows written after empty() are drawn");
}

#[test]
fn an_all_or_nothing_update_refuses_replaced_rows() {
    let rb = buffer(4, Prioritized::new(0.6, 0.4));
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    let sampled = rb.get_many(&[1, 0]).unwrap();
    rb.extend(&rows(&rb, 1, 4)).unwrap();
    assert_eq!(
        rb.update_priority_all(sampled.index(), sampled.generations(), &[9.0, 3.0]),
        Err(PriorityError::Replaced {
            position: 1,
            index: 0
        })
    );
    assert_eq!(
        (rb.priority(0), rb.priority(1)),
        (Some(1.0), Some(1.0)),
        "the live row was not set either"
    );
    let live = rb.get_many(&[1, 2]).unwrap();
    assert_eq!(
        rb.update_priority_all(live.index(), live.generations(), &[9.0, 3.0]),
        Ok(PriorityUpdate {
            applied: 2,
            stale: 0
        })
    );
    assert_eq!((rb.priority(1), rb.priority(2)), (Some(9.0), Some(3.0)));
}

#[test]
fn updates_for_rows_never_held_are_refused() {
    let rb = buffer(8, Prioritized::new(0.6, 0.4));
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    let b = rb.get_many(&[0, 1]).unwrap();
    let g = b.generations().to_vec();
    assert_eq!(
        rb.update_priority(&[0, 6], &g, &[2.0, 2.0]),
        Err(PriorityError::UnknownRow {
            position: 1,
            index: 6,
            generation: g[1]
        }),
        "slot 6 was never written"
    );
    // A generation one lap ahead of the slot's: no row this buffer has held.
    let ahead = g[1] + (1 << 30);
    assert!(matches!(
        rb.update_priority(&[0, 1], &[g[0], ahead], &[2.0, 2.0]),
        Err(PriorityError::UnknownRow { position: 1, .. })
    ));
    assert_eq!(
        (rb.priority(0), rb.priority(1)),
        (Some(1.0), Some(1.0)),
        "nothing changed"
    );
}

#[test]
fn bad_updates_are_refused_and_change_nothing() {
    let rb = buffer(4, Prioritized::new(0.6, 0.4));
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    let b = rb.get_many(&[0, 1]).unwrap();
    let (i, g) = (b.index(), b.generations());
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(matches!(
            rb.update_priority(i, g, &[2.0, bad]),
            Err(PriorityError::Invalid { position: 1, .. })
        ));
    }
    assert!(matches!(
        rb.update_priority(i, g, &[2.0, 2.0, 2.0]),
        Err(PriorityError::Lengths { .. })
    ));
    assert!(matches!(
        rb.update_priority(i, &g[..1], &[2.0, 2.0]),
        Err(PriorityError::Lengths { .. })
    ));
    assert!(matches!(
        rb.update_priority(&[0, 9], g, &[2.0, 2.0]),
        Err(PriorityError::OutOfRange { index: 9, .. })
    ));
    assert!(rb.set_alpha(f64::NAN).is_err() && rb.set_beta(-0.5).is_err());
    // Named as what they are (the message said "value 0 is -0.5").
    assert_eq!(
        rb.set_beta(-0.5).unwrap_err().to_string(),
        "beta is -0.5; it must be finite and at least 0"
    );
    assert_eq!(
        rb.set_alpha(2e6).unwrap_err().to_string(),
        "alpha is 2000000; it must be finite and at least 0, and at most 2^20"
    );
    assert!(matches!(
        rb.set_alpha(f64::NAN).unwrap_err(),
        PriorityError::InvalidSetting { name: "alpha", .. }
    ));
    assert_eq!(
        (rb.priority(0), rb.priority(1)),
        (Some(1.0), Some(1.0)),
        "nothing changed"
    );

    let uniform = ReplayBuffer::builder(spec()).capacity(4).build().unwrap();
    assert_eq!(
        uniform.update_priority(&[], &[], &[]),
        Err(PriorityError::NotPrioritized)
    );
    uniform.extend(&rows(&uniform, 1, 0)).unwrap();
    assert_eq!(uniform.sample(1).unwrap().weight(), None);
}

#[test]
fn builder_checks_the_sampler_and_the_priority_key() {
    let build =
        |b: replaybuf::ReplayBufferBuilder| b.build().map(|_| ()).map_err(|e| e.to_string());
    let base = || ReplayBuffer::builder(spec()).capacity(8);
    assert!(build(base().sampler(Prioritized::new(f64::NAN, 0.4)))
        .unwrap_err()
        .contains("alpha"));
    assert!(build(base().sampler(Prioritized::new(0.6, -1.0)))
        .unwrap_err()
        .contains("beta"));
    assert!(
        build(base().sampler(Prioritized::new(0.6, 0.4).max_capacity(4)))
            .unwrap_err()
            .contains("max_capacity")
    );
    assert!(build(base().sampler(Prioritized::new(0.6, 0.4).max_capacity(8))).is_ok());
    assert!(build(base().priority_key("td_error"))
        .unwrap_err()
        .contains("needs a prioritized sampler"));
    let p = || base().sampler(Prioritized::new(0.6, 0.4));
    assert!(build(p().priority_key("nope"))
        .unwrap_err()
        .contains("no such field"));
    assert!(build(p().priority_key("id"))
        .unwrap_err()
        .contains("float field"));
    assert!(replaybuf::list::ListBuffer::<u8>::builder()
        .capacity(4)
        .sampler(Prioritized::new(0.6, 0.4))
        .build()
        .is_err());
}

#[test]
fn priorities_from_a_field_with_each_reduction() {
    let spec = Spec::builder()
        .field("id", DType::I64, [])
        .field("td_error", DType::F64, [4])
        .build()
        .unwrap();
    for (reduction, want) in [
        (Reduction::Max, 4.0),
        (Reduction::Min, 1.0),
        (Reduction::Mean, 2.5),
        (Reduction::Median, 2.0),
    ] {
        let rb = ReplayBuffer::builder(spec.clone())
            .capacity(8)
            .sampler(Prioritized::new(0.6, 0.4).reduction(reduction))
            .priority_key("td_error")
            .build()
            .unwrap();
        let mut b = rb.batch([2]);
        b.set("td_error", &[4.0, 1.0, 3.0, 2.0, 0.5, 0.5, 0.5, 0.5])
            .unwrap();
        rb.extend(&b).unwrap();
        assert_eq!(
            (rb.priority(0), rb.priority(1)),
            (Some(want), Some(0.5)),
            "{reduction:?}"
        );

        // TorchRL's update_tensordict_priority: the sampled batch carries new values.
        let mut sampled = rb.get_many(&[0, 1]).unwrap();
        sampled
            .set("td_error", &[8.0, 8.0, 8.0, 8.0, 0.0, 1.0, 1.0, 1.0])
            .unwrap();
        assert_eq!(rb.update_priority_from(&sampled).unwrap().applied, 2);
        assert_eq!(rb.priority(0), Some(8.0));
        // A NaN anywhere in a row is refused, whatever the reduction would make of it.
        let mut bad = rb.batch([2]);
        bad.set("td_error", &[1.0, 1.0, 1.0, 1.0, 1.0, f64::NAN, 1.0, 1.0])
            .unwrap();
        assert!(
            matches!(
                rb.extend(&bad),
                Err(DataError::InvalidPriority { row: 1, .. })
            ),
            "{reduction:?}"
        );
        assert_eq!(rb.write_count(), 2);
    }
}

#[test]
fn a_nan_priority_field_is_refused_before_anything_is_written() {
    let spec = Spec::builder()
        .field("td_error", DType::F32, [])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec)
        .capacity(8)
        .sampler(Prioritized::new(0.6, 0.4))
        .priority_key("td_error")
        .build()
        .unwrap();
    let mut b = rb.batch([3]);
    b.set("td_error", &[1.0f32, f32::NAN, 2.0]).unwrap();
    assert!(matches!(
        rb.extend(&b),
        Err(DataError::InvalidPriority { row: 1, .. })
    ));
    assert_eq!(rb.len(), 0);
    b.set("td_error", &[1.0f32, -2.0, 2.0]).unwrap();
    assert!(matches!(
        rb.extend(&b),
        Err(DataError::InvalidPriority { row: 1, .. })
    ));
    assert_eq!(rb.write_count(), 0);
}

#[test]
fn alpha_zero_makes_sampling_uniform() {
    let rb = buffer(4, Prioritized::new(1.0, 1.0));
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    for (i, p) in [(0, 100.0), (1, 1.0), (2, 1.0), (3, 1.0)] {
        set(&rb, i, p);
    }
    rb.set_alpha(0.0).unwrap();
    assert_eq!(rb.alpha(), Some(0.0));
    let mut counts = [0usize; 4];
    for _ in 0..100 {
        let b = rb.sample(256).unwrap();
        assert!(b.weight().unwrap().iter().all(|&w| (w - 1.0).abs() < 1e-6));
        b.index().iter().for_each(|&i| counts[i as usize] += 1);
    }
    assert!(
        counts.iter().all(|&c| (5800..7000).contains(&c)),
        "{counts:?}"
    );
    assert_eq!(
        rb.priority(0),
        Some(100.0),
        "the stored priority is kept for later alphas"
    );
}

/// Shards of unequal sizes count masses in one unit: rows of one priority are drawn
/// alike and weigh 1. Trees of 4 and 3 leaves (capacity 7 over two shards) each took
/// their own unit, and the first shard's rows were drawn twice as often, weighing 0.5.
#[test]
fn shards_of_unequal_sizes_draw_rows_of_one_priority_alike() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(7)
        .shards(2)
        .sampler(Prioritized::new(1.0, 1.0))
        .seed(5)
        .build()
        .unwrap();
    for i in 0..7 {
        rb.extend(&rows(&rb, 1, i)).unwrap();
    }
    assert_eq!(rb.len(), 7);
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..50 {
        let b = rb.sample(256).unwrap();
        assert!(
            b.weight().unwrap().iter().all(|&w| (w - 1.0).abs() < 1e-6),
            "{:?}",
            b.weight()
        );
        for &id in b.column::<i64>("id").unwrap() {
            *counts.entry(id).or_insert(0usize) += 1;
        }
    }
    // 12,800 draws, 1,829 a row expected.
    assert_eq!(counts.len(), 7);
    assert!(
        counts.values().all(|&c| (1600..2060).contains(&c)),
        "{counts:?}"
    );
}

/// A row's priorities that reduce to an infinite one are refused, changing nothing:
/// the mean of `f64::MAX` twice was taken, became the largest priority seen, and a
/// file-backed buffer then refused to reopen as corrupt.
#[test]
fn priorities_that_reduce_to_infinity_are_refused() {
    for reduction in [Reduction::Mean, Reduction::Sum] {
        let rb = buffer(8, Prioritized::new(0.6, 0.4).reduction(reduction));
        rb.extend(&rows(&rb, 2, 0)).unwrap();
        let g = rb.get_many(&[0, 1]).unwrap().generations().to_vec();
        let err = rb
            .update_priority(&[0, 1], &g, &[1.0, 2.0, f64::MAX, f64::MAX])
            .unwrap_err();
        assert!(
            matches!(err, PriorityError::Invalid { position: 2, value } if value.is_infinite()),
            "{reduction:?}: {err:?}"
        );
        assert_eq!((rb.priority(0), rb.priority(1)), (Some(1.0), Some(1.0)));
        rb.extend(&rows(&rb, 1, 2)).unwrap();
        assert_eq!(
            rb.priority(2),
            Some(1.0),
            "{reduction:?}: the largest seen is 1"
        );
    }
    let spec = Spec::builder()
        .field("id", DType::I64, [])
        .field("td", DType::F64, [2])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec)
        .capacity(8)
        .sampler(Prioritized::new(0.6, 0.4).reduction(Reduction::Sum))
        .priority_key("td")
        .build()
        .unwrap();
    let mut b = rb.batch([2]);
    b.set("td", &[1.0, 1.0, f64::MAX, f64::MAX]).unwrap();
    let err = rb.extend(&b).unwrap_err();
    assert!(
        matches!(err, DataError::InvalidPriority { row: 1, .. }),
        "{err:?}"
    );
    assert_eq!(rb.len(), 0);
}

#[test]
fn typed_and_multi_env_buffers_sample_by_priority() {
    let rb = TypedBuffer::<[u32; 2]>::builder()
        .capacity(16)
        .sampler(Prioritized::new(1.0, 0.5).eps(0.0))
        .seed(3)
        .build()
        .unwrap();
    rb.extend(&[[1, 1], [2, 2], [3, 3]]).unwrap();
    let sampled = rb.sample(3).unwrap();
    let zeros = vec![0.0; 3];
    rb.update_priority(sampled.index(), sampled.generations(), &zeros)
        .unwrap();
    let other = (0..3u64).find(|i| !sampled.index().contains(i));
    let b = rb.sample(64);
    if let Some(i) = other {
        let b = b.unwrap();
        assert!(b.index().iter().all(|&j| j == i));
        rb.update_priority(&b.index()[..1], &b.generations()[..1], &[0.0])
            .unwrap();
    }
    // Every row at 0: rows with no mass, not an empty buffer (a branch expected
    // `Empty` here, and the seed never ran it).
    assert_eq!(rb.sample(4).unwrap_err(), SampleError::NoMass { rows: 3 });

    let grid = ReplayBuffer::builder(spec())
        .capacity(12)
        .ndim(2)
        .envs(3)
        .dim_extend(0)
        .shards(2)
        .sampler(Prioritized::new(1.0, 0.4).eps(0.0))
        .seed(5)
        .build()
        .unwrap();
    let mut b = grid.batch([2, 3]);
    b.set("id", &[0i64, 1, 2, 3, 4, 5]).unwrap();
    grid.extend(&b).unwrap();
    for i in 0..6u64 {
        set(&grid, i, if i == 4 { 1.0 } else { 0.0 });
    }
    assert!(grid
        .sample(32)
        .unwrap()
        .column::<i64>("id")
        .unwrap()
        .iter()
        .all(|&id| id == 4));
}

#[test]
fn priority_mass_reads_the_sum_and_the_smallest_in_priority_units() {
    let (alpha, eps) = (0.6, 1e-6);
    let rb = buffer(64, Prioritized::new(alpha, 0.4).eps(eps));
    let empty = rb.priority_mass().unwrap();
    assert_eq!((empty.total, empty.min), (0.0, 0.0));
    rb.extend(&rows(&rb, 40, 0)).unwrap();
    let priorities: Vec<f64> = (0..40).map(|i| 0.5 + i as f64 * 7.0).collect();
    for (i, &p) in priorities.iter().enumerate() {
        set(&rb, i as u64, p);
    }
    let mass: Vec<f64> = priorities.iter().map(|p| (p + eps).powf(alpha)).collect();
    let total: f64 = mass.iter().sum();
    let near = |got: f64, want: f64, tolerance: f64| {
        assert!((got / want - 1.0).abs() < tolerance, "{got} vs {want}");
    };
    let got = rb.priority_mass().unwrap();
    near(got.total, total, 1e-4);
    near(got.min, mass[0], 1e-4);
    // A priority far past the rest moves the buffer's scale; the figures keep their
    // units.
    set(&rb, 5, 1e12);
    let moved = rb.priority_mass().unwrap();
    near(
        moved.total,
        total - mass[5] + (1e12 + eps).powf(alpha),
        1e-4,
    );
    near(moved.min, mass[0], 1e-3);
    assert!(ReplayBuffer::builder(spec())
        .capacity(8)
        .build()
        .unwrap()
        .priority_mass()
        .is_none());
}
