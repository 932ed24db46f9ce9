//! Priorities across the whole range a learner produces, and the write races of the
//! prioritized trees (issue 12, items 7 and 8).
//!
//! - Sampling probabilities follow `(p + eps)^alpha / sum` within 1% for priorities
//!   anywhere in `[1e-8, 1e8]` and `alpha` in `(0, 1]`, as long as a buffer's masses
//!   span less than its resolution (see `sampler/mass_scale.rs`): checked by draw
//!   frequencies under a fixed seed, and exactly through the importance weights
//!   (`beta = 1` makes a weight the ratio of two masses).
//! - A positive priority never gets zero mass, whatever its size; an extend's rows,
//!   each with a priority of its own, each get their own priority's mass.
//! - An update for a row replaced since is dropped however many laps later it comes
//!   (the leaves carry the full 32-bit lap, not 16 bits of it).
//! - `set_alpha` racing appends and updates leaves every leaf with the mass its raw
//!   priority has under the final alpha, including a leaf whose priority an update
//!   changed after the pass worked out its chunk's masses (which a pass that kept
//!   the masses it worked out fails at once).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use replaybuf::internals::sumtree::{quantize, Leaf, OwnedTree};
use replaybuf::sampler::Prioritized;
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder().field("id", DType::U32, []).build().unwrap()
}

fn buffer(capacity: usize, sampler: Prioritized) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .sampler(sampler)
        .seed(12)
        .build()
        .unwrap()
}

/// A buffer of two shards whose rows carry their priorities in field `td` (alpha 0.6,
/// beta 0.4).
fn with_td(capacity: usize, seed: u64) -> ReplayBuffer {
    let spec = Spec::builder()
        .field("id", DType::U32, [])
        .field("td", DType::F32, [])
        .build()
        .unwrap();
    ReplayBuffer::builder(spec)
        .capacity(capacity)
        .shards(2)
        .sampler(Prioritized::new(0.6, 0.4))
        .priority_key("td")
        .seed(seed)
        .build()
        .unwrap()
}

fn rows(rb: &ReplayBuffer, n: usize) -> Batch {
    let mut b = rb.batch([n]);
    let ids: Vec<u32> = (0..n as u32).collect();
    b.set("id", &ids).unwrap();
    b
}

/// A buffer of `priorities.len()` rows holding those priorities (index `i` has
/// `priorities[i]`), with `eps = 0` and `beta = 1`.
fn holding(priorities: &[f64], alpha: f64) -> ReplayBuffer {
    holding_in(priorities.len(), priorities, alpha)
}

fn holding_in(capacity: usize, priorities: &[f64], alpha: f64) -> ReplayBuffer {
    let rb = buffer(capacity, Prioritized::new(alpha, 1.0).eps(0.0));
    rb.extend(&rows(&rb, priorities.len())).unwrap();
    let index: Vec<u64> = (0..priorities.len() as u64).collect();
    let sampled = rb.get_many(&index).unwrap();
    let done = rb
        .update_priority(sampled.index(), sampled.generations(), priorities)
        .unwrap();
    assert_eq!(done.applied, priorities.len());
    rb
}

/// The exact probability of each row: `p^alpha / sum`.
fn exact(priorities: &[f64], alpha: f64) -> Vec<f64> {
    let mass: Vec<f64> = priorities.iter().map(|p| p.powf(alpha)).collect();
    let total: f64 = mass.iter().sum();
    mass.iter().map(|m| m / total).collect()
}

/// Draws `batches * 256` rows and returns each row's frequency.
fn frequencies(rb: &ReplayBuffer, rows: usize, batches: usize) -> Vec<f64> {
    let mut counts = vec![0u64; rows];
    for _ in 0..batches {
        for &i in rb.sample(256).unwrap().index() {
            counts[i as usize] += 1;
        }
    }
    let draws = (batches * 256) as f64;
    counts.iter().map(|&c| c as f64 / draws).collect()
}

/// The mass of each row relative to the smallest, from the importance weights of a
/// sample with `beta = 1` (a weight is `m_min / m_i`): `None` for a row not drawn.
fn mass_ratios(rb: &ReplayBuffer, rows: usize) -> Vec<Option<f64>> {
    let mut ratio = vec![None; rows];
    for _ in 0..50 {
        let b = rb.sample(256).unwrap();
        for (&i, &w) in b.index().iter().zip(b.weight().unwrap()) {
            assert!(w.is_finite() && w > 0.0, "row {i}: weight {w}");
            ratio[i as usize] = Some(1.0 / f64::from(w));
        }
    }
    ratio
}

