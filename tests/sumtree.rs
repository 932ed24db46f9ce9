//! The concurrent segment trees against their locked twin, and their arithmetic under
//! many concurrent updates: no drift, ever.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use proptest::prelude::*;
use replaybuf::internals::sumtree::{Leaf, OwnedTree, ReferenceTree};

/// Steps a xorshift generator.
fn xorshift(x: &mut u64) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
}

#[derive(Clone, Debug)]
enum Op {
    SetRun {
        first: usize,
        leaves: Vec<(u32, u64)>,
    },
    Update {
        i: usize,
        lap: u32,
        value: u64,
    },
    Clear {
        i: usize,
        lap: u32,
    },
}

fn ops(n: usize) -> impl Strategy<Value = Vec<Op>> {
    let value = prop_oneof![3 => 0u64..1000, 1 => Just(0u64), 1 => 0u64..u32::MAX as u64];
    prop::collection::vec(
        prop_oneof![
            (0..n, prop::collection::vec((0u32..4, value.clone()), 1..12)).prop_map(
                move |(first, mut leaves)| {
                    leaves.truncate(n - first);
                    Op::SetRun { first, leaves }
                }
            ),
            (0..n, 0u32..4, value).prop_map(|(i, lap, value)| Op::Update { i, lap, value }),
            (0..n, 0u32..4).prop_map(|(i, lap)| Op::Clear { i, lap }),
        ],
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn trees_match_the_locked_twin(n in 1usize..150, ops in ops(150)) {
        let tree = OwnedTree::new(n);
        let twin = ReferenceTree::new(n);
        let max = tree.value_max();
        for op in &ops {
            match op {
                Op::SetRun { first, leaves } => {
                    if *first >= n { continue; }
                    let leaves: Vec<(Leaf, f64)> = leaves
                        .iter()
                        .take(n - first)
                        .map(|&(lap, v)| (Leaf::new(lap, v.min(max)), v as f64))
                        .collect();
                    tree.set_run(*first, &leaves);
                    twin.set_run(*first, &leaves);
                }
                Op::Update { i, lap, value } => {
                    if *i >= n { continue; }
                    let v = (*value).min(max);
                    prop_assert_eq!(tree.update(*i, *lap, v, 1.0), twin.update(*i, *lap, v, 1.0));
                }
                Op::Clear { i, lap } => {
                    if *i >= n { continue; }
                    tree.clear(*i, *lap);
                    twin.clear(*i, *lap);
                }
            }
            prop_assert!(tree.is_consistent());
            prop_assert_eq!(tree.total(), twin.total());
            prop_assert_eq!(tree.min(), twin.min());
            prop_assert_eq!(tree.max(), twin.max());
            for i in 0..n {
                prop_assert_eq!(tree.leaf(i), twin.leaf(i));
            }
        }
        // Every target lands where the plain scan says, on a leaf with mass.
        let total = twin.total();
        let step = (total / 500).max(1);
        let mut t = 0;
        while t < total {
            let got = tree.descend(t);
            prop_assert_eq!(got.map(|(i, _, _)| i), twin.descend(t), "target {}", t);
            prop_assert!(got.is_some_and(|(_, v, _)| v > 0));
            t += step;
        }
        // A target past the total (a racing update shrank the tree under a sampler)
        // clamps to the last leaf with mass instead of falling off the end.
        let last = (0..n).rev().find(|&i| twin.leaf(i).0.value() > 0);
        prop_assert_eq!(tree.descend(total).map(|(i, _, _)| i), last);
    }
}

/// 10^7 random updates from two threads at once, then the root is exactly the sum of
/// the leaves and every entry of all three trees agrees with its children.
#[test]
fn ten_million_updates_do_not_drift() {
    const LEAVES: usize = 1 << 16;
    const UPDATES: usize = 10_000_000;
    let tree = OwnedTree::new(LEAVES);
    let max = tree.value_max();
    let initial: Vec<(Leaf, f64)> = (0..LEAVES)
        .map(|i| (Leaf::new(0, (i as u64 * 7919) % 5000 + 1), 1.0))
        .collect();
    tree.set_run(0, &initial);
    std::thread::scope(|s| {
        for thread in 0..2u64 {
            let tree = &tree;
            s.spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ thread;
                for _ in 0..UPDATES / 2 {
                    xorshift(&mut x);
                    let i = (x % LEAVES as u64) as usize;
                    // Masses across 12 orders of magnitude, zero included.
                    let value = match x >> 60 {
                        0 => 0,
                        1 => max,
                        k => (x >> 20) % (1 << (4 * k.min(11))),
                    };
                    tree.update(i, 0, value.min(max), value as f64);
                }
            });
        }
    });
    let exact: u64 = (0..LEAVES)
        .map(|i| tree.leaf(i).0.value())
        .fold(0, u64::wrapping_add);
    assert_eq!(
        tree.total(),
        exact,
        "the root drifted from the sum of the leaves"
    );
    assert!(
        tree.is_consistent(),
        "some entry disagrees with its children"
    );
    let min = (0..LEAVES)
        .map(|i| tree.leaf(i).0.value())
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(u64::MAX);
    assert_eq!(tree.min(), min);
    assert_eq!(
        tree.max(),
        (0..LEAVES).map(|i| tree.leaf(i).0.value()).max().unwrap()
    );
}

