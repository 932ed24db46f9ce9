//! The learner's pipeline: transforms on sampled batches and their inverses on written
//! data, the loader's stages (sample preprocessor, collate, inline or prefetched) and
//! iteration. The prefetch workers themselves are `tests/prefetch.rs`'s.

// The loom-facade rule of .clippy.toml is for the library, not its tests.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use replaybuf::error::{AccessError, DataError, SampleError, Stage, TransformIndexError};
use replaybuf::{Batch, DType, ReplayBuffer, Spec, Transform};

/// A transform mapping every reward `r` to `f(r)`.
fn on_reward(f: impl Fn(f32) -> f32 + Send + Sync + 'static) -> Transform {
    Transform::new(move |b: &mut Batch| {
        b.column_mut::<f32>("reward")?
            .iter_mut()
            .for_each(|r| *r = f(*r));
        Ok(())
    })
}

fn rewards(b: &Batch) -> Vec<f32> {
    b.column::<f32>("reward").unwrap().to_vec()
}

#[test]
fn transforms_run_on_every_sample_in_list_order() {
    let rb = buffer(16);
    rb.extend(&rows(&rb, 16, 0)).unwrap();
    rb.append_transform(on_reward(|r| r + 1.0)); // [+1]
    rb.append_transform(on_reward(|r| r * 10.0)); // [+1, *10]
    rb.insert_transform(0, on_reward(|r| r - 3.0)).unwrap(); // [-3, +1, *10]
    assert_eq!(rb.transforms(), 3);
    // (1 - 3 + 1) * 10
    assert_eq!(rewards(&rb.sample(4).unwrap()), [-10.0; 4]);
    let mut batch = rb.batch([3]);
    rb.sample_into(&mut batch).unwrap();
    assert_eq!(rewards(&batch), [-10.0; 3]);
    let mut learner = rb.learner();
    assert_eq!(rewards(&learner.sample(2).unwrap()), [-10.0; 2]);
    learner.sample_into(&mut batch).unwrap();
    assert_eq!(rewards(&batch), [-10.0; 3]);
    // The stored rows are untouched, and reads by position are not samples.
    assert_eq!(rewards(&rb.get(0).unwrap()), [1.0]);

    assert_eq!(
        rb.insert_transform(4, on_reward(|r| r)).unwrap_err(),
        TransformIndexError {
            position: 4,
            len: 3
        }
    );
    assert_eq!(rb.transforms(), 3, "a refused insert changes nothing");
    rb.clear_transforms();
    assert_eq!(rewards(&rb.sample(2).unwrap()), [1.0; 2]);
}

#[test]
fn inverse_transforms_run_on_every_write_in_reverse_order() {
    let rb = buffer(8);
    let scale = |k: f32| {
        Transform::inverse(move |b: &mut Batch| {
            b.column_mut::<f32>("reward")?
                .iter_mut()
                .for_each(|r| *r = *r * 10.0 + k);
            Ok(())
        })
    };
    rb.append_transform(scale(1.0));
    rb.append_transform(scale(2.0));
    // Inverses run last-first: (1 * 10 + 2) * 10 + 1.
    let chunk = rows(&rb, 2, 0);
    rb.extend(&chunk).unwrap();
    assert_eq!(
        rewards(&chunk),
        [1.0; 2],
        "the caller's batch is not changed"
    );
    rb.add(&rows(&rb, 1, 2)).unwrap();
    rb.writer().extend(&rows(&rb, 1, 3)).unwrap();
    rb.writer().add(&rows(&rb, 1, 4)).unwrap();
    assert_eq!(rewards(&rb.read_all_in_order(None)), [121.0; 5]);
    rb.write_all(&rows(&rb, 5, 10), None).unwrap();
    assert_eq!(rewards(&rb.read_all_in_order(None)), [121.0; 5]);
    assert_eq!(
        rb.read_all_in_order(None).column::<i64>("id").unwrap(),
        [10, 11, 12, 13, 14]
    );
    // Inverse-only transforms leave sampled batches alone.
    assert_eq!(rewards(&rb.sample(3).unwrap()), [121.0; 3]);
}