fn assert_within(got: f64, want: f64, tolerance: f64, what: &str) {
    assert!(
        (got - want).abs() <= tolerance * want,
        "{what}: {got:e}, exactly {want:e} ({:+.3}%)",
        100.0 * (got - want) / want
    );
}

#[test]
fn tiny_priorities_alone_are_drawn_in_proportion() {
    for alpha in [1.0, 0.5] {
        let priorities = [1e-8, 2e-8];
        let rb = holding(&priorities, alpha);
        let want = exact(&priorities, alpha);
        let got = frequencies(&rb, 2, 4000);
        for i in 0..2 {
            assert_within(got[i], want[i], 0.01, &format!("alpha {alpha}: row {i}"));
        }
        let ratio = mass_ratios(&rb, 2);
        assert_within(
            ratio[1].unwrap(),
            2f64.powf(alpha),
            1e-4,
            &format!("alpha {alpha}: mass of 2e-8 over 1e-8"),
        );
    }
}

#[test]
fn huge_priorities_are_drawn_in_proportion_without_saturating() {
    // A million leaves in one shard: the old fixed point saturated at a mass of about
    // 1.7e7 there.
    for alpha in [1.0, 0.5] {
        let priorities = [1e7, 1e8];
        let rb = holding_in(1 << 20, &priorities, alpha);
        let want = exact(&priorities, alpha);
        let got = frequencies(&rb, 2, 8000);
        for i in 0..2 {
            assert_within(got[i], want[i], 0.01, &format!("alpha {alpha}: row {i}"));
        }
        let ratio = mass_ratios(&rb, 2);
        assert_within(
            ratio[1].unwrap(),
            10f64.powf(alpha),
            1e-4,
            &format!("alpha {alpha}: mass of 1e8 over 1e7"),
        );
    }
    // And past 2^48 units on a small buffer (1e9 at 20 fractional bits).
    let rb = holding(&[1e8, 1e9], 1.0);
    assert_within(mass_ratios(&rb, 2)[1].unwrap(), 10.0, 1e-4, "1e9 over 1e8");
}

#[test]
fn priorities_eight_decades_apart_keep_their_ratio() {
    for alpha in [1.0, 0.5] {
        let priorities = [1e-6, 1.0, 1e2];
        let rb = holding(&priorities, alpha);
        let want = exact(&priorities, alpha);
        // Row 0 is drawn once in 1e8 (alpha 1): its mass shows in the weights of the
        // others, whose normaliser it is.
        let ratio = mass_ratios(&rb, 3);
        for i in 1..3 {
            assert_within(
                ratio[i].unwrap(),
                want[i] / want[0],
                1e-3,
                &format!("alpha {alpha}: mass of row {i} over row 0"),
            );
        }
        let got = frequencies(&rb, 3, 4000);
        assert_within(got[2], want[2], 0.01, &format!("alpha {alpha}: row 2"));
        if alpha < 1.0 {
            assert_within(got[1], want[1], 0.01, &format!("alpha {alpha}: row 1"));
        }
    }
}

#[test]
fn every_decade_from_1e_minus_8_to_1e8_keeps_a_ratio_of_two() {
    for alpha in [1.0, 0.6, 0.25] {
        for decade in -8..=8 {
            let p = 10f64.powi(decade);
            let rb = holding(&[p, 2.0 * p], alpha);
            let ratio = mass_ratios(&rb, 2);
            assert_within(
                ratio[1].unwrap(),
                2f64.powf(alpha),
                1e-4,
                &format!("alpha {alpha}: mass of {:e} over {p:e}", 2.0 * p),
            );
        }
    }
}

#[test]
fn a_buffer_moves_its_scale_with_its_priorities() {
    // The same rows first at 1e8, then at 1e-8: the scale follows both ways, and the
    // ratios hold at each end. (New rows enter with the largest priority stored: with
    // the largest ever seen, 1e8, the scale would keep room for them instead.)
    let rb = buffer(
        4,
        Prioritized::new(1.0, 1.0)
            .eps(0.0)
            .max_priority_within_buffer(true),
    );
    rb.extend(&rows(&rb, 4)).unwrap();
    for scale in [1e8, 1e-8, 1e8, 1.0] {
        let priorities: Vec<f64> = (1..=4).map(|k| k as f64 * scale).collect();
        let all = rb.get_many(&[0, 1, 2, 3]).unwrap();
        rb.update_priority(all.index(), all.generations(), &priorities)
            .unwrap();
        let ratio = mass_ratios(&rb, 4);
        for (k, r) in ratio.iter().enumerate() {
            assert_within(
                r.unwrap(),
                (k + 1) as f64,
                1e-4,
                &format!("{scale:e}: row {k}"),
            );
        }
    }
}

