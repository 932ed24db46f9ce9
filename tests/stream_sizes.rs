//! Streaming appends (`Storage::stream_rows`) of every slot size a stream takes, from
//! 24 bytes to 4 KiB, a word at a time: each size's appends start at every offset a
//! slot takes in a cache line, and run over the ring's end. `tests/streaming.rs` races
//! streams against readers on a few sizes; this file sweeps the sizes themselves, one
//! appender at a time, where a stage's arithmetic (its first slots up to one that
//! starts a line, its partial lines at either end, its room) differs from size to
//! size: the stage overrun fixed on 2026-12-02 took rows of 648 to 1,016 bytes that
//! are odd multiples of 8, appended 6 or 7 slots short of a line's start.
//!
//! Every size streams through the cache, into a ring that holds 64 of its appends;
//! every twentieth streams past the caches too, into a ring of 34 MB; every eighth
//! streams environment columns (3 or 4 environments, ndim 2). Half the sizes are
//! prioritized, their priorities streamed with their rows. After the appends the ring
//! holds exactly the rows written last (a flat ring: each at its position), whole
//! (every byte derived from its id, padding aside), at their priorities, and the trees
//! agree with their leaves. With the overrun's cause restored (stages of 5,120 bytes,
//! less than a line period of the longer slots), every test here fails: an
//! internal-error panic, where the stream's loop had spun on chunks of no slots.
//! `scripts/sanitize` runs this file under AddressSanitizer.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use replaybuf::sampler::Prioritized;
use replaybuf::{Batch, ReplayBuffer};

mod common;
use common::{fill_payload_rows as fill, payload_priority as priority};

/// The bytes of a ring past the caches: past the 32 MiB from which appends stream by
/// non-temporal stores.
const PAST_CACHES_BYTES: u64 = 34 << 20;

/// Steps `steps` of `rb`'s `width` environments (one where `width` is 1, a flat
/// buffer's rows): the row of step `t` and environment `e` is row `t * width + e`,
/// every byte derived from its id.
fn batch_of(rb: &ReplayBuffer, width: u64, steps: std::ops::Range<u64>) -> Batch {
    let ids: Vec<u64> = steps
        .clone()
        .flat_map(|t| (0..width).map(move |e| t * width + e))
        .collect();
    let n = (steps.end - steps.start) as usize;
    let mut batch = if width == 1 {
        rb.batch([n])
    } else {
        rb.batch([n, width as usize])
    };
    fill(&mut batch, &ids);
    batch
}

/// The slots of the sweep, 24 to 4,096 bytes, one of each size, and the payload
/// whose rows fill slot `24 + 8 k`: a row of `16 + 8 k` bytes less `k % 8` of padding,
/// after a stamp, and the raw priority's word where `prioritized`.
fn slots(prioritized: impl Fn(usize) -> bool) -> impl Iterator<Item = (u64, usize, bool)> {
    (0..=509).map(move |k| {
        let p = prioritized(k);
        (
            24 + 8 * k as u64,
            3 + 8 * k - k % 8 - if p { 8 } else { 0 },
            p,
        )
    })
}

/// A buffer of `rows` rows of `payload`, in slots of `slot` bytes, of `width`
/// environments (steps of `[width]` rows, ndim 2) where `width` is more than 1,
/// prioritized if `prioritized`, filled once: its next appends lap it.
fn lapped(slot: u64, payload: usize, rows: u64, width: u64, prioritized: bool) -> ReplayBuffer {
    let builder = ReplayBuffer::builder(common::payload_spec(payload))
        .capacity(rows as usize)
        .seed(3);
    let builder = if width > 1 {
        builder.ndim(2).envs(width as usize).dim_extend(0)
    } else {
        builder
    };
    let builder = if prioritized {
        builder
            .sampler(Prioritized::new(0.6, 0.4))
            .priority_key("prio")
    } else {
        builder
    };
    let rb = builder.build().unwrap();
    assert_eq!(
        rb.row_bytes().slot as u64,
        slot,
        "a payload of {payload} bytes"
    );
    let (writer, steps) = (rb.writer(), rows / width);
    let mut first = 0;
    while first < steps {
        let n = 4096.min(steps - first);
        writer
            .extend(&batch_of(&rb, width, first..first + n))
            .unwrap();
        first += n;
    }
    rb
}

/// The fewest steps of `rb` an append of which streams (`Some(past_caches)` from
/// `internals::stream_of`), if any up to `most`.
fn fewest_streamed(rb: &ReplayBuffer, most: u64) -> Option<(u64, bool)> {
    (1..=most).find_map(|n| replaybuf::internals::stream_of(rb, n).map(|past| (n, past)))
}

