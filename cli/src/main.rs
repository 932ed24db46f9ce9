//! The `replaybuf` command: a collector/learner demonstration (default), the
//! WORKLOADS.md benchmark (`bench`), and a look into a checkpoint (`inspect`).
// The loom facade rule (atomics only in src/sync.rs) is for the library; this binary
// uses std's threads and counters directly.
#![allow(clippy::disallowed_types, clippy::disallowed_methods, missing_docs)]

mod bench;
mod demo;
mod persist;
mod shared_bench;
mod sim;
mod workloads;

use clap::{Parser, Subcommand};

use bench::BenchArgs;
use workloads::Workload;

#[derive(Parser, Debug)]
#[command(
    name = "replaybuf",
    version,
    about = "A lock-free replay buffer: demonstration and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Collector threads of the demonstration (at most 256).
    #[arg(long, default_value_t = 2, value_parser = threads)]
    collectors: usize,
    /// Learner threads of the demonstration (at most 256).
    #[arg(long, default_value_t = 2, value_parser = threads)]
    learners: usize,
    /// How long the demonstration runs.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    seconds: f64,
    /// Rows the demonstration's buffer holds.
    #[arg(long, default_value_t = 1_000_000)]
    capacity: usize,
    /// Rows per sampled batch (1 to 1,048,576).
    #[arg(long, default_value_t = 256, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1 << 20))]
    batch: usize,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the shared/WORKLOADS.md measurements as JSON lines.
    Bench {
        /// The smaller sizes of WORKLOADS.md, and concurrent configurations of at most
        /// 1 s each (whatever --seconds says).
        #[arg(long)]
        quick: bool,
        /// Only this workload.
        #[arg(long, value_parser = ["mujoco", "mujoco-prioritized", "mujoco-slice", "mujoco-prefetch", "atari", "atari-1m", "concurrent", "concurrent-prioritized", "concurrent-shared", "persist"])]
        workload: Option<String>,
        /// Where the persist workload writes its files (default: the temporary
        /// directory). It runs only when named: `--workload persist`.
        #[arg(long)]
        scratch: Option<std::path::PathBuf>,
        /// Seconds each concurrent configuration runs, in all (more than 0).
        #[arg(long, default_value_t = 3.0, value_parser = parse_bench_seconds)]
        seconds: f64,
        /// Rounds a concurrent workload's configurations take turns in, each run for
        /// its seconds over the rounds (1: each configuration in one piece; at most
        /// 1,000).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=1000))]
        rounds: u64,
        /// Concurrent configurations as WRITERSxLEARNERS (e.g. 1x1,8x8).
        #[arg(long, value_delimiter = ',', value_parser = parse_config)]
        configs: Vec<(usize, usize)>,
        /// Rows a second each collector of the concurrent and concurrent-prioritized
        /// workloads extends at most, as a collector stepping simulators at that rate
        /// would (default: as fast as it can). Its lines are tagged `pace_rows_per_s`.
        #[arg(long, value_parser = parse_pace)]
        pace: Option<f64>,
    },
    /// A collector process of `bench --workload concurrent-shared` (internal).
    #[command(hide = true)]
    BenchCollector {
        name: String,
        seconds: f64,
        #[arg(long)]
        quick: bool,
    },
    /// List or remove shared-memory regions (`shared` buffers), such as those a
    /// crashed creator left behind.
    Shm {
        #[command(subcommand)]
        action: ShmAction,
    },
    /// Describe a checkpoint or file-backed storage directory: spec, sizes, fill,
    /// priorities, and whether every file's checksum holds (exit status 1 if not, or
    /// if its meta.json is damaged; 2 if there is none, or it cannot be read).
    Inspect {
        /// The directory.
        dir: std::path::PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum ShmAction {
    /// Every region: size, creator, live and dead processes, and whether it is stale
    /// (no live process uses it) or foreign (not this user's alone: not opened, never
    /// stale).
    List,
    /// Remove regions by name, or every stale one. A named region that is not stale
    /// (a live process uses it, its creator is still making it, or it is foreign) is
    /// refused unless `--force` is given.
    Remove {
        /// The regions' names.
        #[arg(required_unless_present = "stale")]
        names: Vec<String>,
        /// Every region no live process uses.
        #[arg(long)]
        stale: bool,
        /// Remove the named regions even if they are in use: processes that have one
        /// mapped keep using it, but nothing can attach to it by name any more.
        #[arg(long)]
        force: bool,
    },
}

fn shm(action: ShmAction) {
    match action {
        ShmAction::List => {
            let regions = replaybuf::shared::list();
            if regions.is_empty() {
                println!("no replaybuf shared regions");
            }
            for r in regions {
                println!(
                    "{:<32} {:>12} bytes  creator {:<8} live {:?}  dead {}{}{}{}",
                    r.name,
                    r.bytes,
                    r.creator.map_or("?".to_owned(), |p| p.to_string()),
                    r.live,
                    r.dead,
                    if r.is_stale() { "  STALE" } else { "" },
                    if r.foreign { "  FOREIGN" } else { "" },
                    r.problem.map_or(String::new(), |p| format!("  ({p})")),
                );
            }
        }
        ShmAction::Remove {
            names,
            stale,
            force,
        } => {
            let regions = replaybuf::shared::list();
            let mut failed = false;
            let mut names: Vec<String> = names
                .into_iter()
                .filter(|name| {
                    let in_use = regions.iter().find(|r| &r.name == name).filter(|r| !r.is_stale());
                    match in_use {
                        Some(r) if !force => {
                            eprintln!("replaybuf shm remove: {name} is not stale ({}): pass --force to remove it anyway", why_in_use(r));
                            failed = true;
                            false
                        }
                        _ => true,
                    }
                })
                .collect();
            if stale {
                names.extend(regions.into_iter().filter(|r| r.is_stale()).map(|r| r.name));
            }
            for name in names {
                match replaybuf::shared::remove(&name) {
                    Ok(()) => println!("removed {name}"),
                    Err(e) => {
                        eprintln!("replaybuf shm remove: {}", with_causes(&e));
                        failed = true;
                    }
                }
            }
            if failed {
                std::process::exit(1);
            }
        }
    }
}

/// `e` and the errors that caused it, in one line (an I/O error's reason is its
/// cause: "meta.json: I/O failed: not a regular file").
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut said = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        said = format!("{said}: {c}");
        cause = c.source();
    }
    said
}

