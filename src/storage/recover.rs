//! Recovery: making a region usable again after every writer of it died, or after its
//! words were copied in from a checkpoint. The caller has the region to itself: no
//! other thread or process uses it until this returns.
//!
//! A writer that dies (a process killed during `extend`, a crash with a file-backed
//! storage open) can leave behind:
//!
//! - its units in a shard's occupancy word, or in the updaters' count, which a later
//!   editor or freezer would wait for forever: they go back to zero;
//! - slots marked as being written, half written, or claimed and never started: the
//!   shard's `Abandoned` word moves up to its cursor, so that the next lap's writer of
//!   any slot claimed before takes it over whatever state it is in, once no editor
//!   is inside it ([`Prev::Abandoned`](super::stamp::Prev)); readers skip such a slot
//!   meanwhile, as they skip any row that is not published;
//! - tree leaves and sums that disagree (a priority update or a new row's leaf that
//!   stopped halfway): every leaf is recomputed from its slot's raw priority (or
//!   emptied, if its row is not live and published) and the trees rebuilt;
//! - a slice lane whose tail lags its cursor: closed (see `Lanes::recover`).
//!
//! Layer: algos.

use super::layout::ShardWord;
use super::stamp::Stamp;
use super::Storage;
use crate::sumtree::tree::Tree;
use crate::sync::Ordering;

/// What a recovery found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// Slots found marked as being written.
    pub(crate) torn: u64,
}

impl Storage {
    /// Repairs shard `k` of a shared region after its lease holder died, while other
    /// processes go on using the region: the caller has just taken the lease over, so
    /// no other process appends to the shard, and everything below is safe beside
    /// readers and priority updaters.
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // no shared regions under loom
    pub(crate) fn recover_shard(&self, k: usize) {
        let shard = &self.shards()[k];
        shard.clear_appenders();
        let window = shard.window();
        shard.abandoned().fetch_max(window.hi, Ordering::AcqRel);
        let ring = *shard.ring();
        let positions = window.positions(ring.steps);
        let published_at = |slot: u64, seq: u64| {
            let stamp = self.stamp_at(slot);
            stamp.is_published() && stamp.lap() == ring.lap(seq)
        };
        if let Some(tree) = self.trees().get(k) {
            // Leaves of rows the dead writer claimed but never published.
            for pos in 0..ring.steps {
                let Some(seq) = positions.seq_at(pos) else {
                    continue;
                };
                for lane in 0..ring.width {
                    let (slot, leaf) = (ring.slot(pos, lane), (pos * ring.width + lane) as usize);
                    let l = tree.leaf(leaf);
                    if l.value() > 0 && !published_at(slot, seq) {
                        tree.clear(leaf, l.lap());
                    }
                }
            }
        }
        if let Some(lanes) = self.lanes() {
            for lane in 0..ring.width {
                lanes.recover(self.words(), k, lane, window.hi, |seq| {
                    let slot = ring.slot(ring.pos(seq), lane);
                    published_at(slot, seq)
                        .then(|| self.words()[self.traj_word(slot)].load(Ordering::Acquire))
                });
            }
        }
    }

    /// Repairs shard `k` of a shared region after its editor process died, while
    /// others go on using it: the caller has just taken the shard's `Editor` word
    /// over, so every editor unit in the occupancy word, and every slot marked as being
    /// edited, is the dead process's. The units go; each half-rewritten row is dropped
    /// (`Stamp::dropped`): readers leave it out, and the next lap's appender takes its
    /// slot over. Its tree leaf, if any, is emptied, so that no draw lands on it.
    #[cfg_attr(replaybuf_loom, allow(dead_code))] // no shared regions under loom
    pub(crate) fn recover_editor(&self, k: usize) {
        let shard = &self.shards()[k];
        shard.clear_editors();
        let ring = *shard.ring();
        let trees = self.trees();
        let tree = trees.get(k);
        for pos in 0..ring.steps {
            for lane in 0..ring.width {
                let slot = ring.slot(pos, lane);
                self.drop_if_edited(slot, tree.map(|t| (t, (pos * ring.width + lane) as usize)));
            }
        }
    }

    /// Drops the row of `slot` if an editor was inside it, emptying its leaf.
    fn drop_if_edited(&self, slot: u64, leaf: Option<(&Tree<'_>, usize)>) -> bool {
        let word = self.stamp(slot);
        let stamp = Stamp::from_bits(word.load(Ordering::Acquire));
        if !stamp.is_being_edited() {
            return false;
        }
        let dropped = Stamp::dropped(stamp.lap(), stamp.edit());
        if word
            .compare_exchange(
                stamp.to_bits(),
                dropped.to_bits(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
        if let Some((tree, i)) = leaf {
            let l = tree.leaf(i);
            if l.value() > 0 {
                tree.clear(i, l.lap());
            }
        }
        true
    }

    /// Recovers the region (see the module docs). A prioritized buffer's trees are
    /// rebuilt after, by its sampler, from [`Storage::live_priorities`].
    pub(crate) fn recover(&self) -> Recovered {
        let mut found = Recovered::default();
        for shard in self.shards() {
            shard.occupancy().store(0, Ordering::Release);
            // A lease or a freeze of a process that still runs is this process's own
            // (a shared buffer loading a checkpoint, alone): it stays.
            for w in [ShardWord::Lease, ShardWord::Freezer, ShardWord::Editor] {
                let holder = shard.word(w).load(Ordering::Acquire);
                if !self.holder_alive(holder) {
                    shard.word(w).store(0, Ordering::Release);
                }
            }
            shard.sanitize();
            let window = shard.window();
            shard.abandoned().store(window.hi, Ordering::Release);
            let ring = shard.ring();
            for slot in ring.first_slot..ring.first_slot + ring.steps * ring.width {
                if Stamp::from_bits(self.stamp(slot).load(Ordering::Acquire)).is_writing() {
                    found.torn += 1;
                    // A half-rewritten row is dropped; a half-appended one is left to
                    // the abandoned mark.
                    self.drop_if_edited(slot, None);
                }
            }
        }
        if let Some(lanes) = self.lanes() {
            for (k, shard) in self.shards().iter().enumerate() {
                let ring = *shard.ring();
                let cursor = shard.window().hi;
                for lane in 0..ring.width {
                    lanes.recover(self.words(), k, lane, cursor, |seq| {
                        let slot = ring.slot(ring.pos(seq), lane);
                        let stamp = Stamp::from_bits(self.stamp(slot).load(Ordering::Acquire));
                        (stamp.is_published() && stamp.lap() == ring.lap(seq))
                            .then(|| self.words()[self.traj_word(slot)].load(Ordering::Acquire))
                    });
                }
            }
        }
        found
    }

    /// The raw priority of every live, published row, by tree and leaf: `(lap,
    /// priority)`, or `None` for a leaf that holds no such row. For rebuilding the
    /// trees after a recovery or a load.
    pub(crate) fn live_priorities(&self) -> impl Fn(usize, usize) -> Option<(u32, f64)> + '_ {
        let trees = self.trees();
        let rings: Vec<_> = self
            .shards()
            .iter()
            .map(|s| (*s.ring(), s.window().positions(s.ring().steps)))
            .collect();
        move |k, leaf| {
            let (ring, positions) = &rings[k];
            let pos = leaf as u64 / ring.width;
            let stamp = self.stamp_of(k, leaf as u64);
            let live = positions
                .seq_at(pos)
                .is_some_and(|seq| ring.lap(seq) == stamp.lap());
            let p = trees[k].raw(leaf, stamp.lap())?;
            (live && stamp.is_published()).then_some((stamp.lap(), p))
        }
    }
}
