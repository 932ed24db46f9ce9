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
//! - A **leaf** is a slot's mass and the lap of the row it belongs to, one word:
//!
//!   ```text
//!    63                32 31        26 25                     0
//!   +--------------------+------------+------------------------+
//!   |  lap (32 bits)     |  exp (6)   |  mantissa (26 bits)    |
//!   +--------------------+------------+------------------------+
//!   mass = mantissa << exp            (an exact integer)
//!   ```
//!
//!   The lap is the row's whole lap, as its stamp has it: a priority update carries the
//!   lap of the row it was sampled from, and the compare-exchange that sets the leaf
//!   refuses any other, however many laps (up to 2^32) the slot went round meanwhile.
//!   The mass is an integer of up to 64 bits kept to 26 significant bits (exact below
//!   2^26, a relative rounding of at most 2^-27 above): what a priority's mass is in
//!   these units is the prioritized sampler's business (`sampler/mass_scale.rs`).
//! - A **raw word** holds the row's priority as the caller gave it, before `eps` and
//!   `alpha`, and the same full lap:
//!
//!   ```text
//!    63                32 31                                   0
//!   +--------------------+-------------------------------------+
//!   |  lap (32 bits)     |  0: no priority (never written, or   |
//!   |                    |  emptied); else 1 + the priority's   |
//!   |                    |  f64 bits 62..31, rounded            |
//!   +--------------------+-------------------------------------+
//!   ```
//!
//!   The priority keeps 22 significant bits (a relative rounding of at most 2^-22,
//!   about 2.4e-7, a little coarser than an `f32`'s) over the whole finite `f64`
//!   range down to 2^-1000 (subnormals keep fewer; a positive priority stays
//!   positive). The raw word is the truth a leaf is computed from: set first, then the leaf
//!   follows it (see `tree.rs`).
//! - The **sum tree** holds exact integer sums. A leaf change adds its delta to every
//!   ancestor with one `fetch_add` each: additions commute, so concurrent updates need
//!   no lock and no retry, and the root is always, once updates settle, exactly the sum
//!   of the leaves. Integers cannot drift.
//! - The **min tree** (the weight normaliser) and the **max tree** (the priority of new
//!   rows with `max_priority_within_buffer`) cannot be kept by deltas; their entries
//!   are recomputed from their children and verified (`tree.rs`). They hold the
//!   leaves' mass codes, which order as the masses do (the mantissa is normalised above
//!   2^26), so that a refresh compares words without decoding them. They start at
//!   level 2, each entry there over `ARITY * ARITY` leaves; their level-1 words are
//!   laid out but unused (`tree.rs`, "Min and max trees").
//! - Nodes are `ARITY` entries, two adjacent cache lines: a million leaves sit five
//!   levels deep, and the top three stay cached. A sample reads the running totals of
//!   one level near the top once (a *summit*, `tree.rs`), and each of its descents
//!   starts there with a binary search: a million rows' draw then picks among the
//!   children of three nodes, not five.
//!
//! `reference.rs` is the locked twin: a `Mutex<Vec<_>>` recomputed from scratch, which
//! the property tests and the fuzz target compare against.
//!
//! Layer: algos.

mod extremum;
mod pick;
pub mod reference;
pub(crate) mod tree;

/// Children per node: two adjacent cache lines of `u64` entries, so that a million
/// leaves sit five levels deep (two under loom, to keep the model small).
pub(crate) const ARITY: usize = if cfg!(replaybuf_loom) { 2 } else { 16 };

/// Words per cache line: tree blocks and levels start on line boundaries, so a node
/// never straddles one line more than it must.
const LINE_WORDS: usize = 8;

/// Words of one set of a tree block's marks, a bit for each run of leaves, which an
/// updater of many rows sets for the runs it changes (see `tree.rs`, "Marked
/// updates"): eight lines, 4,096 runs (a million leaves: 256 a run); one word under
/// loom.
pub(crate) const MARK_WORDS: usize = if cfg!(replaybuf_loom) { 1 } else { 64 };