#[test]
fn a_failing_transform_names_itself_and_a_failing_inverse_writes_nothing() {
    let rb = buffer(8);
    rb.extend(&rows(&rb, 4, 0)).unwrap();
    rb.append_transform(on_reward(|r| r));
    rb.append_transform(|b: &mut Batch| {
        b.column_mut::<f32>("no such field")?;
        Ok(())
    });
    match rb.sample(2).unwrap_err() {
        SampleError::Pipeline { stage, error } => {
            assert_eq!(stage, Stage::Transform(1));
            assert!(matches!(*error, DataError::UnknownField { .. }));
        }
        other => panic!("expected a pipeline error, got {other:?}"),
    }
    rb.clear_transforms();
    rb.append_transform(Transform::inverse(|b: &mut Batch| {
        b.column_mut::<i64>("reward")?; // wrong dtype
        Ok(())
    }));
    assert!(matches!(
        rb.extend(&rows(&rb, 2, 10)).unwrap_err(),
        DataError::DType { .. }
    ));
    assert!(matches!(
        rb.write_all(&rows(&rb, 4, 10), None).unwrap_err(),
        AccessError::Data(DataError::DType { .. })
    ));
    assert_eq!(rb.write_count(), 4);
    assert_eq!(
        rb.read_all_in_order(None).column::<i64>("id").unwrap(),
        [0, 1, 2, 3]
    );
}

#[test]
fn samples_racing_transform_changes_see_one_whole_list() {
    let rb = buffer(64);
    rb.extend(&rows(&rb, 64, 0)).unwrap();
    std::thread::scope(|s| {
        let sampler = {
            let rb = rb.clone();
            s.spawn(move || {
                let mut learner = rb.learner();
                let mut batch = rb.batch([16]);
                let mut last = 0.0;
                for _ in 0..20_000 {
                    learner.sample_into(&mut batch).unwrap();
                    let r = rewards(&batch);
                    // Every row went through the same list: one count of +1s, and
                    // never fewer than a previous sample saw.
                    assert!(r.iter().all(|&x| x == r[0]), "{r:?}");
                    assert!(r[0] >= last, "{} after {last}", r[0]);
                    last = r[0];
                }
            })
        };
        for _ in 0..50 {
            rb.append_transform(on_reward(|r| r + 1.0));
            std::thread::yield_now();
        }
        sampler.join().unwrap();
    });
    assert_eq!(rewards(&rb.sample(1).unwrap()), [51.0]);
}

// ---------------------------------------------------------------------------------
// The loader: preprocess, collate, prefetch, iteration.

use std::time::{Duration, Instant};

use replaybuf::sampler::WithoutReplacement;

mod common;
use common::rewards::{buffer, rows, spec};

/// Polls `cond` for up to 10 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn loader_stages_run_in_order_into_the_learners_type() {
    for prefetch in [0, 2] {
        let rb = buffer(32);
        rb.extend(&rows(&rb, 32, 0)).unwrap();
        rb.append_transform(on_reward(|r| r + 1.0)); // 2
        let mut loader = rb
            .loader()
            .batch_size(8)
            .prefetch(prefetch)
            .preprocess(|b: &mut Batch| {
                b.column_mut::<f32>("reward")?
                    .iter_mut()
                    .for_each(|r| *r *= 3.0); // 6
                Ok(())
            })
            .collate(|b: &Batch| {
                let ids = b.column::<i64>("id")?;
                let rewards = b.column::<f32>("reward")?;
                Ok(ids
                    .iter()
                    .zip(rewards)
                    .map(|(&i, &r)| (i, r))
                    .collect::<Vec<_>>())
            })
            .build()
            .unwrap();
        for _ in 0..10 {
            let pairs: Vec<(i64, f32)> = loader.sample().unwrap();
            assert_eq!(pairs.len(), 8);
            assert!(pairs.iter().all(|&(i, r)| (0..32).contains(&i) && r == 6.0));
        }
        let mut out = Vec::new();
        loader.sample_into(&mut out).unwrap();
        assert_eq!(out.len(), 8);
        loader.recycle(out);
    }
}

