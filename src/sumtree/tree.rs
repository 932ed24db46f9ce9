//! Operations on one shard's tree block, safe to run from any number of threads at once.
//!
//! # Memory ordering
//!
//! - **Sum tree.** A leaf is changed by one compare-exchange (by the writer of a new
//!   row, which leaves a newer row's leaf alone; by a priority update, which needs the
//!   leaf's lap to name its row; by a re-mass, which needs the leaf and the raw word to
//!   name the same row), which yields the exact old value; the difference is then added
//!   to each ancestor with `fetch_add`. A plain store by the writer would not do: a
//!   stale update landing between its load and its store would be counted twice.
//!   Integer additions commute, so whatever the interleaving, once every update has
//!   returned each entry is exactly the sum of its leaves. `Relaxed` suffices: no other
//!   memory is published through these words.
//! - **Min and max trees.** An entry is recomputed from its children, stored with a
//!   compare-exchange, and then verified by recomputing again; if a child changed
//!   meanwhile, the updater repeats. All of it is `SeqCst`: the verification load must
//!   not be satisfied before the entry's store is visible (store-load order), or two
//!   updaters could each verify against the other's stale state. An updater that found
//!   the entry already right stops there: whoever changed the children since is still
//!   on its way up and will carry the change. A leaf that beats the entries above it
//!   (a lower min, a higher max) climbs instead: a `fetch_max` of each entry's stored
//!   word, `SeqCst` too, and then the child it climbed from is read again. A child
//!   still holding the value makes the entry right by it (whoever changes the child
//!   next reads the entry after); one that moved on (a later update of the same leaf,
//!   which found the entry not yet improved and carried nothing) may leave the entry
//!   better than its children, and the climber refreshes it as above. Once updates
//!   settle, every entry equals its children's min or max.
//!
//!   The two trees start at level 2 (in a tree of two levels or more), each entry
//!   there over `ARITY * ARITY` leaves; their level-1 words are unused. A collector's
//!   new rows come in at the largest priority, so a learner's update of one lowers a
//!   leaf among fresh ones: over sixteen leaves its entry was the fresh rows' and
//!   the update climbed, a locked `fetch_max`, where over 256 the entry is most often
//!   lower already (a learner beside an unpaced collector kept 93% of its rate alone
//!   against 87%, `replaybuf bench --workload concurrent-prioritized`, MEASURED.md's
//!   thirty-first session). A refresh at level 2 folds 256 leaves, 32 lines: one
//!   update in 256 gives up its entry's extremum, where at level 1 one in 16 did,
//!   over 2 lines.
//! - **Raw priorities, then leaves.** The raw word is the truth and the leaf follows
//!   it. A row's writer stores its raw word with a plain store while it holds the slot;
//!   the next lap's writer waits for this row's publish, and an updater acts only on a
//!   row it saw published, so both come after. An update compare-exchanges the raw word
//!   (only while it names the update's lap and holds a priority) *before* the leaf,
//!   and after its leaf's compare-exchange loads the raw word again: if another writer
//!   changed it meanwhile, the leaf is brought to that word's mass ([`Tree::remass_run`],
//!   by the caller, who knows how priorities become masses). A re-mass loads the leaf,
//!   then the raw word, and compare-exchanges the leaf to that word's mass, then checks
//!   the raw word did not move. All `SeqCst`, so in their single total order: a re-mass
//!   that reads an update's leaf reads its raw word too (or a later one); and whoever
//!   writes a raw word last then moves the leaf to it, or finds a leaf change after its
//!   own that was computed from its word. Leaves and raw words end agreeing. (Under
//!   loom the writer's plain store is a swap: loom mis-orders a plain store after
//!   another thread's read-modify-write on the same atomic, tokio-rs/loom#389; see
//!   `sync.rs`.)
//! - **Plain leaves.** A compare-exchange per new row's leaf is a locked instruction:
//!   of a prioritized extend of 1,000 rows into a million, about a sixth of its time.
//!   An appender alone in changing its tree's leaves stores them plainly instead. Its
//!   shard's `LeafChangers` word counts who changes leaves: appenders, from before
//!   their rows are published until their leaves are set ([`Tree::appending`]), and
//!   priority updates, re-masses and clears, while they run. An appender holding its
//!   shard's leaf turn (`storage/shard.rs`, "Leaf turns"), after publishing, reads
//!   the count by a `SeqCst` read-modify-write; finding only itself, it loads and
//!   stores each leaf ([`Tree::set_run`]). Finding others, it compare-exchanges and
//!   reads the count again every few nodes, and from a reading that finds only itself
//!   stores the rest plainly: each reading is the check below, made later. (Finding
//!   only the updater whose leaves are marked, it stores plainly those it did not
//!   mark: "Marked updates" below.) Nobody else changes those leaves between its load
//!   and store:
//!   - a changer that left before has its changes read: its decrement is Release, the
//!     read-modify-write an acquire;
//!   - an appender of older rows, still to set its leaves, was counted before it
//!     claimed, so before this appender claimed: it is in the count;
//!   - an appender of newer rows over the same positions waits for the turn;
//!   - an updater counted after the read (a `SeqCst` increment, after the fence in the
//!     total order) reads this appender's raw words, stored before the fence: an update
//!     or re-mass of the older row finds another lap in the raw word and leaves the
//!     leaf alone, and one of the new row finds its leaf set or not yet of its lap.
//!     (A store-buffering handshake, the count's read-modify-writes on both sides.)
//!
//!   A clear leaves alone a leaf whose raw word names a newer row, like an update,
//!   except a recovery's of a dead writer's rows ([`Tree::clear_abandoned`]), which
//!   holds the shard's lease: no appender sets its leaves. At the run's edges, the
//!   plain stores of a node's leaves are followed by a `SeqCst` fence before the
//!   node's entries are refreshed from them: what each compare-exchange would have
//!   ordered, once a node.
//! - **Whole nodes.** A node whose leaves are all the alone appender's new rows' it
//!   sets whole ([`Tree::store_node`]), with no locked instruction and no load of a
//!   leaf: its sum entry first (the old leaves' mass is the entry's, exact while
//!   nobody else changes them), by a plain store, then the leaves, each `Release`.
//!   Until a leaf is stored nobody else changes it or the entry above it (an update
//!   of the new row finds its leaf not yet of its lap and is dropped); whoever changes
//!   it after read it, and so the entry's store: its own change of the entry comes
//!   after it. After the run's nodes, one `SeqCst` fence orders the leaves and entries
//!   before the refreshes of the min and max entries over them and of the levels
//!   above, this appender's and others'. An update of one of the node's new rows may
//!   refresh an entry from siblings whose stores it has not yet seen, and store that:
//!   the appender's own refresh, after its fence, then meets it as any two refreshes
//!   meet, and the last to store has read every leaf the other stored before.
//! - **Marked updates.** A learner's batch of updates holds the count for as long as
//!   it runs, and a collector beside it often found it there and compare-exchanged
//!   its 1,000 leaves: its extends took 1.12 times as long as those of a build that
//!   never compare-exchanged (unsound; three runs alternating). Yet a batch of 256
//!   updates over a million leaves rarely changes any of the 1,000 an extend sets.
//!   So an updater takes one of [`MARK_SLOTS`] sets of marks, each with a bit of the
//!   count ([`MARKING`]; a `fetch_or`, which one updater at a time wins; with every
//!   set taken, it is counted as before), sets its marks of the runs of leaves it
//!   will change (a bit each in [`MARK_WORDS`] of its set, after the trees; a million
//!   leaves: runs of 256), then its bit of the shard's marks-set word (a `Release`
//!   `fetch_or`), and only then changes anything ([`Tree::count_updates`]). When done
//!   it clears its bit of the marks-set word, then the marks it set (`Release`), then
//!   its bit of the count. An appender whose check finds itself and marking bits
//!   alone, and then each of those bits set in the marks-set word (`Acquire`), stores
//!   plainly every node none of whose leaves' runs it finds marked in their sets
//!   (`Acquire` loads, [`Tree::marked`]), and compare-exchanges the others. For each
//!   such updater:
//!   - its bit in the marks-set word is its own (or a later holder's of the set),
//!     never an earlier holder's: the holder before it cleared that bit before giving
//!     the count's back, which this updater's `fetch_or` and the check carry on (a
//!     release sequence), so the appender reads that clear or later. This updater's
//!     marks are read, stored before its bit, or their clearing, stored after;
//!   - a run read not marked is one the updater does not change, or a clear stored
//!     after all its changes, which the `Acquire` load then reads;
//!   - a later holder takes the set after this one gave it back, after the check: it
//!     is an updater counted after it, and reads the appender's raw words.
//!
//!   A clear bit in the marks-set word (marks not yet set, or being cleared) tells
//!   nothing, and the appender compare-exchanges, looking again as above. The marked
//!   runs' nodes hold no leaf of the updater's outside them, so its refreshes of those
//!   nodes' entries never meet a whole node. A marking updater whose process dies (a
//!   shared region) leaves its bits and marks as they were until the region is
//!   recovered: appenders compare-exchange its marked runs only, and its set stays
//!   taken, as a dead plain updater's unit stays counted.
//! - **Whole laps.** Leaves and raw words carry the row's full 32-bit lap, compared
//!   for equality, so an update stalled any number of laps short of 2^32 (the stamps'
//!   own wrap) finds another lap and is dropped. An update whose raw compare-exchange
//!   succeeded but whose leaf then shows a newer row leaves no trace: that row's writer
//!   stored its raw word before publishing and setting its leaf, so after the update's
//!   compare-exchange (which would otherwise have failed on the lap).
//! - **Descent.** Loads are `Relaxed`; a descent that races an update may see an
//!   ancestor and its children disagree. It clamps to the last child with mass, and
//!   reports the leaf it lands on with that leaf's value and lap. The caller checks the
//!   leaf still has mass and the row is the one the lap names before using it.
//!
//! Layer: algos.

use super::{
    decode_mass, pick, raw_bits, raw_of, Leaf, TreeKind, TreeLayout, ARITY, MARK_SLOTS, MARK_WORDS,
};
use crate::sync::{fence, AtomicU64, Ordering};
use smallvec::SmallVec;

/// An appender's unit in a leaf-changers word: the high half, which a recovery takes
/// back from a dead appender's process ([`Tree::forget_appenders`]).
const APPENDER: u64 = 1 << 32;
/// Nodes an appender that found others changing leaves sets by compare-exchange
/// before it looks again ([`Tree::set_run`]): a look is a locked instruction, as a
/// leaf's compare-exchange is.
const RECHECK_NODES: usize = if cfg!(replaybuf_loom) { 1 } else { 4 };
/// A priority update's, re-mass's or clear's unit: the low bits, below [`MARKING`].
const UPDATER: u64 = 1;
/// The units of the updaters whose leaves are marked in the tree's marks (see the
/// module's "Marked updates"), a bit for each set of marks ([`marking`]), each taken
/// by a `fetch_or`, and so by one updater at a time.
const MARKING: u64 = ((1 << MARK_SLOTS) - 1) << (31 - MARK_SLOTS);

