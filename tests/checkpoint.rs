//! Checkpoints: `dumps` then `load`/`loads` gives back every row and the sampler's
//! state, for every storage and sampler; damaged checkpoints are refused by name.

use std::path::Path;

use replaybuf::checkpoint::SaveOptions;
use replaybuf::error::SampleError;
use replaybuf::sampler::{Prioritized, Slice, SlicePriority, WithoutReplacement};
use replaybuf::typed::TypedBuffer;
use replaybuf::{Batch, DType, ReplayBuffer, ReplayBufferBuilder, Spec};

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("traj", DType::I64, [])
        .field("obs", DType::F32, [3])
        .field(("next", "obs"), DType::F32, [3])
        .field("done", DType::Bool, [])
        .build()
        .unwrap()
}

/// `n` rows of `envs` environments from step `t0`: trajectories of 7 steps per env,
/// `next.obs` the following step's `obs`. Shape `[n]` or `[n, envs]`.
fn rows(rb: &ReplayBuffer, t0: u64, n: usize, envs: usize) -> Batch {
    let shape: Vec<usize> = if rb.ndim() == 2 {
        vec![n, envs]
    } else {
        vec![n]
    };
    let mut b = rb.batch(&shape);
    let (mut id, mut traj, mut obs, mut next, mut done) = (vec![], vec![], vec![], vec![], vec![]);
    for t in t0..t0 + n as u64 {
        for e in 0..envs as u64 {
            let o = |t: u64| [t as f32, e as f32, (t % 7) as f32];
            id.push(t * 100 + e);
            traj.push((t / 7 * 100 + e) as i64);
            obs.extend(o(t));
            next.extend(o(t + 1));
            done.push(t % 7 == 6);
        }
    }
    b.set("id", &id).unwrap();
    b.set("traj", &traj).unwrap();
    b.set("obs", &obs).unwrap();
    b.set(("next", "obs"), &next).unwrap();
    b.set("done", &done).unwrap();
    b
}

fn fill(rb: &ReplayBuffer, steps: usize) {
    let envs = rb.envs();
    let mut t = 0;
    while t < steps {
        let n = 13.min(steps - t);
        rb.extend(&rows(rb, t as u64, n, envs)).unwrap();
        t += n;
    }
}

fn ids(b: &Batch) -> Vec<u64> {
    b.column::<u64>("id").unwrap().to_vec()
}

fn same_batches(a: &Batch, b: &Batch) {
    assert_eq!(a.shape(), b.shape());
    assert_eq!(ids(a), ids(b));
    assert_eq!(a.index(), b.index());
    assert_eq!(
        a.column::<f32>(("next", "obs")).unwrap(),
        b.column::<f32>(("next", "obs")).unwrap()
    );
    assert_eq!(a.weight(), b.weight());
}

fn builders() -> Vec<(&'static str, ReplayBufferBuilder)> {
    let base = || ReplayBuffer::builder(spec()).seed(21).batch_size(16);
    let slice = || Slice::slice_len(4).traj_key("traj");
    vec![
        ("uniform", base().capacity(100)),
        ("uniform, 2 shards", base().capacity(100).shards(2)),
        (
            "uniform, ndim 2",
            base()
                .capacity(25 * 4)
                .ndim(2)
                .envs(4)
                .dim_extend(0)
                .shards(2),
        ),
        (
            "without replacement",
            base().capacity(100).sampler(WithoutReplacement::new()),
        ),
        (
            "prioritized",
            base()
                .capacity(100)
                .shards(2)
                .sampler(Prioritized::new(0.7, 0.5)),
        ),
        ("slices", base().capacity(100).sampler(slice())),
        (
            "slices, ndim 2",
            base()
                .capacity(25 * 4)
                .ndim(2)
                .envs(4)
                .dim_extend(0)
                .sampler(slice()),
        ),
        (
            "slices without replacement",
            base()
                .capacity(100)
                .sampler(slice().without_replacement(WithoutReplacement::new())),
        ),
        (
            "prioritized slices",
            base()
                .capacity(100)
                .sampler(slice().prioritized(Prioritized::new(0.7, 0.5), SlicePriority::Start)),
        ),
    ]
}

/// Does things to the buffer that change every kind of state.
fn exercise(rb: &ReplayBuffer) {
    fill(rb, 130);
    let b = rb.sample(16).unwrap();
    if rb.alpha().is_some() {
        let p: Vec<f64> = (0..b.len()).map(|i| 0.5 + i as f64).collect();
        rb.update_priority(b.index(), b.generations(), &p).unwrap();
        rb.set_beta(0.8).unwrap();
    }
    rb.sample(16).unwrap();
}

