//! The public API as a user meets it: building, every kind of bad input (each returns
//! its error and changes nothing), multi-environment storage and `dim_extend`, the
//! samplers' contracts, determinism under a seed, and the typed and list faces.

use replaybuf::error::{AccessError, DataError, SampleError, SpecError};
use replaybuf::list::ListBuffer;
use replaybuf::sampler::{Uniform, WithoutReplacement};
use replaybuf::typed::TypedBuffer;
use replaybuf::{Batch, DType, Key, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [2])
        .field("id", DType::I64, [])
        .field("done", DType::Bool, [])
        .build()
        .unwrap()
}

fn buffer(capacity: usize) -> ReplayBuffer {
    ReplayBuffer::builder(spec())
        .capacity(capacity)
        .seed(1)
        .build()
        .unwrap()
}

/// A batch of `shape` with ids `first..`.
fn rows(rb: &ReplayBuffer, shape: &[usize], first: i64) -> Batch {
    let mut b = rb.batch(shape);
    let ids: Vec<i64> = (first..first + b.len() as i64).collect();
    let obs: Vec<f32> = ids
        .iter()
        .flat_map(|&i| [i as f32, 2.0 * i as f32])
        .collect();
    b.set("id", &ids).unwrap();
    b.set("obs", &obs).unwrap();
    b
}

fn ids(batch: &Batch) -> Vec<i64> {
    batch.column::<i64>("id").unwrap().to_vec()
}

#[test]
fn handles_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<ReplayBuffer>();
    both::<replaybuf::Writer>();
    both::<replaybuf::Learner>();
    both::<Batch>();
    both::<TypedBuffer<[u32; 4]>>();
    both::<ListBuffer<String>>();
}

#[test]
fn build_errors_name_the_problem() {
    let err = |b: replaybuf::ReplayBufferBuilder| b.build().unwrap_err();
    let base = || ReplayBuffer::builder(spec()).capacity(8);
    assert!(err(ReplayBuffer::builder(spec())).is_zero_capacity());
    assert!(err(base().capacity(0)).is_zero_capacity());
    assert!(err(base().shards(3)).is_bad_shards());
    assert!(
        err(base().shards(16)).is_bad_shards(),
        "more shards than slots"
    );
    assert!(err(base().shards(0)).is_bad_shards());
    let messages = [
        err(base().ndim(3)).to_string(),
        err(base().ndim(2)).to_string(),
        err(base().envs(2)).to_string(),
        err(base().ndim(2).envs(3)).to_string(),
        err(base().ndim(2).envs(2).shards(4)).to_string(),
        err(base().dim_extend(1)).to_string(),
        err(base().batch_size(0)).to_string(),
    ];
    for (m, want) in messages.iter().zip([
        "ndim must be 1 or 2",
        "needs `envs(E)`",
        "only applies to an ndim-2",
        "not a multiple of envs",
        "more than this buffer can use",
        "dim_extend 1 must be below ndim 1",
        "batch_size must be at least 1",
    ]) {
        assert!(m.contains(want), "`{m}` should say `{want}`");
    }
    assert_eq!(
        Spec::builder()
            .field("a", DType::U8, [1])
            .field("a", DType::U8, [1])
            .build(),
        Err(SpecError::DuplicateKey {
            key: Key::from("a")
        })
    );
}

