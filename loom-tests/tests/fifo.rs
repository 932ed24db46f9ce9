//! Two learners taking from one FIFO queue while a collector writes it: a row comes
//! out at most once, whole, and only once it was written; rows come out in order.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::error::SampleError;
use replaybuf::sampler::Fifo;
use replaybuf::ReplayBuffer;

/// What a learner's sample of one row gave: its id, or nothing (the queue was empty).
fn take_one(rb: &ReplayBuffer) -> Vec<u64> {
    match rb.sample(1) {
        Ok(b) => whole_rows(&b),
        Err(SampleError::Empty) => Vec::new(),
        Err(e) => panic!("a FIFO sample failed: {e}"),
    }
}

#[test]
fn learners_racing_a_collector_take_each_row_once() {
    run_model("two FIFO learners, one collector", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(4)
            .sampler(Fifo)
            .seed(5)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[1], 0)).unwrap();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.extend(&pairs(&rb, &[1], 1)).unwrap())
        };
        let other = {
            let rb = rb.clone();
            loom::thread::spawn(move || take_one(&rb))
        };
        let mine = take_one(&rb);
        let theirs = other.join().unwrap();
        collector.join().unwrap();
        // Whatever a learner got is the oldest row not taken before it: row 0 goes
        // first, and nobody gets it twice.
        let mut ids: Vec<u64> = mine.iter().chain(&theirs).copied().collect();
        ids.sort_unstable();
        assert!(
            ids == [0] || ids == [0, 1],
            "taken: {mine:?} and {theirs:?}"
        );
        // What is left comes out afterwards, once.
        let mut rest = take_one(&rb);
        rest.extend(take_one(&rb));
        ids.extend(rest);
        assert_eq!(ids, [0, 1], "a row lost or handed out twice");
    });
}
