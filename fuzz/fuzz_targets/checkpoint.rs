//! The checkpoint reader against damaged checkpoints: a small buffer of one of several
//! configurations is dumped, its files are cut, overwritten or replaced by fuzz bytes
//! (meta.json included), and, when the input says so, the damaged files' checksums in
//! meta.json are recomputed so that the damage reaches the parsers behind them. Then
//! `load`, `inspect` and `open_dataset` must return an error or a buffer that samples,
//! reads, updates and extends without panicking: never a panic, never an
//! out-of-bounds access.
#![no_main]

use std::path::{Path, PathBuf};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use replaybuf::checkpoint::SaveOptions;
use replaybuf::sampler::{Prioritized, Slice, SlicePriority, WithoutReplacement};
use replaybuf::{DType, ReplayBuffer, ReplayBufferBuilder, Spec};

#[derive(Arbitrary, Debug)]
enum Damage {
    /// Cut file `file` to `len` bytes.
    Truncate { file: u8, len: u16 },
    /// Overwrite bytes of file `file` from `at`.
    Overwrite { file: u8, at: u32, bytes: Vec<u8> },
    /// Replace meta.json with these bytes.
    Meta(Vec<u8>),
    /// Change one JSON value of meta.json: `path` picks it, `value` replaces it.
    MetaValue { path: Vec<u8>, value: i64 },
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: u8,
    rows: u16,
    samples: u8,
    compact: bool,
    damage: Vec<Damage>,
    /// Recompute the checksums of damaged files, so the damage reaches the parsers.
    fix_checksums: bool,
}

fn spec() -> Spec {
    Spec::builder()
        .field("traj", DType::I64, [])
        .field("obs", DType::F32, [2])
        .field(("next", "obs"), DType::F32, [2])
        .field("done", DType::Bool, [])
        .build()
        .unwrap()
}

fn builder(config: u8) -> ReplayBufferBuilder {
    let b = ReplayBuffer::builder(spec()).capacity(24).seed(1);
    let slice = Slice::slice_len(3).traj_key("traj");
    match config % 7 {
        0 => b,
        1 => b.shards(2).sampler(WithoutReplacement::new()),
        2 => b.shards(2).sampler(Prioritized::new(0.6, 0.4)),
        3 => b.sampler(slice),
        4 => b.sampler(slice.without_replacement(WithoutReplacement::new())),
        5 => b.sampler(slice.prioritized(Prioritized::new(0.5, 0.5), SlicePriority::Window)),
        _ => b.capacity(6 * 4).ndim(2).envs(4).dim_extend(0).shards(2),
    }
}

fn rows(rb: &ReplayBuffer, n: usize) -> replaybuf::Batch {
    let shape: Vec<usize> = if rb.ndim() == 2 {
        vec![n, rb.envs()]
    } else {
        vec![n]
    };
    let mut b = rb.batch(&shape);
    let len = b.len();
    let traj: Vec<i64> = (0..len as i64).map(|i| i / 5).collect();
    let obs: Vec<f32> = (0..2 * len).map(|i| i as f32).collect();
    b.set("traj", &traj).unwrap();
    b.set("obs", &obs).unwrap();
    b.set(("next", "obs"), &obs).unwrap();
    b
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "bin"))
        .collect();
    v.sort();
    v
}

/// Rewrites meta.json's checksums and lengths to match the files as they are now.
fn fix_checksums(dir: &Path) {
    let meta = dir.join("meta.json");
    let Ok(text) = std::fs::read(&meta) else {
        return;
    };
    let Ok(mut json) = serde_json::from_slice::<serde_json::Value>(&text) else {
        return;
    };
    if let Some(files) = json
        .pointer_mut("/checkpoint/files")
        .and_then(|f| f.as_array_mut())
    {
        for f in files {
            let Some(name) = f.get("name").and_then(|n| n.as_str()) else {
                continue;
            };
            let Ok(bytes) = std::fs::read(dir.join(name)) else {
                continue;
            };
            f["bytes"] = (bytes.len() as u64).into();
            f["xxh3"] = xxhash_rust::xxh3::xxh3_64(&bytes).into();
        }
    }
    std::fs::write(&meta, serde_json::to_vec(&json).unwrap()).unwrap();
}

