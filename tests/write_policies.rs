//! Write policies: the immutable writer (a read-only dataset refuses every write, on
//! every face, and changes nothing) and the max-value writer (the top rows by a rank
//! field stay; the rest are reported rejected).

// The loom-facade rule of .clippy.toml is for the library, not its tests.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use replaybuf::bytemuck::{Pod, Zeroable};
use replaybuf::error::{AccessError, DataError};
use replaybuf::list::ListBuffer;
use replaybuf::sampler::{Prioritized, Reduction, WithoutReplacement};
use replaybuf::swap::StorageConfig;
use replaybuf::typed::TypedBuffer;
use replaybuf::{Batch, DType, ReplayBuffer, Spec, WritePolicy};

fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [2])
        .field("id", DType::I64, [])
        .field("score", DType::F32, [])
        .build()
        .unwrap()
}

/// `n` rows with ids `first..` and `obs = [id, -id]`.
fn rows(spec: &Spec, n: usize, first: i64) -> Batch {
    let mut b = Batch::zeros(spec.clone(), [n]);
    let ids: Vec<i64> = (first..first + n as i64).collect();
    let obs: Vec<f32> = ids.iter().flat_map(|&i| [i as f32, -(i as f32)]).collect();
    b.set("id", &ids).unwrap();
    b.set("obs", &obs).unwrap();
    b
}

fn sorted_ids(batch: &Batch) -> Vec<i64> {
    let mut ids = batch.column::<i64>("id").unwrap().to_vec();
    ids.sort_unstable();
    ids
}

#[test]
fn an_immutable_buffer_refuses_every_write_and_changes_nothing() {
    let spec = spec();
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(16)
        .shards(2)
        .write_policy(WritePolicy::Immutable)
        .seed(1)
        .build_from(&rows(&spec, 16, 0))
        .unwrap();
    assert_eq!(rb.len(), 16);
    let before = rb.read_all_in_order(None);
    let (count, len) = (rb.write_count(), rb.len());

    let more = rows(&spec, 4, 100);
    assert_eq!(rb.extend(&more).unwrap_err(), DataError::Immutable);
    assert_eq!(
        rb.add(&rows(&spec, 1, 100)).unwrap_err(),
        DataError::Immutable
    );
    let writer = rb.writer();
    assert_eq!(writer.extend(&more).unwrap_err(), DataError::Immutable);
    assert_eq!(
        writer.add(&rows(&spec, 1, 100)).unwrap_err(),
        DataError::Immutable
    );
    assert_eq!(
        rb.write_all(&rows(&spec, 16, 100), None).unwrap_err(),
        AccessError::Data(DataError::Immutable)
    );
    // Emptying is a write too (TorchRL's immutable writer refuses `_empty`): the
    // Rust API dropped every row.
    assert_eq!(rb.clear().unwrap_err(), DataError::Immutable);
    assert_eq!(
        replaybuf::torchrl::TorchRl::empty(&rb).unwrap_err(),
        DataError::Immutable
    );
    // A batch that would not fit anyway is refused as immutable all the same: the
    // policy speaks first.
    assert_eq!(
        rb.extend(&Batch::zeros(spec.clone(), [2, 2])).unwrap_err(),
        DataError::Immutable
    );

    assert_eq!((rb.write_count(), rb.len()), (count, len));
    let after = rb.read_all_in_order(None);
    assert_eq!(
        after.column::<i64>("id").unwrap(),
        before.column::<i64>("id").unwrap()
    );
    assert_eq!(
        after.column::<f32>("obs").unwrap(),
        before.column::<f32>("obs").unwrap()
    );
    assert_eq!(sorted_ids(&after), (0..16).collect::<Vec<_>>());

    // Reading is what a dataset is for.
    let batch = rb.sample(64).unwrap();
    assert!(batch
        .column::<i64>("id")
        .unwrap()
        .iter()
        .all(|&i| (0..16).contains(&i)));
}

