//! A plain sequential model of the buffer, for cross-checking.
//!
//! [`ReferenceBuffer`] keeps what the real storage keeps (the same shards, rings,
//! positions, eviction order and emptying), with none of its machinery: rows are
//! `Vec<u8>`s in a `Vec`, every operation is sequential. The property tests and the
//! fuzz target drive both with one sequence of operations and compare lengths, indices,
//! contents and eviction; the criterion benches put it behind a `Mutex` as the locked
//! baseline the lock-free path is measured against (arc-swap keeps an `RwLock`
//! strategy for the same two purposes).
//!
//! It shares only the spec's row layout with the crate: the shard split, the index
//! arithmetic and the ring logic are written out again here, plainly.
//!
//! Layer: faces.

use std::sync::Arc;

use crate::batch::Batch;
use crate::spec::Spec;

/// One shard of the model: `steps` steps of `width` rows each.
#[derive(Clone, Debug)]
struct RefShard {
    steps: u64,
    width: u64,
    /// First env (ndim 2) or first position (ndim 1) of the shard.
    start: u64,
    cursor: u64,
    floor: u64,
    /// `(seq, row)` of each slot, step-major.
    slots: Vec<Option<(u64, Vec<u8>)>>,
}

impl RefShard {
    fn live(&self, seq: u64) -> bool {
        seq >= self.floor && seq < self.cursor && seq + self.steps >= self.cursor
    }
}

/// The sequential model of a [`ReplayBuffer`](crate::ReplayBuffer).
#[derive(Clone, Debug)]
pub struct ReferenceBuffer {
    spec: Arc<Spec>,
    /// `None` for ndim 1; `Some(envs)` for ndim 2.
    envs: Option<u64>,
    shards: Vec<RefShard>,
}

/// `total` split into `parts` near-equal contiguous parts: (start, len) of each.
fn split(total: u64, parts: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut start = 0;
    for k in 0..parts {
        let len = total / parts + u64::from(k < total % parts);
        out.push((start, len));
        start += len;
    }
    out
}

impl ReferenceBuffer {
    /// A model of an ndim-1 buffer of `capacity` rows in `shards` shards.
    pub fn new(spec: impl Into<Arc<Spec>>, capacity: usize, shards: usize) -> Self {
        let shards = split(capacity as u64, shards as u64)
            .into_iter()
            .map(|(start, steps)| RefShard {
                steps,
                width: 1,
                start,
                cursor: 0,
                floor: 0,
                slots: vec![None; steps as usize],
            })
            .collect();
        ReferenceBuffer {
            spec: spec.into(),
            envs: None,
            shards,
        }
    }

    /// A model of an ndim-2 buffer of shape `[steps, envs]` in `shards` shards.
    pub fn grid(spec: impl Into<Arc<Spec>>, steps: usize, envs: usize, shards: usize) -> Self {
        let shards = split(envs as u64, shards as u64)
            .into_iter()
            .map(|(start, width)| RefShard {
                steps: steps as u64,
                width,
                start,
                cursor: 0,
                floor: 0,
                slots: vec![None; steps * width as usize],
            })
            .collect();
        ReferenceBuffer {
            spec: spec.into(),
            envs: Some(envs as u64),
            shards,
        }
    }

    /// The spec of the rows.
    pub fn spec(&self) -> &Arc<Spec> {
        &self.spec
    }

