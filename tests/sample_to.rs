//! `Learner::sample_to`: a sample written straight into memory the caller owns. It
//! writes what `sample` returns under the same seed, for every sampler (uniform,
//! without replacement with its short last batch, prioritized with its weights, slices
//! with their marks and weights); it refuses bad room and unsupported buffers before
//! drawing; and while a collector writes, every row it writes is whole and its index,
//! generation and marks go with it.
// The loom facade rule (atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use replaybuf::error::{DataError, SampleError};
use replaybuf::sampler::{Marks, Prioritized, Sampler, Slice, SlicePriority, WithoutReplacement};
use replaybuf::{Batch, DType, Destination, Learner, ReplayBuffer, ReplayBufferBuilder, Spec};

mod common;

/// Steps of every trajectory the tests write: row `id` ends one when `id % TRAJ_LEN`
/// is `TRAJ_LEN - 1`.
const TRAJ_LEN: u64 = 6;

/// An id, values derived from it (a row mixed from two writes shows), and the flag
/// that ends trajectories.
fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [3])
        .field("done", DType::Bool, [])
        .field("check", DType::U64, [])
        .build()
        .unwrap()
}

/// `obs` of row `id`: three 16-bit pieces of it, exact in an f32.
fn obs_of(id: u64) -> [f32; 3] {
    [0, 16, 32].map(|shift| ((id >> shift) & 0xffff) as f32)
}

/// Rows `ids` as a batch of `rb`'s spec.
fn rows(rb: &ReplayBuffer, ids: &[u64]) -> Batch {
    let mut b = rb.batch([ids.len()]);
    b.set("id", ids).unwrap();
    let obs: Vec<f32> = ids.iter().flat_map(|&i| obs_of(i)).collect();
    b.set("obs", &obs).unwrap();
    let done: Vec<bool> = ids.iter().map(|&i| i % TRAJ_LEN == TRAJ_LEN - 1).collect();
    b.set("done", &done).unwrap();
    let check: Vec<u64> = ids.iter().map(|&i| common::mix(i)).collect();
    b.set("check", &check).unwrap();
    b
}

/// Memory a caller owns, with room for `rows` rows of `spec`: what a [`Destination`]
/// borrows. Weights and marks start at values no sample writes.
struct Room {
    spec: Spec,
    rows: usize,
    columns: Vec<Vec<u8>>,
    index: Vec<u64>,
    generation: Vec<u64>,
    weight: Vec<f32>,
    marks: Vec<Marks>,
}

impl Room {
    fn new(spec: Spec, rows: usize) -> Room {
        Room {
            columns: spec
                .fields()
                .iter()
                .map(|f| vec![0xAA; rows * f.bytes()])
                .collect(),
            spec,
            rows,
            index: vec![0; rows],
            generation: vec![0; rows],
            weight: vec![-1.0; rows],
            marks: vec![bytemuck::cast(0xFFu8); rows],
        }
    }

    /// Samples into this room through `learner`, lending it room for weights and
    /// marks as asked.
    fn sample(
        &mut self,
        learner: &mut Learner,
        weight: bool,
        marks: bool,
    ) -> Result<usize, SampleError> {
        let columns = self.columns.iter_mut().map(|c| &mut c[..]);
        let mut dest = Destination::new(
            &self.spec,
            self.rows,
            columns,
            &mut self.index,
            &mut self.generation,
        )
        .unwrap();
        if weight {
            dest = dest.with_weight(&mut self.weight).unwrap();
        }
        if marks {
            dest = dest.with_marks(&mut self.marks).unwrap();
        }
        learner.sample_to(&mut dest)
    }

    /// The bytes of field `key` in the first `rows` rows.
    fn column(&self, key: &str, rows: usize) -> &[u8] {
        let (i, f) = self.spec.field(key).unwrap();
        &self.columns[i][..rows * f.bytes()]
    }