fn check_round_trip(name: &str, rb: &ReplayBuffer, dir: &Path) {
    rb.save(dir).unwrap();
    let loaded = ReplayBuffer::from_checkpoint(dir).unwrap();
    assert_eq!(loaded.len(), rb.len(), "{name}");
    assert_eq!(loaded.write_count(), rb.write_count(), "{name}");
    assert_eq!(loaded.seed(), rb.seed(), "{name}");
    assert_eq!(loaded.beta(), rb.beta(), "{name}");
    let (a, b) = (rb.read_all_in_order(None), loaded.read_all_in_order(None));
    assert_eq!(ids(&a), ids(&b), "{name}");
    assert_eq!(a.generations(), b.generations(), "{name}");
    for i in 0..rb.capacity() as u64 {
        assert_eq!(
            rb.priority(i),
            loaded.priority(i),
            "{name}: priority of {i}"
        );
    }
    // The next samples are the ones the original draws next.
    for _ in 0..3 {
        match (rb.sample(16), loaded.sample(16)) {
            (Ok(x), Ok(y)) => same_batches(&x, &y),
            (x, y) => assert_eq!(x.err(), y.err(), "{name}"),
        }
    }
    // And both go on alike.
    fill(rb, 20);
    fill(&loaded, 20);
    same_batches(&rb.sample(16).unwrap(), &loaded.sample(16).unwrap());
}

#[test]
fn every_storage_and_sampler_round_trips() {
    for (name, builder) in builders() {
        let dir = tempfile::tempdir().unwrap();
        let rb = builder.build().unwrap();
        exercise(&rb);
        check_round_trip(name, &rb, dir.path());
    }
}

#[test]
fn an_open_epoch_goes_on_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(WithoutReplacement::new())
        .seed(3)
        .build()
        .unwrap();
    fill(&rb, 64);
    let mut seen: Vec<u64> = ids(&rb.sample(20).unwrap());
    rb.save(dir.path()).unwrap();
    let loaded = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
    seen.extend(ids(&loaded.sample(20).unwrap()));
    seen.extend(ids(&loaded.sample(20).unwrap()));
    seen.extend(ids(&loaded.sample(20).unwrap()));
    assert_eq!(loaded.sample(20).unwrap_err(), SampleError::EpochEnd);
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        64,
        "the loaded epoch hands out each remaining row once"
    );
}

#[test]
fn file_backed_buffers_dump_and_load_too() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ck) = (dir.path().join("store"), dir.path().join("ck"));
    let build = |path: &Path| {
        ReplayBuffer::builder(spec())
            .capacity(100)
            .sampler(Prioritized::new(0.6, 0.4))
            .memmap(path)
            .seed(9)
            .build()
            .unwrap()
    };
    let rb = build(&store);
    exercise(&rb);
    check_round_trip("file-backed", &rb, &ck);
    // And a checkpoint loads into a file-backed buffer of the same layout.
    let mut other = build(&dir.path().join("other"));
    other.restore(&ck).unwrap();
    let saved = ReplayBuffer::from_checkpoint(&ck).unwrap();
    assert_eq!(
        ids(&other.read_all_in_order(None)),
        ids(&saved.read_all_in_order(None))
    );
    same_batches(&other.sample(16).unwrap(), &saved.sample(16).unwrap());
}

#[test]
fn loads_replaces_the_contents_of_an_unshared_buffer_only() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(50)
        .seed(1)
        .build()
        .unwrap();
    fill(&rb, 40);
    rb.save(dir.path()).unwrap();
    let mut other = ReplayBuffer::builder(spec())
        .capacity(50)
        .seed(2)
        .build()
        .unwrap();
    fill(&other, 5);
    let handle = other.clone();
    let e = other.restore(dir.path()).unwrap_err();
    assert!(e.to_string().contains("other handles"), "{e}");
    drop(handle);
    other.restore(dir.path()).unwrap();
    assert_eq!(other.len(), 40);
    assert_eq!(other.seed(), 1);
    // Another layout is refused and changes nothing.
    let mut small = ReplayBuffer::builder(spec()).capacity(49).build().unwrap();
    fill(&small, 3);
    let e = small.restore(dir.path()).unwrap_err();
    assert!(
        e.is_mismatch() && e.to_string().contains("capacity 49 vs 50"),
        "{e}"
    );
    assert_eq!(small.len(), 3);
}

#[test]
fn the_compact_format_stores_each_observation_once() {
    let dir = tempfile::tempdir().unwrap();
    for (name, builder) in builders() {
        let rb = builder.build().unwrap();
        exercise(&rb);
        let (full, compact) = (
            dir.path().join(format!("{name}-full")),
            dir.path().join(format!("{name}-compact")),
        );
        rb.save(&full).unwrap();
        rb.save_with(
            &compact,
            &SaveOptions::new().compact("obs", ("next", "obs")),
        )
        .unwrap();
        let size = |d: &Path| -> u64 {
            std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().metadata().unwrap().len())
                .sum()
        };
        // Most rows' next observation (12 bytes of a row) was left out.
        assert!(
            size(&compact) + 6 * rb.capacity() as u64 <= size(&full),
            "{name}: {} vs {}",
            size(&compact),
            size(&full)
        );
        let loaded = ReplayBuffer::from_checkpoint(&compact).unwrap();
        let (a, b) = (rb.read_all_in_order(None), loaded.read_all_in_order(None));
        assert_eq!(
            a.column::<f32>(("next", "obs")).unwrap(),
            b.column::<f32>(("next", "obs")).unwrap(),
            "{name}"
        );
        assert_eq!(ids(&a), ids(&b), "{name}");
        same_batches(&rb.sample(16).unwrap(), &loaded.sample(16).unwrap());
    }
    let rb = ReplayBuffer::builder(spec()).capacity(10).build().unwrap();
    let e = rb
        .save_with(
            dir.path().join("bad"),
            &SaveOptions::new().compact("obs", "done"),
        )
        .unwrap_err();
    assert!(e.to_string().contains("one dtype and shape"), "{e}");
}

