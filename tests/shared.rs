//! Shared mode: one buffer in named shared memory, written and read by several real
//! processes (this test binary running itself as the children: `shared_child` does
//! nothing unless `REPLAYBUF_SHM_ROLE` is set).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use replaybuf::error::DataError;
use replaybuf::sampler::Prioritized;
use replaybuf::{DType, ReplayBuffer, ReplayBufferBuilder, Spec};

mod common;
use common::shm::path_of;

fn name(test: &str) -> String {
    common::shm::name("shared", test)
}

/// Rows carry their own proof: `id`, and `check` = three values derived from it.
fn spec() -> Spec {
    Spec::builder()
        .field("id", DType::U64, [])
        .field("writer", DType::U64, [])
        .field("check", DType::F64, [3])
        .build()
        .unwrap()
}

fn check_of(id: u64) -> [f64; 3] {
    [id as f64, -(id as f64), (id % 97) as f64 + 0.5]
}

fn builder(name: &str, shards: usize) -> ReplayBufferBuilder {
    ReplayBuffer::builder(spec())
        .capacity(1 << 16)
        .shards(shards)
        .sampler(Prioritized::new(0.6, 0.4))
        .seed(3)
        .shared(name)
}

/// A chunk of rows `first..first + n` of writer `w`.
fn chunk(rb: &ReplayBuffer, w: u64, first: u64, n: usize) -> replaybuf::Batch {
    let mut b = rb.batch([n]);
    let ids: Vec<u64> = (first..first + n as u64).collect();
    b.set("id", &ids).unwrap();
    b.set("writer", &vec![w; n]).unwrap();
    let check: Vec<f64> = ids.iter().flat_map(|&i| check_of(i)).collect();
    b.set("check", &check).unwrap();
    b
}

/// Checks every row of `batch` is whole; returns (writer, id) pairs.
fn whole(batch: &replaybuf::Batch) -> Vec<(u64, u64)> {
    let (ids, w, check) = (
        batch.column::<u64>("id").unwrap(),
        batch.column::<u64>("writer").unwrap(),
        batch.column::<f64>("check").unwrap(),
    );
    for (k, &id) in ids.iter().enumerate() {
        assert_eq!(&check[3 * k..3 * k + 3], &check_of(id), "row {id} is torn");
    }
    w.iter().copied().zip(ids.iter().copied()).collect()
}

const CHUNK: usize = 100;

