//! Writing a prioritized buffer's leaves: priority updates, new rows, `set_alpha`, and
//! the passes a rescale of the masses makes (`mass_scale.rs`), all keeping each leaf
//! the mass of its row's raw priority under the buffer's mass function.
//!
//! # Memory ordering
//!
//! A leaf is a cache of its row's raw priority's mass under the buffer's mass function
//! (the scale word and `alpha`). Every writer of leaves (a collector's new rows, a
//! priority update, a pass after `set_alpha` or a rescale) reads the scale word, then
//! `alpha`, computes, writes, and reads the scale word again: if it moved, the writer
//! brings the leaves it wrote to the new function from their raw words, and repeats.
//! Whoever moves the word (storing `alpha` first) then passes over every leaf of every
//! tree. The two sides meet as in Dekker's protocol: a writer's leaf writes, a `SeqCst`
//! fence, its second read of the word; a mover's change of the word, a `SeqCst` fence,
//! its pass (`State::word_after_writes`, `State::move_scale`). Of the two fences,
//! one comes first in their single total order: if the writer's does, the pass reads
//! its leaves; if the mover's does, the writer's second read sees the new word and it
//! redoes its leaves. (The fences, not `SeqCst` on the accesses alone, are what loom
//! models: it treats a `SeqCst` load as `Acquire`, and at preemption bound 3 found
//! the writer's stale second read that the fences forbid.) Updates write the raw word
//! before the leaf and follow it after (see
//! `sumtree/tree.rs`). Once writes stop, every leaf holds its raw priority's mass under
//! the last function: a collector racing `set_alpha` cannot leave a leaf of the old
//! alpha behind.
//!
//! Layer: algos.

use super::mass_scale::{MassFn, Scale, TooHeavy};
use super::prioritized::{valid_alpha, Priorities};
use crate::error::PriorityError;
use crate::storage::layout::Global;
use crate::sumtree::tree::{room_bytes, DeltaRoom, Tree, Update};
use crate::sumtree::{priority_in, quantize, raw_bits, Leaf};
use crate::sync::{fence, Ordering};

/// Leaves re-massed at once by a pass over a tree: one check of the scale word each.
const REMASS_CHUNK_LEAVES: usize = 4096;

/// The working room of [`Priorities::update`]: kept by its caller from one batch to
/// the next, so that a learner's updates allocate nothing once warm.
#[derive(Debug, Default)]
pub(crate) struct UpdateRoom {
    /// The batch's updates, their masses worked out.
    items: Vec<Update>,
    /// Their priorities as the raw words keep them, and their masses' powers, taken
    /// together (`MassFn::masses`).
    priorities: Vec<f64>,
    powers: Vec<f64>,
    deltas: DeltaRoom,
}

impl UpdateRoom {
    /// Empties the room and makes it room for batches of up to `rows` rows: a caller
    /// that splits a batch among trees makes room for the whole batch first, so that
    /// another split of a batch as large never grows it.
    pub(crate) fn clear_for(&mut self, rows: usize) {
        self.items.clear();
        self.items.reserve(rows);
        for room in [&mut self.priorities, &mut self.powers] {
            room.clear();
            room.reserve(rows);
        }
        self.deltas.clear_for(rows);
    }

    /// The room's capacity in bytes, for a caller that keeps rooms to bound.
    pub(crate) fn bytes(&self) -> usize {
        room_bytes(&self.items)
            + room_bytes(&self.priorities)
            + room_bytes(&self.powers)
            + self.deltas.bytes()
    }
}

impl Priorities {
    /// The scale word (see the module's ordering notes).
    fn scale(&self) -> Scale {
        Scale::from_bits(self.word(Global::MassScale).load(Ordering::SeqCst))
    }

    /// The scale word, read again after writing leaves under an earlier read of it:
    /// the writer's side of the module's fence pairing.
    fn word_after_writes(&self) -> Scale {
        fence(Ordering::SeqCst);
        self.scale()
    }

