//! `split_trajectories`: cutting `[E, T]` / `[T, E]` / `[T]` collector batches into
//! padded trajectories by end flags or trajectory ids, checked row by row against
//! hand-worked cases and, in property tests, against TorchRL's algorithm (cumulative
//! sums of shifted done flags, then runs of equal ids) written out plainly here.

use proptest::prelude::*;
use replaybuf::error::DataError;
use replaybuf::trajectories::{
    split_trajectories, Split, Trajectories, TrajectoryError, TrajectoryOrigin,
};
use replaybuf::{Batch, DType, Key, Spec};

/// `obs` is the payload checked row by row: step `t` of environment `e` holds
/// `[100 e + t, -(100 e + t)]`.
fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [2])
        .field("reward", DType::F64, [1])
        .field(("next", "done"), DType::Bool, [])
        .field(("next", "truncated"), DType::Bool, [1])
        .field("traj", DType::I64, [])
        .build()
        .unwrap()
}

fn obs_of(env: usize, step: usize) -> [f32; 2] {
    let v = (100 * env + step) as f32;
    [v, -v]
}

/// A `[E, T]` batch (time last) whose `obs` encodes each row's environment and step,
/// with `done` set at the given `(env, step)` places; `reward` is `obs[0] + 0.5`.
fn batch_et(envs: usize, steps: usize, done_at: &[(usize, usize)]) -> Batch {
    let mut batch = Batch::zeros(spec(), [envs, steps]);
    let mut obs = Vec::new();
    let mut reward = Vec::new();
    for e in 0..envs {
        for t in 0..steps {
            obs.extend(obs_of(e, t));
            reward.push(f64::from(obs_of(e, t)[0]) + 0.5);
        }
    }
    batch.set("obs", &obs).unwrap();
    batch.set("reward", &reward).unwrap();
    let done = batch.column_mut::<bool>(("next", "done")).unwrap();
    for &(e, t) in done_at {
        done[e * steps + t] = true;
    }
    batch
}

/// The same rows as a `[E, T]` batch, laid out `[T, E]`.
fn transposed(batch: &Batch) -> Batch {
    let [envs, steps] = batch.shape() else {
        panic!("not 2-dim")
    };
    let (envs, steps) = (*envs, *steps);
    let mut out = Batch::zeros(batch.spec().clone(), [steps, envs]);
    macro_rules! transpose {
        ($key:expr, $ty:ty) => {{
            let src = batch.column::<$ty>($key).unwrap();
            let per_row = src.len() / (envs * steps);
            let mut dst = vec![<$ty>::default(); src.len()];
            for e in 0..envs {
                for t in 0..steps {
                    let (from, to) = ((e * steps + t) * per_row, (t * envs + e) * per_row);
                    dst[to..to + per_row].copy_from_slice(&src[from..from + per_row]);
                }
            }
            out.set($key, &dst).unwrap();
        }};
    }
    transpose!("obs", f32);
    transpose!("reward", f64);
    transpose!(("next", "done"), bool);
    transpose!(("next", "truncated"), bool);
    transpose!("traj", i64);
    out
}

/// Every field of padding row `row` of `trajs` is zero.
fn assert_padding_zero(trajs: &Trajectories, row: usize) {
    let b = trajs.batch();
    assert_eq!(
        &b.column::<f32>("obs").unwrap()[2 * row..2 * row + 2],
        &[0.0; 2]
    );
    assert_eq!(b.column::<f64>("reward").unwrap()[row], 0.0);
    assert!(!b.column::<bool>(("next", "done")).unwrap()[row]);
    assert!(!b.column::<bool>(("next", "truncated")).unwrap()[row]);
    assert_eq!(b.column::<i64>("traj").unwrap()[row], 0);
}

