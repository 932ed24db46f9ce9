//! The tmrl-style memory: collector samples paired into transitions (never across an
//! episode's end, and across buffers), get_transition, the sample preprocessor,
//! collate into six f32 tensors, nb_steps iteration, prefetch.

use replaybuf::error::DataError;
use replaybuf::tmrl::{TmrlKeys, TmrlMemory};
use replaybuf::{Batch, DType, ReplayBuffer, Spec};

/// obs: `[id, id, id]` (f32), act: `[id, -id]` (f32), rew: f32, flags.
fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [3])
        .field("act", DType::F32, [2])
        .field("rew", DType::F32, [])
        .field(("next", "obs"), DType::F32, [3])
        .field("terminated", DType::Bool, [])
        .field("truncated", DType::Bool, [])
        .build()
        .unwrap()
}

fn memory(prefetch: usize) -> TmrlMemory {
    let rb = ReplayBuffer::builder(spec())
        .capacity(1000)
        .seed(2)
        .build()
        .unwrap();
    TmrlMemory::builder(rb)
        .batch_size(16)
        .nb_steps(5)
        .prefetch(prefetch)
        .build()
        .unwrap()
}

/// A collector buffer of samples with observation ids `ids`, reward `id / 2`, and the
/// given ends (`t`: terminated, `c`: truncated, `.`: neither).
fn samples(m: &TmrlMemory, ids: &[i32], ends: &str) -> Batch {
    let mut b = m.collector_buffer(ids.len());
    let obs: Vec<f32> = ids.iter().flat_map(|&i| [i as f32; 3]).collect();
    let act: Vec<f32> = ids.iter().flat_map(|&i| [i as f32, -(i as f32)]).collect();
    let rew: Vec<f32> = ids.iter().map(|&i| i as f32 / 2.0).collect();
    b.set("obs", &obs).unwrap();
    b.set("act", &act).unwrap();
    b.set("rew", &rew).unwrap();
    let term: Vec<bool> = ends.chars().map(|c| c == 't').collect();
    let trunc: Vec<bool> = ends.chars().map(|c| c == 'c').collect();
    b.set("terminated", &term).unwrap();
    b.set("truncated", &trunc).unwrap();
    b
}

/// The stored transitions as (prev id, new id, terminated, truncated), by index.
fn transitions(m: &TmrlMemory) -> Vec<(i32, i32, bool, bool)> {
    let all = m.buffer().read_all_in_order(None);
    let prev = all.column::<f32>("obs").unwrap();
    let next = all.column::<f32>(("next", "obs")).unwrap();
    let term = all.column::<bool>("terminated").unwrap();
    let trunc = all.column::<bool>("truncated").unwrap();
    (0..all.len())
        .map(|r| (prev[3 * r] as i32, next[3 * r] as i32, term[r], trunc[r]))
        .collect()
}

#[test]
fn samples_pair_into_transitions_within_episodes_and_across_buffers() {
    let mut m = memory(0);
    assert_eq!(
        (m.nb_steps(), m.batch_size(), m.memory_size()),
        (5, 16, 1000)
    );
    // Episode 0: reset at 0, steps 1..3, terminated at 3. Episode 1: reset at 100,
    // steps 101, 102 and, in the next buffer, 103 (truncated). Episode 2: reset 200.
    let w = m
        .append_buffer(&samples(&m, &[0, 1, 2, 3, 100, 101, 102], "...t..."))
        .unwrap();
    assert_eq!(w.len(), 5);
    let w = m
        .append_buffer(&samples(&m, &[103, 200, 201], "c.."))
        .unwrap();
    assert_eq!(w.len(), 2);
    assert_eq!(
        transitions(&m),
        [
            (0, 1, false, false),
            (1, 2, false, false),
            (2, 3, true, false),
            (100, 101, false, false),
            (101, 102, false, false),
            (102, 103, false, true),
            (200, 201, false, false),
        ]
    );
    assert_eq!(m.len(), 7);
    // The action and reward are the later sample's.
    let t = m.get_transition(5).unwrap();
    assert_eq!(t.column::<f32>("act").unwrap(), [103.0, -103.0]);
    assert_eq!(t.column::<f32>("rew").unwrap(), [51.5]);
    let c = m.collate(&t).unwrap();
    assert_eq!(c.truncated.data, [1.0]);
    assert_eq!(c.prev_obs.shape, [1, 3]);
    assert!(m.get_transition(7).is_err());
}