#[test]
fn preprocess_and_collate_errors_name_their_stage() {
    for prefetch in [0, 1] {
        let rb = buffer(8);
        rb.extend(&rows(&rb, 8, 0)).unwrap();
        let mut bad_pre = rb
            .loader()
            .batch_size(2)
            .prefetch(prefetch)
            .preprocess(|b: &mut Batch| b.column_mut::<u8>("obs").map(drop))
            .build()
            .unwrap();
        assert!(matches!(
            bad_pre.sample().unwrap_err(),
            SampleError::Pipeline {
                stage: Stage::Preprocess,
                ..
            }
        ));
        let mut bad_collate = rb
            .loader()
            .batch_size(2)
            .prefetch(prefetch)
            .collate(|b: &Batch| b.column::<f64>("reward").map(<[f64]>::to_vec))
            .build()
            .unwrap();
        assert!(matches!(
            bad_collate.sample().unwrap_err(),
            SampleError::Pipeline {
                stage: Stage::Collate,
                ..
            }
        ));
        // An empty buffer's error arrives in its place, and the loader goes on.
        let empty = buffer(8);
        let mut loader = empty
            .loader()
            .batch_size(2)
            .prefetch(prefetch)
            .build()
            .unwrap();
        assert_eq!(loader.sample().unwrap_err(), SampleError::Empty);
        empty.extend(&rows(&empty, 8, 0)).unwrap();
        eventually("a batch once rows arrive", || loader.sample().is_ok());
    }
}

#[test]
fn loader_build_errors() {
    let rb = buffer(8);
    let msg = |b: replaybuf::loader::LoaderBuilder| b.build().unwrap_err().to_string();
    assert!(msg(rb.loader()).contains("batch size"));
    assert!(msg(rb.loader().batch_size(0)).contains("batch_size"));
    assert!(msg(rb.loader().batch_size(4).prefetch(2).workers(0)).contains("worker"));
    assert!(rb.prefetch(1).is_err(), "no batch size on the buffer");
    let slices = Spec::builder()
        .field("traj", DType::I64, [])
        .build()
        .unwrap();
    let srb = ReplayBuffer::builder(slices)
        .capacity(64)
        .sampler(replaybuf::sampler::Slice::num_slices(4).traj_key("traj"))
        .build()
        .unwrap();
    assert!(msg(srb.loader().batch_size(6)).contains("multiple of"));
}

#[test]
fn iteration_ends_when_an_epoch_runs_out_and_loses_no_row() {
    for (prefetch, workers) in [(0, 1), (1, 1), (3, 1), (3, 3)] {
        let rb = ReplayBuffer::builder(spec())
            .capacity(100)
            .batch_size(32)
            .sampler(WithoutReplacement::new())
            .seed(9)
            .build()
            .unwrap();
        rb.extend(&rows(&rb, 100, 0)).unwrap();
        let mut loader = rb
            .loader()
            .prefetch(prefetch)
            .workers(workers)
            .build()
            .unwrap();
        for epoch in 0..3 {
            let mut ids: Vec<i64> = Vec::new();
            let mut sizes = Vec::new();
            for batch in &mut loader {
                let batch = batch.unwrap();
                sizes.push(batch.len());
                ids.extend(batch.column::<i64>("id").unwrap());
            }
            ids.sort_unstable();
            assert_eq!(sizes, [32, 32, 32, 4], "prefetch {prefetch}, epoch {epoch}");
            assert_eq!(
                ids,
                (0..100).collect::<Vec<_>>(),
                "prefetch {prefetch}, epoch {epoch}"
            );
        }
    }

    // The buffer itself iterates too.
    let rb = ReplayBuffer::builder(spec())
        .capacity(10)
        .batch_size(4)
        .sampler(WithoutReplacement::new().drop_last(true))
        .build()
        .unwrap();
    rb.extend(&rows(&rb, 10, 0)).unwrap();
    assert_eq!((&rb).into_iter().count(), 2);
    assert_eq!(
        rb.batches(5).map(|b| b.unwrap().len()).collect::<Vec<_>>(),
        [5, 5]
    );
    let no_size = buffer(4);
    assert_eq!(
        (&no_size).into_iter().next().unwrap().unwrap_err(),
        SampleError::NoBatchSize
    );
    // With replacement it never ends.
    no_size.extend(&rows(&no_size, 4, 0)).unwrap();
    assert_eq!(
        no_size.batches(2).take(100).filter(Result::is_ok).count(),
        100
    );
}

#[test]
fn a_loader_batch_past_memory_is_refused() {
    // It aborted the process on the batch's allocation (a buffer's own sample
    // refused it).
    let rb = buffer(16);
    rb.extend(&rows(&rb, 16, 0)).unwrap();
    for n in [usize::MAX, 1 << 40] {
        let mut loader = rb.loader().batch_size(n).build().unwrap();
        assert_eq!(
            loader.sample().unwrap_err(),
            SampleError::TooLarge { rows: n }
        );
        let mut batches = rb.batches(n);
        assert_eq!(
            batches.next().unwrap().unwrap_err(),
            SampleError::TooLarge { rows: n }
        );
    }
}
