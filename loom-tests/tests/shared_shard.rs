//! Two collectors on one shard (more writer handles than shards): their claims
//! interleave and lap each other on a 2-slot ring, yet every slot ends with the row of
//! the latest sequence number written there, whole.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::ReplayBuffer;

#[test]
fn collectors_sharing_a_shard_keep_fifo_order() {
    run_model("two writers, one shard, lapping", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .seed(2)
            .build()
            .unwrap();
        let spawn = |first: u64| {
            let writer = rb.writer();
            loom::thread::spawn(move || {
                let written = writer.extend(&pairs(writer.buffer(), &[2], first)).unwrap();
                // (sequence number, id) of each row: lap * ring + position.
                (0..2)
                    .map(|r| {
                        (
                            (written.generation(r) >> 30) * 2 + written.index(r),
                            first + r as u64,
                        )
                    })
                    .collect::<Vec<_>>()
            })
        };
        let (a, b) = (spawn(10), spawn(20));
        let mut rows = a.join().unwrap();
        rows.extend(b.join().unwrap());
        rows.sort_unstable();
        assert_eq!(
            rows.iter().map(|&(seq, _)| seq).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        // The ring keeps the last two sequence numbers, at positions seq % 2.
        let all = rb.read_all_in_order(None);
        assert_eq!(whole_rows(&all), [rows[2].1, rows[3].1]);
        assert_eq!(rb.write_count(), 4);
    });
}