/// The unit of the updater holding set `slot` of the marks, in the leaf-changers word
/// and in the marks-set word alike: bit `30 - slot`.
fn marking(slot: usize) -> u64 {
    1 << (30 - slot)
}

/// Whether leaf `cur` belongs to a row newer than `leaf`'s (a writer that lapped the
/// one about to give `leaf`), which keeps its leaf.
fn holds_newer_row(cur: Leaf, leaf: Leaf) -> bool {
    cur != Leaf::EMPTY && (cur.lap().wrapping_sub(leaf.lap()) as i32) > 0
}

/// One party counted among a tree's leaf changers until dropped (see the module's
/// "Plain leaves").
#[must_use = "the count ends when the guard drops"]
pub(crate) struct Changing<'a> {
    word: Option<&'a AtomicU64>,
    unit: u64,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        if let Some(word) = self.word {
            // SYNC POINT: pairs with the fence of an appender deciding on plain stores
            // (`Tree::others_changing`): every leaf change of this party happens before
            // the appender's loads of those leaves.
            word.fetch_sub(self.unit, Ordering::Release);
        }
    }
}

/// A priority update counted among the leaf changers until dropped: as the updater
/// whose leaves are marked, whose marks are then cleared before it is no longer
/// counted, or plainly (see the module's "Marked updates").
#[must_use = "the count ends when the guard drops"]
pub(crate) struct Updating<'a> {
    tree: Tree<'a>,
    /// The set of marks it holds, if it holds one, and the marks it set there, word
    /// by word.
    marks: Option<(usize, [u64; MARK_WORDS])>,
    /// Its unit, its set's [`marking`] bit or [`UPDATER`], given back after the marks
    /// are cleared: fields drop after `drop` runs.
    _count: Changing<'a>,
}

impl Drop for Updating<'_> {
    fn drop(&mut self) {
        let (tree, layout) = (self.tree, self.tree.layout);
        let Some((slot, marks)) = &self.marks else {
            return;
        };
        tree.words[layout.marks_set].fetch_and(!marking(*slot), Ordering::Relaxed);
        for (w, &bits) in layout.marks_of(*slot).zip(marks) {
            if bits != 0 {
                // SYNC POINT: pairs with an appender's Acquire load of the marks
                // (`Tree::marked`): an appender that reads a mark cleared reads every
                // leaf change this updater made.
                tree.words[w].store(0, Ordering::Release);
            }
        }
    }
}

/// Who else an appender found changing its tree's leaves (see the module's "Plain
/// leaves" and "Marked updates").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Others {
    /// Nobody: the appender stores every leaf plainly.
    None,
    /// Only updaters whose leaves are marked, their [`marking`] bits: the appender
    /// stores plainly the leaves of runs none of them marked.
    Marked(u64),
    /// Updaters it knows nothing of: the appender compare-exchanges.
    Unknown,
}

/// One shard's trees, over the region's words.
#[derive(Clone, Copy)]
pub(crate) struct Tree<'a> {
    words: &'a [AtomicU64],
    layout: &'a TreeLayout,
}

/// Where a descent landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Landing {
    pub(crate) leaf: usize,
    pub(crate) value: u64,
    /// The lap of the row the leaf belongs to.
    pub(crate) lap: u32,
}

/// The most entries a sample's summits hold, together (`sampler/prioritized.rs`): a
/// million rows' summit, 245 entries, fits with room to spare.
pub(crate) const SUMMIT_ENTRIES: usize = 512;

/// The room a summit of one of `trees` trees gets for a sample of `descents` draws:
/// about `ARITY` entries a descent, `SUMMIT_ENTRIES` shared among the trees.
pub(crate) fn summit_room(descents: usize, trees: usize) -> usize {
    let trees = trees.max(1);
    (SUMMIT_ENTRIES / trees)
        .min((ARITY * descents).div_ceil(trees))
        .max(1)
}

/// The running totals of one level of a sum tree, read once for a batch of descents
/// ([`Tree::summit`]): each descent then starts at that level with a binary search,
/// not a pick at every level above it (two of a million rows' five, for a batch of
/// 256). A snapshot, read `Relaxed` as a descent reads: racing updates make it
/// disagree with the levels below as they would a descent's own reads, and the landing
/// check catches what that does to a draw.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Summit<'s> {
    /// The level (0: the leaves).
    level: usize,
    /// `totals[k]`: the mass of entries `0..=k`.
    totals: &'s [u64],
}

impl Summit<'_> {
    /// The entry holding mass `*t`; `*t` becomes the mass left within it. Clamps to the
    /// last entry with mass if `*t` is past the level's total, as a pick does.
    fn find(&self, t: &mut u64) -> usize {
        let totals = self.totals;
        // The mass of the entries before entry `k`.
        let before = |k: usize| k.checked_sub(1).map_or(0, |b| totals[b]);
        let k = totals.partition_point(|&total| total <= *t);
        if let Some(left) = t.checked_sub(before(k)).filter(|_| k < totals.len()) {
            *t = left;
            return k;
        }
        // Past the total (the root grew after the summit was read), or totals that
        // racing words wrapped.
        let mass = |k: usize| totals[k].wrapping_sub(before(k));
        match (0..totals.len()).rposition(|k| mass(k) > 0) {
            Some(k) => {
                *t = mass(k) - 1;
                k
            }
            None => {
                *t = u64::MAX;
                0
            }
        }
    }
}

/// One priority update: the leaf of the row of lap `lap` gets mass `mass`, its raw
/// word `raw` (a word of [`super::raw_bits`] naming `lap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Update {
    pub(crate) leaf: usize,
    pub(crate) lap: u32,
    pub(crate) mass: u64,
    pub(crate) raw: u64,
}

/// The working room of [`Tree::update_many`], where it gathers the upper levels'
/// deltas: kept by its caller from one batch to the next, so that a learner's updates
/// allocate nothing once warm.
#[derive(Debug, Default)]
pub(crate) struct DeltaRoom {
    /// The deltas of the lowest level that gathers them densely, one an entry.
    dense: Vec<i64>,
    /// The entries of `dense` that updates reached, in the order they did.
    touched: Vec<usize>,
}

impl DeltaRoom {
    /// Empties the room and makes it room for batches of up to `updates` updates.
    pub(crate) fn clear_for(&mut self, updates: usize) {
        self.touched.clear();
        self.touched.reserve(updates);
    }

    /// The room's capacity in bytes, for a caller that keeps rooms to bound.
    pub(crate) fn bytes(&self) -> usize {
        room_bytes(&self.dense) + room_bytes(&self.touched)
    }
}

/// The bytes `v` holds room for: a working room's part, which its keeper bounds.
pub(crate) fn room_bytes<T>(v: &Vec<T>) -> usize {
    v.capacity() * size_of::<T>()
}

/// What a change of one node's leaves did (see [`Tree::change_run`]).
enum NodeChange {
    /// The leaves changed in mass by this much, modulo 2^64; the entries above them
    /// are still to follow.
    Leaves(i64),
    /// The leaves and the sum entry above them were set ([`Tree::store_node`]): the
    /// entry changed by `delta`. The min and max entries are still to follow.
    Whole { delta: i64 },
}

/// A whole node's new leaves and their sum.
struct WholeNode {
    leaves: [Leaf; ARITY],
    sum: u64,
}

/// A min or max tree's combining rule.
fn combine(kind: TreeKind, a: u64, b: u64) -> u64 {
    match kind {
        TreeKind::Min => a.min(b),
        TreeKind::Max => a.max(b),
        TreeKind::Sum => unreachable!("the sum tree is kept by deltas"),
    }
}

/// The identity of `combine`: what an empty subtree holds. A leaf without mass counts
/// as empty for the min tree, so zero-priority rows do not pin the normaliser to zero.
fn identity(kind: TreeKind) -> u64 {
    match kind {
        TreeKind::Min => u64::MAX,
        _ => 0,
    }
}

/// Folds the words of a node (`SeqCst` loads), unrolled for a full one: a refresh
/// folds a node two or three times.
///
/// The loads are `sync::handshake_load`s: a refresh reading children that another
/// party stored plainly before a `SeqCst` fence, while that party's own refresh reads
/// the child this one changed, is a store-buffering handshake, which loom, without a
/// total order of `SeqCst` loads (tokio-rs/loom#180), lets both sides lose.
#[inline(always)]
fn fold_node(node: &[AtomicU64], init: u64, f: impl Fn(u64, u64) -> u64) -> u64 {
    let load = crate::sync::handshake_load;
    over_node(node, |words| words.iter().map(load).fold(init, &f))
}

/// `f` of `node`'s words: of a full node through its fixed length, so that the
/// compiler unrolls `f`'s loop over them.
#[inline(always)]
fn over_node<R>(node: &[AtomicU64], f: impl Fn(&[AtomicU64]) -> R) -> R {
    match <&[AtomicU64; ARITY]>::try_from(node) {
        Ok(full) => f(full),
        Err(_) => f(node),
    }
}

