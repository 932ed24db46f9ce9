//! The concurrent segment trees of prioritized sampling, and their locked twin.
//!
//! Each shard has one tree block in the storage region, after the rows (so shared
//! memory and checkpoints carry it with the rows):
//!
//! ```text
//! | leaves (n words) | sum levels | min levels | max levels |
//! ```
//!
//! A row's raw priority (what [`ReplayBuffer::priority`] reports and `set_alpha`
//! recomputes masses from) lives in its slot, beside the stamp: a sampled row's update
//! then finds it in a cache line the sample just read. A tree on its own
//! ([`OwnedTree`]) keeps its raw priorities in its block, after the leaves.
//!
//! [`ReplayBuffer::priority`]: crate::ReplayBuffer::priority
//!
//! - A **leaf** is a slot's mass `(p + eps)^alpha` in fixed point (20 fractional bits,
//!   48 bits in all) with a 16-bit tag: the low bits of the lap of the row it belongs
//!   to. A priority update for a row that has since been overwritten finds another tag
//!   and is dropped.
//! - The **sum tree** holds exact integer sums. A leaf change adds its delta to every
//!   ancestor with one `fetch_add` each: additions commute, so concurrent updates need
//!   no lock and no retry, and the root is always, once updates settle, exactly the sum
//!   of the leaves. Integers cannot drift.
//! - The **min tree** (the weight normaliser) and the **max tree** (the priority of new
//!   rows with `max_priority_within_buffer`) cannot be kept by deltas; their entries
//!   are recomputed from their children and verified (`tree.rs`).
//! - Nodes are `ARITY` entries, two adjacent cache lines: a million leaves sit five
//!   levels deep, and the top three stay cached.
//!
//! `reference.rs` is the locked twin: a `Mutex<Vec<_>>` recomputed from scratch, which
//! the property tests and the fuzz target compare against.

pub mod reference;
pub(crate) mod tree;

/// Children per node: two adjacent cache lines of `u64` entries, so that a million
/// leaves sit five levels deep (two under loom, to keep the model small).
pub(crate) const ARITY: usize = if cfg!(replaybuf_loom) { 2 } else { 16 };

/// Words per cache line: tree blocks and levels start on line boundaries, so a node
/// never straddles one line more than it must.
const LINE_WORDS: usize = 8;

fn align(words: usize) -> usize {
    words.div_ceil(LINE_WORDS) * LINE_WORDS
}

/// Fractional bits of a leaf's fixed-point mass: a resolution of about 1e-6.
pub const FRACTION_BITS: u32 = 20;
/// Bits of a leaf's mass; the 16 above hold the tag.
const VALUE_BITS: u32 = 48;
pub(crate) const VALUE_MASK: u64 = (1 << VALUE_BITS) - 1;

/// A leaf word: a 16-bit tag and a 48-bit fixed-point mass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf(u64);

impl Leaf {
    /// An empty slot's leaf.
    pub const EMPTY: Leaf = Leaf(0);

    /// The leaf of a row of lap `lap` with mass `value`.
    pub fn new(lap: u32, value: u64) -> Leaf {
        debug_assert!(value <= VALUE_MASK);
        Leaf((u64::from(lap as u16) << VALUE_BITS) | value)
    }

    /// The fixed-point mass.
    pub fn value(self) -> u64 {
        self.0 & VALUE_MASK
    }

    /// The tag: the low 16 bits of the row's lap.
    pub fn tag(self) -> u16 {
        (self.0 >> VALUE_BITS) as u16
    }

    /// Whether this leaf belongs to a row of lap `lap`.
    pub fn is_of(self, lap: u32) -> bool {
        self.tag() == lap as u16
    }

    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    pub(crate) fn from_bits(bits: u64) -> Leaf {
        Leaf(bits)
    }
}

/// A raw priority word: the row's 16-bit tag, then the priority's `f64` bits less the
/// 16 lowest (a relative precision of about 1e-11).
pub(crate) fn raw_bits(tag: u16, raw: f64) -> u64 {
    (u64::from(tag) << 48) | (raw.to_bits() >> 16)
}

/// The largest mass a leaf of a tree of `leaves` leaves may hold: the sum of all of them
/// must fit a `u64`.
pub fn value_max(leaves: usize) -> u64 {
    VALUE_MASK.min(u64::MAX / leaves.max(1) as u64)
}

