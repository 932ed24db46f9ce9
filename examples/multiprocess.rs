//! Collector processes feeding one buffer in shared memory while the parent samples
//! it and writes priorities back.
//!
//! The parent creates a prioritized buffer in a named shared-memory region, then
//! starts `COLLECTORS` copies of this program as collector processes. Each attaches
//! to the region by name, takes the writer lease of a shard of its own, and steps a
//! simple simulator (a noisy pendulum), extending its shard 1,000 transitions at a
//! time. The parent samples batches of 256 meanwhile, checks every row is whole (each
//! row carries a checksum of its own fields), and sets the sampled rows' priorities.
//!
//! Halfway through, the parent kills one collector with SIGKILL, wherever it is, and
//! starts a replacement: the replacement takes the dead collector's shard over,
//! repairs it, and writes on. The run prints, per second, the rows written and
//! sampled, and at the end the totals and the count of torn rows (always 0).
//!
//! ```sh
//! cargo run --release --example multiprocess
//! cargo run --release --example multiprocess -- 3 10   # collectors, seconds
//! ```

// The loom facade rule (atomics only in src/sync.rs) is for the library.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use replaybuf::sampler::Prioritized;
use replaybuf::{DType, ReplayBuffer, Spec};

const CHUNK: usize = 1_000;
const BATCH: usize = 256;

/// One transition: observation, action, reward, next observation, done, and a
/// checksum of all of them (a reader that got a torn row would see it disagree).
fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [3])
        .field("action", DType::F32, [1])
        .field("reward", DType::F32, [1])
        .field(("next", "obs"), DType::F32, [3])
        .field("done", DType::Bool, [1])
        .field("collector", DType::U32, [1])
        .field("check", DType::F64, [1])
        .build()
        .expect("a valid spec")
}

fn checksum(obs: &[f32], action: f32, reward: f32, next: &[f32], collector: u32) -> f64 {
    obs.iter().chain(next).map(|&x| f64::from(x)).sum::<f64>() * 3.0
        + f64::from(action) * 5.0
        + f64::from(reward) * 7.0
        + f64::from(collector)
}

