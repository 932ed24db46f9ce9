//! Write policies at work: the gate every write to a buffer passes before it touches
//! the storage.
//!
//! [`WritePolicy`] is what a user chooses; [`Policy`] is that choice with its running
//! state, kept in the buffer's shared `Inner`. Every write path asks [`Inner::admit`]
//! (appends: `add`, `extend`, a [`Writer`](crate::Writer)'s) or
//! [`Inner::admit_rewrite`] (`write_all`) first:
//!
//! - round robin lets the rows through to the ordinary append at the shard's cursor;
//! - immutable refuses them with [`DataError::Immutable`] before anything changes;
//! - max value places them itself (`max_value.rs`), or reports them rejected;
//!
//! and on the way the buffer's inverse transforms run on a copy of the rows
//! (`transform.rs`).

use std::borrow::Cow;

use crate::batch::Batch;
use crate::buffer::{Inner, Prepared, ReplayBuffer};
use crate::builder::ReplayBufferBuilder;
use crate::error::{BuildError, BuildErrorKind, DataError};
use crate::max_value::{Held, MaxValue, Rerank};
use crate::sampler::Sampler;
use crate::spec::Spec;
use crate::storage::freeze::Retired;
use crate::storage::geometry::Geometry;
use crate::storage::plan::{Source, SrcCol};
use crate::swap::Attempt;
use crate::writer::{WritePolicy, Written};

/// A write policy with its running state.
#[derive(Debug, Default)]
pub(crate) enum Policy {
    /// Appends at the cursor.
    #[default]
    RoundRobin,
    /// Refuses every write.
    Immutable,
    /// Keeps the highest-ranked rows.
    MaxValue(MaxValue),
}

impl Policy {
    /// The running form of `policy` for a buffer of these choices, checked.
    pub(crate) fn new(
        policy: WritePolicy,
        spec: &Spec,
        ndim: usize,
        sampler: &Sampler,
        capacity: usize,
    ) -> Result<Policy, BuildError> {
        Ok(match policy {
            WritePolicy::RoundRobin => Policy::RoundRobin,
            WritePolicy::Immutable => Policy::Immutable,
            WritePolicy::MaxValue {
                rank_key,
                reduction,
            } => Policy::MaxValue(MaxValue::new(
                &rank_key, reduction, spec, ndim, sampler, capacity,
            )?),
        })
    }

    /// Catches up with rows that came from elsewhere (a checkpoint, a reopened file): a
    /// max-value writer ranks them.
    pub(crate) fn reload(&self, inner: &Inner) {
        if let Policy::MaxValue(m) = self {
            m.rerank_stored(inner);
        }
    }

    /// Runs `empty` as the policy needs: a max-value writer forgets its ranks with the
    /// rows, under its lock.
    pub(crate) fn emptying<R>(&self, empty: impl FnOnce() -> R) -> R {
        match self {
            Policy::MaxValue(m) => m.emptying(empty),
            Policy::RoundRobin | Policy::Immutable => empty(),
        }
    }

    /// Holds the policy's lock, if it has one (a max-value writer's): no placement is
    /// under way while the guard lives. A swap holds it around its freeze.
    pub(crate) fn hold(&self) -> Option<Held<'_>> {
        match self {
            Policy::MaxValue(m) => Some(m.hold()),
            Policy::RoundRobin | Policy::Immutable => None,
        }
    }
}

/// The gate's answer to an in-place rewrite: the rows to write, and for a max-value
/// buffer its lock, held until the rewrite is done and re-ranked.
pub(crate) struct Rewrite<'a> {
    pub(crate) data: Cow<'a, Batch>,
    rerank: Option<Rerank<'a>>,
}

impl Rewrite<'_> {
    /// The rewrite of positions `0..end` is done.
    pub(crate) fn finish(self, inner: &Inner, end: u64) {
        if let Some(rerank) = self.rerank {
            rerank.finish(inner, end);
        }
    }
}

/// What the gate decided for an append.
pub(crate) enum Admit<'a> {
    /// Append these rows at the cursor: the caller's batch, or its inverse-transformed
    /// copy.
    Append(Cow<'a, Batch>),
    /// The policy placed the rows itself; here is where they went.
    Placed(Written),
}