/// `x` in fixed point, rounded, saturating at `max`; any positive `x` gets at least one
/// unit, so a row with non-zero priority keeps non-zero mass.
pub fn to_fixed(x: f64, max: u64) -> u64 {
    if x <= 0.0 || x.is_nan() {
        return 0;
    }
    // Round half up by truncation (a libm `round` call is the slow part otherwise).
    let v = x * f64::from(1u32 << FRACTION_BITS) + 0.5;
    if v >= max as f64 {
        max
    } else {
        (v as u64).max(1)
    }
}

/// A fixed-point mass as a float.
pub fn from_fixed(v: u64) -> f64 {
    v as f64 / f64::from(1u32 << FRACTION_BITS)
}

/// Which of the three trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Sum,
    Min,
    Max,
}

/// Where one shard's tree block lives, and its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Leaves: the shard's slots.
    pub(crate) leaves: usize,
    /// First word of the block in the region.
    pub(crate) base: usize,
    /// Where slot `i`'s raw priority is: word `raws.0 + i * raws.1`.
    raws: (usize, usize),
    /// Whether the raw priorities are in the block (after the leaves).
    raws_inside: bool,
    /// (offset inside one tree's levels, entries) of levels 1 (just above the leaves)
    /// to the root level, which has one entry.
    pub(crate) levels: Vec<(usize, usize)>,
    /// Words of one tree's levels.
    pub(crate) internal: usize,
    pub(crate) value_max: u64,
    /// Whether the block has a max tree (only `max_priority_within_buffer` reads it).
    pub(crate) with_max: bool,
    /// (first word, entries) of each level of the sum tree, the leaves as level 0:
    /// what a descent reads, precomputed.
    pub(crate) sum_levels: Vec<(usize, usize)>,
}

impl Layout {
    /// The block of a tree over `leaves` slots, from word `base` on. `raws` places the
    /// raw priorities outside the block (first word, stride in words); `None` keeps
    /// them in it.
    pub(crate) fn new(
        leaves: usize,
        base: usize,
        with_max: bool,
        raws: Option<(usize, usize)>,
    ) -> Layout {
        let mut levels = Vec::new();
        let (mut size, mut offset) = (leaves.max(1), 0);
        loop {
            size = size.div_ceil(ARITY);
            levels.push((offset, size));
            offset += align(size);
            if size == 1 {
                break;
            }
        }
        let base = align(base);
        let mut layout = Layout {
            leaves,
            base,
            raws: raws.unwrap_or((base + align(leaves), 1)),
            raws_inside: raws.is_none(),
            levels,
            internal: offset,
            value_max: value_max(leaves),
            with_max,
            sum_levels: Vec::new(),
        };
        layout.sum_levels = (0..=layout.top())
            .map(|level| {
                let first = if level == 0 {
                    layout.leaf_word(0)
                } else {
                    layout.entry_word(Kind::Sum, level, 0)
                };
                (first, layout.size(level))
            })
            .collect();
        layout
    }

    /// Words the block takes from the region offset it was given: up to a line of
    /// slack to start on a line boundary, then leaves, raw priorities if inside, and
    /// two or three trees.
    pub(crate) fn words(&self) -> usize {
        LINE_WORDS + self.levels_base() + (2 + usize::from(self.with_max)) * self.internal
    }

    /// One past the block's last word.
    pub(crate) fn end(&self) -> usize {
        self.base + self.levels_base() + (2 + usize::from(self.with_max)) * self.internal
    }

    /// Words from the block's start to its first tree level.
    fn levels_base(&self) -> usize {
        (1 + usize::from(self.raws_inside)) * align(self.leaves)
    }

