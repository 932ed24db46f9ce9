//! The core of one buffer state: its storage and sampler engine, and the settings
//! that say how batches map onto them (seed, batch size, `dim_extend`, the priority
//! field). Every path that reads or writes rows runs here: extends after the write
//! policy's gate (`state.rs`), samples, reads and rewrites by position, and the row
//! priorities of a prioritized buffer (`priorities.rs`) and slice samples
//! (`slices.rs`). The gates above it (write policy, max-value ranks) are given a
//! `&Core`, never the whole state.
//!
//! Layer: core.

use crate::batch::{self, Batch, Destination, Scratch};
use crate::error::{AccessError, DataError, PriorityError, SampleError};
use crate::rng::{self, Rng};
use crate::sampler::prioritized::{self, Masses};
use crate::sampler::slice::Marks;
use crate::sampler::{read_after_miss, read_draws, uniform_redraw, OnMiss, SamplerEngine};
use crate::spec::Spec;
use crate::storage::atomic_copy::prefetch_room;
use crate::storage::freeze::Retired;
use crate::storage::geometry::Geometry;
use crate::storage::layout::Global;
use crate::storage::plan::{Dest, DstCol, RowOrder, Source, SrcCol};
use crate::storage::shard::Shard;
use crate::storage::stamp::{Claim, Stamp};
use crate::storage::{Draw, Located, Miss, Storage, Want, READ_BLOCK, SAMPLE_AHEAD_DRAWS};
use crate::sumtree::tree::Tree;
use crate::sync::Ordering;
use smallvec::SmallVec;

mod priorities;
mod slices;
mod written;

pub(crate) use priorities::{column_f64, Replaced};
pub use written::Written;

/// A buffer state's storage and sampler, and how batches map onto them.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) storage: Storage,
    pub(crate) sampler: SamplerEngine,
    /// The seed of every draw.
    pub(crate) seed: u64,
    pub(crate) batch_size: Option<usize>,
    /// Which batch dimension an ndim-2 extend's time runs along (TorchRL's
    /// `dim_extend`).
    pub(crate) dim_extend: usize,
    /// The spec field holding priorities (`priority_key`), by position.
    pub(crate) priority_field: Option<usize>,
}

impl Core {
    /// The rows a FIFO sampler has not taken yet (`None` for another sampler).
    pub(crate) fn queued(&self) -> Option<u64> {
        matches!(self.sampler, SamplerEngine::Fifo)
            .then(|| crate::sampler::fifo::waiting(&self.storage))
    }

    /// The shard of the next buffer-level extend: round robin across calls.
    pub(crate) fn pick_shard(&self) -> Result<usize, DataError> {
        if let Some(leased) = self.storage.process_lease() {
            return leased.map_err(|_| DataError::NoFreeShard {
                shards: self.storage.shards().len(),
            });
        }
        let s = self.storage.shards().len() as u64;
        let one_ring = self.sampler.slice().is_some() || self.storage.frames().is_some();
        Ok(if s == 1 || one_ring {
            0
        } else {
            (self
                .storage
                .global(Global::NextShard)
                .fetch_add(1, Ordering::Relaxed)
                % s) as usize
        })
    }

    /// The random stream of the next sample call made through the buffer itself
    /// ([`Storage::take_count`]: refused if a swap may have carried the counter to a
    /// new storage first, where two calls would then draw alike).
    pub(crate) fn call_rng(&self) -> Result<Rng, Retired> {
        let call = self.storage.take_count(Global::Calls)?;
        Ok(rng::stream(self.seed, rng::Stream::Call(call)))
    }

    pub(crate) fn batch_size_for(&self, batch: &Batch) -> Result<usize, SampleError> {
        match (self.batch_size, batch.len()) {
            (Some(n), _) => Ok(n),
            (None, 0) => Err(SampleError::NoBatchSize),
            (None, n) => Ok(n),
        }
    }

