//! The concurrent segment trees (`sumtree/`) under every interleaving loom explores: a
//! descent racing a priority update, a new row's insert racing an update for the row
//! it replaces, and, through the public API, a stale update dropped rather than
//! applied to the newer row, and `set_alpha` racing a collector or an update: every
//! leaf ends with its raw priority's mass under the last alpha; and collectors storing
//! their leaves plainly (`sumtree/tree.rs`, "Plain leaves") beside a lapping collector
//! or an update, and whole nodes with the entries above them beside an update of one
//! of the new rows or of a row beside them, or after a collector looked again and
//! found an update gone.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model};
use loom::sync::Arc;
use replaybuf::internals::sumtree::{Leaf, OwnedTree};
use replaybuf::sampler::Prioritized;
use replaybuf::ReplayBuffer;

/// A 4-leaf tree (arity 2 under loom: sum entries over leaves 0-1 and 2-3 at level 1,
/// the min and max trees' lowest level the root, over all four) holding `masses`, all
/// of lap 0, each with its mass as its priority.
fn four_leaves(masses: [u64; 4]) -> Arc<OwnedTree> {
    leaves_of(&masses)
}

/// A tree of `masses.len()` leaves, as [`four_leaves`]. Of eight, the min and max
/// trees have two levels: entries over leaves 0-3 and 4-7, and the root.
fn leaves_of(masses: &[u64]) -> Arc<OwnedTree> {
    let tree = OwnedTree::new(masses.len());
    let leaves: Vec<(Leaf, f64)> = masses
        .iter()
        .map(|&m| (Leaf::new(0, m), m as f64))
        .collect();
    tree.set_run(0, &leaves);
    Arc::new(tree)
}

#[test]
fn a_descent_racing_an_update_lands_on_mass() {
    run_model("descent vs update (4 leaves)", || {
        let tree = four_leaves([1, 2, 3, 4]);
        let updater = {
            let tree = tree.clone();
            loom::thread::spawn(move || {
                assert!(tree.update(1, 0, 0, 0.0), "leaf 1 belongs to lap 0");
                assert!(tree.update(3, 0, 9, 9.0));
            })
        };
        // Targets across the old total: each lands on a leaf that has mass when the
        // descent reads it, or is rejected, never lands on an empty leaf.
        for t in [0, 2, 5, 9] {
            if let Some((leaf, mass, lap)) = tree.descend(t) {
                assert!(mass > 0, "target {t} landed on empty leaf {leaf}");
                assert_eq!(lap, 0);
            }
        }
        updater.join().unwrap();
        assert!(tree.is_consistent(), "an entry disagrees with its children");
        assert_eq!(tree.total(), 1 + 3 + 9);
        assert_eq!((tree.min(), tree.max()), (1, 9));
    });
}

#[test]
fn an_insert_racing_an_update_for_the_replaced_row() {
    run_model("insert vs stale update", || {
        let tree = four_leaves([1, 2, 3, 4]);
        // A collector writes lap 1's row into slot 2 while a learner updates lap 0's.
        let writer = {
            let tree = tree.clone();
            loom::thread::spawn(move || tree.set_run(2, &[(Leaf::new(1, 7), 7.0)]))
        };
        let applied = tree.update(2, 0, 5, 5.0);
        writer.join().unwrap();
        // Whatever the order, the slot ends with the new row's leaf: an update applied
        // before the insert was overwritten, one after it found another lap.
        assert_eq!(tree.leaf(2).0, Leaf::new(1, 7), "applied: {applied}");
        assert!(tree.is_consistent());
        assert_eq!(tree.total(), 1 + 2 + 7 + 4);
    });
}