/// Changes the `path`-th scalar value of the JSON tree to `value`.
fn set_scalar(json: &mut serde_json::Value, pick: &mut usize, value: i64) -> bool {
    match json {
        serde_json::Value::Object(m) => m.values_mut().any(|v| set_scalar(v, pick, value)),
        serde_json::Value::Array(a) => a.iter_mut().any(|v| set_scalar(v, pick, value)),
        v => {
            if *pick == 0 {
                *v = value.into();
                return true;
            }
            *pick -= 1;
            false
        }
    }
}

/// Uses a loaded buffer every way there is.
fn exercise(rb: &ReplayBuffer, samples: u8) {
    for _ in 0..samples % 8 {
        if let Ok(b) = rb.sample(6) {
            let p = vec![1.0; b.len()];
            let _ = rb.update_priority(b.index(), b.generations(), &p);
        }
    }
    let _ = rb.read_all_in_order(None);
    for i in 0..rb.capacity() as u64 {
        let _ = rb.get(i);
        let _ = rb.priority(i);
    }
    let n = if rb.ndim() == 2 { 2 } else { 7 };
    let _ = rb.extend(&rows(rb, n));
    let _ = rb.sample(6);
}

fuzz_target!(|input: Input| {
    let dir =
        std::env::temp_dir().join(format!("replaybuf-fuzz-checkpoint-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let rb = builder(input.config).build().unwrap();
    let n = usize::from(input.rows % 40) + 1;
    let _ = rb.extend(&rows(&rb, n));
    let _ = rb.sample(6);
    let options = if input.compact {
        SaveOptions::new().compact("obs", ("next", "obs"))
    } else {
        SaveOptions::new()
    };
    rb.save_with(&dir, &options).unwrap();
    for d in input.damage.iter().take(4) {
        let fs = files(&dir);
        match d {
            Damage::Truncate { file, len } => {
                let f = &fs[usize::from(*file) % fs.len()];
                let file = std::fs::OpenOptions::new().write(true).open(f).unwrap();
                let len = u64::from(*len) % (file.metadata().unwrap().len() + 1);
                file.set_len(len).unwrap();
            }
            Damage::Overwrite { file, at, bytes } => {
                let f = &fs[usize::from(*file) % fs.len()];
                let mut all = std::fs::read(f).unwrap();
                if all.is_empty() {
                    continue;
                }
                let at = *at as usize % all.len();
                for (k, b) in bytes.iter().take(64).enumerate() {
                    if let Some(x) = all.get_mut(at + k) {
                        *x = *b;
                    }
                }
                std::fs::write(f, all).unwrap();
            }
            Damage::Meta(bytes) => std::fs::write(dir.join("meta.json"), bytes).unwrap(),
            Damage::MetaValue { path, value } => {
                let meta = dir.join("meta.json");
                if let Ok(mut json) =
                    serde_json::from_slice::<serde_json::Value>(&std::fs::read(&meta).unwrap())
                {
                    let mut pick = path.iter().map(|&b| usize::from(b)).sum::<usize>() % 64;
                    set_scalar(&mut json, &mut pick, *value);
                    std::fs::write(&meta, serde_json::to_vec(&json).unwrap()).unwrap();
                }
            }
        }
    }
    if input.fix_checksums {
        fix_checksums(&dir);
    }
    if let Ok(found) = replaybuf::checkpoint::inspect(&dir) {
        let _ = found.to_string();
    }
    if let Ok(loaded) = ReplayBuffer::from_checkpoint(&dir) {
        exercise(&loaded, input.samples);
    }
    let mut same = builder(input.config).build().unwrap();
    if same.restore(&dir).is_ok() {
        exercise(&same, input.samples);
    }
    let _ = std::fs::remove_dir_all(&dir);
});
