//! File-backed storage: a buffer in files under a directory, reopened with its contents.

use replaybuf::sampler::Prioritized;
use replaybuf::{DType, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [3])
        .build()
        .unwrap()
}

fn chunk(rb: &ReplayBuffer, ids: std::ops::Range<u64>) -> replaybuf::Batch {
    let mut b = rb.batch([(ids.end - ids.start) as usize]);
    let id: Vec<u64> = ids.clone().collect();
    let obs: Vec<f32> = ids.flat_map(|i| [i as f32, -(i as f32), 0.5]).collect();
    b.set("id", &id).unwrap();
    b.set("obs", &obs).unwrap();
    b
}

fn ids(b: &replaybuf::Batch) -> Vec<u64> {
    let id = b.column::<u64>("id").unwrap();
    let obs = b.column::<f32>("obs").unwrap();
    for (k, &i) in id.iter().enumerate() {
        assert_eq!(
            &obs[3 * k..3 * k + 3],
            &[i as f32, -(i as f32), 0.5],
            "row {i} torn"
        );
    }
    id.to_vec()
}

#[test]
fn a_buffer_comes_back_with_its_contents() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rb");
    let (first, sampled) = {
        let rb = ReplayBuffer::builder(spec())
            .capacity(100)
            .shards(2)
            .memmap(&path)
            .seed(5)
            .build()
            .unwrap();
        rb.extend(&chunk(&rb, 0..70)).unwrap();
        rb.extend(&chunk(&rb, 70..130)).unwrap();
        let first = ids(&rb.read_all_in_order(None));
        // What the buffer would sample next, from a clone of its state.
        (first, rb.len())
    };
    assert!(path.join("storage.bin").exists() && path.join("meta.json").exists());
    let again = ReplayBuffer::builder(spec())
        .capacity(100)
        .shards(2)
        .memmap(&path)
        .existsok(true)
        .build()
        .unwrap();
    assert_eq!(again.len(), sampled);
    assert_eq!(again.seed(), 5, "a reopened buffer keeps its seed");
    assert_eq!(ids(&again.read_all_in_order(None)), first);
    // Writing goes on where it stopped: the round robin's next shard is 0 (which held
    // 20..70), and its FIFO eviction continues.
    again.extend(&chunk(&again, 130..140)).unwrap();
    let now = ids(&again.read_all_in_order(None));
    assert_eq!(now.len(), 100);
    assert!(now.contains(&139) && !now.contains(&25) && now.contains(&30));
    ids(&again.sample(64).unwrap());
}

#[test]
fn an_existing_buffer_is_refused_without_existsok_and_a_mismatch_always() {
    let dir = tempfile::tempdir().unwrap();
    let build = |capacity: usize, existsok: bool| {
        ReplayBuffer::builder(spec())
            .capacity(capacity)
            .memmap(dir.path())
            .existsok(existsok)
            .build()
    };
    let rb = build(64, false).unwrap();
    rb.extend(&chunk(&rb, 0..10)).unwrap();
    drop(rb);
    let e = build(64, false).unwrap_err();
    assert!(e.to_string().contains("already holds a buffer"), "{e}");
    let e = build(128, true).unwrap_err();
    assert!(e.to_string().contains("capacity 128 vs 64"), "{e}");
    let other_spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
    let e = ReplayBuffer::builder(other_spec)
        .capacity(64)
        .memmap(dir.path())
        .existsok(true)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("the spec"), "{e}");
    // The buffer is untouched by the refusals.
    assert_eq!(build(64, true).unwrap().len(), 10);
}

#[test]
fn a_second_process_or_handle_cannot_map_an_open_storage() {
    let dir = tempfile::tempdir().unwrap();
    let build = || {
        ReplayBuffer::builder(spec())
            .capacity(64)
            .memmap(dir.path())
            .existsok(true)
            .build()
    };
    let rb = build().unwrap();
    let e = build().unwrap_err();
    assert!(
        e.to_string().contains("open for writing by another buffer"),
        "{e}"
    );
    drop(rb);
    build().unwrap();
}

#[test]
fn a_fresh_buffer_never_sees_stale_rows() {
    let dir = tempfile::tempdir().unwrap();
    // An unfinished creation left a storage file with rows but no meta.
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .memmap(dir.path())
        .build()
        .unwrap();
    rb.extend(&chunk(&rb, 0..64)).unwrap();
    drop(rb);
    std::fs::remove_file(dir.path().join("meta.json")).unwrap();
    let fresh = ReplayBuffer::builder(spec())
        .capacity(64)
        .memmap(dir.path())
        .build()
        .unwrap();
    assert_eq!(fresh.len(), 0);
    assert!(fresh.read_all_in_order(None).is_empty());
}

