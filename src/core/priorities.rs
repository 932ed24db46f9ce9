//! Priorities of a prioritized buffer: what new rows enter with, updates from any thread
//! (dropping those whose row has been replaced), `alpha` and `beta`, and emptying.
//!
//! A row's priority lives in its slot's raw word and its mass in its shard's tree
//! block (`sumtree/`); its *generation* (the stamp a sampled batch reports,
//! [`Batch::generations`]) names which row of a slot an update is for. An update whose
//! row has since been overwritten, or emptied, is dropped and counted as stale, never
//! applied to the newer row: the whole generation is checked against the stamp first,
//! and the raw word and the leaf carry the row's whole 32-bit lap, checked by the
//! compare-exchanges that set them, so a row replaced after the check (even 65,536 or
//! more laps later) turns the update away. An in-place rewrite (`write_all`) after the
//! check keeps the lap and lets the update through: it changes no priority, so the
//! result is the one of the update coming just before it.
//!
//! Layer: core.

use std::cell::RefCell;
use std::cmp::Ordering;

use super::Core;
use crate::batch::Batch;
use crate::core::Attempt;
use crate::dtype::DType;
use crate::error::{DataError, PriorityError, PriorityUpdate};
use crate::sampler::leaf_writes;
use crate::sampler::prioritized::{self, Priorities};
use crate::storage::plan::Source;
use crate::storage::shard;
use crate::storage::stamp::{self, Stamp};
use crate::storage::{Appended, Raws};
use crate::sumtree::tree::{room_bytes, Tree};

/// The working room of a priority update, one for each thread that updates: a learner
/// updates from one thread, batch after batch, and so allocates nothing once warm (it
/// made seven allocations a batch before).
#[derive(Debug, Default)]
struct UpdateRoom {
    /// Where each row lies.
    slots: Vec<(u64, u64, u64)>,
    /// The rows still live, as `(shard, leaf, lap, priority)`.
    live: Vec<(usize, usize, u32, f64)>,
    /// One shard's live rows, as `(leaf, lap, priority)`.
    rows: Vec<(usize, u32, f64)>,
    applied: Vec<bool>,
    leaves: leaf_writes::UpdateRoom,
}

impl UpdateRoom {
    /// Empties the room and makes it room for a batch of `rows` rows, however the
    /// batch splits among the shards.
    fn clear_for(&mut self, rows: usize) {
        self.slots.clear();
        self.live.clear();
        self.rows.clear();
        self.applied.clear();
        self.slots.reserve(rows);
        self.live.reserve(rows);
        self.rows.reserve(rows);
        self.applied.reserve(rows);
        self.leaves.clear_for(rows);
    }

    fn bytes(&self) -> usize {
        room_bytes(&self.slots)
            + room_bytes(&self.live)
            + room_bytes(&self.rows)
            + room_bytes(&self.applied)
            + self.leaves.bytes()
    }
}

/// What a thread's room may keep between updates: about 8,000 rows' worth. A room that
/// a larger batch grew is let go after it.
const ROOM_KEPT_BYTES: usize = 1 << 20;

thread_local! {
    /// This thread's room.
    static ROOM: RefCell<UpdateRoom> = RefCell::new(UpdateRoom::default());
}

impl Core {
    pub(crate) fn prioritized(&self) -> Result<&Priorities, PriorityError> {
        self.sampler
            .prioritized()
            .ok_or(PriorityError::NotPrioritized)
    }

    /// One priority per row of `batch` from the priority field, reduced; `None` when
    /// the buffer has no priority field. Refuses NaN, infinite or negative values.
    pub(crate) fn batch_priorities(&self, batch: &Batch) -> Result<Option<Vec<f64>>, DataError> {
        let (Some(field), Some(state)) = (self.priority_field, self.sampler.prioritized()) else {
            return Ok(None);
        };
        let key = self.storage.spec().fields()[field].key();
        let values =
            column_f64(batch, key).ok_or_else(|| DataError::MissingField { key: key.clone() })?;
        let per_row = (values.len() / batch.len().max(1)).max(1);
        // Every value, not just each row's reduction: a max or min would skip a NaN.
        if let Some(at) = values.iter().position(|&p| !prioritized::valid(p)) {
            return Err(DataError::InvalidPriority {
                key: key.clone(),
                row: at / per_row,
                value: values[at],
            });
        }
        let reduced = values
            .chunks(per_row)
            .take(batch.len())
            .enumerate()
            .map(|(row, values)| {
                state
                    .reduction
                    .reduce_valid(values)
                    .map_err(|value| DataError::InvalidPriority {
                        key: key.clone(),
                        row,
                        value,
                    })
            })
            .collect::<Result<Vec<f64>, _>>()?;
        Ok(Some(reduced))
    }