#[test]
fn a_stale_update_never_lands_on_the_new_row() {
    run_model("update_priority vs lapping extend", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .sampler(Prioritized::new(1.0, 0.5))
            .seed(6)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[2], 0)).unwrap();
        let old = rb.get(0).unwrap();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.extend(&pairs(&rb, &[1], 2)).unwrap())
        };
        // A priority below the initial 1.0, so it never becomes the new row's default.
        let done = rb
            .update_priority(old.index(), old.generations(), &[0.25])
            .unwrap();
        collector.join().unwrap();
        assert_eq!(done.applied + done.stale, 1);
        assert_eq!(
            rb.priority(0),
            Some(1.0),
            "the new row keeps its own priority ({done:?}, {:?})",
            replaybuf::internals::leaf_and_raw(&rb, 0)
        );
        assert_eq!(rb.priority(1), Some(1.0));
    });
}

/// A one-row buffer whose rows carry their priorities (field `p`, alpha 1): masses
/// that differ from row to row, so that a leaf's change counted twice or lost shows
/// in the sums.
fn one_row_with_priorities() -> ReplayBuffer {
    rows_with_priorities(1)
}

/// [`one_row_with_priorities`] of `capacity` rows: a node of the tree (two leaves
/// under loom) for two, a node for each pair and a root above them for four.
fn rows_with_priorities(capacity: usize) -> ReplayBuffer {
    let spec = replaybuf::Spec::builder()
        .field("a", replaybuf::DType::U64, [])
        .field("b", replaybuf::DType::U64, [])
        .field("p", replaybuf::DType::F64, [])
        .build()
        .unwrap();
    ReplayBuffer::builder(spec)
        .capacity(capacity)
        .sampler(Prioritized::new(1.0, 0.5).eps(0.0))
        .priority_key("p")
        .seed(6)
        .build()
        .unwrap()
}

/// Row `id` of priority `p`, for [`one_row_with_priorities`].
fn row_of(rb: &ReplayBuffer, id: u64, p: f64) -> replaybuf::Batch {
    rows_of(rb, id, &[p])
}

/// Rows `id, id + 1, ...` of priorities `p`, for [`rows_with_priorities`].
fn rows_of(rb: &ReplayBuffer, id: u64, p: &[f64]) -> replaybuf::Batch {
    let mut batch = pairs(rb, &[p.len()], id);
    batch.set("p", p).unwrap();
    batch
}

/// Every leaf holds the mass of its row's raw priority, and every entry of the trees
/// agrees with its children.
fn assert_trees_exact(rb: &ReplayBuffer) {
    assert!(
        replaybuf::internals::masses_current(rb),
        "a leaf is not its raw priority's mass"
    );
    assert!(
        replaybuf::internals::priorities_consistent(rb),
        "an entry disagrees with its children"
    );
}

/// `rb.update_priority` of `row` to `p`, on a thread of its own, while this thread
/// runs `beside`: what the update did.
fn update_beside(
    rb: &ReplayBuffer,
    row: replaybuf::Batch,
    p: f64,
    beside: impl FnOnce(),
) -> replaybuf::PriorityUpdate {
    let learner = {
        let rb = rb.clone();
        loom::thread::spawn(move || {
            rb.update_priority(row.index(), row.generations(), &[p])
                .unwrap()
        })
    };
    beside();
    learner.join().unwrap()
}

#[test]
fn collectors_lapping_each_other_on_one_ring_keep_the_sums_exact() {
    run_model("two collectors' leaves on one slot", || {
        let rb = one_row_with_priorities();
        rb.extend(&row_of(&rb, 0, 1.0)).unwrap();
        // Each replaces the row the other may be replacing: one takes the leaf turn
        // after its claim and may store its leaf plainly; the other, whichever lap it
        // writes, waits for the turn before touching the leaf, or finds the turn's
        // holder counted and the leaves compare-exchanged.
        let other = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.writer().extend(&row_of(&rb, 1, 2.0)).unwrap())
        };
        rb.writer().extend(&row_of(&rb, 2, 4.0)).unwrap();
        other.join().unwrap();
        let last = rb.get(0).unwrap();
        let p = if last.column::<u64>("a").unwrap()[0] == 1 {
            2.0
        } else {
            4.0
        };
        assert_eq!(rb.priority(0), Some(p));
        assert!(
            replaybuf::internals::masses_current(&rb),
            "the leaf is not the last row's: {:?}",
            replaybuf::internals::leaf_and_raw(&rb, 0)
        );
        assert!(replaybuf::internals::priorities_consistent(&rb));
    });
}