/// Two threads updating the same few leaves, each raising and lowering them across
/// orders of magnitude, so that updates of one leaf race each other up the min and max
/// trees (a lowering that climbs while a raise of its own leaf refreshes, the race that
/// the loom model `a_climb_whose_leaf_moved_on_refreshes_instead` pins). Checked
/// every round, once both threads have finished it.
#[test]
fn contended_updates_of_the_same_leaves_keep_the_extrema_exact() {
    const LEAVES: usize = 40;
    const ROUNDS: usize = 200;
    const UPDATES: usize = 5_000;
    let tree = OwnedTree::new(LEAVES);
    let initial: Vec<(Leaf, f64)> = (0..LEAVES).map(|_| (Leaf::new(0, 1000), 1.0)).collect();
    tree.set_run(0, &initial);
    for round in 0..ROUNDS as u64 {
        std::thread::scope(|s| {
            for thread in 0..2u64 {
                let tree = &tree;
                s.spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (round << 8) ^ thread;
                    for _ in 0..UPDATES {
                        xorshift(&mut x);
                        let i = (x % LEAVES as u64) as usize;
                        let value = match x >> 61 {
                            0 => 0,
                            k => (x >> 20) % (1 << (3 * k)) + 1,
                        };
                        tree.update(i, 0, value, value as f64);
                    }
                });
            }
        });
        let values: Vec<u64> = (0..LEAVES).map(|i| tree.leaf(i).0.value()).collect();
        assert!(tree.is_consistent(), "round {round}: {values:?}");
        let min = values.iter().copied().filter(|&v| v > 0).min();
        assert_eq!(tree.min(), min.unwrap_or(u64::MAX), "round {round}");
        assert_eq!(tree.max(), values.iter().copied().max().unwrap_or(0));
    }
}

/// Descents racing updates always land on a leaf that has mass when they read it.
#[test]
fn descents_racing_updates_land_on_mass() {
    const LEAVES: usize = 4096;
    let tree = OwnedTree::new(LEAVES);
    let leaves: Vec<(Leaf, f64)> = (0..LEAVES)
        .map(|i| (Leaf::new(0, (i % 3) as u64 * 100), 1.0))
        .collect();
    tree.set_run(0, &leaves);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (tree, stop) = (&tree, &stop);
        s.spawn(move || {
            let mut x = 12345u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                xorshift(&mut x);
                tree.update((x % LEAVES as u64) as usize, 0, (x >> 40) % 3 * 100, 1.0);
            }
        });
        let mut landed = 0;
        for k in 0..200_000u64 {
            let total = tree.total();
            if total == 0 {
                continue;
            }
            if let Some((_, value, _)) = tree.descend(k.wrapping_mul(0x9e37_79b9) % total) {
                assert!(value > 0, "a descent landed on a leaf without mass");
                landed += 1;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(landed > 190_000, "only {landed} of 200000 descents landed");
    });
    assert!(tree.is_consistent());
}