impl Inner {
    /// The gate of every append: refuses it (immutable), or hands back the rows to
    /// append. `shard` is the writer handle's shard (`None` for the buffer's own).
    pub(crate) fn admit<'a>(
        &self,
        shard: Option<usize>,
        batch: &'a Batch,
    ) -> Result<Admit<'a>, Attempt<DataError>> {
        if let Policy::Immutable = &self.policy {
            return Err(DataError::Immutable.into());
        }
        let batch = self.transforms.invert(batch)?;
        match &self.policy {
            Policy::MaxValue(m) => {
                // A writer handle fills its own shard first; the buffer, shard 0.
                m.place(self, shard.unwrap_or(0), &batch).map(Admit::Placed)
            }
            Policy::RoundRobin | Policy::Immutable => Ok(Admit::Append(batch)),
        }
    }

    /// The gate of an in-place rewrite (`write_all`).
    pub(crate) fn admit_rewrite<'a>(&'a self, data: &'a Batch) -> Result<Rewrite<'a>, DataError> {
        if let Policy::Immutable = &self.policy {
            return Err(DataError::Immutable);
        }
        let data = self.transforms.invert(data)?;
        let rerank = match &self.policy {
            Policy::MaxValue(m) => Some(m.rerank(self, &data)?),
            Policy::RoundRobin | Policy::Immutable => None,
        };
        Ok(Rewrite { data, rerank })
    }

    /// The gate of the typed face, whose values are rows already: refused when
    /// immutable (a typed buffer cannot be built with a max-value writer).
    pub(crate) fn admit_typed(&self) -> Result<(), DataError> {
        match &self.policy {
            Policy::Immutable => Err(DataError::Immutable),
            Policy::RoundRobin | Policy::MaxValue(_) => Ok(()),
        }
    }

    /// Writes a new buffer's first rows past the gate (an immutable buffer's only
    /// rows). ndim 1: the rows are split evenly across the shards, in order, so that a
    /// dataset as large as the capacity fits whole; ndim 2: `[t, envs]` steps, as
    /// `extend` takes them.
    fn write_initial(&self, rows: &Batch) -> Result<(), DataError> {
        if let Policy::MaxValue(m) = &self.policy {
            return m.place(self, 0, rows).map(drop).map_err(Attempt::unswapped);
        }
        let prepared = self.prepare(None, rows)?;
        let unswapped =
            |r: Result<Written, Retired>| r.map_err(|r| Attempt::<DataError>::from(r).unswapped());
        let Geometry::Flat { .. } = self.storage.geometry() else {
            unswapped(self.append(None, &prepared))?;
            return Ok(());
        };
        let shards = self.storage.shards().len() as u64;
        let n = prepared.steps;
        for k in 0..shards {
            let (a, b) = (n * k / shards, n * (k + 1) / shards);
            if a == b {
                continue;
            }
            let part = Prepared {
                steps: b - a,
                src: rows_of(&prepared.src, a, b),
                priorities: prepared
                    .priorities
                    .as_ref()
                    .map(|p| p[a as usize..b as usize].to_vec()),
            };
            unswapped(self.append(Some(k as usize), &part))?;
        }
        Ok(())
    }
}

/// Rows `a..b` of an ndim-1 (`Flat`) source, as a source of their own.
pub(crate) fn rows_of<'a>(src: &Source<'a>, a: u64, b: u64) -> Source<'a> {
    let (a, b) = (a as usize, b as usize);
    Source {
        cols: src
            .cols
            .iter()
            .map(|c| SrcCol {
                data: &c.data[a * c.bytes..b * c.bytes],
                ..*c
            })
            .collect(),
        order: src.order,
    }
}

impl ReplayBufferBuilder {
    /// Builds the buffer and writes `rows` into it before any handle exists: how a
    /// read-only dataset ([`WritePolicy::Immutable`]) gets its rows, and a quick way
    /// to start any buffer from data. ndim 1: `[n]` rows, spread evenly over the
    /// shards in order (so `n` up to the capacity all stay); ndim 2: `[t, envs]` steps
    /// (or `[envs, t]` with `dim_extend = 1`).
    ///
    /// ```
    /// use replaybuf::{DType, DataError, ReplayBuffer, Spec, WritePolicy};
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [2]).build()?;
    /// let mut rows = replaybuf::Batch::zeros(spec.clone(), [100]);
    /// rows.column_mut::<f32>("obs")?.fill(1.0);
    /// let dataset = ReplayBuffer::builder(spec)
    ///     .capacity(100)
    ///     .writer(WritePolicy::Immutable)
    ///     .build_from(&rows)?;
    /// assert_eq!(dataset.len(), 100);
    /// assert_eq!(dataset.extend(&rows).unwrap_err(), DataError::Immutable);
    /// assert_eq!(dataset.sample(8)?.column::<f32>("obs")?, &[1.0; 16]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_from(self, rows: &Batch) -> Result<ReplayBuffer, BuildError> {
        let rb = self.build()?;
        rb.inner()
            .write_initial(rows)
            .map_err(|e| BuildError::new(BuildErrorKind::Rows(e)))?;
        Ok(rb)
    }
}