#[test]
fn an_update_racing_a_collector_that_stores_its_leaf_plainly() {
    run_model("update_priority vs extend (plain leaves)", || {
        let rb = one_row_with_priorities();
        rb.extend(&row_of(&rb, 0, 1.0)).unwrap();
        let old = rb.get(0).unwrap();
        // Counted before the collector's check, the update marked its leaf's run, the
        // collector's, and the collector compare-exchanges it; counted after, it finds
        // the new row's raw word and is dropped.
        let done = update_beside(&rb, old, 8.0, || {
            rb.writer().extend(&row_of(&rb, 1, 2.0)).unwrap();
        });
        assert_eq!(done.applied + done.stale, 1);
        assert_eq!(rb.priority(0), Some(2.0), "{done:?}");
        assert_trees_exact(&rb);
    });
}

#[test]
fn an_update_of_a_new_row_racing_a_collector_that_stores_its_node_plainly() {
    run_model(
        "update_priority of a new row vs extend (plain node)",
        || {
            let rb = rows_with_priorities(2);
            rb.extend(&rows_of(&rb, 0, &[1.0, 3.0])).unwrap();
            // The generation row 0 will have once replaced: the same writes to a twin.
            let twin = rows_with_priorities(2);
            twin.extend(&rows_of(&twin, 0, &[1.0, 3.0])).unwrap();
            twin.extend(&rows_of(&twin, 2, &[2.0, 5.0])).unwrap();
            let new = twin.get(0).unwrap();
            // The collector sets both leaves of the node and the entries above them with
            // plain stores, entries first; an update of the new row that found its leaf
            // set adds its change to the entries after theirs. One that came before the
            // row was published is refused, and one before its leaf was set is dropped.
            let learner = {
                let rb = rb.clone();
                loom::thread::spawn(move || {
                    rb.update_priority(new.index(), new.generations(), &[8.0])
                        .map(|done| done.applied)
                        .unwrap_or(0)
                })
            };
            rb.writer().extend(&rows_of(&rb, 2, &[2.0, 5.0])).unwrap();
            let applied = learner.join().unwrap();
            let p0 = if applied == 1 { 8.0 } else { 2.0 };
            assert_eq!(rb.priority(0), Some(p0));
            assert_eq!(rb.priority(1), Some(5.0));
            assert!(
                replaybuf::internals::masses_current(&rb),
                "a leaf is not its row's: {:?}",
                replaybuf::internals::leaf_and_raw(&rb, 0)
            );
            assert!(
                replaybuf::internals::priorities_consistent(&rb),
                "an entry disagrees with its leaves (update applied: {applied})"
            );
        },
    );
}

#[test]
fn an_update_beside_a_plain_node_meets_it_at_the_root() {
    run_model(
        "update_priority vs extend (plain node, shared root)",
        || {
            let rb = rows_with_priorities(4);
            rb.extend(&rows_of(&rb, 0, &[1.0, 3.0, 6.0, 7.0])).unwrap();
            assert!(replaybuf::internals::priorities_consistent(&rb));
            let row2 = rb.get(2).unwrap();
            // The collector replaces rows 0 and 1 (the root's min, 1, goes with them)
            // while the learner lowers row 2 below the collector's new rows: both carry
            // their node's change to the root, the collector after storing its node's
            // entries plainly, whether it found the learner gone, not yet counted, or
            // counted with row 2's run marked.
            let done = update_beside(&rb, row2, 1.5, || {
                rb.writer().extend(&rows_of(&rb, 4, &[2.0, 5.0])).unwrap();
            });
            assert_eq!(done.applied, 1);
            assert_eq!(rb.priority(2), Some(1.5));
            assert_trees_exact(&rb);
        },
    );
}

