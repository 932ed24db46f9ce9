//! A swap racing a collector: whatever the interleaving, the collector's row ends up
//! in the buffer's new storage exactly once and whole. Its extend lands in the old
//! storage before the swap copies it, or, having found the old storage frozen or
//! retired, is redone on the new one; it is never left in the retired storage, nor
//! written twice. Fails if an appender skips the retirement check after it enters
//! (`Storage::enter_append`), or if a swap thaws the old storage before retiring it.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::sampler::WithoutReplacement;
use replaybuf::swap::StorageConfig;
use replaybuf::{ReplayBuffer, WritePolicy};

fn buffer() -> ReplayBuffer {
    let rb = ReplayBuffer::builder(pair_spec())
        .capacity(4)
        .seed(1)
        .build()
        .expect("a valid buffer");
    rb.extend(&pairs(&rb, &[1], 0)).unwrap();
    rb
}

/// Runs `swap` on this thread while a collector's writer handle extends row 1; then
/// checks rows 0 and 1 are each stored exactly once.
fn extend_racing(swap: fn(&ReplayBuffer)) {
    let rb = buffer();
    let writer = rb.writer();
    let collector = {
        let rb = rb.clone();
        loom::thread::spawn(move || {
            writer.extend(&pairs(&rb, &[1], 1)).unwrap();
        })
    };
    swap(&rb);
    collector.join().unwrap();
    let mut ids = whole_rows(&rb.read_all_in_order(None));
    ids.sort_unstable();
    assert_eq!(ids, [0, 1], "each row exactly once in the new storage");
    assert_eq!(rb.len(), 2);
}

#[test]
fn an_extend_racing_a_copy_into_a_new_storage_lands_once() {
    run_model("extend vs set_storage", || {
        extend_racing(|rb| {
            rb.set_storage(StorageConfig::heap().capacity(8)).unwrap();
            assert_eq!(rb.capacity(), 8);
        });
    });
}

#[test]
fn an_extend_racing_an_in_place_swap_to_immutable_lands_before_it_or_not_at_all() {
    run_model("extend vs set_writer(Immutable) (in place)", || {
        let rb = buffer();
        let writer = rb.writer();
        let collector = {
            let rb = rb.clone();
            loom::thread::spawn(move || writer.extend(&pairs(&rb, &[1], 1)).is_ok())
        };
        rb.set_write_policy(WritePolicy::Immutable).unwrap();
        // Once the swap returns, nothing is written: the rows now are the rows for good.
        let now = whole_rows(&rb.read_all_in_order(None));
        let written = collector.join().unwrap();
        assert_eq!(whole_rows(&rb.read_all_in_order(None)), now);
        assert_eq!(
            now.contains(&1),
            written,
            "an extend that failed wrote, or one that succeeded did not"
        );
    });
}

#[test]
fn an_extend_racing_two_swaps_lands_once() {
    run_model("extend vs set_sampler then set_storage", || {
        extend_racing(|rb| {
            rb.set_sampler(WithoutReplacement::new()).unwrap();
            rb.set_storage(StorageConfig::heap().shards(2)).unwrap();
        });
    });
}

#[test]
fn writers_made_racing_a_copy_into_a_new_storage_take_different_shards() {
    // A handle's shard comes from a counter the swap carries to the new storage: a
    // number taken from the old storage after the copy would be taken again from the
    // new one, and two collectors would share a shard. Fails if `try_writer` counts
    // without reading the swap's `carrying` flag (`Storage::take_count`).
    run_model("writer() vs set_storage", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(4)
            .shards(2)
            .seed(1)
            .build()
            .expect("a valid buffer");
        let first = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.writer().shard())
        };
        rb.set_storage(StorageConfig::heap().capacity(8)).unwrap();
        let second = rb.writer().shard();
        assert_ne!(first.join().unwrap(), second, "two writers on one shard");
    });
}

#[test]
fn sample_calls_racing_a_copy_into_a_new_storage_draw_different_streams() {
    // A sample call through the buffer draws from the stream its call number names,
    // from a counter the swap carries: a number taken from the old storage after the
    // copy would be taken again from the new one, and two calls would draw the same
    // rows. Fails if `Storage::take_count` takes the number without then reading the
    // swap's `carrying` flag, or if either side's fence is missing.
    run_model("sample() vs set_storage", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(4)
            .seed(1)
            .build()
            .expect("a valid buffer");
        rb.extend(&pairs(&rb, &[4], 0)).unwrap();
        let first = {
            let rb = rb.clone();
            loom::thread::spawn(move || whole_rows(&rb.sample(3).unwrap()))
        };
        rb.set_storage(StorageConfig::heap().capacity(8)).unwrap();
        let second = whole_rows(&rb.sample(3).unwrap());
        assert_ne!(first.join().unwrap(), second, "two calls drew one stream");
    });
}