#[test]
fn build_from_spreads_a_full_dataset_over_the_shards() {
    let spec = spec();
    for shards in [1, 2, 4] {
        let rb = ReplayBuffer::builder(spec.clone())
            .capacity(100)
            .shards(shards)
            .write_policy(WritePolicy::Immutable)
            .build_from(&rows(&spec, 100, 0))
            .unwrap();
        assert_eq!(rb.len(), 100, "{shards} shards");
        assert_eq!(
            sorted_ids(&rb.read_all_in_order(None)),
            (0..100).collect::<Vec<_>>(),
            "{shards} shards: every row stays"
        );

        // The typed and list faces' datasets alike: they wrote everything to one
        // shard, which kept its ring's share (25 of 100 over four shards).
        let steps: Vec<Step> = (0..100)
            .map(|i| Step {
                obs: [0.0; 2],
                id: i,
            })
            .collect();
        let typed = TypedBuffer::<Step>::builder()
            .capacity(100)
            .shards(shards)
            .write_policy(WritePolicy::Immutable)
            .build_from(&steps)
            .unwrap();
        let mut ids: Vec<u32> = (0..100).map(|i| typed.get(i).unwrap().id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..100).collect::<Vec<_>>(), "typed, {shards} shards");
        let list = ListBuffer::<u32>::builder()
            .capacity(100)
            .shards(shards)
            .write_policy(WritePolicy::Immutable)
            .build_from(0..100)
            .unwrap();
        let mut values: Vec<u32> = (0..100).map(|i| list.get(i).unwrap()).collect();
        values.sort_unstable();
        assert_eq!(
            values,
            (0..100).collect::<Vec<_>>(),
            "list, {shards} shards"
        );
    }
}

#[test]
fn an_immutable_dataset_can_be_read_in_epochs_and_reprioritized() {
    let spec = Spec::builder()
        .field("id", DType::I64, [])
        .field("td", DType::F32, [])
        .build()
        .unwrap();
    let mut data = Batch::zeros(spec.clone(), [8]);
    data.set("id", &(0..8).collect::<Vec<i64>>()).unwrap();
    let epochs = ReplayBuffer::builder(spec.clone())
        .capacity(8)
        .sampler(WithoutReplacement::new())
        .write_policy(WritePolicy::Immutable)
        .build_from(&data)
        .unwrap();
    let mut seen: Vec<i64> = Vec::new();
    while let Ok(b) = epochs.sample(3) {
        seen.extend(b.column::<i64>("id").unwrap());
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<_>>());

    // Priorities are the sampler's state, not the data: they still change.
    let prio = ReplayBuffer::builder(spec)
        .capacity(8)
        .sampler(Prioritized::new(1.0, 0.0).eps(0.0))
        .write_policy(WritePolicy::Immutable)
        .seed(3)
        .build_from(&data)
        .unwrap();
    let all = prio.read_all_in_order(None);
    let mut p = vec![0.0; 8];
    p[5] = 1.0;
    prio.update_priority(all.index(), all.generations(), &p)
        .unwrap();
    assert!(prio
        .sample(32)
        .unwrap()
        .column::<i64>("id")
        .unwrap()
        .iter()
        .all(|&i| i == 5));
}