#[test]
fn an_update_of_a_sibling_beside_a_collector_storing_a_leaf_plainly() {
    run_model("update_priority vs extend (plain leaf, same node)", || {
        let rb = rows_with_priorities(4);
        rb.extend(&rows_of(&rb, 0, &[1.0, 3.0, 6.0, 7.0])).unwrap();
        let row1 = rb.get(1).unwrap();
        // The collector replaces row 0 alone while the learner lowers row 1, its
        // sibling under one node, below both. Counted with row 1's run marked, the
        // learner compare-exchanges its leaf beside the collector's plain load and
        // store of row 0's (a run not marked), and both carry their change into the
        // node they share, and up.
        let done = update_beside(&rb, row1, 0.5, || {
            rb.writer().extend(&rows_of(&rb, 4, &[2.0])).unwrap();
        });
        assert_eq!(done.applied, 1);
        assert_eq!(rb.priority(0), Some(2.0));
        assert_eq!(rb.priority(1), Some(0.5));
        assert_trees_exact(&rb);
    });
}

#[test]
fn two_learners_marking_beside_a_collector_storing_a_node_plainly() {
    run_model("two update_priority vs extend (two sets of marks)", || {
        let rb = rows_with_priorities(4);
        rb.extend(&rows_of(&rb, 0, &[1.0, 3.0, 6.0, 7.0])).unwrap();
        let (row1, row3) = (rb.get(1).unwrap(), rb.get(3).unwrap());
        // Each learner holds a set of marks of its own, whichever comes first. The
        // collector replaces rows 0 and 1, one node: finding both learners counted and
        // both their sets of marks set, it finds row 1's run marked in one of them and
        // compare-exchanges the node's leaves beside the second learner's update of
        // the old row 1 (applied before the collector's raw word, or dropped after
        // it), while the first lowers row 3, in the other node.
        let mut second = None;
        let first = update_beside(&rb, row3, 0.25, || {
            second = Some(update_beside(&rb, row1, 0.5, || {
                rb.writer().extend(&rows_of(&rb, 4, &[2.0, 5.0])).unwrap();
            }));
        });
        assert_eq!(first.applied, 1);
        let second = second.unwrap();
        assert_eq!(second.applied + second.stale, 1);
        assert_eq!(rb.priority(0), Some(2.0));
        assert_eq!(rb.priority(1), Some(5.0));
        assert_eq!(rb.priority(3), Some(0.25));
        assert_trees_exact(&rb);
    });
}

#[test]
fn a_collector_that_finds_an_update_gone_stores_the_rest_plainly() {
    run_model("update_priority vs extend (plain after a look)", || {
        let rb = rows_with_priorities(4);
        rb.extend(&rows_of(&rb, 0, &[1.0, 3.0, 6.0, 7.0])).unwrap();
        let row3 = rb.get(3).unwrap();
        // The collector replaces all four rows, two nodes. Finding the learner
        // counted and row 3's run marked, it stores the first node whole and
        // compare-exchanges the second's leaves. Finding it counted before its marks
        // are set, it compare-exchanges the first node's leaves, and looks again
        // before the second: the learner gone, it stores that node whole, over the
        // leaf the learner changed (an update of the old row 3, applied before the
        // collector's raw word, or dropped after it).
        let done = update_beside(&rb, row3, 0.5, || {
            rb.writer()
                .extend(&rows_of(&rb, 4, &[2.0, 5.0, 4.0, 8.0]))
                .unwrap();
        });
        assert_eq!(done.applied + done.stale, 1);
        assert_eq!(
            rb.priority(3),
            Some(8.0),
            "{:?} {:?}",
            replaybuf::internals::leaf_and_raw(&rb, 3),
            rb.get(3).unwrap().column::<u64>("a").unwrap()
        );
        assert_trees_exact(&rb);
    });
}