    /// The ids of the first `rows` rows.
    fn ids(&self, rows: usize) -> Vec<u64> {
        self.column("id", rows)
            .chunks(8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Asserts that the first `batch.len()` rows hold `batch`: every column, index,
    /// generation, and the weights and marks it has.
    fn assert_holds(&self, batch: &Batch) {
        let rows = batch.len();
        for f in self.spec.fields() {
            let key = f.key().to_string();
            assert_eq!(
                self.column(&key, rows),
                batch.column_bytes(f.key()).unwrap(),
                "column `{key}`"
            );
        }
        assert_eq!(&self.index[..rows], batch.index());
        assert_eq!(&self.generation[..rows], batch.generations());
        if let Some(weight) = batch.weight() {
            assert_eq!(&self.weight[..rows], weight);
        }
        if let Some(marks) = batch.marks() {
            assert_eq!(&self.marks[..rows], marks);
        }
    }
}

/// The buffer `builder` makes, holding rows `0..n`.
fn filled(builder: ReplayBufferBuilder, n: u64) -> ReplayBuffer {
    let rb = builder.build().unwrap();
    rb.extend(&rows(&rb, &(0..n).collect::<Vec<_>>())).unwrap();
    rb
}

/// Two buffers of `builder` holding the same `n` rows: the learner of each draws the
/// same stream, so one's `sample` is what the other's `sample_to` must write.
fn twins(builder: impl Fn() -> ReplayBufferBuilder, n: u64) -> [ReplayBuffer; 2] {
    [(); 2].map(|()| filled(builder(), n))
}

#[test]
fn uniform_writes_what_sample_returns() {
    let [a, b] = twins(
        || {
            ReplayBuffer::builder(spec())
                .capacity(500)
                .shards(2)
                .seed(3)
        },
        700,
    );
    let (mut sampler, mut writer_to) = (a.learner(), b.learner());
    let mut room = Room::new(spec(), 64);
    for _ in 0..20 {
        let batch = sampler.sample(64).unwrap();
        assert_eq!(room.sample(&mut writer_to, false, false), Ok(64));
        room.assert_holds(&batch);
    }
    assert!(
        room.weight.iter().all(|&w| w == -1.0),
        "an unweighted sample leaves weights alone"
    );
}

#[test]
fn without_replacement_ends_its_epoch_short_as_sample_does() {
    let builder = || {
        ReplayBuffer::builder(spec())
            .capacity(8)
            .sampler(WithoutReplacement::new())
            .seed(2)
    };
    let [a, b] = twins(builder, 5);
    let (mut sampler, mut writer_to) = (a.learner(), b.learner());
    let mut room = Room::new(spec(), 2);
    let mut seen = Vec::new();
    for want in [2, 2, 1] {
        let batch = sampler.sample(2).unwrap();
        assert_eq!(batch.len(), want);
        assert_eq!(room.sample(&mut writer_to, false, false), Ok(want));
        room.assert_holds(&batch);
        seen.extend(room.ids(want));
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 4], "every row once in the epoch");
    assert_eq!(sampler.sample(2).unwrap_err(), SampleError::EpochEnd);
    assert_eq!(
        room.sample(&mut writer_to, false, false),
        Err(SampleError::EpochEnd)
    );
    // The next call starts a new epoch, on both.
    let batch = sampler.sample(2).unwrap();
    assert_eq!(room.sample(&mut writer_to, false, false), Ok(2));
    room.assert_holds(&batch);
}

/// A prioritized buffer of `sampler` with 120 rows of uneven priorities, sampled
/// `rows_asked` rows at a time by two learners of one stream: one `sample`s, the other
/// `sample_to`s room with weights (and marks, for `slices`), which must hold the same
/// rows, weights and marks. Room without weights is refused before anything is drawn,
/// so the two streams stay in step.
fn weights_equal_those_of_sample(sampler: impl Into<Sampler>, rows_asked: usize, slices: bool) {
    let rb = filled(
        ReplayBuffer::builder(spec())
            .capacity(120)
            .sampler(sampler)
            .seed(9),
        120,
    );
    let all = rb.read_all_in_order(None);
    let priorities: Vec<f64> = (0..120).map(|i| 0.1 + (i % 17) as f64).collect();
    rb.update_priority(all.index(), all.generations(), &priorities)
        .unwrap();
    let mut sampler = rb.learner();
    let mut writer_to = sampler.clone();
    let mut room = Room::new(spec(), rows_asked);
    assert_eq!(
        room.sample(&mut writer_to, false, slices),
        Err(SampleError::NoWeightRoom)
    );
    for _ in 0..10 {
        let batch = sampler.sample(rows_asked).unwrap();
        assert_eq!(room.sample(&mut writer_to, true, slices), Ok(rows_asked));
        room.assert_holds(&batch);
        assert!(batch.weight().unwrap().iter().any(|&w| w < 1.0));
    }
}

#[test]
fn prioritized_weights_equal_those_of_sample() {
    weights_equal_those_of_sample(Prioritized::new(0.7, 0.5), 32, false);
}

#[test]
fn prioritized_slices_weigh_as_sample_does() {
    let slice = Slice::slice_len(4)
        .end_key("done")
        .prioritized(Prioritized::new(0.8, 0.4), SlicePriority::Start);
    weights_equal_those_of_sample(slice, 16, true);
}

#[test]
fn slices_write_the_marks_of_sample() {
    let builder = || {
        ReplayBuffer::builder(spec())
            .capacity(200)
            .sampler(Slice::slice_len(4).end_key("done").strict_length(false))
            .seed(4)
    };
    // 203 rows: the oldest trajectory is cut by the wrap, the newest is still open.
    let [a, b] = twins(builder, 203);
    let (mut sampler, mut writer_to) = (a.learner(), b.learner());
    let mut room = Room::new(spec(), 32);
    let mut padded = 0;
    for _ in 0..30 {
        let batch = sampler.sample(32).unwrap();
        assert_eq!(batch.shape(), [8, 4]);
        assert_eq!(room.sample(&mut writer_to, false, true), Ok(32));
        room.assert_holds(&batch);
        padded += room.marks.iter().filter(|m| !m.is_valid()).count();
    }
    assert!(padded > 0, "short slices were padded");
    // Without room for marks, none are written.
    room.marks.fill(bytemuck::cast(0xFFu8));
    assert_eq!(room.sample(&mut writer_to, false, false), Ok(32));
    assert!(room
        .marks
        .iter()
        .all(|&m| bytemuck::cast::<_, u8>(m) == 0xFF));
}

#[test]
fn slices_without_replacement_end_short() {
    let builder = || {
        ReplayBuffer::builder(spec()).capacity(100).seed(5).sampler(
            Slice::slice_len(3)
                .end_key("done")
                .without_replacement(WithoutReplacement::new()),
        )
    };
    // Five trajectories of six steps: ten windows, three a sample.
    let [a, b] = twins(builder, 30);
    let (mut sampler, mut writer_to) = (a.learner(), b.learner());
    let mut room = Room::new(spec(), 9);
    for want in [9, 9, 9, 3] {
        let batch = sampler.sample(9).unwrap();
        assert_eq!(room.sample(&mut writer_to, false, true), Ok(want));
        assert_eq!(batch.len(), want);
        room.assert_holds(&batch);
    }
    assert_eq!(
        room.sample(&mut writer_to, false, true),
        Err(SampleError::EpochEnd)
    );
}

#[test]
fn fields_are_paired_by_key_at_any_address() {
    // The caller's spec lists the buffer's fields in another order, and its columns
    // start at odd addresses.
    let reordered = Spec::builder()
        .field("check", DType::U64, [])
        .field("done", DType::Bool, [])
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [3])
        .build()
        .unwrap();
    let rb = filled(ReplayBuffer::builder(spec()).capacity(50).seed(1), 50);
    let rows_asked = 10;
    let widths: Vec<usize> = reordered
        .fields()
        .iter()
        .map(|f| rows_asked * f.bytes())
        .collect();
    let mut memory = vec![0u8; 1 + widths.iter().sum::<usize>()];
    let mut rest = &mut memory[1..];
    let mut columns = Vec::new();
    for &w in &widths {
        let (column, tail) = rest.split_at_mut(w);
        columns.push(column);
        rest = tail;
    }
    let (mut index, mut generation) = (vec![0; rows_asked], vec![0; rows_asked]);
    let mut dest =
        Destination::new(&reordered, rows_asked, columns, &mut index, &mut generation).unwrap();
    assert_eq!(dest.rows(), rows_asked);
    assert_eq!(rb.learner().sample_to(&mut dest), Ok(rows_asked));
    drop(dest);
    let at = |k: usize| 1 + widths[..k].iter().sum::<usize>();
    let u64s = |bytes: &[u8]| -> Vec<u64> {
        bytes
            .chunks(8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
            .collect()
    };
    let checks = u64s(&memory[at(0)..at(1)]);
    let ids = u64s(&memory[at(2)..at(3)]);
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(
            index[k], id,
            "one shard, one extend: row id sits at index id"
        );
        assert_eq!(checks[k], common::mix(id));
        assert_eq!(memory[at(1) + k], u8::from(id % TRAJ_LEN == TRAJ_LEN - 1));
        let obs: Vec<f32> = memory[at(3) + 12 * k..at(3) + 12 * (k + 1)]
            .chunks(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(obs, obs_of(id));
    }
}

/// The first `n` of `columns`, as a destination takes them.
fn cols(columns: &mut [Vec<u8>], n: usize) -> Vec<&mut [u8]> {
    columns.iter_mut().take(n).map(|c| &mut c[..]).collect()
}

#[test]
fn bad_room_is_refused() {
    let spec = spec();
    let mut room = Room::new(spec.clone(), 4);
    let Room {
        columns,
        index,
        generation,
        weight,
        marks,
        ..
    } = &mut room;
    // Too few and too many columns.
    for n in [3, 5] {
        let (mut i, mut g) = ([0u64; 4], [0u64; 4]);
        let mut spare = vec![vec![0u8; 48]; 5];
        let e = Destination::new(&spec, 4, cols(&mut spare, n), &mut i, &mut g).unwrap_err();
        assert_eq!(
            e,
            DataError::ColumnCount {
                expected: 4,
                found: n
            }
        );
    }
    // A column one byte short.
    let mut short = columns.clone();
    short[1].pop();
    let e = Destination::new(&spec, 4, cols(&mut short, 4), index, generation).unwrap_err();
    assert_eq!(
        e,
        DataError::ColumnBytes {
            key: "obs".into(),
            expected: 48,
            found: 47
        }
    );
    assert!(e.to_string().contains("`obs`"), "{e}");
    // Index, generation, weight and marks: one entry a row.
    let short = |part, found| DataError::RowSlice {
        part,
        expected: 4,
        found,
    };
    let e = Destination::new(&spec, 4, cols(columns, 4), &mut index[..3], generation).unwrap_err();
    assert_eq!(e, short("index", 3));
    let e = Destination::new(&spec, 4, cols(columns, 4), index, &mut generation[..2]).unwrap_err();
    assert_eq!(e, short("generation", 2));
    let dest = Destination::new(&spec, 4, cols(columns, 4), index, generation).unwrap();
    let e = dest.with_weight(&mut weight[..1]).unwrap_err();
    assert_eq!(e, short("weight", 1));
    let dest = Destination::new(&spec, 4, cols(columns, 4), index, generation).unwrap();
    let e = dest.with_marks(&mut marks[..0]).unwrap_err();
    assert_eq!(e, short("marks", 0));
}

#[test]
fn unsupported_samples_are_refused_before_drawing() {
    // A slice sample needs whole slices.
    let rb = filled(
        ReplayBuffer::builder(spec())
            .capacity(60)
            .sampler(Slice::slice_len(4).end_key("done"))
            .seed(6),
        60,
    );
    let mut learner = rb.learner();
    assert_eq!(
        Room::new(spec(), 6).sample(&mut learner, false, true),
        Err(SampleError::SliceBatchSize {
            batch: 6,
            divisor: 4
        })
    );

    // Transforms run on a Batch: a buffer with any refuses, until they are cleared.
    let rb = filled(ReplayBuffer::builder(spec()).capacity(60).seed(6), 60);
    let mut learner = rb.learner();
    let mut room = Room::new(spec(), 8);
    rb.append_transform(|_: &mut Batch| Ok(()));
    let e = room.sample(&mut learner, false, false).unwrap_err();
    assert_eq!(e, SampleError::TransformsNeedBatch);
    assert!(e.to_string().contains("transforms"), "{e}");
    rb.clear_transforms();
    assert_eq!(room.sample(&mut learner, false, false), Ok(8));
    // An inverse transform runs on writes only: it was refused as well.
    rb.append_transform(replaybuf::Transform::inverse(|_: &mut Batch| Ok(())));
    assert_eq!(room.sample(&mut learner, false, false), Ok(8));
    rb.clear_transforms();

    // Room made for other fields.
    let other = Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [3])
        .field("done", DType::Bool, [])
        .field("checksum", DType::U64, [])
        .build()
        .unwrap();
    assert_eq!(
        Room::new(other, 8).sample(&mut learner, false, false),
        Err(SampleError::SpecMismatch)
    );
}

