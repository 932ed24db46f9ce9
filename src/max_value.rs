//! The max-value writer (TorchRL's `TensorDictMaxValueWriter`): the storage keeps the
//! rows that rank highest by a field.
//!
//! While the storage has room, rows are appended at the shards' cursors as usual. Once
//! it is full, a row replaces the lowest-ranked stored row only if it ranks strictly
//! higher; otherwise it is rejected, and the [`Written`] of the extend says so. Rows of
//! one batch compete in order with the stored ones and with each other: a batch row
//! that a later row of the same batch displaces is reported rejected and never
//! written.
//!
//! # Concurrency
//!
//! Deciding where rows go needs the ranks of everything stored, so the decisions are
//! made under one lock (TorchRL locks too): a cold-path writer. The rows themselves go
//! through the slot protocol like every other write: new rows by the ordinary append
//! (stamp marked, row stored, stamp published), replacements by the in-place edit path
//! of `write_all` (an editor guard on the shard, the stamp's edit count bumped around
//! the copy). A learner sampling meanwhile reads either the old row or the new one,
//! never a mix, and never waits.
//!
//! Every write of a max-value buffer takes the lock (`extend`, `add`, a writer handle's,
//! `write_all`, which re-ranks the rows it rewrites), and so does `empty`, which
//! forgets the ranks with the rows. No other path moves a cursor while the lock is
//! held, so the next append of each shard lands where the plan expects.
//!
//! Layer: gates.

use std::collections::{BTreeSet, HashMap};

use crate::batch::Batch;
use crate::dtype::DType;
use crate::error::{BuildError, BuildErrorKind, DataError};
use crate::key::Key;

use crate::core::Attempt;
use crate::core::Core;
use crate::core::Written;
use crate::sampler::{Reduction, Sampler};
use crate::spec::Spec;
use crate::storage::freeze::Retired;
use crate::storage::plan::RowOrder;
use crate::storage::stamp::Stamp;
use crate::sync::{Mutex, MutexGuard};

/// A row's rank: its rank field's values reduced, ordered totally. An integer
/// field's are exact: as `f64`s, ranks past 2^53 (a timestamp in nanoseconds, say)
/// rounded together, and a strictly higher one was rejected as a tie.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rank {
    /// A stored row whose field gives no rank (a NaN, written under another policy):
    /// below every other.
    Unranked,
    /// A float field's (`-0.0` stored as `0.0`; NaN never gets in). Infinities
    /// order above and below every finite rank, as TorchRL's do.
    Float(f64),
    /// An integer field's.
    Int(i128),
}

impl Rank {
    fn kind(&self) -> u8 {
        match self {
            Rank::Unranked => 0,
            Rank::Float(_) => 1,
            Rank::Int(_) => 2,
        }
    }
}

impl PartialEq for Rank {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Rank {}

impl PartialOrd for Rank {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Rank {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (Rank::Float(a), Rank::Float(b)) => a.total_cmp(b),
            (Rank::Int(a), Rank::Int(b)) => a.cmp(b),
            // One buffer's rank field has one dtype: only `Unranked` meets the others.
            _ => self.kind().cmp(&other.kind()),
        }
    }
}

/// The ranks of the stored rows.
#[derive(Debug, Default)]
pub(crate) struct Ranks {
    /// `(rank, index)` of every stored row, lowest first.
    order: BTreeSet<(Rank, u64)>,
    /// The rank of the row at each storage index (`None`: none stored).
    by_index: Vec<Option<Rank>>,
}

impl Ranks {
    fn set(&mut self, index: u64, rank: Rank) {
        if let Some(old) = self.by_index[index as usize].replace(rank) {
            self.order.remove(&(old, index));
        }
        self.order.insert((rank, index));
    }

    fn lowest(&self) -> Option<(Rank, u64)> {
        self.order.first().copied()
    }

    fn clear(&mut self) {
        self.order.clear();
        self.by_index.fill(None);
    }
}

/// A max-value writer with its ranks.
#[derive(Debug)]
pub(crate) struct MaxValue {
    /// The rank field, by position in the spec.
    field: usize,
    reduction: Reduction,
    /// Held while rows are placed, rewritten or emptied.
    ranks: Mutex<Ranks>,
}

