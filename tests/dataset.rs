//! Offline datasets and `inspect`: directories opened to be read, never written.

use std::path::Path;

use replaybuf::error::DataError;
use replaybuf::sampler::Prioritized;
use replaybuf::{DType, ReplayBuffer, Spec};

fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("obs", DType::F32, [4])
        .build()
        .unwrap()
}

fn fill(rb: &ReplayBuffer, n: u64) {
    let mut b = rb.batch([n as usize]);
    let ids: Vec<u64> = (0..n).collect();
    let obs: Vec<f32> = (0..n).flat_map(|i| [i as f32; 4]).collect();
    b.set("id", &ids).unwrap();
    b.set("obs", &obs).unwrap();
    rb.extend(&b).unwrap();
}

/// Four threads sample the dataset; every row they get is whole.
fn sample_from_threads(rb: &ReplayBuffer) {
    std::thread::scope(|s| {
        for _ in 0..4 {
            let mut learner = rb.learner();
            s.spawn(move || {
                for _ in 0..50 {
                    let b = learner.sample(32).unwrap();
                    let (ids, obs) = (
                        b.column::<u64>("id").unwrap(),
                        b.column::<f32>("obs").unwrap(),
                    );
                    for (k, &id) in ids.iter().enumerate() {
                        assert_eq!(&obs[4 * k..4 * k + 4], &[id as f32; 4]);
                    }
                }
            });
        }
    });
}

fn digest(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn a_checkpoint_opens_as_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(500)
        .seed(1)
        .build()
        .unwrap();
    fill(&rb, 400);
    rb.save(dir.path()).unwrap();
    let data = ReplayBuffer::open_dataset(dir.path()).unwrap();
    assert_eq!(data.len(), 400);
    sample_from_threads(&data);
    // Read-only: every write is refused and changes nothing.
    let rows = data.read_all_in_order(Some(10));
    assert_eq!(data.extend(&rows).unwrap_err(), DataError::Immutable);
    assert_eq!(
        data.writer().extend(&rows).unwrap_err(),
        DataError::Immutable
    );
    assert!(data.write_all(&rows, None).is_err());
    assert_eq!(data.len(), 400);
}

#[test]
fn a_file_backed_storage_opens_as_a_dataset_and_its_file_never_changes() {
    let dir = tempfile::tempdir().unwrap();
    let writer = ReplayBuffer::builder(spec())
        .capacity(500)
        .sampler(Prioritized::new(0.6, 0.4))
        .memmap(dir.path())
        .seed(2)
        .build()
        .unwrap();
    fill(&writer, 300);
    // Not while a process has it open for writing.
    let e = ReplayBuffer::open_dataset(dir.path()).unwrap_err();
    assert!(e.is_in_use(), "{e}");
    drop(writer);
    let before = digest(&dir.path().join("storage.bin"));
    let (a, b) = (
        ReplayBuffer::open_dataset(dir.path()).unwrap(),
        ReplayBuffer::open_dataset(dir.path()).unwrap(),
    );
    assert_eq!((a.len(), b.len()), (300, 300));
    let rows = a.read_all_in_order(Some(3));
    assert_eq!(a.extend(&rows).unwrap_err(), DataError::Immutable);
    sample_from_threads(&a);
    sample_from_threads(&b);
    drop((a, b));
    assert!(
        before == digest(&dir.path().join("storage.bin")),
        "the dataset's file changed"
    );
}

#[test]
fn inspect_reports_contents_and_damage() {
    let dir = tempfile::tempdir().unwrap();
    let rb = ReplayBuffer::builder(spec())
        .capacity(1000)
        .shards(2)
        .sampler(Prioritized::new(0.6, 0.4))
        .seed(3)
        .build()
        .unwrap();
    fill(&rb, 350); // one shard
    fill(&rb, 350); // the other
    rb.save(dir.path()).unwrap();
    let found = replaybuf::checkpoint::inspect(dir.path()).unwrap();
    assert!(found.is_whole());
    assert_eq!(found.rows(), Some(700));
    let text = found.to_string();
    for want in [
        "checkpoint, generation 1",
        "obs",
        "f32",
        "700 of 1000 rows (70.0%)",
        "priorities: min 1.000000",
        "every checksum holds",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // `replaybuf inspect` says the same: cli/tests/commands.rs.
    let slots = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("slots.")
        })
        .unwrap();
    let mut bytes = std::fs::read(&slots).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&slots, bytes).unwrap();
    let found = replaybuf::checkpoint::inspect(dir.path()).unwrap();
    assert!(!found.is_whole());
    assert!(replaybuf::checkpoint::inspect(dir.path().join("nothing")).is_err());
}