#[test]
fn a_buffer_starting_a_fresh_memory_or_after_an_end_makes_no_transition_of_its_first_sample() {
    let mut m = memory(0);
    assert_eq!(m.append_buffer(&samples(&m, &[5], "t")).unwrap().len(), 0);
    assert_eq!(
        m.append_buffer(&samples(&m, &[10, 11], ".."))
            .unwrap()
            .len(),
        1
    );
    assert_eq!(m.append_buffer(&samples(&m, &[], "")).unwrap().len(), 0);
    assert_eq!(m.append_buffer(&samples(&m, &[12], ".")).unwrap().len(), 1);
    assert_eq!(
        transitions(&m),
        [(10, 11, false, false), (11, 12, false, false)]
    );
    assert!(matches!(
        m.append_buffer(&m.collector_buffer(1).clone())
            .map(|w| w.len()),
        Ok(1)
    ));
    let wrong = Batch::zeros(spec(), [2]);
    assert!(matches!(
        m.append_buffer(&wrong).unwrap_err(),
        DataError::UnknownField { .. }
    ));
}

#[test]
fn batches_are_preprocessed_and_collated_into_six_tensors() {
    for prefetch in [0, 2] {
        let rb = ReplayBuffer::builder(spec())
            .capacity(1000)
            .seed(4)
            .build()
            .unwrap();
        let mut m = TmrlMemory::builder(rb)
            .batch_size(32)
            .nb_steps(3)
            .prefetch(prefetch)
            .sample_preprocessor(|b: &mut Batch| {
                // Data augmentation: shift both observations by the same offset.
                let keys: [replaybuf::Key; 2] = ["obs".into(), ("next", "obs").into()];
                for key in &keys {
                    b.column_mut::<f32>(key)?
                        .iter_mut()
                        .for_each(|x| *x += 1000.0);
                }
                Ok(())
            })
            .build()
            .unwrap();
        let ids: Vec<i32> = (0..200).collect();
        let ends: String = (0..200)
            .map(|i| if i % 20 == 19 { 't' } else { '.' })
            .collect();
        m.append_buffer(&samples(&m, &ids, &ends)).unwrap();
        let batches: Vec<_> = m.iter().collect::<Result<_, _>>().unwrap();
        assert_eq!(batches.len(), 3, "nb_steps batches per pass");
        for b in batches {
            assert_eq!(b.prev_obs.shape, [32, 3]);
            assert_eq!(b.act.shape, [32, 2]);
            assert_eq!(b.rew.shape, [32]);
            assert_eq!(b.new_obs.shape, [32, 3]);
            assert_eq!(b.terminated.shape, [32]);
            assert_eq!(b.truncated.shape, [32]);
            for r in 0..32 {
                let (prev, new) = (b.prev_obs.data[3 * r], b.new_obs.data[3 * r]);
                assert!(prev >= 1000.0, "preprocessed");
                assert_eq!(new, prev + 1.0, "one step of one episode");
                let id = new - 1000.0;
                assert_eq!(b.act.data[2 * r], id);
                assert_eq!(b.rew.data[r], id / 2.0);
                assert_eq!(
                    b.terminated.data[r],
                    f32::from(u8::from(id as i32 % 20 == 19))
                );
                assert_eq!(b.truncated.data[r], 0.0);
            }
            let (prev_obs, ..) = b.into_tuple();
            assert_eq!(prev_obs.data.len(), 96);
        }
    }
}

#[test]
fn tmrl_build_errors_name_the_field() {
    let msg = |spec: Spec| {
        let rb = ReplayBuffer::builder(spec).capacity(8).build().unwrap();
        TmrlMemory::builder(rb).build().unwrap_err().to_string()
    };
    let base = || {
        Spec::builder()
            .field("obs", DType::F32, [3])
            .field("act", DType::F32, [2])
            .field("terminated", DType::Bool, [])
            .field("truncated", DType::Bool, [])
    };
    let m = msg(base().field("rew", DType::F32, []).build().unwrap());
    assert!(m.contains("next.obs") || m.contains("next"), "{m}");
    let m = msg(base()
        .field("rew", DType::F32, [])
        .field(("next", "obs"), DType::F32, [4])
        .build()
        .unwrap());
    assert!(m.contains("dtype and shape"), "{m}");
    let m = msg(base()
        .field("rew", DType::I32, [])
        .field(("next", "obs"), DType::F32, [3])
        .build()
        .unwrap());
    assert!(m.contains("float"), "{m}");
    // Other keys work, and extra fields are fine.
    let rb = ReplayBuffer::builder(
        Spec::builder()
            .field("o", DType::U8, [2])
            .field("a", DType::I64, [])
            .field("r", DType::F64, [1])
            .field("o2", DType::U8, [2])
            .field("done", DType::Bool, [])
            .field("cut", DType::Bool, [1])
            .field("extra", DType::F32, [])
            .build()
            .unwrap(),
    )
    .capacity(8)
    .build()
    .unwrap();
    let keys = TmrlKeys {
        obs: "o".into(),
        act: "a".into(),
        rew: "r".into(),
        next_obs: "o2".into(),
        terminated: "done".into(),
        truncated: "cut".into(),
    };
    assert!(TmrlMemory::builder(rb.clone())
        .keys(keys.clone())
        .build()
        .is_ok());
    // One field for the observation and the next (every prev_obs was lost).
    let same = TmrlKeys {
        next_obs: "o".into(),
        ..keys.clone()
    };
    let e = TmrlMemory::builder(rb.clone())
        .keys(same)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("another field"), "{e}");
    assert!(TmrlMemory::builder(rb)
        .keys(keys)
        .batch_size(0)
        .build()
        .is_err());
}