#[test]
fn build_from_refuses_rows_that_do_not_fit() {
    let other = Spec::builder().field("x", DType::U8, []).build().unwrap();
    let err = ReplayBuffer::builder(spec())
        .capacity(4)
        .write_policy(WritePolicy::Immutable)
        .build_from(&Batch::zeros(other, [2]))
        .unwrap_err();
    assert!(err.to_string().contains("initial rows"), "{err}");
    assert!(std::error::Error::source(&err).is_some());
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
struct Step {
    obs: [f32; 2],
    id: u32,
}

#[test]
fn the_typed_and_list_faces_refuse_writes_when_immutable() {
    let step = |i: u32| Step {
        obs: [i as f32; 2],
        id: i,
    };
    let typed = TypedBuffer::<Step>::builder()
        .capacity(8)
        .write_policy(WritePolicy::Immutable)
        .build_from(&(0..8).map(step).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(typed.push(&step(9)).unwrap_err(), DataError::Immutable);
    assert_eq!(
        typed.extend(&[step(9); 3]).unwrap_err(),
        DataError::Immutable
    );
    assert_eq!(typed.clear().unwrap_err(), DataError::Immutable);
    assert_eq!(typed.len(), 8);
    assert!(typed.sample(16).unwrap().rows().iter().all(|s| s.id < 8));

    let list = ListBuffer::<String>::builder()
        .capacity(3)
        .write_policy(WritePolicy::Immutable)
        .build_from(["a", "b", "c"].map(String::from))
        .unwrap();
    assert_eq!(list.push("d".into()).unwrap_err(), DataError::Immutable);
    assert_eq!(
        list.extend(["e".to_string()]).unwrap_err(),
        DataError::Immutable
    );
    assert_eq!(list.clear().unwrap_err(), DataError::Immutable);
    assert_eq!(list.len(), 3);
    assert_eq!(list.get(0).unwrap(), "a");

    // Round robin still writes, on both faces.
    let list = ListBuffer::<u8>::builder().capacity(2).build().unwrap();
    assert_eq!(list.push(7).unwrap(), 0);
}

// ---------------------------------------------------------------------------------
// The max-value writer.

/// `scores.len()` rows with ids `first..`, `obs = [id, -id]` and the given scores.
fn scored(spec: &Spec, first: i64, scores: &[f32]) -> Batch {
    let mut b = rows(spec, scores.len(), first);
    b.set("score", scores).unwrap();
    b
}

fn max_value(capacity: usize, shards: usize) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .shards(shards)
        .write_policy(WritePolicy::max_value("score"))
        .seed(2)
        .build()
        .unwrap()
}

/// The stored (score, id) pairs, sorted, after checking every row whole.
fn stored(rb: &ReplayBuffer) -> Vec<(i64, i64)> {
    let all = rb.read_all_in_order(None);
    let ids = all.column::<i64>("id").unwrap();
    let obs = all.column::<f32>("obs").unwrap();
    let scores = all.column::<f32>("score").unwrap();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for (r, &id) in ids.iter().enumerate() {
        assert_eq!(
            obs[2 * r..2 * r + 2],
            [id as f32, -(id as f32)],
            "row {r} whole"
        );
        out.push((scores[r] as i64, id));
    }
    out.sort_unstable();
    out
}

/// The sequential model: each row enters while there is room, then replaces the
/// lowest stored row if it ranks strictly higher. Returns the rejected rows.
fn model_extend(model: &mut Vec<(i64, i64)>, capacity: usize, rows: &[(i64, i64)]) -> Vec<usize> {
    let mut placed: Vec<Option<usize>> = Vec::new(); // model slot -> batch row
    placed.resize(model.len(), None);
    let mut rejected = vec![false; rows.len()];
    for (r, &row) in rows.iter().enumerate() {
        if model.len() < capacity {
            model.push(row);
            placed.push(Some(r));
            continue;
        }
        let (low, _) = model.iter().enumerate().min_by_key(|(_, &s)| s).unwrap();
        if row.0 > model[low].0 {
            if let Some(earlier) = placed[low] {
                rejected[earlier] = true;
            }
            model[low] = row;
            placed[low] = Some(r);
        } else {
            rejected[r] = true;
        }
    }
    (0..rows.len()).filter(|&r| rejected[r]).collect()
}

#[test]
fn the_max_value_writer_keeps_the_top_rows_and_reports_the_rest() {
    let rb = max_value(4, 1);
    let scores = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 0.0, 6.0, 4.0];
    let written = rb.extend(&scored(rb.spec(), 0, &scores)).unwrap();
    assert_eq!(written.len(), 10);
    // 1, 3 and 2 got in and were displaced by later rows of the same batch; 5 was the
    // lowest when 6 came; 0 and 4 never ranked high enough.
    assert_eq!(written.rejected().collect::<Vec<_>>(), [0, 1, 3, 5, 7, 9]);
    assert_eq!(written.accepted(), 4);
    assert!(written.is_rejected(0) && !written.is_rejected(2));
    assert_eq!(written.get(0), None);
    assert_eq!(written.index(0), u64::MAX);
    assert_eq!(written.generation(0), 0);
    assert_eq!(stored(&rb), [(6, 8), (7, 4), (8, 6), (9, 2)]);

    // Every accepted row is where the extend said, with the generation a sample
    // reports for it.
    let all = rb.read_all_in_order(None);
    for row in [2, 4, 6, 8] {
        let index = written.get(row).unwrap();
        let at = all.index().iter().position(|&i| i == index).unwrap();
        assert_eq!(all.column::<i64>("id").unwrap()[at], row as i64);
        assert_eq!(all.generations()[at], written.generation(row));
    }

    // A later extend competes with what is stored; ties do not displace.
    let w = rb.extend(&scored(rb.spec(), 100, &[6.0, 10.0])).unwrap();
    assert_eq!(w.rejected().collect::<Vec<_>>(), [0]);
    assert_eq!(stored(&rb), [(7, 4), (8, 6), (9, 2), (10, 101)]);
    assert_eq!(rb.len(), 4);
    assert_eq!(
        rb.write_count(),
        4,
        "replacements are in place: the cursor stays"
    );
}