/// Every real row of `trajs` holds the input row its origin names (by the `obs` and
/// `reward` encoding), every padding row is zero, and the mask says which is which.
fn assert_rows_match_origins(trajs: &Trajectories) {
    let b = trajs.batch();
    let max_len = trajs.max_len();
    assert_eq!(b.shape(), &[trajs.count(), max_len]);
    assert_eq!(trajs.mask().len(), trajs.count() * max_len);
    let obs = b.column::<f32>("obs").unwrap();
    let reward = b.column::<f64>("reward").unwrap();
    for (i, (&len, origin)) in trajs.lengths().iter().zip(trajs.origins()).enumerate() {
        assert!((1..=max_len).contains(&len));
        assert_eq!(trajs.rows(i), Some(i * max_len..i * max_len + len));
        for k in 0..max_len {
            let row = i * max_len + k;
            assert_eq!(
                trajs.mask()[row],
                k < len,
                "mask of trajectory {i} step {k}"
            );
            if k < len {
                let want = obs_of(origin.env, origin.step + k);
                assert_eq!(&obs[2 * row..2 * row + 2], &want, "trajectory {i} step {k}");
                assert_eq!(reward[row], f64::from(want[0]) + 0.5);
            } else {
                assert_padding_zero(trajs, row);
            }
        }
    }
    assert_eq!(trajs.rows(trajs.count()), None);
}

fn origin(env: usize, step: usize) -> TrajectoryOrigin {
    TrajectoryOrigin { env, step }
}

#[test]
fn done_flags_cut_a_2x5_batch_exactly() {
    // env 0: done after steps 1 and 3 -> [0, 1], [2, 3], [4]
    // env 1: done after step 2        -> [0, 1, 2], [3, 4]
    let batch = batch_et(2, 5, &[(0, 1), (0, 3), (1, 2)]);
    let trajs = split_trajectories(&batch, &Split::default()).unwrap();

    assert_eq!(trajs.count(), 5);
    assert_eq!(trajs.max_len(), 3);
    assert_eq!(trajs.lengths(), &[2, 2, 1, 3, 2]);
    assert_eq!(
        trajs.origins(),
        &[
            origin(0, 0),
            origin(0, 2),
            origin(0, 4),
            origin(1, 0),
            origin(1, 3)
        ]
    );
    #[rustfmt::skip]
    let mask = [
        true, true, false,
        true, true, false,
        true, false, false,
        true, true, true,
        true, true, false,
    ];
    assert_eq!(trajs.mask(), &mask);

    // The payload, row by row (padding rows are zero).
    #[rustfmt::skip]
    let obs: [f32; 15] = [
        0.0, 1.0, 0.0,
        2.0, 3.0, 0.0,
        4.0, 0.0, 0.0,
        100.0, 101.0, 102.0,
        103.0, 104.0, 0.0,
    ];
    let got = trajs.batch().column::<f32>("obs").unwrap();
    for (row, &v) in obs.iter().enumerate() {
        assert_eq!(&got[2 * row..2 * row + 2], &[v, -v], "row {row}");
    }
    // The done flags travel with their rows: each trajectory but an environment's last
    // ends on its done step.
    #[rustfmt::skip]
    let done = [
        false, true, false,
        false, true, false,
        false, false, false,
        false, false, true,
        false, false, false,
    ];
    assert_eq!(
        trajs.batch().column::<bool>(("next", "done")).unwrap(),
        &done
    );
    assert!(std::sync::Arc::ptr_eq(trajs.batch().spec(), batch.spec()));
    assert_rows_match_origins(&trajs);
}

#[test]
fn no_done_flag_gives_one_trajectory_per_environment() {
    let batch = batch_et(3, 4, &[]);
    let trajs = split_trajectories(&batch, &Split::default()).unwrap();
    assert_eq!(trajs.lengths(), &[4, 4, 4]);
    assert_eq!(trajs.origins(), &[origin(0, 0), origin(1, 0), origin(2, 0)]);
    assert!(trajs.mask().iter().all(|&m| m));
    assert_rows_match_origins(&trajs);
    // Nothing to pad: the output holds the input's rows as they were.
    assert_eq!(
        trajs.batch().column::<f32>("obs").unwrap(),
        batch.column::<f32>("obs").unwrap()
    );
}

