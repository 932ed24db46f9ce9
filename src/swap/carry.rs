//! What a swap into a new storage carries over, and the copy: which old rows go to
//! which new shard, in what order (the rules are in
//! [`ReplayBuffer::set_storage`](crate::ReplayBuffer::set_storage)'s docs), then the
//! rows themselves, their priorities, and the random streams' counters.
//!
//! The old storage is frozen throughout: every row claimed in it is published and
//! none changes. The new one is not published yet: nobody else writes it.
//!
//! Layer: api.

use crate::core::Prepared;
use crate::policy::PolicyEngine;
use crate::sampler::fifo;
use crate::state::State;
use crate::storage::geometry::Geometry;
use crate::storage::layout::Global;
use crate::storage::plan::RowOrder;
use crate::storage::shard::Shard;
use crate::storage::{Draw, Storage};
use crate::sync::Ordering;

/// The old rows one new shard receives: oldest first; for ndim 2, step after step,
/// each step's lanes in order.
struct CarriedRun {
    shard: usize,
    steps: u64,
    draws: Vec<Draw>,
    /// The rows of each old shard in `draws`, oldest first: a trajectory left open
    /// at the end of one does not go on into the next.
    runs: Vec<usize>,
    /// Whether the trajectory open at its newest row goes on in another new shard (a
    /// split's older run): the rows appended next begin a new one.
    cut: bool,
}

impl CarriedRun {
    /// One run of `draws`, `steps` steps long.
    fn whole(shard: usize, steps: u64, draws: Vec<Draw>) -> CarriedRun {
        CarriedRun {
            shard,
            steps,
            runs: vec![draws.len()],
            draws,
            cut: false,
        }
    }
}

/// Copies `old`'s rows into `new` (see the module docs).
pub(super) fn carry(old: &State, new: &mut State) {
    new.core.storage.start_at_lap(next_lap(&old.core.storage));
    let new = &*new;
    let counters = [
        Global::Calls,
        Global::NextShard,
        Global::Writers,
        Global::Learners,
    ];
    for g in counters {
        let value = old.core.storage.global(g).load(Ordering::Relaxed);
        new.core.storage.global(g).store(value, Ordering::Relaxed);
    }
    let keep_priorities = match (
        old.core.sampler.prioritized(),
        new.core.sampler.prioritized(),
    ) {
        (Some(_), Some(state)) => {
            // The running maximum goes on (priorities are never negative, so their
            // bit patterns order as the numbers do).
            let max = old
                .core
                .storage
                .global(Global::MaxSeen)
                .load(Ordering::Relaxed);
            new.core
                .storage
                .global(Global::MaxSeen)
                .fetch_max(max, Ordering::Relaxed);
            Some(state.new_row_priority(&new.core.storage.trees()))
        }
        _ => None,
    };
    let parts = match (&new.policy, *new.core.storage.geometry()) {
        (PolicyEngine::MaxValue(m), _) => {
            // The highest-ranked rows that fit, in the order they were written.
            let all = in_time_order(&old.core.storage);
            let rows = old.core.read_positions(&all);
            let ranks = m.stored_ranks(&rows);
            let capacity = new.core.storage.geometry().capacity() as usize;
            let mut by_rank: Vec<usize> = (0..all.len()).collect();
            // Highest first; of equal ranks, the newest.
            by_rank.sort_by(|&a, &b| ranks[b].cmp(&ranks[a]).then(b.cmp(&a)));
            by_rank.truncate(capacity);
            by_rank.sort_unstable();
            let kept = by_rank.into_iter().map(|i| all[i]).collect();
            flat_parts(vec![kept], &ring_steps(&new.core.storage))
        }
        (_, Geometry::Flat { .. }) => {
            let sources = match old.core.storage.geometry() {
                Geometry::Flat { .. } => (0..old.core.storage.shards().len())
                    .map(|k| column(&old.core.storage, k, 0))
                    .collect(),
                Geometry::Grid { .. } => vec![in_time_order(&old.core.storage)],
            };
            flat_parts(sources, &ring_steps(&new.core.storage))
        }
        (_, Geometry::Grid { .. }) => grid_parts(&old.core.storage, &new.core.storage),
    };
    for part in parts.into_iter().filter(|p| !p.draws.is_empty()) {
        let storage = &new.core.storage;
        let shard = &storage.shards()[part.shard];
        let width = shard.ring().width;
        let order = match storage.geometry() {
            Geometry::Flat { .. } => RowOrder::Flat,
            Geometry::Grid { .. } => RowOrder::TimeMajor {
                envs: width,
                env0: 0,
            },
        };
        let first = shard.window().hi;
        let mut at = 0;
        for (r, &len) in part.runs.iter().enumerate() {
            if r > 0 {
                storage.end_trajectories(part.shard);
            }
            let draws = &part.draws[at..at + len];
            at += len;
            let rows = old.core.read_positions(draws);
            let src = new
                .core
                .source(&rows, order)
                .expect("replaybuf internal error: a buffer's rows do not fit its own spec");
            let priorities = keep_priorities.map(|default| raws(&old.core.storage, draws, default));
            let rows = Prepared {
                steps: if part.runs.len() == 1 {
                    part.steps
                } else {
                    len as u64 / width
                },
                src,
                priorities,
            };
            new.core
                .append(Some(part.shard), &rows)
                .expect("replaybuf internal error: a storage retired before it was published");
        }
        if part.cut {
            storage.end_trajectories(part.shard);
        }
        carry_fifo_mark(&old.core.storage, &part, shard, first);
    }
    new.policy.reload(&new.core);
}