#[test]
fn bad_data_is_refused_and_changes_nothing() {
    let rb = buffer(8);
    rb.extend(&rows(&rb, &[3], 0)).unwrap();
    let before = rb.read_all_in_order(None);

    let other = |s: Spec| Batch::zeros(s, [2]);
    let missing = other(
        Spec::builder()
            .field("obs", DType::F32, [2])
            .field("id", DType::I64, [])
            .build()
            .unwrap(),
    );
    assert_eq!(
        rb.extend(&missing).unwrap_err(),
        DataError::MissingField { key: "done".into() }
    );
    let wrong_dtype = other(
        Spec::builder()
            .field("obs", DType::F64, [2])
            .field("id", DType::I64, [])
            .field("done", DType::Bool, [])
            .build()
            .unwrap(),
    );
    assert!(matches!(
        rb.extend(&wrong_dtype),
        Err(DataError::DType {
            expected: DType::F32,
            found: DType::F64,
            ..
        })
    ));
    let wrong_shape = other(
        Spec::builder()
            .field("obs", DType::F32, [3])
            .field("id", DType::I64, [])
            .field("done", DType::Bool, [])
            .build()
            .unwrap(),
    );
    assert!(matches!(
        rb.extend(&wrong_shape),
        Err(DataError::FieldShape { .. })
    ));
    let extra = other(
        Spec::builder()
            .field("obs", DType::F32, [2])
            .field("id", DType::I64, [])
            .field("done", DType::Bool, [])
            .field("x", DType::U8, [])
            .build()
            .unwrap(),
    );
    assert_eq!(
        rb.extend(&extra).unwrap_err(),
        DataError::UnknownField { key: "x".into() }
    );
    assert!(matches!(
        rb.extend(&rb.batch([2, 2])),
        Err(DataError::BatchShape { .. })
    ));
    assert!(matches!(
        rb.add(&rb.batch([2])),
        Err(DataError::BatchShape { .. })
    ));

    let mut b = rb.batch([2]);
    assert!(matches!(
        b.set("id", &[1i64]),
        Err(DataError::Length {
            expected: 2,
            found: 1,
            ..
        })
    ));
    assert!(matches!(
        b.column::<f32>("id"),
        Err(DataError::DType { .. })
    ));
    assert!(matches!(
        b.column::<f32>("nope"),
        Err(DataError::UnknownField { .. })
    ));

    assert_eq!(rb.len(), 3);
    assert_eq!(rb.write_count(), 3);
    assert_eq!(ids(&rb.read_all_in_order(None)), ids(&before));
}

#[test]
fn a_rejected_extend_does_not_take_a_shard_turn() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(8)
        .shards(2)
        .seed(1)
        .build()
        .unwrap();
    assert!(rb.extend(&rb.batch([2, 2])).is_err());
    // The first accepted extend still goes to shard 0, which starts at index 0.
    assert_eq!(rb.extend(&rows(&rb, &[1], 0)).unwrap().to_vec(), [0]);
    assert_eq!(rb.extend(&rows(&rb, &[1], 1)).unwrap().to_vec(), [4]);
}

#[test]
fn sample_errors() {
    let rb = buffer(8);
    assert_eq!(rb.sample(4).unwrap_err(), SampleError::Empty);
    assert_eq!(rb.sample_default().unwrap_err(), SampleError::NoBatchSize);
    // Iterations with no batch size (none built, or batches of 0 rows, which went on
    // forever) say so once and end.
    for items in [
        (&rb).into_iter().take(5).collect::<Vec<_>>(),
        rb.batches(0).take(5).collect(),
    ] {
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].as_ref().unwrap_err(), &SampleError::NoBatchSize);
    }
    // Any other error is the iteration's last item: an empty buffer's, and fewer
    // rows than a batch under drop_last, were yielded forever (a loop skipping
    // errors, or `count`, never ended).
    let items: Vec<_> = rb.batches(4).take(3).collect();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].as_ref().unwrap_err(), &SampleError::Empty);
    let short = ReplayBuffer::builder(spec())
        .capacity(16)
        .sampler(replaybuf::sampler::WithoutReplacement::new().drop_last(true))
        .build()
        .unwrap();
    short.extend(&short.batch([10])).unwrap();
    let items: Vec<_> = short.batches(32).take(5).collect();
    assert_eq!(items.len(), 1);
    assert!(
        matches!(items[0], Err(SampleError::NotEnough { .. })),
        "{items:?}"
    );
    let mut empty = rb.batch([0]);
    assert_eq!(
        rb.sample_into(&mut empty).unwrap_err(),
        SampleError::NoBatchSize
    );
    let other = Batch::zeros(
        Spec::builder().field("x", DType::U8, []).build().unwrap(),
        [2],
    );
    rb.extend(&rows(&rb, &[2], 0)).unwrap();
    assert_eq!(
        rb.sample_into(&mut other.clone()).unwrap_err(),
        SampleError::SpecMismatch
    );
    assert_eq!(rb.sample(0).unwrap().len(), 0);

    let wor = ReplayBuffer::builder(spec())
        .capacity(8)
        .sampler(WithoutReplacement::new())
        .build()
        .unwrap();
    assert_eq!(wor.sample(1).unwrap_err(), SampleError::Empty);
    wor.extend(&rows(&wor, &[3], 0)).unwrap();
    // More rows than are stored: the epoch's one batch is all of them, as TorchRL's
    // sampler gives them; with drop_last, no batch could be whole.
    let mut all = wor.sample(4).unwrap().index().to_vec();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2]);
    assert_eq!(wor.sample(4).unwrap_err(), SampleError::EpochEnd);
    let dropping = ReplayBuffer::builder(spec())
        .capacity(8)
        .sampler(WithoutReplacement::new().drop_last(true))
        .build()
        .unwrap();
    dropping.extend(&rows(&dropping, &[3], 0)).unwrap();
    assert_eq!(
        dropping.sample(4).unwrap_err(),
        SampleError::NotEnough {
            requested: 4,
            available: 3
        }
    );
}