#[test]
fn a_done_flag_on_every_step_gives_length_one_trajectories() {
    let all: Vec<(usize, usize)> = (0..2).flat_map(|e| (0..3).map(move |t| (e, t))).collect();
    let trajs = split_trajectories(&batch_et(2, 3, &all), &Split::default()).unwrap();
    assert_eq!(trajs.lengths(), &[1; 6]);
    assert_eq!(trajs.max_len(), 1);
    assert_rows_match_origins(&trajs);
}

#[test]
fn a_one_dim_batch_is_one_environment() {
    let spec = spec();
    let mut batch = Batch::zeros(spec, [6]);
    let obs: Vec<f32> = (0..6).flat_map(|t| obs_of(0, t)).collect();
    batch.set("obs", &obs).unwrap();
    let reward: Vec<f64> = (0..6).map(|t| f64::from(obs_of(0, t)[0]) + 0.5).collect();
    batch.set("reward", &reward).unwrap();
    batch.column_mut::<bool>(("next", "done")).unwrap()[2] = true;
    for split in [Split::default(), Split::default().time_first(true)] {
        let trajs = split_trajectories(&batch, &split).unwrap();
        assert_eq!(trajs.lengths(), &[3, 3]);
        assert_eq!(trajs.origins(), &[origin(0, 0), origin(0, 3)]);
        assert_rows_match_origins(&trajs);
    }
}

#[test]
fn integer_end_flags_are_set_when_not_zero() {
    let spec = Spec::builder()
        .field("x", DType::U16, [])
        .field("end", DType::I32, [1])
        .build()
        .unwrap();
    let mut batch = Batch::zeros(spec, [1, 6]);
    batch.set("x", &[1u16, 2, 3, 4, 5, 6]).unwrap();
    batch.set("end", &[0i32, -7, 0, 0, 2, 0]).unwrap();
    let trajs = split_trajectories(&batch, &Split::by_end_key("end")).unwrap();
    assert_eq!(trajs.lengths(), &[2, 3, 1]);
    assert_eq!(
        trajs.batch().column::<u16>("x").unwrap(),
        &[1, 2, 0, 3, 4, 5, 6, 0, 0]
    );
}

#[test]
fn truncated_flags_end_trajectories_too() {
    // env 0: done after step 1, truncated after step 3 -> [0, 1], [2, 3], [4]
    // env 1: truncated after step 0 and done after it  -> [0], [1, 2, 3, 4]
    let mut batch = batch_et(2, 5, &[(0, 1), (1, 0)]);
    {
        let truncated = batch.column_mut::<bool>(("next", "truncated")).unwrap();
        truncated[3] = true;
        truncated[5] = true;
    }
    let split = Split::default().truncated_key(("next", "truncated"));
    let trajs = split_trajectories(&batch, &split).unwrap();
    assert_eq!(trajs.lengths(), &[2, 2, 1, 1, 4]);
    assert_eq!(
        trajs.origins(),
        &[
            origin(0, 0),
            origin(0, 2),
            origin(0, 4),
            origin(1, 0),
            origin(1, 1)
        ]
    );
    assert_rows_match_origins(&trajs);

    // Without the truncated key, truncation alone does not cut.
    let trajs = split_trajectories(&batch, &Split::default()).unwrap();
    assert_eq!(trajs.lengths(), &[2, 3, 1, 4]);

    // Truncation alone, with the end key set nowhere.
    let mut batch = batch_et(1, 4, &[]);
    batch.column_mut::<bool>(("next", "truncated")).unwrap()[1] = true;
    let trajs = split_trajectories(&batch, &split).unwrap();
    assert_eq!(trajs.lengths(), &[2, 2]);
}