/// Leaves of masses 5, 6, 7, 8, one thread setting leaf 0, the minimum, to `first`,
/// the other setting leaf `other` to `to`: a raise racing a lowering below the same
/// entry or a cousin's, or two lowerings meeting at the root. Whatever the
/// interleaving, every entry ends equal to its children's extremum.
fn two_updates_race(first: u64, other: usize, to: u64) {
    two_updates_race_from([5, 6, 7, 8], first, other, to);
}

/// [`two_updates_race`] from leaves of `masses`.
fn two_updates_race_from(masses: [u64; 4], first: u64, other: usize, to: u64) {
    two_updates_race_over(&masses, first, other, to);
}

/// [`two_updates_race`] from any number of leaves.
fn two_updates_race_over(masses: &[u64], first: u64, other: usize, to: u64) {
    let tree = leaves_of(masses);
    let setter = {
        let tree = tree.clone();
        loom::thread::spawn(move || assert!(tree.update(0, 0, first, 1.0)))
    };
    assert!(tree.update(other, 0, to, 1.0));
    setter.join().unwrap();
    assert!(
        tree.is_consistent(),
        "a min or max entry disagrees with its children"
    );
    let mut masses = masses.to_vec();
    (masses[0], masses[other]) = (first, to);
    let (min, max) = (masses.iter().min(), masses.iter().max());
    assert_eq!((tree.min(), tree.max()), (*min.unwrap(), *max.unwrap()));
}

#[test]
fn sibling_updates_keep_the_min_tree_exact() {
    // Leaves 0 and 1 share their min entry (the root), whose min is 5. One raises the
    // old minimum; the other lowers its sibling to that same value, finds the entry
    // already right, and stops. If the first could store the entry it computed before
    // the second's change without checking again, the entry would stay 6 above
    // children 9 and 5.
    run_model("two updates under one min entry", || {
        two_updates_race(9, 1, 5)
    });
}

#[test]
fn a_sibling_climbing_past_a_refresh_keeps_the_min_tree_exact() {
    run_model("climb vs refresh, one entry", || two_updates_race(9, 1, 2));
}

#[test]
fn a_cousin_climbing_to_the_root_past_a_refresh_keeps_the_min_tree_exact() {
    run_model("climb vs refresh, to the root", || {
        two_updates_race(9, 3, 1)
    });
}

/// A refresh whose entry another update changes between its store and its
/// verification: the raiser takes leaf 0 from 5 to 9 and stores entry 9; the other
/// lowers leaf 1 from 9 to 6. Whoever changed the entry last carries it to the root,
/// or the root stays 5 over children 6 and 7.
#[test]
fn a_refresh_that_a_climb_overtook_still_carries_its_change_up() {
    run_model("refresh overtaken by a climb", || {
        two_updates_race_from([5, 9, 7, 8], 9, 1, 6)
    });
}

/// Two lowerings meeting at the root: the lesser must not land last.
#[test]
fn two_climbs_to_the_root_keep_the_better() {
    run_model("climb vs climb", || two_updates_race(2, 3, 1));
}

/// The races above where the min and max trees have two levels (eight leaves): the
/// raise of leaf 0, the minimum, refreshes the entry over leaves 0-3 and then the
/// root, while leaf 4 climbs from the entry over 4-7 to the root.
#[test]
fn a_cousin_climbing_past_a_refresh_of_two_levels_keeps_the_min_tree_exact() {
    run_model("climb vs refresh, two levels", || {
        two_updates_race_over(&[5, 6, 7, 8, 9, 10, 11, 12], 13, 4, 1)
    });
}