#[test]
fn save_and_load_hooks_see_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let mut rb = ReplayBuffer::builder(spec())
        .capacity(40)
        .seed(4)
        .build()
        .unwrap();
    fill(&rb, 30);
    let before = rb.read_all_in_order(None);
    // Saved negated; the buffer itself is not touched.
    rb.register_save_hook(|b| {
        for x in b.column_mut::<f32>("obs")? {
            *x = -*x;
        }
        Ok(())
    });
    rb.save(dir.path()).unwrap();
    assert_eq!(
        rb.read_all_in_order(None).column::<f32>("obs").unwrap(),
        before.column::<f32>("obs").unwrap()
    );
    // Without a load hook the negated rows come back...
    let raw = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
    let negated: Vec<f32> = before
        .column::<f32>("obs")
        .unwrap()
        .iter()
        .map(|x| -x)
        .collect();
    assert_eq!(
        raw.read_all_in_order(None).column::<f32>("obs").unwrap(),
        &negated[..]
    );
    // ...and a load hook undoes them.
    rb.register_load_hook(|b| {
        for x in b.column_mut::<f32>("obs")? {
            *x = -*x;
        }
        Ok(())
    });
    rb.clear().unwrap();
    rb.restore(dir.path()).unwrap();
    assert_eq!(
        rb.read_all_in_order(None).column::<f32>("obs").unwrap(),
        before.column::<f32>("obs").unwrap()
    );
    // A failing hook fails the dump, and leaves the previous checkpoint, and the
    // directory, as they were (the failed part's file was left behind).
    let files = listing(dir.path());
    rb.register_save_hook(|_| Err("refused".into()));
    let e = rb.save(dir.path()).unwrap_err();
    assert!(e.to_string().contains("refused"), "{e}");
    assert_eq!(ReplayBuffer::from_checkpoint(dir.path()).unwrap().len(), 30);
    assert_eq!(listing(dir.path()), files);
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A save's progress reports climb to their total and end on it, plain and compact
/// (they stopped at a quarter to a half of it: the total was the whole region's
/// bytes, most of which no dump writes).
#[test]
#[allow(clippy::disallowed_types)] // the loom facade rule is for the library
fn progress_ends_at_its_total() {
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    for (name, rb) in builders() {
        let rb = rb.build().unwrap();
        fill(&rb, 20);
        for compact in [false, true] {
            let reports = Arc::new(Mutex::new(Vec::new()));
            let seen = Arc::clone(&reports);
            let mut options = SaveOptions::new().progress(move |done, total| {
                seen.lock().unwrap().push((done, total));
            });
            if compact {
                options = options.compact("obs", ("next", "obs"));
            }
            rb.save_with(dir.path().join(name), &options).unwrap();
            let reports = reports.lock().unwrap();
            let &(done, total) = reports.last().unwrap();
            assert_eq!(done, total, "{name}, compact {compact}: {reports:?}");
            assert!(
                reports
                    .windows(2)
                    .all(|w| w[0].0 <= w[1].0 && w[0].0 <= w[1].1),
                "{name}, compact {compact}: {reports:?}"
            );
        }
    }
}

/// Saves into one directory from two threads at once, while a collector writes:
/// every save returns, and after each round the directory holds a checkpoint that
/// loads, of one of the saves. Without the directory's lock both wrote the next
/// generation's files over each other and deleted the last good one: 13 rounds of 20
/// left nothing that loaded.
#[test]
fn two_saves_into_one_directory_leave_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(4096)
        .seed(1)
        .build()
        .unwrap();
    fill(&rb, 4096);
    rb.save(dir.path()).unwrap();
    for round in 0..12u64 {
        let barrier = std::sync::Barrier::new(3);
        std::thread::scope(|s| {
            let saves: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        rb.save(dir.path())
                    })
                })
                .collect();
            barrier.wait();
            rb.extend(&rows(&rb, 5000 + round, 1, 1)).unwrap();
            for save in saves {
                save.join().unwrap().unwrap();
            }
        });
        let loaded = ReplayBuffer::from_checkpoint(dir.path())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(loaded.len(), 4096);
    }
}

/// A file-backed buffer's restore runs its load hooks too (it skipped them, reading
/// the rows straight into its file).
#[test]
fn load_hooks_see_the_rows_of_a_file_backed_restore() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec()).capacity(40).build().unwrap();
    fill(&rb, 30);
    let before = rb.read_all_in_order(None);
    rb.save(dir.path().join("ck")).unwrap();
    let mut backed = ReplayBuffer::builder(spec())
        .capacity(40)
        .memmap(dir.path().join("store"))
        .build()
        .unwrap();
    backed.register_load_hook(|b| {
        for x in b.column_mut::<f32>("obs")? {
            *x += 1000.0;
        }
        Ok(())
    });
    backed.restore(dir.path().join("ck")).unwrap();
    let shifted: Vec<f32> = before
        .column::<f32>("obs")
        .unwrap()
        .iter()
        .map(|x| x + 1000.0)
        .collect();
    assert_eq!(
        backed.read_all_in_order(None).column::<f32>("obs").unwrap(),
        &shifted[..]
    );
}

