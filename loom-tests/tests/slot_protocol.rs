//! The slot protocol itself (`storage/stamp.rs`): a reader racing the writers of one
//! slot never validates a torn copy, whatever the interleaving.
#![cfg(replaybuf_loom)]

mod common;

use common::run_model;
use loom::sync::atomic::AtomicU64;
use loom::sync::Arc;
use replaybuf::internals::stamp::{self, Claim, Prev, Stamp};
use replaybuf::internals::{load, store};

/// One slot: a stamp word, then a row of two words.
fn slot() -> Arc<Vec<AtomicU64>> {
    Arc::new((0..3).map(|_| AtomicU64::new(0)).collect())
}

fn write_row(slot: &[AtomicU64], value: u64) {
    let bytes: Vec<u8> = [value, value]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    store(slot, 8, &bytes);
}

/// Reads the row if it is published and whole: (stamp, first word, second word).
fn read_row(slot: &[AtomicU64]) -> Option<(Stamp, u64, u64)> {
    let seen = stamp::begin_read(&slot[0]);
    if !seen.is_published() {
        return None;
    }
    let mut bytes = [0u8; 16];
    load(slot, 8, &mut bytes);
    let word = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
    stamp::validate(&slot[0], seen).then(|| (seen, word(0), word(1)))
}

fn append(slot: &[AtomicU64], prev: Prev, lap: u32, claim: Claim, value: u64) {
    stamp::begin_append(&slot[0], prev, lap, claim);
    write_row(slot, value);
    stamp::publish(&slot[0], Stamp::published(lap, 0));
}

#[test]
fn a_reader_racing_two_laps_sees_whole_rows() {
    run_model("reader vs appender lapping", || {
        let s = slot();
        append(&s, Prev::Empty, 0, Claim::Plain, 100);
        let writer = {
            let s = s.clone();
            loom::thread::spawn(move || {
                append(&s, Prev::Lap(0), 1, Claim::Plain, 101);
                append(&s, Prev::Lap(1), 2, Claim::Plain, 102);
            })
        };
        if let Some((seen, a, b)) = read_row(&s) {
            assert_eq!(a, b, "validated a torn row");
            assert_eq!(
                a,
                100 + u64::from(seen.lap()),
                "row does not match its stamp"
            );
        }
        writer.join().unwrap();
        assert_eq!(read_row(&s).map(|(_, a, _)| a), Some(102));
    });
}

#[test]
fn appenders_of_consecutive_laps_take_turns() {
    run_model("two appenders, consecutive laps of one slot", || {
        let s = slot();
        // Lap 1's appender may start first: it must wait for lap 0 to be published.
        let later = {
            let s = s.clone();
            loom::thread::spawn(move || append(&s, Prev::Lap(0), 1, Claim::Plain, 201))
        };
        let earlier = {
            let s = s.clone();
            loom::thread::spawn(move || append(&s, Prev::Empty, 0, Claim::Plain, 200))
        };
        earlier.join().unwrap();
        later.join().unwrap();
        let (seen, a, b) = read_row(&s).expect("the slot holds lap 1");
        assert_eq!(
            (seen.lap(), a, b),
            (1, 201, 201),
            "the older lap overwrote the newer"
        );
    });
}

/// An editor rewrites the slot's published lap-0 row while an appender of lap 1 whose
/// predecessor is `prev` claims the slot by compare-exchange: a reader never validates
/// a torn row, and the slot ends holding one whole row of lap 1.
fn editor_races_appender(name: &str, prev: Prev) {
    run_model(name, move || {
        let s = slot();
        append(&s, Prev::Empty, 0, Claim::Plain, 300);
        let editor = {
            let s = s.clone();
            loom::thread::spawn(move || {
                let edited = stamp::begin_edit(&s[0]).expect("the slot holds a row");
                write_row(&s, 400);
                stamp::publish(&s[0], edited);
            })
        };
        let appender = {
            let s = s.clone();
            loom::thread::spawn(move || append(&s, prev, 1, Claim::Exchange, 301))
        };
        if let Some((_, a, b)) = read_row(&s) {
            assert_eq!(a, b, "validated a torn row");
        }
        editor.join().unwrap();
        appender.join().unwrap();
        let (seen, a, b) = read_row(&s).expect("a published row");
        assert_eq!(a, b);
        // Either the edit came first (then lap 1 replaced it) or last (then it rewrote
        // lap 1's row in place, bumping the edit count); never back to lap 0.
        match (seen.lap(), seen.edit()) {
            (1, 0) => assert_eq!(a, 301),
            (1, 1) => assert_eq!(a, 400),
            other => panic!("unexpected final stamp {other:?}"),
        }
    });
}

#[test]
fn an_editor_and_an_exchanging_appender_exclude_each_other() {
    editor_races_appender("editor vs appender (compare-exchange)", Prev::Lap(0));
}

#[test]
fn an_editor_and_an_appender_taking_over_an_abandoned_slot_exclude_each_other() {
    // The appender's predecessor was claimed by a writer that died (`Prev::Abandoned`,
    // shared mode): the row it finds may be a published one that an editor is
    // rewriting, and it must wait for the editor rather than take the slot from it.
    editor_races_appender(
        "editor vs appender taking over an abandoned slot",
        Prev::Abandoned,
    );
}