    /// Replaces the scale word `from` by `to`; whether it was still `from`. A move is
    /// followed by a fence before the pass it owes reads any leaf (the mover's side of
    /// the module's fence pairing).
    fn move_scale(&self, from: Scale, to: Scale) -> bool {
        let moved = self
            .word(Global::MassScale)
            .compare_exchange(from.bits(), to.bits(), Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if moved {
            fence(Ordering::SeqCst);
        }
        moved
    }

    /// The mass function now, for trees like `tree` (every tree of a storage has the
    /// same bound): the scale word, then alpha.
    pub(crate) fn mass_fn(&self, tree: &Tree<'_>) -> MassFn {
        let scale = self.scale();
        MassFn::new(
            scale,
            self.alpha(),
            self.config.eps,
            tree.layout().value_max,
        )
    }

    /// Stores a new alpha and moves the scale word's epoch, then brings every leaf of
    /// `trees` to it. Even the same alpha again moves the epoch and passes over the
    /// leaves.
    pub(crate) fn set_alpha(&self, alpha: f64, trees: &[Tree<'_>]) -> Result<(), PriorityError> {
        if !valid_alpha(alpha) {
            return Err(PriorityError::InvalidSetting {
                name: "alpha",
                value: alpha,
            });
        }
        // Alpha first: a writer that reads the new word reads the new alpha after it.
        self.word(Global::Alpha)
            .store(alpha.to_bits(), Ordering::SeqCst);
        loop {
            let scale = self.scale();
            if self.move_scale(scale, scale.bumped()) {
                break;
            }
        }
        self.remass(trees);
        self.raise_if_light(trees);
        Ok(())
    }

    /// Lowers the scale so that a mass `heavy` (too heavy under `f`) fits, unless
    /// another writer lowered it enough already; whether this call moved it (and so
    /// owes a pass over every leaf).
    fn lower_for(&self, f: &MassFn, heavy: TooHeavy) -> bool {
        loop {
            let now = self.scale();
            match f.lowered_for(now, heavy) {
                None => return false,
                Some(to) if self.move_scale(now, to) => return true,
                Some(_) => {}
            }
        }
    }

    /// After a write: raises the scale if the buffer's total mass has fallen below the
    /// low-water mark (see `mass_scale.rs`), and passes over every leaf if it did.
    fn raise_if_light(&self, trees: &[Tree<'_>]) {
        let Some(first) = trees.first() else {
            return;
        };
        let total: u128 = trees.iter().map(|t| u128::from(t.total())).sum();
        let f = self.mass_fn(first);
        if !f.is_light(total) {
            return;
        }
        let new_row = quantize(self.new_row_priority(trees));
        if let Some(to) = f.raised_for(total, new_row) {
            // Another writer that moved the word first decides instead.
            if self.move_scale(f.scale(), to) {
                self.remass(trees);
            }
        }
    }

    /// Brings every leaf of `trees` to the mass function now, a chunk at a time,
    /// lowering the scale for a priority too heavy for it; again from the start if this
    /// pass lowered it.
    pub(crate) fn remass(&self, trees: &[Tree<'_>]) {
        let mut chunk = ChunkMasses::default();
        let mut again = true;
        while again {
            again = false;
            for tree in trees {
                let leaves = tree.layout().leaves;
                for first in (0..leaves).step_by(REMASS_CHUNK_LEAVES) {
                    let n = REMASS_CHUNK_LEAVES.min(leaves - first);
                    let mut f = self.mass_fn(tree);
                    loop {
                        let mut heavy = None;
                        let raws = (first..first + n).map(|i| tree.raw_tagged(i).1);
                        chunk.fill(&f, raws.map(|p| p.unwrap_or(0.0)));
                        tree.remass_run(first, n, |i, p| {
                            keep_heavy(chunk.mass(&f, i - first, p), &mut heavy)
                        });
                        if let Some(h) = heavy {
                            again |= self.lower_for(&f, h);
                        } else if self.word_after_writes() == f.scale() {
                            break;
                        }
                        f = self.mass_fn(tree);
                    }
                }
            }
        }
    }

    /// After leaves were written under `f`, the heaviest of them `heaviest`: while the
    /// scale word is no longer `f`'s, brings them (`redo`, given the mass of a
    /// priority) to the function now. Then the pass a lowering owes (`owed`, or one
    /// made here), and a raise if the buffer is light: looked at only if the write
    /// could have made it so (no mass it wrote reaches the low-water mark), so that a
    /// write of ordinary masses reads no tree roots that other shards' writers change.
    fn settle(
        &self,
        trees: &[Tree<'_>],
        tree: &Tree<'_>,
        mut f: MassFn,
        heaviest: u64,
        mut owed: bool,
        mut redo: impl FnMut(&mut dyn FnMut(usize, f64) -> Option<u64>),
    ) {
        let may_be_light = f.under_low_water(heaviest);
        let moved = self.word_after_writes() != f.scale();
        // A priority too heavy for `f` moves the word (here or in another writer),
        // so the loop goes round again.
        while self.word_after_writes() != f.scale() {
            f = self.mass_fn(tree);
            let mut heavy = None;
            redo(&mut |_, p| keep_heavy(f.mass(p), &mut heavy));
            if let Some(h) = heavy {
                owed |= self.lower_for(&f, h);
            }
        }
        if owed {
            self.remass(trees);
        }
        if may_be_light || moved {
            self.raise_if_light(trees);
        }
    }

    /// Recomputes every leaf of `trees` with plain stores, for a region nobody else
    /// uses (a recovery, a load): leaf `i` of tree `k` gets the mass of `row(k, i)`'s
    /// priority, if it holds a live row (`(lap, priority)`), and is emptied otherwise.
    /// The scale stays (so a loaded checkpoint draws as the original would), unless a
    /// priority is too heavy for it.
    pub(crate) fn rebuild(
        &self,
        trees: &[Tree<'_>],
        row: impl Fn(usize, usize) -> Option<(u32, f64)>,
    ) {
        let Some(first) = trees.first() else {
            return;
        };
        let mut chunk = ChunkMasses::default();
        loop {
            let f = self.mass_fn(first);
            let mut heavy = None;
            for (k, tree) in trees.iter().enumerate() {
                let leaves = tree.layout().leaves;
                // A chunk's masses together, as a pass takes them: the tree asks for
                // its leaves in order.
                tree.rebuild(|i| {
                    let at = i % REMASS_CHUNK_LEAVES;
                    if at == 0 {
                        let rows = i..(i + REMASS_CHUNK_LEAVES).min(leaves);
                        chunk.fill(&f, rows.map(|j| row(k, j).map_or(0.0, |(_, p)| p)));
                    }
                    match row(k, i) {
                        Some((lap, p)) => Leaf::new(
                            lap,
                            keep_heavy(chunk.mass(&f, at, p), &mut heavy).unwrap_or(0),
                        ),
                        None => Leaf::EMPTY,
                    }
                });
            }
            match heavy {
                None => return,
                Some(h) => {
                    self.lower_for(&f, h);
                }
            }
        }
    }

    /// Sets the priorities of `rows` of tree `k` (`(leaf, lap, p)` each) whose leaves
    /// and raw words still belong to rows of those laps; `applied` receives which did.
    /// Each raw word is set before its leaf; a leaf whose raw word another writer
    /// changed meanwhile follows that word, and all of them follow a mass function
    /// that changed meanwhile (see the module's ordering notes). `room` is the
    /// caller's, any left from an earlier batch.
    pub(crate) fn update(
        &self,
        trees: &[Tree<'_>],
        k: usize,
        rows: &[(usize, u32, f64)],
        applied: &mut [bool],
        room: &mut UpdateRoom,
    ) {
        if let Some(top) = rows.iter().map(|&(_, _, p)| p).reduce(f64::max) {
            self.saw(top);
        }
        let tree = &trees[k];
        let mut owed = false;
        let UpdateRoom {
            items,
            priorities,
            powers,
            deltas,
        } = room;
        let mut heaviest = 0;
        let f = loop {
            let f = self.mass_fn(tree);
            let mut heavy = None;
            items.clear();
            items.extend(rows.iter().map(|&(leaf, lap, p)| Update {
                leaf,
                lap,
                mass: 0,
                raw: raw_bits(lap, Some(p)),
            }));
            // The masses of the priorities as the raw words keep them.
            priorities.clear();
            priorities.extend(items.iter().map(|u| priority_in(u.raw)));
            f.masses(priorities, powers, |i, mass| {
                let mass = keep_heavy(mass, &mut heavy).unwrap_or(0);
                heaviest = heaviest.max(mass);
                items[i].mass = mass;
            });
            match heavy {
                None => break f,
                Some(h) => owed |= self.lower_for(&f, h),
            }
        };
        for leaf in tree.update_many(items, applied, deltas) {
            // Another writer's raw word: this leaf follows it.
            tree.remass_run(leaf, 1, |_, p| f.mass(p).ok());
        }
        let applied_items = || items.iter().zip(applied.iter()).filter(|(_, &a)| a);
        self.settle(trees, tree, f, heaviest, owed, |mass_of| {
            for (u, _) in applied_items() {
                tree.remass_run(u.leaf, 1, &mut *mass_of);
            }
        });
    }

    /// Gives the new rows of runs `(first slot, slots, lap)` of tree `k` their leaves
    /// (their raw words are stored already): slot `j` of run `r` priority `each(r, j)`,
    /// or every one `top` without `each`. `top` is at least every priority. `turn`:
    /// the caller holds the shard's leaf turn over the runs (see [`Tree::set_run`]).
    pub(crate) fn set_leaves(
        &self,
        trees: &[Tree<'_>],
        k: usize,
        runs: &[(usize, usize, u32)],
        top: f64,
        each: Option<impl Fn(usize, usize) -> f64>,
        turn: bool,
    ) {
        let tree = &trees[k];
        let mut owed = false;
        let (f, heaviest) = loop {
            let f = self.mass_fn(tree);
            match f.mass(quantize(top)) {
                Ok(m) => break (f, m),
                Err(h) => owed |= self.lower_for(&f, h),
            }
        };
        // A run's masses, their powers taken together, when its rows each have one.
        let (mut priorities, mut masses, mut powers) = (Vec::new(), Vec::new(), Vec::new());
        for (r, &(first, n, lap)) in runs.iter().enumerate() {
            match &each {
                Some(each) => {
                    priorities.clear();
                    priorities.extend((0..n).map(|j| quantize(each(r, j))));
                    masses.clear();
                    f.masses(&priorities, &mut powers, |_, m| {
                        // Masses grow with priorities: none passes the heaviest's.
                        masses.push(m.map_or(heaviest, |m| m.min(heaviest)));
                    });
                    tree.set_run(first, n, |j| Leaf::new(lap, masses[j]), turn)
                }
                None => {
                    let leaf = Leaf::new(lap, heaviest);
                    tree.set_run_of(first, n, leaf, turn)
                }
            }
        }
        self.settle(trees, tree, f, heaviest, owed, |mass_of| {
            for &(first, n, _) in runs {
                tree.remass_run(first, n, &mut *mass_of);
            }
        });
    }
}

/// The masses of a chunk of leaves, worked out before a pass brings the leaves to
/// them ([`Priorities::remass`], [`Priorities::rebuild`]): the priorities the chunk's
/// raw words held when read, and their masses under one function, their powers taken
/// together ([`MassFn::masses`]). A slot whose raw word still holds the priority read
/// takes its mass from here, one whose word moved since has its own worked out alone.
/// (A pass over a million leaves, `set_alpha`: 27.7-29.3 ms with an `f32` `powf` a
/// leaf, 35.2-35.8 with `powers.rs`'s one at a time, 27.2-28.1 with a chunk's
/// together.)
#[derive(Debug, Default)]
struct ChunkMasses {
    priorities: Vec<f64>,
    masses: Vec<Result<u64, TooHeavy>>,
    powers: Vec<f64>,
}

impl ChunkMasses {
    /// Works out the masses under `f` of a chunk's slots' `priorities` (0 for a slot
    /// without one, whose mass nobody takes).
    fn fill(&mut self, f: &MassFn, priorities: impl Iterator<Item = f64>) {
        let ChunkMasses {
            priorities: read,
            masses,
            powers,
        } = self;
        read.clear();
        read.extend(priorities);
        masses.clear();
        f.masses(read, powers, |_, m| masses.push(m));
    }

    /// The mass under `f` of priority `p`, that of the chunk's `k`-th slot: the one
    /// worked out if `p` is the priority read there.
    fn mass(&self, f: &MassFn, k: usize, p: f64) -> Result<u64, TooHeavy> {
        match self.priorities.get(k) {
            Some(&read) if read == p => self.masses[k],
            _ => f.mass(p),
        }
    }
}

/// The mass `mass` gave, or `None` (and the heaviest such priority kept in `heavy`)
/// if it is too heavy for its scale.
fn keep_heavy(mass: Result<u64, TooHeavy>, heavy: &mut Option<TooHeavy>) -> Option<u64> {
    match mass {
        Ok(m) => Some(m),
        Err(h) => {
            if heavy.is_none_or(|k| k.0 < h.0) {
                *heavy = Some(h);
            }
            None
        }
    }
}