#[test]
fn a_max_value_buffer_keeps_ranking_after_a_load() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(10)
        .write_policy(replaybuf::WritePolicy::max_value("id"))
        .seed(2)
        .build()
        .unwrap();
    fill(&rb, 30); // ids 0..3000 by 100; the top ten by id stay
    rb.save(dir.path()).unwrap();
    let loaded = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
    let mut kept = ids(&loaded.read_all_in_order(None));
    kept.sort_unstable();
    assert_eq!(kept, (20..30).map(|t| t * 100).collect::<Vec<u64>>());
    // A row ranking above the lowest stored one replaces it; one below is rejected.
    let written = loaded.extend(&rows(&loaded, 15, 1, 1)).unwrap();
    assert!(
        written.is_rejected(0),
        "id 1500 ranks below every stored row"
    );
    let written = loaded.extend(&rows(&loaded, 40, 1, 1)).unwrap();
    assert!(!written.is_rejected(0));
    let mut kept = ids(&loaded.read_all_in_order(None));
    kept.sort_unstable();
    assert_eq!(kept[0], 2100, "the lowest (2000) was replaced");
    assert_eq!(*kept.last().unwrap(), 4000);
}

#[test]
fn typed_buffers_round_trip() {
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
    struct Step {
        obs: [f32; 4],
        action: u32,
        reward: f32,
    }
    let dir = tempfile::tempdir().unwrap();
    let rb = TypedBuffer::<Step>::builder()
        .capacity(32)
        .seed(8)
        .build()
        .unwrap();
    let steps: Vec<Step> = (0..50)
        .map(|i| Step {
            obs: [i as f32; 4],
            action: i,
            reward: 0.5,
        })
        .collect();
    rb.extend(&steps).unwrap();
    rb.save(dir.path()).unwrap();
    let loaded = TypedBuffer::<Step>::from_checkpoint(dir.path()).unwrap();
    assert_eq!(loaded.len(), 32);
    assert_eq!(
        rb.sample(8).unwrap().rows(),
        loaded.sample(8).unwrap().rows()
    );
}

mod damage {
    use super::*;

    fn checkpoint(dir: &Path) -> ReplayBuffer {
        let rb = ReplayBuffer::builder(spec())
            .capacity(100)
            .sampler(Prioritized::new(0.6, 0.4))
            .seed(5)
            .build()
            .unwrap();
        exercise(&rb);
        rb.save(dir).unwrap();
        rb
    }