    /// The copy plan of `batch`'s columns for this storage's rows, or `None` if the
    /// batch has another spec.
    pub(crate) fn source<'a>(
        &self,
        batch: &'a Batch,
        order: RowOrder,
    ) -> Result<Source<'a>, DataError> {
        let spec = self.storage.spec();
        let map = batch.columns_for(spec)?;
        let cols = spec
            .fields()
            .iter()
            .zip(&map)
            .enumerate()
            .map(|(f, (field, &i))| SrcCol {
                data: batch.columns()[i].as_bytes(),
                bytes: field.bytes(),
                place: self.storage.place(f),
            })
            .collect();
        Ok(Source { cols, order })
    }

    pub(crate) fn check_one_row(&self, row: &Batch) -> Result<(), DataError> {
        if self.storage.geometry().ndim() != 1 || row.len() != 1 {
            return Err(DataError::BatchShape {
                expected: "one row ([1]) on an ndim-1 storage",
                found: row.shape().to_vec(),
            });
        }
        Ok(())
    }

    pub(crate) fn order_for(&self, t: u64, envs: u64) -> RowOrder {
        if self.dim_extend == 0 {
            RowOrder::TimeMajor { envs, env0: 0 }
        } else {
            RowOrder::EnvMajor { steps: t, env0: 0 }
        }
    }

    /// Checks the batch shape against the storage and returns (steps, envs on the
    /// batch's env axis, row order).
    fn extent(&self, shard: Option<usize>, batch: &Batch) -> Result<(u64, RowOrder), DataError> {
        let shape = batch.shape();
        match (*self.storage.geometry(), shard) {
            (Geometry::Flat { .. }, _) => match shape {
                [n] => Ok((*n as u64, RowOrder::Flat)),
                _ => Err(DataError::BatchShape {
                    expected: "[n] for an ndim-1 storage",
                    found: shape.to_vec(),
                }),
            },
            (Geometry::Grid { envs, .. }, group) => {
                let want = match group {
                    Some(k) => self.storage.shards()[k].ring().width,
                    None => envs,
                };
                let (expected, dims) = match self.dim_extend {
                    0 => (
                        "[t, envs] (dim_extend 0), envs of the storage or the writer's group",
                        [1, 0],
                    ),
                    _ => (
                        "[envs, t] (dim_extend 1), envs of the storage or the writer's group",
                        [0, 1],
                    ),
                };
                match shape {
                    [a, b] if [*a, *b][dims[0]] as u64 == want => {
                        let t = [*a, *b][dims[1]] as u64;
                        Ok((t, self.order_for(t, want)))
                    }
                    _ => Err(DataError::BatchShape {
                        expected,
                        found: shape.to_vec(),
                    }),
                }
            }
        }
    }

    /// Checks `batch` for an extend of `shard` (or of the whole buffer) and returns what
    /// `append` needs: its steps, copy plan, and the priorities of its priority field.
    pub(crate) fn prepare<'a>(
        &self,
        shard: Option<usize>,
        batch: &'a Batch,
    ) -> Result<Prepared<'a>, DataError> {
        let (steps, order) = self.extent(shard, batch)?;
        let src = self.source(batch, order)?;
        if self.storage.frames().is_some() {
            self.check_frames(shard, steps, &src)?;
        }
        Ok(Prepared {
            steps,
            src,
            priorities: self.batch_priorities(batch)?,
        })
    }

    /// Checks a frames buffer's extend of `shard` (or of the whole buffer) against
    /// the trajectories it continues (`Storage::check_frames`).
    fn check_frames(
        &self,
        shard: Option<usize>,
        steps: u64,
        src: &Source<'_>,
    ) -> Result<(), DataError> {
        let storage = &self.storage;
        let groups: SmallVec<[(usize, Source<'_>); 4]> = match (shard, storage.geometry()) {
            (Some(k), _) => smallvec::smallvec![(k, src.clone())],
            // A buffer-level extend of an ndim-1 frames buffer goes to one ring.
            (None, Geometry::Flat { .. }) => smallvec::smallvec![(self.pick_shard()?, src.clone())],
            (None, Geometry::Grid { .. }) => (storage.shards().iter().enumerate())
                .map(|(k, s)| (k, src.for_group(s.ring().index_offset)))
                .collect(),
        };
        for (k, src) in groups {
            storage
                .check_frames(k, steps, &src)
                .map_err(|m| DataError::Frames {
                    key: m.key,
                    row: m.row,
                    what: m.what,
                })?;
        }
        Ok(())
    }

    /// Appends validated rows. `shard: None` writes every env group of an ndim-2 storage.
    /// Refused, with nothing written, if a swap retired the storage.
    pub(crate) fn append(
        &self,
        shard: Option<usize>,
        rows: &Prepared<'_>,
    ) -> Result<Written, Retired> {
        let storage = &self.storage;
        let (steps, src) = (rows.steps, &rows.src);
        let mut written = Written::new(steps, src.order);
        let priorities = rows.priorities.as_deref();
        match shard {
            Some(k) => {
                let claim = storage.enter_append(k)?;
                let first = self.append_shard(k, claim, steps, src, priorities);
                written.push(*storage.shards()[k].ring(), first, 0);
            }
            None => {
                // Every shard is entered before any is written, so that a swap finds
                // the whole extend in the storage it copies, or none of it.
                let claims = storage.enter_append_all()?;
                for ((k, shard), claim) in storage.shards().iter().enumerate().zip(claims) {
                    let ring = *shard.ring();
                    let group = src.for_group(ring.index_offset);
                    let first = self.append_shard(k, claim, steps, &group, priorities);
                    written.push(ring, first, ring.index_offset);
                }
            }
        }
        Ok(written)
    }

    /// Appends to shard `k`, entered with `claim`; for a prioritized buffer, records
    /// the rows' raw priorities once they are claimed and gives them their leaves once
    /// they are published (see `priorities.rs`).
    fn append_shard(
        &self,
        k: usize,
        claim: Claim,
        steps: u64,
        src: &Source<'_>,
        priorities: Option<&[f64]>,
    ) -> u64 {
        let Some(raws) = self.new_raws(priorities) else {
            return self
                .storage
                .append_entered(k, claim, steps, src, None)
                .first;
        };
        // A leaf changer from before its rows are published until their leaves are
        // set (`sumtree/tree.rs`, "Plain leaves").
        let trees = self.storage.trees();
        let _appending = trees[k].appending();
        let appended = self
            .storage
            .append_entered(k, claim, steps, src, Some(raws));
        self.set_leaves(&trees, k, &appended, steps, src, raws);
        appended.first
    }

    /// Samples `n` rows into `batch`, with the scratch it keeps.
    pub(crate) fn sample_into(
        &self,
        rng: &mut Rng,
        n: usize,
        batch: &mut Batch,
    ) -> Result<(), SampleError> {
        let mut scratch = std::mem::take(batch.scratch_mut());
        let result = self.sample_to(rng, n, batch, &mut scratch);
        *batch.scratch_mut() = scratch;
        result.map(drop)
    }

    /// Makes room in `batch` for a sample of `n` rows, or refuses one past memory
    /// ([`SampleError::TooLarge`]); before the sample is counted or drawn.
    pub(crate) fn room_for_sample(&self, n: usize, batch: &mut Batch) -> Result<(), SampleError> {
        batch.room_for_sample(n, self.sampler.prioritized().is_some())
    }

    /// Refuses now a sample of `n` rows that [`Core::sample_to`] would refuse before
    /// drawing: a batch a slice sampler cannot split into its slices, or a prioritized
    /// storage whose rows have no mass to draw from (an empty one is left to the
    /// caller, which may wait for rows). For a caller about to draw from several
    /// buffers at once (an ensemble), whose later buffer's refusal would otherwise come
    /// after the earlier ones drew: a draw moves a buffer's epoch and rate-limit counts.
    pub(crate) fn check_sample(&self, n: usize) -> Result<(), SampleError> {
        if let Some(slice) = self.sampler.slice_state() {
            slice.cfg.sample_layout(n)?;
        } else if self.sampler.prioritized().is_some()
            && self.storage.len() > 0
            && Masses::new(&self.storage.trees()).is_empty()
        {
            return Err(self.massless());
        }
        Ok(())
    }

    /// Samples up to `n` rows into `out`, with `scratch` as working room; returns the
    /// rows written (fewer than `n` only when a without-replacement epoch ends short,
    /// or a FIFO queue has fewer rows waiting).
    /// Everything that can refuse the sample does so before anything is drawn.
    pub(crate) fn sample_to(
        &self,
        rng: &mut Rng,
        n: usize,
        out: &mut impl SampleOut,
        scratch: &mut Scratch,
    ) -> Result<usize, SampleError> {
        scratch.room(n)?;
        if let Some(slice) = self.sampler.slice_state() {
            return self.sample_slices(slice, rng, n, out, scratch);
        }
        // The output may list the same fields in another order: pair them by key.
        let spec = self.storage.spec();
        let map = out.column_map(spec)?;
        let weighted = self.sampler.prioritized().is_some();
        out.check_weighted(weighted)?;
        let mut rounds = 0;
        loop {
            self.draw(rng, n, scratch, rounds > 0)?;
            let rows = scratch.draws.len();
            out.shape_rows(rows, weighted);
            let mut parts = out.parts(&self.storage, &map);
            let read = self.gather_sampled(
                rng,
                scratch,
                &mut parts.dest,
                parts.generation,
                parts.index,
                parts.weight.filter(|_| weighted),
            );
            let shards = self.storage.shards();
            if self
                .sampler
                .settle(shards, &scratch.draws, read, &mut rounds)?
            {
                return Ok(rows);
            }
        }
    }

    /// Why a prioritized sample found no mass to draw from: every live row at priority
    /// 0 ([`SampleError::NoMass`]; with `eps` 0 such rows weigh nothing), or no row
    /// ([`SampleError::Empty`]), which is also the answer while rows of a positive
    /// priority are stored (their writers are still setting their leaves: a retry
    /// finds them).
    #[cold]
    fn massless(&self) -> SampleError {
        let storage = &self.storage;
        if storage.len() == 0 {
            return SampleError::Empty;
        }
        let live = storage.live_priorities();
        let mut zero = 0;
        for (k, tree) in storage.trees().iter().enumerate() {
            for leaf in 0..tree.layout().leaves {
                match live(k, leaf) {
                    Some((_, p)) if p > 0.0 => return SampleError::Empty,
                    Some(_) => zero += 1,
                    None => {}
                }
            }
        }
        if zero == 0 {
            SampleError::Empty
        } else {
            SampleError::NoMass { rows: zero }
        }
    }

    /// Draws up to `n` rows into `scratch.draws`; `again` after a read of the rows
    /// last drawn missed, when a FIFO draw leaves out the rows that will never be read
    /// (`fifo.rs`; the first draw of a sample does not look).
    ///
    /// A uniform sample's draws are fetched first, all their lines at once
    /// (`atomic_copy::prefetch_room`), while they are made, which loads nothing else.
    /// Not where each lies (`scratch.located`, 192 lines to the draws' 128), written
    /// beside the rows' own prefetches: fetched too, a cold sample took 1.15-1.16x
    /// the cold gather's time against 1.08-1.16x (three runs alternating in one
    /// process). Nor a prioritized sample's: its descents wait on the trees' lines, and
    /// the scratch's took their room (`sample+update` 256 of a million rows: 0.96x
    /// the time with the scratch fetched, 0.94x with only the outputs; after a write
    /// over 64 MiB, 1.01x-1.03x and 1.00x-1.03x).
    pub(crate) fn draw(
        &self,
        rng: &mut Rng,
        n: usize,
        scratch: &mut Scratch,
        again: bool,
    ) -> Result<(), SampleError> {
        let storage = &self.storage;
        storage.windows(&mut scratch.windows);
        if self.sampler.prioritized().is_none() {
            prefetch_room(scratch.draws.as_ptr(), scratch.draws.capacity());
            return self.sampler.draw(
                storage.shards(),
                &scratch.windows,
                rng,
                n,
                &mut scratch.draws,
                again.then_some(&|d| storage.is_abandoned(d)),
            );
        }
        // A frames buffer whose rows all wait for their next step (or for older
        // frames) holds mass but no row a draw can return: the uniform sampler says so
        // at once, where the draws landed on rows left out and were drawn again 2^20
        // times, for 0.45 s, before a sample failed as starved.
        if storage.frames().is_some() && scratch.windows.iter().all(|w| w.steps() == 0) {
            return Err(SampleError::Empty);
        }
        let trees = storage.trees();
        let masses = Masses::new(&trees);
        if masses.is_empty() {
            return Err(self.massless());
        }
        prioritized::draw(
            &trees,
            storage.shards(),
            &scratch.windows,
            &masses,
            rng,
            n,
            &mut scratch.draws,
        );
        Ok(())
    }

    /// Copies the rows drawn into `scratch.draws` into rows `0..` of `dest`, replacing
    /// draws that miss as the sampler says, with importance weights when prioritized.
    /// The rows' generations, indices and weights are fetched first, all their lines
    /// at once (`atomic_copy::prefetch_room`).
    pub(crate) fn gather_sampled(
        &self,
        rng: &mut Rng,
        scratch: &mut Scratch,
        dest: &mut Dest<'_>,
        generation: &mut [u64],
        index: &mut [u64],
        weight: Option<&mut [f32]>,
    ) -> Result<(), SampleError> {
        for room in [&*generation, &*index] {
            prefetch_room(room.as_ptr(), room.len());
        }
        if let Some(w) = &weight {
            prefetch_room(w.as_ptr(), w.len());
        }
        let shards = self.storage.shards();
        let Scratch {
            windows,
            draws,
            located,
            ..
        } = scratch;
        match (self.sampler.prioritized(), weight) {
            (Some(state), Some(weight)) => {
                let trees = self.storage.trees();
                let min = trees.iter().map(Tree::min).min().unwrap_or(u64::MAX);
                let mut masses = Masses::new(&trees);
                let mut redraw = |refresh: bool| {
                    if refresh {
                        windows.clear();
                        windows.extend(shards.iter().map(Shard::window));
                        masses = Masses::new(&trees);
                    }
                    prioritized::redraw(&trees, shards, windows, &masses, rng)
                };
                let weigh = Weigh {
                    min,
                    out: &mut *weight,
                };
                self.gather(
                    draws,
                    located,
                    Want::Exact,
                    OnMiss::Redraw(&mut redraw),
                    dest,
                    generation,
                    index,
                    Some(weigh),
                )?;
                // The rows' ratios in, their weights out: the powers of the batch at
                // once.
                state.weigh(weight);
                Ok(())
            }
            _ => {
                let mut redraw = uniform_redraw(shards, windows, rng);
                // A row its writer never finishes: the writer may be a process that
                // died (shared mode), whose shard is then taken over and repaired.
                let lost = |d: Draw| {
                    let k = d.shard as usize;
                    self.storage.reclaim_dead_lease(k);
                    self.storage.reclaim_dead_editor(k);
                    self.storage.is_abandoned(d)
                };
                self.gather(
                    draws,
                    located,
                    self.sampler.want(),
                    self.sampler.on_miss(&mut redraw, &lost),
                    dest,
                    generation,
                    index,
                    None,
                )
            }
        }
    }

    /// Copies the drawn rows into rows `0..draws.len()` of `dest`. With `weigh`, the
    /// draws are prioritized: a draw must name the row its leaf belongs to, and each
    /// row read gets its weight ratio (`prioritized::ratio`). `located` is room for
    /// where each draw's row lies, worked out once (prefetching and reading it used to
    /// split its sequence number three times: mujoco `sample` 256 in L2 6.6 -> 6.3 us).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gather(
        &self,
        draws: &[Draw],
        located: &mut Vec<Located>,
        want: Want,
        on_miss: OnMiss<'_>,
        dest: &mut Dest<'_>,
        generation: &mut [u64],
        index: &mut [u64],
        mut weigh: Option<Weigh<'_>>,
    ) -> Result<(), SampleError> {
        let storage = &self.storage;
        located.clear();
        // Every row's lines start for L2 at once, and a sliding window of them for L1
        // (`Storage::prefetch`): the misses then overlap the copying, not precede it.
        // Each row's as soon as it is located, so that the locating of the rest
        // overlaps them too (mujoco `sample` 256 on a Zen 3 host, alternating: 14.0-
        // 14.5 us where a pass of its own after took 15.0-15.6).
        let locator = storage.locator();
        located.extend(draws.iter().map(|&d| {
            let at = locator.locate(d);
            storage.prefetch_later(at);
            at
        }));
        let located = &located[..];
        for &at in located.iter().take(SAMPLE_AHEAD_DRAWS) {
            storage.prefetch(at);
        }
        if !storage.reads_in_blocks() {
            return read_draws(
                draws,
                on_miss,
                |d, k, first| {
                    if let Some(&ahead) = located.get(k + SAMPLE_AHEAD_DRAWS) {
                        storage.prefetch(ahead);
                    }
                    self.read_drawn(located, want, dest, &mut weigh, d, k, first)
                },
                generation,
                index,
            );
        }
        // First reads go a block of rows at a time (`Storage::read_block`); a row that
        // misses is then redrawn or retried alone, before the next block is read. The
        // blocks are this loop's own, not `read_draws`' row by row through one closure
        // for first reads and retries alike: mujoco `sample` 256 by callgrind, 520 ->
        // 454 instructions a row; alternating laps in one process on a Zen 3 host,
        // 0.863x the time on 10,000 rows and 0.937x and 0.966x on a million.
        let (n, mut on_miss) = (draws.len(), on_miss);
        let mut block = [Err(Miss::Busy); READ_BLOCK];
        for (b, chunk) in draws.chunks(READ_BLOCK).enumerate() {
            let (start, end) = (b * READ_BLOCK, b * READ_BLOCK + chunk.len());
            let reads = &mut block[..chunk.len()];
            storage.read_block(&located[start..end], want, dest, start, reads);
            let ahead = (start + SAMPLE_AHEAD_DRAWS).min(n)..(end + SAMPLE_AHEAD_DRAWS).min(n);
            for &at in &located[ahead] {
                storage.prefetch(at);
            }
            for (j, (&d, &read)) in chunk.iter().zip(reads.iter()).enumerate() {
                let k = start + j;
                let first = read.and_then(|stamp| {
                    weigh_row(&mut weigh, d, stamp, k)?;
                    Ok((stamp.generation(), located[k].index))
                });
                let (g, i) = match first {
                    Ok(read) => read,
                    Err(miss) => read_after_miss(d, k, miss, &mut on_miss, &mut |d, k, first| {
                        self.read_drawn(located, want, dest, &mut weigh, d, k, first)
                    })?,
                };
                generation[k] = g;
                index[k] = i;
            }
        }
        Ok(())
    }

    /// One read of draw `d` into output row `k` for [`Core::gather`]: its row's first
    /// (at `located[k]`) or a redraw's or retry's, weighed as [`weigh_row`] says.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn read_drawn(
        &self,
        located: &[Located],
        want: Want,
        dest: &mut Dest<'_>,
        weigh: &mut Option<Weigh<'_>>,
        d: Draw,
        k: usize,
        first: bool,
    ) -> Result<(u64, u64), Miss> {
        let here = if first {
            located[k]
        } else {
            self.storage.locate(d)
        };
        let (stamp, at) = self.storage.read(d, here, want, dest, k)?;
        weigh_row(weigh, d, stamp, k)?;
        Ok((stamp.generation(), at))
    }

    /// Every live row, as a draw, in storage order.
    pub(crate) fn live_draws(&self) -> Vec<Draw> {
        (0..self.storage.geometry().capacity())
            .filter_map(|i| self.storage.draw_at(i))
            .collect()
    }

    /// The rows at the drawn positions, as they are now.
    ///
    /// A read by position waits for a row being written: its writer is inside one
    /// extend. If it waits long, the writer may be a process that died (shared mode):
    /// the shards of dead lease holders are taken over and repaired, and rows such a
    /// writer never published are left out. A row that is gone (a frames buffer's row
    /// whose frames were lapped or evicted) ends the pass at once; every pass after the
    /// first reads the positions' rows as the windows then say.
    pub(crate) fn read_positions(&self, draws: &[Draw]) -> Batch {
        let mut draws = std::borrow::Cow::Borrowed(draws);
        let mut backoff = crate::sync::Backoff::new();
        let mut passes = 0u32;
        loop {
            if let Some(batch) = self.read_each(&draws) {
                return batch;
            }
            for k in 0..self.storage.shards().len() {
                self.storage.reclaim_dead_lease(k);
                self.storage.reclaim_dead_editor(k);
            }
            // Each position's row as it is now: rows a dead writer never published
            // are left out, and so are a frames buffer's rows that can no longer be
            // rebuilt (evicted, or whose neighbours were lapped) or not yet (the
            // lane's newest step, whose next step may never come).
            let mut now: Vec<Draw> = draws
                .iter()
                .filter_map(|&d| self.storage.draw_at(self.storage.position_of(d)))
                .collect();
            passes += 1;
            if passes.is_multiple_of(POSITION_READ_PASSES) {
                // A row that no pass reads while its position says it is live (a
                // damaged stamp): each position read alone, and those that still
                // miss left out, rather than passes without end.
                now.retain(|&d| self.reads(d));
            }
            draws = std::borrow::Cow::Owned(now);
            backoff.snooze();
        }
    }

    /// Whether the row of `d` reads, alone, within a read's patience.
    fn reads(&self, d: Draw) -> bool {
        self.read_each(&[d]).is_some()
    }

    /// The rows of `draws` (each the row at its position, or a newer one), or `None`
    /// if one missed a read's patience.
    fn read_each(&self, draws: &[Draw]) -> Option<Batch> {
        let mut batch = Batch::zeros(self.storage.spec().clone(), [0]);
        batch.reshape_for_sample(draws.len(), false);
        let identity: SmallVec<[usize; 8]> = (0..self.storage.spec().fields().len()).collect();
        let parts = batch.parts_mut();
        let mut dest = dest_for(&self.storage, &identity, parts.columns);
        let read = self.gather(
            draws,
            &mut Vec::new(),
            Want::AtLeast,
            OnMiss::RetryUpTo(POSITION_READ_PATIENCE),
            &mut dest,
            parts.generation,
            parts.index,
            None,
        );
        drop(dest);
        read.is_ok().then_some(batch)
    }
}