/// Why a region that is not stale is kept, in words.
fn why_in_use(r: &replaybuf::shared::RegionInfo) -> String {
    if r.foreign {
        "foreign: not this user's alone".to_owned()
    } else if !r.live.is_empty() {
        format!("used by processes {:?}", r.live)
    } else {
        "its creator is still making it".to_owned()
    }
}

/// The WORKLOADS.md measurements `args` names, as JSON lines.
fn bench(args: &BenchArgs) {
    let wants = |name: &str| args.workload.as_deref().is_none_or(|w| w == name);
    if wants("mujoco") {
        bench::single(Workload::mujoco(args.quick), 2000);
    }
    if wants("mujoco-prioritized") {
        bench::single(Workload::mujoco_prioritized(args.quick), 2000);
    }
    if wants("mujoco-slice") {
        bench::single(Workload::mujoco_slice(args.quick), 2000);
    }
    if wants("mujoco-prefetch") {
        bench::prefetch(Workload::mujoco(args.quick), 2000);
    }
    if wants("atari") {
        bench::single(Workload::atari(args.quick), 500);
    }
    if wants("atari-1m") {
        bench::single(Workload::atari_1m(args.quick), 500);
    }
    if args.workload.as_deref() == Some("persist") {
        persist::run(args.quick, args.scratch.as_deref());
    }
    if args.workload.as_deref() == Some("concurrent-shared") {
        shared_bench::run(args, Workload::mujoco(args.quick));
    }
    if wants("concurrent") {
        bench::concurrent(args, Workload::mujoco(args.quick), "concurrent");
    }
    if wants("concurrent-prioritized") {
        bench::concurrent(
            args,
            Workload::mujoco_prioritized(args.quick),
            "concurrent-prioritized",
        );
    }
}