#[test]
fn max_value_matches_the_sequential_model_across_extends_and_shards() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (capacity, shards) in [(1, 1), (7, 1), (16, 4), (33, 2)] {
        let rb = max_value(capacity, shards);
        let writers: Vec<_> = (0..shards).map(|_| rb.writer()).collect();
        let mut model = Vec::new();
        let mut id = 0i64;
        for round in 0..40 {
            let n = (next() % 9) as usize;
            // Distinct scores, so the model's choice among equal ranks never matters.
            let rows: Vec<(i64, i64)> = (0..n)
                .map(|k| {
                    (
                        ((next() % 1000) * 64 + (id + k as i64) as u64 % 64) as i64,
                        id + k as i64,
                    )
                })
                .collect();
            let scores: Vec<f32> = rows.iter().map(|r| r.0 as f32).collect();
            let batch = scored(rb.spec(), id, &scores);
            let written = if round % 2 == 0 {
                rb.extend(&batch).unwrap()
            } else {
                writers[round % shards].extend(&batch).unwrap()
            };
            let rejected = model_extend(&mut model, capacity, &rows);
            assert_eq!(
                written.rejected().collect::<Vec<_>>(),
                rejected,
                "capacity {capacity}, round {round}"
            );
            id += n as i64;
            let mut want = model.clone();
            want.sort_unstable();
            assert_eq!(stored(&rb), want, "capacity {capacity}, round {round}");
        }
    }
}

#[test]
fn max_value_ranks_by_the_reduction_of_a_multi_value_field() {
    let spec = Spec::builder()
        .field("id", DType::I64, [])
        .field("returns", DType::I32, [3])
        .build()
        .unwrap();
    let build = |reduction| {
        ReplayBuffer::builder(spec.clone())
            .capacity(1)
            .write_policy(WritePolicy::MaxValue {
                rank_key: "returns".into(),
                reduction,
            })
            .build()
            .unwrap()
    };
    let mut batch = Batch::zeros(spec.clone(), [2]);
    batch.set("id", &[0i64, 1]).unwrap();
    // Row 0 sums to 9 with a max of 9; row 1 sums to 12 with a max of 4.
    batch.set("returns", &[9i32, 0, 0, 4, 4, 4]).unwrap();
    for (reduction, kept) in [
        (replaybuf::sampler::Reduction::Sum, 1),
        (replaybuf::sampler::Reduction::Max, 0),
        (replaybuf::sampler::Reduction::Mean, 1),
        (replaybuf::sampler::Reduction::Min, 1),
        (replaybuf::sampler::Reduction::Median, 1),
    ] {
        let rb = build(reduction);
        rb.extend(&batch).unwrap();
        assert_eq!(
            rb.get(0).unwrap().column::<i64>("id").unwrap(),
            [kept],
            "{reduction:?}"
        );
    }
}

