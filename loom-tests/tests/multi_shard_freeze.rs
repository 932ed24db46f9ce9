//! Writes that span every shard (a buffer-level extend of an ndim-2 storage,
//! `write_all`) racing a freeze and a swap. A freezer sets `FROZEN` on every shard and
//! then waits for each to drain; a writer that meets a frozen shard must leave every
//! shard it entered before it waits for the thaw (`Storage::enter_all`), or each waits
//! for the other forever (loom reports the deadlock as a model that never ends). The
//! write lands whole, before the freeze or after the thaw, and exactly once.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::internals::frozen_view;
use replaybuf::sampler::WithoutReplacement;
use replaybuf::ReplayBuffer;

/// Two environments in two shards, one step already written.
fn buffer() -> ReplayBuffer {
    let rb = ReplayBuffer::builder(pair_spec())
        .capacity(4)
        .ndim(2)
        .envs(2)
        .dim_extend(0)
        .shards(2)
        .seed(5)
        .build()
        .unwrap();
    rb.extend(&pairs(&rb, &[1, 2], 0)).unwrap();
    rb
}

#[test]
fn a_multi_shard_extend_racing_a_freeze_ends_whole() {
    run_model("buffer-level ndim-2 extend vs freeze", || {
        let rb = buffer();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.extend(&pairs(&rb, &[1, 2], 10)).unwrap())
        };
        let view = frozen_view(&rb);
        assert_eq!(
            view.writing, 0,
            "a slot was being written during the freeze"
        );
        // Both shards' steps of the extend, or neither, are in what the freeze saw.
        assert!(view.claimed == 2 || view.claimed == 4, "{view:?}");
        assert_eq!(view.published, view.claimed);
        collector.join().unwrap();
        assert_eq!(rb.len(), 4);
    });
}

#[test]
fn write_all_over_two_shards_racing_a_freeze_ends_whole() {
    run_model("write_all over two shards vs freeze", || {
        let rb = buffer();
        let editor = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.write_all(&pairs(&rb, &[2], 20), None).unwrap())
        };
        let view = frozen_view(&rb);
        assert_eq!(
            view.writing, 0,
            "a row was being rewritten during the freeze"
        );
        editor.join().unwrap();
        let mut ids = whole_rows(&rb.read_all_in_order(None));
        ids.sort_unstable();
        assert_eq!(ids, [20, 21]);
    });
}

#[test]
fn a_multi_shard_extend_racing_a_swap_lands_once() {
    run_model("buffer-level ndim-2 extend vs set_sampler", || {
        let rb = buffer();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.extend(&pairs(&rb, &[1, 2], 10)).unwrap())
        };
        rb.set_sampler(WithoutReplacement::new()).unwrap();
        collector.join().unwrap();
        let mut ids = whole_rows(&rb.read_all_in_order(None));
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 10, 11], "each row exactly once");
    });
}