/// Where one accepted batch row goes.
#[derive(Clone, Copy, Debug)]
enum Placement {
    /// Appended to shard `k` at sequence number `seq`.
    Append { k: usize, seq: u64 },
    /// Written in place over the stored row at this index.
    Replace,
}

impl MaxValue {
    /// Checks the choices of a max-value writer for a buffer of `spec`.
    pub(crate) fn new(
        rank_key: &Key,
        reduction: Reduction,
        spec: &Spec,
        ndim: usize,
        sampler: &Sampler,
        capacity: usize,
    ) -> Result<MaxValue, BuildError> {
        let err = |reason| Err(BuildError::new(BuildErrorKind::Writer { reason }));
        let key_err = |reason| {
            Err(BuildError::new(BuildErrorKind::RankKey {
                key: rank_key.clone(),
                reason,
            }))
        };
        let Some((field, f)) = spec.field(rank_key) else {
            return key_err("no such field in the spec");
        };
        if f.dtype() == DType::Bool {
            return key_err("ranks must be a numeric field, not bool");
        }
        if f.elements() == 0 {
            return key_err("a rank field needs at least one value a row");
        }
        if ndim != 1 {
            return err("a max-value writer needs an ndim-1 storage");
        }
        match sampler {
            Sampler::Uniform(_) | Sampler::WithoutReplacement(_) => {}
            Sampler::Prioritized(_) => {
                return err(
                    "a max-value writer replaces rows in place, which the prioritized \
                            trees do not follow: use a uniform or without-replacement sampler",
                )
            }
            Sampler::Slice(_) => {
                return err("a max-value writer replaces single rows, which breaks the \
                            trajectories a slice sampler reads: use a uniform or \
                            without-replacement sampler")
            }
            Sampler::Fifo(_) => {
                return err("a max-value writer replaces rows in place, behind a FIFO \
                            sampler's mark: use a uniform or without-replacement sampler")
            }
        }
        Ok(MaxValue {
            field,
            reduction,
            ranks: Mutex::new(Ranks {
                order: BTreeSet::new(),
                by_index: vec![None; capacity],
            }),
        })
    }

    /// Each row's rank ([`MaxValue::rank`]). Refuses a row that ranks nowhere.
    fn ranks_of(&self, core: &Core, batch: &Batch, rows: usize) -> Result<Vec<Rank>, DataError> {
        let key = core.storage.spec().fields()[self.field].key();
        let values = RankValues::of(batch, key)?;
        (0..rows.min(batch.len()))
            .map(|r| {
                self.rank(&values, r, batch.len())
                    .ok_or_else(|| DataError::InvalidRank {
                        key: key.clone(),
                        row: r,
                        value: f64::NAN,
                    })
            })
            .collect()
    }

    /// The rank of row `r` of `rows` rows whose rank field holds `values`: their
    /// reduction, or `None` for a NaN (a NaN among them, infinities of both signs
    /// summed), which ranks nowhere. Rows coming in and rows re-ranked after a swap or
    /// a load rank alike: a re-rank that took an infinite rank for the lowest dropped
    /// the best row first.
    fn rank(&self, values: &RankValues, r: usize, rows: usize) -> Option<Rank> {
        let row = |len: usize| {
            let per_row = len / rows.max(1);
            (per_row > 0).then(|| r * per_row..(r + 1) * per_row)
        };
        match values {
            RankValues::Float(v) => {
                let rank = self.reduction.reduce(v.get(row(v.len())?)?);
                (!rank.is_nan()).then_some(Rank::Float(rank + 0.0))
            }
            RankValues::Int(v) => Some(Rank::Int(
                self.reduction.reduce_exact(v.get(row(v.len())?)?),
            )),
        }
    }