/// Two lowerings under different entries of the lowest level, meeting at the root.
#[test]
fn two_climbs_of_two_levels_keep_the_better() {
    run_model("climb vs climb, two levels", || {
        two_updates_race_over(&[5, 6, 7, 8, 9, 10, 11, 12], 2, 4, 1)
    });
}

/// Two updates of one leaf: one lowers it from 5 to 2, below the entries above (a
/// climb), the other raises it to 9. The raise may find the entries not yet lowered
/// and so nothing of its own to carry; the climb that then lowers them must see its
/// leaf moved on and refresh them from the children, or the min tree keeps a 2 that
/// no leaf holds.
#[test]
fn a_climb_whose_leaf_moved_on_refreshes_instead() {
    run_model("climb vs a raise of its own leaf", || {
        let tree = four_leaves([5, 6, 7, 8]);
        let lowerer = {
            let tree = tree.clone();
            loom::thread::spawn(move || assert!(tree.update(0, 0, 2, 2.0)))
        };
        assert!(tree.update(0, 0, 9, 9.0));
        lowerer.join().unwrap();
        let last = tree.leaf(0).0.value();
        assert!(last == 2 || last == 9, "leaf 0 holds {last}");
        assert!(
            tree.is_consistent(),
            "a min or max entry disagrees with its children (leaf 0 ended {last})"
        );
        assert_eq!((tree.min(), tree.max()), (last.min(6), last.max(8)));
    });
}

/// A buffer of two rows at alpha 1, the largest priority seen raised to 4 (so that a
/// new row's mass differs between alphas), and the generation of row 0.
fn two_rows_seen_4() -> (ReplayBuffer, replaybuf::Batch) {
    let rb = ReplayBuffer::builder(pair_spec())
        .capacity(2)
        .sampler(Prioritized::new(1.0, 0.5).eps(0.0))
        .seed(6)
        .build()
        .unwrap();
    rb.extend(&pairs(&rb, &[2], 0)).unwrap();
    let row1 = rb.get(1).unwrap();
    rb.update_priority(row1.index(), row1.generations(), &[4.0])
        .unwrap();
    let row0 = rb.get(0).unwrap();
    (rb, row0)
}

#[test]
fn set_alpha_racing_an_append_leaves_the_new_alpha() {
    run_model("set_alpha vs extend", || {
        let (rb, _) = two_rows_seen_4();
        // The collector replaces row 0 with a row of priority 4 (the largest seen),
        // whose mass is 4 units at alpha 1 and 2 at alpha 0.5.
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.extend(&pairs(&rb, &[1], 2)).unwrap())
        };
        rb.set_alpha(0.5).unwrap();
        collector.join().unwrap();
        assert_eq!(rb.priority(0), Some(4.0));
        assert!(
            replaybuf::internals::masses_current(&rb),
            "a leaf kept a mass of the old alpha: {:?}",
            replaybuf::internals::leaf_and_raw(&rb, 0)
        );
        assert!(replaybuf::internals::priorities_consistent(&rb));
    });
}

#[test]
fn an_update_racing_set_alpha_keeps_leaf_and_priority_agreeing() {
    run_model("update vs set_alpha (same alpha)", || {
        let (rb, row0) = two_rows_seen_4();
        // The same alpha again still re-masses every leaf: a pass that read row 0's
        // leaf after the update set it, but its raw priority before, would leave the
        // old priority's mass beside the new priority.
        let done = update_beside(&rb, row0, 2.0, || rb.set_alpha(1.0).unwrap());
        assert_eq!(done.applied, 1);
        assert_eq!(rb.priority(0), Some(2.0));
        assert!(
            replaybuf::internals::masses_current(&rb),
            "row 0's leaf disagrees with its priority: {:?}",
            replaybuf::internals::leaf_and_raw(&rb, 0)
        );
        assert!(replaybuf::internals::priorities_consistent(&rb));
    });
}
