//! Write policies: the immutable writer (a read-only dataset refuses every write, on
//! every face, and changes nothing) and the max-value writer (the top rows by a rank
//! field stay; the rest are reported rejected).

use replaybuf::bytemuck::{Pod, Zeroable};
use replaybuf::{
    AccessError, Batch, DType, DataError, ListBuffer, Prioritized, ReplayBuffer, Spec, TypedBuffer,
    WithoutReplacement, WritePolicy,
};

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
        .writer(WritePolicy::Immutable)
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
            .writer(WritePolicy::Immutable)
            .build_from(&rows(&spec, 100, 0))
            .unwrap();
        assert_eq!(rb.len(), 100, "{shards} shards");
        assert_eq!(
            sorted_ids(&rb.read_all_in_order(None)),
            (0..100).collect::<Vec<_>>(),
            "{shards} shards: every row stays"
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
        .writer(WritePolicy::Immutable)
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
        .writer(WritePolicy::Immutable)
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
        .writer(WritePolicy::Immutable)
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
        .writer(WritePolicy::Immutable)
        .build_from(&(0..8).map(step).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(typed.push(&step(9)).unwrap_err(), DataError::Immutable);
    assert_eq!(
        typed.extend(&[step(9); 3]).unwrap_err(),
        DataError::Immutable
    );
    assert_eq!(typed.len(), 8);
    assert!(typed.sample(16).unwrap().rows().iter().all(|s| s.id < 8));

    let list = ListBuffer::<String>::builder()
        .capacity(3)
        .writer(WritePolicy::Immutable)
        .build_from(["a", "b", "c"].map(String::from))
        .unwrap();
    assert_eq!(list.push("d".into()).unwrap_err(), DataError::Immutable);
    assert_eq!(
        list.extend(["e".to_string()]).unwrap_err(),
        DataError::Immutable
    );
    assert_eq!(list.len(), 3);
    assert_eq!(list.get(0).unwrap(), "a");

    // Round robin still writes, on both faces.
    let list = ListBuffer::<u8>::builder().capacity(2).build().unwrap();
    assert_eq!(list.push(7).unwrap(), 0);
}