/// Misses of one row after which a read by position looks for dead writers.
const POSITION_READ_PATIENCE: u32 = 1 << 14;
/// Failed passes of a read by position after which it reads each position alone and
/// leaves out those that never read.
const POSITION_READ_PASSES: u32 = 8;

/// Rows checked for an extend, ready to append.
pub(crate) struct Prepared<'a> {
    pub(crate) steps: u64,
    pub(crate) src: Source<'a>,
    /// One priority per batch row, from the priority field.
    pub(crate) priorities: Option<Vec<f64>>,
}

/// What a prioritized gather needs to weigh the rows it reads.
pub(crate) struct Weigh<'a> {
    /// The smallest mass of any stored row, read before the draws.
    min: u64,
    /// Each row's weight ratio (`prioritized::ratio`), which the gather's caller
    /// raises to the weights.
    out: &'a mut [f32],
}

/// A prioritized read's check and weight for draw `d`, read with `stamp`, as output
/// row `k`: a draw of no mass, or whose leaf's lap is not the row's, is not this row's
/// (`Miss::Gone`); otherwise its weight ratio lands in row `k`. Nothing without
/// weights.
#[inline(always)]
fn weigh_row(weigh: &mut Option<Weigh<'_>>, d: Draw, stamp: Stamp, k: usize) -> Result<(), Miss> {
    if let Some(w) = weigh {
        // The leaf's mass is this row's only if its lap is this row's.
        if d.mass == 0 || stamp.lap() != d.lap {
            return Err(Miss::Gone);
        }
        w.out[k] = prioritized::ratio(d.mass, w.min.min(d.mass));
    }
    Ok(())
}

