//! Write policies at work: the gate every write to a buffer passes before it touches
//! the storage.
//!
//! [`WritePolicy`] is what a user chooses; [`PolicyEngine`] is that choice with its running
//! state, kept in the buffer's shared `State`. Every write path asks
//! [`State::admit`](crate::state::State::admit) (appends: `add`, `extend`, a
//! [`Writer`](crate::Writer)'s) or
//! [`State::admit_rewrite`](crate::state::State::admit_rewrite) (`write_all`) first:
//!
//! - round robin lets the rows through to the ordinary append at the shard's cursor;
//! - immutable refuses them with
//!   [`DataError::Immutable`](crate::error::DataError::Immutable) before anything
//!   changes;
//! - max value places them itself (`max_value.rs`), or reports them rejected;
//!
//! and on the way the buffer's inverse transforms run on a copy of the rows
//! (`transform.rs`).
//!
//! Layer: gates.

use std::borrow::Cow;

use crate::batch::Batch;
use crate::core::Core;
use crate::core::Written;
use crate::error::BuildError;
use crate::key::Key;
use crate::max_value::{Held, MaxValue, Rerank};
use crate::sampler::Reduction;
use crate::sampler::Sampler;
use crate::spec::Spec;

/// How rows enter the storage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WritePolicy {
    /// Append at the ring's cursor, evicting the oldest row of the shard (TorchRL
    /// `RoundRobinWriter`).
    #[default]
    RoundRobin,
    /// A read-only dataset (TorchRL `ImmutableDatasetWriter`): every write (`add`,
    /// `extend`, a [`Writer`](crate::Writer)'s, `write_all`, the typed and list faces') is refused with
    /// [`DataError::Immutable`](crate::error::DataError::Immutable) and changes nothing. Its rows come from
    /// [`ReplayBufferBuilder::build_from`](crate::ReplayBufferBuilder::build_from).
    Immutable,
    /// Keep the rows that rank highest (TorchRL `TensorDictMaxValueWriter`): each row's
    /// rank is its `rank_key` field reduced to one number by `reduction`. While the
    /// storage has room every row enters; then a row replaces the lowest-ranked stored
    /// row only if it ranks strictly higher, and is otherwise rejected ([`Written`]
    /// reports which). Needs an ndim-1 storage and a uniform or without-replacement
    /// sampler: the prioritized trees and the slice sampler's trajectories follow the
    /// write cursor, and this policy writes rows in place.
    MaxValue {
        /// The numeric field ranking the rows (TorchRL's default is `"reward"`).
        rank_key: Key,
        /// How a field of several values reduces to one rank.
        reduction: Reduction,
    },
}

impl WritePolicy {
    /// Keep the top rows by the sum of `rank_key` (TorchRL's defaults).
    pub fn max_value(rank_key: impl Into<Key>) -> WritePolicy {
        WritePolicy::MaxValue {
            rank_key: rank_key.into(),
            reduction: Reduction::Sum,
        }
    }
}

/// A write policy with its running state.
#[derive(Debug, Default)]
pub(crate) enum PolicyEngine {
    /// Appends at the cursor.
    #[default]
    RoundRobin,
    /// Refuses every write.
    Immutable,
    /// Keeps the highest-ranked rows.
    MaxValue(MaxValue),
}

impl PolicyEngine {
    /// The running form of `policy` for a buffer of these choices, checked.
    pub(crate) fn new(
        policy: WritePolicy,
        spec: &Spec,
        ndim: usize,
        sampler: &Sampler,
        capacity: usize,
    ) -> Result<PolicyEngine, BuildError> {
        Ok(match policy {
            WritePolicy::RoundRobin => PolicyEngine::RoundRobin,
            WritePolicy::Immutable => PolicyEngine::Immutable,
            WritePolicy::MaxValue {
                rank_key,
                reduction,
            } => PolicyEngine::MaxValue(MaxValue::new(
                &rank_key, reduction, spec, ndim, sampler, capacity,
            )?),
        })
    }

    /// Catches up with rows that came from elsewhere (a checkpoint, a reopened file): a
    /// max-value writer ranks them.
    pub(crate) fn reload(&self, core: &Core) {
        if let PolicyEngine::MaxValue(m) = self {
            m.rerank_stored(core);
        }
    }

    /// Runs `empty` as the policy needs: a max-value writer forgets its ranks with the
    /// rows, under its lock.
    pub(crate) fn emptying<R>(&self, empty: impl FnOnce() -> R) -> R {
        match self {
            PolicyEngine::MaxValue(m) => m.emptying(empty),
            PolicyEngine::RoundRobin | PolicyEngine::Immutable => empty(),
        }
    }

    /// Holds the policy's lock, if it has one (a max-value writer's): no placement is
    /// under way while the guard lives. A swap holds it around its freeze.
    pub(crate) fn hold(&self) -> Option<Held<'_>> {
        match self {
            PolicyEngine::MaxValue(m) => Some(m.hold()),
            PolicyEngine::RoundRobin | PolicyEngine::Immutable => None,
        }
    }
}

/// The gate's answer to an in-place rewrite: the rows to write, and for a max-value
/// buffer its lock, held until the rewrite is done and re-ranked.
pub(crate) struct Rewrite<'a> {
    pub(crate) data: Cow<'a, Batch>,
    pub(crate) rerank: Option<Rerank<'a>>,
}

impl Rewrite<'_> {
    /// The rewrite of `positions` (row `r` of the data at `positions[r]`) is done.
    pub(crate) fn finish(self, core: &Core, positions: &[u64]) {
        if let Some(rerank) = self.rerank {
            rerank.finish(core, positions);
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
