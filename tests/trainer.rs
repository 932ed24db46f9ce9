//! ReplayBufferTrainer: collector batches `[E, T]` flattened (masked steps dropped) or
//! padded to `max_dims`, the optimisation batch sampled, priorities written back.

use replaybuf::error::DataError;
use replaybuf::sampler::Prioritized;
use replaybuf::torchrl::{ReplayBufferTrainer, PAD_MASK};
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

fn step_spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [2])
        .field("id", DType::I64, [])
        .field("valid", DType::Bool, [])
        .field("td_error", DType::F32, [])
        .build()
        .unwrap()
}

/// A collector batch `[envs, steps]` of `spec` with `id = 100 * env + step`, obs
/// `[id, -id]`, and step `invalid` of every env marked invalid.
fn collected(spec: &Spec, envs: usize, steps: usize, invalid: Option<usize>) -> Batch {
    let mut b = Batch::zeros(spec.clone(), [envs, steps]);
    let ids: Vec<i64> = (0..envs)
        .flat_map(|e| (0..steps).map(move |t| (100 * e + t) as i64))
        .collect();
    let obs: Vec<f32> = ids.iter().flat_map(|&i| [i as f32, -(i as f32)]).collect();
    b.set("id", &ids).unwrap();
    b.set("obs", &obs).unwrap();
    if spec.field("valid").is_some() {
        let valid: Vec<bool> = (0..envs * steps)
            .map(|r| Some(r % steps) != invalid)
            .collect();
        b.set("valid", &valid).unwrap();
    }
    b
}

fn ids(b: &Batch) -> Vec<i64> {
    b.column::<i64>("id").unwrap().to_vec()
}

#[test]
fn flattening_stores_every_valid_step_in_order() {
    let rb = ReplayBuffer::builder(step_spec())
        .capacity(100)
        .batch_size(4)
        .build()
        .unwrap();
    let trainer = ReplayBufferTrainer::builder(rb.clone()).build().unwrap();
    let w = trainer
        .extend(&collected(&step_spec(), 3, 4, None))
        .unwrap();
    assert_eq!(w.len(), 12);
    assert_eq!(
        ids(&rb.read_all_in_order(None)),
        [0, 1, 2, 3, 100, 101, 102, 103, 200, 201, 202, 203]
    );

    let rb = ReplayBuffer::builder(step_spec())
        .capacity(100)
        .batch_size(4)
        .build()
        .unwrap();
    let trainer = ReplayBufferTrainer::builder(rb.clone())
        .mask_key("valid")
        .build()
        .unwrap();
    let w = trainer
        .extend(&collected(&step_spec(), 2, 3, Some(1)))
        .unwrap();
    assert_eq!(w.len(), 4, "the invalid step of each env is dropped");
    assert_eq!(ids(&rb.read_all_in_order(None)), [0, 2, 100, 102]);
    // Flat batches pass through; deeper ones are refused.
    assert_eq!(
        trainer.extend(&rb.batch([5])).unwrap().len(),
        0,
        "all marked invalid"
    );
    assert!(matches!(
        trainer.extend(&rb.batch([2, 2, 2])).unwrap_err(),
        DataError::BatchShape { .. }
    ));
    assert_eq!(trainer.collector_batch(2, 3).shape(), &[2, 3]);
}

/// Without a mask, each environment's last step is marked truncated before the rows
/// are laid end to end, as TorchRL's trainer marks it: one environment's last step ran
/// into the next one's first as one trajectory.
#[test]
fn flattening_without_a_mask_truncates_each_environments_last_step() {
    let spec = Spec::builder()
        .field("obs", DType::F32, [2])
        .field("id", DType::I64, [])
        .field(("next", "truncated"), DType::Bool, [])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec.clone())
        .capacity(100)
        .batch_size(4)
        .build()
        .unwrap();
    let trainer = ReplayBufferTrainer::builder(rb.clone()).build().unwrap();
    trainer.extend(&collected(&spec, 2, 3, None)).unwrap();
    let all = rb.read_all_in_order(None);
    assert_eq!(ids(&all), [0, 1, 2, 100, 101, 102]);
    assert_eq!(
        all.column::<bool>(("next", "truncated")).unwrap(),
        [false, false, true, false, false, true]
    );
}

/// The trajectory buffer of `steps`-step padded rows: the step fields (without
/// the collector's mask) with a leading `steps`, and the padding mask.
fn trajectory_spec(steps: usize) -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [steps, 2])
        .field("id", DType::I64, [steps])
        .field("td_error", DType::F32, [steps])
        .field(PAD_MASK, DType::Bool, [steps])
        .build()
        .unwrap()
}