/// The copy plan from rows of `spec` into an output's columns: field `i` of `spec`
/// goes to column `map[i]` (see `batch::columns_for`). The columns are a batch's
/// (`&mut Column`) or a caller's bytes.
pub(crate) fn dest_for<'a, C: Into<&'a mut [u8]>>(
    storage: &Storage,
    map: &[usize],
    columns: impl IntoIterator<Item = C>,
) -> Dest<'a> {
    let mut columns: SmallVec<[Option<C>; 8]> = columns.into_iter().map(Some).collect();
    Dest::new(
        storage
            .spec()
            .fields()
            .iter()
            .zip(map)
            .enumerate()
            .map(|(f, (field, &i))| {
                let data = columns[i]
                    .take()
                    .expect("replaybuf internal error: a column mapped twice")
                    .into();
                DstCol::new(data, field.bytes(), storage.place(f))
            })
            .collect(),
    )
}

/// Where a sample's rows go: a [`Batch`], shaped to fit each sample, or a caller's
/// [`Destination`] of fixed room. One sampling body (`Core::sample_to`, the slice
/// samples of `slices.rs`) writes both.
pub(crate) trait SampleOut {
    /// For each field of `spec`, the column of this output that takes it; refused if
    /// the output's fields are not `spec`'s.
    fn column_map(&self, spec: &Spec) -> Result<SmallVec<[usize; 8]>, SampleError>;