    /// The raw priorities of an append's rows (`None` unless prioritized): from
    /// `priorities` (one per row of the batch), or else the sampler's priority for new
    /// rows.
    pub(crate) fn new_raws<'a>(&self, priorities: Option<&'a [f64]>) -> Option<Raws<'a>> {
        let state = self.sampler.prioritized()?;
        Some(match priorities {
            Some(ps) => {
                if let Some(top) = ps.iter().copied().reduce(f64::max) {
                    state.saw(top);
                }
                Raws::Each(ps)
            }
            None => Raws::All(state.new_row_priority(&self.storage.trees())),
        })
    }

    /// Gives the rows of an append to shard `k` (whose tree is `trees[k]`), `appended`
    /// and now published, their leaves: a draw never lands on a row before it can be
    /// read. An append without the shard's leaf turn first waits for an appender of
    /// rows it replaced that holds it (`shard.rs`, "Leaf turns").
    pub(crate) fn set_leaves(
        &self,
        trees: &[Tree<'_>],
        k: usize,
        appended: &Appended<'_>,
        steps: u64,
        src: &Source<'_>,
        raws: Raws<'_>,
    ) {
        let state = self
            .sampler
            .prioritized()
            .expect("only a prioritized buffer has leaves");
        let first = appended.first;
        let turn = appended.turn.is_some();
        if !turn {
            self.storage.shards()[k].await_leaf_turn(first, steps);
        }
        let ring = *self.storage.shards()[k].ring();
        let width = ring.width as usize;
        let runs: smallvec::SmallVec<[(shard::Step, u64); 2]> =
            shard::runs_of(&ring, first, steps).collect();
        let slots: smallvec::SmallVec<[(usize, usize, u32); 2]> = runs
            .iter()
            .map(|(start, len)| {
                let at = (start.pos * ring.width) as usize;
                (at, *len as usize * width, start.lap)
            })
            .collect();
        match raws {
            // New rows without a priority field share one priority: one mass.
            Raws::All(p) => {
                let each = None::<fn(usize, usize) -> f64>;
                state.set_leaves(trees, k, &slots, p, each, turn)
            }
            Raws::Each(ps) => {
                let top = ps.iter().copied().fold(0.0, f64::max);
                let each = |r: usize, i: usize| {
                    let (j, lane) = (runs[r].0.j + (i / width) as u64, (i % width) as u64);
                    ps[src.order.row(j, lane)]
                };
                state.set_leaves(trees, k, &slots, top, Some(each), turn)
            }
        }
    }

    pub(crate) fn update_priority(
        &self,
        index: &[u64],
        generation: &[u64],
        priority: &[f64],
        replaced: Replaced,
    ) -> Result<PriorityUpdate, Attempt<PriorityError>> {
        let state = self.prioritized()?;
        let lengths = PriorityError::Lengths {
            indices: index.len(),
            generations: generation.len(),
            priorities: priority.len(),
        };
        if index.len() != generation.len() {
            return Err(lengths.into());
        }
        if index.is_empty() {
            return if priority.is_empty() {
                Ok(PriorityUpdate::default())
            } else {
                Err(lengths.into())
            };
        }
        if priority.is_empty() || !priority.len().is_multiple_of(index.len()) {
            return Err(lengths.into());
        }
        if let Some(position) = priority.iter().position(|&p| !prioritized::valid(p)) {
            return Err(PriorityError::Invalid {
                position,
                value: priority[position],
            }
            .into());
        }
        let update = |room: &mut UpdateRoom| {
            self.update_in(room, state, index, generation, priority, replaced)
        };
        // A room of its own for an update made within one on this thread (none is
        // today), or while the thread's locals are torn down.
        let fresh = || update(&mut UpdateRoom::default());
        ROOM.try_with(|room| {
            let Ok(mut room) = room.try_borrow_mut() else {
                return fresh();
            };
            let done = update(&mut room);
            if room.bytes() > ROOM_KEPT_BYTES {
                *room = UpdateRoom::default();
            }
            done
        })
        .unwrap_or_else(|_| fresh())
    }

    /// [`Core::update_priority`]'s work once its arguments are checked, in `room`
    /// (any left from an earlier batch).
    fn update_in(
        &self,
        room: &mut UpdateRoom,
        state: &Priorities,
        index: &[u64],
        generation: &[u64],
        priority: &[f64],
        replaced: Replaced,
    ) -> Result<PriorityUpdate, Attempt<PriorityError>> {
        room.clear_for(index.len());
        let UpdateRoom {
            slots,
            live,
            rows,
            applied,
            leaves,
        } = room;
        // Where each row lies, found once, and the line of its stamp (and raw word)
        // loading before any is checked: a learner updates after its forward and
        // backward passes have pushed the batch's slots out of the cache, and the
        // checks would otherwise wait out those misses one row at a time. Without it
        // (`replaybuf bench`'s `update-cold-paired`, 256 of a million rows) the update
        // took 1.9 times the plain floor's update; 1.67 with it.
        let geometry = self.storage.geometry();
        for (&i, &g) in index.iter().zip(generation) {
            if i == crate::batch::PADDING_INDEX {
                // Padding after a short slice: no row. Its place in `slots` is kept
                // (the loop below walks them beside `index`) and never read.
                slots.push((0, 0, 0));
                continue;
            }
            let Some(at) = geometry.locate(i) else {
                if self.storage.first_lap() > 0 && self.before_swap(g) {
                    // A row of a larger storage this buffer had before a swap, at a
                    // position the new one has not: replaced, as the rows of the
                    // positions it kept are. It refused the whole update.
                    slots.push(SWAPPED_OUT);
                    continue;
                }
                let capacity = geometry.capacity();
                return Err(PriorityError::OutOfRange { index: i, capacity }.into());
            };
            self.storage.prefetch_stamp(at);
            slots.push(at);
        }
        let per_row = priority.len() / index.len();
        let trees = self.storage.trees();
        let positions: smallvec::SmallVec<[shard::Positions; 8]> = self
            .storage
            .shards()
            .iter()
            .map(|s| s.window().positions(s.ring().steps))
            .collect();
        let mut done = PriorityUpdate::default();
        for (row, ((&i, &g), &at)) in index.iter().zip(generation).zip(slots.iter()).enumerate() {
            if i == crate::batch::PADDING_INDEX {
                continue;
            }
            let p = state
                .reduction
                .reduce_valid(&priority[row * per_row..(row + 1) * per_row])
                .map_err(|value| PriorityError::Invalid {
                    position: row * per_row,
                    value,
                })?;
            match self.row_is(&positions, at, g) {
                Row::Live { shard, leaf, lap } => live.push((shard, leaf, lap, p)),
                Row::Replaced if replaced == Replaced::Skip => done.stale += 1,
                Row::Replaced => {
                    return Err(PriorityError::Replaced {
                        position: row,
                        index: i,
                    }
                    .into())
                }
                Row::Unknown => {
                    return Err(PriorityError::UnknownRow {
                        position: row,
                        index: i,
                        generation: g,
                    }
                    .into())
                }
            }
        }
        // A swap that retired the storage meanwhile: the caller checks the rows again
        // against the new state and updates them there.
        let _inside = self.storage.enter_update()?;
        // One batch a tree, each shard's rows in the order given.
        for k in 0..trees.len() {
            rows.clear();
            rows.extend(
                live.iter()
                    .filter(|&&(shard, ..)| shard == k)
                    .map(|&(_, leaf, lap, p)| (leaf, lap, p)),
            );
            if rows.is_empty() {
                continue;
            }
            applied.clear();
            applied.resize(rows.len(), false);
            state.update(&trees, k, rows, applied, leaves);
            let n = applied.iter().filter(|&&a| a).count();
            done.applied += n;
            done.stale += rows.len() - n;
        }
        Ok(done)
    }

    /// What the row of generation `g` in shard `k`'s position `pos`, lane `lane` is
    /// now, against `positions` (a snapshot of the shards' windows).
    fn row_is(
        &self,
        positions: &[shard::Positions],
        (k, pos, lane): (u64, u64, u64),
        g: u64,
    ) -> Row {
        if (k, pos, lane) == SWAPPED_OUT {
            return Row::Replaced;
        }
        let ring = self.storage.shards()[k as usize].ring();
        let leaf = pos * ring.width + lane;
        let stamp = self.storage.stamp_of(k as usize, leaf);
        if stamp == Stamp::EMPTY && self.before_swap(g) {
            // A row of a storage this buffer had before a swap (`swap/carry.rs`).
            return Row::Replaced;
        }
        if stamp == Stamp::EMPTY
            || stamp::generation_cmp(g, stamp.generation()) == Ordering::Greater
        {
            // Never written, or a row this slot has not held yet: not from this buffer.
            return Row::Unknown;
        }
        let live = positions[k as usize]
            .seq_at(pos)
            .is_some_and(|seq| ring.lap(seq) == stamp.lap());
        if live && stamp.is_published() && stamp.generation() == g {
            Row::Live {
                shard: k as usize,
                leaf: leaf as usize,
                lap: stamp.lap(),
            }
        } else {
            Row::Replaced
        }
    }

    /// Whether generation `g` is of a row of a storage this buffer had before a swap
    /// (`swap/carry.rs`): older than the laps its storage started at.
    fn before_swap(&self, g: u64) -> bool {
        let first = Stamp::published(self.storage.first_lap() as u32, 0).generation();
        stamp::generation_cmp(g, first) == Ordering::Less
    }

    /// After `empty`: takes the mass of every row no longer live away, so draws land
    /// only on live rows.
    pub(crate) fn clear_emptied(&self) {
        if self.sampler.prioritized().is_none() {
            return;
        }
        for (shard, tree) in self.storage.shards().iter().zip(self.storage.trees()) {
            let ring = shard.ring();
            for leaf in 0..tree.layout().leaves {
                if shard.seq_at(leaf as u64 / ring.width).is_none() {
                    tree.clear(leaf, tree.leaf(leaf).lap());
                }
            }
        }
    }
}