#[test]
fn sample_into_a_batch_with_the_fields_in_another_order() {
    let rb = buffer(8);
    rb.extend(&rows(&rb, &[4], 0)).unwrap();
    let reordered = Spec::builder()
        .field("done", DType::Bool, [])
        .field("id", DType::I64, [])
        .field("obs", DType::F32, [2])
        .build()
        .unwrap();
    let mut batch = Batch::zeros(reordered, [3]);
    rb.sample_into(&mut batch).unwrap();
    for (&id, obs) in batch
        .column::<i64>("id")
        .unwrap()
        .iter()
        .zip(batch.column::<f32>("obs").unwrap().chunks(2))
    {
        assert_eq!(obs, [id as f32, 2.0 * id as f32]);
    }
    // And an extend from it lands field by field.
    rb.extend(&batch).unwrap();
}

#[test]
fn index_errors_and_in_place_writes() {
    let rb = buffer(4);
    rb.extend(&rows(&rb, &[2], 0)).unwrap();
    assert_eq!(
        rb.get(4).unwrap_err(),
        AccessError::OutOfRange {
            index: 4,
            capacity: 4
        }
    );
    assert_eq!(rb.get(2).unwrap_err(), AccessError::NotWritten { index: 2 });
    assert_eq!(
        rb.get_many(&[1, 3]).unwrap_err(),
        AccessError::NotWritten { index: 3 }
    );
    assert_eq!(ids(&rb.get_many(&[1, 0, 1]).unwrap()), [1, 0, 1]);

    // write_all over positions that hold no row is refused, and writes nothing.
    let new = rows(&rb, &[3], 100);
    assert_eq!(
        rb.write_all(&new, None).unwrap_err(),
        AccessError::NotWritten { index: 2 }
    );
    assert_eq!(ids(&rb.read_all_in_order(None)), [0, 1]);
    assert!(matches!(
        rb.write_all(&new, Some(5)),
        Err(AccessError::Data(DataError::BatchShape { .. }))
    ));
    rb.write_all(&new, Some(2)).unwrap();
    assert_eq!(ids(&rb.read_all_in_order(None)), [100, 101]);
    assert_eq!(ids(&rb.read_all_in_order(Some(1))), [100]);
    assert_eq!(rb.write_count(), 2, "rewrites are not new writes");
}

#[test]
fn writes_at_chosen_positions_in_order_or_not_at_all() {
    let rb = buffer(4);
    rb.extend(&rows(&rb, &[3], 0)).unwrap();
    // Positions past the stored rows, past the capacity, or a row count that does not
    // match: refused, and nothing is written.
    let new = rows(&rb, &[3], 100);
    assert_eq!(
        rb.write_at(&[2, 3, 0], &new).unwrap_err(),
        AccessError::NotWritten { index: 3 }
    );
    assert_eq!(
        rb.write_at(&[0, 9, 1], &new).unwrap_err(),
        AccessError::OutOfRange {
            index: 9,
            capacity: 4
        }
    );
    assert!(matches!(
        rb.write_at(&[0, 1], &new),
        Err(AccessError::Data(DataError::BatchShape { .. }))
    ));
    assert_eq!(ids(&rb.read_all_in_order(None)), [0, 1, 2]);
    // Row r goes to indices[r]; a position named twice keeps its last row.
    rb.write_at(&[2, 0, 2], &new).unwrap();
    assert_eq!(ids(&rb.read_all_in_order(None)), [101, 1, 102]);
    rb.write_at(&[], &rows(&rb, &[0], 200)).unwrap();
    assert_eq!(ids(&rb.read_all_in_order(None)), [101, 1, 102]);
    assert_eq!(rb.write_count(), 3, "rewrites are not new writes");
}