#[test]
fn trajectory_ids_cut_where_the_id_changes() {
    // env 0: ids 7 7 7 2 2 -> [0, 1, 2], [3, 4]
    // env 1: ids 5 5 9 9 9 -> [0, 1], [2, 3, 4]
    let mut batch = batch_et(2, 5, &[(0, 0), (1, 4)]); // done flags are ignored
    batch
        .set("traj", &[7i64, 7, 7, 2, 2, 5, 5, 9, 9, 9])
        .unwrap();
    let trajs = split_trajectories(&batch, &Split::by_traj_key("traj")).unwrap();
    assert_eq!(trajs.lengths(), &[3, 2, 2, 3]);
    assert_eq!(
        trajs.origins(),
        &[origin(0, 0), origin(0, 3), origin(1, 0), origin(1, 2)]
    );
    assert_eq!(
        trajs.batch().column::<i64>("traj").unwrap(),
        &[7, 7, 7, 2, 2, 0, 5, 5, 0, 9, 9, 9]
    );
    assert_rows_match_origins(&trajs);
}

#[test]
fn trajectory_ids_of_every_integer_width_compare_exactly() {
    // u64::MAX and i64::MIN would collide if ids were narrowed or cast to i64.
    let spec = Spec::builder()
        .field("u", DType::U64, [])
        .field("i", DType::I64, [1])
        .field("b", DType::U8, [])
        .build()
        .unwrap();
    let mut batch = Batch::zeros(spec, [5]);
    batch
        .set("u", &[u64::MAX, u64::MAX, 0, 0, 1 << 63])
        .unwrap();
    batch
        .set("i", &[-1i64, -1, i64::MIN, i64::MIN, i64::MAX])
        .unwrap();
    batch.set("b", &[255u8, 0, 0, 1, 1]).unwrap();
    let lengths = |key| {
        split_trajectories(&batch, &Split::by_traj_key(key))
            .unwrap()
            .lengths()
            .to_vec()
    };
    assert_eq!(lengths("u"), [2, 2, 1]);
    assert_eq!(lengths("i"), [2, 2, 1]);
    assert_eq!(lengths("b"), [1, 2, 2]);
}

#[test]
fn time_first_matches_the_transposed_time_last_batch() {
    let mut batch = batch_et(3, 4, &[(0, 0), (0, 2), (2, 1)]);
    batch.column_mut::<bool>(("next", "truncated")).unwrap()[5] = true;
    batch
        .set("traj", &[1i64, 1, 2, 2, 3, 3, 3, 4, 5, 6, 6, 6])
        .unwrap();
    let batch_te = transposed(&batch);
    assert_eq!(batch_te.shape(), &[4, 3]);

    for split in [
        Split::default(),
        Split::default().truncated_key(("next", "truncated")),
        Split::by_traj_key("traj"),
    ] {
        let et = split_trajectories(&batch, &split).unwrap();
        let te = split_trajectories(&batch_te, &split.clone().time_first(true)).unwrap();
        assert_eq!(et.lengths(), te.lengths());
        assert_eq!(et.origins(), te.origins());
        assert_eq!(et.mask(), te.mask());
        assert_eq!(et.batch().shape(), te.batch().shape());
        for field in batch.spec().fields() {
            assert_eq!(
                et.batch().column_bytes(field.key()).unwrap(),
                te.batch().column_bytes(field.key()).unwrap(),
                "field {}",
                field.key()
            );
        }
        assert_rows_match_origins(&te);
    }
}

#[test]
fn into_batch_hands_back_the_padded_batch() {
    let trajs = split_trajectories(&batch_et(2, 3, &[(1, 0)]), &Split::default()).unwrap();
    let obs = trajs.batch().column::<f32>("obs").unwrap().to_vec();
    let batch = trajs.into_batch();
    assert_eq!(batch.shape(), &[3, 3]);
    assert_eq!(batch.column::<f32>("obs").unwrap(), &obs[..]);
}