    /// Refuses, before anything is drawn, a weighted sample into an output that has
    /// no room for weights.
    fn check_weighted(&self, weighted: bool) -> Result<(), SampleError>;

    /// Makes room for `rows` rows, with a weight each when `weighted`.
    fn shape_rows(&mut self, rows: usize, weighted: bool);

    /// Makes room for `slices` slices of `len` rows, with marks (and weights when
    /// `weighted`).
    fn shape_slices(&mut self, slices: usize, len: usize, weighted: bool);

    /// The parts a sample writes, the rows of `storage` going to columns as `map`
    /// says.
    fn parts(&mut self, storage: &Storage, map: &[usize]) -> SampleParts<'_>;
}

/// The parts of an output a sample writes, borrowed apart. Row `k` of the sample is
/// row `k` of each.
pub(crate) struct SampleParts<'a> {
    pub(crate) dest: Dest<'a>,
    pub(crate) index: &'a mut [u64],
    pub(crate) generation: &'a mut [u64],
    pub(crate) weight: Option<&'a mut [f32]>,
    /// Slice samples' marks, when the output keeps them.
    pub(crate) marks: Option<&'a mut [Marks]>,
}

impl SampleOut for Batch {
    fn column_map(&self, spec: &Spec) -> Result<SmallVec<[usize; 8]>, SampleError> {
        Batch::columns_for(self, spec).map_err(|_| SampleError::SpecMismatch)
    }

