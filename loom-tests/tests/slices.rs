//! Slice sampling: a window read racing the collector that laps it is never returned
//! torn or spanning two trajectories, and collectors sharing a ring hand trajectories
//! on in sequence order.
#![cfg(replaybuf_loom)]

mod common;

use common::{run_model, whole_rows};
use replaybuf::sampler::Slice;
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

/// `a == b` names the row; `traj` its trajectory.
fn spec() -> Spec {
    Spec::builder()
        .field("a", DType::U64, [])
        .field("b", DType::U64, [])
        .field("traj", DType::U64, [])
        .build()
        .expect("a valid spec")
}

/// Rows `(id, traj)`.
fn rows(rb: &ReplayBuffer, rows: &[(u64, u64)]) -> Batch {
    let mut batch = rb.batch([rows.len()]);
    let ids: Vec<u64> = rows.iter().map(|r| r.0).collect();
    let traj: Vec<u64> = rows.iter().map(|r| r.1).collect();
    batch.set("a", &ids).expect("field a");
    batch.set("b", &ids).expect("field b");
    batch.set("traj", &traj).expect("field traj");
    batch
}

fn buffer(capacity: usize, len: usize) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .sampler(Slice::slice_len(len).traj_key("traj"))
        .seed(1)
        .build()
        .expect("a valid buffer")
}

#[test]
fn a_window_racing_a_lapping_collector_is_whole() {
    run_model("slice sample vs lapping extend", || {
        let rb = buffer(3, 2);
        rb.extend(&rows(&rb, &[(0, 1), (1, 1), (2, 1)])).unwrap();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || {
                // Row 3 continues trajectory 1 over row 0; row 4 starts trajectory 2
                // over row 1. A window of 2 steps of trajectory 1 exists throughout.
                rb.extend(&rows(&rb, &[(3, 1)])).unwrap();
                rb.extend(&rows(&rb, &[(4, 2)])).unwrap();
            })
        };
        let batch = rb.sample(2).expect("a 2-step window is always stored");
        let ids = whole_rows(&batch);
        let traj = batch.column::<u64>("traj").unwrap();
        assert_eq!(ids[1], ids[0] + 1, "the window is not consecutive: {ids:?}");
        assert_eq!((traj[0], traj[1]), (1, 1), "the window spans trajectories");
        assert!(ids[1] <= 3);
        collector.join().unwrap();
    });
}

#[test]
fn collectors_sharing_a_ring_continue_one_trajectory() {
    run_model("two collectors, one lane, one trajectory", || {
        let rb = buffer(4, 2);
        let spawn = |id: u64| {
            let writer = rb.writer();
            loom::thread::spawn(move || {
                writer.extend(&rows(writer.buffer(), &[(id, 7)])).unwrap();
            })
        };
        let (a, b) = (spawn(10), spawn(20));
        a.join().unwrap();
        b.join().unwrap();
        // Both rows carry trajectory id 7 and are adjacent in the lane: one trajectory
        // of two steps, whichever collector claimed first.
        let batch = rb.sample(2).expect("the two rows are one trajectory");
        let ids = whole_rows(&batch);
        assert_eq!(ids, whole_rows(&rb.read_all_in_order(None)));
        let marks = batch.marks().unwrap();
        assert!(marks[0].is_start() && !marks[1].is_start());
    });
}