// ---- errors ----

fn key(k: impl Into<Key>) -> Key {
    k.into()
}

fn error_of(batch: &Batch, split: &Split) -> TrajectoryError {
    split_trajectories(batch, split).expect_err("the split should fail")
}

#[test]
fn a_missing_key_is_named() {
    let batch = batch_et(2, 3, &[]);
    for (split, missing) in [
        (Split::by_end_key("done"), key("done")),
        (
            Split::by_traj_key(("collector", "traj_ids")),
            key(("collector", "traj_ids")),
        ),
        (
            Split::default().truncated_key("truncated"),
            key("truncated"),
        ),
        // A parent of a field is not a field.
        (Split::by_end_key("next"), key("next")),
    ] {
        let err = error_of(&batch, &split);
        assert_eq!(
            err,
            TrajectoryError::MissingKey {
                key: missing.clone()
            }
        );
        assert_eq!(
            err.to_string(),
            format!("field `{missing}` is not in the batch")
        );
    }
    // The default split names `("next", "done")`.
    let spec = Spec::builder()
        .field("done", DType::Bool, [])
        .build()
        .unwrap();
    assert_eq!(
        error_of(&Batch::zeros(spec, [3]), &Split::default()),
        TrajectoryError::MissingKey {
            key: key(("next", "done"))
        }
    );
}

#[test]
fn a_key_field_of_the_wrong_dtype_is_refused() {
    let batch = batch_et(2, 3, &[]);
    let err = error_of(&batch, &Split::by_end_key("reward"));
    assert_eq!(
        err,
        TrajectoryError::EndKeyDType {
            key: key("reward"),
            found: DType::F64
        }
    );
    assert_eq!(
        err.to_string(),
        "end-flag field `reward` is f64; end flags must be bool or integers"
    );
    let err = error_of(&batch, &Split::default().truncated_key("reward"));
    assert!(matches!(err, TrajectoryError::EndKeyDType { .. }), "{err}");

    // Trajectory ids are integers: neither bool nor float.
    let err = error_of(&batch, &Split::by_traj_key(("next", "done")));
    assert_eq!(
        err,
        TrajectoryError::TrajKeyDType {
            key: key(("next", "done")),
            found: DType::Bool
        }
    );
    assert_eq!(
        err.to_string(),
        "trajectory-id field `next.done` is bool; trajectory ids must be integers"
    );
    let err = error_of(&batch, &Split::by_traj_key("reward"));
    assert_eq!(
        err,
        TrajectoryError::TrajKeyDType {
            key: key("reward"),
            found: DType::F64
        }
    );
    let spec = Spec::builder().field("id", DType::F16, []).build().unwrap();
    assert!(matches!(
        error_of(&Batch::zeros(spec, [2]), &Split::by_traj_key("id")),
        TrajectoryError::TrajKeyDType {
            found: DType::F16,
            ..
        }
    ));
}

#[test]
fn a_key_field_with_other_than_one_element_per_step_is_refused() {
    let spec = Spec::builder()
        .field("obs", DType::I64, [2])
        .field("none", DType::Bool, [0])
        .field("one", DType::Bool, [1, 1])
        .build()
        .unwrap();
    let batch = Batch::zeros(spec, [2, 3]);
    let err = error_of(&batch, &Split::by_traj_key("obs"));
    assert_eq!(
        err,
        TrajectoryError::NotScalar {
            key: key("obs"),
            shape: vec![2]
        }
    );
    assert_eq!(
        err.to_string(),
        "field `obs` has shape [2] per step; a split key needs one element per step"
    );
    assert_eq!(
        error_of(&batch, &Split::by_end_key("none")),
        TrajectoryError::NotScalar {
            key: key("none"),
            shape: vec![0]
        }
    );
    assert!(matches!(
        error_of(&batch, &Split::by_end_key("one").truncated_key("obs")),
        TrajectoryError::NotScalar { .. }
    ));
    // `[1, 1]` is one element per step.
    assert_eq!(
        split_trajectories(&batch, &Split::by_end_key("one"))
            .unwrap()
            .lengths(),
        &[3, 3]
    );
}