#[test]
fn fifo_eviction_and_emptying() {
    let rb = buffer(4);
    let w = rb.extend(&rows(&rb, &[6], 0)).unwrap();
    assert_eq!(
        w.to_vec(),
        [0, 1, 2, 3, 0, 1],
        "an extend longer than the ring wraps"
    );
    assert_eq!(ids(&rb.read_all_in_order(None)), [4, 5, 2, 3]);
    assert_eq!((rb.len(), rb.write_count()), (4, 6));
    rb.extend(&rows(&rb, &[1], 6)).unwrap();
    assert_eq!(
        ids(&rb.read_all_in_order(None)),
        [4, 5, 6, 3],
        "the oldest row goes first"
    );

    rb.clear().unwrap();
    assert!(rb.is_empty());
    assert_eq!(rb.write_count(), 0);
    assert_eq!(rb.sample(1).unwrap_err(), SampleError::Empty);
    assert_eq!(rb.get(0).unwrap_err(), AccessError::NotWritten { index: 0 });
    rb.extend(&rows(&rb, &[1], 7)).unwrap();
    assert_eq!(ids(&rb.read_all_in_order(None)), [7]);
    assert_eq!(
        rb.read_all_in_order(None).index(),
        [3],
        "the ring goes on from its cursor"
    );
}

#[test]
fn emptying_ends_an_epoch() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(8)
        .sampler(WithoutReplacement::new())
        .seed(2)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, &[4], 0)).unwrap();
    rb.sample(1).unwrap();
    rb.clear().unwrap();
    assert_eq!(
        rb.sample(2).unwrap_err(),
        SampleError::Empty,
        "no dropped row comes back"
    );
    rb.extend(&rows(&rb, &[2], 10)).unwrap();
    let mut seen = ids(&rb.sample(2).unwrap());
    seen.sort_unstable();
    assert_eq!(seen, [10, 11]);
}

#[test]
fn epochs_end_clearly_and_restart() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(8)
        .sampler(WithoutReplacement::new().shuffle(false))
        .build()
        .unwrap();
    rb.extend(&rows(&rb, &[5], 0)).unwrap();
    assert_eq!(ids(&rb.sample(2).unwrap()), [0, 1]);
    assert_eq!(ids(&rb.sample(2).unwrap()), [2, 3]);
    assert_eq!(
        ids(&rb.sample(2).unwrap()),
        [4],
        "the last batch is short without drop_last"
    );
    assert_eq!(rb.sample(2).unwrap_err(), SampleError::EpochEnd);
    assert_eq!(
        ids(&rb.sample(2).unwrap()),
        [0, 1],
        "the next call starts a new epoch"
    );

    let dropping = ReplayBuffer::builder(spec())
        .capacity(8)
        .sampler(WithoutReplacement::new().drop_last(true))
        .seed(3)
        .build()
        .unwrap();
    dropping.extend(&rows(&dropping, &[5], 0)).unwrap();
    let mut seen: Vec<i64> = (0..2)
        .flat_map(|_| ids(&dropping.sample(2).unwrap()))
        .collect();
    assert_eq!(
        dropping.sample(2).unwrap_err(),
        SampleError::EpochEnd,
        "a short batch is dropped"
    );
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 4, "no row twice in an epoch");
}

#[test]
fn same_seed_same_samples() {
    let run = |seed: u64| {
        let rb = ReplayBuffer::builder(spec())
            .capacity(1000)
            .seed(seed)
            .build()
            .unwrap();
        rb.extend(&rows(&rb, &[1000], 0)).unwrap();
        let mut learner = rb.learner();
        let a: Vec<u64> = (0..5)
            .flat_map(|_| rb.sample(16).unwrap().index().to_vec())
            .collect();
        let b: Vec<u64> = (0..5)
            .flat_map(|_| learner.sample(16).unwrap().index().to_vec())
            .collect();
        (a, b)
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42).0, run(43).0);
    assert_ne!(run(42).0, run(42).1, "a learner has a stream of its own");

    // A learner's clone goes on with a copy of its stream; a second handle does not.
    let rb = ReplayBuffer::builder(spec())
        .capacity(1000)
        .seed(42)
        .build()
        .unwrap();
    rb.extend(&rows(&rb, &[1000], 0)).unwrap();
    let mut learner = rb.learner();
    learner.sample(16).unwrap();
    let (mut clone, mut other) = (learner.clone(), rb.learner());
    let next = learner.sample(16).unwrap().index().to_vec();
    assert_eq!(clone.sample(16).unwrap().index(), next);
    assert_ne!(other.sample(16).unwrap().index(), next);

    let shuffled = |seed: u64| {
        let rb = ReplayBuffer::builder(spec())
            .capacity(64)
            .sampler(WithoutReplacement::new())
            .seed(seed)
            .build()
            .unwrap();
        rb.extend(&rows(&rb, &[64], 0)).unwrap();
        rb.sample(64).unwrap().index().to_vec()
    };
    assert_eq!(shuffled(7), shuffled(7));
    assert_ne!(shuffled(7), (0..64).collect::<Vec<u64>>());
}

