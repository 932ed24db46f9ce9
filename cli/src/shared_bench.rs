//! `replaybuf bench --workload concurrent-shared`: the `concurrent` workload with its
//! collectors as processes over a shared-memory buffer, beside the same configuration
//! with collector threads in one process, in the same run.
//!
//! Each collector process is this program again (`replaybuf bench-collector`): it
//! attaches to the region, takes a shard's lease, fills the shard, says `ready`, waits
//! for a line on its standard input, extends for the run's duration, and prints how
//! many chunks it wrote. Learners are threads of the parent, as in `concurrent`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::bench::{concurrent_run, configs, learner_loop, report, BenchArgs, Run};
use crate::workloads::Workload;
use replaybuf::ReplayBuffer;

/// Runs every configuration three times: collector threads on the heap
/// (`concurrent`), collector threads over shared memory (`concurrent-shared-threads`),
/// and collector processes over shared memory (`concurrent-shared`).
pub fn run(args: &BenchArgs, w: Workload) {
    for (writers, learners) in configs(args) {
        let secs = args.seconds;
        report(
            "concurrent",
            w,
            writers,
            learners,
            concurrent_run(w, writers, learners, secs, None),
        );
        let name = format!("bench-{}-threads", std::process::id());
        let run = concurrent_run(w, writers, learners, secs, Some(&name));
        report("concurrent-shared-threads", w, writers, learners, run);
        let run = processes_run(w, writers, learners, secs, args.quick);
        report("concurrent-shared", w, writers, learners, run);
    }
}

/// The collector process: `replaybuf bench-collector NAME SECONDS [--quick]`. It
/// writes only into a region its parent bench made (named `bench-{parent pid}-...`):
/// run by hand on a user's region, it wrote random rows into it.
pub fn collector(name: &str, seconds: f64, quick: bool) {
    let refuse = |why: String| -> ! {
        eprintln!("replaybuf bench-collector: {why}");
        std::process::exit(2)
    };
    let parents = format!("bench-{}-", std::os::unix::process::parent_id());
    if !name.starts_with(&parents) {
        refuse(format!(
            "`{name}` is not a region of the bench that started this process ({parents}...)"
        ));
    }
    let w = Workload::mujoco(quick);
    let rb = ReplayBuffer::attach(name).unwrap_or_else(|e| refuse(e.to_string()));
    let writer = rb.try_writer().unwrap_or_else(|e| refuse(e.to_string()));
    let chunk = w.chunk_data(&rb, w.chunk, 2);
    let ring = rb.capacity() / rb.shards();
    for _ in 0..ring.div_ceil(w.chunk) {
        writer.extend(&chunk).expect("extend");
    }
    println!("ready");
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .expect("the parent's go");
    let t = Instant::now();
    let mut n = 0usize;
    while t.elapsed().as_secs_f64() < seconds {
        writer.extend(&chunk).expect("extend");
        n += 1;
    }
    println!("chunks {n} {}", t.elapsed().as_secs_f64());
}

fn processes_run(w: Workload, writers: usize, learners: usize, secs: f64, quick: bool) -> Run {
    let name = format!("bench-{}-{writers}x{learners}", std::process::id());
    let shards = writers.max(1).next_power_of_two();
    let rb = w
        .builder(11)
        .shards(shards)
        .shared(&name)
        .build()
        .expect("shared bench buffer");
    let exe = std::env::current_exe().expect("this program");
    let mut children: Vec<Child> = (0..writers)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.args(["bench-collector", &name, &secs.to_string()]);
            if quick {
                cmd.arg("--quick");
            }
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("a collector process")
        })
        .collect();
    let mut outs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("piped")).lines())
        .collect();
    for out in &mut outs {
        let line = out.next().expect("ready").expect("a line");
        assert_eq!(line.trim(), "ready");
    }
    if writers == 0 {
        let chunk = w.chunk_data(&rb, w.chunk, 2);
        while rb.len() < rb.capacity() {
            rb.extend(&chunk).expect("extend");
        }
    }
    let stop = AtomicBool::new(false);
    let mut latencies_ns = Vec::new();
    let mut rows_sampled = 0;
    let started = Instant::now();
    std::thread::scope(|s| {
        for c in &mut children {
            writeln!(c.stdin.as_mut().expect("piped"), "go").expect("go");
        }
        let samplers: Vec<_> = (0..learners)
            .map(|l| {
                let (rb, stop) = (&rb, &stop);
                s.spawn(move || learner_loop(rb, w, l, stop))
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        for l in samplers {
            let lat = l.join().expect("learner thread");
            rows_sampled += lat.len() * w.batch;
            latencies_ns.extend(lat);
        }
    });
    let mut extends = 0;
    let mut writer_secs = 0.0f64;
    for (mut c, mut out) in children.into_iter().zip(outs) {
        let line = out.next().expect("a count").expect("a line");
        let mut parts = line.split_whitespace().skip(1);
        extends += parts
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .expect("chunks");
        let s: f64 = parts.next().and_then(|n| n.parse().ok()).expect("seconds");
        writer_secs = writer_secs.max(s);
        c.wait().expect("collector exit");
    }
    let secs = started.elapsed().as_secs_f64().max(writer_secs);
    Run {
        rows_written: extends * w.chunk,
        extends,
        rows_sampled,
        latencies_ns,
        secs,
    }
}
