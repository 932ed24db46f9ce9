//! This process's membership of a shared region: its process-table entry and the
//! shards it holds the writer lease of, given back when the process's last handle of
//! the buffer drops (a process that dies gives nothing back: others find it dead).
//!
//! Layer: algos.

use crate::shared::procs::{
    release_lease, take_from_dead, take_lease, Holder, Leased, NoShard, ProcTable,
};
use crate::storage::layout::ShardWord;
use crate::storage::shard::Shard;
use crate::storage::Storage;
use crate::sync::{nap, AtomicU64, Backoff, Mutex, Ordering};
use smallvec::SmallVec;

/// How long [`Member::lease`] waits for a shard to come free before it reports none:
/// far longer than another process's repair of a dead writer's shard takes
/// (microseconds; milliseconds under a sanitizer), short enough that a buffer whose
/// shards are all truly taken says so at once to a person.
const LEASE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(500);

/// How often a refused writer looks again meanwhile: asleep in between, so that a
/// buffer whose shards are all truly taken costs no processor while it says so.
const LEASE_POLL: std::time::Duration = std::time::Duration::from_micros(200);

/// This process in a shared region.
#[derive(Debug)]
pub(crate) struct Member {
    table: ProcTable,
    me: Holder,
    /// Shards this process holds the lease of, in the order it took them.
    leases: Mutex<Vec<usize>>,
    /// The shared-memory object to unlink when this member goes (its creator's), and
    /// the object its name stood for at creation: a newer object of that name stays.
    unlink: Option<(String, crate::region::shared::ObjectId)>,
    /// The region's shards, to give their leases back.
    shards: Box<[Shard]>,
    /// Per shard, this process's editors inside it: while there are any, the process
    /// holds the shard's `Editor` word.
    editors: Box<[Mutex<usize>]>,
}

impl Member {
    /// Joins the region's process table; `None` if every entry is held by a live
    /// process. The creator's member unlinks `object` when it goes.
    pub(crate) fn join(
        table: ProcTable,
        shards: Box<[Shard]>,
        unlink: Option<(String, crate::region::shared::ObjectId)>,
    ) -> Option<Member> {
        let me = table.register()?;
        Some(Member {
            table,
            me,
            leases: Mutex::new(Vec::new()),
            unlink,
            editors: shards.iter().map(|_| Mutex::new(0)).collect(),
            shards,
        })
    }

    pub(crate) fn holder(&self) -> Holder {
        self.me
    }

    /// A shard for a writer of this process: one whose lease this process takes now,
    /// or, with none left, one it already holds. Shards a dead process held come
    /// first (taken over and recovered, so that its ring is written on), looked for
    /// in turn from `start`; then free ones, the emptiest first ([`by_room`]).
    pub(crate) fn lease(&self, storage: &Storage, start: usize) -> Result<usize, NoShard> {
        patiently(|| self.try_lease(storage, start).ok_or(NoShard))
    }

    /// One pass of [`Member::lease`]: a dead holder's shard first (repaired), then a
    /// free one, else one this process holds already; `None` if none of these.
    fn try_lease(&self, storage: &Storage, start: usize) -> Option<usize> {
        let mut held = self.leases.lock();
        let shards = storage.shards();
        let in_turn = (0..shards.len()).map(|i| (start + i) % shards.len());
        let from_dead = in_turn.filter(|&k| {
            !held.contains(&k) && shards[k].word(ShardWord::Lease).load(Ordering::Acquire) != 0
        });
        let from_dead: SmallVec<[usize; 8]> = from_dead.collect();
        let free = by_room(shards, start, |k| !held.contains(&k));
        for k in from_dead.into_iter().chain(free) {
            match take_lease(&self.table, shards[k].word(ShardWord::Lease), self.me) {
                Some(Leased::Free) => {}
                Some(Leased::FromDead) => storage.recover_shard(k),
                None => continue,
            }
            held.push(k);
            return Some(k);
        }
        (!held.is_empty()).then(|| held[start % held.len()])
    }

    /// Takes the lease of every shard this process does not hold yet (a buffer-level
    /// extend of an ndim-2 buffer writes them all): free ones, and dead holders' after
    /// repairing them. `Err(k)`: a live process holds shard `k` (the leases taken so
    /// far stay this process's).
    pub(crate) fn lease_all(&self, storage: &Storage) -> Result<(), usize> {
        patiently(|| self.try_lease_all(storage))
    }

    /// One pass of [`Member::lease_all`].
    fn try_lease_all(&self, storage: &Storage) -> Result<(), usize> {
        let mut held = self.leases.lock();
        for (k, shard) in storage.shards().iter().enumerate() {
            if held.contains(&k) {
                continue;
            }
            match take_lease(&self.table, shard.word(ShardWord::Lease), self.me) {
                Some(Leased::Free) => {}
                Some(Leased::FromDead) => storage.recover_shard(k),
                None => return Err(k),
            }
            held.push(k);
        }
        Ok(())
    }

