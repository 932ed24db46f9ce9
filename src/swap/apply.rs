//! The swap itself (see the module docs of `swap/mod.rs` for its steps): the new
//! configuration checked, the new state made, the old one frozen, copied or kept,
//! replaced, retired and thawed.
//!
//! Layer: api.

use std::sync::Arc;

use super::carry;
use super::config::{Change, Reconfigure};
#[cfg(not(replaybuf_loom))]
use crate::backing::dir::{DirKind, DirMeta};
use crate::buffer::ReplayBuffer;
use crate::builder::{Origin, ReplayBufferBuilder};
use crate::error::{SwapError, SwapErrorKind};
use crate::sampler::{Prioritized, Sampler, SamplerEngine};
use crate::state::State;

/// What a swap will make: the new configuration, and whether its rows stay where they
/// are.
struct SwapTarget {
    builder: ReplayBufferBuilder,
    /// The new state is a view of the old storage's region (no copy).
    in_place: bool,
}

/// Checks `change` against the buffer's current state and swaps it in.
impl Reconfigure<'_> {
    /// Checks the changes and swaps them in. On an error nothing has changed.
    pub fn apply(self) -> Result<(), SwapError> {
        apply(self.buffer, self.change)
    }
}

pub(super) fn apply(buffer: &ReplayBuffer, change: Change) -> Result<(), SwapError> {
    let _reconfiguring = buffer.reconfiguring();
    // Under the lock nobody else publishes: this is the state the swap replaces.
    let old: Arc<State> = Arc::clone(&buffer.state());
    let target = plan(&old, &change)?;
    // What can fail (memory, files) is done before anything is held.
    let fresh = if target.in_place {
        #[cfg(not(replaybuf_loom))]
        if let Some(dir) = &old.memmap {
            // The directory's record follows the configuration (its layout is the same).
            let config = target.builder.config(old.core.seed);
            DirMeta::new(DirKind::Memmap, config)
                .write(dir)
                .map_err(|e| SwapError::new(SwapErrorKind::Persist(e)))?;
        }
        None
    } else {
        let new = target
            .builder
            .clone()
            .build_inner()
            .map_err(SwapError::build)?;
        Some(new)
    };
    // A save holds the policy's lock: one of its hooks swapping is refused first.
    old.core.storage.refuse_reentry();
    let held = old.policy.hold();
    let frozen = old.core.storage.freeze();
    // A copy carries the counters (of sample calls, handles) until the old storage is
    // retired; a swap in place keeps them in the region both storages share.
    let carrying = fresh
        .is_some()
        .then(|| old.core.storage.begin_carry(&frozen));
    let queued = old.core.queued();
    let mut new = match fresh {
        Some(mut new) => {
            carry::carry(&old, &mut new);
            new
        }
        None => in_place(&old, target.builder),
    };
    new.hooks = Arc::clone(&old.hooks);
    new.transforms = Arc::clone(&old.transforms);
    // A queue's rows the swap did not carry will never be taken: their inserts are
    // taken back, as a clear takes back all of them. Counted, a queue limit held no
    // collector back again, and each sample waited out the queue's grace for rows that
    // would never come, and failed.
    let dropped = queued
        .zip(new.core.queued())
        .map(|(q, n)| q.saturating_sub(n));
    if let (Some(limiter), Some(dropped)) = (&buffer.limiter, dropped.filter(|&d| d > 0)) {
        limiter.refund_inserts(dropped);
    }
    buffer.cell.publish(new);
    old.core.storage.retire(&frozen);
    drop(carrying);
    drop(frozen);
    drop(held);
    Ok(())
}