#[test]
fn max_value_refuses_bad_ranks_and_combinations_it_cannot_serve() {
    let rb = max_value(4, 1);
    let err = rb
        .extend(&scored(rb.spec(), 0, &[1.0, f32::NAN]))
        .unwrap_err();
    assert!(
        matches!(err, DataError::InvalidRank { row: 1, .. }),
        "{err:?}"
    );
    assert_eq!(rb.len(), 0, "a refused batch writes nothing");
    // Infinite ranks order as TorchRL's do: above (or below) every finite one.
    rb.extend(&scored(
        rb.spec(),
        10,
        &[f32::INFINITY, 3.0, f32::NEG_INFINITY, 2.0],
    ))
    .unwrap();
    let w = rb.extend(&scored(rb.spec(), 20, &[1e30, -1e30])).unwrap();
    assert_eq!(w.rejected().collect::<Vec<_>>(), [1]);
    assert_eq!(
        stored(&rb).iter().map(|&(_, id)| id).collect::<Vec<_>>(),
        [13, 11, 10, 20],
        "the row ranked -inf gave way; +inf and 1e30 stay"
    );
    rb.clear().unwrap();
    assert!(matches!(
        rb.extend(&Batch::zeros(spec(), [2, 2])).unwrap_err(),
        DataError::BatchShape { .. }
    ));

    let build = |b: replaybuf::ReplayBufferBuilder| b.build().unwrap_err().to_string();
    let base = || ReplayBuffer::builder(spec()).capacity(8);
    let msg = build(base().write_policy(WritePolicy::max_value("reward")));
    assert!(msg.contains("rank key `reward`"), "{msg}");
    let with_bool = Spec::builder()
        .field("done", DType::Bool, [])
        .build()
        .unwrap();
    let msg = build(
        ReplayBuffer::builder(with_bool)
            .capacity(8)
            .write_policy(WritePolicy::max_value("done")),
    );
    assert!(msg.contains("numeric"), "{msg}");
    let msg = build(
        base()
            .ndim(2)
            .envs(2)
            .write_policy(WritePolicy::max_value("score")),
    );
    assert!(msg.contains("ndim-1"), "{msg}");
    let msg = build(
        base()
            .sampler(Prioritized::new(0.6, 0.4))
            .write_policy(WritePolicy::max_value("score")),
    );
    assert!(msg.contains("prioritized"), "{msg}");
    let slices = Spec::builder()
        .field("score", DType::F32, [])
        .field("traj", DType::I64, [])
        .build()
        .unwrap();
    let msg = build(
        ReplayBuffer::builder(slices)
            .capacity(8)
            .sampler(replaybuf::sampler::Slice::num_slices(2).traj_key("traj"))
            .write_policy(WritePolicy::max_value("score")),
    );
    assert!(msg.contains("slice"), "{msg}");
    assert!(TypedBuffer::<Step>::builder()
        .capacity(4)
        .write_policy(WritePolicy::max_value("row"))
        .build()
        .is_err());
    assert!(ListBuffer::<u8>::builder()
        .capacity(4)
        .write_policy(WritePolicy::max_value("x"))
        .build()
        .is_err());
}

/// Rows re-ranked from storage (after a swap, a load) rank as they did coming in: an
/// infinite rank stays on top. A re-rank took every non-finite rank for the lowest,
/// and a smaller storage dropped the best row, an extend replaced it first.
#[test]
fn an_infinite_rank_stays_on_top_after_a_rerank() {
    let into_smaller = max_value(3, 1);
    into_smaller
        .extend(&scored(into_smaller.spec(), 0, &[f32::INFINITY, 1.0, 2.0]))
        .unwrap();
    into_smaller
        .set_storage(StorageConfig::heap().capacity(2))
        .unwrap();
    assert_eq!(sorted_ids(&into_smaller.read_all_in_order(None)), [0, 2]);

    let in_place = max_value(3, 1);
    in_place
        .extend(&scored(in_place.spec(), 0, &[f32::INFINITY, 1.0, 2.0]))
        .unwrap();
    in_place.set_sampler(WithoutReplacement::new()).unwrap();
    let w = in_place
        .extend(&scored(in_place.spec(), 10, &[1.5]))
        .unwrap();
    assert_eq!(w.rejected().count(), 0);
    assert_eq!(sorted_ids(&in_place.read_all_in_order(None)), [0, 2, 10]);
}