/// Moves the FIFO mark of new shard `shard`, whose rows from `first` on are `part`'s,
/// past the rows at the part's start that a FIFO sampler had taken in the old storage,
/// so that a queue carried into a new storage does not hand them out again. (Taken
/// rows after one not taken, which merging shards can interleave, are handed out
/// again.) ndim 1 only: a new ndim-2 storage's queues start over.
fn carry_fifo_mark(old: &Storage, part: &CarriedRun, shard: &Shard, first: u64) {
    if shard.ring().width != 1 {
        return;
    }
    let taken = part
        .draws
        .iter()
        .take_while(|d| {
            let old_shard = &old.shards()[d.shard as usize];
            fifo::row(d, old_shard.ring().width) < old_shard.popped().load(Ordering::Relaxed)
        })
        .count() as u64;
    if taken > 0 {
        shard.popped().fetch_max(first + taken, Ordering::Relaxed);
    }
}

/// The first lap the new storage's rings start at: beyond every lap the old storage
/// reached, so that no (index, generation) of an old row names a new one.
fn next_lap(old: &Storage) -> u64 {
    old.shards()
        .iter()
        .map(|s| s.window().hi.div_ceil(s.ring().steps))
        .max()
        .unwrap_or(0)
}

/// Each new shard's ring steps.
fn ring_steps(storage: &Storage) -> Vec<u64> {
    storage.shards().iter().map(|s| s.ring().steps).collect()
}

/// The live rows of lane `lane` of old shard `k`, oldest first.
fn column(old: &Storage, k: usize, lane: u64) -> Vec<Draw> {
    let shard = &old.shards()[k];
    let ring = *shard.ring();
    let window = shard.window();
    (window.lo..window.hi)
        .filter_map(|seq| {
            old.draw_at(ring.index(ring.pos(seq), lane))
                .filter(|d| d.seq == seq && u64::from(d.lane) == lane)
        })
        .collect()
}

/// Every environment's column of an ndim-2 storage, by environment.
fn columns(old: &Storage) -> Vec<Vec<Draw>> {
    let mut cols = Vec::new();
    for (k, shard) in old.shards().iter().enumerate() {
        for lane in 0..shard.ring().width {
            cols.push(column(old, k, lane));
        }
    }
    cols
}

/// Every live row in time order: ndim 1, the shards one after another; ndim 2, step
/// after step from the oldest (columns aligned at their newest step), the
/// environments of a step in order.
fn in_time_order(old: &Storage) -> Vec<Draw> {
    match old.geometry() {
        Geometry::Flat { .. } => (0..old.shards().len())
            .flat_map(|k| column(old, k, 0))
            .collect(),
        Geometry::Grid { .. } => {
            let cols = columns(old);
            let longest = cols.iter().map(Vec::len).max().unwrap_or(0);
            let mut rows = Vec::new();
            for age in (0..longest).rev() {
                for c in &cols {
                    if let Some(i) = c.len().checked_sub(age + 1) {
                        rows.push(c[i]);
                    }
                }
            }
            rows
        }
    }
}

/// The newest `keep` of `rows`.
fn newest(rows: &[Draw], keep: usize) -> &[Draw] {
    &rows[rows.len().saturating_sub(keep)..]
}