#[test]
fn uniform_sampling_is_uniform_across_shards() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(40)
        .shards(4)
        .seed(5)
        .sampler(Uniform)
        .build()
        .unwrap();
    // Unequal fill: shards get 10, 10, 10 and 2 rows.
    for k in 0..4 {
        rb.extend(&rows(&rb, &[if k == 3 { 2 } else { 10 }], k * 100))
            .unwrap();
    }
    let mut counts = std::collections::HashMap::new();
    let draws = 32_000;
    for _ in 0..draws / 320 {
        for id in ids(&rb.sample(320).unwrap()) {
            *counts.entry(id).or_insert(0usize) += 1;
        }
    }
    assert_eq!(counts.len(), 32, "every live row is drawn");
    let expected = draws as f64 / 32.0;
    for (id, n) in counts {
        assert!(
            (n as f64 - expected).abs() < 0.2 * expected,
            "row {id} drawn {n} times, expected about {expected}"
        );
    }
}

#[test]
fn multi_env_storage_and_dim_extend() {
    // Shape [3, 4]: 3 steps of 4 environments, time on dim 0 of extended batches.
    let rb = ReplayBuffer::builder(spec())
        .capacity(12)
        .ndim(2)
        .envs(4)
        .dim_extend(0)
        .shards(2)
        .build()
        .unwrap();
    let w = rb.extend(&rows(&rb, &[2, 4], 0)).unwrap();
    assert_eq!(
        w.to_vec(),
        (0..8).collect::<Vec<u64>>(),
        "index t * envs + e"
    );
    rb.extend(&rows(&rb, &[2, 4], 8)).unwrap();
    // Step 3 of every env wrapped to t = 0: each column is its env's trajectory.
    assert_eq!(
        ids(&rb.read_all_in_order(None)),
        [12, 13, 14, 15, 4, 5, 6, 7, 8, 9, 10, 11]
    );
    assert!(matches!(
        rb.extend(&rows(&rb, &[4, 2], 0)),
        Err(DataError::BatchShape { .. })
    ));

    // dim_extend 1 (TorchRL's default for ndim 2): batches are [envs, t].
    let rb = ReplayBuffer::builder(spec())
        .capacity(12)
        .ndim(2)
        .envs(4)
        .build()
        .unwrap();
    let w = rb.extend(&rows(&rb, &[4, 2], 0)).unwrap();
    // Row e * t + j holds env e, step j: it lands at index j * 4 + e.
    assert_eq!(w.to_vec(), [0, 4, 1, 5, 2, 6, 3, 7]);
    assert_eq!(
        ids(&rb.get(5).unwrap()),
        [3],
        "env 1, step 1 was row 1 * 2 + 1"
    );

    // Collectors own disjoint env groups and extend them alone.
    let rb = ReplayBuffer::builder(spec())
        .capacity(12)
        .ndim(2)
        .envs(4)
        .dim_extend(0)
        .shards(2)
        .build()
        .unwrap();
    let (a, b) = (rb.writer(), rb.writer());
    assert_eq!((a.envs(), b.envs()), (Some(0..2), Some(2..4)));
    assert_eq!(b.extend(&rows(&rb, &[1, 2], 50)).unwrap().to_vec(), [2, 3]);
    assert_eq!(b.extend(&rows(&rb, &[1, 2], 60)).unwrap().to_vec(), [6, 7]);
    assert_eq!(a.extend(&rows(&rb, &[1, 2], 70)).unwrap().to_vec(), [0, 1]);
    assert_eq!(rb.len(), 6);
    assert!(matches!(
        a.extend(&rows(&rb, &[1, 4], 0)),
        Err(DataError::BatchShape { .. })
    ));
    assert!(matches!(
        rb.add(&rows(&rb, &[1], 0)),
        Err(DataError::BatchShape { .. })
    ));
}