/// Sets of marks in a tree block, one for each updater that may mark at once: four
/// learners' updates beside collectors; two under loom, whose models race at most two
/// updaters.
pub(crate) const MARK_SLOTS: usize = if cfg!(replaybuf_loom) { 2 } else { 4 };

fn align(words: usize) -> usize {
    words.div_ceil(LINE_WORDS) * LINE_WORDS
}

/// Bits of a leaf's mass code; the 32 above hold the lap.
const MASS_BITS: u32 = 32;
/// Significant bits of a mass.
const MANTISSA_BITS: u32 = 26;
const MANTISSA_MASK: u64 = (1 << MANTISSA_BITS) - 1;
/// The largest exponent a mass code is given: the largest mass is below 2^64.
const EXP_MAX: u32 = 64 - MANTISSA_BITS;

/// The code of mass `v`, rounded to the nearest mass a leaf holds (ties up; below
/// 2^26 every integer is one). A positive mass never rounds to zero.
fn encode_mass(v: u64) -> u64 {
    if v <= MANTISSA_MASK {
        return v;
    }
    let exp = 64 - v.leading_zeros() - MANTISSA_BITS;
    let round_up = (v >> (exp - 1)) & 1;
    let (mut mantissa, mut exp) = ((v >> exp) + round_up, exp);
    if mantissa > MANTISSA_MASK {
        mantissa >>= 1;
        exp += 1;
    }
    if exp > EXP_MAX {
        // Rounded up past 2^64: the largest mass below it.
        return (u64::from(EXP_MAX) << MANTISSA_BITS) | MANTISSA_MASK;
    }
    (u64::from(exp) << MANTISSA_BITS) | mantissa
}

/// The mass of a code.
#[inline]
fn decode_mass(code: u64) -> u64 {
    (code & MANTISSA_MASK) << ((code >> MANTISSA_BITS) & 63)
}

/// The largest mass a leaf holds that is at most `v`.
fn mass_at_most(v: u64) -> u64 {
    if v <= MANTISSA_MASK {
        return v;
    }
    let exp = 64 - v.leading_zeros() - MANTISSA_BITS;
    (v >> exp) << exp
}

/// A leaf word: the row's 32-bit lap and its mass (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf(u64);

impl Leaf {
    /// An empty slot's leaf.
    pub const EMPTY: Leaf = Leaf(0);

    /// The leaf of a row of lap `lap` with mass `value`, rounded to 26 significant
    /// bits (see [`Leaf::value`]).
    pub fn new(lap: u32, value: u64) -> Leaf {
        Leaf((u64::from(lap) << MASS_BITS) | encode_mass(value))
    }

    /// The mass: an exact integer, what the sums add up.
    #[inline]
    pub fn value(self) -> u64 {
        decode_mass(self.0)
    }

    /// The lap of the row the leaf belongs to.
    #[inline]
    pub fn lap(self) -> u32 {
        (self.0 >> MASS_BITS) as u32
    }

    /// Whether this leaf belongs to a row of lap `lap`.
    #[inline]
    pub fn is_of(self, lap: u32) -> bool {
        self.lap() == lap
    }

    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    /// The mass's 32-bit code, which orders as the masses do: what the min and max
    /// trees keep, so that they compare leaves without decoding them.
    #[inline]
    pub(crate) fn code(self) -> u64 {
        self.0 & ((1 << MASS_BITS) - 1)
    }

    pub(crate) fn from_bits(bits: u64) -> Leaf {
        Leaf(bits)
    }
}

/// The mass a leaf given `value` holds ([`Leaf::new`]'s rounding).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn leaf_mass(value: u64) -> u64 {
    decode_mass(encode_mass(value))
}

/// The largest finite priority's code (the code after it would be infinity's).
const PRIORITY_CODE_MAX: u64 = 0x7FEF_FFFF_FFFF_FFFF >> 31;

