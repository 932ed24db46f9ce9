//! Recovery: making a region usable again after every writer of it died, or after its
//! words were copied in from a checkpoint. The caller has the region to itself: no
//! other thread or process uses it until this returns.
//!
//! A writer that dies (a process killed during `extend`, a crash with a file-backed
//! storage open) can leave behind:
//!
//! - its units in a shard's occupancy word, or in the updaters' count, which a later
//!   editor or freezer would wait for forever: they go back to zero;
//! - the rows of a streaming append it was writing (`Storage::stream_rows`), which
//!   mark no slot and may show a published stamp over a half-written row: each is
//!   dropped ([`Stamp::dropped`]) before the stream's words are cleared, so that no
//!   reader takes it once they no longer name it;
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

use super::geometry::Ring;
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
    /// Rows claimed and never published: taken back, or dropped.
    pub(crate) unpublished: u64,
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
        if let Some(tree) = self.trees().get(k) {
            tree.forget_appenders();
        }
        self.end_dead_stream(k);
        self.free_dead_sides(k);
        let window = shard.window();
        shard.abandoned().fetch_max(window.hi, Ordering::AcqRel);
        let ring = *shard.ring();
        let positions = window.positions(ring.steps);
        if let Some(tree) = self.trees().get(k) {
            // Leaves of rows the dead writer claimed but never published.
            for pos in 0..ring.steps {
                let Some(seq) = positions.seq_at(pos) else {
                    continue;
                };
                for lane in 0..ring.width {
                    let (slot, leaf) = (ring.slot(pos, lane), (pos * ring.width + lane) as usize);
                    let l = tree.leaf(leaf);
                    if l.value() > 0 && !self.published_at(&ring, slot, seq) {
                        tree.clear_abandoned(leaf, l.lap());
                    }
                }
            }
        }
        self.recover_lanes(k, window.hi);
    }

    /// Whether `slot` holds the published row of `seq`, a step of `ring`.
    fn published_at(&self, ring: &Ring, slot: u64, seq: u64) -> bool {
        let stamp = self.stamp_at(slot);
        stamp.is_published() && stamp.lap() == ring.lap(seq)
    }

    /// Closes the slice lanes of shard `k` at `cursor` (`Lanes::recover`), counting
    /// the trajectories its published rows name.
    fn recover_lanes(&self, k: usize, cursor: u64) {
        let Some(lanes) = self.lanes() else {
            return;
        };
        let ring = *self.shards()[k].ring();
        for lane in 0..ring.width {
            lanes.recover(self.words(), k, lane, cursor, |seq| {
                let slot = ring.slot(ring.pos(seq), lane);
                self.published_at(&ring, slot, seq)
                    .then(|| self.words()[self.traj_word(slot)].load(Ordering::Acquire))
            });
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

    /// Ends the streaming append of shard `k` that its writer died inside (or that
    /// unwound), if any:
    /// every row of it dropped, whatever its stamp shows (its bytes may be part new,
    /// part old; the ones whose old row still shows are past the cursor's check), and
    /// then the stream's words cleared. Returns the rows dropped.
    pub(super) fn end_dead_stream(&self, k: usize) -> u64 {
        let shard = &self.shards()[k];
        let ring = *shard.ring();
        let rows = shard.stream();
        if rows.is_empty() {
            return 0;
        }
        // Only rows claimed, and of the ring's last lap (a damaged region's words
        // could name any).
        let cursor = shard.window().hi;
        let live = rows.start.max(cursor.saturating_sub(ring.steps))..rows.end.min(cursor);
        for seq in live.clone() {
            for lane in 0..ring.width {
                let slot = ring.slot(ring.pos(seq), lane);
                let dropped = Stamp::dropped(ring.lap(seq), 0);
                self.stamp(slot).store(dropped.to_bits(), Ordering::Release);
            }
        }
        shard.end_stream(rows.end);
        live.end.saturating_sub(live.start) * ring.width
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
        for (k, shard) in self.shards().iter().enumerate() {
            // Nobody else uses the region: nobody is inside, nor changing leaves.
            for w in [
                ShardWord::Occupancy,
                ShardWord::LeafTurn,
                ShardWord::LeafChangers,
                ShardWord::MarksSet,
            ] {
                shard.word(w).store(0, Ordering::Release);
            }
            // No freeze goes on: nobody else is here, and the `FROZEN` bit went with
            // the occupancy word. A freezer word naming this process is a save's,
            // copied in with a checkpoint's control words: kept, every later freeze
            // waited on it for good.
            shard.word(ShardWord::Freezer).store(0, Ordering::Release);
            // A lease of a process that still runs is this process's own (a shared
            // buffer loading a checkpoint, alone): it stays.
            for w in [ShardWord::Lease, ShardWord::Editor] {
                let holder = shard.word(w).load(Ordering::Acquire);
                if !self.holder_alive(holder) {
                    shard.word(w).store(0, Ordering::Release);
                }
            }
            shard.sanitize();
            found.torn += self.end_dead_stream(k);
            self.free_dead_sides(k);
            let ring = shard.ring();
            for slot in ring.first_slot..ring.first_slot + ring.steps * ring.width {
                if Stamp::from_bits(self.stamp(slot).load(Ordering::Acquire)).is_writing() {
                    found.torn += 1;
                    // A half-rewritten row is dropped; a half-appended one is left to
                    // the abandoned mark.
                    self.drop_if_edited(slot, None);
                }
            }
            found.unpublished += self.forget_unpublished(k);
        }
        for (k, shard) in self.shards().iter().enumerate() {
            self.recover_lanes(k, shard.window().hi);
        }
        found
    }

    /// Forgets the rows of shard `k` that were claimed and never published (their
    /// writers died), for a recovery alone in the region; returns how many. Left in
    /// the window, each such row stayed "being written" to every reader for good: a
    /// FIFO queue waited on it forever, a sample redrew every draw that landed on one
    /// (a writer killed a million rows into an extend left a buffer whose every
    /// uniform sample failed), and `len` counted them.
    ///
    /// - The window's last such rows, back to its last published one, are taken back:
    ///   the cursor returns to the first of them
    ///   ([`Shard::take_back_claims`](super::shard::Shard::take_back_claims)), so `len`
    ///   and `write_count` count only rows that were published. Each slot is left as
    ///   the next claim of its position expects it: empty on the ring's first lap
    ///   (`Prev::Empty`); on later laps, the row a lap back if it is still there (the
    ///   dead writer never began this slot: the row is live again), else that row
    ///   dropped and evicted from the window (`Shard::evict_below`: they lie at its
    ///   bottom). The abandoned mark goes to the new cursor, so the next claim of each
    ///   takes its slot over (its predecessor is below the mark), every claim made
    ///   before the recovery is covered, and the claims of the lap after wait for
    ///   their rows as usual.
    /// - Any other such row (another appender's, left between published ones) is
    ///   dropped ([`Stamp::dropped`]): readers leave it out, as they leave out a row
    ///   a lap overwrote, and the next lap's appender takes it over.
    ///
    /// A frames buffer's rows link to the rows before them, and a slice buffer's
    /// lanes count trajectories up to the cursor: there every such row is dropped,
    /// none taken back (`len` still counts them until the ring laps them).
    fn forget_unpublished(&self, k: usize) -> u64 {
        let shard = &self.shards()[k];
        let ring = *shard.ring();
        let window = shard.window();
        let slot_of = |seq: u64, lane: u64| ring.slot(ring.pos(seq), lane);
        let published = |seq: u64, lane: u64| self.published_at(&ring, slot_of(seq, lane), seq);
        let any_published = |seq: u64| (0..ring.width).any(|lane| published(seq, lane));
        let set = |seq: u64, lane: u64, stamp: Stamp| {
            self.stamp(slot_of(seq, lane))
                .store(stamp.to_bits(), Ordering::Release);
        };
        let take_back = self.frames().is_none() && self.lanes().is_none();
        let kept_to = if take_back {
            (window.lo..window.hi)
                .rev()
                .find(|&seq| any_published(seq))
                .map_or(window.lo, |seq| seq + 1)
        } else {
            window.hi
        };
        let mut forgotten = 0;
        for seq in window.lo..kept_to {
            for lane in 0..ring.width {
                if !published(seq, lane) {
                    set(seq, lane, Stamp::dropped(ring.lap(seq), 0));
                    forgotten += 1;
                }
            }
        }
        // A prioritized row a lap back lives again only with its raw priority (the
        // dead writer may have recorded its own row's already): the trees are rebuilt
        // from the raw words after.
        let trees = self.trees();
        let kept_raw = |seq: u64, lane: u64| {
            let leaf = (ring.pos(seq) * ring.width + lane) as usize;
            trees
                .get(k)
                .is_none_or(|tree| tree.raw(leaf, ring.lap(seq)).is_some())
        };
        for seq in kept_to..window.hi {
            for lane in 0..ring.width {
                let stamp = match seq.checked_sub(ring.steps) {
                    None => Stamp::EMPTY,
                    Some(before) if published(before, lane) && kept_raw(before, lane) => continue,
                    Some(before) => Stamp::dropped(ring.lap(before), 0),
                };
                set(seq, lane, stamp);
            }
            forgotten += ring.width;
        }
        shard.take_back_claims(kept_to);
        // Claims from here on are live ones: the next lap's appender of each waits for
        // its row as usual (and the ones taken back, below the old cursor, a lap
        // before them, take their slots over as set above).
        shard.abandoned().store(kept_to, Ordering::Release);
        if take_back {
            // The rows a lap back that the dead writer had begun to overwrite, dropped
            // above, now lie at the bottom of the window (it wrote its claims in
            // order): they leave it, so that `len` counts only rows that read (it
            // counted them: a file-backed buffer killed inside a lapping extend read
            // 99,989 of the 100,000 rows it counted).
            let w = shard.window();
            let first_live = (w.lo..w.hi).find(|&seq| any_published(seq));
            shard.evict_below(first_live.unwrap_or(w.hi));
        }
        forgotten
    }

    /// The first slot of a region made before that holds a row its shard never
    /// claimed, described, if any: a slot of a ring's first lap at or past its
    /// shard's cursor must be empty, and the first append to it waits until it is
    /// ([`Prev::Empty`](super::stamp::Prev)). Only a damaged stamp or cursor (a
    /// cursor moved back over written rows) makes one otherwise, and nobody would
    /// ever empty it. Slots the cursor has passed need no such check: the next lap's
    /// appender takes them over whatever they hold (the abandoned mark).
    pub(crate) fn unclaimed_row(&self) -> Option<String> {
        self.shards().iter().enumerate().find_map(|(k, shard)| {
            let ring = *shard.ring();
            let cursor = shard.window().hi;
            (cursor..ring.steps).find_map(|pos| {
                (0..ring.width).find_map(|lane| {
                    let stamp =
                        Stamp::from_bits(self.stamp(ring.slot(pos, lane)).load(Ordering::Acquire));
                    (stamp != Stamp::EMPTY).then(|| {
                        format!(
                            "shard {k} holds a row at ring position {pos} (stamp {stamp:?}) \
                             though its cursor, {cursor}, never reached it"
                        )
                    })
                })
            })
        })
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

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use crate::error::{AccessError, SampleError};
    use crate::storage::stamp::Stamp;
    use crate::sync::Ordering;
    use crate::{DType, ReplayBuffer, Spec};

    /// Rows of 120-byte slots: 77 MB, a ring appends stream into.
    const ROWS: u64 = 640_000;

    fn buffer(capacity: u64) -> ReplayBuffer {
        let spec = Spec::builder()
            .field("id", DType::U64, [])
            .field("pad", DType::U8, [104])
            .build()
            .unwrap();
        ReplayBuffer::builder(spec)
            .capacity(capacity as usize)
            .build()
            .unwrap()
    }

    fn extend(rb: &ReplayBuffer, ids: std::ops::Range<u64>) {
        let mut batch = rb.batch([(ids.end - ids.start) as usize]);
        batch.set("id", &ids.collect::<Vec<_>>()).unwrap();
        rb.extend(&batch).unwrap();
    }

    /// The guard on the integration tests of streaming (`tests/streaming.rs`): their
    /// configuration streams, and only the appender alone in a shard does.
    #[test]
    fn a_lone_appender_of_4_kib_into_a_large_ring_streams() {
        let (large, small) = (buffer(ROWS), buffer(10_000));
        for (rb, streams) in [(&large, true), (&small, false)] {
            let storage = &rb.state().core.storage;
            let shard = &storage.shards()[0];
            let claim = shard.enter_append(1);
            assert_eq!(storage.streams(0, claim, 1000), streams);
            // 10 rows of 120 bytes: under 4 KiB.
            assert!(!storage.streams(0, claim, 10));
            let other = shard.enter_append(1);
            assert!(!storage.streams(0, claim, 1000), "two appenders inside");
            shard.leave_append(other);
            shard.leave_append(claim);
        }
    }

    /// A row that no read ever takes while its position says it is live (its stamp
    /// shows it being written, by a writer nothing can find dead: a damaged region) is
    /// left out of a read by position, which retried it forever.
    #[test]
    #[allow(clippy::disallowed_methods)] // a hang shows as a timeout, not a stall
    fn a_row_no_read_takes_is_left_out_of_reads_by_position() {
        let rb = buffer(64);
        extend(&rb, 0..40);
        let storage = &rb.state().core.storage;
        let ring = *storage.shards()[0].ring();
        let slot = ring.slot(ring.pos(10), 0);
        storage.stamp(slot).store(
            Stamp::writing(ring.lap(10), 0).to_bits(),
            crate::sync::Ordering::Release,
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = rb.clone();
        std::thread::spawn(move || {
            let ids = reader
                .read_all_in_order(None)
                .column::<u64>("id")
                .unwrap()
                .to_vec();
            tx.send(ids).unwrap();
        });
        let ids = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the read returns");
        assert_eq!(ids, (0..40).filter(|&i| i != 10).collect::<Vec<_>>());
    }

    /// A FIFO queue hands out every row around the ones that will never be read: a
    /// dead claim between published rows, dropped by a recovery (every batch that met
    /// it was drawn again and again, until the sample gave up as starved), and a row
    /// being written below the abandoned mark, as a shared shard's takeover leaves a
    /// dead lease holder's (waited on as a row being written, likewise).
    #[test]
    fn a_fifo_queue_skips_the_rows_dead_writers_left() {
        let rb = ids_only(64).sampler(crate::sampler::Fifo).build().unwrap();
        extend(&rb, 0..10);
        let storage = &rb.state().core.storage;
        let shard = &storage.shards()[0];
        assert_eq!(shard.claim(2), 10);
        extend(&rb, 12..20);
        assert_eq!(storage.recover().unpublished, 2);
        extend(&rb, 20..30);
        leave(storage, 25, Stamp::writing);
        shard.abandoned().store(30, crate::sync::Ordering::Release);
        let popped = sampled_until(&rb, 7, |e| matches!(e, SampleError::Empty));
        let want: Vec<u64> = (0..10).chain(12..25).chain(26..30).collect();
        assert_eq!(popped, want);
    }

    /// An epoch without replacement hands out every other row once when one of its
    /// rows is a dead writer's, never to be published, or was dropped (it waited on
    /// such a row, and failed every sample as starved, 2^20 tries later).
    #[test]
    fn an_epoch_without_replacement_skips_a_row_a_dead_writer_left() {
        let rb = ids_only(64)
            .sampler(crate::sampler::WithoutReplacement::new())
            .seed(3)
            .build()
            .unwrap();
        extend(&rb, 0..20);
        let storage = &rb.state().core.storage;
        leave(storage, 5, Stamp::writing);
        storage.shards()[0]
            .abandoned()
            .store(20, crate::sync::Ordering::Release);
        // And a row a dead editor's recovery dropped (read again until a lap wrote a
        // newer row there).
        leave(storage, 12, Stamp::dropped);
        let mut got = sampled_until(&rb, 4, |e| matches!(e, SampleError::EpochEnd));
        got.sort_unstable();
        assert_eq!(
            got,
            (0..20).filter(|&i| i != 5 && i != 12).collect::<Vec<_>>()
        );
    }

    /// A row being rewritten in place below the abandoned mark is a live editor's,
    /// not abandoned (a FIFO queue or an epoch that met it while its editor was slow
    /// would have skipped it); a row an appender marked there is a dead writer's.
    #[test]
    fn a_row_being_edited_below_the_abandoned_mark_is_not_abandoned() {
        let rb = ids_only(64).build().unwrap();
        extend(&rb, 0..20);
        let storage = &rb.state().core.storage;
        storage.shards()[0]
            .abandoned()
            .store(20, crate::sync::Ordering::Release);
        leave(storage, 5, |lap, _| Stamp::writing(lap, 1));
        leave(storage, 6, Stamp::writing);
        let draw = |seq| crate::storage::Draw {
            seq,
            ..crate::storage::Draw::default()
        };
        assert!(!storage.is_abandoned(draw(5)));
        assert!(storage.is_abandoned(draw(6)));
        assert!(!storage.is_abandoned(draw(7)));
    }

    /// The ids of samples of `n` rows, one after another, until one fails as `end`
    /// says it should; any other failure fails the test.
    fn sampled_until(rb: &ReplayBuffer, n: usize, end: fn(&SampleError) -> bool) -> Vec<u64> {
        let mut got = Vec::new();
        loop {
            match rb.sample(n) {
                Ok(b) => got.extend_from_slice(b.column::<u64>("id").unwrap()),
                Err(e) if end(&e) => return got,
                Err(e) => panic!("after {got:?}: {e}"),
            }
        }
    }

    /// A buffer of one `id` column, of `capacity` rows, one shard.
    fn ids_only(capacity: usize) -> crate::ReplayBufferBuilder {
        let spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
        ReplayBuffer::builder(spec).capacity(capacity)
    }

    /// Stores the stamp `stamp(lap, 0)` in the slot of row `seq` (shard 0, lane 0), as
    /// a writer or an editor that died there left it.
    fn leave(storage: &super::Storage, seq: u64, stamp: fn(u32, u32) -> Stamp) {
        let ring = *storage.shards()[0].ring();
        storage.stamp(ring.slot(ring.pos(seq), 0)).store(
            stamp(ring.lap(seq), 0).to_bits(),
            crate::sync::Ordering::Release,
        );
    }

    fn ids(rb: &ReplayBuffer) -> Vec<u64> {
        rb.read_all_in_order(None)
            .column::<u64>("id")
            .unwrap()
            .to_vec()
    }

    /// Rows a dead writer claimed on the ring's first lap and never began: taken back
    /// (they counted in `len` and `write_count`, and every sample and FIFO pop that
    /// met one waited on it as a row being written, for good); the next append claims
    /// their positions again, each found empty as a first lap's slot must be.
    #[test]
    fn a_dead_writers_first_lap_claims_are_taken_back() {
        let rb = buffer(64);
        extend(&rb, 0..10);
        let storage = &rb.state().core.storage;
        let shard = &storage.shards()[0];
        assert_eq!(shard.claim(20), 10);
        let ring = *shard.ring();
        storage.stamp(ring.slot(ring.pos(10), 0)).store(
            Stamp::writing(0, 0).to_bits(),
            crate::sync::Ordering::Release,
        );
        assert_eq!(rb.len(), 30, "claimed rows count until a recovery");
        let found = storage.recover();
        assert_eq!(found.unpublished, 20);
        assert_eq!((rb.len(), rb.write_count()), (10, 10));
        for _ in 0..50 {
            assert!(rb.sample(8).unwrap().index().iter().all(|&i| i < 10));
        }
        extend(&rb, 100..105);
        assert_eq!(
            ids(&rb),
            (0..10).chain(100..105).collect::<Vec<_>>(),
            "the next rows take positions 10.."
        );
        assert!(storage.unclaimed_row().is_none());
    }

    /// On a later lap, the slots a dead writer claimed: those it began lose the row a
    /// lap back (dropped: reads leave them out), those it never reached keep theirs,
    /// live again; the cursor goes back, and the next appends take every slot over.
    /// A dead claim between published rows (another appender's) is dropped.
    #[test]
    fn a_dead_writers_later_lap_claims_give_back_the_rows_they_never_touched() {
        let rb = buffer(64);
        extend(&rb, 0..70); // positions 0..6 hold ids 64..70
        let storage = &rb.state().core.storage;
        let shard = &storage.shards()[0];
        let ring = *shard.ring();
        // A dead claim, then a live append's published rows after it: a hole.
        assert_eq!(shard.claim(2), 70);
        extend(&rb, 72..74);
        // The last writer's claim: it began the first three of its ten slots.
        assert_eq!(shard.claim(10), 74);
        for seq in 74..77 {
            storage.stamp(ring.slot(ring.pos(seq), 0)).store(
                Stamp::writing(ring.lap(seq), 0).to_bits(),
                crate::sync::Ordering::Release,
            );
        }
        let found = storage.recover();
        assert_eq!(found.unpublished, 2 + 10);
        // The cursor back at 74: window 10..74, less the hole (70, 71) and the three
        // rows whose slots the dead writer began (ids 10..13); ids 13..20, whose
        // slots it never reached, live again. The three leave the window (`len`
        // counted them); the hole counts until the next lap writes over it.
        assert_eq!(rb.write_count(), 74);
        let mut got = ids(&rb);
        got.sort_unstable();
        assert_eq!(got, (13..70).chain(72..74).collect::<Vec<_>>());
        assert_eq!(rb.len(), got.len() + 2);
        // The next lap writes over every slot: the dropped, the revived, the hole's.
        extend(&rb, 200..264);
        let mut got = ids(&rb);
        got.sort_unstable();
        assert_eq!(got, (200..264).collect::<Vec<_>>());
        for _ in 0..50 {
            rb.sample(16).unwrap();
        }
    }

    /// A stream whose writer died (a process killed inside `extend`): its rows' stamps
    /// may show them published over old bytes. Readers leave them out meanwhile; a
    /// recovery drops them and ends the stream; later appends write over them.
    #[test]
    fn a_dead_stream_is_dropped_by_recovery() {
        let rb = buffer(ROWS);
        for first in (0..ROWS).step_by(64_000) {
            extend(&rb, first..first + 64_000);
        }
        let storage = &rb.state().core.storage;
        let shard = &storage.shards()[0];
        let ring = *shard.ring();
        // The dead writer claimed rows ROWS..ROWS + 1000 and announced them; half of
        // their stamps landed, none of their bytes.
        let first = shard.claim(1000);
        assert_eq!(first, ROWS);
        shard.begin_stream(first..first + 1000);
        for seq in first..first + 500 {
            let slot = ring.slot(ring.pos(seq), 0);
            storage.stamp(slot).store(
                Stamp::published(ring.lap(seq), 0).to_bits(),
                crate::sync::Ordering::Release,
            );
        }
        // A sample never returns them (it redraws); positions past the stream still read.
        for _ in 0..200 {
            let batch = rb.sample(64).unwrap();
            for &i in batch.index() {
                assert!(i >= 1000, "sampled position {i}, inside the dead stream");
            }
        }
        assert_eq!(rb.get(1000).unwrap().column::<u64>("id").unwrap(), [1000]);

        let found = storage.recover();
        assert_eq!(found.torn, 1000);
        assert!(shard.stream().is_empty());
        for pos in [0, 499, 500, 999] {
            assert!(
                matches!(rb.get(pos), Err(AccessError::NotWritten { .. })),
                "position {pos}"
            );
        }
        // The dead claim is taken back: appends go on from its first row, taking the
        // dropped slots over, streaming. The rows a lap back that it dropped left the
        // window.
        assert_eq!(rb.write_count(), ROWS);
        assert_eq!(rb.len() as u64, ROWS - 1000);
        for first in (ROWS + 1000..2 * ROWS + 1000).step_by(64_000) {
            extend(&rb, first..first + 64_000);
        }
        let ids = rb.get_many(&[0, 999, 1000, 2999]).unwrap();
        assert_eq!(
            ids.column::<u64>("id").unwrap(),
            [ROWS + 1000, ROWS + 1999, ROWS + 2000, ROWS + 3999]
        );
    }

    /// A side slot whose appender died inside its write stays taken: the next episode
    /// end that comes to it gives up on it after a wait (its row misses), and the
    /// recovery frees it for the one after.
    #[test]
    fn a_side_slot_a_dead_appender_held_is_freed_by_recovery() {
        let spec = Spec::builder()
            .field("obs", DType::U64, [2])
            .field("next_obs", DType::U64, [2])
            .field("done", DType::U8, [])
            .build()
            .unwrap();
        let rb = ReplayBuffer::builder(spec)
            .capacity(8)
            .frames(
                crate::Frames::new()
                    .next_of("obs", "next_obs")
                    .ends("done", None)
                    .terminal_slots(1),
            )
            .build()
            .unwrap();
        let step = |i: u64, done: u8| {
            let mut b = rb.batch([1]);
            b.set("obs", &[i, i]).unwrap();
            b.set("next_obs", &[i + 100, i + 100]).unwrap();
            b.set("done", &[done]).unwrap();
            rb.extend(&b).unwrap();
        };
        let end = |i: u64| step(i, 1);
        let state = rb.state();
        let storage = &state.core.storage;
        let frames = storage.frames().unwrap();
        let tag = &storage.words()[frames.side_tag_at(0, 0)];
        tag.store(crate::storage::frames::SIDE_TAKEN, Ordering::Release);
        let started = std::time::Instant::now();
        end(1);
        assert!(started.elapsed() >= std::time::Duration::from_millis(150));
        storage.recover();
        assert_eq!(tag.load(Ordering::Acquire), 0);
        let started = std::time::Instant::now();
        end(2);
        assert!(started.elapsed() < std::time::Duration::from_millis(150));
        // The slot names the second row (slot sequence 1, plus one), whole; it is
        // read once a step follows it (a lane's newest step is never read).
        assert_eq!(tag.load(Ordering::Acquire), 2);
        step(3, 0);
        // A read by position leaves out a row it cannot rebuild.
        let first = rb.get_many(&[0]).unwrap();
        assert_eq!(first.len(), 0, "the first row never got a side slot");
        let row = rb.get_many(&[1]).unwrap();
        assert_eq!(row.column::<u64>("next_obs").unwrap(), [102, 102]);
    }
}
