//! `replaybuf bench --workload persist`: dumps and loads of a full mujoco buffer,
//! beside `dd`'s sequential write and read of as many bytes on the same disk, in the
//! same run.
//!
//! - write: `dd if=/dev/zero of=F bs=8M count=N conv=fdatasync` against `dumps` (which
//!   flushes every file it writes);
//! - read: `dd if=F of=/dev/null bs=8M` against `ReplayBuffer::from_checkpoint`, both with a cold
//!   page cache when this process may drop it (`/proc/sys/vm/drop_caches`, root), warm
//!   otherwise; the JSON lines say which.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::json;

use crate::workloads::Workload;
use replaybuf::checkpoint::SaveOptions;
use replaybuf::ReplayBuffer;

const DD_BLOCK: u64 = 8 << 20;
const ROUNDS: usize = 3;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Drops the kernel's page cache, if this process may; whether it did.
fn drop_caches() -> bool {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Seconds `dd` took with `args`.
fn dd(args: &[String]) -> Result<f64, String> {
    let t = Instant::now();
    let out = Command::new("dd")
        .args(args)
        .output()
        .map_err(|e| format!("dd does not run (coreutils): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dd {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(t.elapsed().as_secs_f64())
}

fn line(op: &str, secs: f64, bytes: u64, rows: usize, cache: &str) {
    println!(
        "{}",
        json!({
            "system": if op.starts_with("dd") { "dd" } else { "replaybuf" },
            "workload": "persist",
            "op": op,
            "us_per_op": (secs * 1e8).round() / 100.0,
            "items_per_s": (rows as f64 / secs).round() as u64,
            "mb_per_s": (bytes as f64 / secs / 1e6).round(),
            "bytes": bytes,
            "cache": cache,
        })
    );
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Runs the persistence measurements under `scratch` (a fresh directory in it, which
/// must exist), and removes what it wrote; a failure (a full disk, say) is reported,
/// with exit status 1.
pub fn run(quick: bool, scratch: Option<&Path>) {
    let base: PathBuf = scratch.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let work = base.join(format!("replaybuf-persist-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&work) {
        eprintln!(
            "replaybuf bench: no scratch directory at {}: {e}",
            work.display()
        );
        std::process::exit(2);
    }
    let measured = measure(quick, &work);
    let _ = std::fs::remove_dir_all(&work);
    if let Err(e) = measured {
        eprintln!("replaybuf bench: persist: {e}");
        std::process::exit(1);
    }
}

/// The persistence measurements, in `work`.
fn measure(quick: bool, work: &Path) -> Result<(), String> {
    let w = Workload::mujoco(quick);
    let rb = w.builder(7).build().expect("workload buffer");
    let chunk = w.chunk_data(&rb, w.chunk, 1);
    let writer = rb.writer();
    for _ in 0..w.capacity / w.chunk {
        writer.extend(&chunk).expect("extend");
    }
    let ck = work.join("checkpoint");
    let options = SaveOptions::new();
    rb.save_with(&ck, &options)
        .map_err(|e| format!("dumps: {e}"))?;
    let bytes = dir_bytes(&ck);
    let blocks = bytes.div_ceil(DD_BLOCK);
    let dd_file = work.join("dd.bin");
    // Each measurement three times, alternating with its dd twin; medians reported.
    let (mut dd_w, mut dumps, mut dd_r, mut load) = (vec![], vec![], vec![], vec![]);
    let mut cache = "cold";
    for _ in 0..ROUNDS {
        let _ = std::fs::remove_file(&dd_file);
        drop_caches();
        dd_w.push(dd(&[
            "if=/dev/zero".into(),
            format!("of={}", dd_file.display()),
            "bs=8M".into(),
            format!("count={blocks}"),
            "conv=fdatasync".into(),
        ])?);
        std::fs::remove_dir_all(&ck).map_err(|e| format!("removing the last checkpoint: {e}"))?;
        drop_caches();
        let t = Instant::now();
        rb.save_with(&ck, &options)
            .map_err(|e| format!("dumps: {e}"))?;
        dumps.push(t.elapsed().as_secs_f64());
        if !drop_caches() {
            cache = "warm";
        }
        dd_r.push(dd(&[
            format!("if={}", dd_file.display()),
            "of=/dev/null".into(),
            "bs=8M".into(),
        ])?);
        drop_caches();
        let t = Instant::now();
        let loaded = ReplayBuffer::from_checkpoint(&ck).map_err(|e| format!("load: {e}"))?;
        load.push(t.elapsed().as_secs_f64());
        assert_eq!(loaded.len(), rb.len());
    }
    line("dd write", median(dd_w), blocks * DD_BLOCK, w.capacity, "-");
    line("dumps", median(dumps), bytes, w.capacity, "-");
    line(
        "dd read",
        median(dd_r),
        blocks * DD_BLOCK,
        w.capacity,
        cache,
    );
    line("load", median(load), bytes, w.capacity, cache);
    Ok(())
}