    /// Storage positions.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| s.steps * s.width).sum::<u64>() as usize
    }

    /// Live rows.
    pub fn len(&self) -> usize {
        self.live_rows().len()
    }

    /// Whether no row is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows written since creation or the last `empty`.
    pub fn write_count(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| (s.cursor - s.floor) * s.width)
            .sum()
    }

    /// The storage index of slot (`pos`, `lane`) of shard `k`.
    fn index(&self, k: usize, pos: u64, lane: u64) -> u64 {
        let s = &self.shards[k];
        match self.envs {
            None => s.start + pos,
            Some(envs) => pos * envs + s.start + lane,
        }
    }

    /// Row `r` of `batch`, laid out as a stored row (fields at their offsets, zero
    /// padding).
    pub fn row_of(&self, batch: &Batch, r: usize) -> Vec<u8> {
        let mut row = vec![0u8; self.spec.row_bytes()];
        for f in self.spec.fields() {
            let col = batch
                .column_bytes(f.key())
                .expect("the batch has the model's fields");
            row[f.offset()..f.offset() + f.bytes()]
                .copy_from_slice(&col[r * f.bytes()..(r + 1) * f.bytes()]);
        }
        row
    }

    /// Appends `steps` steps to shard `k`; `row(j, lane)` gives each row. Returns the
    /// storage index of each (step, lane), step-major.
    pub fn append(
        &mut self,
        k: usize,
        steps: usize,
        mut row: impl FnMut(usize, usize) -> Vec<u8>,
    ) -> Vec<u64> {
        let mut at = Vec::new();
        let (ring, width) = (self.shards[k].steps, self.shards[k].width);
        for j in 0..steps as u64 {
            let seq = self.shards[k].cursor + j;
            for lane in 0..width {
                let pos = seq % ring;
                self.shards[k].slots[(pos * width + lane) as usize] =
                    Some((seq, row(j as usize, lane as usize)));
                at.push(self.index(k, pos, lane));
            }
        }
        self.shards[k].cursor += steps as u64;
        at
    }

    /// Appends an ndim-1 batch (shape `[n]`) to shard `k`; returns its indices.
    pub fn extend(&mut self, k: usize, batch: &Batch) -> Vec<u64> {
        let rows: Vec<Vec<u8>> = (0..batch.len()).map(|r| self.row_of(batch, r)).collect();
        self.append(k, rows.len(), |j, _| rows[j].clone())
    }

    /// Appends `t` steps of every environment of an ndim-2 model from a `[t, envs]`
    /// batch (`env_major`: an `[envs, t]` batch). Returns indices in batch row order.
    pub fn extend_grid(&mut self, batch: &Batch, env_major: bool) -> Vec<u64> {
        let envs = self.envs.expect("extend_grid needs an ndim-2 model") as usize;
        let t = batch.len() / envs;
        let rows: Vec<Vec<u8>> = (0..batch.len()).map(|r| self.row_of(batch, r)).collect();
        let row_of = |j: usize, e: usize| if env_major { e * t + j } else { j * envs + e };
        let mut indices = vec![0; batch.len()];
        for k in 0..self.shards.len() {
            let start = self.shards[k].start as usize;
            let width = self.shards[k].width as usize;
            let at = self.append(k, t, |j, lane| rows[row_of(j, start + lane)].clone());
            for j in 0..t {
                for lane in 0..width {
                    indices[row_of(j, start + lane)] = at[j * width + lane];
                }
            }
        }
        indices
    }

    /// Where storage index `index` lives: (shard, pos, lane).
    fn locate(&self, index: u64) -> Option<(usize, u64, u64)> {
        for (k, s) in self.shards.iter().enumerate() {
            match self.envs {
                None if (s.start..s.start + s.steps).contains(&index) => {
                    return Some((k, index - s.start, 0))
                }
                Some(envs) => {
                    let (pos, env) = (index / envs, index % envs);
                    if pos < s.steps && (s.start..s.start + s.width).contains(&env) {
                        return Some((k, pos, env - s.start));
                    }
                }
                None => {}
            }
        }
        None
    }

    /// The live row at `index`.
    pub fn get(&self, index: u64) -> Option<&[u8]> {
        let (k, pos, lane) = self.locate(index)?;
        let s = &self.shards[k];
        match &s.slots[(pos * s.width + lane) as usize] {
            Some((seq, row)) if s.live(*seq) => Some(row),
            _ => None,
        }
    }

    /// Every live row, as (index, row), in storage order.
    pub fn live_rows(&self) -> Vec<(u64, &[u8])> {
        let mut rows: Vec<(u64, &[u8])> = (0..self.capacity() as u64)
            .filter_map(|i| self.get(i).map(|r| (i, r)))
            .collect();
        rows.sort_by_key(|&(i, _)| i);
        rows
    }

    /// The live rows among the first `end` positions, in storage order.
    pub fn read_all_in_order(&self, end: Option<usize>) -> Vec<(u64, &[u8])> {
        let end = end.unwrap_or(usize::MAX) as u64;
        self.live_rows()
            .into_iter()
            .filter(|&(i, _)| i < end)
            .collect()
    }

    /// Rewrites positions `0..end` with rows of `batch`; `false` (and nothing written)
    /// if a position holds no live row or `batch` is too short.
    pub fn write_all(&mut self, batch: &Batch, end: Option<usize>) -> bool {
        let end = end.unwrap_or(batch.len());
        if end > batch.len()
            || end > self.capacity()
            || (0..end as u64).any(|i| self.get(i).is_none())
        {
            return false;
        }
        for i in 0..end {
            let row = self.row_of(batch, i);
            let (k, pos, lane) = self.locate(i as u64).expect("checked above");
            let s = &mut self.shards[k];
            if let Some((_, stored)) = &mut s.slots[(pos * s.width + lane) as usize] {
                *stored = row;
            }
        }
        true
    }

    /// Rewrites position `indices[r]` with row `r` of `batch`, in order; `false` (and
    /// nothing written) if the counts differ or a position holds no live row.
    pub fn write_at(&mut self, indices: &[u64], batch: &Batch) -> bool {
        if indices.len() != batch.len() || indices.iter().any(|&i| self.get(i).is_none()) {
            return false;
        }
        for (r, &i) in indices.iter().enumerate() {
            let row = self.row_of(batch, r);
            let (k, pos, lane) = self.locate(i).expect("checked above");
            let s = &mut self.shards[k];
            if let Some((_, stored)) = &mut s.slots[(pos * s.width + lane) as usize] {
                *stored = row;
            }
        }
        true
    }

    /// Drops every row.
    pub fn clear(&mut self) {
        for s in &mut self.shards {
            s.floor = s.cursor;
        }
    }
}