/// The most writer or learner threads of one concurrent configuration.
const MAX_THREADS: usize = 256;

fn parse_config(s: &str) -> Result<(usize, usize), String> {
    let (w, l) = s
        .split_once('x')
        .ok_or_else(|| format!("`{s}`: expected WRITERSxLEARNERS, like 2x1"))?;
    let n = |v: &str| match v.parse::<usize>() {
        // Threads of each kind; shards are the writers' next power of two.
        Ok(n) if n <= MAX_THREADS => Ok(n),
        Ok(_) => Err(format!("`{s}`: at most {MAX_THREADS} writers and learners")),
        Err(e) => Err(format!("`{s}`: {e}")),
    };
    match (n(w)?, n(l)?) {
        (0, 0) => Err(format!("`{s}`: no writer and no learner")),
        config => Ok(config),
    }
}

/// A count of the demonstration's threads of one kind: at most [`MAX_THREADS`] (a
/// huge one panicked making their handles).
fn threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n <= MAX_THREADS => Ok(n),
        Ok(_) => Err(format!("`{s}`: at most {MAX_THREADS} threads")),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

/// A bench run's length: as [`parse_seconds`], and more than 0 (a run of none
/// printed figures of 0 that measured nothing).
fn parse_bench_seconds(s: &str) -> Result<f64, String> {
    match parse_seconds(s)? {
        0.0 => Err(format!("`{s}`: a bench runs for more than 0 seconds")),
        secs => Ok(secs),
    }
}

/// A pace in rows a second: a finite number, one or more (`1e6` and `1000000`
/// alike). At one, a chunk's turn comes every 1,000 seconds at most.
/// A run's length: finite seconds, 0 or more, at most a year (NaN, infinities and
/// negatives panicked once the threads were up, and the run never ended).
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(secs) if (0.0..=365.0 * 86_400.0).contains(&secs) => Ok(secs),
        Ok(_) => Err(format!("`{s}`: seconds from 0 to a year's")),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

fn parse_pace(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(rows) if rows.is_finite() && rows >= 1.0 => Ok(rows),
        Ok(_) => Err(format!(
            "`{s}`: a pace is a number of rows a second, 1 or more"
        )),
        Err(e) => Err(format!("`{s}`: {e}")),
    }
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        None => demo::run(&demo::DemoArgs {
            collectors: cli.collectors,
            learners: cli.learners,
            seconds: cli.seconds,
            capacity: cli.capacity,
            batch: cli.batch,
        }),
        Some(Command::Shm { action }) => shm(action),
        Some(Command::BenchCollector {
            name,
            seconds,
            quick,
        }) => shared_bench::collector(&name, seconds, quick),
        Some(Command::Inspect { dir }) => match replaybuf::checkpoint::inspect(&dir) {
            Ok(found) => {
                println!("{found}");
                if !found.is_whole() {
                    std::process::exit(1);
                }
            }
            Err(e) => {
                eprintln!("replaybuf inspect: {}", with_causes(&e));
                // Damaged is 1, as a damaged file is; nothing to inspect, 2.
                std::process::exit(if e.is_corrupt() { 1 } else { 2 });
            }
        },
        Some(Command::Bench {
            quick,
            workload,
            seconds,
            rounds,
            configs,
            scratch,
            pace,
        }) => bench(&BenchArgs {
            quick,
            workload,
            seconds: if quick { seconds.min(1.0) } else { seconds },
            rounds: rounds as usize,
            configs,
            scratch,
            pace,
        }),
    }
}
