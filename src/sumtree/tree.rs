//! Operations on one shard's tree block, safe to run from any number of threads at once.
//!
//! # Memory ordering
//!
//! - **Sum tree.** A leaf is changed by one atomic read-modify-write (a swap by the
//!   writer of a new row, a compare-exchange by a priority update), which yields the
//!   exact old value; the difference is then added to each ancestor with `fetch_add`.
//!   Integer additions commute, so whatever the interleaving, once every update has
//!   returned each entry is exactly the sum of its leaves. `Relaxed` suffices: no other
//!   memory is published through these words.
//! - **Min and max trees.** An entry is recomputed from its children, stored with a
//!   compare-exchange, and then verified by recomputing again; if a child changed
//!   meanwhile, the updater repeats. All of it is `SeqCst`: the verification load must
//!   not be satisfied before the entry's store is visible (store-load order), or two
//!   updaters could each verify against the other's stale state. An updater that found
//!   the entry already right stops there: whoever changed the children since is still
//!   on its way up and will carry the change. Once updates settle, every entry equals
//!   its children's min or max.
//! - **Descent.** Loads are `Relaxed`; a descent that races an update may see an
//!   ancestor and its children disagree. It clamps to the last child with mass, and
//!   reports the leaf it lands on with that leaf's value and tag. The caller checks the
//!   leaf still has mass and the row is the one the tag names before using it.

use super::{Kind, Layout, Leaf, ARITY};
use crate::sync::{AtomicU64, Ordering};

/// One shard's trees, over the region's words.
#[derive(Clone, Copy)]
pub(crate) struct Tree<'a> {
    words: &'a [AtomicU64],
    layout: &'a Layout,
}

/// What a priority update of one leaf did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Updated {
    Applied,
    /// The leaf belongs to another row now (or not yet to this one).
    Stale,
}

/// Where a descent landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Landing {
    pub(crate) leaf: usize,
    pub(crate) value: u64,
    pub(crate) tag: u16,
}

/// A min or max tree's combining rule.
fn combine(kind: Kind, a: u64, b: u64) -> u64 {
    match kind {
        Kind::Min => a.min(b),
        Kind::Max => a.max(b),
        Kind::Sum => unreachable!("the sum tree is kept by deltas"),
    }
}

/// The identity of `combine`: what an empty subtree holds. A leaf without mass counts
/// as empty for the min tree, so zero-priority rows do not pin the normaliser to zero.
fn identity(kind: Kind) -> u64 {
    match kind {
        Kind::Min => u64::MAX,
        _ => 0,
    }
}