#[test]
fn padding_stores_trajectories_with_a_mask() {
    let rb = ReplayBuffer::builder(trajectory_spec(6))
        .capacity(16)
        .batch_size(2)
        .build()
        .unwrap();
    let trainer = ReplayBufferTrainer::builder(rb.clone())
        .max_dims([4, 6])
        .mask_key("valid")
        .build()
        .unwrap();
    let batch = trainer.collector_batch(3, 5);
    assert_eq!(batch.spec().fields().len(), 4);
    let w = trainer
        .extend(&collected(batch.spec(), 3, 5, Some(4)))
        .unwrap();
    assert_eq!(w.len(), 4, "padded to 4 environments");
    let all = rb.read_all_in_order(None);
    let ids = all.column::<i64>("id").unwrap();
    let mask = all.column::<bool>(PAD_MASK).unwrap();
    let obs = all.column::<f32>("obs").unwrap();
    for env in 0..3 {
        for t in 0..6 {
            let at = env * 6 + t;
            if t < 5 {
                assert_eq!(ids[at], (100 * env + t) as i64);
                assert_eq!(obs[2 * at..2 * at + 2], [ids[at] as f32, -(ids[at] as f32)]);
            } else {
                assert_eq!(ids[at], 0, "padding is zero");
            }
            assert_eq!(mask[at], t < 4, "env {env} step {t}");
        }
    }
    assert!(
        mask[18..].iter().all(|&m| !m),
        "the padded environment is empty"
    );

    // Only the environments given, with pad_steps.
    let rb = ReplayBuffer::builder(trajectory_spec(6))
        .capacity(16)
        .batch_size(2)
        .build()
        .unwrap();
    let trainer = ReplayBufferTrainer::builder(rb.clone())
        .pad_steps(6)
        .build()
        .unwrap();
    let spec = trainer.collector_batch(1, 1).spec().clone();
    assert_eq!(
        trainer.extend(&collected(&spec, 2, 6, None)).unwrap().len(),
        2
    );
    assert!(rb
        .read_all_in_order(None)
        .column::<bool>(PAD_MASK)
        .unwrap()
        .iter()
        .all(|&m| m));
    for bad in [[2, 7], [1, 1]] {
        let b = if bad == [1, 1] {
            Batch::zeros(step_spec(), bad) // carries a field the trajectories lack
        } else {
            collected(&spec, bad[0], bad[1], None)
        };
        assert!(trainer.extend(&b).is_err(), "{bad:?}");
    }
    assert!(matches!(
        trainer
            .extend(&Batch::zeros(spec.clone(), [4]))
            .unwrap_err(),
        DataError::BatchShape { .. }
    ));
}

#[test]
fn sample_then_write_the_losses_priorities_back() {
    let rb = ReplayBuffer::builder(step_spec())
        .capacity(64)
        .sampler(Prioritized::new(1.0, 0.5).eps(0.0))
        .priority_key("td_error")
        .seed(3)
        .build()
        .unwrap();
    for prefetch in [0, 2] {
        let mut trainer = ReplayBufferTrainer::builder(rb.clone())
            .batch_size(8)
            .prefetch(prefetch)
            .build()
            .unwrap();
        let mut chunk = collected(&step_spec(), 4, 8, None);
        chunk.column_mut::<f32>("td_error").unwrap().fill(1.0);
        trainer.extend(&chunk).unwrap();
        let mut batch = trainer.sample().unwrap();
        assert_eq!(batch.len(), 8);
        assert!(batch.weight().is_some());
        batch.column_mut::<f32>("td_error").unwrap().fill(0.25);
        let done = trainer.update_priority(&batch).unwrap();
        assert_eq!(done.applied + done.stale, 8);
        for &i in batch.index() {
            assert_eq!(rb.priority(i), Some(0.25));
        }
        let done = trainer.update_priority_with(&batch, &[2.0; 8]).unwrap();
        assert_eq!(done.applied, 8);
        let mut again = rb.batch([8]);
        trainer.sample_into(&mut again).unwrap();
        assert_eq!(again.len(), 8);
    }
}

#[test]
fn sampling_goes_on_into_the_next_epoch() {
    // TorchRL's hook never sees an epoch end: its sampler starts the next one. Ours
    // failed with EpochEnd once an epoch, and a training loop's `sample()?` stopped.
    let rb = ReplayBuffer::builder(step_spec())
        .capacity(16)
        .sampler(replaybuf::sampler::WithoutReplacement::new())
        .build()
        .unwrap();
    for prefetch in [0, 2] {
        let mut trainer = ReplayBufferTrainer::builder(rb.clone())
            .batch_size(8)
            .prefetch(prefetch)
            .build()
            .unwrap();
        trainer
            .extend(&collected(&step_spec(), 2, 8, None))
            .unwrap();
        let mut into = rb.batch([8]);
        for _ in 0..5 {
            assert_eq!(trainer.sample().unwrap().len(), 8);
            trainer.sample_into(&mut into).unwrap();
            assert_eq!(into.len(), 8);
        }
    }
}

#[test]
fn trainer_build_errors() {
    let msg = |b: replaybuf::torchrl::TrainerBuilder| b.build().unwrap_err().to_string();
    let flat = ReplayBuffer::builder(step_spec())
        .capacity(8)
        .batch_size(2)
        .build()
        .unwrap();
    let t = || ReplayBufferTrainer::builder(flat.clone());
    assert!(msg(t().mask_key("obs")).contains("mask key"));
    assert!(msg(t().mask_key("nope")).contains("mask key"));
    assert!(msg(t().max_dims([2, 4])).contains("pad_mask"));
    assert!(msg(t().pad_steps(0)).contains("at least 1"));
    let traj = ReplayBuffer::builder(trajectory_spec(6))
        .capacity(8)
        .batch_size(2)
        .build()
        .unwrap();
    assert!(msg(ReplayBufferTrainer::builder(traj.clone()).pad_steps(5)).contains("pad_mask"));
    let odd = ReplayBuffer::builder(
        Spec::builder()
            .field("obs", DType::F32, [3])
            .field(PAD_MASK, DType::Bool, [6])
            .build()
            .unwrap(),
    )
    .capacity(8)
    .batch_size(2)
    .build()
    .unwrap();
    assert!(msg(ReplayBufferTrainer::builder(odd).pad_steps(6)).contains("leading dimension"));
    let no_size = ReplayBuffer::builder(step_spec())
        .capacity(8)
        .build()
        .unwrap();
    assert!(msg(ReplayBufferTrainer::builder(no_size)).contains("batch size"));
    let grid = ReplayBuffer::builder(step_spec())
        .capacity(8)
        .ndim(2)
        .envs(2)
        .batch_size(2)
        .build()
        .unwrap();
    assert!(msg(ReplayBufferTrainer::builder(grid)).contains("ndim-1"));
}
