//! Freezing a storage (what `dumps` does while it copies the region): once the freeze
//! returns, no appender is inside any slot and no priority update is halfway up a
//! tree, whatever the interleaving; writers that arrive meanwhile wait for the thaw
//! and then finish.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model};
use replaybuf::internals::frozen_view;
use replaybuf::sampler::Prioritized;
use replaybuf::ReplayBuffer;

#[test]
fn a_freeze_waits_for_appenders_and_holds_new_ones() {
    run_model("freeze vs extend", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .seed(1)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[1], 0)).unwrap();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.extend(&pairs(&rb, &[2], 1)).unwrap())
        };
        let view = frozen_view(&rb);
        assert_eq!(
            view.writing, 0,
            "a slot was being written during the freeze"
        );
        // Every claimed row is published: the collector's extend is wholly before the
        // freeze or wholly after the thaw.
        assert_eq!(view.published, view.claimed.min(2));
        assert!(view.claimed == 1 || view.claimed == 3, "{view:?}");
        collector.join().unwrap();
        assert_eq!(rb.write_count(), 3);
    });
}

#[test]
fn a_freeze_waits_for_priority_updates() {
    run_model("freeze vs priority update", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .sampler(Prioritized::new(1.0, 0.5))
            .seed(1)
            .build()
            .unwrap();
        let written = rb.extend(&pairs(&rb, &[2], 0)).unwrap();
        let learner = {
            let rb = rb.clone();
            let g = [written.generation(0), written.generation(1)];
            loom::thread::spawn(move || {
                rb.update_priority(&[0, 1], &g, &[3.0, 5.0]).unwrap();
            })
        };
        let view = frozen_view(&rb);
        assert!(
            view.trees_consistent,
            "a tree was caught halfway through an update"
        );
        learner.join().unwrap();
        assert!(replaybuf::internals::priorities_consistent(&rb));
    });
}