#[test]
fn a_batch_of_other_than_one_or_two_dims_is_refused() {
    for shape in [vec![], vec![2, 3, 4]] {
        let batch = Batch::zeros(spec(), &shape);
        let err = error_of(&batch, &Split::default());
        assert_eq!(
            err,
            TrajectoryError::BatchDims {
                shape: shape.clone()
            }
        );
        assert!(err.to_string().contains(&format!("{shape:?}")), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("has {} dims", shape.len())),
            "{err}"
        );
    }
}

#[test]
fn an_empty_batch_is_refused() {
    for shape in [vec![0], vec![0, 5], vec![2, 0]] {
        let batch = Batch::zeros(spec(), &shape);
        for split in [
            Split::default(),
            Split::default().time_first(true),
            Split::by_traj_key("traj"),
        ] {
            let err = error_of(&batch, &split);
            assert_eq!(
                err,
                TrajectoryError::Empty {
                    shape: shape.clone()
                }
            );
            assert_eq!(
                err.to_string(),
                format!("batch shape {shape:?} holds no step to split")
            );
        }
    }
}

#[test]
fn an_id_in_two_environments_is_refused() {
    let mut batch = batch_et(3, 3, &[]);
    batch.set("traj", &[1i64, 1, 2, 3, 3, 3, 4, 4, 2]).unwrap();
    let err = error_of(&batch, &Split::by_traj_key("traj"));
    assert_eq!(
        err,
        TrajectoryError::IdInTwoEnvs {
            id: 2,
            first_env: 0,
            env: 2
        }
    );
    assert_eq!(
        err.to_string(),
        "trajectory id 2 appears in environment 0 and in environment 2"
    );
    // Even where the environments' rows meet: an environment's steps end its
    // trajectories.
    batch.set("traj", &[1i64, 1, 2, 2, 3, 3, 4, 4, 4]).unwrap();
    assert_eq!(
        error_of(&batch, &Split::by_traj_key("traj")),
        TrajectoryError::IdInTwoEnvs {
            id: 2,
            first_env: 0,
            env: 1
        }
    );
}

#[test]
fn an_id_that_reappears_after_another_is_refused() {
    let mut batch = batch_et(2, 5, &[]);
    batch
        .set("traj", &[1i64, 1, 1, 1, 1, 2, 3, 3, 2, 2])
        .unwrap();
    let err = error_of(&batch, &Split::by_traj_key("traj"));
    assert_eq!(
        err,
        TrajectoryError::IdNotContiguous {
            id: 2,
            env: 1,
            step: 3
        }
    );
    assert_eq!(
        err.to_string(),
        "trajectory id 2 reappears at step 3 of environment 1 after another id; \
         a trajectory's steps must be contiguous"
    );
    // Time first: the same rows transposed give the same error.
    let err = error_of(
        &transposed(&batch),
        &Split::by_traj_key("traj").time_first(true),
    );
    assert_eq!(
        err,
        TrajectoryError::IdNotContiguous {
            id: 2,
            env: 1,
            step: 3
        }
    );
}

#[test]
fn a_truncated_key_on_an_id_split_is_refused() {
    let batch = batch_et(2, 3, &[]);
    let split = Split::by_traj_key("traj").truncated_key(("next", "truncated"));
    let err = error_of(&batch, &split);
    assert_eq!(
        err,
        TrajectoryError::TruncatedWithTrajKey {
            key: key(("next", "truncated"))
        }
    );
    assert!(err
        .to_string()
        .starts_with("truncated key `next.truncated` only applies"));
}