    fn file(dir: &Path, part: &str) -> std::path::PathBuf {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(&format!("{part}."))
            })
            .unwrap()
    }

    fn refused(dir: &Path) -> replaybuf::error::PersistError {
        let e = ReplayBuffer::from_checkpoint(dir).unwrap_err();
        // And a buffer given it keeps its own rows.
        let mut other = ReplayBuffer::builder(spec())
            .capacity(100)
            .sampler(Prioritized::new(0.6, 0.4))
            .build()
            .unwrap();
        fill(&other, 7);
        assert!(other.restore(dir).is_err());
        assert_eq!(other.len(), 7);
        e
    }

    #[test]
    fn a_truncated_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(dir.path());
        let slots = file(dir.path(), "slots");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&slots)
            .unwrap();
        f.set_len(f.metadata().unwrap().len() - 100).unwrap();
        let e = refused(dir.path());
        assert!(e.is_corrupt() && e.path() == slots, "{e}");
        assert!(e.to_string().contains("truncated"), "{e}");
    }

    #[test]
    fn a_flipped_byte_fails_its_checksum() {
        for part in ["control", "slots", "trees"] {
            let dir = tempfile::tempdir().unwrap();
            checkpoint(dir.path());
            let path = file(dir.path(), part);
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x10;
            std::fs::write(&path, bytes).unwrap();
            let e = refused(dir.path());
            assert!(e.is_corrupt() && e.path() == path, "{part}: {e}");
            assert!(e.to_string().contains("checksum"), "{e}");
        }
    }

    /// A damaged value of the configuration that the layout hash does not cover (the
    /// seed: it loaded with the other seed, and drew other rows) fails meta.json's
    /// checksum; settings whose decimal text is long (alpha 0.1 + 0.2, beta 1/3)
    /// read back to the same checksum.
    #[test]
    fn a_damaged_seed_in_meta_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let rb = ReplayBuffer::builder(spec())
            .capacity(100)
            .sampler(Prioritized::new(0.1 + 0.2, 1.0 / 3.0).eps(1e-7 / 3.0))
            .seed(5)
            .build()
            .unwrap();
        exercise(&rb);
        rb.save(dir.path()).unwrap();
        ReplayBuffer::from_checkpoint(dir.path()).unwrap();
        let meta = dir.path().join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        assert!(text.contains("\"seed\": 5,"), "{text}");
        std::fs::write(&meta, text.replace("\"seed\": 5,", "\"seed\": 7,")).unwrap();
        let e = refused(dir.path());
        assert!(e.is_corrupt() && e.to_string().contains("checksum"), "{e}");
    }

    /// What meta.json records beside the configuration and no file's checksum covers
    /// (a rate limit, the list of files) fails the checkpoint record's checksum: a
    /// flipped digit of the limit loaded as another limit, and an epochs file struck
    /// from the list loaded as a fresh epoch.
    #[test]
    fn a_damaged_limit_or_file_list_in_meta_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let limit = replaybuf::RateLimit::new(5, 2.0, -490.0, 1e6).unwrap();
        let rb = ReplayBuffer::builder(spec())
            .capacity(100)
            .sampler(WithoutReplacement::new())
            .rate_limit(limit)
            .build()
            .unwrap();
        exercise(&rb);
        rb.sample(3).unwrap();
        rb.save(dir.path()).unwrap();
        ReplayBuffer::from_checkpoint(dir.path()).unwrap();
        let meta = dir.path().join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        let damaged = [
            text.replace("\"samples_per_insert\": 2.0", "\"samples_per_insert\": 3.0"),
            text.replace("\"min_diff\": -490.0", "\"min_diff\": -590.0"),
        ];
        for damaged in damaged {
            assert_ne!(damaged, text);
            std::fs::write(&meta, damaged).unwrap();
            let e = ReplayBuffer::from_checkpoint(dir.path()).unwrap_err();
            assert!(e.is_corrupt() && e.to_string().contains("checksum"), "{e}");
        }
        // The epochs file struck from the list (valid JSON still).
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let files = value["checkpoint"]["files"].as_array_mut().unwrap();
        let before = files.len();
        files.retain(|f| f["part"] != "epochs");
        assert_eq!(files.len(), before - 1);
        std::fs::write(&meta, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
        let e = ReplayBuffer::from_checkpoint(dir.path()).unwrap_err();
        assert!(e.is_corrupt() && e.to_string().contains("checksum"), "{e}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(dir.path());
        let trees = file(dir.path(), "trees");
        std::fs::remove_file(&trees).unwrap();
        let e = refused(dir.path());
        assert!(e.is_missing() && e.path() == trees, "{e}");
    }

    #[test]
    fn another_version_or_garbage_meta_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(dir.path());
        let meta = dir.path().join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        // Whatever version this build writes becomes 99.
        let at = text.find("\"version\": ").unwrap() + "\"version\": ".len();
        let digits = text[at..].find(|c: char| !c.is_ascii_digit()).unwrap();
        let other = format!("{}99{}", &text[..at], &text[at + digits..]);
        std::fs::write(&meta, other).unwrap();
        let e = refused(dir.path());
        assert!(
            e.is_version() && e.to_string().contains("version 99"),
            "{e}"
        );
        std::fs::write(&meta, &text[..text.len() / 2]).unwrap();
        let e = refused(dir.path());
        assert!(e.is_corrupt() && e.to_string().contains("meta.json"), "{e}");
        std::fs::write(
            &meta,
            text.replace("\"capacity\": 100", "\"capacity\": 101"),
        )
        .unwrap();
        let e = refused(dir.path());
        assert!(
            e.is_corrupt() && e.to_string().contains("layout hash"),
            "{e}"
        );
        std::fs::remove_file(&meta).unwrap();
        assert!(refused(dir.path()).is_missing());
    }

    /// `e` and its causes, in one line.
    fn said(e: &replaybuf::error::PersistError) -> String {
        let mut said = e.to_string();
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            said = format!("{said}: {c}");
            cause = c.source();
        }
        said
    }

    /// Runs `f` on a thread of its own, failing if it takes a minute.
    fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (done, wait) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .spawn(move || done.send(f()))
            .unwrap();
        wait.recv_timeout(std::time::Duration::from_secs(60))
            .expect("hung")
    }

    /// A FIFO or a device where a file belongs is refused by loads and by `inspect`
    /// (a FIFO's open waited for a writer for good; `/dev/zero` as meta.json was read
    /// until memory ran out), and so is a file named outside the directory (`inspect`
    /// read it).
    #[test]
    fn a_fifo_a_device_or_a_name_outside_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(dir.path());
        let path = dir.path().to_path_buf();
        let slots = file(&path, "slots");
        let saved = std::fs::read(&slots).unwrap();
        std::fs::remove_file(&slots).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&slots)
            .status()
            .unwrap();
        assert!(made.success());
        let (e, whole) = within_a_minute({
            let path = path.clone();
            move || {
                let e = refused(&path);
                let whole = replaybuf::checkpoint::inspect(&path).map(|i| i.is_whole());
                (e, whole)
            }
        });
        assert!(said(&e).contains("not a regular file"), "{}", said(&e));
        assert!(!whole.unwrap(), "inspect calls a FIFO whole");
        std::fs::remove_file(&slots).unwrap();
        std::fs::write(&slots, saved).unwrap();
        ReplayBuffer::from_checkpoint(&path).unwrap();

        let meta = path.join("meta.json");
        let text = std::fs::read_to_string(&meta).unwrap();
        std::fs::remove_file(&meta).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &meta).unwrap();
        let (e, inspected) = within_a_minute({
            let path = path.clone();
            move || {
                (
                    refused(&path),
                    replaybuf::checkpoint::inspect(&path).is_err(),
                )
            }
        });
        assert!(said(&e).contains("not a regular file"), "{}", said(&e));
        assert!(inspected);
        std::fs::remove_file(&meta).unwrap();

        // A file named outside, with the record's checksum struck (it is optional).
        let mut value: serde_json::Value = serde_json::from_str(&text).unwrap();
        value.as_object_mut().unwrap().remove("checkpoint_xxh3");
        let name = slots.file_name().unwrap().to_str().unwrap();
        for f in value["checkpoint"]["files"].as_array_mut().unwrap() {
            if f["name"] == name {
                f["name"] = format!("../{name}").into();
            }
        }
        std::fs::write(&meta, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
        let e = refused(&path);
        assert!(e.to_string().contains("outside"), "{e}");
        let e = replaybuf::checkpoint::inspect(&path).unwrap_err();
        assert!(e.to_string().contains("outside"), "{e}");
    }

    /// Rewrites `part`'s file with `change`, and meta.json's record of it to match
    /// (its checksum, and the record's own, which is optional, struck).
    fn rewrite(dir: &Path, part: &str, change: impl FnOnce(&mut Vec<u8>)) {
        let path = file(dir, part);
        let mut bytes = std::fs::read(&path).unwrap();
        change(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let meta = dir.join("meta.json");
        let mut value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
        value.as_object_mut().unwrap().remove("checkpoint_xxh3");
        let name = path.file_name().unwrap().to_str().unwrap();
        for f in value["checkpoint"]["files"].as_array_mut().unwrap() {
            if f["name"] == name {
                f["xxh3"] = xxhash_rust::xxh3::xxh3_64(&bytes).into();
            }
        }
        std::fs::write(&meta, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
    }

    /// Words of the control file whose checksum holds but that no save writes: a
    /// prioritized sampler's alpha of NaN (the load never returned), a cursor moved
    /// back over written rows (the load dropped them, and the next extend waited for
    /// good). Refused, as a reopened file-backed directory refuses them.
    #[test]
    fn control_words_no_save_writes_are_refused() {
        let nan = |bytes: &mut Vec<u8>| {
            let alpha = 0.6f64.to_ne_bytes();
            let at = bytes
                .windows(8)
                .position(|w| w == alpha)
                .expect("alpha stored");
            bytes[at..at + 8].copy_from_slice(&f64::NAN.to_ne_bytes());
        };
        // The control file starts with shard 0's cursor.
        let back = |bytes: &mut Vec<u8>| bytes[..8].copy_from_slice(&0u64.to_ne_bytes());
        for (what, change) in [("alpha", &nan as &dyn Fn(&mut Vec<u8>)), ("cursor", &back)] {
            let dir = tempfile::tempdir().unwrap();
            checkpoint(dir.path());
            rewrite(dir.path(), "control", change);
            let path = dir.path().to_path_buf();
            let e = within_a_minute(move || refused(&path));
            assert!(e.is_corrupt(), "{what}: {e}");
        }
    }

    #[test]
    fn a_checkpoint_of_another_spec_is_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(dir.path());
        let other = Spec::builder().field("id", DType::U64, []).build().unwrap();
        let mut rb = ReplayBuffer::builder(other)
            .capacity(100)
            .sampler(Prioritized::new(0.6, 0.4))
            .build()
            .unwrap();
        let e = rb.restore(dir.path()).unwrap_err();
        assert!(e.is_mismatch() && e.to_string().contains("the spec"), "{e}");
    }
}