/// The configuration the buffer will have, checked, and how it gets there.
fn plan(old: &State, change: &Change) -> Result<SwapTarget, SwapError> {
    if old.core.storage.is_shared() {
        // Every process holds its own state over the region: one cannot swap alone.
        return Err(SwapError::new(SwapErrorKind::Shared));
    }
    let mut b = ReplayBufferBuilder::from_config(&old.config)
        .map_err(|_| SwapError::new(SwapErrorKind::Config))?;
    b.settings.seed = Some(old.core.seed);
    b.settings.sampler = match &change.sampler {
        Some(s) => s.clone(),
        // The same sampler, at the alpha and beta it runs with now.
        None => live(b.settings.sampler.clone(), &old.core.sampler),
    };
    if let Some(w) = &change.writer {
        b.settings.write_policy = w.clone();
    }
    b.priority_key = match &change.priority_key {
        Some(k) => Some(k.clone()),
        None if prioritized(&b.settings.sampler).is_some() => b.priority_key.take(),
        None => None,
    };
    match &change.storage {
        Some(storage) => storage.apply_to(&mut b),
        // Kept in place (or refused below if a file-backed storage would have to move).
        None => b.memmap = old.memmap.clone(),
    }
    b.check().map_err(SwapError::build)?;
    let current = live(
        ReplayBufferBuilder::from_config(&old.config)
            .map_err(|_| SwapError::new(SwapErrorKind::Config))?
            .settings
            .sampler,
        &old.core.sampler,
    );
    let in_place = change.storage.is_none() && same_region(&current, &b.settings.sampler);
    if !in_place && old.core.storage.frames().is_some() {
        // The carry copies rows one by one into fresh steps: each stack would restart
        // its episode, and the newest step of each lane, which no row holds yet, would
        // be lost (and the collector's next step refused as not following it).
        return Err(SwapError::new(SwapErrorKind::Frames));
    }
    if change.storage.is_none() && old.memmap.is_some() {
        let config = b.config(old.core.seed);
        if !in_place || config.layout_hash() != old.config.layout_hash() {
            return Err(SwapError::new(SwapErrorKind::FileBacked));
        }
    }
    Ok(SwapTarget {
        builder: b,
        in_place,
    })
}

/// The new state over the old storage's region (`old` is frozen).
fn in_place(old: &State, builder: ReplayBufferBuilder) -> State {
    let checked = builder
        .check()
        .expect("replaybuf internal error: a checked configuration no longer checks");
    let config = builder.config(old.core.seed);
    let sampler = builder.settings.sampler.clone();
    let new = builder.assemble(
        checked,
        config,
        old.core.storage.view(),
        old.core.seed,
        Origin::Reused,
    );
    // The region keeps alpha and beta: a new sampler's go in. Priority updaters are
    // held out by the freeze, so the masses can be recomputed here.
    if let (Some(state), Some(p)) = (new.core.sampler.prioritized(), prioritized(&sampler)) {
        if state.alpha() != p.alpha {
            let _ = state.set_alpha(p.alpha, &new.core.storage.trees());
        }
        let _ = state.set_beta(p.beta);
    }
    new
}

/// The prioritized settings of `sampler`, slices' included.
fn prioritized(sampler: &Sampler) -> Option<&Prioritized> {
    match sampler {
        Sampler::Prioritized(p) => Some(p),
        Sampler::Slice(s) => s.prioritized.as_ref().map(|(p, _)| p),
        _ => None,
    }
}

/// `sampler` with the alpha and beta `engine` runs with now (`set_alpha`, `set_beta`).
fn live(mut sampler: Sampler, engine: &SamplerEngine) -> Sampler {
    if let Some(state) = engine.prioritized() {
        let p = match &mut sampler {
            Sampler::Prioritized(p) => Some(p),
            Sampler::Slice(s) => s.prioritized.as_mut().map(|(p, _)| p),
            _ => None,
        };
        if let Some(p) = p {
            p.alpha = state.alpha();
            p.beta = state.beta();
        }
    }
    sampler
}

/// Whether a buffer sampled by `old` can be sampled by `new` over the same region:
/// neither keeps anything in it (uniform, without replacement), or they differ only
/// in alpha and beta, which the region holds.
fn same_region(old: &Sampler, new: &Sampler) -> bool {
    let plain = |s: &Sampler| {
        matches!(
            s,
            Sampler::Uniform(_) | Sampler::WithoutReplacement(_) | Sampler::Fifo(_)
        )
    };
    if plain(old) && plain(new) {
        return true;
    }
    let bare = |s: &Sampler| {
        let mut s = s.clone();
        let p = match &mut s {
            Sampler::Prioritized(p) => Some(p),
            Sampler::Slice(s) => s.prioritized.as_mut().map(|(p, _)| p),
            _ => None,
        };
        if let Some(p) = p {
            p.alpha = 0.0;
            p.beta = 0.0;
        }
        s
    };
    bare(old) == bare(new)
}
