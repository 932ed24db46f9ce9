//! Frames stored once: a row rebuilt from the frames of several slots, racing the
//! collector that laps one of them, is never returned mixed.
#![cfg(replaybuf_loom)]

mod common;

use common::run_model;
use replaybuf::{Batch, DType, Frames, ReplayBuffer, Spec};

/// Stacks of 2 one-word "frames"; frame `i` is step `i`'s newest.
fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::U64, [2])
        .field("next_obs", DType::U64, [2])
        .field("done", DType::U8, [])
        .build()
        .expect("a valid spec")
}

/// Step `i` of one endless episode that began at step 1: `obs` the frames `i - 1`
/// and `i` (the first frame repeated at step 1), `next_obs` the frames `i`, `i + 1`.
fn step(rb: &ReplayBuffer, i: u64) -> Batch {
    let mut batch = rb.batch([1]);
    batch.set("obs", &[(i - 1).max(1), i]).expect("obs");
    batch.set("next_obs", &[i, i + 1]).expect("next_obs");
    batch
}

#[test]
fn a_rebuild_racing_the_collector_that_laps_its_frames_is_whole() {
    run_model("frames rebuild vs lapping extend", || {
        let rb = ReplayBuffer::builder(spec())
            .capacity(3)
            .seed(1)
            .frames(Frames::new().stack("obs", 2).next_of("obs", "next_obs"))
            .build()
            .expect("a valid buffer");
        for i in 1..=3 {
            rb.extend(&step(&rb, i)).unwrap();
        }
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || {
                // Step 4 laps step 1's slot, step 5 step 2's: the frames of the rows
                // a sample may have drawn.
                rb.extend(&step(&rb, 4)).unwrap();
                rb.extend(&step(&rb, 5)).unwrap();
            })
        };
        let batch = rb.sample(1).expect("one row can always be rebuilt");
        let obs = batch.column::<u64>("obs").unwrap();
        let next = batch.column::<u64>("next_obs").unwrap();
        let i = obs[1];
        assert!((1..=4).contains(&i), "step {i} cannot be rebuilt yet");
        assert_eq!(
            obs[0],
            (i - 1).max(1),
            "a stack mixed from two laps: {obs:?}"
        );
        assert_eq!(
            next,
            [i, i + 1],
            "a next stack mixed from two laps: {next:?}"
        );
        collector.join().unwrap();
    });
}

/// One row that ends its episode: `obs` `[i, i]`, `next_obs` `[i + 100, i + 100]`.
fn episode_end(rb: &ReplayBuffer, i: u64) -> Batch {
    let mut batch = rb.batch([1]);
    batch.set("obs", &[i, i]).expect("obs");
    batch
        .set("next_obs", &[i + 100, i + 100])
        .expect("next_obs");
    batch.set("done", &[1u8]).expect("done");
    batch
}

#[test]
fn two_appenders_ending_episodes_into_one_side_slot_write_it_in_turn() {
    // Both came to the one side slot at once and wrote their next values into it
    // together: a row's `next_obs` half its own, half the other's, under its tag.
    run_model("frames side slot vs two appenders", || {
        let rb = ReplayBuffer::builder(spec())
            .capacity(4)
            .seed(1)
            .frames(
                Frames::new()
                    .next_of("obs", "next_obs")
                    .ends("done", None)
                    .terminal_slots(1),
            )
            .build()
            .expect("a valid buffer");
        let appenders: Vec<_> = [1, 2]
            .into_iter()
            .map(|i| {
                let rb = rb.clone();
                loom::thread::spawn(move || {
                    rb.extend(&episode_end(&rb, i)).unwrap();
                })
            })
            .collect();
        // Every row stored now, each whole or left out.
        let batch = rb.read_all_in_order(None);
        let obs = batch.column::<u64>("obs").unwrap();
        let next = batch.column::<u64>("next_obs").unwrap();
        for (o, n) in obs.chunks(2).zip(next.chunks(2)) {
            assert_eq!(
                n,
                [o[0] + 100, o[0] + 100],
                "row {o:?} has another row's next value"
            );
        }
        for a in appenders {
            a.join().unwrap();
        }
    });
}