    /// The min and max trees this block keeps.
    pub(crate) fn extrema(&self) -> &'static [Kind] {
        if self.with_max {
            &[Kind::Min, Kind::Max]
        } else {
            &[Kind::Min]
        }
    }

    pub(crate) fn leaf_word(&self, i: usize) -> usize {
        self.base + i
    }

    pub(crate) fn raw_word(&self, i: usize) -> usize {
        self.raws.0 + i * self.raws.1
    }

    /// The word of entry `j` of level `level` (1-based) of tree `kind`.
    pub(crate) fn entry_word(&self, kind: Kind, level: usize, j: usize) -> usize {
        let tree = match kind {
            Kind::Sum => 0,
            Kind::Min => 1,
            Kind::Max => 2,
        };
        self.base + self.levels_base() + tree * self.internal + self.levels[level - 1].0 + j
    }

    /// Entries of level `level` (0: the leaves).
    pub(crate) fn size(&self, level: usize) -> usize {
        if level == 0 {
            self.leaves
        } else {
            self.levels[level - 1].1
        }
    }

    /// The root level's number.
    pub(crate) fn top(&self) -> usize {
        self.levels.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_end_in_one_root() {
        for n in [1, 2, 7, 8, 9, 64, 65, 1000, 1 << 20] {
            let l = Layout::new(n, 0, true, None);
            assert_eq!(l.levels.last().unwrap().1, 1, "{n} leaves");
            for level in 1..=l.top() {
                assert_eq!(l.size(level), l.size(level - 1).div_ceil(ARITY));
            }
        }
        assert_eq!(Layout::new(1 << 20, 0, false, None).top(), 5);
    }

    #[test]
    fn fixed_point_keeps_positive_mass_and_saturates() {
        assert_eq!(to_fixed(0.0, 100), 0);
        assert_eq!(to_fixed(1e-30, 100), 1);
        assert_eq!(to_fixed(1.0, u64::MAX), 1 << FRACTION_BITS);
        assert_eq!(to_fixed(1e30, 100), 100);
        assert!((from_fixed(to_fixed(0.3, u64::MAX)) - 0.3).abs() < 1e-6);
        let leaf = Leaf::new(0x1_2345, 77);
        assert_eq!((leaf.tag(), leaf.value()), (0x2345, 77));
        assert!(leaf.is_of(0x2345) && leaf.is_of(0x9_2345) && !leaf.is_of(1));
        assert_eq!(value_max(1 << 20), u64::MAX >> 20);
    }
}

/// A concurrent tree block that owns its words: the trees of one shard, on their own.
/// For the crate's loom tests, property tests and fuzz targets, which drive the trees
/// without a storage around them.
#[derive(Debug)]
pub struct OwnedTree {
    words: Box<[crate::sync::AtomicU64]>,
    layout: Layout,
}

impl OwnedTree {
    /// A tree over `leaves` slots, all empty.
    pub fn new(leaves: usize) -> OwnedTree {
        let layout = Layout::new(leaves, 0, true, None);
        OwnedTree {
            words: (0..layout.words())
                .map(|_| crate::sync::AtomicU64::new(0))
                .collect(),
            layout,
        }
    }

    fn tree(&self) -> tree::Tree<'_> {
        tree::Tree::new(&self.words, &self.layout)
    }

    /// The largest mass a leaf may hold.
    pub fn value_max(&self) -> u64 {
        self.layout.value_max
    }

    /// Gives slots `first..` new rows' leaves and raw priorities, as a writer does.
    pub fn set_run(&self, first: usize, leaves: &[(Leaf, f64)]) {
        self.tree().store_raws(first, leaves);
        self.tree().set_run(first, leaves.len(), |k| leaves[k].0)
    }

    /// Sets slot `i`'s mass if its leaf belongs to lap `lap`; whether it did.
    pub fn update(&self, i: usize, lap: u32, value: u64, raw: f64) -> bool {
        let mut applied = [false];
        self.tree()
            .update_many(&[(i, lap, value, raw)], &mut applied);
        applied[0]
    }

    /// Applies many updates at once (`(slot, lap, mass, raw)` each); whether each was.
    pub fn update_many(&self, items: &[(usize, u32, u64, f64)]) -> Vec<bool> {
        let mut applied = vec![false; items.len()];
        self.tree().update_many(items, &mut applied);
        applied
    }

    /// Takes slot `i`'s mass away if its tag is `tag`.
    pub fn clear(&self, i: usize, tag: u16) {
        self.tree().clear(i, tag)
    }

    /// The leaf of slot `i` and its raw priority.
    pub fn leaf(&self, i: usize) -> (Leaf, f64) {
        (self.tree().leaf(i), self.tree().raw_tagged(i).1)
    }

    /// The sum tree's root.
    pub fn total(&self) -> u64 {
        self.tree().total()
    }

    /// The min tree's root.
    pub fn min(&self) -> u64 {
        self.tree().min()
    }

    /// The max tree's root.
    pub fn max(&self) -> u64 {
        self.tree().max()
    }

    /// The slot a descent for mass `t` lands on, with its mass and tag.
    pub fn descend(&self, t: u64) -> Option<(usize, u64, u16)> {
        self.tree().descend(t).map(|l| (l.leaf, l.value, l.tag))
    }

    /// Whether every entry of all three trees equals what its children give (true once
    /// concurrent updates have settled).
    pub fn is_consistent(&self) -> bool {
        self.tree().is_consistent()
    }
}