    fn check_weighted(&self, _: bool) -> Result<(), SampleError> {
        Ok(())
    }

    fn shape_rows(&mut self, rows: usize, weighted: bool) {
        self.reshape_for_sample(rows, weighted);
    }

    fn shape_slices(&mut self, slices: usize, len: usize, weighted: bool) {
        self.reshape_for_slices(slices, len, weighted);
    }

    fn parts(&mut self, storage: &Storage, map: &[usize]) -> SampleParts<'_> {
        let parts = self.parts_mut();
        SampleParts {
            dest: dest_for(storage, map, parts.columns),
            index: parts.index,
            generation: parts.generation,
            weight: parts.weight,
            marks: parts.marks,
        }
    }
}

/// A destination's room is fixed: a sample of fewer rows writes its first rows.
impl SampleOut for Destination<'_> {
    fn column_map(&self, spec: &Spec) -> Result<SmallVec<[usize; 8]>, SampleError> {
        batch::columns_for(self.spec, spec).map_err(|_| SampleError::SpecMismatch)
    }

    fn check_weighted(&self, weighted: bool) -> Result<(), SampleError> {
        if weighted && self.weight.is_none() {
            return Err(SampleError::NoWeightRoom);
        }
        Ok(())
    }

    fn shape_rows(&mut self, rows: usize, _: bool) {
        assert!(
            rows <= self.rows,
            "replaybuf internal error: {rows} rows sampled into room for {}",
            self.rows
        );
    }

    fn shape_slices(&mut self, slices: usize, len: usize, weighted: bool) {
        self.shape_rows(slices * len, weighted);
    }

    fn parts(&mut self, storage: &Storage, map: &[usize]) -> SampleParts<'_> {
        SampleParts {
            dest: dest_for(storage, map, self.columns.iter_mut().map(|c| &mut **c)),
            index: &mut *self.index,
            generation: &mut *self.generation,
            weight: self.weight.as_deref_mut(),
            marks: self.marks.as_deref_mut(),
        }
    }
}