/// The raw word of the row of lap `lap` with priority `raw` (`None`: no priority, an
/// emptied row). `raw` is finite and not negative; a negative zero is zero.
pub(crate) fn raw_bits(lap: u32, raw: Option<f64>) -> u64 {
    let code = match raw {
        None => 0,
        Some(p) => {
            // Rounded to nearest; a positive priority stays positive (the smallest
            // subnormals round up to 2^-1043).
            let bits = p.to_bits() & !(1 << 63);
            let code = ((bits + (1 << 30)) >> 31).min(PRIORITY_CODE_MAX);
            code.max(u64::from(bits != 0)) + 1
        }
    };
    (u64::from(lap) << 32) | code
}

/// The lap and priority of a raw word.
pub(crate) fn raw_of(word: u64) -> (u32, Option<f64>) {
    let code = word & 0xFFFF_FFFF;
    let raw = (code != 0).then(|| f64::from_bits((code - 1) << 31));
    ((word >> 32) as u32, raw)
}

/// The priority of a raw word that holds one.
#[inline]
pub(crate) fn priority_in(word: u64) -> f64 {
    debug_assert!(word & 0xFFFF_FFFF != 0, "a raw word without a priority");
    f64::from_bits(((word & 0xFFFF_FFFF).wrapping_sub(1) & 0xFFFF_FFFF) << 31)
}

/// Priority `p` as a raw word keeps it (22 significant bits): what
/// [`ReplayBuffer::priority`] reports, and what masses are computed from.
///
/// [`ReplayBuffer::priority`]: crate::ReplayBuffer::priority
pub fn quantize(p: f64) -> f64 {
    raw_of(raw_bits(0, Some(p))).1.unwrap_or(0.0)
}

/// The largest mass a leaf of a tree of `leaves` leaves may hold: the sum of all of
/// them must fit a `u64` (and one alone an `i64`, whatever the leaves).
pub fn value_max(leaves: usize) -> u64 {
    mass_at_most((u64::MAX / leaves.max(1) as u64).min(i64::MAX as u64))
}

/// Which of the three trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TreeKind {
    Sum,
    Min,
    Max,
}

/// Where one shard's tree block lives, and its shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TreeLayout {
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
    /// The first word of level `level` of tree `kind` at `kind * top + level - 1`:
    /// [`TreeLayout::entry_word`], which every update calls a dozen times, precomputed.
    level_words: Vec<usize>,
    /// The word counting who changes the leaves now (`ShardWord::LeafChangers` of the
    /// block's shard; see `tree.rs`, "Plain leaves"), if the block has one: a tree of
    /// a storage does, a tree on its own (`OwnedTree`) does not, and its writers always
    /// compare-exchange.
    pub(crate) changers: Option<usize>,
    /// The word saying whose marks are set (`ShardWord::MarksSet`), with `changers`.
    pub(crate) marks_set: usize,
    /// The first of the block's [`MARK_SLOTS`] sets of [`MARK_WORDS`] marks, after its
    /// trees: set `s` from `marks + s * MARK_WORDS`.
    pub(crate) marks: usize,
    /// Leaf `i`'s mark is bit `i >> mark_shift` of the marks: the smallest shift that
    /// gives every leaf one.
    pub(crate) mark_shift: u32,
}

impl TreeLayout {
    /// The block of a tree over `leaves` slots, from word `base` on. `raws` places the
    /// raw priorities outside the block (first word, stride in words); `None` keeps
    /// them in it.
    pub(crate) fn new(
        leaves: usize,
        base: usize,
        with_max: bool,
        raws: Option<(usize, usize)>,
    ) -> TreeLayout {
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
        let mut layout = TreeLayout {
            leaves,
            base,
            raws: raws.unwrap_or((base + align(leaves), 1)),
            raws_inside: raws.is_none(),
            levels,
            internal: offset,
            value_max: value_max(leaves),
            with_max,
            sum_levels: Vec::new(),
            level_words: Vec::new(),
            changers: None,
            marks_set: 0,
            marks: 0,
            mark_shift: (0..usize::BITS)
                .find(|&shift| leaves.max(1).div_ceil(1 << shift) <= MARK_WORDS * 64)
                .unwrap_or(0),
        };
        layout.marks = layout.base + layout.trees_end();
        let levels_at = layout.base + layout.levels_base();
        layout.level_words = (0..3)
            .flat_map(|tree| {
                let first = levels_at + tree * layout.internal;
                layout.levels.iter().map(move |&(offset, _)| first + offset)
            })
            .collect();
        layout.sum_levels = (0..=layout.top())
            .map(|level| {
                let first = if level == 0 {
                    layout.leaf_word(0)
                } else {
                    layout.entry_word(TreeKind::Sum, level, 0)
                };
                (first, layout.size(level))
            })
            .collect();
        layout
    }