    /// Places the rows of `batch`: appends while the storage has room (shard `first`
    /// first), then replaces the lowest-ranked rows that rank below them.
    ///
    /// Refused with `Retired` before anything is written if a swap retired the
    /// storage: the swap holds this writer's lock while it freezes the storage, so a
    /// placement is either wholly done before the copy or starts after the retirement,
    /// and then its first write is the one refused.
    pub(crate) fn place(
        &self,
        core: &Core,
        first: usize,
        batch: &Batch,
    ) -> Result<Written, Attempt<DataError>> {
        let prepared = core.prepare(None, batch)?;
        let ranks = self.ranks_of(core, batch, batch.len())?;
        let storage = &core.storage;
        let shards = storage.shards();
        // Before the lock: a save of this buffer holds it, and a save hook's write
        // would wait for it forever instead of being refused.
        storage.refuse_reentry();
        let mut held = self.ranks.lock();

        // Plan: which row goes where, rows competing in order.
        let mut next: Vec<u64> = shards.iter().map(|s| s.window().hi).collect();
        let mut room: Vec<u64> = shards
            .iter()
            .map(|s| s.ring().steps - s.window().steps())
            .collect();
        // The batch row planned at each index, and how it gets there.
        let mut planned: HashMap<u64, (usize, Placement)> = HashMap::new();
        let mut placed: Vec<Option<u64>> = vec![None; ranks.len()];
        for (row, &rank) in ranks.iter().enumerate() {
            let free = (0..shards.len())
                .map(|i| (first + i) % shards.len())
                .find(|&k| room[k] > 0);
            let (index, target) = match (free, held.lowest()) {
                (Some(k), _) => {
                    let ring = shards[k].ring();
                    let seq = next[k];
                    next[k] += 1;
                    room[k] -= 1;
                    (ring.index(ring.pos(seq), 0), Placement::Append { k, seq })
                }
                (None, Some((lowest, index))) if rank > lowest => {
                    let target = match planned.get(&index) {
                        // Displaces a row of this batch: it takes that row's place.
                        Some(&(earlier, target)) => {
                            placed[earlier] = None;
                            target
                        }
                        None => Placement::Replace,
                    };
                    (index, target)
                }
                _ => continue,
            };
            held.set(index, rank);
            planned.insert(index, (row, target));
            placed[row] = Some(index);
        }

        // Write: appends shard by shard in sequence order, then the replacements.
        let src = &prepared.src;
        let mut appends: Vec<(usize, u64, usize)> = planned
            .values()
            .filter_map(|&(row, t)| match t {
                Placement::Append { k, seq } => Some((k, seq, row)),
                Placement::Replace => None,
            })
            .collect();
        appends.sort_unstable();
        let mut generation: HashMap<usize, u64> = HashMap::new();
        for (k, seq, row) in appends {
            let one = src.rows(row as u64, row as u64 + 1);
            let got = storage.append(k, 1, &one)?;
            debug_assert_eq!(
                got, seq,
                "replaybuf internal error: a cursor moved under the max-value lock"
            );
            let ring = shards[k].ring();
            generation.insert(row, Stamp::published(ring.lap(got), 0).generation());
        }
        for (&index, &(row, target)) in &planned {
            let Placement::Replace = target else { continue };
            if let Some(g) = rewrite(core, index, src, row)? {
                generation.insert(row, g);
            } else {
                // Unreachable while the lock is held (`empty` takes it); reported as
                // rejected rather than as a row that is not there.
                placed[row] = None;
            }
        }
        drop(held);
        Ok(Written::placed(
            placed
                .iter()
                .enumerate()
                .map(|(row, at)| at.map(|index| (index, generation[&row])))
                .collect(),
        ))
    }

    /// Takes the lock for a rewrite of `data`'s first `rows` rows (the rest are not
    /// written, and not ranked): the rewrite happens under it, and [`Rerank::finish`]
    /// records the rewritten rows' ranks.
    pub(crate) fn rerank(
        &self,
        core: &Core,
        data: &Batch,
        rows: usize,
    ) -> Result<Rerank<'_>, DataError> {
        let ranks = self.ranks_of(core, data, rows)?;
        core.storage.refuse_reentry();
        Ok(Rerank {
            held: self.ranks.lock(),
            ranks,
        })
    }

    /// Ranks the rows the storage holds now, forgetting the ranks known before: for a
    /// buffer whose rows came from elsewhere (a checkpoint, a reopened file, a swap).
    pub(crate) fn rerank_stored(&self, core: &Core) {
        let mut held = self.ranks.lock();
        held.clear();
        let rows = core.read_positions(&core.live_draws());
        for (&index, rank) in rows.index().iter().zip(self.stored_ranks(&rows)) {
            held.set(index, rank);
        }
    }

    /// The rank of each row of `rows` (rows already stored somewhere), as
    /// [`MaxValue::rank`] ranks rows coming in; rows written under another policy may
    /// hold anything, and a row without a rank (a NaN) ranks lowest.
    pub(crate) fn stored_ranks(&self, rows: &Batch) -> Vec<Rank> {
        let values = RankValues::of(rows, rows.spec().fields()[self.field].key())
            .unwrap_or(RankValues::Float(Vec::new()));
        (0..rows.len())
            .map(|r| self.rank(&values, r, rows.len()).unwrap_or(Rank::Unranked))
            .collect()
    }

    /// Runs `empty` under the lock, then forgets every rank.
    pub(crate) fn emptying<R>(&self, empty: impl FnOnce() -> R) -> R {
        let mut held = self.ranks.lock();
        let r = empty();
        held.clear();
        r
    }

    /// Holds the lock: no placement, rewrite or emptying is under way meanwhile.
    pub(crate) fn hold(&self) -> Held<'_> {
        Held {
            _ranks: self.ranks.lock(),
        }
    }
}

