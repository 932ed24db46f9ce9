//! The concurrent segment trees against their locked twin: a decoded sequence of
//! inserts, priority updates (current or stale), clears and descents runs on both,
//! and every total, minimum, maximum, leaf and landing must agree.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use replaybuf::internals::sumtree::{Leaf, OwnedTree, ReferenceTree};

#[derive(Arbitrary, Debug)]
enum Op {
    /// New rows of `lap` at slots `first..`.
    Insert {
        first: u16,
        lap: u8,
        masses: Vec<u32>,
    },
    /// A priority update of slot `slot` for the row of `lap` (stale if another lap).
    Update {
        slot: u16,
        lap: u8,
        mass: u32,
    },
    /// Many updates at once, as one learner batch.
    Batch(Vec<(u16, u8, u32)>),
    Clear {
        slot: u16,
        tag: u8,
    },
    /// A descent for target `t`, as a fraction of the total.
    Descend(u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    leaves: u16,
    /// Masses are scaled by `1 << scale`, up to the tree's maximum.
    scale: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let n = usize::from(input.leaves % 300) + 1;
    let tree = OwnedTree::new(n);
    let twin = ReferenceTree::new(n);
    let max = tree.value_max();
    let mass = |m: u32| (u64::from(m) << (input.scale % 40)).min(max);
    for op in input.ops.iter().take(200) {
        match op {
            Op::Insert { first, lap, masses } => {
                let first = usize::from(*first) % n;
                let leaves: Vec<(Leaf, f64)> = masses
                    .iter()
                    .take(n - first)
                    .map(|&m| (Leaf::new(u32::from(*lap), mass(m)), f64::from(m)))
                    .collect();
                tree.set_run(first, &leaves);
                twin.set_run(first, &leaves);
            }
            Op::Update { slot, lap, mass: m } => {
                let slot = usize::from(*slot) % n;
                let (lap, m) = (u32::from(*lap), mass(*m));
                assert_eq!(
                    tree.update(slot, lap, m, 1.0),
                    twin.update(slot, lap, m, 1.0)
                );
            }
            Op::Batch(items) => {
                // The twin applies them in order; the tree applies a batch with its
                // ancestors' deltas gathered. A slot updated twice in one batch ends
                // with the later value in both.
                let items: Vec<(usize, u32, u64, f64)> = items
                    .iter()
                    .take(64)
                    .map(|&(slot, lap, m)| (usize::from(slot) % n, u32::from(lap), mass(m), 1.0))
                    .collect();
                let applied = tree.update_many(&items);
                for (&(slot, lap, m, raw), got) in items.iter().zip(applied) {
                    assert_eq!(
                        twin.update(slot, lap, m, raw),
                        got,
                        "batch update of slot {slot}"
                    );
                }
            }
            Op::Clear { slot, tag } => {
                let slot = usize::from(*slot) % n;
                tree.clear(slot, u32::from(*tag));
                twin.clear(slot, u32::from(*tag));
            }
            Op::Descend(fraction) => {
                let total = twin.total();
                if total > 0 {
                    let t = ((u128::from(total) * u128::from(*fraction)) >> 32) as u64;
                    let got = tree.descend(t);
                    assert_eq!(
                        got.map(|(slot, _, _)| slot),
                        twin.descend(t),
                        "target {t} of {total}"
                    );
                    assert!(got.is_some_and(|(_, m, _)| m > 0));
                }
            }
        }
        assert!(tree.is_consistent(), "an entry disagrees with its children");
        assert_eq!(tree.total(), twin.total());
        assert_eq!((tree.min(), tree.max()), (twin.min(), twin.max()));
    }
    for slot in 0..n {
        assert_eq!(tree.leaf(slot).0, twin.leaf(slot).0, "slot {slot}");
    }
});