/// Appends to `rb` (of `width` environments) appends of `fewest` to `fewest + 7`
/// steps in turn, each streaming as `past_caches` says, until `more` steps are
/// written; then checks that the ring holds exactly the rows written last, whole, at
/// their priorities (a flat ring: each at its position).
fn stream_and_check(rb: &ReplayBuffer, width: u64, fewest: u64, past_caches: bool, more: u64) {
    let (rows, slot) = (rb.capacity() as u64, rb.row_bytes().slot);
    let writer = rb.writer();
    let first = rb.write_count() / width;
    let (mut next, end) = (first, first + more);
    let mut turn = 0;
    while next < end {
        let n = (fewest + turn % 8).min(end - next);
        if n >= fewest {
            assert_eq!(
                replaybuf::internals::stream_of(rb, n),
                Some(past_caches),
                "slots of {slot} bytes: an append of {n} steps streams"
            );
        }
        writer.extend(&batch_of(rb, width, next..next + n)).unwrap();
        next += n;
        turn += 1;
    }
    let read = rb.read_all_in_order(None);
    let ids = read.column::<u64>("id").unwrap();
    let end = end * width;
    if width == 1 {
        // Position p holds the last row written there: the last id below `end` that
        // is p modulo the ring's rows.
        let want = (0..rows).map(|p| p + (end - 1 - p) / rows * rows);
        if let Some((p, (&id, want))) = ids
            .iter()
            .zip(want)
            .enumerate()
            .find(|(_, (&id, w))| id != *w)
        {
            panic!("slots of {slot} bytes: position {p} holds row {id}, not row {want}");
        }
    } else {
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        assert!(
            sorted.iter().copied().eq(end - rows..end),
            "slots of {slot} bytes, {width} environments: the ring holds other rows than the last lap's"
        );
    }
    let mut expected = Batch::zeros(read.spec().clone(), [ids.len()]);
    fill(&mut expected, ids);
    for field in read.spec().fields() {
        let (got, exp, w) = (
            read.column_bytes(field.key()).unwrap(),
            expected.column_bytes(field.key()).unwrap(),
            field.bytes(),
        );
        if let Some(r) = (0..ids.len()).find(|&r| got[r * w..][..w] != exp[r * w..][..w]) {
            panic!(
                "slots of {slot} bytes: row {} at {} has field `{}` torn",
                ids[r],
                read.index()[r],
                field.key()
            );
        }
    }
    if rb.alpha().is_some() {
        for (&id, &at) in ids.iter().zip(read.index()) {
            let got = rb.priority(at).expect("a stored row");
            assert!(
                (got - priority(id)).abs() <= priority(id) * 1e-5,
                "slots of {slot} bytes: row {id} at {at} at priority {got}, written {}",
                priority(id)
            );
        }
        let view = replaybuf::internals::frozen_view(rb);
        assert!(
            view.trees_consistent,
            "slots of {slot} bytes: the trees disagree with their leaves"
        );
        assert!(rb.sample(64).is_ok());
    }
}

#[test]
fn streams_of_every_slot_size_through_the_cache_read_back_exactly() {
    for (slot, payload, prioritized) in slots(|k| k % 2 == 1) {
        // A ring that holds 64 of the largest append (4 KiB of slots at the fewest,
        // and 7 more).
        let fewest = 4096u64.div_ceil(slot);
        let rows = 64 * (fewest + 7);
        let rb = lapped(slot, payload, rows, 1, prioritized);
        assert_eq!(fewest_streamed(&rb, fewest), Some((fewest, false)));
        // Past the ring's end once, and on for a quarter lap.
        stream_and_check(&rb, 1, fewest, false, rows + rows / 4);
    }
}

#[test]
fn streams_of_every_twentieth_slot_size_past_the_caches_read_back_exactly() {
    for (slot, payload, prioritized) in slots(|k| k % 40 == 20).step_by(20) {
        let fewest = 4096u64.div_ceil(slot);
        let rows = PAST_CACHES_BYTES.div_ceil(slot);
        let rb = lapped(slot, payload, rows, 1, prioritized);
        assert_eq!(fewest_streamed(&rb, fewest), Some((fewest, true)));
        // A few dozen appends at the ring's start, then one to near its end and a few
        // dozen more over it: each offset in a line at both, without a whole lap of
        // small appends.
        stream_and_check(&rb, 1, fewest, true, 40 * fewest);
        let at = rb.write_count();
        let jump = rows - 60 * fewest;
        rb.writer()
            .extend(&batch_of(&rb, 1, at..at + jump))
            .unwrap();
        stream_and_check(&rb, 1, fewest, true, 40 * fewest);
    }
}

/// Environment columns: a step's slots, one an environment, stream together, the
/// batch's rows taken an environment at a time. Every eighth slot size, at 3 and 4
/// environments, through the cache.
#[test]
fn streamed_environment_columns_of_every_eighth_slot_size_read_back_exactly() {
    for (k, (slot, payload, prioritized)) in slots(|k| k % 16 == 8).enumerate().step_by(8) {
        let width = 3 + (k as u64 / 8) % 2;
        let fewest = 4096u64.div_ceil(slot * width);
        let steps = 64 * (fewest + 7);
        let rb = lapped(slot, payload, steps * width, width, prioritized);
        assert_eq!(fewest_streamed(&rb, fewest), Some((fewest, false)));
        stream_and_check(&rb, width, fewest, false, steps + steps / 4);
    }
}