#[test]
fn views_and_nested_keys() {
    let spec = Spec::builder()
        .field("obs", DType::U8, [2, 3])
        .field(("next", "obs"), DType::U8, [2, 3])
        .field("h", DType::F16, [2])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec).capacity(4).build().unwrap();
    let mut b = rb.batch([2]);
    b.column_mut::<u8>(("next", "obs"))
        .unwrap()
        .copy_from_slice(&[7; 12]);
    b.set("h", &[replaybuf::half::f16::from_f32(1.5); 4])
        .unwrap();
    rb.extend(&b).unwrap();
    let s = rb.sample(3).unwrap();
    let view = s.view::<u8>(["next", "obs"]).unwrap();
    assert_eq!(view.shape, &[3, 2, 3]);
    assert!(view.data.iter().all(|&v| v == 7));
    assert_eq!(
        s.column::<replaybuf::half::f16>("h").unwrap()[5].to_f32(),
        1.5
    );
    assert_eq!(s.dtype("h").unwrap(), DType::F16);
}

#[test]
fn typed_buffer() {
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    struct Step {
        obs: [f32; 3],
        action: u32,
    }
    let rb = TypedBuffer::<Step>::builder()
        .capacity(3)
        .seed(4)
        .build()
        .unwrap();
    let step = |i: u32| Step {
        obs: [i as f32; 3],
        action: i,
    };
    assert_eq!(rb.push(&step(0)).unwrap(), 0);
    assert_eq!(
        rb.extend(&[step(1), step(2), step(3)]).unwrap().to_vec(),
        [1, 2, 0]
    );
    assert_eq!(rb.get(0).unwrap(), step(3));
    assert_eq!(
        rb.read_all_in_order(None),
        (vec![step(3), step(1), step(2)], vec![0, 1, 2])
    );
    let batch = rb.sample(50).unwrap();
    for (s, &i) in batch.rows().iter().zip(batch.index()) {
        assert_eq!(*s, rb.get(i).unwrap());
    }
    let mut reused = replaybuf::typed::TypedBatch::new();
    assert_eq!(
        rb.sample_into(&mut reused).unwrap_err(),
        SampleError::NoBatchSize
    );
    for n in [usize::MAX, 1 << 40] {
        assert_eq!(rb.sample(n).unwrap_err(), SampleError::TooLarge { rows: n });
    }
    assert!(
        TypedBuffer::<()>::builder().capacity(4).build().is_err(),
        "zero-sized rows are refused"
    );
}

#[test]
fn list_buffer_holds_any_clone_type() {
    let rb = ListBuffer::<Vec<String>>::builder()
        .capacity(4)
        .shards(2)
        .seed(6)
        .sampler(WithoutReplacement::new().shuffle(false))
        .build()
        .unwrap();
    for i in 0..6 {
        rb.push(vec![format!("step {i}")]).unwrap();
    }
    assert_eq!(rb.len(), 4);
    assert_eq!(rb.write_count(), 6);
    let batch = rb.sample(4).unwrap();
    let mut got: Vec<String> = batch.items().iter().map(|v| v[0].clone()).collect();
    got.sort();
    assert_eq!(got, ["step 2", "step 3", "step 4", "step 5"]);
    assert_eq!(
        rb.get(9).unwrap_err(),
        AccessError::OutOfRange {
            index: 9,
            capacity: 4
        }
    );
    for n in [usize::MAX, 1 << 40] {
        assert_eq!(rb.sample(n).unwrap_err(), SampleError::TooLarge { rows: n });
    }
    assert!(ListBuffer::<u8>::builder().capacity(0).build().is_err());
    // A capacity past the memory is an error (it aborted the process).
    let e = ListBuffer::<u8>::builder()
        .capacity(1 << 50)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("memory"), "{e}");
    rb.clear().unwrap();
    assert_eq!(rb.sample(1).unwrap_err(), SampleError::Empty);
}