#[test]
fn list_buffers_round_trip_and_refuse_damage() {
    use replaybuf::list::ListBuffer;
    let dir = tempfile::tempdir().unwrap();
    for sampler in [
        replaybuf::sampler::Sampler::from(replaybuf::sampler::Uniform),
        WithoutReplacement::new().into(),
    ] {
        let rb = ListBuffer::<(String, Vec<u32>)>::builder()
            .capacity(50)
            .shards(2)
            .sampler(sampler)
            .seed(6)
            .build()
            .unwrap();
        for i in 0..70u32 {
            rb.push((format!("step {i}"), vec![i; (i % 4) as usize]))
                .unwrap();
        }
        rb.sample(10).unwrap(); // opens an epoch when without replacement
        rb.save(dir.path()).unwrap();
        let loaded = ListBuffer::<(String, Vec<u32>)>::from_checkpoint(dir.path()).unwrap();
        assert_eq!(
            (loaded.len(), loaded.write_count()),
            (rb.len(), rb.write_count())
        );
        for i in 0..50 {
            assert_eq!(loaded.get(i).unwrap(), rb.get(i).unwrap());
        }
        for _ in 0..3 {
            match (rb.sample(8), loaded.sample(8)) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.items(), b.items());
                    assert_eq!(a.index(), b.index());
                }
                (a, b) => assert_eq!(a.err(), b.err()),
            }
        }
    }
    // Damage is refused by name; another value type is refused too.
    let items = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("items.")
        })
        .unwrap();
    assert!(ListBuffer::<u64>::from_checkpoint(dir.path()).is_err());
    // A seed changed in meta.json's text is refused, as a row buffer's is: it loaded
    // and drew other rows.
    let meta_path = dir.path().join("meta.json");
    let meta = std::fs::read_to_string(&meta_path).unwrap();
    let seed = meta
        .lines()
        .find(|l| l.trim_start().starts_with("\"seed\""))
        .unwrap()
        .to_owned();
    let other = seed.replace(|c: char| c.is_ascii_digit(), "7");
    assert_ne!(seed, other);
    std::fs::write(&meta_path, meta.replace(&seed, &other)).unwrap();
    let e = ListBuffer::<(String, Vec<u32>)>::from_checkpoint(dir.path()).unwrap_err();
    assert!(e.is_corrupt() && e.to_string().contains("checksum"), "{e}");
    std::fs::write(&meta_path, &meta).unwrap();
    assert!(ListBuffer::<(String, Vec<u32>)>::from_checkpoint(dir.path()).is_ok());
    let mut bytes = std::fs::read(&items).unwrap();
    bytes[30] ^= 4;
    std::fs::write(&items, &bytes).unwrap();
    let e = ListBuffer::<(String, Vec<u32>)>::from_checkpoint(dir.path()).unwrap_err();
    assert!(e.is_corrupt() && e.path() == items, "{e}");
    // A row buffer's checkpoint is not a list's, nor the other way round.
    assert!(ReplayBuffer::from_checkpoint(dir.path()).is_err());
}