/// What became of a sampled row, by its index and generation.
/// The place in an update's slots of a row at a position the buffer's storage has
/// not, of a larger storage before a swap ([`Core::before_swap`]).
const SWAPPED_OUT: (u64, u64, u64) = (u64::MAX, 0, 0);

enum Row {
    /// Still stored, at this leaf of this shard's tree, in this lap.
    Live { shard: usize, leaf: usize, lap: u32 },
    /// Overwritten by a newer row, rewritten in place, or emptied.
    Replaced,
    /// Never held by this buffer: the slot is unwritten or the generation is ahead of
    /// the slot's.
    Unknown,
}

/// What an update does with rows replaced since they were sampled.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replaced {
    /// Skips them and counts them as stale.
    Skip,
    /// Refuses the whole update.
    Refuse,
}

/// A float column of `batch` as `f64`s, or `None` if the batch lacks it.
pub(crate) fn column_f64(batch: &Batch, key: &crate::key::Key) -> Option<Vec<f64>> {
    Some(match batch.dtype(key).ok()? {
        DType::F64 => batch.column::<f64>(key).ok()?.to_vec(),
        DType::F32 => batch
            .column::<f32>(key)
            .ok()?
            .iter()
            .map(|&v| f64::from(v))
            .collect(),
        DType::F16 => batch
            .column::<half::f16>(key)
            .ok()?
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        DType::BF16 => batch
            .column::<half::bf16>(key)
            .ok()?
            .iter()
            .map(|v| v.to_f64())
            .collect(),
        _ => return None,
    })
}