#[test]
fn prioritized_state_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let build = || {
        ReplayBuffer::builder(spec())
            .capacity(64)
            .sampler(Prioritized::new(0.6, 0.4))
            .memmap(dir.path())
            .existsok(true)
            .seed(1)
            .build()
            .unwrap()
    };
    let rb = build();
    let written = rb.extend(&chunk(&rb, 0..64)).unwrap();
    let idx: Vec<u64> = written.iter().collect();
    let gens: Vec<u64> = (0..64).map(|r| written.generation(r)).collect();
    let prios: Vec<f64> = (0..64).map(|i| 0.1 + i as f64).collect();
    rb.update_priority(&idx, &gens, &prios).unwrap();
    rb.set_beta(0.9).unwrap();
    let next = rb.sample(32).unwrap();
    drop(rb);
    let rb = build();
    assert_eq!(rb.beta(), Some(0.9));
    // A raw priority keeps 22 significant bits.
    let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= b * 2.5e-7);
    assert!(close(rb.priority(10), 10.1));
    assert!(replaybuf::internals::priorities_consistent(&rb));
    // New rows enter at the largest priority seen before the reopen.
    rb.extend(&chunk(&rb, 64..65)).unwrap();
    assert!(close(rb.priority(0), 63.1));
    drop(next);
}

/// A region whose alpha was damaged (set to NaN, or past its range, in the file) is
/// refused on reopening with an error that says so: it was trusted, and the reopen's
/// rebuild of the trees never returned. Each reopen runs on a thread of its own, so
/// that a hang fails the test rather than stalling it.
#[test]
#[allow(clippy::disallowed_methods)] // the loom facade rule is for the library
fn a_damaged_alpha_is_refused_on_reopening() {
    use std::time::Duration;
    const ALPHA: f64 = 0.637;
    for damage in [f64::NAN, -1.0, 1e9] {
        let dir = tempfile::tempdir().unwrap();
        let build = |path: std::path::PathBuf| {
            ReplayBuffer::builder(spec())
                .capacity(64)
                .sampler(Prioritized::new(ALPHA, 0.4))
                .memmap(path)
                .existsok(true)
                .build()
        };
        let rb = build(dir.path().to_path_buf()).unwrap();
        rb.extend(&chunk(&rb, 0..40)).unwrap();
        drop(rb);
        let file = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "bin"))
            .expect("the storage file");
        let mut bytes = std::fs::read(&file).unwrap();
        let word = bytes
            .chunks(8)
            .position(|w| w == ALPHA.to_bits().to_le_bytes())
            .expect("alpha's word");
        bytes[word * 8..word * 8 + 8].copy_from_slice(&damage.to_bits().to_le_bytes());
        std::fs::write(&file, &bytes).unwrap();

        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || tx.send(build(path).map(drop).map_err(|e| e.to_string())));
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the reopen of a damaged region returns");
        let e = got.expect_err("a damaged alpha is refused");
        assert!(e.contains("alpha is"), "{damage}: {e}");
    }
}

