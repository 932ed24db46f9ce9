//! A buffer's state and the cell that holds it. [`State`] is what a swap replaces
//! whole: the [`Core`] (storage, sampler), the write policy, the configuration, and
//! the hooks and transforms every state of the buffer shares. [`StateCell`] is what
//! every handle of one buffer shares: the current state behind one `ArcSwap`, the
//! spec, and the reconfiguration lock. The write paths that pass the policy's gate
//! (extend, add, rewrites) start here and go down to the core.
//!
//! Layer: state.

use crate::batch::Batch;
use crate::config::Config;
use crate::core::Written;
use crate::core::{Attempt, Core, Prepared};
use crate::error::{AccessError, DataError};
use crate::hooks::Hooks;
use crate::policy::{Admit, PolicyEngine, Rewrite};
use crate::sampler::SamplerEngine;
use crate::spec::Spec;
use crate::storage::freeze::Retired;
use crate::storage::geometry::Geometry;
use crate::storage::plan::RowOrder;
use crate::storage::Storage;
use crate::sync::Guard;
use crate::sync::{ArcSwap, Mutex};
use crate::transform::Transforms;
use std::path::PathBuf;
use std::sync::Arc;

/// A buffer's state: what a swap replaces whole (see `swap/mod.rs`). Every handle
/// reaches the current one through [`ReplayBuffer::state`](crate::ReplayBuffer).
#[derive(Debug)]
pub(crate) struct State {
    /// The storage, the sampler and how batches map onto them.
    pub(crate) core: Core,
    /// What the buffer was built with (its seed resolved): for checkpoints.
    pub(crate) config: Config,
    /// The directory of a file-backed storage.
    pub(crate) memmap: Option<PathBuf>,
    /// Save and load hooks of checkpoints, shared by every state of the buffer.
    pub(crate) hooks: Arc<Hooks>,
    /// The write policy and its state: every write passes its gate (`policy.rs`).
    pub(crate) policy: PolicyEngine,
    /// Closures on sampled batches, and their inverses on written data, shared by
    /// every state of the buffer.
    pub(crate) transforms: Arc<Transforms>,
}

impl State {
    pub(crate) fn new(
        config: Config,
        storage: Storage,
        sampler: SamplerEngine,
        seed: u64,
        batch_size: Option<usize>,
        dim_extend: usize,
        priority_field: Option<usize>,
    ) -> State {
        State {
            config,
            memmap: None,
            hooks: Arc::default(),
            core: Core {
                storage,
                sampler,
                seed,
                batch_size,
                dim_extend,
                priority_field,
            },
            policy: PolicyEngine::RoundRobin,
            transforms: Arc::default(),
        }
    }

    pub(crate) fn add(&self, shard: usize, row: &Batch) -> Result<u64, Attempt<DataError>> {
        self.core.check_one_row(row)?;
        Ok(self.extend(Some(shard), row)?.index(0))
    }

    /// Appends `batch` to shard `shard` (ndim 1, or one env group of ndim 2), or to
    /// every shard (`None`, ndim 2 only).
    pub(crate) fn extend(
        &self,
        shard: Option<usize>,
        batch: &Batch,
    ) -> Result<Written, Attempt<DataError>> {
        let batch = match self.admit(shard, batch)? {
            Admit::Append(batch) => batch,
            Admit::Placed(written) => return Ok(written),
        };
        let rows = self.core.prepare(shard, &batch)?;
        if shard.is_none() {
            // Every shard is written: in a shared region, only by its lease holder, so
            // that a dead process's damage is its lease's (`shared/procs.rs`).
            self.core
                .storage
                .lease_all()
                .map_err(|shard| DataError::ShardLeased { shard })?;
        }
        Ok(self.core.append(shard, &rows)?)
    }

    /// Refuses what an extend of `batch` to `shard` (an `add`, with `one_row`) would be
    /// refused for whatever the buffer holds, before a rate limit makes it wait: a
    /// refused batch waited for room it would never use (for good, without a
    /// timeout). The policy, then, where the batch goes in as given (no inverse
    /// transform may make another of it) and no frames check takes a shard's turn,
    /// its shape, fields, dtypes and priorities.
    pub(crate) fn precheck(
        &self,
        shard: Option<usize>,
        batch: &Batch,
        one_row: bool,
    ) -> Result<(), DataError> {
        if let PolicyEngine::Immutable = &self.policy {
            return Err(DataError::Immutable);
        }
        if one_row {
            self.core.check_one_row(batch)?;
        }
        if !self.transforms.inverts() && self.core.storage.frames().is_none() {
            self.core.prepare(shard, batch)?;
        }
        Ok(())
    }