#[test]
fn a_memory_starts_from_a_dataset_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = memory(0);
    m.append_buffer(&samples(&m, &[1, 2, 3, 4], "...t"))
        .unwrap();
    m.buffer().save(dir.path()).unwrap();
    let mut again = TmrlMemory::from_dataset(dir.path())
        .unwrap()
        .batch_size(16)
        .nb_steps(5)
        .build()
        .unwrap();
    assert_eq!(transitions(&again), transitions(&m));
    // It goes on appending, and collates what it held.
    again
        .append_buffer(&samples(&again, &[10, 11], ".."))
        .unwrap();
    assert_eq!(again.len(), 4);
    let batch = again.sample().unwrap();
    assert_eq!(batch.into_tuple().0.shape, vec![16, 3]);
    // A file-backed memory is reopened in place.
    let store = dir.path().join("store");
    let rb = ReplayBuffer::builder(spec())
        .capacity(100)
        .memmap(&store)
        .build()
        .unwrap();
    let mut m = TmrlMemory::builder(rb).batch_size(4).build().unwrap();
    m.append_buffer(&samples(&m, &[1, 2, 3], "...")).unwrap();
    drop(m);
    let m = TmrlMemory::from_dataset(&store)
        .unwrap()
        .batch_size(4)
        .build()
        .unwrap();
    assert_eq!(
        transitions(&m),
        vec![(1, 2, false, false), (2, 3, false, false)]
    );
}

#[test]
fn a_memory_from_a_dataset_draws_from_the_seed_it_is_given() {
    // Without one it goes on from the seed the directory records: every run resumed
    // from one dataset draws the same batches.
    let dir = tempfile::tempdir().unwrap();
    let mut m = memory(0);
    let ids: Vec<i32> = (0..200).collect();
    m.append_buffer(&samples(&m, &ids, &".".repeat(200)))
        .unwrap();
    m.buffer().save(dir.path()).unwrap();
    let first = |seed: Option<u64>| {
        let builder = match seed {
            Some(seed) => TmrlMemory::from_dataset_seeded(dir.path(), seed),
            None => TmrlMemory::from_dataset(dir.path()),
        };
        let mut m = builder.unwrap().batch_size(16).build().unwrap();
        m.sample().unwrap().into_tuple().0.data
    };
    assert_eq!(first(None), first(None));
    assert_eq!(first(Some(5)), first(Some(5)));
    assert_ne!(first(Some(5)), first(Some(6)));
    assert_ne!(first(Some(5)), first(None));
}

/// Items count from the oldest transition held, as tmrl's lists (trimmed from the
/// front) do: once the memory is full, item 0 is not the row at storage index 0.
#[test]
fn transitions_are_items_oldest_first_once_the_memory_wraps() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(4)
        .seed(2)
        .build()
        .unwrap();
    let mut m = TmrlMemory::builder(rb).batch_size(2).build().unwrap();
    m.append_buffer(&samples(&m, &[0, 1, 2, 3, 4, 5, 6], "......."))
        .unwrap();
    let prev = |item: u64| {
        let t = m.get_transition(item).unwrap();
        t.column::<f32>("obs").unwrap()[0] as i32
    };
    assert_eq!((0..4).map(prev).collect::<Vec<_>>(), [2, 3, 4, 5]);
    assert!(m.get_transition(4).is_err());
}

/// An ndim-2 buffer is refused: its length counted every environment's rows while
/// `get_transition` read environment 0 alone, and every append was refused.
#[test]
fn an_ndim2_buffer_is_refused() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(8)
        .ndim(2)
        .envs(2)
        .build()
        .unwrap();
    let e = TmrlMemory::builder(rb).build().unwrap_err();
    assert!(e.to_string().contains("ndim-1"), "{e}");
}