/// The outcome of one attempt at a write against one state: its own error, or
/// [`Retired`] (the state's storage was retired by a swap; nothing was written).
#[derive(Debug)]
pub(crate) enum Attempt<E> {
    Failed(E),
    Retired,
}

impl<E> From<Retired> for Attempt<E> {
    fn from(_: Retired) -> Self {
        Attempt::Retired
    }
}

impl From<DataError> for Attempt<DataError> {
    fn from(e: DataError) -> Self {
        Attempt::Failed(e)
    }
}

impl From<AccessError> for Attempt<AccessError> {
    fn from(e: AccessError) -> Self {
        Attempt::Failed(e)
    }
}

impl From<DataError> for Attempt<AccessError> {
    fn from(e: DataError) -> Self {
        Attempt::Failed(AccessError::Data(e))
    }
}

impl From<PriorityError> for Attempt<PriorityError> {
    fn from(e: PriorityError) -> Self {
        Attempt::Failed(e)
    }
}

impl<E> Attempt<E> {
    /// The error of an attempt that cannot have met a swap (a buffer still being
    /// built, or one the caller holds the reconfiguration lock of).
    pub(crate) fn unswapped(self) -> E {
        match self {
            Attempt::Failed(e) => e,
            Attempt::Retired => {
                panic!("replaybuf internal error: a storage retired while no swap could run")
            }
        }
    }
}