impl<'a> Tree<'a> {
    pub(crate) fn new(words: &'a [AtomicU64], layout: &'a Layout) -> Tree<'a> {
        debug_assert!(layout.base + layout.words() <= words.len());
        Tree { words, layout }
    }

    pub(crate) fn layout(&self) -> &Layout {
        self.layout
    }

    fn leaf_atomic(&self, i: usize) -> &AtomicU64 {
        &self.words[self.layout.leaf_word(i)]
    }

    fn entry(&self, kind: Kind, level: usize, j: usize) -> &AtomicU64 {
        &self.words[self.layout.entry_word(kind, level, j)]
    }

    /// The leaf of slot `i`.
    pub(crate) fn leaf(&self, i: usize) -> Leaf {
        Leaf::from_bits(self.leaf_atomic(i).load(Ordering::SeqCst))
    }

    /// The priority last given to slot `i`, before `eps` and `alpha`.
    pub(crate) fn raw(&self, i: usize) -> f64 {
        f64::from_bits(self.words[self.layout.raw_word(i)].load(Ordering::Relaxed))
    }

    fn set_raw(&self, i: usize, raw: f64) {
        self.words[self.layout.raw_word(i)].store(raw.to_bits(), Ordering::Relaxed);
    }

    /// Total mass (the sum tree's root).
    pub(crate) fn total(&self) -> u64 {
        self.entry(Kind::Sum, self.layout.top(), 0)
            .load(Ordering::Relaxed)
    }

    /// The smallest non-zero mass (`u64::MAX` if none).
    pub(crate) fn min(&self) -> u64 {
        self.extremum(Kind::Min, self.layout.top(), 0)
    }

    /// The largest mass (0 if none).
    pub(crate) fn max(&self) -> u64 {
        self.extremum(Kind::Max, self.layout.top(), 0)
    }

    /// Min and max entries are stored so that a zeroed word is the empty subtree: the
    /// max tree as is, the min tree bitwise negated (its identity is `u64::MAX`). The
    /// region needs no initialisation and stays lazily allocated.
    fn encode(kind: Kind, v: u64) -> u64 {
        if kind == Kind::Min {
            !v
        } else {
            v
        }
    }

    fn extremum(&self, kind: Kind, level: usize, j: usize) -> u64 {
        Self::encode(kind, self.entry(kind, level, j).load(Ordering::SeqCst))
    }

    /// Entry `j` of level `level` of a min or max tree as its children give it now.
    fn recompute(&self, kind: Kind, level: usize, j: usize) -> u64 {
        let children = ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1));
        children.fold(identity(kind), |acc, c| {
            let v = if level == 1 {
                match self.leaf(c).value() {
                    0 => identity(kind),
                    v => v,
                }
            } else {
                self.extremum(kind, level - 1, c)
            };
            combine(kind, acc, v)
        })
    }

    /// Brings entry `j` of `level` of a min or max tree up to date with its children;
    /// returns whether it changed (see the module's ordering notes).
    fn refresh(&self, kind: Kind, level: usize, j: usize) -> bool {
        let entry = self.entry(kind, level, j);
        loop {
            let cur = entry.load(Ordering::SeqCst);
            let want = self.recompute(kind, level, j);
            if want == Self::encode(kind, cur) {
                return false;
            }
            let stored = Self::encode(kind, want);
            if entry
                .compare_exchange(cur, stored, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
                && self.recompute(kind, level, j) == want
            {
                return true;
            }
        }
    }

    /// Carries a change of leaves `first..end` up the min and max trees.
    fn refresh_extrema(&self, first: usize, end: usize) {
        for kind in [Kind::Min, Kind::Max] {
            let (mut lo, mut hi) = (first, end);
            for level in 1..=self.layout.top() {
                (lo, hi) = (lo / ARITY, (hi - 1) / ARITY + 1);
                let mut changed = false;
                for j in lo..hi {
                    changed |= self.refresh(kind, level, j);
                }
                if !changed {
                    break;
                }
            }
        }
    }

    /// Adds the deltas of leaves `first..first + deltas.len()` up the sum tree, one
    /// `fetch_add` per touched entry.
    fn add_deltas(&self, first: usize, deltas: &[i64]) {
        let mut lo = first;
        let mut level_deltas: Vec<i64> = deltas.to_vec();
        for level in 1..=self.layout.top() {
            let start = lo / ARITY;
            let mut next = vec![0i64; (lo + level_deltas.len() - 1) / ARITY + 1 - start];
            for (k, d) in level_deltas.iter().enumerate() {
                next[(lo + k) / ARITY - start] += d;
            }
            for (k, &d) in next.iter().enumerate() {
                if d != 0 {
                    self.entry(Kind::Sum, level, start + k)
                        .fetch_add(d as u64, Ordering::Relaxed);
                }
            }
            lo = start;
            level_deltas = next;
        }
    }

    /// Adds one leaf's delta up the sum tree.
    fn add_delta(&self, leaf: usize, delta: i64) {
        if delta == 0 {
            return;
        }
        let mut j = leaf;
        for level in 1..=self.layout.top() {
            j /= ARITY;
            self.entry(Kind::Sum, level, j)
                .fetch_add(delta as u64, Ordering::Relaxed);
        }
    }

    /// Gives slots `first..first + leaves.len()` new rows' leaves (and raw priorities).
    /// A slot whose leaf already belongs to a newer row (a writer that lapped this one
    /// got there first) keeps it.
    pub(crate) fn set_run(&self, first: usize, leaves: &[(Leaf, f64)]) {
        if leaves.is_empty() {
            return;
        }
        let deltas: Vec<i64> = leaves
            .iter()
            .enumerate()
            .map(|(k, &(leaf, raw))| {
                let atomic = self.leaf_atomic(first + k);
                loop {
                    let cur = Leaf::from_bits(atomic.load(Ordering::SeqCst));
                    if cur != Leaf::EMPTY && (cur.tag().wrapping_sub(leaf.tag()) as i16) > 0 {
                        return 0;
                    }
                    if atomic
                        .compare_exchange(
                            cur.bits(),
                            leaf.bits(),
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        )
                        .is_ok()
                    {
                        self.set_raw(first + k, raw);
                        return leaf.value() as i64 - cur.value() as i64;
                    }
                }
            })
            .collect();
        self.add_deltas(first, &deltas);
        self.refresh_extrema(first, first + leaves.len());
    }

    /// Sets slot `i`'s mass to `value` if its leaf still belongs to a row of lap `lap`.
    pub(crate) fn update(&self, i: usize, lap: u32, value: u64, raw: f64) -> Updated {
        let leaf = self.leaf_atomic(i);
        loop {
            let cur = Leaf::from_bits(leaf.load(Ordering::SeqCst));
            if !cur.is_of(lap) {
                return Updated::Stale;
            }
            let new = Leaf::new(lap, value);
            if leaf
                .compare_exchange(cur.bits(), new.bits(), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.set_raw(i, raw);
                self.add_delta(i, value as i64 - cur.value() as i64);
                self.refresh_extrema(i, i + 1);
                return Updated::Applied;
            }
        }
    }

    /// Takes the mass of slot `i` away if its leaf still has tag `tag` (an emptied
    /// row); a leaf a writer has since given to a new row is left alone.
    pub(crate) fn clear(&self, i: usize, tag: u16) {
        let leaf = self.leaf_atomic(i);
        loop {
            let cur = Leaf::from_bits(leaf.load(Ordering::SeqCst));
            if cur.tag() != tag || cur.value() == 0 {
                return;
            }
            let new = Leaf::new(u32::from(tag), 0);
            if leaf
                .compare_exchange(cur.bits(), new.bits(), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.add_delta(i, -(cur.value() as i64));
                self.refresh_extrema(i, i + 1);
                return;
            }
        }
    }

    /// The leaf holding mass `t` (`0 <= t < total`), counting leaves left to right.
    pub(crate) fn descend(&self, t: u64) -> Option<Landing> {
        let mut targets = [(t, None)];
        self.descend_many(&mut targets);
        targets[0].1
    }

    /// Descends for every target at once, level by level, so that the cache misses of
    /// different descents overlap instead of queueing.
    pub(crate) fn descend_many(&self, targets: &mut [(u64, Option<Landing>)]) {
        let mut nodes: smallvec::SmallVec<[usize; 32]> = smallvec::smallvec![0; targets.len()];
        for level in (1..=self.layout.top()).rev() {
            for ((t, _), node) in targets.iter_mut().zip(nodes.iter_mut()) {
                *node = self.pick_child(level, *node, t);
            }
        }
        for ((t, landing), &leaf) in targets.iter_mut().zip(&nodes) {
            let l = self.leaf(leaf);
            *landing = (l.value() > *t && *t != u64::MAX).then_some(Landing {
                leaf,
                value: l.value(),
                tag: l.tag(),
            });
        }
    }

    /// Among the children of entry `j` of `level`, the one holding mass `*t`; `*t`
    /// becomes the mass left within that child. Clamps to the last child with mass if
    /// a racing update made the children sum to less than `*t`.
    fn pick_child(&self, level: usize, j: usize, t: &mut u64) -> usize {
        let children = ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1));
        let mass = |c: usize| {
            if level == 1 {
                self.leaf(c).value()
            } else {
                self.entry(Kind::Sum, level - 1, c).load(Ordering::Relaxed)
            }
        };
        let mut last = None;
        for c in children {
            let m = mass(c);
            if m == 0 {
                continue;
            }
            if *t < m {
                return c;
            }
            *t -= m;
            last = Some((c, m));
        }
        match last {
            Some((c, m)) => {
                *t = m - 1;
                c
            }
            // No child has mass (everything moved away meanwhile): the caller's check
            // of the landing leaf rejects this draw.
            None => {
                *t = u64::MAX;
                ARITY * j
            }
        }
    }

    /// A slot whose mass is the largest (what a max-tree descent finds), or `None`.
    pub(crate) fn argmax(&self) -> Option<usize> {
        let max = self.max();
        if max == 0 {
            return None;
        }
        let mut j = 0;
        for level in (1..=self.layout.top()).rev() {
            let children = ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1));
            j = children
                .clone()
                .find(|&c| {
                    let v = if level == 1 {
                        self.leaf(c).value()
                    } else {
                        self.extremum(Kind::Max, level - 1, c)
                    };
                    v == max
                })
                .unwrap_or(children.start);
        }
        Some(j)
    }

    /// Whether every entry of the three trees equals what its children give now.
    pub(crate) fn is_consistent(&self) -> bool {
        (1..=self.layout.top()).all(|level| {
            (0..self.layout.size(level)).all(|j| {
                let children = ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1));
                let sum: u64 = children
                    .map(|c| {
                        if level == 1 {
                            self.leaf(c).value()
                        } else {
                            self.entry(Kind::Sum, level - 1, c).load(Ordering::SeqCst)
                        }
                    })
                    .fold(0u64, u64::wrapping_add);
                sum == self.entry(Kind::Sum, level, j).load(Ordering::SeqCst)
                    && self.recompute(Kind::Min, level, j) == self.extremum(Kind::Min, level, j)
                    && self.recompute(Kind::Max, level, j) == self.extremum(Kind::Max, level, j)
            })
        })
    }
}