    /// A shard this process holds, taking one if it holds none (the shard of
    /// buffer-level extends).
    pub(crate) fn any_lease(&self, storage: &Storage) -> Result<usize, NoShard> {
        if let Some(&k) = self.leases.lock().first() {
            return Ok(k);
        }
        self.lease(storage, std::process::id() as usize)
    }
}

/// The shards `wanted` picks, the fewest rows written first, and among as many in turn
/// from `start`. A process's lease goes back when it leaves: taken in turn, the shard
/// a collector that finished had filled went to the next one, whose rows then pushed
/// its predecessor's out while other shards stood empty (two collector processes of
/// 3,750 rows each, one after the other, into four shards of 5,000: 5,000 rows kept).
fn by_room(shards: &[Shard], start: usize, wanted: impl Fn(usize) -> bool) -> SmallVec<[usize; 8]> {
    let n = shards.len();
    let mut order: SmallVec<[(u64, usize); 8]> = (0..n)
        .filter(|&i| wanted((start + i) % n))
        .map(|i| (shards[(start + i) % n].written(), i))
        .collect();
    order.sort_unstable();
    order.into_iter().map(|(_, i)| (start + i) % n).collect()
}

/// `attempt`, repeated while it fails and [`LEASE_PATIENCE`] has not passed; its last
/// answer. A lease another live process holds may be a reclaim in passing: an editor
/// or a dump that met a dead writer's row takes its lease, repairs the shard and gives
/// the lease back. A writer refused a lease waits out such a reclaim (holding nothing
/// meanwhile) before it reports the shard taken.
fn patiently<T, E>(mut attempt: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let patience = std::time::Instant::now() + LEASE_PATIENCE;
    loop {
        match attempt() {
            Err(_) if std::time::Instant::now() < patience => nap(LEASE_POLL),
            answer => return answer,
        }
    }
}

impl Member {
    /// Lets one more editor of this process into shard `k`: the first takes the
    /// shard's `Editor` word, waiting while another live process's editors are in (they
    /// finish their one rewrite, or die and are repaired here). Call before entering
    /// the shard's occupancy word, and [`Member::end_edit`] after leaving it.
    pub(crate) fn begin_edit(&self, storage: &Storage, k: usize) {
        let mut inside = self.editors[k].lock();
        if *inside == 0 {
            let word = self.shards[k].word(ShardWord::Editor);
            let mut backoff = Backoff::new();
            loop {
                match take_lease(&self.table, word, self.me) {
                    Some(Leased::Free) => break,
                    Some(Leased::FromDead) => {
                        storage.recover_editor(k);
                        break;
                    }
                    None => backoff.snooze(),
                }
            }
        }
        *inside += 1;
    }

    /// One editor of this process left shard `k`; the last gives the `Editor` word
    /// back.
    pub(crate) fn end_edit(&self, k: usize) {
        let mut inside = self.editors[k].lock();
        *inside -= 1;
        if *inside == 0 {
            release_lease(self.shards[k].word(ShardWord::Editor), self.me);
        }
    }

    /// If shard `k`'s lease holder died: takes the lease over, repairs the shard
    /// (`Storage::recover_shard`) and gives the lease back.
    pub(crate) fn reclaim_dead_lease(&self, storage: &Storage, k: usize) {
        self.repair_if_dead(self.shards[k].word(ShardWord::Lease), || {
            storage.recover_shard(k)
        });
    }

    /// If shard `k`'s editor process died: takes its `Editor` word over, repairs the
    /// shard (`Storage::recover_editor`) and gives the word back.
    ///
    /// Nothing while another thread of this process holds the shard's editors: it is
    /// counting one in or out, or waiting in [`Member::begin_edit`] for the word,
    /// which takes it over from a dead holder itself. Waiting for that thread here
    /// could wait for good: the callers are a freeze waiting for its shards to drain
    /// and an appender waiting for a slot, and the word's live holder may be another
    /// process's editor waiting for that very freeze to thaw (or for that appender to
    /// leave), while the thread in `begin_edit` waits for the word.
    pub(crate) fn reclaim_dead_editor(&self, storage: &Storage, k: usize) {
        let word = self.shards[k].word(ShardWord::Editor);
        if word.load(Ordering::Acquire) == 0 {
            return;
        }
        let Some(inside) = self.editors[k].try_lock() else {
            return;
        };
        if *inside == 0 {
            self.repair_if_dead(word, || storage.recover_editor(k));
        }
        drop(inside);
    }