    pub(crate) fn write_all(
        &self,
        data: &Batch,
        end: Option<usize>,
    ) -> Result<(), Attempt<AccessError>> {
        let rows = data.len() as u64;
        let end = end.map_or(rows, |e| e as u64);
        if end > rows {
            return Err(AccessError::from(DataError::BatchShape {
                expected: "at least `end` rows",
                found: data.shape().to_vec(),
            })
            .into());
        }
        let capacity = self.core.storage.geometry().capacity();
        if end > capacity {
            return Err(AccessError::OutOfRange {
                index: end - 1,
                capacity,
            }
            .into());
        }
        let positions: Vec<u64> = (0..end).collect();
        self.write_at(&positions, data)
    }

    /// Rewrites storage position `positions[r]` with row `r` of `data` (which has at
    /// least as many rows), in order: a position named twice ends with its last row.
    pub(crate) fn write_at(
        &self,
        positions: &[u64],
        data: &Batch,
    ) -> Result<(), Attempt<AccessError>> {
        if self.core.storage.frames().is_some() {
            return Err(Attempt::Failed(AccessError::FramesRewrite));
        }
        let rewrite = self.admit_rewrite(data, positions.len())?;
        let data = &*rewrite.data;
        if data.len() < positions.len() {
            return Err(AccessError::from(DataError::BatchShape {
                expected: "a row for every position",
                found: data.shape().to_vec(),
            })
            .into());
        }
        let storage = &self.core.storage;
        let capacity = storage.geometry().capacity();
        let src = self
            .core
            .source(data, RowOrder::Flat)
            .map_err(AccessError::from)?;
        let draws = positions
            .iter()
            .map(|&index| match storage.draw_at(index) {
                Some(d) => Ok(d),
                None if index >= capacity => Err(AccessError::OutOfRange { index, capacity }),
                None => Err(AccessError::NotWritten { index }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(bounds) = storage.slice_bounds() {
            // A slice sampler knows trajectories by what the rows said when they were
            // appended (the lanes' words, not the rows): a rewrite keeps each row's.
            let stored = self.core.read_positions(&draws);
            let before = self
                .core
                .source(&stored, RowOrder::Flat)
                .map_err(AccessError::from)?;
            // By position: a row emptied meanwhile is left out of `stored`.
            let at: std::collections::HashMap<u64, u64> = stored
                .index()
                .iter()
                .enumerate()
                .map(|(k, &i)| (i, k as u64))
                .collect();
            let changed = positions.iter().enumerate().find(|&(r, i)| {
                at.get(i)
                    .is_some_and(|&k| bounds.key(&src, r as u64, 0) != bounds.key(&before, k, 0))
            });
            if let Some((_, &index)) = changed {
                return Err(AccessError::TrajectoryRewrite { index }.into());
            }
        }
        // Every shard is entered before any row is rewritten: all or nothing.
        let _guards = storage.enter_edit_all()?;
        for (r, d) in draws.into_iter().enumerate() {
            // A row emptied after the check above has nothing to rewrite: skip it.
            let _ = storage.edit(d, &src, r as u64);
        }
        drop(src);
        rewrite.finish(&self.core, positions);
        Ok(())
    }
}

impl State {
    /// The gate of every append: refuses it (immutable), or hands back the rows to
    /// append. `shard` is the writer handle's shard (`None` for the buffer's own).
    pub(crate) fn admit<'a>(
        &self,
        shard: Option<usize>,
        batch: &'a Batch,
    ) -> Result<Admit<'a>, Attempt<DataError>> {
        if let PolicyEngine::Immutable = &self.policy {
            return Err(DataError::Immutable.into());
        }
        let batch = self.transforms.invert(batch)?;
        match &self.policy {
            PolicyEngine::MaxValue(m) => {
                // A writer handle fills its own shard first; the buffer, shard 0.
                m.place(&self.core, shard.unwrap_or(0), &batch)
                    .map(Admit::Placed)
            }
            PolicyEngine::RoundRobin | PolicyEngine::Immutable => Ok(Admit::Append(batch)),
        }
    }

    /// The gate of an in-place rewrite (`write_at`, `write_all`) of `data`'s first
    /// `rows` rows.
    pub(crate) fn admit_rewrite<'a>(
        &'a self,
        data: &'a Batch,
        rows: usize,
    ) -> Result<Rewrite<'a>, DataError> {
        if let PolicyEngine::Immutable = &self.policy {
            return Err(DataError::Immutable);
        }
        let data = self.transforms.invert(data)?;
        let rerank = match &self.policy {
            PolicyEngine::MaxValue(m) => Some(m.rerank(&self.core, &data, rows)?),
            PolicyEngine::RoundRobin | PolicyEngine::Immutable => None,
        };
        Ok(Rewrite { data, rerank })
    }

    /// The gate of the typed face, whose values are rows already: refused when
    /// immutable; `false` where a max-value writer must rank them first (a typed
    /// buffer is not built with one, but may get one through its untyped buffer or a
    /// checkpoint).
    pub(crate) fn admit_typed(&self) -> Result<bool, DataError> {
        match &self.policy {
            PolicyEngine::Immutable => Err(DataError::Immutable),
            PolicyEngine::RoundRobin => Ok(true),
            PolicyEngine::MaxValue(_) => Ok(false),
        }
    }

    /// Writes a new buffer's first rows past the gate (an immutable buffer's only
    /// rows). ndim 1: the rows are split evenly across the shards, in order, so that a
    /// dataset as large as the capacity fits whole; ndim 2: `[t, envs]` steps, as
    /// `extend` takes them.
    pub(crate) fn write_initial(&self, rows: &Batch) -> Result<(), DataError> {
        if let PolicyEngine::MaxValue(m) = &self.policy {
            return m
                .place(&self.core, 0, rows)
                .map(drop)
                .map_err(Attempt::unswapped);
        }
        let prepared = self.core.prepare(None, rows)?;
        let unswapped =
            |r: Result<Written, Retired>| r.map_err(|r| Attempt::<DataError>::from(r).unswapped());
        let Geometry::Flat { .. } = self.core.storage.geometry() else {
            unswapped(self.core.append(None, &prepared))?;
            return Ok(());
        };
        if self.core.storage.frames().is_some() {
            // A row's stack is rebuilt from the rows before it in its ring, and the
            // rows were checked as one stream: one ring, as every extend of such a
            // buffer (`Core::pick_shard`). Spread, a shard's first rows stacked
            // copies of their own frame, and the row before each split was lost.
            unswapped(self.core.append(Some(0), &prepared))?;
            return Ok(());
        }
        let shards = self.core.storage.shards().len() as u64;
        let n = prepared.steps;
        for k in 0..shards {
            let (a, b) = (n * k / shards, n * (k + 1) / shards);
            if a == b {
                continue;
            }
            let part = Prepared {
                steps: b - a,
                src: prepared.src.rows(a, b),
                priorities: prepared
                    .priorities
                    .as_ref()
                    .map(|p| p[a as usize..b as usize].to_vec()),
            };
            unswapped(self.core.append(Some(k as usize), &part))?;
        }
        Ok(())
    }
}

