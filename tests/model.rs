//! Property tests: the buffer against the sequential reference model, on random
//! sequences of operations (lengths, indices, contents, eviction order, emptying,
//! in-place rewrites), for ndim 1 and ndim 2 storages.

use proptest::prelude::*;
use replaybuf::error::{AccessError, SampleError};
use replaybuf::reference::ReferenceBuffer;
use replaybuf::sampler::WithoutReplacement;
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [3])
        .field("flag", DType::Bool, [])
        .field(("next", "small"), DType::I16, [2])
        .build()
        .unwrap()
}

/// A batch of `shape` whose rows are numbered from `first`; every field derives from
/// the row's number, so any mix-up shows.
fn rows(rb: &ReplayBuffer, shape: &[usize], first: u64) -> Batch {
    let mut b = rb.batch(shape);
    let n = b.len();
    let ids: Vec<u64> = (first..first + n as u64).collect();
    b.set("id", &ids).unwrap();
    let obs: Vec<f32> = ids
        .iter()
        .flat_map(|&i| [i as f32, -(i as f32), 0.5])
        .collect();
    b.set("obs", &obs).unwrap();
    let flags: Vec<bool> = ids.iter().map(|&i| i % 3 == 0).collect();
    b.set("flag", &flags).unwrap();
    let small: Vec<i16> = ids
        .iter()
        .flat_map(|&i| [i as i16, (i >> 16) as i16])
        .collect();
    b.set(("next", "small"), &small).unwrap();
    b
}

#[derive(Clone, Debug)]
enum Op {
    /// Buffer-level extend (round robin over shards for ndim 1, all envs for ndim 2).
    Extend(usize),
    /// Extend through writer handle `k % shards`.
    ExtendVia(usize, usize),
    Get(u64),
    ReadAll(Option<usize>),
    WriteAll(Option<usize>),
    /// Rewrites these positions (some past the stored rows, some twice).
    WriteAt(Vec<u64>),
    Empty,
    Sample(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (0usize..12).prop_map(Op::Extend),
            3 => (0usize..4, 0usize..12).prop_map(|(k, n)| Op::ExtendVia(k, n)),
            2 => (0u64..48).prop_map(Op::Get),
            1 => prop::option::of(0usize..48).prop_map(Op::ReadAll),
            1 => prop::option::of(0usize..20).prop_map(Op::WriteAll),
            1 => prop::collection::vec(0u64..24, 0..6).prop_map(Op::WriteAt),
            1 => Just(Op::Empty),
            2 => (1usize..20).prop_map(Op::Sample),
        ],
        1..40,
    )
}

/// Checks that every row of `batch` is the model's live row at its index.
fn check_rows(model: &ReferenceBuffer, batch: &Batch) {
    for (r, &index) in batch.index().iter().enumerate() {
        let stored = model
            .get(index)
            .unwrap_or_else(|| panic!("row {r} came from index {index}, which holds no live row"));
        assert_eq!(model.row_of(batch, r), stored, "row {r} at index {index}");
    }
}

fn check_state(rb: &ReplayBuffer, model: &ReferenceBuffer) {
    assert_eq!(rb.len(), model.len());
    assert_eq!(rb.write_count(), model.write_count());
    let all = rb.read_all_in_order(None);
    let want = model.read_all_in_order(None);
    assert_eq!(
        all.index(),
        want.iter().map(|&(i, _)| i).collect::<Vec<_>>()
    );
    check_rows(model, &all);
}