/// A rank or priority field of no values a row is refused when the buffer is built: a
/// median of none panicked on the first extend.
#[test]
fn a_rank_or_priority_field_without_values_is_refused() {
    let spec = Spec::builder()
        .field("score", DType::F32, [0])
        .field("id", DType::I64, [])
        .build()
        .unwrap();
    let msg = ReplayBuffer::builder(spec.clone())
        .capacity(4)
        .write_policy(WritePolicy::MaxValue {
            rank_key: "score".into(),
            reduction: Reduction::Median,
        })
        .build()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("at least one value"), "{msg}");
    let msg = ReplayBuffer::builder(spec)
        .capacity(4)
        .sampler(Prioritized::new(0.6, 0.4).reduction(Reduction::Median))
        .priority_key("score")
        .build()
        .unwrap_err()
        .to_string();
    assert!(msg.contains("at least one value"), "{msg}");
}

/// A typed buffer is not built with a max-value writer, but its untyped buffer may be
/// given one (as a checkpoint may carry one): its pushes are then ranked too, by their
/// bytes, not appended round robin past the writer.
#[test]
fn a_typed_buffer_given_a_max_value_writer_ranks_its_pushes() {
    let typed = TypedBuffer::<[u8; 2]>::builder()
        .capacity(2)
        .build()
        .unwrap();
    typed
        .as_untyped()
        .set_write_policy(WritePolicy::max_value("row"))
        .unwrap();
    typed.extend(&[[1, 1], [5, 5]]).unwrap();
    let w = typed.extend(&[[2, 2], [0, 1]]).unwrap();
    assert_eq!(w.rejected().collect::<Vec<_>>(), [1]);
    assert_eq!(typed.push(&[0, 0]).unwrap(), u64::MAX, "rejected");
    let (mut rows, _) = typed.read_all_in_order(None);
    rows.sort_unstable();
    assert_eq!(rows, [[2, 2], [5, 5]]);
    assert_eq!(
        typed.write_count(),
        2,
        "a replacement is in place: the cursor stays"
    );
}

#[test]
fn write_all_reranks_and_empty_forgets() {
    let rb = max_value(3, 1);
    rb.extend(&scored(rb.spec(), 0, &[10.0, 20.0, 30.0]))
        .unwrap();
    // Rewrite the stored rows in place with low scores: the next rows displace them.
    rb.write_all(&scored(rb.spec(), 50, &[1.0, 2.0, 3.0]), None)
        .unwrap();
    let w = rb.extend(&scored(rb.spec(), 100, &[2.5, 0.5])).unwrap();
    assert_eq!(w.rejected().collect::<Vec<_>>(), [1]);
    assert_eq!(stored(&rb), [(2, 51), (2, 100), (3, 52)]);

    rb.clear().unwrap();
    assert_eq!(rb.len(), 0);
    let w = rb.extend(&scored(rb.spec(), 200, &[-5.0])).unwrap();
    assert_eq!(w.accepted(), 1, "after empty every row has room again");
    assert_eq!(stored(&rb), [(-5, 200)]);
}

#[test]
fn write_all_ranks_only_the_rows_it_writes() {
    let rb = max_value(3, 1);
    rb.extend(&scored(rb.spec(), 0, &[10.0, 20.0, 30.0]))
        .unwrap();
    // Row 2 of the data, past `end`, is neither written nor ranked.
    rb.write_all(&scored(rb.spec(), 50, &[1.0, 2.0, f32::NAN]), Some(2))
        .unwrap();
    assert_eq!(stored(&rb), [(1, 50), (2, 51), (30, 2)]);
}