/// A save hook or progress report that writes to the buffer being saved (or saves it
/// again) panics, saying so, where it waited forever for the save it runs inside; the
/// buffer then goes on (its writers thawed), and the hook that only reads is fine.
#[test]
#[allow(clippy::disallowed_methods)] // the loom facade rule is for the library
fn a_hook_that_writes_to_the_buffer_it_saves_panics_rather_than_hangs() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let dir = tempfile::tempdir().unwrap();
    // Each gets the buffer and the directory it is being saved to.
    type Reentry = fn(&ReplayBuffer, &Path);
    let reentries: [(&str, Reentry); 4] = [
        ("extend", |rb, _| {
            rb.extend(&rows(rb, 900, 1, 1)).map(drop).unwrap()
        }),
        ("clear", |rb, _| rb.clear().unwrap()),
        ("save", |rb, dest| {
            rb.save(dest.with_extension("again")).unwrap()
        }),
        // The directory's lock, which the outer save holds, waited for good.
        ("save here", |rb, dest| rb.save(dest).unwrap()),
    ];
    // A save of a max-value buffer holds its writer's lock too (whole batches in
    // the checkpoint): a hook's write must be refused before it waits for that.
    for (what, reentry) in reentries {
        for (through_progress, max_value) in [(false, false), (true, false), (false, true)] {
            let policy = match max_value {
                true => replaybuf::WritePolicy::max_value("id"),
                false => replaybuf::WritePolicy::RoundRobin,
            };
            let rb = ReplayBuffer::builder(spec())
                .capacity(64)
                .seed(2)
                .write_policy(policy)
                .build()
                .unwrap();
            fill(&rb, 20);
            let dest = dir
                .path()
                .join(format!("{what}-{through_progress}-{max_value}"));
            let (inner, path) = (rb.clone(), dest.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            let saving = rb.clone();
            std::thread::spawn(move || {
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    if through_progress {
                        let options =
                            SaveOptions::new().progress(move |_, _| reentry(&inner, &path));
                        saving.save_with(&dest, &options).map_err(|e| e.to_string())
                    } else {
                        saving.register_save_hook(move |_| {
                            reentry(&inner, &path);
                            Ok(())
                        });
                        saving.save(&dest).map_err(|e| e.to_string())
                    }
                }));
                let message = match outcome {
                    Ok(r) => format!("returned {r:?}"),
                    Err(p) => p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default(),
                };
                tx.send(message).unwrap();
            });
            let message = rx
                .recv_timeout(std::time::Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("{what}, progress {through_progress}: hung"));
            assert!(
                message.contains("wrote to the buffer being saved"),
                "{what}, progress {through_progress}: {message}"
            );
            rb.extend(&rows(&rb, 20, 1, 1)).unwrap();
        }
    }
}

/// A list buffer's checkpoint keeps a FIFO queue's place (taken values came out
/// again after a load); refuses at save a value JSON cannot read back (a NaN saved
/// "fine" and never loaded, the previous checkpoint already gone), keeping the
/// previous checkpoint; refuses at load cursors its values do not back (a damaged
/// meta.json: reads then waited forever); and `inspect` says what it is (it said
/// "damaged").
#[test]
fn list_checkpoints_keep_the_queue_and_refuse_what_they_cannot_hold() {
    use replaybuf::list::ListBuffer;
    use replaybuf::sampler::Fifo;
    let dir = tempfile::tempdir().unwrap();
    let fifo = ListBuffer::<u32>::builder()
        .capacity(8)
        .seed(1)
        .sampler(Fifo)
        .build()
        .unwrap();
    fifo.extend(0..5).unwrap();
    assert_eq!(fifo.sample(3).unwrap().items(), [0, 1, 2]);
    fifo.save(dir.path().join("fifo")).unwrap();
    let back = ListBuffer::<u32>::from_checkpoint(dir.path().join("fifo")).unwrap();
    assert_eq!(back.sample(3).unwrap().items(), [3, 4]);

    let floats = ListBuffer::<f64>::builder()
        .capacity(4)
        .seed(0)
        .build()
        .unwrap();
    floats.extend([1.0, 2.0]).unwrap();
    let path = dir.path().join("floats");
    floats.save(&path).unwrap();
    floats.extend([f64::NAN]).unwrap();
    let e = floats.save(&path).unwrap_err();
    assert!(e.to_string().contains("does not read back"), "{e}");
    assert_eq!(ListBuffer::<f64>::from_checkpoint(&path).unwrap().len(), 2);

    let meta = path.join("meta.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    let cursor = text.find("\"cursors\"").unwrap();
    let damaged = format!(
        "{}{}",
        &text[..cursor],
        text[cursor..].replacen('2', "3", 1)
    );
    std::fs::write(&meta, damaged).unwrap();
    // Refused by the meta's checksum (before it, by the items it then lacked).
    let e = ListBuffer::<f64>::from_checkpoint(&path).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    let e = replaybuf::checkpoint::inspect(&path).unwrap_err();
    assert!(e.to_string().contains("ListBuffer::from_checkpoint"), "{e}");
}