/// The child: attaches to the region named by `REPLAYBUF_SHM_NAME` and plays its role.
#[test]
fn shared_child() {
    let Ok(role) = std::env::var("REPLAYBUF_SHM_ROLE") else {
        return;
    };
    let name = std::env::var("REPLAYBUF_SHM_NAME").unwrap();
    let w: u64 = std::env::var("REPLAYBUF_SHM_WRITER")
        .unwrap()
        .parse()
        .unwrap();
    if role == "creator" {
        // Creates the region, says so, and waits to be killed.
        let rb = builder(&name, 1).build().unwrap();
        println!("created {}", rb.capacity());
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let rb = match ReplayBuffer::attach(&name) {
        Ok(rb) => rb,
        Err(e) => {
            println!("attach refused: {e}");
            std::process::exit(4);
        }
    };
    let writer = || rb.writer();
    match role.as_str() {
        // Writes `chunks` chunks of ids w * 1e6.., says so, and stays (its shard
        // leased) until the parent closes its stdin.
        "writer" => {
            let writer = writer();
            let chunks: u64 = std::env::var("REPLAYBUF_SHM_CHUNKS")
                .unwrap()
                .parse()
                .unwrap();
            for c in 0..chunks {
                writer
                    .extend(&chunk(&rb, w, w * 1_000_000 + c * CHUNK as u64, CHUNK))
                    .unwrap();
            }
            println!("done {}", writer.shard());
            std::io::stdout().flush().unwrap();
            let _ = std::io::stdin().read_line(&mut String::new());
        }
        // Writes a chunk, forks a child that sleeps (an environment worker), says
        // the child's pid, and waits to be killed.
        "forker" => {
            writer()
                .extend(&chunk(&rb, w, w * 1_000_000, CHUNK))
                .unwrap();
            // SAFETY: the child only sleeps and exits, both async-signal-safe.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: as above: a sleep and an exit.
                unsafe {
                    libc::sleep(60);
                    libc::_exit(0);
                }
            }
            println!("forked {pid}");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        // Writes forever, saying after each chunk how far it got.
        "forever" => {
            let writer = writer();
            println!("shard {}", writer.shard());
            for c in 0.. {
                writer
                    .extend(&chunk(&rb, w, w * 1_000_000 + c * CHUNK as u64, CHUNK))
                    .unwrap();
                println!("wrote {c}");
            }
        }
        // Samples and updates priorities forever, saying so once it has begun.
        "learner" => {
            let mut learner = rb.learner();
            for round in 0.. {
                if let Ok(b) = learner.sample(64) {
                    let p = vec![2.0; b.len()];
                    rb.update_priority(b.index(), b.generations(), &p).unwrap();
                }
                if round == 10 {
                    println!("learning");
                }
            }
        }
        // Takes a writer handle, says so, and gives its shard back (by going) after
        // `chunks` milliseconds.
        "hold" => {
            let writer = writer();
            println!("holding {}", writer.shard());
            let ms: u64 = std::env::var("REPLAYBUF_SHM_CHUNKS")
                .unwrap()
                .parse()
                .unwrap();
            std::thread::sleep(Duration::from_millis(ms));
        }
        // Asks for a writer handle, and says why there is none.
        "try-writer" => match rb.try_writer() {
            Ok(w) => println!("writer on shard {}", w.shard()),
            Err(e) => {
                println!("refused: {e}");
                std::process::exit(3);
            }
        },
        // Sets the priority of every row it can see to its id, then says so.
        "updater" => {
            let all = rb.read_all_in_order(None);
            let p: Vec<f64> = all
                .column::<u64>("id")
                .unwrap()
                .iter()
                .map(|&i| i as f64)
                .collect();
            rb.update_priority(all.index(), all.generations(), &p)
                .unwrap();
            println!("updated {}", all.len());
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(name: &str, role: &str, writer: u64, chunks: u64) -> Child {
    common::child("shared_child", &[])
        .env("REPLAYBUF_SHM_ROLE", role)
        .env("REPLAYBUF_SHM_NAME", name)
        .env("REPLAYBUF_SHM_WRITER", writer.to_string())
        .env("REPLAYBUF_SHM_CHUNKS", chunks.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The child's output lines (the harness prints `test shared_child ... ` first).
fn lines(child: &mut Child) -> impl Iterator<Item = String> {
    BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| l.unwrap())
}

#[test]
#[allow(clippy::disallowed_methods)] // the loom facade rule is for the library
fn three_writer_processes_and_a_sampling_parent_lose_nothing() {
    let name = name("three");
    let rb = builder(&name, 4).build().unwrap();
    let chunks = 40u64;
    let mut children: Vec<Child> = (1..=3).map(|w| spawn(&name, "writer", w, chunks)).collect();
    // Each child's lines arrive on a channel, so the parent samples while it waits.
    let (said, heard) = std::sync::mpsc::channel();
    for c in &mut children {
        let (said, out) = (said.clone(), lines(c));
        std::thread::spawn(move || out.for_each(|l| drop(said.send(l))));
    }
    drop(said);
    // Sample while they write, and at least once after (a fast machine may finish
    // the writes before the first draw): every row whole. The writers stay until
    // their stdin closes, so their shards stay leased.
    let mut learner = rb.learner();
    let (mut sampled, mut done) = (0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(120);
    while done.len() < 3 || sampled == 0 {
        assert!(
            Instant::now() < deadline,
            "writers said {done:?}, {sampled} draws"
        );
        for c in &mut children {
            let failed = c.try_wait().unwrap().filter(|s| !s.success());
            assert!(failed.is_none(), "a writer process failed: {failed:?}");
        }
        while let Ok(l) = heard.try_recv() {
            if let Some(shard) = l.split("done ").nth(1) {
                done.push(shard.trim().to_owned());
            }
        }
        if let Ok(b) = learner.sample(64) {
            whole(&b);
            let p = vec![1.0; b.len()];
            rb.update_priority(b.index(), b.generations(), &p).unwrap();
            sampled += 1;
        }
    }
    let shards: BTreeSet<String> = done.into_iter().collect();
    assert_eq!(
        shards.len(),
        3,
        "each writer process leased a shard of its own"
    );
    for mut c in children {
        drop(c.stdin.take());
        assert!(c.wait().unwrap().success());
    }
    // Every row written is there, whole, exactly once.
    let all = rb.read_all_in_order(None);
    let mut got: Vec<(u64, u64)> = whole(&all);
    got.sort_unstable();
    let want: Vec<(u64, u64)> = (1..=3)
        .flat_map(|w| (0..chunks * CHUNK as u64).map(move |i| (w, w * 1_000_000 + i)))
        .collect();
    assert_eq!(got, want);
    assert_eq!(rb.write_count(), 3 * chunks * CHUNK as u64);
    assert!(replaybuf::internals::priorities_consistent(&rb));
}

#[test]
fn a_killed_writer_loses_only_its_unpublished_rows_and_its_shard_is_taken_over() {
    let name = name("killed");
    let rb = builder(&name, 2).capacity(4000).build().unwrap();
    let mut child = spawn(&name, "forever", 7, 0);
    let mut out = lines(&mut child);
    let shard: usize = loop {
        let l = out.next().unwrap();
        if let Some(s) = l.split("shard ").nth(1) {
            break s.trim().parse().unwrap();
        }
    };
    // Let it lap its ring a few times, then kill it mid-stream.
    let mut wrote = 0;
    while wrote < 50 {
        if out.next().unwrap().contains("wrote") {
            wrote += 1;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Readers skip whatever it left half written: every row they get is whole.
    for _ in 0..200 {
        whole(&rb.sample(64).unwrap());
    }
    let before = whole(&rb.read_all_in_order(None));
    // This process's writers lease both shards: the dead one's is taken over and
    // repaired; writing on goes on through all its slots, laps included.
    let (a, b) = (rb.writer(), rb.writer());
    assert!(a.shard() == shard || b.shard() == shard);
    let mine = if a.shard() == shard { &a } else { &b };
    for c in 0..60 {
        mine.extend(&chunk(&rb, 1, 5_000_000 + c * CHUNK as u64, CHUNK))
            .unwrap();
    }
    // The shard now holds only the new rows: 2000 of them, all whole.
    let after = whole(&rb.read_all_in_order(None));
    let new: Vec<u64> = after.iter().filter(|r| r.0 == 1).map(|r| r.1).collect();
    assert_eq!(new.len(), 2000);
    assert_eq!(*new.iter().min().unwrap(), 5_000_000 + 4000);
    // Before the takeover, at most the chunk being written was lost: the dead
    // writer's rows are consecutive ids up to where it stopped.
    let mut dead: Vec<u64> = before.iter().filter(|r| r.0 == 7).map(|r| r.1).collect();
    dead.sort_unstable();
    let (lo, hi) = (dead[0], *dead.last().unwrap());
    let missing = (hi - lo + 1) as usize - dead.len();
    assert!(missing <= CHUNK, "{missing} rows of the dead writer lost");
    for _ in 0..100 {
        whole(&rb.sample(64).unwrap());
    }
}

#[test]
fn priorities_set_in_one_process_are_seen_in_another() {
    let name = name("prio");
    let rb = builder(&name, 1).build().unwrap();
    rb.extend(&chunk(&rb, 0, 0, 500)).unwrap();
    let mut c = spawn(&name, "updater", 0, 0);
    let said: Vec<String> = lines(&mut c).collect();
    assert!(c.wait().unwrap().success());
    assert!(said.iter().any(|l| l.contains("updated 500")), "{said:?}");
    for i in [0u64, 7, 499] {
        let p = rb.priority(i).unwrap();
        assert!((p - i as f64).abs() < 1e-6, "row {i}: {p}");
    }
    // Sampling follows them: row 0's mass is eps^alpha, next to nothing.
    let b = rb.sample(512).unwrap();
    assert!(b.index().iter().filter(|&&i| i == 0).count() < 3);
}

#[test]
fn names_are_refused_when_taken_and_attached_with_existsok() {
    let name = name("names");
    let rb = builder(&name, 2).build().unwrap();
    rb.extend(&chunk(&rb, 0, 0, 10)).unwrap();
    let e = builder(&name, 2).build().unwrap_err();
    assert!(e.to_string().contains("already holds a buffer"), "{e}");
    let again = builder(&name, 2).existsok(true).build().unwrap();
    assert_eq!(again.len(), 10);
    // Another layout is refused, naming what differs.
    let e = builder(&name, 4).existsok(true).build().unwrap_err();
    assert!(e.to_string().contains("shards 4 vs 2"), "{e}");
    // Attach reads the configuration from the region.
    let attached = ReplayBuffer::attach(&name).unwrap();
    assert_eq!((attached.capacity(), attached.shards()), (1 << 16, 2));
    assert_eq!(whole(&attached.read_all_in_order(None)).len(), 10);
    assert!(ReplayBuffer::attach("no-such-region-here")
        .unwrap_err()
        .is_missing());
    assert!(builder("a/b", 1).build().is_err());
}

#[test]
fn the_region_is_owner_only_listed_and_removed_with_its_creator() {
    use std::os::unix::fs::PermissionsExt;
    let name = name("perm");
    let path = path_of(&name);
    let rb = builder(&name, 1).build().unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let found = replaybuf::shared::list();
    let me = found.iter().find(|r| r.name == name).unwrap();
    assert_eq!(me.live, vec![std::process::id()]);
    assert!(!me.is_stale());
    drop(rb);
    assert!(
        !std::path::Path::new(&path).exists(),
        "the creator removes the name"
    );
}

/// A region whose alpha was damaged (NaN in the shared memory) is refused by an
/// attach with an error that says so: it was trusted, and writes through it hung.
#[test]
fn an_attach_refuses_a_damaged_alpha() {
    use std::io::{Read, Seek, SeekFrom};
    const ALPHA: f64 = 0.637;
    let name = name("alpha");
    let rb = ReplayBuffer::builder(spec())
        .capacity(64)
        .sampler(Prioritized::new(ALPHA, 0.4))
        .shared(&name)
        .build()
        .unwrap();
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path_of(&name))
        .unwrap();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    let word = bytes
        .chunks(8)
        .position(|w| w == ALPHA.to_bits().to_le_bytes())
        .expect("alpha's word");
    file.seek(SeekFrom::Start(word as u64 * 8)).unwrap();
    file.write_all(&f64::NAN.to_bits().to_le_bytes()).unwrap();
    let e = ReplayBuffer::attach(&name).map(drop).unwrap_err();
    assert!(e.to_string().contains("alpha is NaN"), "{e}");
    drop(rb);
}

#[test]
fn a_bad_region_is_refused_with_a_reason() {
    // A region whose creator is still laying it out (or died doing so): its header
    // never became ready. Its creator (this process, by its header) runs, so it is
    // not stale yet.
    let name = name("unready");
    let path = path_of(&name);
    let mut bytes = vec![0u8; 8192];
    bytes[48..56].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    // Owner-only, as a region must be (one open to others is refused unread).
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write_all(&bytes))
        .unwrap();
    let t = Instant::now();
    let e = ReplayBuffer::attach(&name).unwrap_err();
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "it waits for a slow creator"
    );
    assert!(e.to_string().contains("not finished"), "{e}");
    let listed = replaybuf::shared::list();
    let found = listed.iter().find(|r| r.name == name).unwrap();
    assert!(found.problem.is_some() && !found.is_stale(), "{found:?}");
    replaybuf::shared::remove(&name).unwrap();
    assert!(!std::path::Path::new(&path).exists());
    // Made but not yet sized (0 bytes), as an attach racing its creator finds it:
    // waited for, where it was refused at once as corrupt.
    let name = name_unsized();
    let path = path_of(&name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    let t = Instant::now();
    let e = ReplayBuffer::attach(&name).unwrap_err();
    assert!(t.elapsed() >= Duration::from_secs(1), "{e}");
    assert!(e.to_string().contains("not finished"), "{e}");
    std::fs::remove_file(&path).unwrap();
    // Another format version.
    let name = name_v();
    let rb = builder(&name, 1).build().unwrap();
    let path = path_of(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[8] = 99; // the version word
    std::fs::write(&path, &bytes).unwrap();
    let e = ReplayBuffer::attach(&name).unwrap_err();
    assert!(e.is_version(), "{e}");
    drop(rb);
}

fn name_v() -> String {
    name("version")
}

fn name_unsized() -> String {
    name("unsized")
}

#[test]
fn no_free_shard_is_an_error_not_a_hang() {
    let name = name("noshard");
    let rb = builder(&name, 1).build().unwrap();
    let w = rb.writer(); // this process holds the only shard
    let out = spawn(&name, "try-writer", 9, 0).wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "a second process has no shard to write"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&DataError::NoFreeShard { shards: 1 }.to_string()),
        "{said}"
    );
    // The lease is this process's until its buffer goes; then the other gets it.
    drop(w);
    drop(rb);
    let out = spawn(&name, "try-writer", 9, 0).wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(4),
        "the creator's drop removed the region"
    );
}

#[test]
fn a_writer_waits_out_a_lease_given_back_within_half_a_second() {
    // Another process may hold a shard's lease for a moment only (repairing a dead
    // writer's shard takes its lease and gives it back): a writer refused by every
    // shard waits half a second for one before it reports none.
    let name = name("patient");
    let rb = builder(&name, 2).build().unwrap();
    let _w = rb.writer(); // this process holds one shard
    let mut holder = spawn(&name, "hold", 8, 300);
    let mut held = lines(&mut holder);
    while !held.next().unwrap().contains("holding") {}
    let out = spawn(&name, "try-writer", 9, 0).wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("writer on shard"), "{said}");
    held.for_each(drop);
    assert!(holder.wait().unwrap().success());
}

/// A region whose header records a process table of another size is listed with its
/// problem: the table's walks read 64 entries whatever the header said (a panic).
#[test]
fn a_region_listing_survives_a_damaged_process_table_size() {
    let name = name("procs");
    let rb = builder(&name, 1).build().unwrap();
    let path = path_of(&name);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[64..72].copy_from_slice(&1u64.to_le_bytes()); // Procs, header word 8
    std::fs::write(&path, &bytes).unwrap();
    let listed = replaybuf::shared::list();
    let found = listed.iter().find(|r| r.name == name).expect("listed");
    assert!(found.problem.is_some(), "{found:?}");
    drop(rb);
}

#[test]
fn a_crashed_creators_region_is_found_stale_and_removed() {
    let name = name("crashed");
    let mut c = spawn(&name, "creator", 0, 0);
    let mut out = lines(&mut c);
    while !out.next().unwrap().contains("created") {}
    c.kill().unwrap();
    c.wait().unwrap();
    // What `replaybuf shm list` / `shm remove --stale` do (cli/tests/commands.rs).
    let listed = replaybuf::shared::list();
    let region = listed.iter().find(|r| r.name == name).expect("listed");
    assert!(region.is_stale(), "{region:?}");
    replaybuf::shared::remove(&name).unwrap();
    assert!(!std::path::Path::new(&path_of(&name)).exists());
}

#[test]
fn a_killed_learner_blocks_no_writer_and_no_checkpoint() {
    let name = name("learner");
    let rb = builder(&name, 2).capacity(4000).build().unwrap();
    let writer = rb.writer();
    writer.extend(&chunk(&rb, 1, 0, 1000)).unwrap();
    let mut child = spawn(&name, "learner", 0, 0);
    let mut out = lines(&mut child);
    while !out.next().unwrap().contains("learning") {}
    // Let it update for a while, writing meanwhile, then kill it mid-update.
    for c in 1..40 {
        writer.extend(&chunk(&rb, 1, c * 1000, 1000)).unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Writers go on, laps included, and so do samples and checkpoints.
    for c in 40..60 {
        writer.extend(&chunk(&rb, 1, c * 1000, 1000)).unwrap();
    }
    whole(&rb.sample(256).unwrap());
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    let loaded = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
    assert_eq!(
        whole(&loaded.read_all_in_order(None)),
        whole(&rb.read_all_in_order(None))
    );
    assert!(replaybuf::internals::priorities_consistent(&loaded));
}

#[test]
#[allow(clippy::disallowed_methods)] // the loom facade rule is for the library
fn a_shared_buffer_round_trips_through_a_checkpoint() {
    let name = name("ckpt");
    let mut rb = builder(&name, 2).build().unwrap();
    rb.extend(&chunk(&rb, 1, 0, 300)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    let heap = ReplayBuffer::from_checkpoint(dir.path()).unwrap();
    assert_eq!(whole(&heap.read_all_in_order(None)).len(), 300);
    assert_eq!(
        heap.sample(16).unwrap().index(),
        rb.sample(16).unwrap().index()
    );
    // Loaded back into the shared buffer, which no other process uses.
    rb.extend(&chunk(&rb, 2, 0, 100)).unwrap();
    rb.restore(dir.path()).unwrap();
    let back = whole(&rb.read_all_in_order(None));
    assert_eq!(back.len(), 300);
    assert!(back.iter().all(|r| r.0 == 1));
    // Its writers go on after the load.
    rb.writer().extend(&chunk(&rb, 3, 0, 10)).unwrap();
    assert_eq!(rb.len(), 310);
    // And it saves again: the freeze its save held, copied in with the checkpoint's
    // control words, was kept as this live process's, and the next freeze waited on
    // it for good.
    let again = tempfile::tempdir().unwrap();
    let saver = rb.clone();
    let (done, saved) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(saver.save(again.path()).map(drop)));
    let saved = saved.recv_timeout(std::time::Duration::from_secs(20));
    assert!(matches!(saved, Ok(Ok(()))), "{saved:?}");
}

/// A handle attached with settings that write a longer configuration (a seed, a
/// batch size, alpha and beta of more digits) sees the creator's rows and writes
/// where the creator reads: the region's blocks lie after the meta its creator
/// wrote, and an attacher laid them out after the meta it would write.
#[test]
fn an_attach_with_longer_settings_shares_the_rows() {
    let name = name("longer");
    let _cleanup = common::shm::Cleanup(common::shm::path_of(&name));
    let creator = builder(&name, 2).build().unwrap();
    creator.extend(&chunk(&creator, 0, 0, 40)).unwrap();
    for (round, digits) in [3, 9, 19u32].into_iter().enumerate() {
        let big = 10u64.pow(digits);
        let long = 0.1 + f64::from(digits) / 7.0;
        let other = ReplayBuffer::builder(spec())
            .capacity(1 << 16)
            .shards(2)
            .sampler(Prioritized::new(long.min(0.99), long / 3.0))
            .seed(big)
            .batch_size(big as usize)
            .shared(&name)
            .existsok(true)
            .build()
            .unwrap_or_else(|e| panic!("{digits} digits: {e}"));
        assert_eq!(other.len(), 40 + 10 * round, "{digits} digits");
        other
            .extend(&chunk(&other, 1, 1000 + u64::from(digits), 10))
            .unwrap();
        assert_eq!(creator.len(), other.len());
        drop(other);
    }
}

#[test]
fn a_region_too_new_to_name_its_creator_is_not_stale() {
    // Made but not sized yet, its header naming no creator: `shm remove --stale`
    // removed it under the process making it.
    let name = name("too-new");
    let path = path_of(&name);
    let _cleanup = common::shm::Cleanup(path.clone());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    let found = |name: &str| {
        replaybuf::shared::list()
            .into_iter()
            .find(|r| r.name == name)
            .expect("listed")
    };
    let region = found(&name);
    assert!(region.problem.is_some() && region.recent, "{region:?}");
    assert!(!region.is_stale(), "{region:?}");
    // Left so past `RECENT`: its creator died before it wrote the header.
    let long_ago = std::time::SystemTime::now() - replaybuf::shared::RECENT * 6;
    file.set_modified(long_ago).unwrap();
    let region = found(&name);
    assert!(!region.recent && region.is_stale(), "{region:?}");
}

#[test]
fn a_restore_keeps_which_process_holds_each_shard() {
    // A checkpoint's lease words (a heap buffer's: none) were copied over the
    // region's: this process's shard, its lease gone, went to another writer, and
    // both wrote it.
    let name = name("restore-lease");
    let _cleanup = common::shm::Cleanup(path_of(&name));
    let mut rb = common::shm::builder(&name).shards(1).build().unwrap();
    rb.extend(&rb.batch([8])).unwrap(); // takes shard 0's lease
    let heap = ReplayBuffer::builder(common::shm::spec())
        .capacity(1024)
        .shards(1)
        .seed(5)
        .build()
        .unwrap();
    heap.extend(&heap.batch([4])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    heap.save(dir.path()).unwrap();
    rb.restore(dir.path()).unwrap();
    assert_eq!(rb.len(), 4);
    let other = ReplayBuffer::attach(&name).unwrap();
    assert!(
        other.try_writer().is_err(),
        "another writer took this process's shard"
    );
    rb.extend(&rb.batch([2])).unwrap();
    assert_eq!(rb.len(), 6);
}

#[test]
fn a_process_killed_while_a_child_it_forked_lives_is_seen_dead() {
    // The child shared the description that carries the process's liveness lock, and
    // kept it held: the killed writer stayed "alive" in the table, and a save waited
    // on its rows for as long as the child ran.
    let name = name("forker");
    let _cleanup = common::shm::Cleanup(path_of(&name));
    let rb = builder(&name, 2).build().unwrap();
    let mut parent = spawn(&name, "forker", 1, 0);
    let said = lines(&mut parent)
        .find(|l| l.contains("forked "))
        .expect("the forker says its child's pid");
    let child: i32 = said
        .split("forked ")
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let live = || {
        replaybuf::shared::list()
            .into_iter()
            .find(|r| r.name == name)
            .expect("listed")
            .live
    };
    assert!(live().contains(&parent.id()));
    parent.kill().unwrap();
    parent.wait().unwrap();
    let gone = Instant::now();
    while live().contains(&parent.id()) {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "the killed writer still counts as alive, its forked child running"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    // SAFETY: the forker's child, still sleeping.
    unsafe { libc::kill(child, libc::SIGKILL) };
}

#[test]
fn a_full_process_table_is_said_so_not_called_damage() {
    // The 65th member's attach was refused as a damaged configuration.
    let name = name("full-table");
    let _cleanup = common::shm::Cleanup(path_of(&name));
    let rb = common::shm::builder(&name).build().unwrap();
    let members: Vec<ReplayBuffer> = (0..63)
        .map(|_| ReplayBuffer::attach(&name).unwrap())
        .collect();
    let e = ReplayBuffer::attach(&name).unwrap_err();
    assert!(!e.is_corrupt(), "{e}");
    assert!(e.to_string().contains("process table is held"), "{e}");
    drop(members);
    ReplayBuffer::attach(&name).unwrap();
    drop(rb);
}

#[test]
fn a_collector_that_comes_after_another_left_takes_an_empty_shard() {
    // Leases were taken in turn from a start of the process's pid: each attachment of
    // this process started at the shard the one before it filled, and pushed its rows
    // out while three shards stood empty.
    let name = name("emptiest");
    let rb = builder(&name, 4).build().unwrap();
    let per_shard = rb.capacity() / 4;
    let rows = per_shard * 3 / 4;
    for w in 1..=3u64 {
        let collector = ReplayBuffer::attach(&name).unwrap();
        collector.extend(&chunk(&collector, w, 0, rows)).unwrap();
    }
    assert_eq!(rb.len(), 3 * rows, "every collector's rows are kept");
    let mut kept: Vec<u64> = whole(&rb.read_all_in_order(None))
        .into_iter()
        .map(|(w, _)| w)
        .collect();
    kept.dedup();
    assert_eq!(kept.len(), 3, "one shard each: {kept:?}");
}

#[test]
fn a_restore_is_refused_while_another_buffer_of_this_process_is_attached() {
    // Only other processes were looked for: a second attachment in this process had
    // the checkpoint's rows copied in under its learners and writers.
    let name = name("restore-twin");
    let _cleanup = common::shm::Cleanup(path_of(&name));
    let mut rb = common::shm::builder(&name).build().unwrap();
    rb.extend(&rb.batch([8])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    rb.extend(&rb.batch([4])).unwrap();
    let twin = ReplayBuffer::attach(&name).unwrap();
    let e = rb.restore(dir.path()).unwrap_err();
    assert!(e.to_string().contains("attached"), "{e}");
    assert_eq!((rb.len(), twin.len()), (12, 12), "nothing loaded");
    twin.writer().extend(&twin.batch([1])).unwrap();
    drop(twin);
    rb.restore(dir.path()).unwrap();
    assert_eq!(rb.len(), 8);
}

#[test]
fn an_attach_during_a_live_restore_is_told_to_wait_not_to_remove() {
    // It read the restoring mark as a restore that died ("damaged ... remove it"),
    // while this process was in the middle of one.
    let name = name("restoring");
    let _cleanup = common::shm::Cleanup(path_of(&name));
    let mut rb = common::shm::builder(&name).build().unwrap();
    rb.extend(&rb.batch([8])).unwrap();
    let dir = tempfile::tempdir().unwrap();
    rb.save(dir.path()).unwrap();
    rb.register_load_hook(|_| {
        std::thread::sleep(Duration::from_millis(400));
        Ok(())
    });
    std::thread::scope(|s| {
        let attacher = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            ReplayBuffer::attach(&name).unwrap_err()
        });
        rb.restore(dir.path()).unwrap();
        let e = attacher.join().unwrap();
        assert!(
            !e.is_corrupt() && e.to_string().contains("restoring"),
            "{e}"
        );
    });
    assert_eq!(rb.len(), 8);
    ReplayBuffer::attach(&name).unwrap();
}