#[test]
fn write_at_reranks_the_rows_it_rewrites() {
    let rb = max_value(3, 1);
    rb.extend(&scored(rb.spec(), 0, &[10.0, 20.0, 30.0]))
        .unwrap();
    // Position 1 (id 1, score 20) named twice: its last row's score counts.
    rb.write_at(&[1, 2, 1], &scored(rb.spec(), 50, &[40.0, 1.0, 5.0]))
        .unwrap();
    // The lowest now: position 2 (score 1), then position 1 (score 5).
    let w = rb.extend(&scored(rb.spec(), 100, &[6.0, 7.0])).unwrap();
    assert_eq!(w.accepted(), 2);
    assert_eq!(stored(&rb), [(6, 100), (7, 101), (10, 0)]);
}

#[test]
fn max_value_with_epochs_reads_the_rows_stored_now() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(4)
        .sampler(WithoutReplacement::new().shuffle(false))
        .write_policy(WritePolicy::max_value("score"))
        .build()
        .unwrap();
    rb.extend(&scored(rb.spec(), 0, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
        .unwrap();
    let mut seen: Vec<i64> = Vec::new();
    while let Ok(b) = rb.sample(2) {
        seen.extend(b.column::<i64>("id").unwrap());
    }
    seen.sort_unstable();
    assert_eq!(seen, [2, 3, 4, 5]);
}

#[test]
fn max_value_writers_racing_samplers_keep_the_top_rows_whole() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CAPACITY: usize = 64;
    const PER_WRITER: i64 = 20_000;
    let rb = max_value(CAPACITY, 2);
    // Scores are a bijection of ids, so every score is distinct.
    let score = |id: i64| ((id * 7919) % (2 * PER_WRITER)) as f32;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2i64)
            .map(|w| {
                let writer = rb.writer();
                s.spawn(move || {
                    let spec = writer.buffer().spec().clone();
                    for chunk in 0..PER_WRITER / 50 {
                        let first = w * PER_WRITER + chunk * 50;
                        let scores: Vec<f32> = (first..first + 50).map(score).collect();
                        writer.extend(&scored(&spec, first, &scores)).unwrap();
                    }
                })
            })
            .collect();
        let (rb, stop) = (&rb, &stop);
        s.spawn(move || {
            let mut learner = rb.learner();
            let mut batch = rb.batch([32]);
            while !stop.load(Ordering::Relaxed) {
                if learner.sample_into(&mut batch).is_err() {
                    continue;
                }
                let ids = batch.column::<i64>("id").unwrap();
                let obs = batch.column::<f32>("obs").unwrap();
                let scores = batch.column::<f32>("score").unwrap();
                for (r, &id) in ids.iter().enumerate() {
                    assert_eq!(obs[2 * r..2 * r + 2], [id as f32, -(id as f32)], "torn row");
                    assert_eq!(scores[r], score(id), "torn row");
                }
            }
        });
        // Let the writers finish, then stop the sampler.
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let mut all: Vec<(i64, i64)> = (0..2 * PER_WRITER)
        .map(|id| (score(id) as i64, id))
        .collect();
    all.sort_unstable();
    assert_eq!(stored(&rb), all[all.len() - CAPACITY..]);
}

/// A one-row max-value buffer ranking by a `[values]` field of `dtype`.
fn one_row_ranked_by(dtype: DType, values: usize, reduction: Reduction) -> ReplayBuffer {
    let spec = Spec::builder()
        .field("id", DType::I64, [])
        .field("rank", dtype, [values])
        .build()
        .unwrap();
    ReplayBuffer::builder(spec)
        .capacity(1)
        .write_policy(WritePolicy::MaxValue {
            rank_key: "rank".into(),
            reduction,
        })
        .build()
        .unwrap()
}