fn run(rb: &ReplayBuffer, model: &mut ReferenceBuffer, ops: &[Op], env_major: bool) {
    let shards = rb.shards();
    let writers: Vec<_> = (0..shards).map(|_| rb.writer()).collect();
    let mut next_id = 0u64;
    let mut round_robin = 0usize;
    for op in ops {
        match *op {
            Op::Extend(n) => {
                if rb.ndim() == 1 {
                    let b = rows(rb, &[n], next_id);
                    let got = rb.extend(&b).unwrap().to_vec();
                    let k = round_robin % shards;
                    round_robin += 1;
                    assert_eq!(got, model.extend(k, &b), "extend of {n} to shard {k}");
                } else {
                    let envs = rb.envs();
                    let shape = if env_major { [envs, n] } else { [n, envs] };
                    let b = rows(rb, &shape, next_id);
                    let got = rb.extend(&b).unwrap().to_vec();
                    assert_eq!(got, model.extend_grid(&b, env_major));
                }
                next_id += 1000;
            }
            Op::ExtendVia(k, n) => {
                let w = &writers[k % shards];
                if rb.ndim() == 1 {
                    let b = rows(rb, &[n], next_id);
                    assert_eq!(w.extend(&b).unwrap().to_vec(), model.extend(w.shard(), &b));
                } else {
                    let group = w.envs().unwrap();
                    let width = group.len();
                    let shape = if env_major { [width, n] } else { [n, width] };
                    let b = rows(rb, &shape, next_id);
                    let got = w.extend(&b).unwrap().to_vec();
                    let data: Vec<Vec<u8>> = (0..b.len()).map(|r| model.row_of(&b, r)).collect();
                    let row = |j: usize, lane: usize| {
                        if env_major {
                            lane * n + j
                        } else {
                            j * width + lane
                        }
                    };
                    let at = model.append(w.shard(), n, |j, lane| data[row(j, lane)].clone());
                    let mut want = vec![0; b.len()];
                    for j in 0..n {
                        for lane in 0..width {
                            want[row(j, lane)] = at[j * width + lane];
                        }
                    }
                    assert_eq!(got, want);
                }
                next_id += 1000;
            }
            Op::Get(i) => match (rb.get(i), model.get(i)) {
                (Ok(b), Some(row)) => {
                    assert_eq!(b.index(), &[i]);
                    assert_eq!(model.row_of(&b, 0), row);
                }
                (Err(AccessError::NotWritten { index }), None) => assert_eq!(index, i),
                (Err(AccessError::OutOfRange { index, .. }), None) => {
                    assert!(index >= rb.capacity() as u64)
                }
                (got, want) => panic!("get({i}): buffer {got:?}, model {want:?}"),
            },
            Op::ReadAll(end) => {
                let got = rb.read_all_in_order(end);
                let want = model.read_all_in_order(end);
                assert_eq!(
                    got.index(),
                    want.iter().map(|&(i, _)| i).collect::<Vec<_>>()
                );
                check_rows(model, &got);
            }
            Op::WriteAll(end) => {
                let n = end.unwrap_or(rb.len()).min(rb.capacity());
                let b = rows(rb, &[n], next_id);
                next_id += 1000;
                let ok = rb.write_all(&b, end).is_ok();
                assert_eq!(
                    ok,
                    model.write_all(&b, end),
                    "write_all({end:?}) of {n} rows"
                );
            }
            Op::WriteAt(ref indices) => {
                let b = rows(rb, &[indices.len()], next_id);
                next_id += 1000;
                let ok = rb.write_at(indices, &b).is_ok();
                assert_eq!(ok, model.write_at(indices, &b), "write_at({indices:?})");
            }
            Op::Empty => {
                rb.clear().unwrap();
                model.clear();
            }
            Op::Sample(n) => match rb.sample(n) {
                Ok(b) => {
                    assert_eq!(b.len(), n);
                    check_rows(model, &b);
                }
                Err(SampleError::Empty) => assert!(model.is_empty()),
                Err(e) => panic!("sample({n}): {e}"),
            },
        }
        check_state(rb, model);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn flat_storage_matches_the_model(capacity in 1usize..40, shard_bits in 0u32..3, ops in ops()) {
        let shards = (1usize << shard_bits).min(capacity.next_power_of_two() / 2).max(1);
        let rb = ReplayBuffer::builder(spec()).capacity(capacity).shards(shards).seed(3).build().unwrap();
        let mut model = ReferenceBuffer::new(spec(), capacity, shards);
        run(&rb, &mut model, &ops, false);
    }

    #[test]
    fn grid_storage_matches_the_model(
        steps in 1usize..8,
        envs in 1usize..6,
        shard_bits in 0u32..3,
        env_major in any::<bool>(),
        ops in ops(),
    ) {
        let shards = (1usize << shard_bits).min(envs.next_power_of_two() / 2).max(1);
        let rb = ReplayBuffer::builder(spec())
            .capacity(steps * envs)
            .ndim(2)
            .envs(envs)
            .dim_extend(usize::from(env_major))
            .shards(shards)
            .seed(5)
            .build()
            .unwrap();
        let mut model = ReferenceBuffer::grid(spec(), steps, envs, shards);
        run(&rb, &mut model, &ops, env_major);
    }

    /// An epoch without replacement visits every live row exactly once, then ends.
    #[test]
    fn epochs_visit_every_row_once(
        capacity in 1usize..60,
        writes in prop::collection::vec(1usize..30, 1..5),
        batch in 1usize..16,
        drop_last in any::<bool>(),
        shuffle in any::<bool>(),
    ) {
        let rb = ReplayBuffer::builder(spec())
            .capacity(capacity)
            .seed(9)
            .sampler(WithoutReplacement::new().drop_last(drop_last).shuffle(shuffle))
            .build()
            .unwrap();
        let mut model = ReferenceBuffer::new(spec(), capacity, 1);
        let mut id = 0;
        for n in writes {
            let b = rows(&rb, &[n], id);
            id += 1000;
            rb.extend(&b).unwrap();
            model.extend(0, &b);
        }
        let live = model.len();
        if batch > live && drop_last {
            prop_assert_eq!(
                rb.sample(batch).unwrap_err(),
                SampleError::NotEnough { requested: batch, available: live }
            );
            return Ok(());
        }
        for _epoch in 0..2 {
            let mut seen = Vec::new();
            loop {
                match rb.sample(batch) {
                    Ok(b) => {
                        check_rows(&model, &b);
                        prop_assert!(b.len() == batch || (!drop_last && b.len() < batch));
                        seen.extend_from_slice(b.index());
                    }
                    Err(SampleError::EpochEnd) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), seen.len(), "a row came twice in one epoch");
            let expected = if drop_last { live / batch * batch } else { live };
            prop_assert_eq!(seen.len(), expected);
            if !shuffle {
                prop_assert!(seen.windows(2).all(|w| w[0] < w[1]), "unshuffled epochs go in storage order");
            }
        }
    }
}