#[test]
fn errors_are_std_errors_and_data_errors_pass_through() {
    let err: Box<dyn std::error::Error> = Box::new(TrajectoryError::MissingKey { key: key("x") });
    assert!(err.source().is_none());
    // `Data` is transparent: its message is the data error's.
    let data = DataError::InvalidBool { key: key("done") };
    let err = TrajectoryError::from(data.clone());
    assert_eq!(err, TrajectoryError::Data(data.clone()));
    assert_eq!(err.to_string(), data.to_string());
}

// ---- properties ----

/// TorchRL's own algorithm, written out plainly: ids are the cumulative sum of the done
/// flags shifted one step later, offset per environment past the previous
/// environment's largest id; a trajectory is a run of equal ids in `[E, T]` order.
fn torchrl_lengths(done: &[bool], envs: usize, steps: usize) -> Vec<usize> {
    let mut ids = Vec::with_capacity(envs * steps);
    let mut base = 0u64;
    for e in 0..envs {
        let mut id = base;
        for t in 0..steps {
            if t > 0 && done[e * steps + t - 1] {
                id += 1;
            }
            ids.push(id);
        }
        base = id + 1;
    }
    let mut lengths: Vec<usize> = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 && ids[i - 1] == *id {
            *lengths.last_mut().unwrap() += 1;
        } else {
            lengths.push(1);
        }
    }
    lengths
}

/// A `[E, T]` batch with random done flags and random payload, and its ids as TorchRL
/// would number its trajectories.
fn random_batch() -> impl Strategy<Value = Batch> {
    (1usize..5, 1usize..9)
        .prop_flat_map(|(envs, steps)| {
            let rows = envs * steps;
            (
                Just((envs, steps)),
                prop::collection::vec(any::<bool>(), rows),
                prop::collection::vec(any::<bool>(), rows),
                prop::collection::vec(any::<f32>(), 2 * rows),
            )
        })
        .prop_map(|((envs, steps), done, truncated, obs)| {
            let mut batch = Batch::zeros(spec(), [envs, steps]);
            batch.set(("next", "done"), &done).unwrap();
            batch.set(("next", "truncated"), &truncated).unwrap();
            batch.set("obs", &obs).unwrap();
            let reward: Vec<f64> = (0..envs * steps).map(|r| r as f64).collect();
            batch.set("reward", &reward).unwrap();
            // Ids: a fresh one after every done step, distinct across environments.
            let ids: Vec<i64> = (0..envs * steps)
                .scan((0i64, usize::MAX), |(id, env), r| {
                    if r / steps != *env || (r % steps > 0 && done[r - 1]) {
                        *id += 1;
                        *env = r / steps;
                    }
                    Some(*id * 3 - 50)
                })
                .collect();
            batch.set("traj", &ids).unwrap();
            batch
        })
}

/// Each environment's steps, as the trajectories' unmasked rows give them back in
/// order: `(obs, reward)` per step, environment by environment.
fn unmasked_rows(trajs: &Trajectories) -> Vec<([u32; 2], f64)> {
    let obs = trajs.batch().column::<f32>("obs").unwrap();
    let reward = trajs.batch().column::<f64>("reward").unwrap();
    (0..trajs.mask().len())
        .filter(|&row| trajs.mask()[row])
        .map(|row| {
            (
                [obs[2 * row].to_bits(), obs[2 * row + 1].to_bits()],
                reward[row],
            )
        })
        .collect()
}