/// A list buffer whose values panic when dropped: the append that replaces one
/// panics, after it has stored all its values, and the buffer goes on (the panic
/// came inside the append's claim: its later slots were never written, and the next
/// append of their positions, and a save, waited for good).
#[test]
fn a_list_value_that_panics_when_dropped_leaves_a_working_buffer() {
    #[derive(Clone, serde::Serialize, serde::Deserialize)]
    struct Loud(u32);
    impl Drop for Loud {
        fn drop(&mut self) {
            if self.0 == 1 && !std::thread::panicking() {
                panic!("value 1 dropped");
            }
        }
    }
    let rb = ListBuffer::<Loud>::builder().capacity(4).build().unwrap();
    rb.extend((0..4).map(Loud)).unwrap();
    let lapping = rb.clone();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lapping.extend((10..14).map(Loud)).map(drop)
    }));
    assert!(outcome.is_err(), "dropping value 1 panicked");
    let (tx, rx) = std::sync::mpsc::channel();
    let after = rb.clone();
    #[allow(clippy::disallowed_methods)] // a hang shows as a timeout
    std::thread::spawn(move || {
        after.extend((20..26).map(Loud)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        after.save(dir.path()).unwrap();
        let mut got: Vec<u32> = (0..4).map(|i| after.get(i).unwrap().0).collect();
        got.sort_unstable();
        tx.send(got).unwrap();
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the appends and the save after the panic return");
    assert_eq!(got, [22, 23, 24, 25]);
}

#[test]
fn generations_at_are_those_a_read_of_the_rows_gives() {
    let rb = buffer(8);
    rb.extend(&rows(&rb, &[6], 0)).unwrap();
    let at = [5, 0, 3];
    let read = rb.get_many(&at).unwrap();
    assert_eq!(rb.generations_at(&at).unwrap(), read.generations());
    // Lapped: the new rows' generations.
    rb.extend(&rows(&rb, &[4], 6)).unwrap();
    let now = rb.generations_at(&at).unwrap();
    assert_eq!(now, rb.get_many(&at).unwrap().generations());
    assert_eq!(now[0], read.generations()[0], "position 5 was not lapped");
    assert_ne!(now[1], read.generations()[1], "position 0 was");
    let small = buffer(8);
    small.extend(&rows(&small, &[2], 0)).unwrap();
    assert_eq!(
        small.generations_at(&[1, 2]).unwrap_err(),
        AccessError::NotWritten { index: 2 }
    );
    assert_eq!(
        small.generations_at(&[8]).unwrap_err(),
        AccessError::OutOfRange {
            index: 8,
            capacity: 8
        }
    );
}

#[test]
fn a_typed_buffer_of_rows_too_large_is_refused_not_a_panic() {
    type Huge = [u8; (1 << 30) + 8];
    let e = TypedBuffer::<Huge>::builder()
        .capacity(1)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("row"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let small = TypedBuffer::<u64>::builder().capacity(4).build().unwrap();
    small.save(dir.path()).unwrap();
    assert!(TypedBuffer::<Huge>::from_checkpoint(dir.path()).is_err());
}

#[test]
fn a_list_sample_of_large_items_past_memory_is_refused_before_drawing() {
    // Room for the draws was there (32 bytes a row), and the items' `vec!` (64 KiB
    // a row) aborted the process.
    let rb = ListBuffer::<[u8; 1 << 16]>::builder()
        .capacity(4)
        .sampler(WithoutReplacement::new().shuffle(false))
        .build()
        .unwrap();
    for _ in 0..4 {
        rb.push([7; 1 << 16]).unwrap();
    }
    let n = 1 << 26;
    assert_eq!(rb.sample(n).unwrap_err(), SampleError::TooLarge { rows: n });
    assert_eq!(rb.sample(4).unwrap().items().len(), 4, "the epoch is whole");
}

#[test]
fn a_borrowed_batch_of_more_bytes_than_memory_is_refused() {
    // Its column sizes wrapped: 2^62 rows of 8-byte obs needed 0 bytes, the empty
    // columns passed, and the extend that followed claimed the rows and panicked,
    // leaving them claimed and never written (the next extend hung).
    let rb = buffer(8);
    let refused = Batch::borrowing(rb.spec().clone(), [1 << 62], &[&[], &[], &[]], |b| {
        rb.extend(b).map(|w| w.len())
    });
    assert!(
        matches!(refused, Err(DataError::BatchShape { .. })),
        "{refused:?}"
    );
    assert_eq!(rb.len(), 0);
    rb.extend(&rows(&rb, &[3], 0)).unwrap();
    assert_eq!(rb.len(), 3);
    let caught = std::panic::catch_unwind(|| Batch::zeros(spec(), [1 << 62]));
    assert!(caught.is_err(), "a batch past the address space panics");
}