/// The parts of new ndim-1 shards of `steps` each from `sources` (each oldest first;
/// both counts powers of two).
///
/// With more shards than sources, source `j` is cut into `k` consecutive runs for
/// shards `j + m * bitrev(r)`, run `r = 0` the newest (so it stays in shard `j`,
/// where a writer bound to `j` goes on appending). With fewer, shard `t` takes
/// sources `t + n * q`, oldest first by the same order. The order is what repeated
/// halvings give (a split in two sends the older half to the upper shard), so
/// splitting and merging back, in any steps, gives every row back its place. Each
/// shard keeps the newest rows it has room for.
fn flat_parts(sources: Vec<Vec<Draw>>, steps: &[u64]) -> Vec<CarriedRun> {
    let (n, m) = (steps.len(), sources.len());
    let cap = |t: usize| steps[t] as usize;
    let mut parts: Vec<CarriedRun> = (0..n)
        .map(|shard| CarriedRun::whole(shard, 0, Vec::new()))
        .collect();
    if n <= m {
        let k = m / n;
        let mut sources: Vec<Option<Vec<Draw>>> = sources.into_iter().map(Some).collect();
        for (t, part) in parts.iter_mut().enumerate() {
            // Oldest first: the highest run number first.
            let mut runs: Vec<Vec<Draw>> = (0..k)
                .rev()
                .map(|r| sources[t + n * bitrev(r, k)].take().unwrap_or_default())
                .collect();
            // The newest rows that fit: the oldest runs give up theirs first.
            let mut over = runs
                .iter()
                .map(Vec::len)
                .sum::<usize>()
                .saturating_sub(cap(t));
            for run in &mut runs {
                let dropped = over.min(run.len());
                run.drain(..dropped);
                over -= dropped;
            }
            part.runs = runs.iter().map(Vec::len).filter(|&len| len > 0).collect();
            part.draws = runs.concat();
        }
    } else {
        let k = n / m;
        for (j, source) in sources.into_iter().enumerate() {
            let targets: Vec<usize> = (0..k).map(|r| j + m * bitrev(r, k)).collect();
            let room: usize = targets.iter().map(|&t| cap(t)).sum();
            let rows = newest(&source, room);
            let mut end = rows.len();
            for (r, &t) in targets.iter().enumerate() {
                let later: usize = targets[r + 1..].iter().map(|&u| cap(u)).sum();
                let even = end.div_ceil(k - r);
                let take = even.max(end.saturating_sub(later)).min(cap(t));
                parts[t] = CarriedRun {
                    // Run 0 is the newest: older ones end where a newer one goes on.
                    cut: r > 0,
                    ..CarriedRun::whole(t, 0, rows[end - take..end].to_vec())
                };
                end -= take;
            }
        }
    }
    for part in &mut parts {
        part.steps = part.draws.len() as u64;
    }
    parts
}

/// `r` with its `log2(k)` low bits reversed (`k` a power of two).
fn bitrev(r: usize, k: usize) -> usize {
    let bits = k.trailing_zeros();
    if bits == 0 {
        return 0;
    }
    r.reverse_bits() >> (usize::BITS - bits)
}

/// The parts of a new ndim-2 storage's shards: with the same environments, every
/// column's rows stay in their column (a shard keeps the newest steps all its columns
/// have); otherwise the rows in time order fill whole steps of the new environments,
/// the oldest rows that do not fill one dropped.
fn grid_parts(old: &Storage, new: &Storage) -> Vec<CarriedRun> {
    let Geometry::Grid { envs, .. } = *new.geometry() else {
        unreachable!("replaybuf internal error: grid parts of a flat storage")
    };
    let same_envs = matches!(*old.geometry(), Geometry::Grid { envs: e, .. } if e == envs);
    let envs = envs as usize;
    let mut parts = Vec::new();
    if same_envs {
        let cols = columns(old);
        for (t, shard) in new.shards().iter().enumerate() {
            let ring = *shard.ring();
            let group = &cols[ring.index_offset as usize..][..ring.width as usize];
            let h = group
                .iter()
                .map(Vec::len)
                .min()
                .unwrap_or(0)
                .min(ring.steps as usize);
            let mut draws = Vec::with_capacity(h * group.len());
            for i in 0..h {
                draws.extend(group.iter().map(|c| c[c.len() - h + i]));
            }
            parts.push(CarriedRun::whole(t, h as u64, draws));
        }
    } else {
        let all = in_time_order(old);
        let steps = new.shards().first().map_or(0, |s| s.ring().steps) as usize;
        let h = all.len().min(steps * envs) / envs;
        let rows = newest(&all, h * envs);
        for (t, shard) in new.shards().iter().enumerate() {
            let ring = *shard.ring();
            let (first, width) = (ring.index_offset as usize, ring.width as usize);
            let mut draws = Vec::with_capacity(h * width);
            for i in 0..h {
                draws.extend_from_slice(&rows[i * envs + first..][..width]);
            }
            parts.push(CarriedRun::whole(t, h as u64, draws));
        }
    }
    parts
}

/// The raw priority of each drawn old row (`default` for one without).
fn raws(old: &Storage, draws: &[Draw], default: f64) -> Vec<f64> {
    let trees = old.trees();
    draws
        .iter()
        .map(|d| {
            let ring = old.shards()[d.shard as usize].ring();
            let leaf = ring.pos(d.seq) * ring.width + u64::from(d.lane);
            let lap = ring.lap(d.seq);
            trees
                .get(d.shard as usize)
                .and_then(|t| t.raw(leaf as usize, lap))
                .unwrap_or(default)
        })
        .collect()
}