/// The id kept after extending, one batch after another, with rows of these ranks.
fn kept_of<T: replaybuf::Element + Copy>(rb: &ReplayBuffer, batches: &[&[T]]) -> i64 {
    let mut id = 0i64;
    for ranks in batches {
        let per_row = rb.spec().field("rank").unwrap().1.elements();
        let n = ranks.len() / per_row;
        let mut b = rb.batch([n]);
        b.set("id", &(id..id + n as i64).collect::<Vec<_>>())
            .unwrap();
        b.set("rank", ranks).unwrap();
        rb.extend(&b).unwrap();
        id += n as i64;
    }
    rb.get(0).unwrap().column::<i64>("id").unwrap()[0]
}

#[test]
fn integer_ranks_past_two_to_the_53_order_exactly() {
    // As f64s they rounded together: a strictly higher rank (a nanosecond timestamp
    // one tick later) was rejected as a tie.
    let rb = one_row_ranked_by(DType::I64, 1, Reduction::Sum);
    assert_eq!(kept_of::<i64>(&rb, &[&[1 << 53], &[(1 << 53) + 1]]), 1);
    let rb = one_row_ranked_by(DType::U64, 1, Reduction::Max);
    assert_eq!(kept_of::<u64>(&rb, &[&[u64::MAX - 1000, u64::MAX]]), 1);
    // A sum of several: 2^53 + 3 above 2^53 + 2, which an f64 sum had below it.
    let rb = one_row_ranked_by(DType::I64, 4, Reduction::Sum);
    assert_eq!(
        kept_of::<i64>(&rb, &[&[(1 << 53) + 2, 0, 0, 0], &[1 << 53, 1, 1, 1]]),
        1
    );
    let rb = one_row_ranked_by(DType::I64, 2, Reduction::Mean);
    assert_eq!(
        kept_of::<i64>(&rb, &[&[i64::MAX, i64::MAX - 1], &[i64::MAX, i64::MAX]]),
        1,
        "a mean of large values, without overflow"
    );
}

#[test]
fn infinite_and_overflowing_ranks_keep_their_order() {
    // +inf was clamped to f64::MAX, and a sum that overflowed to one MAX: each then
    // tied with MAX and was rejected.
    let rb = one_row_ranked_by(DType::F64, 1, Reduction::Sum);
    assert_eq!(kept_of::<f64>(&rb, &[&[f64::MAX, f64::INFINITY]]), 1);
    let rb = one_row_ranked_by(DType::F64, 2, Reduction::Sum);
    assert_eq!(
        kept_of::<f64>(&rb, &[&[f64::MAX, 0.0], &[f64::MAX, f64::MAX]]),
        1
    );
    let rb = one_row_ranked_by(DType::F64, 1, Reduction::Sum);
    assert_eq!(kept_of::<f64>(&rb, &[&[f64::NEG_INFINITY], &[f64::MIN]]), 1);
}

#[test]
fn a_nan_among_a_rows_rank_values_is_refused_by_every_reduction() {
    // Max, Min and Median skipped it (f64::max, a sort) and ranked the row by the rest.
    for reduction in [
        Reduction::Max,
        Reduction::Min,
        Reduction::Median,
        Reduction::Mean,
        Reduction::Sum,
    ] {
        let rb = one_row_ranked_by(DType::F32, 2, reduction);
        let mut b = rb.batch([1]);
        b.set("rank", &[f32::NAN, 5.0]).unwrap();
        assert!(
            matches!(rb.extend(&b), Err(DataError::InvalidRank { row: 0, .. })),
            "{reduction:?}"
        );
        assert_eq!(rb.len(), 0);
    }
    // A prioritized buffer's priority field reduces the same way: refused too.
    let spec = Spec::builder()
        .field("td", DType::F32, [2])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec)
        .capacity(4)
        .sampler(Prioritized::new(0.6, 0.4).reduction(Reduction::Max))
        .priority_key("td")
        .build()
        .unwrap();
    let mut b = rb.batch([1]);
    b.set("td", &[f32::NAN, 5.0]).unwrap();
    assert!(rb.extend(&b).is_err());
    assert_eq!(rb.len(), 0);
}