impl<'a> Tree<'a> {
    pub(crate) fn new(words: &'a [AtomicU64], layout: &'a TreeLayout) -> Tree<'a> {
        debug_assert!(layout.end() <= words.len());
        Tree { words, layout }
    }

    pub(crate) fn layout(&self) -> &TreeLayout {
        self.layout
    }

    /// Counts the caller among the leaf changers as `unit` until the guard drops.
    ///
    /// `SeqCst`: see the module's "Plain leaves": an updater counted after an
    /// appender's check reads that appender's raw words.
    fn count(&self, unit: u64) -> Changing<'a> {
        let word = self.layout.changers.map(|w| &self.words[w]);
        if let Some(word) = word {
            word.fetch_add(unit, Ordering::SeqCst);
        }
        Changing { word, unit }
    }

    /// Counts an appender among the leaf changers, from before its rows are published
    /// until it has set their leaves (see the module's "Plain leaves").
    pub(crate) fn appending(&self) -> Changing<'a> {
        self.count(APPENDER)
    }

    /// Takes back every appender's unit (a dead lease holder's: only its threads
    /// appended to the shard), keeping the updaters'.
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // no shared regions under loom
    pub(crate) fn forget_appenders(&self) {
        if let Some(w) = self.layout.changers {
            self.words[w].fetch_and(APPENDER - 1, Ordering::AcqRel);
        }
    }

    /// Counts the caller, about to apply `items`, among the leaf changers: as the
    /// holder of a set of marks if one is free, with its marks set there before it
    /// changes any leaf; plainly otherwise (see the module's "Marked updates").
    fn count_updates(&self, items: &[Update]) -> Updating<'a> {
        let plainly = || Updating {
            tree: *self,
            marks: None,
            _count: self.count(UPDATER),
        };
        let Some(w) = self.layout.changers else {
            return plainly();
        };
        let word = &self.words[w];
        // The first set free, as last read; one another updater took meanwhile sends
        // this one to the next, a try for each set at most.
        let mut seen = word.load(Ordering::Relaxed);
        let mut tries = MARK_SLOTS;
        let bit = loop {
            let free = MARKING & !seen;
            if free == 0 || tries == 0 {
                return plainly();
            }
            tries -= 1;
            let bit = 1 << (63 - free.leading_zeros());
            // `SeqCst`, as `count`'s increment.
            seen = word.fetch_or(bit, Ordering::SeqCst);
            if seen & bit == 0 {
                break bit;
            }
        };
        let slot = 30 - bit.trailing_zeros() as usize;
        let shift = self.layout.mark_shift;
        let mut set = [0u64; MARK_WORDS];
        for u in items {
            let run = u.leaf >> shift;
            set[run / 64] |= 1 << (run % 64);
        }
        for (w, &bits) in self.layout.marks_of(slot).zip(&set) {
            if bits != 0 {
                self.words[w].store(bits, Ordering::Relaxed);
            }
        }
        // SYNC POINT: pairs with the Acquire load of an appender that finds the marks
        // set (`Tree::others_changing`): it reads these marks, or later ones.
        self.words[self.layout.marks_set].fetch_or(bit, Ordering::Release);
        Updating {
            tree: *self,
            marks: Some((slot, set)),
            // Its bit is its own: taking it back by subtraction clears it.
            _count: Changing {
                word: Some(word),
                unit: bit,
            },
        }
    }

    /// Who else changes leaves, as the calling appender, counted
    /// ([`Tree::appending`]) and holding its shard's leaf turn, finds them: alone, it
    /// may set its new rows' leaves with plain stores, and beside only updaters whose
    /// leaves are marked, those of runs none of them marked (see the module's "Plain
    /// leaves" and "Marked updates").
    fn others_changing(&self) -> Others {
        let Some(w) = self.layout.changers else {
            return Others::Unknown;
        };
        // SYNC POINT: a read-modify-write, `SeqCst`: acquires the Release of every
        // changer that left before (their changes happen before this appender's
        // loads) and of the marking updaters' counts, and orders this appender's raw
        // words before the count it reads: an updater counted later reads them.
        let count = self.words[w].fetch_add(0, Ordering::SeqCst);
        let markers = count & MARKING;
        match count & !MARKING {
            APPENDER if markers == 0 => Others::None,
            // SYNC POINT: pairs with each marking updater's Release `fetch_or`: its
            // marks, set before, are read by `Tree::marked`. A bit found clear is that
            // of an updater still to set its marks, or done: not known.
            APPENDER
                if self.words[self.layout.marks_set].load(Ordering::Acquire) & markers
                    == markers =>
            {
                Others::Marked(markers)
            }
            _ => Others::Unknown,
        }
    }

    /// Whether one of the updaters of [`marking`] bits `markers` marked the run of
    /// any of leaves `slots`, as an appender that found them so ([`Others::Marked`])
    /// reads their marks.
    fn marked(&self, markers: u64, slots: std::ops::Range<usize>) -> bool {
        let shift = self.layout.mark_shift;
        let (first, last) = (slots.start >> shift, (slots.end - 1) >> shift);
        (0..MARK_SLOTS)
            .filter(|&slot| markers & marking(slot) != 0)
            .any(|slot| {
                let marks = self.layout.marks_of(slot).start;
                (first / 64..=last / 64).any(|w| {
                    let lo = if w == first / 64 { first % 64 } else { 0 };
                    let hi = if w == last / 64 { last % 64 } else { 63 };
                    let runs = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
                    // SYNC POINT: pairs with the marking updater's Release stores, of
                    // its marks and of their clearing (`Updating`'s drop): a run found
                    // not marked is one it does not change, or changed before.
                    self.words[marks + w].load(Ordering::Acquire) & runs != 0
                })
            })
    }

    fn leaf_atomic(&self, i: usize) -> &AtomicU64 {
        &self.words[self.layout.leaf_word(i)]
    }

    fn entry(&self, kind: TreeKind, level: usize, j: usize) -> &AtomicU64 {
        &self.words[self.layout.entry_word(kind, level, j)]
    }

    /// The leaf of slot `i`.
    pub(crate) fn leaf(&self, i: usize) -> Leaf {
        Leaf::from_bits(self.leaf_atomic(i).load(Ordering::SeqCst))
    }

    fn raw_atomic(&self, i: usize) -> &AtomicU64 {
        &self.words[self.layout.raw_word(i)]
    }

    /// Slot `i`'s raw word (see [`super::raw_bits`]).
    pub(crate) fn raw_bits_at(&self, i: usize) -> u64 {
        self.raw_atomic(i).load(Ordering::SeqCst)
    }

    /// The lap of the row slot `i`'s raw word belongs to, and the priority last given
    /// to it before `eps` and `alpha` (`None` if emptied or never written).
    pub(crate) fn raw_tagged(&self, i: usize) -> (u32, Option<f64>) {
        raw_of(self.raw_bits_at(i))
    }

    /// The priority last given to the row of lap `lap` at slot `i`, if the raw word is
    /// that row's and holds one.
    pub(crate) fn raw(&self, i: usize, lap: u32) -> Option<f64> {
        let (l, raw) = self.raw_tagged(i);
        raw.filter(|_| l == lap)
    }

    /// Records the raw priorities of new rows at slots `first..`, for a tree on its own
    /// ([`super::OwnedTree`]), whose callers may give an older lap after a newer one: a
    /// word already naming a newer lap is kept, as [`Tree::set_run`] keeps such a leaf.
    /// (A storage's writers store raw words in lap order, by the slot protocol.)
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn store_raws(&self, first: usize, leaves: &[(Leaf, f64)]) {
        for (k, &(leaf, raw)) in leaves.iter().enumerate() {
            let atomic = self.raw_atomic(first + k);
            let word = raw_bits(leaf.lap(), Some(raw));
            let mut cur = atomic.load(Ordering::SeqCst);
            loop {
                let newer = cur != 0 && (raw_of(cur).0.wrapping_sub(leaf.lap()) as i32) > 0;
                if newer {
                    break;
                }
                match atomic.compare_exchange(cur, word, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(_) => break,
                    Err(now) => cur = now,
                }
            }
        }
    }

    /// Sets slot `i`'s raw word to `word` if it names lap `lap` and holds a priority
    /// (the row is neither replaced nor emptied); whether it did.
    fn set_raw(&self, i: usize, lap: u32, word: u64) -> bool {
        let atomic = self.raw_atomic(i);
        let mut cur = atomic.load(Ordering::SeqCst);
        loop {
            let (l, raw) = raw_of(cur);
            if l != lap || raw.is_none() {
                return false;
            }
            match atomic.compare_exchange(cur, word, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Total mass (the sum tree's root).
    pub(crate) fn total(&self) -> u64 {
        self.entry(TreeKind::Sum, self.layout.top(), 0)
            .load(Ordering::Relaxed)
    }

    /// The smallest non-zero mass (`u64::MAX` if none).
    pub(crate) fn min(&self) -> u64 {
        match self.extremum(TreeKind::Min, self.layout.top(), 0) {
            u64::MAX => u64::MAX,
            code => decode_mass(code),
        }
    }

    /// The largest mass (0 if none).
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn max(&self) -> u64 {
        decode_mass(self.extremum(TreeKind::Max, self.layout.top(), 0))
    }

    /// Min and max entries are stored so that a zeroed word is the empty subtree: the
    /// max tree as is, the min tree bitwise negated (its identity is `u64::MAX`). The
    /// region needs no initialisation and stays lazily allocated.
    fn encode(kind: TreeKind, v: u64) -> u64 {
        if kind == TreeKind::Min {
            !v
        } else {
            v
        }
    }

    /// The lowest level of the min and max trees: level 2, whose entries each cover
    /// `ARITY * ARITY` leaves, in a tree of two levels or more; level 1 otherwise.
    /// The min and max trees keep no level 1 under it.
    #[inline(always)]
    fn bottom(&self) -> usize {
        self.layout.top().min(2)
    }

    /// The leaves under each entry of the min and max trees' lowest level.
    #[inline(always)]
    fn bottom_leaves(&self) -> usize {
        ARITY.pow(self.bottom() as u32)
    }

    fn extremum(&self, kind: TreeKind, level: usize, j: usize) -> u64 {
        Self::encode(kind, self.entry(kind, level, j).load(Ordering::SeqCst))
    }

    /// The children of entry `j` of a level whose level below starts at word `word`
    /// with `size` entries: up to `ARITY` words.
    fn node(&self, word: usize, size: usize, j: usize) -> &'a [AtomicU64] {
        let first = ARITY * j;
        &self.words[word + first..word + size.min(first + ARITY)]
    }

    /// Entry `j` of level `level` of a min or max tree as its children give it now (a
    /// mass code; see the module docs of `sumtree`).
    ///
    /// One pass over the node's words, the rule chosen once: what every refresh of an
    /// update runs two or three times.
    fn recompute(&self, kind: TreeKind, level: usize, j: usize) -> u64 {
        if level == 1 || (level == 2 && self.bottom() == 2) {
            // The leaves below: `ARITY` of them under level 1, `ARITY * ARITY` (level
            // 1's nodes, folded as one run) under the lowest level of two.
            let under = ARITY.pow(level as u32);
            let first = (under * j).min(self.layout.leaves);
            let end = (first + under).min(self.layout.leaves);
            let word = self.layout.leaf_word(0);
            return super::extremum::of_leaves(kind, &self.words[word + first..word + end]);
        }
        let node = self.node(
            self.layout.entry_word(kind, level - 1, 0),
            self.layout.size(level - 1),
            j,
        );
        // Entries are stored encoded, the min tree's negated, so the min of the
        // entries is the negation of the max of their words.
        match kind {
            TreeKind::Min => !fold_node(node, 0, u64::max),
            TreeKind::Max => fold_node(node, 0, u64::max),
            TreeKind::Sum => unreachable!("the sum tree is kept by deltas"),
        }
    }

    /// Brings entry `j` of `level` of a min or max tree up to date with its children;
    /// returns whether it changed (see the module's ordering notes).
    ///
    /// A call that stored a value reports a change even if a later pass finds the entry
    /// already right, so that its caller still refreshes the level above.
    fn refresh(&self, kind: TreeKind, level: usize, j: usize) -> bool {
        let entry = self.entry(kind, level, j);
        let mut changed = false;
        loop {
            let cur = entry.load(Ordering::SeqCst);
            let want = self.recompute(kind, level, j);
            if want == Self::encode(kind, cur) {
                return changed;
            }
            let stored = Self::encode(kind, want);
            if entry
                .compare_exchange(cur, stored, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                changed = true;
                if self.recompute(kind, level, j) == want {
                    return true;
                }
            }
        }
    }

    /// Carries a change of leaves `lo..hi` up tree `kind`, from its lowest level to
    /// the root, stopping at a level where nothing changed.
    fn refresh_leaves(&self, kind: TreeKind, lo: usize, hi: usize) {
        let (bottom, f) = (self.bottom(), self.bottom_leaves());
        let (lo, hi) = (lo / f, (hi - 1) / f + 1);
        let mut changed = false;
        for j in lo..hi {
            changed |= self.refresh(kind, bottom, j);
        }
        if changed && bottom < self.layout.top() {
            self.refresh_above(kind, bottom + 1, lo, hi);
        }
    }

    /// Carries a change of entries `lo..hi` of level `level - 1` up tree `kind`,
    /// from `level` to the root, stopping at a level where nothing changed.
    #[inline(never)]
    fn refresh_above(&self, kind: TreeKind, level: usize, lo: usize, hi: usize) {
        let (mut lo, mut hi) = (lo, hi);
        for level in level..=self.layout.top() {
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

    /// Carries one leaf's change from mass code `old` to `new` up the min and max
    /// trees:
    ///
    /// - A new code that beats the entry above (a lower min, a higher max) can only
    ///   improve the entries above it: it climbs ([`Tree::climb`]), with nothing
    ///   recomputed. This is what most updates of a buffer do whose new rows come in at
    ///   the largest priority.
    /// - Otherwise an entry that is not the old code cannot change: the tree is
    ///   skipped. (If the entry is stale, whoever made it so is on the way to refresh
    ///   it, and will read this leaf's new code.)
    /// - Otherwise the leaf held the entry's extremum and gave it up: the entries are
    ///   refreshed from their children, up while they change.
    fn refresh_extrema_after(&self, leaf: usize, old: u64, new: u64) {
        for &kind in self.layout.extrema() {
            let above = self
                .layout
                .entry_word(kind, self.bottom(), leaf / self.bottom_leaves());
            self.refresh_extremum_after(kind, above, leaf, old, new);
        }
    }

    /// [`Tree::refresh_extrema_after`] in tree `kind`, whose entry above the leaf is
    /// word `above`: inlined into an update's loop, which looks up the word's level
    /// once for a batch, and most updates need no more than its one load. A climb or a
    /// refresh (each about one update in 256, at random priorities) is a call.
    #[inline(always)]
    fn refresh_extremum_after(
        &self,
        kind: TreeKind,
        above: usize,
        leaf: usize,
        old: u64,
        new: u64,
    ) {
        let as_mass = |v: u64| if v == 0 { identity(kind) } else { v };
        let (old, new) = (as_mass(old), as_mass(new));
        let entry = Self::encode(kind, self.words[above].load(Ordering::SeqCst));
        if combine(kind, entry, new) != entry {
            self.climb(kind, leaf, new);
        } else if old == entry {
            self.refresh_leaves(kind, leaf, leaf + 1);
        }
    }

    /// Improves the entries of tree `kind` above leaf `leaf` to its code `code`, from
    /// the tree's lowest level up while `code` beats them.
    ///
    /// Each entry is improved by a `fetch_max` of its stored word (the min tree's are
    /// negated, so both trees improve upwards), and then the child it was improved
    /// from is read again: a climb carries a value, not what the children hold, and the
    /// child may have moved on since it was read (a later update of the same leaf,
    /// which found the entry not yet improved and so had nothing to carry). If it did,
    /// the entry may now be better than its children: it is refreshed from them, and
    /// the change carried up as a refresh carries it. If the child still holds `code`,
    /// the entry is right by it, and whoever changes the child next reads the entry
    /// after this improvement.
    ///
    /// A climb never undoes a refresh, nor a refresh a climb: a refresh stores by
    /// compare-exchange against the word it read and then reads the children again, so
    /// a climb before its store makes it fail and reread, and one after its store
    /// improves on what it stored; the refresh's second reading of the children finds
    /// the climbing child (or, if it moved on, the climber's own check does).
    #[inline(never)]
    fn climb(&self, kind: TreeKind, leaf: usize, code: u64) {
        debug_assert_ne!(code, identity(kind), "an empty leaf beats no entry");
        let stored = Self::encode(kind, code);
        let bottom = self.bottom();
        let mut j = leaf;
        for level in bottom..=self.layout.top() {
            let child = j;
            j = if level == bottom {
                leaf / self.bottom_leaves()
            } else {
                j / ARITY
            };
            let entry = self.entry(kind, level, j);
            if entry.load(Ordering::SeqCst) >= stored
                || entry.fetch_max(stored, Ordering::SeqCst) >= stored
            {
                // As good already: whatever made it so carries itself up.
                return;
            }
            let holds = if level == bottom {
                self.leaf(child).code() == code
            } else {
                self.extremum(kind, level - 1, child) == code
            };
            if !holds {
                // This entry changed (the climb stored it): carried up whatever its
                // refresh finds.
                self.refresh(kind, level, j);
                self.refresh_above(kind, level + 1, j, j + 1);
                return;
            }
        }
    }

    /// Adds the deltas of entries `lo..lo + deltas.len()` of level `level - 1` to
    /// their ancestors from `level` up, one `fetch_add` per touched entry.
    ///
    /// Deltas add up modulo 2^64 (`wrapping_add`, then `as u64`): one leaf's change
    /// fits an `i64` (every mass is below 2^63), but a node's many changes together
    /// need not (sixteen leaves at `value_max` of a small tree pass `i64::MAX`). Every
    /// sum entry's true value fits a `u64`, so the entry the wrapping adds leave is
    /// exact.
    fn add_deltas(&self, level: usize, lo: usize, deltas: &[i64]) {
        let mut lo = lo;
        let mut below: SmallVec<[i64; 64]> = deltas.into();
        for level in level..=self.layout.top() {
            let start = lo / ARITY;
            let mut sums: SmallVec<[i64; 64]> =
                smallvec::smallvec![0; (lo + below.len() - 1) / ARITY + 1 - start];
            for (k, d) in below.iter().enumerate() {
                let sum = &mut sums[(lo + k) / ARITY - start];
                *sum = sum.wrapping_add(*d);
            }
            for (k, &d) in sums.iter().enumerate() {
                if d != 0 {
                    self.entry(TreeKind::Sum, level, start + k)
                        .fetch_add(d as u64, Ordering::Relaxed);
                }
            }
            lo = start;
            below = sums;
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
            self.entry(TreeKind::Sum, level, j)
                .fetch_add(delta as u64, Ordering::Relaxed);
        }
    }

    /// Gives slots `first..first + n` new rows' leaves, slot `first + k` the leaf
    /// `leaf_of(k)`. A slot whose leaf already belongs to a newer row (a writer that
    /// lapped this one) keeps it. Each leaf changes by a compare-exchange, which yields
    /// its exact old mass for the sums even while a stale priority update races it.
    ///
    /// A node's leaves are made before any is given: a compare-exchange waits for
    /// every instruction before it, so leaves made between them (a power each, for
    /// rows with priorities of their own) would be made one at a time, where made
    /// together their powers overlap.
    ///
    /// `turn`: the caller is an appender, counted ([`Tree::appending`]), holding its
    /// shard's leaf turn over these slots (`shard.rs`): if it is then the only leaf
    /// changer, it stores the leaves plainly, and a node whose leaves are all its own
    /// with the entries above them (see the module's "Plain leaves").
    pub(crate) fn set_run(
        &self,
        first: usize,
        n: usize,
        leaf_of: impl Fn(usize) -> Leaf,
        turn: bool,
    ) {
        self.set_run_with(first, n, leaf_of, None, turn);
    }

    /// [`Tree::set_run`] of leaves all `leaf`: new rows of one priority, as rows
    /// without priorities of their own are. A whole node's sum is worked out
    /// once for the run.
    pub(crate) fn set_run_of(&self, first: usize, n: usize, leaf: Leaf, turn: bool) {
        self.set_run_with(first, n, |_| leaf, Some(leaf), turn);
    }

    /// [`Tree::set_run`], with `same`, the leaf every slot gets if they all get one.
    #[inline(always)]
    fn set_run_with(
        &self,
        first: usize,
        n: usize,
        leaf_of: impl Fn(usize) -> Leaf,
        same: Option<Leaf>,
        turn: bool,
    ) {
        let mut others = if turn {
            self.others_changing()
        } else {
            Others::Unknown
        };
        let same = same
            .filter(|_| turn)
            .map(|leaf| self.whole_node([leaf; ARITY]));
        let first_node = first / ARITY;
        self.change_run(first, n, |node, slots| {
            // An appender that found others changing leaves looks again every few
            // nodes: an updater it found is often done before its run is.
            if turn
                && others == Others::Unknown
                && (node + 1 - first_node).is_multiple_of(RECHECK_NODES)
            {
                others = self.others_changing();
            }
            let plain = match others {
                Others::None => true,
                Others::Marked(markers) => !self.marked(markers, slots.clone()),
                Others::Unknown => false,
            };
            if let Some(whole) = same.as_ref().filter(|_| plain && slots.len() == ARITY) {
                return self.store_node(node, whole);
            }
            let mut leaves = [Leaf::EMPTY; ARITY];
            for (leaf, i) in leaves.iter_mut().zip(slots.clone()) {
                *leaf = leaf_of(i - first);
            }
            if !plain {
                let give = |d: i64, (i, leaf)| d.wrapping_add(self.give_leaf(i, leaf));
                return NodeChange::Leaves(slots.zip(leaves).fold(0i64, give));
            }
            if slots.len() == ARITY {
                return self.store_node(node, &self.whole_node(leaves));
            }
            let store = |d: i64, (i, leaf)| d.wrapping_add(self.store_leaf(i, leaf));
            let delta = slots.zip(leaves).fold(0i64, store);
            // The stores before the loads of the node's refresh: what a
            // compare-exchange of each leaf would order, once for the node (see the
            // module's "Plain leaves").
            fence(Ordering::SeqCst);
            NodeChange::Leaves(delta)
        });
    }

    /// Brings the leaves of slots `first..first + n` to the masses of their raw words:
    /// `mass_of(i, p)` for slot `i`'s priority `p`, none for a row without one. A leaf
    /// whose raw word names another row (a new row's writer between publishing and
    /// setting its leaf, which then sets it) is left alone, and so is one whose priority
    /// `mass_of` refuses (`None`: too heavy for the caller's scale, which the caller
    /// then changes).
    pub(crate) fn remass_run(
        &self,
        first: usize,
        n: usize,
        mut mass_of: impl FnMut(usize, f64) -> Option<u64>,
    ) {
        /// Raw words loading ahead: each sits in its own slot, a miss apart.
        const RAWS_AHEAD: usize = 8;
        let _changing = self.count(UPDATER);
        for i in first..(first + RAWS_AHEAD).min(first + n) {
            self.prefetch_raw(i);
        }
        self.change_run(first, n, |_, slots| {
            NodeChange::Leaves(slots.fold(0i64, |d, i| {
                if i + RAWS_AHEAD < first + n {
                    self.prefetch_raw(i + RAWS_AHEAD);
                }
                d.wrapping_add(self.follow_raw(i, &mut mass_of))
            }))
        });
    }

    fn prefetch_raw(&self, i: usize) {
        crate::storage::atomic_copy::prefetch(
            self.words,
            self.layout.raw_word(i) * 8,
            crate::storage::atomic_copy::Intent::Read,
        );
    }

    /// Starts loading the lines of words `first..=last`, to write.
    fn prefetch_to_write(&self, first: usize, last: usize) {
        crate::storage::atomic_copy::prefetch_lines(
            self.words,
            first * 8,
            (last + 1) * 8,
            crate::storage::atomic_copy::Intent::Write,
        );
    }

    /// Changes the leaves of slots `first..first + n` by `change(node, slots)`, called
    /// with each node and its slots among them in turn, and carries the changes up the
    /// trees.
    ///
    /// One pass, a node at a time: its leaves, then the sum entry above them (unless
    /// `change` set it too), while the leaves are in cache; then the sum levels above,
    /// aggregated, and the min and max entries over the run's leaves, from the trees'
    /// lowest level up.
    fn change_run(
        &self,
        first: usize,
        n: usize,
        mut change: impl FnMut(usize, std::ops::Range<usize>) -> NodeChange,
    ) {
        if n == 0 {
            return;
        }
        let end = first + n;
        let (lo, hi) = (first / ARITY, (end - 1) / ARITY + 1);
        // The leaves' lines, and those of the entries above them, loading
        // at once: a locked instruction on a line that misses waits out the miss
        // alone. New rows over rows whose priorities a learner spread change every
        // node's sum, min and max, 24 lines of entries over 1,000 rows (over rows of
        // one mass, none: they are read and left). Beside a learner, the leaves of
        // 1,000 new rows took 8.3-8.5 us with those lines missed in turn, 6.6-8.2 with
        // them loading, three runs alternating.
        let layout = &self.layout;
        self.prefetch_to_write(layout.leaf_word(first), layout.leaf_word(end - 1));
        self.prefetch_to_write(
            layout.entry_word(TreeKind::Sum, 1, lo),
            layout.entry_word(TreeKind::Sum, 1, hi - 1),
        );
        let (bottom, f) = (self.bottom(), self.bottom_leaves());
        for &kind in layout.extrema() {
            self.prefetch_to_write(
                layout.entry_word(kind, bottom, first / f),
                layout.entry_word(kind, bottom, (end - 1) / f),
            );
        }
        let mut deltas: SmallVec<[i64; 64]> = SmallVec::with_capacity(hi - lo);
        // Whether `change` set any node whole, with its sum.
        let mut whole = false;
        for node in lo..hi {
            let slots = (node * ARITY).max(first)..((node + 1) * ARITY).min(end);
            let delta = match change(node, slots) {
                NodeChange::Leaves(delta) => {
                    // Modulo 2^64: see `add_deltas`.
                    if delta != 0 {
                        self.entry(TreeKind::Sum, 1, node)
                            .fetch_add(delta as u64, Ordering::Relaxed);
                    }
                    delta
                }
                NodeChange::Whole { delta } => {
                    whole = true;
                    delta
                }
            };
            deltas.push(delta);
        }
        if whole {
            // SYNC POINT: the leaves and entries stored plainly before the loads of
            // the refreshes below, and of the levels' above (see the module's "Plain
            // leaves"): what a compare-exchange of each would order, once.
            fence(Ordering::SeqCst);
        }
        self.add_deltas(2, lo, &deltas);
        for &kind in self.layout.extrema() {
            self.refresh_leaves(kind, first, end);
        }
    }

    /// A whole node of new leaves, `leaves`, with the sum they make.
    fn whole_node(&self, leaves: [Leaf; ARITY]) -> WholeNode {
        WholeNode {
            leaves,
            sum: leaves.iter().fold(0u64, |s, l| s.wrapping_add(l.value())),
        }
    }

    /// Sets node `node`'s leaves, all of them new rows', and the sum entry above them
    /// (`whole`), by an appender alone in changing leaves: the entry first, with a
    /// plain store, and then the leaves, each with a `Release` store (see the module's
    /// "Whole nodes"). Whoever changes a leaf next read its store, so the entry's too:
    /// its own change of the entry comes after this one. The min and max entries over
    /// the node are its caller's to refresh ([`Tree::change_run`]).
    ///
    /// Reads no leaf: the old leaves' mass is the sum entry's, exact while nobody
    /// else changes them.
    ///
    /// Inlined into [`Tree::set_run`]'s loop: a call per node took 2-7% longer
    /// extends of 1,000 rows, two runs alternating in one process.
    #[inline(always)]
    fn store_node(&self, node: usize, whole: &WholeNode) -> NodeChange {
        let entry = self.entry(TreeKind::Sum, 1, node);
        let old = entry.load(Ordering::Relaxed);
        crate::sync::store_beside_rmw(entry, whole.sum, Ordering::Relaxed);
        let at = self.layout.leaf_word(node * ARITY);
        for (atomic, leaf) in self.words[at..at + ARITY].iter().zip(&whole.leaves) {
            debug_assert!(
                !holds_newer_row(Leaf::from_bits(atomic.load(Ordering::Relaxed)), *leaf),
                "a newer row's writer set its leaves while this one held the leaf turn"
            );
            crate::sync::store_beside_rmw(atomic, leaf.bits(), Ordering::Release);
        }
        NodeChange::Whole {
            delta: whole.sum.wrapping_sub(old) as i64,
        }
    }

    /// Gives slot `i` a new row's leaf unless a newer row holds it; the change in mass.
    fn give_leaf(&self, i: usize, leaf: Leaf) -> i64 {
        let atomic = self.leaf_atomic(i);
        let mut cur = Leaf::from_bits(atomic.load(Ordering::SeqCst));
        loop {
            if holds_newer_row(cur, leaf) {
                return 0;
            }
            match atomic.compare_exchange(
                cur.bits(),
                leaf.bits(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return leaf.value() as i64 - cur.value() as i64,
                Err(now) => cur = Leaf::from_bits(now),
            }
        }
    }

    /// [`Tree::give_leaf`] by an appender that is the only leaf changer: a plain load
    /// and store, nobody else changing the leaf between them.
    fn store_leaf(&self, i: usize, leaf: Leaf) -> i64 {
        let atomic = self.leaf_atomic(i);
        let cur = Leaf::from_bits(atomic.load(Ordering::Relaxed));
        if holds_newer_row(cur, leaf) {
            return 0;
        }
        crate::sync::store_beside_rmw(atomic, leaf.bits(), Ordering::Relaxed);
        leaf.value() as i64 - cur.value() as i64
    }

    /// Brings slot `i`'s leaf to the mass of its raw word, if both name one row (see
    /// [`Tree::remass_run`]); the change in mass.
    fn follow_raw(&self, i: usize, mass_of: &mut impl FnMut(usize, f64) -> Option<u64>) -> i64 {
        let (leaf, raw) = (self.leaf_atomic(i), self.raw_atomic(i));
        let mut delta = 0i64;
        loop {
            // The leaf before the raw word: a leaf an update set is read with that
            // update's raw word or a later one (see the module's ordering notes).
            let cur = Leaf::from_bits(leaf.load(Ordering::SeqCst));
            let word = raw.load(Ordering::SeqCst);
            let (lap, p) = raw_of(word);
            if !cur.is_of(lap) {
                return delta;
            }
            let mass = match p {
                None => 0,
                Some(p) => match mass_of(i, p) {
                    Some(m) => m,
                    None => return delta,
                },
            };
            let new = Leaf::new(lap, mass);
            if new != cur {
                if leaf
                    .compare_exchange(cur.bits(), new.bits(), Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    continue;
                }
                delta = delta.wrapping_add(new.value() as i64 - cur.value() as i64);
            }
            // A raw word that moved since: its writer may have set the leaf before
            // this did; follow it again.
            if raw.load(Ordering::SeqCst) == word {
                return delta;
            }
        }
    }

    /// Applies many priority updates at once, `applied` receiving whether each was (it
    /// is not if the leaf or the raw word no longer names the update's lap: its row was
    /// replaced, or emptied). Each sets the raw word first, then the leaf, each by its
    /// own compare-exchange, then adds its delta to the sum entries above and refreshes
    /// the min and max entries above, all while the lines it prefetched a few updates
    /// earlier are at hand. The deltas of the upper levels (small, and shared by many
    /// updates) are gathered and added last, one `fetch_add` per touched entry rather
    /// than one per update, visiting only the entries the updates reached (a million
    /// leaves, 256 updates: 245 entries and a branch on each that went either way at
    /// random, 0.3 us of a 12 us update). Additions commute, so the result is the same
    /// as one update at a time.
    ///
    /// Returns the slots of applied updates whose raw word another writer changed
    /// after the update set it (loaded right after the update's leaf, while its line is
    /// at hand): the caller re-masses those leaves from their raw words (see the
    /// module's ordering notes).
    pub(crate) fn update_many(
        &self,
        items: &[Update],
        applied: &mut [bool],
        room: &mut DeltaRoom,
    ) -> SmallVec<[usize; 4]> {
        /// Levels of at most this many entries gather their deltas densely.
        const DENSE_ENTRIES: usize = 1024;
        /// Updates whose lines are loading while one is applied: enough to overlap
        /// their misses, few enough that their lines (five or so each) stay in L1
        /// until used, which prefetching a whole batch's would not.
        const UPDATES_AHEAD: usize = 16;
        let _changing = self.count_updates(items);
        let top = self.layout.top();
        // The lowest level whose deltas gather densely; the levels above it take
        // theirs from it at the end (`add_deltas`).
        let dense_from = (1..=top)
            .find(|&l| self.layout.size(l) <= DENSE_ENTRIES)
            .unwrap_or(top);
        // Zeroed whole each batch, not trusted to be left so: a batch that unwound
        // midway would leave its deltas for the next to add.
        let DeltaRoom { dense, touched } = room;
        dense.clear();
        dense.resize(self.layout.size(dense_from), 0);
        // One entry may come twice in `touched` (if its deltas summed to nothing and
        // then did not): the flush visits these rather than every entry, each of which
        // it would branch on at random.
        touched.clear();
        // The first words of the levels an update touches, looked up once: a lookup
        // is a bounds-checked read of the layout, and an update made eleven of them.
        // The sum levels' are the layout's own `sum_levels`.
        let sums = &self.layout.sum_levels[1..dense_from];
        let extrema: SmallVec<[usize; 2]> = self
            .layout
            .extrema()
            .iter()
            .map(|&kind| self.layout.entry_word(kind, self.bottom(), 0))
            .collect();
        let f = self.bottom_leaves();
        // What an update writes: its leaf, its raw word, its sum entry on each level
        // below `dense`'s, and the min and max entries above the leaf. Each locked
        // instruction then finds its line ready instead of waiting out a miss, one
        // after another (with the pipeline drained, as a locked instruction leaves it).
        // An update made after a learner's passes have pushed the tree out of the
        // cache, as every real one is, took 1.2 times as long with only the first sum
        // level prefetched (and the dense flush's below not at all).
        let line = |word: usize| {
            crate::storage::atomic_copy::prefetch(
                self.words,
                word * 8,
                crate::storage::atomic_copy::Intent::Write,
            )
        };
        let prefetch = |&Update { leaf: i, .. }: &Update| {
            let parent = i / ARITY;
            line(self.layout.leaf_word(i));
            line(self.layout.raw_word(i));
            let mut j = parent;
            for &(sum, _) in sums {
                line(sum + j);
                j /= ARITY;
            }
            for &e in &extrema {
                line(e + i / f);
            }
        };
        items.iter().take(UPDATES_AHEAD).for_each(prefetch);
        let mut moved = SmallVec::new();
        for (k, (u, ok)) in items.iter().zip(applied.iter_mut()).enumerate() {
            if let Some(ahead) = items.get(k + UPDATES_AHEAD) {
                prefetch(ahead);
            }
            let new = Leaf::new(u.lap, u.mass);
            let Some(old) = self.apply_update(u, new) else {
                *ok = false;
                continue;
            };
            *ok = true;
            if self.raw_bits_at(u.leaf) != u.raw {
                moved.push(u.leaf);
            }
            let delta = new.value() as i64 - old.value() as i64;
            if delta != 0 {
                let mut j = u.leaf / ARITY;
                for &(level, _) in sums {
                    self.words[level + j].fetch_add(delta as u64, Ordering::Relaxed);
                    j /= ARITY;
                }
                // Wrapping, as `add_deltas` explains: many updates' deltas together may
                // pass `i64::MAX`; the entry's sum is exact mod 2^64.
                if dense[j] == 0 {
                    touched.push(j);
                }
                dense[j] = dense[j].wrapping_add(delta);
            }
            for (&kind, &first) in self.layout.extrema().iter().zip(&extrema) {
                let above = first + u.leaf / f;
                self.refresh_extremum_after(kind, above, u.leaf, old.code(), new.code());
            }
        }
        // The level above `dense`'s, gathered as its entries are added (a level
        // above one of at most `DENSE_ENTRIES` has at most `DENSE_ENTRIES / ARITY`).
        let mut above: SmallVec<[i64; DENSE_ENTRIES / ARITY]> = SmallVec::new();
        if dense_from < top {
            above.resize(self.layout.size(dense_from + 1), 0);
        }
        // Their lines first, all at once: they are few (at most `DENSE_ENTRIES`
        // entries, 128 lines), and each add below would otherwise wait out its miss.
        let dense_word = self.layout.entry_word(TreeKind::Sum, dense_from, 0);
        for &j in touched.iter() {
            line(dense_word + j);
        }
        for &j in touched.iter() {
            // Taken, so that an entry listed twice is added once.
            let d = std::mem::take(&mut dense[j]);
            if d != 0 {
                self.entry(TreeKind::Sum, dense_from, j)
                    .fetch_add(d as u64, Ordering::Relaxed);
                if let Some(a) = above.get_mut(j / ARITY) {
                    *a = a.wrapping_add(d);
                }
            }
        }
        if !above.is_empty() {
            self.add_deltas(dense_from + 2, 0, &above);
            for (j, &d) in above.iter().enumerate() {
                if d != 0 {
                    self.entry(TreeKind::Sum, dense_from + 1, j)
                        .fetch_add(d as u64, Ordering::Relaxed);
                }
            }
        }
        moved
    }

    /// One update of [`Tree::update_many`]: the raw word, then the leaf (`new`). The
    /// leaf it replaced if applied.
    fn apply_update(&self, u: &Update, new: Leaf) -> Option<Leaf> {
        let leaf = self.leaf_atomic(u.leaf);
        let mut cur = Leaf::from_bits(leaf.load(Ordering::SeqCst));
        if !cur.is_of(u.lap) || !self.set_raw(u.leaf, u.lap, u.raw) {
            return None;
        }
        loop {
            match leaf.compare_exchange(cur.bits(), new.bits(), Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(cur),
                Err(now) => {
                    cur = Leaf::from_bits(now);
                    // A newer row's writer stored its raw word after this update's
                    // (the update's compare-exchange would have failed on the lap
                    // otherwise): nothing of the update is left.
                    if !cur.is_of(u.lap) {
                        return None;
                    }
                }
            }
        }
    }

    /// Empties slot `i` if it holds the row of lap `lap`: its raw word first (an
    /// update that comes later finds no priority and is dropped; one whose leaf lands
    /// later finds the raw word changed and follows it), then its mass. A slot a writer
    /// has since given to a new row is left alone, its leaf too if the raw word is
    /// already the new row's: that writer replaces the leaf (and may be storing it
    /// plainly; see the module's "Plain leaves").
    pub(crate) fn clear(&self, i: usize, lap: u32) {
        self.clear_with(i, lap, false)
    }

    /// [`Tree::clear`] of a row whose slot a writer that died had begun to replace: its
    /// raw word names that writer's lap, and nobody will set the leaf, which is
    /// emptied all the same. Only where no appender sets the shard's leaves (a
    /// recovery holding the shard's lease).
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // no shared regions under loom
    pub(crate) fn clear_abandoned(&self, i: usize, lap: u32) {
        self.clear_with(i, lap, true)
    }

    fn clear_with(&self, i: usize, lap: u32, abandoned: bool) {
        let _changing = self.count(UPDATER);
        let raw = self.raw_atomic(i);
        let mut word = raw.load(Ordering::SeqCst);
        while raw_of(word).0 == lap && raw_of(word).1.is_some() {
            match raw.compare_exchange(
                word,
                raw_bits(lap, None),
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(now) => word = now,
            }
        }
        if raw_of(word).0 != lap && !abandoned {
            return;
        }
        let leaf = self.leaf_atomic(i);
        loop {
            let cur = Leaf::from_bits(leaf.load(Ordering::SeqCst));
            if !cur.is_of(lap) || cur.value() == 0 {
                return;
            }
            let new = Leaf::new(lap, 0);
            if leaf
                .compare_exchange(cur.bits(), new.bits(), Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                self.add_delta(i, -(cur.value() as i64));
                self.refresh_extrema_after(i, cur.code(), 0);
                return;
            }
        }
    }

    /// The leaf holding mass `t` (`0 <= t < total`), counting leaves left to right.
    pub(crate) fn descend(&self, t: u64) -> Option<Landing> {
        let mut targets = [(t, None)];
        self.descend_many(None, &mut targets);
        targets[0].1
    }

    /// Reads the running totals of the deepest level of at most `room.len()` entries
    /// below the root into `room`, for a batch of descents to start from
    /// ([`Tree::descend_many`]); `None` if only the root fits.
    pub(crate) fn summit<'s>(&self, room: &'s mut [u64]) -> Option<Summit<'s>> {
        let level = (0..self.layout.top()).find(|&l| self.layout.size(l) <= room.len())?;
        let (word, size) = self.layout.sum_levels[level];
        let mut total = 0u64;
        for (slot, w) in room.iter_mut().zip(&self.words[word..word + size]) {
            // Modulo 2^64, as the sums add (`add_deltas`).
            total = total.wrapping_add(if level == 0 {
                pick::mass::<true>(w)
            } else {
                pick::mass::<false>(w)
            });
            *slot = total;
        }
        Some(Summit {
            level,
            totals: &room[..size],
        })
    }

    /// Descends for every target at once, level by level, so that the cache misses of
    /// different descents overlap instead of queueing. With a `summit` of this tree,
    /// each starts at the summit's level, found there by one binary search.
    pub(crate) fn descend_many(
        &self,
        summit: Option<Summit<'_>>,
        targets: &mut [(u64, Option<Landing>)],
    ) {
        if crate::cpu::avx512f() && crate::cpu::avx2() {
            // SAFETY: the CPU has AVX-512, AVX2 and POPCNT (which AVX2 comes with
            // wherever `cpu::avx2` says so).
            unsafe { self.descend_many_avx512(summit, targets) }
        } else if crate::cpu::avx2() {
            // SAFETY: the CPU has AVX2 and POPCNT.
            unsafe { self.descend_many_avx2(summit, targets) }
        } else {
            self.descend_many_with::<{ pick::SCALAR }>(summit, targets)
        }
    }

    /// [`Tree::descend_many`] compiled for, and counting with, AVX2 (`sumtree/pick.rs`).
    ///
    /// # Safety
    /// The CPU has AVX2 and POPCNT.
    #[cfg_attr(
        all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        ),
        target_feature(enable = "avx2,popcnt")
    )]
    unsafe fn descend_many_avx2(
        &self,
        summit: Option<Summit<'_>>,
        targets: &mut [(u64, Option<Landing>)],
    ) {
        self.descend_many_with::<{ pick::AVX2 }>(summit, targets)
    }

    /// [`Tree::descend_many`] compiled for, and counting with, AVX-512
    /// (`sumtree/pick.rs`).
    ///
    /// # Safety
    /// The CPU has AVX-512 (foundation), AVX2 and POPCNT.
    #[cfg_attr(
        all(
            target_arch = "x86_64",
            not(replaybuf_loom),
            not(replaybuf_atomic_copy)
        ),
        target_feature(enable = "avx512f,avx2,popcnt")
    )]
    unsafe fn descend_many_avx512(
        &self,
        summit: Option<Summit<'_>>,
        targets: &mut [(u64, Option<Landing>)],
    ) {
        self.descend_many_with::<{ pick::AVX512 }>(summit, targets)
    }

    #[inline(always)]
    fn descend_many_with<const SIMD: pick::Simd>(
        &self,
        summit: Option<Summit<'_>>,
        targets: &mut [(u64, Option<Landing>)],
    ) {
        let mut nodes: smallvec::SmallVec<[usize; 32]> = smallvec::smallvec![0; targets.len()];
        // The words of level `level` of the sum tree, the leaves as level 0.
        let level_words = |level: usize| {
            let (word, size) = self.layout.sum_levels[level];
            &self.words[word..word + size]
        };
        let start = match summit {
            Some(summit) => {
                let below = summit.level.checked_sub(1).map(level_words);
                for ((t, _), node) in targets.iter_mut().zip(nodes.iter_mut()) {
                    *node = summit.find(t);
                    if let Some(below) = below {
                        Self::prefetch_node(below, *node);
                    }
                }
                summit.level
            }
            None => {
                let top = self.layout.top();
                Self::prefetch_node(level_words(top - 1), 0);
                top
            }
        };
        for level in (1..=start).rev() {
            let (children, below) = (level_words(level - 1), level.checked_sub(2));
            let below = below.map(level_words);
            // A descent's next node starts loading as soon as it is known, and is read
            // a whole level of the other descents later: its miss overlaps their picks
            // instead of stalling its own.
            for ((t, _), node) in targets.iter_mut().zip(nodes.iter_mut()) {
                *node = if level == 1 {
                    Self::pick_child::<true, SIMD>(children, *node, t)
                } else {
                    Self::pick_child::<false, SIMD>(children, *node, t)
                };
                if let Some(below) = below {
                    Self::prefetch_node(below, *node);
                }
            }
        }
        for ((t, landing), &leaf) in targets.iter_mut().zip(&nodes) {
            let l = self.leaf(leaf);
            *landing = (l.value() > *t && *t != u64::MAX).then_some(Landing {
                leaf,
                value: l.value(),
                lap: l.lap(),
            });
        }
    }

    /// Starts loading node `j` of a level's words (up to two lines).
    #[inline(always)]
    fn prefetch_node(level: &[AtomicU64], j: usize) {
        for line in 0..ARITY.div_ceil(8) {
            crate::storage::atomic_copy::prefetch(
                level,
                (ARITY * j + 8 * line) * 8,
                crate::storage::atomic_copy::Intent::Read,
            );
        }
    }

    /// Among `children` (a level's words) of node `j`, the one holding mass `*t`; `*t`
    /// becomes the mass left within that child. Clamps to the last child with mass if
    /// a racing update made the children sum to less than `*t`. `LEAVES`: the children
    /// are leaves, whose words hold a lap and a mass code.
    #[inline(always)]
    fn pick_child<const LEAVES: bool, const SIMD: pick::Simd>(
        children: &[AtomicU64],
        j: usize,
        t: &mut u64,
    ) -> usize {
        let first = ARITY * j;
        // The child holding `t` is the number of children whose running total ends at
        // or before `t` (a child without mass never holds it); the mass before it is
        // the running total of the child before (`sumtree/pick.rs`). All but the last
        // node of a level are full.
        let (node, (c, before)) = match children.get(first..first + ARITY) {
            Some(full) => {
                let full = <&[AtomicU64; ARITY]>::try_from(full).expect("ARITY words");
                (&full[..], pick::count_full::<LEAVES, SIMD>(full, *t))
            }
            None => {
                let node = &children[first.min(children.len())..];
                (node, pick::count_partial::<LEAVES>(node, *t))
            }
        };
        if let Some(left) = t.checked_sub(before).filter(|_| c < node.len()) {
            *t = left;
            return first + c;
        }
        // `t` is past this node's mass (a racing update shrank it), or racing words
        // wrapped the running totals. Clamp to the last child with mass; with none, the
        // caller's check of the landing leaf rejects the draw.
        let mass = pick::mass::<LEAVES>;
        match node.iter().rposition(|w| mass(w) > 0) {
            Some(c) => {
                *t = mass(&node[c]).saturating_sub(1);
                first + c
            }
            None => {
                *t = u64::MAX;
                first
            }
        }
    }

    /// A slot whose mass is the largest (what a max-tree descent finds), or `None`.
    pub(crate) fn argmax(&self) -> Option<usize> {
        let max = self.extremum(TreeKind::Max, self.layout.top(), 0);
        if max == 0 {
            return None;
        }
        let (bottom, f) = (self.bottom(), self.bottom_leaves());
        let mut j = 0;
        for level in (bottom..=self.layout.top()).rev() {
            let children = if level == bottom {
                f * j..(f * (j + 1)).min(self.layout.leaves)
            } else {
                ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1))
            };
            j = children
                .clone()
                .find(|&c| {
                    let v = if level == bottom {
                        self.leaf(c).code()
                    } else {
                        self.extremum(TreeKind::Max, level - 1, c)
                    };
                    v == max
                })
                .unwrap_or(children.start);
        }
        Some(j)
    }

    /// Sets every leaf to `leaf_of(i)`, asked of the slots in order, and recomputes
    /// every entry of the three trees from them, with plain stores: for a tree nobody
    /// else touches (a region being recovered or loaded). Clears the marks, which an
    /// updater that died may have left.
    pub(crate) fn rebuild(&self, mut leaf_of: impl FnMut(usize) -> Leaf) {
        let marks = self.layout.marks..self.layout.end();
        for mark in &self.words[marks] {
            mark.store(0, Ordering::Relaxed);
        }
        for i in 0..self.layout.leaves {
            self.leaf_atomic(i)
                .store(leaf_of(i).bits(), Ordering::Relaxed);
        }
        for level in 1..=self.layout.top() {
            for j in 0..self.layout.size(level) {
                let children = ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1));
                let sum = children
                    .map(|c| {
                        if level == 1 {
                            self.leaf(c).value()
                        } else {
                            self.entry(TreeKind::Sum, level - 1, c)
                                .load(Ordering::Relaxed)
                        }
                    })
                    .fold(0u64, u64::wrapping_add);
                self.entry(TreeKind::Sum, level, j)
                    .store(sum, Ordering::Relaxed);
                if level < self.bottom() {
                    continue;
                }
                for &kind in self.layout.extrema() {
                    let v = self.recompute(kind, level, j);
                    self.entry(kind, level, j)
                        .store(Self::encode(kind, v), Ordering::Relaxed);
                }
            }
        }
    }

    /// Whether every entry of the three trees equals what its children give now.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn is_consistent(&self) -> bool {
        (1..=self.layout.top()).all(|level| {
            (0..self.layout.size(level)).all(|j| {
                let children = ARITY * j..(ARITY * (j + 1)).min(self.layout.size(level - 1));
                let sum: u64 = children
                    .map(|c| {
                        if level == 1 {
                            self.leaf(c).value()
                        } else {
                            self.entry(TreeKind::Sum, level - 1, c)
                                .load(Ordering::SeqCst)
                        }
                    })
                    .fold(0u64, u64::wrapping_add);
                sum == self.entry(TreeKind::Sum, level, j).load(Ordering::SeqCst)
                    && (level < self.bottom()
                        || self.layout.extrema().iter().all(|&kind| {
                            self.recompute(kind, level, j) == self.extremum(kind, level, j)
                        }))
            })
        })
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use super::*;
    use crate::sumtree::quantize;

    /// A tree over `n` leaves on its own words, raw words inside the block.
    fn words(n: usize) -> (Vec<AtomicU64>, TreeLayout) {
        let layout = TreeLayout::new(n, 0, true, None);
        (
            (0..layout.words()).map(|_| AtomicU64::new(0)).collect(),
            layout,
        )
    }

    /// A tree over `n` leaves with a leaf-changers word (word 0) and a marks-set word
    /// (word 1), as a storage's trees have: its appenders may store leaves plainly.
    fn counted_words(n: usize) -> (Vec<AtomicU64>, TreeLayout) {
        let layout = TreeLayout::new(n, 2, true, None).counted_at(0, 1);
        (
            (0..layout.end()).map(|_| AtomicU64::new(0)).collect(),
            layout,
        )
    }

    fn update(tree: &Tree<'_>, leaf: usize, lap: u32, mass: u64, raw: f64) -> bool {
        let mut applied = [false];
        let u = Update {
            leaf,
            lap,
            mass,
            raw: raw_bits(lap, Some(raw)),
        };
        let _moved = tree.update_many(&[u], &mut applied, &mut DeltaRoom::default());
        applied[0]
    }

    /// Sixteen leaves of a small tree all set to `value_max` change their node by more
    /// than `i64::MAX`; the sums stay exact (found by the `sumtree` fuzz target, which
    /// panicked on the overflow in a build with overflow checks).
    #[test]
    fn a_node_of_heaviest_leaves_sums_exactly() {
        for n in [1, 2, 3, 5, 16] {
            let (w, layout) = words(n);
            let tree = Tree::new(&w, &layout);
            let heaviest = Leaf::new(1, layout.value_max);
            tree.set_run(0, n, |_| heaviest, false);
            let total: u64 = (0..n).map(|i| tree.leaf(i).value()).sum();
            assert_eq!(tree.total(), total, "{n} leaves");
            assert!(tree.is_consistent());
            tree.set_run(0, n, |_| Leaf::new(2, 1), false);
            assert_eq!(tree.total(), n as u64, "{n} leaves, lightened");
            assert!(tree.is_consistent());
        }
    }

    /// An appender alone stores its leaves plainly, and a whole node's entries with
    /// them: runs inside a node, across nodes and over whole ones, of one mass or of
    /// many, over leaves of other masses, the heaviest and empty ones among them, keep
    /// every entry exact.
    #[test]
    fn an_appender_alone_keeps_every_entry_exact() {
        let n = 100;
        let (w, layout) = counted_words(n);
        let tree = Tree::new(&w, &layout);
        let runs = [
            (0, 100),
            (3, 5),
            (10, 40),
            (16, 32),
            (90, 10),
            (0, 16),
            (50, 1),
        ];
        for (lap, &(first, len)) in (1..).zip(&runs) {
            let mass = |i: usize| match i % 23 {
                0 => 0,
                1 => layout.value_max,
                k => (i * 7919 % 1000 + k) as u64,
            };
            // Every other run, rows of one priority ([`Tree::set_run_of`]).
            let same = lap % 2 == 0;
            let leaf = |i: usize| Leaf::new(lap, mass(if same { first } else { i }));
            let _appending = tree.appending();
            assert_eq!(tree.others_changing(), Others::None);
            if same {
                tree.set_run_of(first, len, leaf(first), true);
            } else {
                tree.set_run(first, len, |k| leaf(first + k), true);
            }
            assert!(tree.is_consistent(), "after run {first}..{}", first + len);
            let total = (0..n).fold(0u64, |t, i| t.wrapping_add(tree.leaf(i).value()));
            assert_eq!(tree.total(), total);
            assert!((first..first + len).all(|i| tree.leaf(i) == leaf(i)));
        }
    }

    /// An appender is alone in the count but while an updater is counted, and an
    /// updater that came and went leaves the count as it found it.
    #[test]
    fn an_appender_is_alone_but_while_an_updater_is_counted() {
        let (w, layout) = counted_words(16);
        let tree = Tree::new(&w, &layout);
        let appending = tree.appending();
        let alone = || tree.others_changing() == Others::None;
        assert!(alone());
        drop(tree.count(UPDATER));
        assert!(alone());
        {
            let _updating = tree.count(UPDATER);
            assert!(!alone());
        }
        drop(tree.count_updates(&[]));
        assert!(alone());
        drop(appending);
        drop(tree.count(UPDATER));
        assert_eq!(w[0].load(Ordering::Relaxed), 0);
    }

    /// An updater marks the runs of the leaves it changes, and an appender beside it
    /// alone finds exactly those runs marked; a second updater marks its own in the
    /// next set, and the appender finds both sets'. Beside one updater more than there
    /// are sets, counted plainly, the appender knows nothing. Each leaves the words as
    /// it found them.
    #[test]
    fn updaters_mark_their_runs_and_an_appender_reads_them() {
        let n = 1 << 20;
        let (w, layout) = counted_words(n);
        let tree = Tree::new(&w, &layout);
        assert_eq!(layout.mark_shift, 8, "a million leaves: 256 a run");
        let at = |leaf: usize| Update {
            leaf,
            lap: 1,
            mass: 1,
            raw: raw_bits(1, Some(1.0)),
        };
        let appending = tree.appending();
        {
            let first = tree.count_updates(&[at(300), at(70_000), at(n - 1)]);
            assert_eq!(first.marks.map(|(slot, _)| slot), Some(0));
            let one = marking(0);
            assert_eq!(tree.others_changing(), Others::Marked(one));
            let marked = |leaves| tree.marked(one, leaves);
            assert!(marked(256..512) && marked(300..301));
            assert!(marked(0..257) && marked(511..1000));
            assert!(!marked(0..256) && !marked(512..69_888));
            assert!(marked(69_888..69_889) && !marked(70_144..n - 256));
            assert!(marked(n - 1..n) && marked(n - 256..n));
            let second = tree.count_updates(&[at(5)]);
            assert_eq!(second.marks.map(|(slot, _)| slot), Some(1));
            let both = one | marking(1);
            assert_eq!(tree.others_changing(), Others::Marked(both));
            assert!(!tree.marked(one, 0..256), "the first set holds the first's");
            assert!(tree.marked(both, 0..256) && tree.marked(both, 300..301));
            assert!(!tree.marked(both, 512..69_888));
            let rest: Vec<_> = (2..MARK_SLOTS)
                .map(|slot| tree.count_updates(&[at(slot * 1000)]))
                .collect();
            assert!(rest.iter().all(|u| u.marks.is_some()));
            assert_eq!(tree.others_changing(), Others::Marked(MARKING));
            let plain = tree.count_updates(&[at(512)]);
            assert!(plain.marks.is_none());
            assert_eq!(tree.others_changing(), Others::Unknown);
            assert!(
                !tree.marked(MARKING, 512..768),
                "a plain updater marks nothing"
            );
        }
        assert_eq!(tree.others_changing(), Others::None);
        assert!(!tree.marked(MARKING, 0..n));
        drop(appending);
        assert!(w[..2].iter().all(|w| w.load(Ordering::Relaxed) == 0));
        let marks = layout.marks..layout.end();
        assert!(w[marks].iter().all(|w| w.load(Ordering::Relaxed) == 0));
    }

    /// An appender beside two updaters whose marks are set stores the leaves of runs
    /// neither marked plainly and compare-exchanges the others: every entry stays
    /// exact, the updaters' leaves among the appender's or not.
    #[test]
    fn an_appender_beside_marking_updaters_keeps_every_entry_exact() {
        let n = 4096;
        let (w, layout) = counted_words(n);
        let tree = Tree::new(&w, &layout);
        assert_eq!(layout.mark_shift, 0, "a leaf a run");
        tree.set_run(0, n, |i| Leaf::new(1, i as u64 % 97), false);
        for (lap, marked) in (2..).zip([[5, 40], [37, 3000], [4000, 4095]]) {
            let items = marked.map(|leaf| Update {
                leaf,
                lap: 1,
                mass: 1,
                raw: raw_bits(1, Some(1.0)),
            });
            let _first = tree.count_updates(&items[..1]);
            let _second = tree.count_updates(&items[1..]);
            let _appending = tree.appending();
            assert_eq!(
                tree.others_changing(),
                Others::Marked(marking(0) | marking(1))
            );
            let (first, len) = (marked[0] / 2, 700);
            tree.set_run(
                first,
                len,
                |k| Leaf::new(lap, (first + k) as u64 % 89),
                true,
            );
            assert!(tree.is_consistent(), "marked {marked:?}");
            let total = (0..n).fold(0u64, |t, i| t.wrapping_add(tree.leaf(i).value()));
            assert_eq!(tree.total(), total);
        }
    }

    #[test]
    fn an_update_needs_both_words_of_its_lap_and_sets_the_raw_word() {
        let (w, layout) = words(4);
        let tree = Tree::new(&w, &layout);
        tree.store_raws(0, &[(Leaf::new(3, 10), 1.0)]);
        tree.set_run(0, 1, |_| Leaf::new(3, 10), false);
        assert!(update(&tree, 0, 3, 20, 2.0));
        assert_eq!(
            (tree.leaf(0), tree.raw(0, 3)),
            (Leaf::new(3, 20), Some(2.0))
        );
        // Lap 4's writer stored its raw word and published, but has not set its leaf:
        // an update for lap 3 finds the raw word taken and changes nothing.
        w[layout.raw_word(0)].store(raw_bits(4, Some(5.0)), Ordering::SeqCst);
        assert!(!update(&tree, 0, 3, 30, 3.0));
        assert_eq!(tree.leaf(0), Leaf::new(3, 20));
        assert_eq!(tree.raw_tagged(0), (4, Some(5.0)));
        assert_eq!(tree.total(), 20);
        // An emptied row takes no update either.
        tree.store_raws(0, &[(Leaf::new(5, 1), 1.0)]);
        tree.set_run(0, 1, |_| Leaf::new(5, 1), false);
        tree.clear(0, 5);
        assert_eq!((tree.leaf(0).value(), tree.raw_tagged(0)), (0, (5, None)));
        assert!(!update(&tree, 0, 5, 9, 9.0));
        assert_eq!(tree.total(), 0);
        assert!(tree.is_consistent());
    }

    /// A batch of updates, some of one leaf twice and some at `value_max`, leaves
    /// every sum entry exact: on trees whose levels all gather their deltas densely,
    /// and on trees with one and with two levels added to update by update below them;
    /// one room serving every batch, whatever the tree.
    #[test]
    fn a_batch_of_updates_keeps_every_level_exact() {
        let mut rng = crate::rng::stream(0x6a09_e667_f3bc_c909u64, crate::rng::Stream::Call(0));
        let mut next = move || rand::Rng::next_u64(&mut rng);
        let mut room = DeltaRoom::default();
        for n in [1, 17, 4_097, 70_001, 300_000, 4_097] {
            let (w, layout) = words(n);
            let tree = Tree::new(&w, &layout);
            let leaves: Vec<(Leaf, f64)> =
                (0..n).map(|i| (Leaf::new(1, i as u64 % 5), 1.0)).collect();
            tree.store_raws(0, &leaves);
            tree.set_run(0, n, |i| leaves[i].0, false);
            for round in 0..4 {
                let items: Vec<Update> = (0..300)
                    .map(|k| {
                        let leaf = if k % 10 == 9 { 0 } else { next() as usize % n };
                        let mass = match next() % 3 {
                            0 if round % 2 == 1 => layout.value_max,
                            0 => 0,
                            _ => next() % 100_000,
                        };
                        Update {
                            leaf,
                            lap: 1,
                            mass,
                            raw: raw_bits(1, Some(mass as f64)),
                        }
                    })
                    .collect();
                let mut applied = vec![false; items.len()];
                tree.update_many(&items, &mut applied, &mut room);
                assert!(applied.iter().all(|&a| a), "{n} leaves");
                let total = (0..n)
                    .map(|i| tree.leaf(i).value())
                    .fold(0u64, u64::wrapping_add);
                assert_eq!(tree.total(), total, "{n} leaves, round {round}");
                assert!(tree.is_consistent(), "{n} leaves, round {round}");
            }
        }
    }

    /// Updates whose deltas at a densely gathered entry sum to nothing and then do
    /// not (the entry listed twice) add it once.
    #[test]
    fn an_entry_whose_deltas_cancel_and_return_is_added_once() {
        for n in [17, 70_001] {
            let (w, layout) = words(n);
            let tree = Tree::new(&w, &layout);
            let leaves: Vec<(Leaf, f64)> = (0..n).map(|_| (Leaf::new(1, 10), 1.0)).collect();
            tree.store_raws(0, &leaves);
            tree.set_run(0, n, |i| leaves[i].0, false);
            let update = |leaf, mass| Update {
                leaf,
                lap: 1,
                mass,
                raw: raw_bits(1, Some(mass as f64)),
            };
            // Leaf 1 up by 5, leaf 2 down by 5 (one node: the entry's sum is back to
            // nothing), then leaf 1 up by 7 more.
            let items = [update(1, 15), update(2, 5), update(1, 22)];
            let mut applied = [false; 3];
            tree.update_many(&items, &mut applied, &mut DeltaRoom::default());
            assert_eq!(applied, [true; 3]);
            assert_eq!(tree.total(), 10 * n as u64 + 7, "{n} leaves");
            assert!(tree.is_consistent(), "{n} leaves");
        }
    }

    /// Descents from a summit of every size land where descents from the root do,
    /// whatever the tree's shape (partial last nodes included), and a target past the
    /// summit's total clamps to the last leaf with mass.
    #[test]
    fn descents_from_a_summit_land_where_descents_from_the_root_do() {
        let mut rng = crate::rng::stream(0x2545_f491_4f6c_dd1du64, crate::rng::Stream::Call(0));
        let mut next = move || rand::Rng::next_u64(&mut rng);
        for n in [1, 2, 15, 16, 17, 255, 256, 257, 4097, 70_001] {
            let (w, layout) = words(n);
            let tree = Tree::new(&w, &layout);
            let masses: Vec<u64> = (0..n)
                .map(|i| if i % 7 == 3 { 0 } else { next() % 1000 + 1 })
                .collect();
            tree.set_run(0, n, |i| Leaf::new(1, masses[i]), false);
            let total = tree.total();
            for room in [1, 16, 64, 300, SUMMIT_ENTRIES] {
                let mut room = vec![0; room];
                let Some(summit) = tree.summit(&mut room) else {
                    continue;
                };
                assert!(summit.level < layout.top() || n == 1);
                let targets: Vec<u64> = (0..64).map(|_| next() % total).collect();
                for chunk in targets.chunks(32) {
                    let mut group: Vec<_> = chunk.iter().map(|&t| (t, None)).collect();
                    tree.descend_many(Some(summit), &mut group);
                    for (&t, &(_, landing)) in chunk.iter().zip(&group) {
                        let want = tree.descend(t).expect("a target below the total lands");
                        assert_eq!(
                            landing,
                            Some(want),
                            "{n} leaves, summit {:?}, t {t}",
                            summit
                        );
                    }
                }
                let mut past = [(total + 5, None)];
                tree.descend_many(Some(summit), &mut past);
                let last = (0..n).rposition(|i| tree.leaf(i).value() > 0).unwrap();
                assert_eq!(past[0].1.map(|l| l.leaf), Some(last), "{n} leaves");
            }
        }
    }

    #[test]
    fn a_remass_brings_leaves_to_their_raw_words() {
        let (w, layout) = words(40);
        let tree = Tree::new(&w, &layout);
        let rows: Vec<(Leaf, f64)> = (0..40).map(|i| (Leaf::new(1, 1), i as f64)).collect();
        tree.store_raws(0, &rows);
        tree.set_run(0, 40, |i| rows[i].0, false);
        // Slot 7 holds lap 2's raw word before its leaf: left alone. Slot 8 is emptied.
        w[layout.raw_word(7)].store(raw_bits(2, Some(100.0)), Ordering::SeqCst);
        tree.clear(8, 1);
        // Masses of ten times the priority; priority 30 and up is "too heavy".
        tree.remass_run(0, 40, |i, p| {
            assert_eq!(p, i as f64, "slot {i}'s priority");
            (p < 30.0).then_some((10.0 * p) as u64)
        });
        for i in 0..40 {
            let want = match i {
                7 => 1,
                8 => 0,
                i if i >= 30 => 1,
                i => 10 * i as u64,
            };
            assert_eq!(tree.leaf(i).value(), want, "slot {i}");
        }
        assert!(tree.is_consistent());
        let total: u64 = (0..40).map(|i| tree.leaf(i).value()).sum();
        assert_eq!(tree.total(), total);
        assert_eq!(quantize(tree.raw(9, 1).unwrap()), 9.0);
    }
}
