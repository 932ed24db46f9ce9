//! The prefetch handoff (`src/prefetch.rs`): a worker thread filling batches while the
//! learner takes them, a loader dropped with a batch in flight, and an epoch's end
//! handed over in its place. Loom explores the interleavings of the facade's mutex,
//! condition variables and threads underneath: no lost wakeup, no deadlock, no batch
//! torn or taken twice, and no worker left running after the loader is dropped.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::error::SampleError;
use replaybuf::sampler::WithoutReplacement;
use replaybuf::ReplayBuffer;

#[test]
fn the_learner_takes_whole_batches_from_a_worker() {
    run_model("prefetch handoff", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .seed(1)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[2], 0)).unwrap();
        let mut loader = rb.loader().batch_size(1).prefetch(1).build().unwrap();
        let mut batch = rb.batch([1]);
        for _ in 0..2 {
            loader.sample_into(&mut batch).unwrap();
            let ids = whole_rows(&batch);
            assert!(ids[0] < 2, "row {} was never written", ids[0]);
        }
        assert!(loader.ready() <= 1, "more than one batch prepared ahead");
        drop(loader);
    });
}

#[test]
fn dropping_the_loader_with_a_batch_in_flight() {
    run_model("prefetch shutdown", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .seed(2)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[1], 7)).unwrap();
        let loader = rb.loader().batch_size(1).prefetch(1).build().unwrap();
        // The worker may be waiting, mid-sample, or done: the drop stops and joins it
        // in every case (loom reports a deadlock or a leaked thread otherwise).
        drop(loader);
    });
}

#[test]
fn an_epoch_end_arrives_in_its_place_and_pauses_the_worker() {
    run_model("prefetch epoch end", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(1)
            .sampler(WithoutReplacement::new().shuffle(false))
            .seed(3)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[1], 5)).unwrap();
        let mut loader = rb.loader().batch_size(1).prefetch(1).build().unwrap();
        assert_eq!(whole_rows(&loader.sample().unwrap()), [5]);
        assert_eq!(loader.sample().unwrap_err(), SampleError::EpochEnd);
        // The worker waited for the learner to see the end: the next epoch starts now.
        assert_eq!(whole_rows(&loader.sample().unwrap()), [5]);
        drop(loader);
    });
}

#[test]
fn an_error_made_before_the_learner_asked_is_not_handed_over() {
    run_model("prefetch stale error", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .seed(4)
            .build()
            .unwrap();
        // The worker may sample the empty buffer before the rows arrive...
        let mut loader = rb.loader().batch_size(1).prefetch(1).build().unwrap();
        rb.extend(&pairs(&rb, &[1], 9)).unwrap();
        // ...but the learner asks after they did: it gets a batch, never `Empty`.
        assert_eq!(whole_rows(&loader.sample().unwrap()), [9]);
        drop(loader);
    });
}