#[test]
fn a_positive_priority_never_gets_zero_mass() {
    for p in [1e-300, 5e-324, 1e-45, 1e-30] {
        let rb = holding(&[p], 1.0);
        let b = rb
            .sample(4)
            .unwrap_or_else(|e| panic!("priority {p:e}: {e:?}"));
        assert_eq!(b.index(), [0, 0, 0, 0]);
        assert!(b.weight().unwrap().iter().all(|&w| w == 1.0));
    }
    // Beside a row 1e16 times heavier (past any integer sum's resolution), the tiny
    // row keeps some mass: drawable, never lost as a float sum loses it.
    let rb = holding(&[1e-8, 1e8], 1.0);
    let ratio = mass_ratios(&rb, 2);
    let heavy = ratio[1].unwrap();
    assert!(heavy.is_finite() && heavy > 1.0, "{heavy}");
    assert_eq!(rb.priority(0), Some(quantize(1e-8)));
    assert!((quantize(1e-8) - 1e-8).abs() < 1e-8 * 2.5e-7);
    // The largest finite priority, at alpha 1, and a zero beside it.
    let rb = holding(&[f64::MAX, 1.0, 0.0], 1.0);
    let ratio = mass_ratios(&rb, 3);
    assert!(ratio[1].is_none() || ratio[1].unwrap() < 1.0 + 1e-6);
    assert!(ratio[2].is_none(), "a zero priority was drawn");
}

#[test]
fn a_stale_update_65536_laps_late_is_dropped() {
    // The tree alone: an update computed for lap 0 of slot 0 arrives after the slot
    // was written 65,536 laps later (the same low 16 bits).
    let tree = OwnedTree::new(4);
    tree.set_run(0, &[(Leaf::new(0, 100), 1.0)]);
    tree.set_run(0, &[(Leaf::new(1 << 16, 200), 2.0)]);
    assert!(
        !tree.update(0, 0, 5, 0.5),
        "an update for lap 0 applied to lap 65536's row"
    );
    assert_eq!(tree.leaf(0).0, Leaf::new(1 << 16, 200));
    assert_eq!(tree.leaf(0).1, 2.0);
    assert_eq!(tree.total(), 200);
    assert!(tree.update(0, 1 << 16, 7, 0.7));
    assert_eq!(tree.total(), 7);
}

#[test]
fn rows_written_many_laps_on_keep_their_priority() {
    // An extend longer than the ring writes only its last lap: slot 0 goes from lap 0
    // straight to lap 40,000 (past half of 16 bits), and then exactly 65,536 laps on.
    let rb = buffer(2, Prioritized::new(1.0, 1.0).eps(0.0));
    rb.extend(&rows(&rb, 2)).unwrap();
    let first = rb.get_many(&[0, 1]).unwrap();
    for laps in [40_000usize, 65_536 - 40_000] {
        rb.extend(&rows(&rb, 2 * laps)).unwrap();
        assert_eq!(rb.priority(0), Some(1.0), "after {laps} more laps");
        assert_eq!(rb.priority(1), Some(1.0), "after {laps} more laps");
        let b = rb.sample(64).unwrap();
        assert_eq!(b.len(), 64);
    }
    // The rows sampled 65,536 laps ago are gone: their update is stale.
    let done = rb
        .update_priority(first.index(), first.generations(), &[5.0, 5.0])
        .unwrap();
    assert_eq!((done.applied, done.stale), (0, 2));
    assert_eq!((rb.priority(0), rb.priority(1)), (Some(1.0), Some(1.0)));
    // The live rows take updates.
    let now = rb.get_many(&[0, 1]).unwrap();
    let done = rb
        .update_priority(now.index(), now.generations(), &[3.0, 1.0])
        .unwrap();
    assert_eq!(done.applied, 2);
    assert_within(
        mass_ratios(&rb, 2)[0].unwrap(),
        3.0,
        1e-4,
        "row 0 over row 1",
    );
}