/// A collector process: attaches, leases a shard, steps its pendulum forever.
fn collector(name: &str, id: u32) {
    let rb = ReplayBuffer::attach(name).expect("the parent's region");
    let writer = rb.try_writer().expect("a shard of its own");
    eprintln!(
        "collector {id} (pid {}) writes shard {}",
        std::process::id(),
        writer.shard()
    );
    let mut chunk = rb.batch([CHUNK]);
    let (mut theta, mut omega, mut t) = (0.5f32, 0.0f32, 0u64);
    let mut noise = u64::from(id).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    loop {
        let (mut obs, mut action, mut reward, mut next, mut done, mut check) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..CHUNK {
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            let a = ((noise >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
            let o = [theta.cos(), theta.sin(), omega];
            omega = (omega + (-10.0 * theta.sin() + a) * 0.05).clamp(-8.0, 8.0);
            theta += omega * 0.05;
            let n = [theta.cos(), theta.sin(), omega];
            let r = -(theta * theta + 0.1 * omega * omega + 0.001 * a * a);
            t += 1;
            let d = t % 200 == 0;
            if d {
                theta = 0.5;
                omega = 0.0;
            }
            check.push(checksum(&o, a, r, &n, id));
            obs.extend(o);
            next.extend(n);
            action.push(a);
            reward.push(r);
            done.push(d);
        }
        chunk.set("obs", &obs).expect("obs");
        chunk.set("action", &action).expect("action");
        chunk.set("reward", &reward).expect("reward");
        chunk.set(("next", "obs"), &next).expect("next obs");
        chunk.set("done", &done).expect("done");
        chunk.set("collector", &vec![id; CHUNK]).expect("collector");
        chunk.set("check", &check).expect("check");
        writer.extend(&chunk).expect("extend");
    }
}

fn spawn(name: &str, id: u32) -> Child {
    Command::new(std::env::current_exe().expect("this program"))
        .args(["--collector", name, &id.to_string()])
        .spawn()
        .expect("a collector process")
}

/// Rows of `batch` whose checksum disagrees with their fields.
fn torn(batch: &replaybuf::Batch) -> usize {
    let obs = batch.column::<f32>("obs").expect("obs");
    let next = batch.column::<f32>(("next", "obs")).expect("next obs");
    let action = batch.column::<f32>("action").expect("action");
    let reward = batch.column::<f32>("reward").expect("reward");
    let collector = batch.column::<u32>("collector").expect("collector");
    let check = batch.column::<f64>("check").expect("check");
    (0..batch.len())
        .filter(|&r| {
            let want = checksum(
                &obs[3 * r..3 * r + 3],
                action[r],
                reward[r],
                &next[3 * r..3 * r + 3],
                collector[r],
            );
            want != check[r]
        })
        .count()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--collector") {
        collector(&args[2], args[3].parse().expect("a collector id"));
        return;
    }
    let collectors: u32 = args.get(1).map_or(2, |a| a.parse().expect("a count"));
    let seconds: u64 = args.get(2).map_or(6, |a| a.parse().expect("seconds"));
    let name = format!("example-multiprocess-{}", std::process::id());
    let rb = ReplayBuffer::builder(spec())
        .capacity(1 << 20)
        .shards((collectors as usize + 1).next_power_of_two())
        .sampler(Prioritized::new(0.6, 0.4))
        .seed(1)
        .shared(&name)
        .build()
        .expect("a shared buffer");
    println!(
        "region {name}: {} rows in {} shards; {collectors} collector processes",
        rb.capacity(),
        rb.shards()
    );
    let mut children: Vec<Child> = (0..collectors).map(|id| spawn(&name, id)).collect();
    let mut learner = rb.learner();
    let mut batch = rb.batch([BATCH]);
    let (mut sampled, mut torn_rows, mut killed) = (0u64, 0usize, false);
    let started = Instant::now();
    let mut tick = started;
    let mut last = (0u64, 0u64);
    while started.elapsed() < Duration::from_secs(seconds) {
        if !killed && started.elapsed() >= Duration::from_secs(seconds / 2) {
            let victim = children.remove(0);
            let pid = victim.id();
            let mut victim = victim;
            victim.kill().expect("kill");
            victim.wait().expect("reap");
            println!("killed collector 0 (pid {pid}) mid-stream; starting a replacement");
            children.push(spawn(&name, collectors));
            killed = true;
        }
        if learner.sample_into(&mut batch).is_ok() {
            torn_rows += torn(&batch);
            let rewards = batch.column::<f32>("reward").expect("reward");
            let priorities: Vec<f64> = rewards.iter().map(|r| f64::from(r.abs()) + 0.01).collect();
            rb.update_priority(batch.index(), batch.generations(), &priorities)
                .expect("update");
            sampled += BATCH as u64;
        }
        if tick.elapsed() >= Duration::from_secs(1) {
            let written = rb.write_count();
            println!(
                "{:>4.1} s  written {:>6.2} M rows/s  sampled {:>6.2} M rows/s  stored {}",
                started.elapsed().as_secs_f64(),
                (written - last.0) as f64 / tick.elapsed().as_secs_f64() / 1e6,
                (sampled - last.1) as f64 / tick.elapsed().as_secs_f64() / 1e6,
                rb.len()
            );
            last = (written, sampled);
            tick = Instant::now();
        }
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "total: {} rows written ({:.2} M/s), {} sampled ({:.2} M/s), torn rows: {torn_rows}",
        rb.write_count(),
        rb.write_count() as f64 / secs / 1e6,
        sampled,
        sampled as f64 / secs / 1e6
    );
    assert_eq!(torn_rows, 0, "a torn row was sampled");
}