/// Loads hold the checkpoint directory's lock beside saves: a save deleted the
/// generation a load was reading (`Missing`, or a file-backed buffer's region half
/// written). Loads and saves of one directory in two threads: every load whole. And
/// a save hook that loads the checkpoint it is part of is refused, not left waiting
/// on its own lock.
#[test]
fn loads_and_saves_of_one_directory_take_turns() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(2000)
        .seed(3)
        .build()
        .unwrap();
    fill(&rb, 2000);
    rb.save(dir.path()).unwrap();
    std::thread::scope(|s| {
        let saver = s.spawn(|| {
            for _ in 0..20 {
                rb.save(dir.path()).unwrap();
            }
        });
        for _ in 0..20 {
            let loaded = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
            assert_eq!(loaded.len(), 2000);
        }
        saver.join().unwrap();
    });

    let path = dir.path().to_path_buf();
    rb.register_save_hook(move |_| {
        let e = ReplayBuffer::from_checkpoint(&path).unwrap_err();
        assert!(e.to_string().contains("already"), "{e}");
        Ok(())
    });
    rb.save(dir.path()).unwrap();
}

#[test]
fn the_compact_format_refuses_fields_of_no_bytes() {
    // Saved, such a checkpoint's load split its rows into chunks of 0 bytes (a panic).
    let spec = Spec::builder()
        .field("o", DType::F32, [0])
        .field("no", DType::F32, [0])
        .field("id", DType::U64, [])
        .build()
        .unwrap();
    let rb = ReplayBuffer::builder(spec).capacity(8).build().unwrap();
    rb.extend(&rb.batch([4])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let e = rb
        .save_with(dir.path(), &SaveOptions::new().compact("o", "no"))
        .unwrap_err();
    assert!(e.to_string().contains("no bytes"), "{e}");
}

#[test]
fn a_hook_that_reorders_the_fields_fails_the_save() {
    // The rows come back by column position: a batch of the same fields in another
    // order passed the check and wrote one field's bytes as another's.
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(40)
        .seed(4)
        .build()
        .unwrap();
    fill(&rb, 10);
    rb.register_save_hook(|b| {
        let mut reversed = Spec::builder();
        for f in b.spec().fields().iter().rev() {
            reversed = reversed.field(f.key().clone(), f.dtype(), f.shape());
        }
        *b = Batch::zeros(reversed.build().unwrap(), [b.len()]);
        Ok(())
    });
    let e = rb.save(dir.path()).unwrap_err();
    assert!(e.to_string().contains("values only"), "{e}");
}

/// A save while a max-value writer places its batches holds whole batches: the
/// writer places a batch row by row under its lock, and a save that froze the
/// storage between two rows held part of one (148,039 rows of 64-row batches).
#[test]
#[allow(clippy::disallowed_methods, clippy::disallowed_types)] // the loom facade rule is for the library
fn a_save_beside_a_max_value_writer_holds_whole_batches() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(40_000)
        .write_policy(replaybuf::WritePolicy::max_value("id"))
        .build()
        .unwrap();
    let batches = 600;
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            for b in 0..batches {
                rb.extend(&rows(&rb, b * 64, 64, 1)).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut saves = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) || saves == 0 {
            let dest = dir.path().join(format!("c{}", saves % 2));
            rb.save(&dest).unwrap();
            let held = ReplayBuffer::from_checkpoint(&dest).unwrap().len();
            assert_eq!(held % 64, 0, "save {saves} holds {held} rows");
            saves += 1;
        }
    });
}

/// A list buffer's save into a directory holding a file-backed storage or a row
/// buffer's checkpoint is refused: it replaced their meta.json, and they could be
/// opened no more.
#[test]
fn a_list_save_over_another_kind_of_directory_is_refused() {
    use replaybuf::list::ListBuffer;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let rb = ReplayBuffer::builder(spec())
        .capacity(16)
        .memmap(&store)
        .build()
        .unwrap();
    fill(&rb, 5);
    rb.flush().unwrap();
    drop(rb);
    let checkpoint = dir.path().join("checkpoint");
    let saved = ReplayBuffer::builder(spec()).capacity(16).build().unwrap();
    fill(&saved, 7);
    saved.save(&checkpoint).unwrap();
    let list = ListBuffer::<u32>::builder().capacity(4).build().unwrap();
    list.extend(0..3).unwrap();
    for other in [&store, &checkpoint] {
        let e = list.save(other).unwrap_err();
        assert!(e.to_string().contains("not a list buffer's"), "{e}");
    }
    let reopened = ReplayBuffer::builder(spec())
        .capacity(16)
        .memmap(&store)
        .existsok(true)
        .build()
        .unwrap();
    assert_eq!(reopened.len(), 5);
    assert_eq!(ReplayBuffer::from_checkpoint(&checkpoint).unwrap().len(), 7);
    // Its own checkpoints it saves over, as before.
    let own = dir.path().join("list");
    list.save(&own).unwrap();
    list.save(&own).unwrap();
}