/// A region whose rows past its cursor were damaged (a slot of the ring's first lap
/// the cursor never reached shows a row: its stamp damaged, or the cursor moved back
/// over written rows) is refused on reopening, with an error that says where: it was
/// reopened, and the next append to that slot waited forever for it to be empty.
/// A row below the cursor damaged the same way is taken over as before.
#[test]
#[allow(clippy::disallowed_methods)] // the loom facade rule is for the library
fn a_row_past_the_cursor_is_refused_on_reopening() {
    use std::time::Duration;
    const BASE: u64 = 0x5eed_0000_0000;
    let dir = tempfile::tempdir().unwrap();
    let build = |path: std::path::PathBuf| {
        ReplayBuffer::builder(spec())
            .capacity(64)
            .memmap(path)
            .existsok(true)
            .build()
    };
    let rb = build(dir.path().to_path_buf()).unwrap();
    rb.extend(&chunk(&rb, BASE..BASE + 40)).unwrap();
    drop(rb);
    let file = dir.path().join("storage.bin");
    let bytes = std::fs::read(&file).unwrap();
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let id_at = |i: u64| {
        bytes
            .chunks(8)
            .position(|w| w == (BASE + i).to_le_bytes())
            .expect("a row's id")
            * 8
    };
    let stride = id_at(1) - id_at(0);
    assert_eq!(id_at(39) - id_at(0), 39 * stride, "slots in ring order");
    // The stamp: the word before the id that every written row has published (lap
    // 0, no edit: 2) and the rest of the ring's slots empty.
    let stamp = (8..=id_at(0))
        .step_by(8)
        .find(|&back| {
            (0..40).all(|i| word(id_at(0) + i * stride - back) == 2)
                && (40..64).all(|i| word(id_at(0) + i * stride - back) == 0)
        })
        .expect("the stamps' word");
    let stamp_of = |i: usize| id_at(0) + i * stride - stamp;

    let reopen = |bytes: &[u8]| {
        std::fs::write(&file, bytes).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let got = build(path).map_err(|e| e.to_string()).and_then(|rb| {
                rb.extend(&chunk(&rb, 0..30)).map_err(|e| e.to_string())?;
                Ok(rb.len())
            });
            tx.send(got)
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the reopen and an append return")
    };
    for damaged in [40, 50, 63] {
        let mut copy = bytes.clone();
        copy[stamp_of(damaged)..stamp_of(damaged) + 8].copy_from_slice(&2u64.to_le_bytes());
        let e = reopen(&copy).expect_err("a row past the cursor is refused");
        assert!(
            e.contains(&format!("ring position {damaged}")) && e.contains("cursor, 40"),
            "{e}"
        );
        // Refused, and left as it was.
        assert_eq!(std::fs::read(&file).unwrap(), copy);
    }
    // Below the cursor: a stamp of another lap is the abandoned mark's to take over.
    let mut copy = bytes.clone();
    copy[stamp_of(10)..stamp_of(10) + 8].copy_from_slice(&(7u64 << 32 | 2).to_le_bytes());
    assert_eq!(reopen(&copy), Ok(64));
    assert_eq!(reopen(&bytes), Ok(64));
}

/// A buffer reopened with settings that write a longer or shorter configuration (a
/// seed, a batch size, alpha and beta of more digits) finds its rows: the region's
/// blocks lie after the meta its creator wrote, and a reopening laid them out after
/// the meta it would write, reading the cursors from other words.
#[test]
fn a_reopening_with_longer_settings_finds_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let build = |seed: u64, batch: usize, alpha: f64, beta: f64| {
        ReplayBuffer::builder(spec())
            .capacity(64)
            .seed(seed)
            .batch_size(batch)
            .sampler(Prioritized::new(alpha, beta))
            .memmap(dir.path())
            .existsok(true)
            .build()
    };
    let rb = build(5, 1, 0.5, 0.5).unwrap();
    rb.extend(&chunk(&rb, 0..40)).unwrap();
    drop(rb);
    for digits in 0..20u32 {
        let big = 10u64.pow(digits.min(19));
        let long = 0.1 + f64::from(digits) / 7.0;
        let rb = build(big, big.max(1) as usize, long.min(0.99), long / 3.0)
            .unwrap_or_else(|e| panic!("{digits} digits: {e}"));
        assert_eq!(rb.len(), 40, "{digits} digits");
        assert_eq!(
            ids(&rb.read_all_in_order(None)),
            (0..40).collect::<Vec<_>>()
        );
    }
}

/// A file-backed buffer that restored a checkpoint reopens with the checkpoint's seed,
/// and samples as a buffer loaded from the checkpoint does: its directory kept the
/// seed it was built with, under the checkpoint's stream counters.
#[test]
fn a_restored_buffer_reopens_with_the_checkpoints_seed() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, store) = (dir.path().join("ck"), dir.path().join("rb"));
    let src = ReplayBuffer::builder(spec())
        .capacity(64)
        .seed(1)
        .build()
        .unwrap();
    src.extend(&chunk(&src, 0..40)).unwrap();
    src.sample(8).unwrap();
    src.save(&ck).unwrap();
    let builder = || ReplayBuffer::builder(spec()).capacity(64).memmap(&store);
    {
        let mut rb = builder().seed(2).build().unwrap();
        rb.restore(&ck).unwrap();
        assert_eq!(rb.seed(), 1);
    }
    let again = builder().existsok(true).build().unwrap();
    assert_eq!(again.seed(), 1);
    let loaded = ReplayBuffer::from_checkpoint(&ck).unwrap();
    assert_eq!(
        again.sample(16).unwrap().index(),
        loaded.sample(16).unwrap().index()
    );
}