/// A max-value writer's lock, held (see [`MaxValue::hold`]).
pub(crate) struct Held<'a> {
    _ranks: MutexGuard<'a, Ranks>,
}

/// A `write_all` of a max-value buffer in progress: the lock, and the new rows' ranks.
pub(crate) struct Rerank<'a> {
    held: MutexGuard<'a, Ranks>,
    ranks: Vec<Rank>,
}

impl Rerank<'_> {
    /// Records the ranks of the rows now at `positions`, row `r`'s at `positions[r]`
    /// (a position named twice keeps its last row's).
    pub(crate) fn finish(mut self, core: &Core, positions: &[u64]) {
        for (&index, &rank) in positions.iter().zip(&self.ranks) {
            if core.storage.draw_at(index).is_some() {
                self.held.set(index, rank);
            }
        }
    }
}

/// Rewrites the live row at `index` in place with row `row` of `src`, under an editor
/// guard; returns its new generation, or `None` if the position holds no row.
fn rewrite(
    core: &Core,
    index: u64,
    src: &crate::storage::plan::Source<'_>,
    row: usize,
) -> Result<Option<u64>, Retired> {
    let storage = &core.storage;
    let Some(draw) = storage.draw_at(index) else {
        return Ok(None);
    };
    let _editor = storage.enter_edit(draw.shard as usize)?;
    debug_assert_eq!(src.order, RowOrder::Flat);
    if !storage.edit(draw, src, row as u64) {
        return Ok(None);
    }
    let ring = storage.shards()[draw.shard as usize].ring();
    let leaf = ring.pos(draw.seq) * ring.width + u64::from(draw.lane);
    Ok(Some(
        storage.stamp_of(draw.shard as usize, leaf).generation(),
    ))
}

/// A rank field's values, row after row: a float field's as `f64`s, an integer
/// field's exactly.
enum RankValues {
    Float(Vec<f64>),
    Int(Vec<i128>),
}

impl RankValues {
    fn of(batch: &Batch, key: &Key) -> Result<RankValues, DataError> {
        fn all<T: crate::dtype::Element + Copy, U>(
            batch: &Batch,
            key: &Key,
            f: impl Fn(T) -> U,
        ) -> Result<Vec<U>, DataError> {
            Ok(batch.column::<T>(key)?.iter().map(|&v| f(v)).collect())
        }
        use RankValues::{Float, Int};
        Ok(match batch.dtype(key)? {
            DType::F64 => Float(all(batch, key, |v: f64| v)?),
            DType::F32 => Float(all(batch, key, |v: f32| f64::from(v))?),
            DType::F16 => Float(all(batch, key, |v: half::f16| v.to_f64())?),
            DType::BF16 => Float(all(batch, key, |v: half::bf16| v.to_f64())?),
            DType::I64 => Int(all(batch, key, |v: i64| i128::from(v))?),
            DType::I32 => Int(all(batch, key, |v: i32| i128::from(v))?),
            DType::I16 => Int(all(batch, key, |v: i16| i128::from(v))?),
            DType::I8 => Int(all(batch, key, |v: i8| i128::from(v))?),
            DType::U64 => Int(all(batch, key, |v: u64| i128::from(v))?),
            DType::U32 => Int(all(batch, key, |v: u32| i128::from(v))?),
            DType::U16 => Int(all(batch, key, |v: u16| i128::from(v))?),
            DType::U8 => Int(all(batch, key, |v: u8| i128::from(v))?),
            DType::Bool => Int(all(batch, key, |v: bool| i128::from(u8::from(v)))?),
        })
    }
}