    /// This block, its leaves bounded as those of a tree of `leaves` leaves (at least
    /// its own): the bound of a storage's largest tree, for every tree of it.
    pub(crate) fn bounded_as(self, leaves: usize) -> TreeLayout {
        TreeLayout {
            value_max: value_max(leaves.max(self.leaves)),
            ..self
        }
    }

    /// This block, its leaf changers counted at word `changers` of the region, and
    /// whether its marks are set said at word `marks_set`.
    pub(crate) fn counted_at(self, changers: usize, marks_set: usize) -> TreeLayout {
        TreeLayout {
            changers: Some(changers),
            marks_set,
            ..self
        }
    }

    /// Words the block takes from the region offset it was given: up to a line of
    /// slack to start on a line boundary, then leaves, raw priorities if inside, two or
    /// three trees, and the marks.
    pub(crate) fn words(&self) -> usize {
        LINE_WORDS + self.trees_end() + MARK_SLOTS * MARK_WORDS
    }

    /// One past the block's last word.
    pub(crate) fn end(&self) -> usize {
        self.base + self.trees_end() + MARK_SLOTS * MARK_WORDS
    }

    /// The words of the marks of set `slot`.
    pub(crate) fn marks_of(&self, slot: usize) -> std::ops::Range<usize> {
        let first = self.marks + slot * MARK_WORDS;
        first..first + MARK_WORDS
    }

    /// Words from the block's start to the end of its trees.
    fn trees_end(&self) -> usize {
        self.levels_base() + (2 + usize::from(self.with_max)) * self.internal
    }

    /// Words from the block's start to its first tree level.
    fn levels_base(&self) -> usize {
        (1 + usize::from(self.raws_inside)) * align(self.leaves)
    }

