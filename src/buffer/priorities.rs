//! A prioritized buffer's priorities, from the API: updates by index and generation,
//! alpha and beta.
//!
//! Layer: api.

use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::core::Attempt;
use crate::core::{column_f64, Replaced};
use crate::error::{PriorityError, PriorityUpdate};
use crate::sampler::prioritized::Priorities;
use crate::sumtree::tree::Tree;

/// A prioritized buffer's masses ([`ReplayBuffer::priority_mass`]), in
/// `(priority + eps)^alpha` units.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityMass {
    /// The sum over the stored rows (0 when empty).
    pub total: f64,
    /// The smallest non-zero one (0 when empty).
    pub min: f64,
}

impl ReplayBuffer {
    /// Sets the priorities of sampled rows, from any thread, at any time.
    ///
    /// `index` and `generation` come from a sampled batch ([`Batch::index`],
    /// [`Batch::generations`]); `priority` holds one value per row, or `k` per row
    /// (reduced by the sampler's reduction). A row that a collector has replaced (or
    /// that was emptied) since it was sampled is skipped and counted as stale: its
    /// priority would belong to another row. A padding row after a short slice (index
    /// [`PADDING_INDEX`](crate::PADDING_INDEX)) is skipped and counted nowhere. NaN,
    /// infinite or negative priorities, slices that do not line up, indices out of
    /// range, and rows this buffer never held (an unwritten slot, or a generation
    /// ahead of the slot's) are refused, and then nothing is changed.
    ///
    /// Skipping replaced rows, rather than refusing the update, is what a learner
    /// racing collectors needs: with a writer lapping a full ring, some rows of most
    /// batches are replaced between sample and update. [`update_priority_all`] refuses
    /// instead.
    ///
    /// A thread that updates batch after batch allocates nothing once warm: its working
    /// room is kept for the next batch (up to about 8,000 rows' worth).
    ///
    /// [`update_priority_all`]: ReplayBuffer::update_priority_all
    pub fn update_priority(
        &self,
        index: &[u64],
        generation: &[u64],
        priority: &[f64],
    ) -> Result<PriorityUpdate, PriorityError> {
        self.retrying(|inner| {
            inner
                .core
                .update_priority(index, generation, priority, Replaced::Skip)
        })
    }

    /// Like [`update_priority`], but all or nothing: if any row has been replaced
    /// since it was sampled, returns [`PriorityError::Replaced`] and changes nothing.
    ///
    /// The rows are checked together, then set. A collector may still replace a row
    /// between the two; its update is then dropped (counted in
    /// [`PriorityUpdate::stale`]), as if the update had come first and the new row
    /// had reset the slot's priority after it.
    ///
    /// [`update_priority`]: ReplayBuffer::update_priority
    pub fn update_priority_all(
        &self,
        index: &[u64],
        generation: &[u64],
        priority: &[f64],
    ) -> Result<PriorityUpdate, PriorityError> {
        self.retrying(|inner| {
            inner
                .core
                .update_priority(index, generation, priority, Replaced::Refuse)
        })
    }

    /// Sets priorities from a sampled batch's priority field (TorchRL's
    /// `update_tensordict_priority`): the batch's `index`, `generations` and its values
    /// of the builder's `priority_key`.
    pub fn update_priority_from(&self, batch: &Batch) -> Result<PriorityUpdate, PriorityError> {
        self.retrying(|inner| {
            inner.core.prioritized()?;
            let field = inner
                .core
                .priority_field
                .ok_or(PriorityError::NoPriorityField)?;
            let key = inner.core.storage.spec().fields()[field].key();
            let values = column_f64(batch, key).ok_or(PriorityError::NoPriorityField)?;
            inner
                .core
                .update_priority(batch.index(), batch.generations(), &values, Replaced::Skip)
        })
    }

    /// The priority exponent (`None` unless prioritized).
    pub fn alpha(&self) -> Option<f64> {
        self.state()
            .core
            .sampler
            .prioritized()
            .map(Priorities::alpha)
    }

    /// The sampler's masses now (`None` unless prioritized): the sum over the stored
    /// rows of `(priority + eps)^alpha`, which a row's chance of being drawn is its
    /// share of, and the smallest of them, which its importance weight
    /// `(min / mass)^beta` is taken against. Several buffers that each sample part of a
    /// batch (shards across machines, as `replaybuf.ray` keeps them) split it by their
    /// totals, and bring their weights to one scale with their minima. A snapshot:
    /// priorities set meanwhile move both.
    pub fn priority_mass(&self) -> Option<PriorityMass> {
        let inner = self.state();
        let state = inner.core.sampler.prioritized()?;
        let trees = inner.core.storage.trees();
        let mass = state.mass_fn(trees.first()?);
        let total: u128 = trees.iter().map(|t| u128::from(t.total())).sum();
        let min = trees.iter().map(Tree::min).min().unwrap_or(u64::MAX);
        Some(PriorityMass {
            total: mass.value_of(total as f64),
            min: if total == 0 {
                0.0
            } else {
                mass.value_of(min as f64)
            },
        })
    }

    /// The importance-correction exponent (`None` unless prioritized).
    pub fn beta(&self) -> Option<f64> {
        self.state()
            .core
            .sampler
            .prioritized()
            .map(Priorities::beta)
    }

    /// Changes `beta` for the samples that follow (annealing).
    pub fn set_beta(&self, beta: f64) -> Result<(), PriorityError> {
        // A swap carries beta over: it does not run meanwhile.
        let _reconfiguring = self.reconfiguring();
        self.state().core.prioritized()?.set_beta(beta)
    }

    /// Changes `alpha`, recomputing every row's mass from its stored priority: a pass
    /// over the trees, so a cold-path call. Samples and updates may run meanwhile.
    pub fn set_alpha(&self, alpha: f64) -> Result<(), PriorityError> {
        // A swap carries alpha over: it does not run meanwhile.
        let _reconfiguring = self.reconfiguring();
        let inner = self.state();
        let state = inner.core.prioritized()?;
        let _inside = inner
            .core
            .storage
            .enter_update()
            .map_err(|r| Attempt::<PriorityError>::from(r).unswapped())?;
        let trees = inner.core.storage.trees();
        state.set_alpha(alpha, &trees)
    }

    /// The priority of the live row at `index`, as last set (`None` if the buffer is
    /// not prioritized or the position holds no live row).
    pub fn priority(&self, index: u64) -> Option<f64> {
        let inner = self.state();
        inner.core.sampler.prioritized()?;
        let (k, pos, lane) = inner.core.storage.geometry().locate(index)?;
        let shard = &inner.core.storage.shards()[k as usize];
        let seq = shard.seq_at(pos)?;
        let tree = &inner.core.storage.trees()[k as usize];
        let leaf = (pos * shard.ring().width + lane) as usize;
        let lap = (seq / shard.ring().steps) as u32;
        if !tree.leaf(leaf).is_of(lap) {
            return None;
        }
        tree.raw(leaf, lap)
    }
}