    /// A reclaim in passing: takes `word` (a lease or an `Editor` word) over only if
    /// its holder died ([`take_from_dead`]), runs `repair`, and gives the word back.
    fn repair_if_dead(&self, word: &AtomicU64, repair: impl FnOnce()) {
        if take_from_dead(&self.table, word, self.me) {
            repair();
            release_lease(word, self.me);
        }
    }
}

impl Drop for Member {
    /// Leaves the region: leases, entry, and for its creator, the name. A forked
    /// child's copy of its parent's member leaves nothing: the entry, its leases and
    /// the name are the parent's, which lives on.
    fn drop(&mut self) {
        if self.me.pid() != std::process::id() {
            return;
        }
        for k in self.leases.lock().drain(..) {
            release_lease(self.shards[k].word(ShardWord::Lease), self.me);
        }
        self.table.deregister(self.me);
        if let Some((object, id)) = &self.unlink {
            let _ = crate::region::shared::unlink_if_same(object, *id);
        }
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod tests {
    use crate::storage::layout::ShardWord;
    use crate::sync::Ordering;
    use crate::{DType, ReplayBuffer, Spec};

    /// A reclaim in passing (a dump, a read or an edit that met a dead writer's row)
    /// takes a lease or an editor word only from a dead holder, and gives it back: one
    /// found free stays free, for another process's writer. (It once kept a free
    /// lease, and `tests/shared_crash.rs`'s next writer found every shard taken, in
    /// about one run of 40 under AddressSanitizer.)
    #[test]
    fn a_reclaim_takes_only_a_dead_holders_lease_and_gives_it_back() {
        let name = format!("test-member-reclaim-{}", std::process::id());
        let spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
        let rb = ReplayBuffer::builder(spec)
            .capacity(64)
            .shards(2)
            .shared(&name)
            .build()
            .unwrap();
        let state = rb.state();
        let storage = &state.core.storage;
        let word = |k: usize, w| storage.shards()[k].word(w).load(Ordering::Acquire);
        let reclaim = |k| {
            storage.reclaim_dead_lease(k);
            storage.reclaim_dead_editor(k);
        };
        for k in 0..2 {
            reclaim(k);
            assert_eq!(word(k, ShardWord::Lease), 0, "a free lease stays free");
            assert_eq!(word(k, ShardWord::Editor), 0);
        }
        let writer = rb.writer();
        let mine = writer.shard();
        let me = word(mine, ShardWord::Lease);
        assert_ne!(me, 0);
        reclaim(mine);
        assert_eq!(
            word(mine, ShardWord::Lease),
            me,
            "a live holder keeps its lease"
        );
        // Entry 63 of the process table, which nobody claimed: a holder long dead.
        let dead = (64 << 56) | (1 << 32) | 12_345;
        let other = 1 - mine;
        for w in [ShardWord::Lease, ShardWord::Editor] {
            storage.shards()[other]
                .word(w)
                .store(dead, Ordering::Release);
        }
        reclaim(other);
        assert_eq!(
            word(other, ShardWord::Lease),
            0,
            "taken over, repaired, given back"
        );
        assert_eq!(word(other, ShardWord::Editor), 0);
        drop(state);
        assert_eq!(rb.writer().shard(), other, "free for the next writer");
    }

    /// The two sides of a restore's race with an attach (`Storage::begin_restore`):
    /// a restore is refused while another member lives, its own process's other
    /// attachments included, and leaves the mark as it found it; once marked, a
    /// member that joins sees the mark.
    #[test]
    fn a_restore_marks_the_region_only_with_no_other_member_and_a_joiner_sees_it() {
        let name = format!("test-member-restore-{}", std::process::id());
        let spec = Spec::builder().field("id", DType::U64, []).build().unwrap();
        let rb = ReplayBuffer::builder(spec)
            .capacity(64)
            .shared(&name)
            .build()
            .unwrap();
        let state = rb.state();
        let storage = &state.core.storage;
        assert!(storage.other_members().is_empty());
        let other = ReplayBuffer::attach(&name).unwrap();
        assert_eq!(storage.other_members(), vec![std::process::id()]);
        assert_eq!(storage.begin_restore(), Err(vec![std::process::id()]));
        assert!(!storage.restoring(), "the mark is left as it was");
        drop(other);
        storage.begin_restore().unwrap();
        let joiner = ReplayBuffer::attach(&name).unwrap_err();
        assert!(joiner.to_string().contains("restoring"), "{joiner}");
        // One that got past the attach's look joins and then sees the mark.
        assert!(storage.restoring());
        storage.set_restoring(false);
        drop(state);
        drop(ReplayBuffer::attach(&name).unwrap());
    }
}