    /// The min and max trees this block keeps.
    pub(crate) fn extrema(&self) -> &'static [TreeKind] {
        if self.with_max {
            &[TreeKind::Min, TreeKind::Max]
        } else {
            &[TreeKind::Min]
        }
    }

    pub(crate) fn leaf_word(&self, i: usize) -> usize {
        self.base + i
    }

    pub(crate) fn raw_word(&self, i: usize) -> usize {
        self.raws.0 + i * self.raws.1
    }

    /// The word of entry `j` of level `level` (1-based) of tree `kind`.
    pub(crate) fn entry_word(&self, kind: TreeKind, level: usize, j: usize) -> usize {
        let tree = match kind {
            TreeKind::Sum => 0,
            TreeKind::Min => 1,
            TreeKind::Max => 2,
        };
        self.level_words[tree * self.top() + level - 1] + j
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
            let l = TreeLayout::new(n, 0, true, None);
            assert_eq!(l.levels.last().unwrap().1, 1, "{n} leaves");
            for level in 1..=l.top() {
                assert_eq!(l.size(level), l.size(level - 1).div_ceil(ARITY));
            }
        }
        assert_eq!(TreeLayout::new(1 << 20, 0, false, None).top(), 5);
    }

    /// The levels, then the marks, which end the block.
    #[test]
    fn the_trees_levels_follow_the_leaves_in_order_without_overlap() {
        for (n, with_max, raws) in [
            (1, true, None),
            (1000, false, None),
            (1 << 20, true, Some((7, 3))),
        ] {
            let l = TreeLayout::new(n, 13, with_max, raws);
            let mut next = l.base + align(n) * if raws.is_none() { 2 } else { 1 };
            for &kind in [TreeKind::Sum, TreeKind::Min, TreeKind::Max]
                .iter()
                .take(2 + usize::from(with_max))
            {
                for level in 1..=l.top() {
                    let first = l.entry_word(kind, level, 0);
                    assert_eq!(first, next, "{n} leaves, {kind:?} level {level}");
                    assert_eq!(first % LINE_WORDS, 0, "levels start on a line");
                    next = align(l.entry_word(kind, level, l.size(level) - 1) + 1);
                }
            }
            assert_eq!(next, l.marks, "{n} leaves");
            assert_eq!(l.marks_of(MARK_SLOTS - 1).end, l.end(), "{n} leaves");
            let runs = n.div_ceil(1 << l.mark_shift);
            assert!(runs <= MARK_WORDS * 64 && (l.mark_shift == 0 || runs > MARK_WORDS * 32));
        }
    }

    #[test]
    fn masses_are_exact_integers_kept_to_26_bits() {
        for v in [0, 1, 2, 1000, MANTISSA_MASK] {
            assert_eq!(leaf_mass(v), v, "{v} is exact");
        }
        assert_eq!(leaf_mass(MANTISSA_MASK + 1), MANTISSA_MASK + 1);
        // Rounded to nearest, ties up, within 2^-27.
        assert_eq!(leaf_mass((1 << 27) + 1), 1 << 27);
        assert_eq!(leaf_mass((1 << 27) + 2), (1 << 27) + 4);
        assert_eq!(leaf_mass((1 << 27) + 3), (1 << 27) + 4);
        for v in [
            12_345_678_901u64,
            u64::MAX / 3,
            1 << 63,
            u64::MAX / 1_048_576,
        ] {
            let m = leaf_mass(v);
            assert!(
                (m as f64 - v as f64).abs() <= v as f64 * 2f64.powi(-26),
                "{v} -> {m}"
            );
        }
        assert_eq!(leaf_mass(u64::MAX), MANTISSA_MASK << EXP_MAX);
        for leaves in [1, 3, 1000, 1 << 20] {
            let max = value_max(leaves);
            assert_eq!(leaf_mass(max), max, "{leaves}: the bound is a mass");
            assert!(max.checked_mul(leaves as u64).is_some());
            let bound = (u64::MAX / leaves as u64).min(i64::MAX as u64);
            assert!(max <= i64::MAX as u64);
            assert!(max as f64 > bound as f64 * (1.0 - 2f64.powi(-25)));
        }
        let leaf = Leaf::new(0x1_2345, 77);
        assert_eq!((leaf.lap(), leaf.value()), (0x1_2345, 77));
        assert!(leaf.is_of(0x1_2345) && !leaf.is_of(0x2345) && !leaf.is_of(0x9_2345));
        assert!(
            !Leaf::new(1 << 16, 5).is_of(0),
            "the whole lap, not 16 bits of it"
        );
    }

    #[test]
    fn raw_words_keep_the_lap_and_22_bits_of_the_priority() {
        for p in [
            0.0,
            1.0,
            0.5,
            3.0,
            999.5,
            1e-8,
            1e8,
            1e-300,
            f64::MAX,
            0.3,
            10.1,
        ] {
            let (lap, got) = raw_of(raw_bits(u32::MAX, Some(p)));
            let got = got.unwrap();
            assert_eq!(lap, u32::MAX);
            assert!(got.is_finite());
            assert!((got - p).abs() <= p * 2f64.powi(-22), "{p} -> {got}");
            assert_eq!(quantize(got), got, "{p}: quantizing is idempotent");
        }
        assert!(quantize(5e-324) > 0.0, "a positive priority stays positive");
        assert_eq!(raw_of(raw_bits(7, Some(-0.0))), (7, Some(0.0)));
        assert_eq!(raw_of(raw_bits(7, None)), (7, None));
        assert_eq!(raw_of(0), (0, None), "a zeroed word holds no priority");
        assert!(quantize(0.3) < quantize(0.30001));
    }
}

