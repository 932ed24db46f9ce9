//! Through the public API: a learner sampling or reading a buffer whose ring a
//! collector laps never gets a torn row, and never a row other than the one at its
//! index.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, run_model_at_most, whole_rows};
use loom::thread::JoinHandle;
use replaybuf::ReplayBuffer;

/// A two-slot buffer holding rows 0 and 1, and a collector thread lapping both: it
/// extends chunks of `chunks` rows, ids 2 and 3 between them (row `id` goes to
/// position `id % 2`).
fn lapped_by_a_collector(chunks: &'static [usize]) -> (ReplayBuffer, JoinHandle<()>) {
    let rb = ReplayBuffer::builder(pair_spec())
        .capacity(2)
        .seed(1)
        .build()
        .expect("a valid buffer");
    rb.extend(&pairs(&rb, &[2], 0)).unwrap();
    let collector = {
        let rb = rb.clone();
        loom::thread::spawn(move || {
            let mut first = 2;
            for &rows in chunks {
                rb.extend(&pairs(&rb, &[rows], first)).unwrap();
                first += rows as u64;
            }
        })
    };
    (rb, collector)
}

#[test]
fn sampling_while_a_collector_laps_the_ring() {
    run_model("uniform sample vs lapping extend", || {
        one_row_sample(&[1, 1])
    });
}

/// A one-row sample racing a collector that extends `chunks`: a whole row, the one
/// at its index.
fn one_row_sample(chunks: &'static [usize]) {
    let (rb, collector) = lapped_by_a_collector(chunks);
    let batch = rb
        .sample(1)
        .expect("two rows were published before the race");
    let ids = whole_rows(&batch);
    // Row `id` went to position `id % 2`.
    assert_eq!(ids[0] % 2, batch.index()[0]);
    collector.join().unwrap();
}

/// A sample of two rows reads them as one block (`Storage::read_block`): both stamps
/// first, then both copies, one fence, then both checks. A collector lapping both rows
/// in between must leave neither torn.
#[test]
fn sampling_a_block_of_rows_while_a_collector_laps_them() {
    run_model("two-row sample vs lapping extend", || {
        let (rb, collector) = lapped_by_a_collector(&[2]);
        let batch = rb
            .sample(2)
            .expect("two rows were published before the race");
        let ids = whole_rows(&batch);
        for (id, &index) in ids.iter().zip(batch.index()) {
            assert_eq!(id % 2, index, "rows {ids:?} at {:?}", batch.index());
        }
        collector.join().unwrap();
    });
}

#[test]
fn reading_by_index_while_a_collector_laps_the_ring() {
    run_model("get vs lapping extend", || {
        let (rb, collector) = lapped_by_a_collector(&[2]);
        let row = rb.get(1).expect("position 1 holds a row");
        let ids = whole_rows(&row);
        assert!(ids == [1] || ids == [3], "position 1 held {ids:?}");
        collector.join().unwrap();
        assert_eq!(whole_rows(&rb.read_all_in_order(None)), [2, 3]);
    });
}

/// A collector's two-row extend of a lapped ring streams (`Storage::stream_rows`): it
/// marks no slot, and its stamps may land before its bytes. A one-row sample racing
/// it must still get a whole row, the one at its index.
#[test]
fn sampling_one_row_while_a_collector_streams_over_it() {
    run_model("one-row sample vs streaming extend", || {
        one_row_sample(&[2])
    });
}

/// A one-row extend (marking its slot) claimed after a streaming one whose rows it
/// laps waits for the stream to end before it writes; the ring then holds the last
/// claims' rows, whole, whatever the interleaving.
#[test]
fn an_append_after_a_stream_waits_for_it() {
    run_model("one-row extend behind a streaming extend", || {
        let (rb, streamer, plain) = behind_a_stream();
        streamer.join().unwrap();
        plain.join().unwrap();
        last_claims_whole(&rb);
    });
}

/// As [`an_append_after_a_stream_waits_for_it`], with a read of position 0 racing
/// both appends: a whole row. The reader and the one-row appender may both wait for
/// the stream, which loom explores only up to preemption bound 2
/// (`common::run_model_at_most`); each waits alone on a stream in the models above
/// at any bound.
#[test]
fn a_read_beside_an_append_behind_a_stream_is_whole() {
    run_model_at_most(2, "get vs one-row extend behind a streaming extend", || {
        let (rb, streamer, plain) = behind_a_stream();
        let row = rb.get(0).expect("position 0 holds a row");
        whole_rows(&row);
        streamer.join().unwrap();
        plain.join().unwrap();
        last_claims_whole(&rb);
    });
}

/// The two-slot buffer of [`lapped_by_a_collector`], lapped by a streaming two-row
/// extend (ids 2 and 3) and a one-row extend (id 10) from threads of their own.
fn behind_a_stream() -> (ReplayBuffer, JoinHandle<()>, JoinHandle<()>) {
    let (rb, streamer) = lapped_by_a_collector(&[2]);
    let plain = {
        let rb = rb.clone();
        loom::thread::spawn(move || {
            rb.extend(&pairs(&rb, &[1], 10)).unwrap();
        })
    };
    (rb, streamer, plain)
}

/// The ring holds the last two claims' rows, whole: the stream's second and the
/// single row, or, if the single row claimed first, the stream's two.
fn last_claims_whole(rb: &ReplayBuffer) {
    let mut ids = whole_rows(&rb.read_all_in_order(None));
    ids.sort_unstable();
    assert!(ids == [3, 10] || ids == [2, 3], "the ring holds {ids:?}");
}