/// What every handle of one buffer shares.
#[derive(Debug)]
pub(crate) struct StateCell {
    /// The buffer's state. Replaced whole by a swap, under `reconfigure`.
    current: ArcSwap<State>,
    /// The spec of every row: no swap changes it.
    spec: Arc<Spec>,
    /// Held by a swap from its checks to its thaw, and by the cold-path setters whose
    /// values a swap carries over (`set_alpha`, `set_beta`).
    pub(crate) reconfigure: Mutex<()>,
}

impl StateCell {
    pub(crate) fn new(inner: State) -> StateCell {
        StateCell {
            spec: inner.core.storage.spec().clone(),
            current: ArcSwap::new(Arc::new(inner)),
            reconfigure: Mutex::new(()),
        }
    }

    #[inline]
    pub(crate) fn current(&self) -> Guard<State> {
        self.current.load()
    }

    /// Makes `inner` the buffer's state (a swap, under the reconfiguration lock).
    pub(crate) fn publish(&self, inner: State) {
        self.current.store(Arc::new(inner));
    }

    pub(crate) fn spec(&self) -> &Arc<Spec> {
        &self.spec
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use crate::storage::plan::RowOrder;
    use crate::{DType, ReplayBuffer, Spec};

    fn ids(rb: &ReplayBuffer, first: u64, n: usize) -> crate::Batch {
        let mut b = rb.batch([n]);
        b.set("id", &(first..first + n as u64).collect::<Vec<_>>())
            .unwrap();
        b
    }

    /// A rewrite whose row a writer replaced after the draw (lapping the ring) leaves
    /// the newer row alone: its checks (a slice buffer's trajectories) were of the
    /// drawn row. It rewrote the newer row, and a slice buffer's windows then crossed
    /// trajectories under writers and `write_at` together.
    #[test]
    fn an_edit_leaves_a_row_newer_than_its_draw_alone() {
        let spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
        let rb = ReplayBuffer::builder(spec).capacity(4).build().unwrap();
        rb.extend(&ids(&rb, 0, 4)).unwrap();
        let state = rb.state();
        let storage = &state.core.storage;
        let drawn = storage.draw_at(1).unwrap();
        rb.extend(&ids(&rb, 10, 4)).unwrap();
        let data = ids(&rb, 100, 1);
        let src = state.core.source(&data, RowOrder::Flat).unwrap();
        let _editing = storage.enter_edit_all().unwrap();
        assert!(!storage.edit(drawn, &src, 0), "the drawn row is gone");
        let now = storage.draw_at(1).unwrap();
        assert!(storage.edit(now, &src, 0), "the row there now is rewritten");
        drop(_editing);
        drop(src);
        let all = rb.read_all_in_order(None);
        assert_eq!(all.column::<u64>("id").unwrap(), [10, 100, 12, 13]);
    }
}