/// A concurrent tree block that owns its words: the trees of one shard, on their own.
/// For the crate's loom tests, property tests and fuzz targets, which drive the trees
/// without a storage around them.
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
#[derive(Debug)]
pub struct OwnedTree {
    words: Box<[crate::sync::AtomicU64]>,
    layout: TreeLayout,
}

#[cfg_attr(not(feature = "internals"), allow(dead_code))]
impl OwnedTree {
    /// A tree over `leaves` slots, all empty.
    pub fn new(leaves: usize) -> OwnedTree {
        let layout = TreeLayout::new(leaves, 0, true, None);
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

    /// Gives slots `first..` new rows' leaves and raw priorities, as a writer does
    /// (the raw word first; a slot holding a newer row keeps both of its words).
    pub fn set_run(&self, first: usize, leaves: &[(Leaf, f64)]) {
        self.tree().store_raws(first, leaves);
        self.tree()
            .set_run(first, leaves.len(), |k| leaves[k].0, false)
    }

    /// Sets slot `i`'s mass and raw priority if both its words belong to lap `lap`
    /// (and the row was not cleared); whether it did.
    pub fn update(&self, i: usize, lap: u32, value: u64, raw: f64) -> bool {
        self.update_many(&[(i, lap, value, raw)])[0]
    }

    /// Applies many updates at once (`(slot, lap, mass, raw)` each); whether each was.
    pub fn update_many(&self, items: &[(usize, u32, u64, f64)]) -> Vec<bool> {
        let items: Vec<tree::Update> = items
            .iter()
            .map(|&(leaf, lap, mass, raw)| tree::Update {
                leaf,
                lap,
                mass,
                raw: raw_bits(lap, Some(raw)),
            })
            .collect();
        let mut applied = vec![false; items.len()];
        // No other writer: no raw word moves under an update.
        let _moved = self
            .tree()
            .update_many(&items, &mut applied, &mut tree::DeltaRoom::default());
        applied
    }

    /// Empties slot `i` (its mass and raw priority) if it holds the row of lap `lap`.
    pub fn clear(&self, i: usize, lap: u32) {
        self.tree().clear(i, lap)
    }

    /// The leaf of slot `i` and its raw priority (0 for none).
    pub fn leaf(&self, i: usize) -> (Leaf, f64) {
        (
            self.tree().leaf(i),
            self.tree().raw_tagged(i).1.unwrap_or(0.0),
        )
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

    /// The slot a descent for mass `t` lands on, with its mass and lap.
    pub fn descend(&self, t: u64) -> Option<(usize, u64, u32)> {
        self.tree().descend(t).map(|l| (l.leaf, l.value, l.lap))
    }

    /// Descends for every mass of `targets` at once, as a sample does: `out[k]` the
    /// landing of `targets[k]`, as [`OwnedTree::descend`] gives it.
    pub fn descend_many(&self, targets: &[u64], out: &mut Vec<Option<(usize, u64, u32)>>) {
        out.clear();
        let mut room = [0u64; tree::SUMMIT_ENTRIES];
        let tree = self.tree();
        let summit = tree.summit(&mut room[..tree::summit_room(targets.len(), 1)]);
        for chunk in targets.chunks(32) {
            let mut group: smallvec::SmallVec<[(u64, Option<tree::Landing>); 32]> =
                chunk.iter().map(|&t| (t, None)).collect();
            tree.descend_many(summit, &mut group);
            out.extend(
                group
                    .iter()
                    .map(|(_, l)| l.map(|l| (l.leaf, l.value, l.lap))),
            );
        }
    }

    /// Whether every entry of all three trees equals what its children give (true once
    /// concurrent updates have settled).
    pub fn is_consistent(&self) -> bool {
        self.tree().is_consistent()
    }
}