#[test]
fn set_alpha_racing_appends_and_updates_leaves_every_mass_current() {
    // Collectors and a learner keep writing while alpha changes back and forth
    // (sometimes to the value it has): once all stop, every leaf holds the mass of its
    // row's raw priority under the last alpha, and the trees are exact.
    let rb = with_td(256, 3);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for w in 0..2u32 {
            let (rb, stop) = (&rb, &stop);
            s.spawn(move || {
                let writer = rb.writer();
                let mut k = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut b = rb.batch([8]);
                    b.set("id", &[w; 8]).unwrap();
                    let td: Vec<f32> = (0..8).map(|j| ((k + j) % 97) as f32 * 0.37).collect();
                    b.set("td", &td).unwrap();
                    writer.extend(&b).unwrap();
                    k = k.wrapping_add(8);
                }
            });
        }
        {
            let (rb, stop) = (&rb, &stop);
            s.spawn(move || {
                let mut k = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(b) = rb.sample(32) {
                        let p: Vec<f64> = (0..32).map(|j| ((k + j) % 1000) as f64 * 1e-3).collect();
                        rb.update_priority(b.index(), b.generations(), &p).unwrap();
                    }
                    k += 32;
                }
            });
        }
        for round in 0..300 {
            rb.set_alpha([0.6, 0.6, 1.0, 0.3][round % 4]).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(replaybuf::internals::priorities_consistent(&rb));
    assert!(
        replaybuf::internals::masses_current(&rb),
        "a leaf keeps a mass of another alpha or priority than its row's"
    );
}

#[test]
fn an_update_racing_set_alpha_is_never_lost() {
    // A learner rewrites every row's priority, batch after batch, while alpha is set
    // again and again (to the value it has): each pass re-masses every leaf from its
    // raw priority. A pass that reads a raw priority before an update stores it must
    // not write it back, nor leave its mass beside the new priority.
    let rb = buffer(8, Prioritized::new(0.6, 1.0).eps(0.0));
    rb.extend(&rows(&rb, 8)).unwrap();
    let all = rb.get_many(&[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let last = std::thread::scope(|s| {
        let learner = s.spawn(|| {
            let mut p = vec![0.0; 8];
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || k < 1000 {
                for (j, p) in p.iter_mut().enumerate() {
                    *p = ((k * 8 + j as u64) % 997) as f64 * 0.01 + 0.01;
                }
                let done = rb
                    .update_priority(all.index(), all.generations(), &p)
                    .unwrap();
                assert_eq!(done.applied, 8);
                k += 1;
            }
            p
        });
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(1500) {
            rb.set_alpha(0.6).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        learner.join().unwrap()
    });
    for (i, &p) in last.iter().enumerate() {
        let got = rb.priority(i as u64).unwrap();
        assert!(
            (got - p).abs() <= p * 2.5e-7,
            "row {i}: priority {got}, last set {p}: an update was lost"
        );
    }
    assert!(replaybuf::internals::priorities_consistent(&rb));
    assert!(
        replaybuf::internals::masses_current(&rb),
        "a leaf disagrees with its row's priority"
    );
}

#[test]
fn a_pass_racing_an_updates_last_batch_leaves_its_masses() {
    // A pass (`set_alpha`) reads a chunk's raw priorities, works out their masses
    // together, then brings each leaf to its row's: an update that lands between the
    // two has set a new priority, and the pass must give that leaf the new priority's
    // mass, not the one it worked out. Episode after episode, the pass in progress
    // when the learner's last batch lands is the last to touch the leaves.
    let rb = buffer(8, Prioritized::new(0.6, 1.0).eps(0.0));
    rb.extend(&rows(&rb, 8)).unwrap();
    let all = rb.get_many(&[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    for episode in 0..100u64 {
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 0..10u64 {
                    let p: Vec<f64> = (0..8)
                        .map(|j| ((episode * 80 + k * 8 + j) % 997) as f64 * 0.01 + 0.01)
                        .collect();
                    rb.update_priority(all.index(), all.generations(), &p)
                        .unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                rb.set_alpha(0.6).unwrap();
            }
        });
        assert!(
            replaybuf::internals::masses_current(&rb),
            "episode {episode}: a leaf keeps a mass its raw priority no longer has"
        );
    }
    assert!(replaybuf::internals::priorities_consistent(&rb));
}

#[test]
fn an_extends_rows_each_get_the_mass_of_their_own_priority() {
    // New rows' masses are worked out a run at a time: an extend that wraps the ring
    // (two runs) into a buffer of two shards, every row a priority of its own.
    let rb = with_td(24, 5);
    let writer = rb.writer();
    for round in 0..5u32 {
        let mut b = rb.batch([10]);
        b.set("id", &[round; 10]).unwrap();
        let td: Vec<f32> = (0..10)
            .map(|j| 0.05 + (round * 10 + j) as f32 * 0.11)
            .collect();
        b.set("td", &td).unwrap();
        writer.extend(&b).unwrap();
        assert!(
            replaybuf::internals::masses_current(&rb),
            "round {round}: a new row's leaf holds another row's mass"
        );
    }
    assert!(replaybuf::internals::priorities_consistent(&rb));
}