/// Asserts that the first `rows` rows of `room` are whole rows that go with their
/// index and generation: a row's index is where its id was written (one writer, one
/// shard of `capacity` rows), and two rows of one slot share a generation exactly when
/// they share an id. With `slice_len`, each slice's valid rows are consecutive steps of
/// one trajectory, marked as such, and padding comes after them.
fn check_rows(room: &Room, rows: usize, capacity: u64, slice_len: Option<usize>) {
    let ids = room.ids(rows);
    let checks = room.column("check", rows);
    let obs = room.column("obs", rows);
    for (k, &id) in ids.iter().enumerate() {
        if slice_len.is_some() && !room.marks[k].is_valid() {
            assert_eq!(room.index[k], u64::MAX, "padding has no index");
            continue;
        }
        let torn = |field: &str| format!("torn row {k}: id {id} but `{field}` differs");
        let check = u64::from_ne_bytes(checks[8 * k..8 * k + 8].try_into().unwrap());
        assert_eq!(check, common::mix(id), "{}", torn("check"));
        let o: Vec<f32> = obs[12 * k..12 * k + 12]
            .chunks(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(o, obs_of(id), "{}", torn("obs"));
        assert_eq!(
            room.index[k],
            id % capacity,
            "row {k}: index of another row"
        );
        let (slot, generation) = (room.index[k], room.generation[k]);
        let earlier = ids.iter().zip(&room.index).zip(&room.generation).take(k);
        for ((&other, _), &g) in earlier.filter(|((_, &i), _)| i == slot) {
            assert_eq!(
                g == generation,
                other == id,
                "two rows of slot {slot}: generations {g} and {generation} for ids {other} and {id}"
            );
        }
    }
    let Some(len) = slice_len else { return };
    for (s, window) in ids.chunks(len).enumerate() {
        let marks = &room.marks[s * len..(s + 1) * len];
        let valid = marks.iter().take_while(|m| m.is_valid()).count();
        assert!(valid > 0, "slice {s} is empty");
        assert!(marks[valid..].iter().all(|m| !m.is_valid()));
        for (i, (&id, m)) in window.iter().zip(marks).take(valid).enumerate() {
            assert_eq!(id, window[0] + i as u64, "slice {s} skips: {window:?}");
            assert_eq!(id / TRAJ_LEN, window[0] / TRAJ_LEN, "slice {s} spans two");
            assert_eq!(m.is_start(), id % TRAJ_LEN == 0, "start mark of {id}");
            assert_eq!(
                m.is_end(),
                id % TRAJ_LEN == TRAJ_LEN - 1,
                "end mark of {id}"
            );
        }
    }
}

/// One collector extends `rb` (one shard) with chunks of consecutive ids while two
/// learners `sample_to` it and check every row; returns (rows written, rows checked).
fn race(rb: &ReplayBuffer, rows_asked: usize, slice_len: Option<usize>) -> (u64, u64) {
    let capacity = rb.capacity() as u64;
    let stop = AtomicBool::new(false);
    let (written, checked) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        let (writer, stop_w, written) = (rb.writer(), &stop, &written);
        s.spawn(move || {
            let mut next = capacity;
            let mut round = 0u64;
            while !stop_w.load(Ordering::Relaxed) {
                round += 1;
                let n = round % 11 + 1;
                let ids: Vec<u64> = (next..next + n).collect();
                writer.extend(&rows(rb, &ids)).unwrap();
                next += n;
                written.fetch_add(n, Ordering::Relaxed);
            }
        });
        for _ in 0..2 {
            let (mut learner, stop, checked) = (rb.learner(), &stop, &checked);
            s.spawn(move || {
                let mut room = Room::new(spec(), rows_asked);
                while !stop.load(Ordering::Relaxed) {
                    let rows = match room.sample(&mut learner, false, slice_len.is_some()) {
                        Ok(rows) => rows,
                        // A slice sample whose picks keep being lapped gives up (the
                        // collector outruns a 96-row ring); nothing was written, as
                        // with `sample`. Never as "too short": every trajectory has
                        // six steps, and a scan the collector tore is no answer.
                        Err(SampleError::Starved { .. }) if slice_len.is_some() => continue,
                        Err(e) => panic!("{e}"),
                    };
                    assert_eq!(rows, rows_asked);
                    check_rows(&room, rows, capacity, slice_len);
                    checked.fetch_add(rows as u64, Ordering::Relaxed);
                }
            });
        }
        std::thread::sleep(common::race_duration("REPLAYBUF_STRESS_MS"));
        stop.store(true, Ordering::Relaxed);
    });
    (written.into_inner(), checked.into_inner())
}

#[test]
fn rows_stay_whole_while_a_collector_writes() {
    for slice_len in [None, Some(4)] {
        let mut builder = ReplayBuffer::builder(spec()).capacity(96).seed(8);
        if let Some(len) = slice_len {
            builder = builder.sampler(Slice::slice_len(len).end_key("done"));
        }
        let rb = builder.build().unwrap();
        // Full before the race: its ids start at the capacity, index = id % capacity.
        rb.extend(&rows(&rb, &(0..96).collect::<Vec<_>>())).unwrap();
        let (written, checked) = race(&rb, 24, slice_len);
        assert!(
            written > 1000 && checked > 1000,
            "slices {slice_len:?}: the race ran ({written} written, {checked} checked)"
        );
    }
}