fn input_rows(batch: &Batch) -> Vec<([u32; 2], f64)> {
    let obs = batch.column::<f32>("obs").unwrap();
    let reward = batch.column::<f64>("reward").unwrap();
    (0..batch.len())
        .map(|row| {
            (
                [obs[2 * row].to_bits(), obs[2 * row + 1].to_bits()],
                reward[row],
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Concatenating each trajectory's unmasked rows in order gives back the input's
    /// rows, environment by environment; padding is zero; lengths match TorchRL's.
    #[test]
    fn unmasked_rows_concatenate_to_the_input(batch in random_batch()) {
        let [envs, steps] = [batch.shape()[0], batch.shape()[1]];
        let done = batch.column::<bool>(("next", "done")).unwrap().to_vec();
        let truncated = batch.column::<bool>(("next", "truncated")).unwrap().to_vec();

        let trajs = split_trajectories(&batch, &Split::default()).unwrap();
        prop_assert_eq!(unmasked_rows(&trajs), input_rows(&batch));
        prop_assert_eq!(trajs.lengths(), &torchrl_lengths(&done, envs, steps)[..]);
        prop_assert_eq!(trajs.lengths().iter().sum::<usize>(), envs * steps);
        prop_assert_eq!(trajs.max_len(), *trajs.lengths().iter().max().unwrap());
        for (i, o) in trajs.origins().iter().enumerate() {
            // Every trajectory but an environment's last ends on a done step.
            let last = o.step + trajs.lengths()[i] - 1;
            prop_assert!(done[o.env * steps + last] || last + 1 == steps);
            let row = (trajs.rows(i).unwrap().start) * 2;
            prop_assert_eq!(
                trajs.batch().column::<f32>("obs").unwrap()[row].to_bits(),
                batch.column::<f32>("obs").unwrap()[(o.env * steps + o.step) * 2].to_bits()
            );
        }
        for row in (0..trajs.mask().len()).filter(|&r| !trajs.mask()[r]) {
            assert_padding_zero(&trajs, row);
        }

        // Trajectory ids numbered from the same done flags cut the same trajectories.
        let by_id = split_trajectories(&batch, &Split::by_traj_key("traj")).unwrap();
        prop_assert_eq!(by_id.lengths(), trajs.lengths());
        prop_assert_eq!(by_id.origins(), trajs.origins());
        prop_assert_eq!(by_id.mask(), trajs.mask());

        // With truncation too: the same, cut where either flag is set.
        let either: Vec<bool> = done.iter().zip(&truncated).map(|(d, t)| d | t).collect();
        let cut = split_trajectories(&batch, &Split::default().truncated_key(("next", "truncated")))
            .unwrap();
        prop_assert_eq!(unmasked_rows(&cut), input_rows(&batch));
        prop_assert_eq!(cut.lengths(), &torchrl_lengths(&either, envs, steps)[..]);

        // Time first, on the transposed batch: the same trajectories, byte for byte.
        let te = split_trajectories(&transposed(&batch), &Split::default().time_first(true))
            .unwrap();
        prop_assert_eq!(te.lengths(), trajs.lengths());
        prop_assert_eq!(te.origins(), trajs.origins());
        prop_assert_eq!(te.mask(), trajs.mask());
        for field in batch.spec().fields() {
            prop_assert_eq!(
                te.batch().column_bytes(field.key()).unwrap(),
                trajs.batch().column_bytes(field.key()).unwrap()
            );
        }
    }
}

#[test]
fn padding_past_memory_is_refused_not_aborted() {
    // A 128 MB batch of 4M one-step trajectories and one of 4M steps pads to 4M x 4M
    // rows: 256 TB, past the address space. The allocation failed and aborted the
    // process.
    let spec = Spec::builder()
        .field("obs", DType::F64, [])
        .field("done", DType::Bool, [])
        .build()
        .unwrap();
    let n = 1 << 23;
    let mut batch = Batch::zeros(spec, [n]);
    batch.column_mut::<bool>("done").unwrap()[..n / 2].fill(true);
    assert_eq!(
        split_trajectories(&batch, &Split::by_end_key("done")).unwrap_err(),
        TrajectoryError::TooLarge {
            count: n / 2 + 1,
            max_len: n / 2
        }
    );
}
