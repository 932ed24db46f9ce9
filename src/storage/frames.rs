//! Frames stored once ([`crate::frames`]): the row a buffer with frame stacks and
//! `next_of` fields stores, the word each slot keeps about its episode, the side slots
//! of the next observations of episode ends, and the rebuild of a sampled row.
//!
//! ```text
//! logical row:  | obs [4, 84, 84] | action | reward | next_obs [4, 84, 84] | done |
//! stored row:   | obs frame [84, 84] | action | reward | done |   (one frame a step)
//! slot header:  | stamp | [raw] | frames word | [trajectory word] |
//! frames word:  | side slot (32) | unused (23) | terminal (1) | steps since start (8) |
//! side slot:    | tag: the row's slot sequence + 1 | the next value's stored part |
//! ```
//!
//! # Rebuilding a row
//!
//! A row at sequence `s` of its lane with `t` steps since its episode began reads
//! its stack's older frames from the rows `s - 1 ..= s - min(t, depth - 1)` of the same
//! lane, fills the places before the episode's first step, and takes its next value
//! from row `s + 1`, or from its side slot if it ends its episode. Each of those rows is
//! read as a sample reads one (`stamp.rs`): its stamp must say it is exactly the row of
//! that sequence number, published, and unchanged across the copy. Rows of a frames
//! buffer are never rewritten in place (no edits: `write_all` and max-value writers
//! are refused), so a row read whole at its exact lap is the row written there, and
//! the rebuilt row is made of the trajectory's own steps whatever the writers did in
//! between. A row whose frames were lapped, or whose next step is not written yet,
//! misses and is drawn again; it is never returned mixed.
//!
//! # Side slots
//!
//! A shard's side slots form a ring of their own: the `c`-th episode end of the shard
//! takes slot `c % slots` (`c` from the shard's side counter). Its tag is the row's
//! slot sequence (`seq * width + lane`) plus one, written like a stamp: taken while the
//! slot is rewritten, the tag once it is whole. An appender takes the slot only from
//! the tag of a whole one, so that two appenders that come to one slot write it in turn
//! (`take_side`). The appender holds the row's slot while it writes the side slot, so a
//! reader that sees the row published sees its side slot whole, until a later episode
//! end takes the slot over. Then the row, and every older row of the shard, leaves the
//! buffer: the appender raises the shard's floor past it, so that a buffer keeps its
//! last `capacity` steps or its last `slots` episode ends, whichever is fewer, and
//! never a row without its next value.
//!
//! Layer: algos (storage).

use std::sync::Arc;

use smallvec::SmallVec;

use super::atomic_copy;
use super::geometry::Geometry;
use super::lanes::Scalar;
use super::plan::{Dest, Place, Source};
use super::{Miss, Storage, Want};
use crate::dtype::DType;
use crate::frames::{Frames, StackFill};
use crate::key::{Key, KeyLike};
use crate::spec::Spec;
use crate::sync::{fence, Ordering};

const SINCE_MASK: u64 = 0xff;
const TERMINAL: u64 = 1 << 8;
const SIDE_SHIFT: u32 = 32;
/// The deepest stack: its steps since the episode began fit the word's 8 bits.
pub(crate) const MAX_DEPTH: usize = 255;
/// A side slot's tag while an appender writes it (no row's tag: tags are slot
/// sequences plus one, below 2^63).
pub(super) const SIDE_TAKEN: u64 = 1 << 63;
/// The side slot of a step whose appender got none ([`take_side`] gave up): its row
/// misses, as one whose side slot was taken over does.
const NO_SIDE: u64 = u32::MAX as u64;
/// How long an appender waits for another to finish writing the side slot both came
/// to (microseconds, unless it died inside: then the recovery frees it).
#[cfg(not(replaybuf_loom))]
const SIDE_PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// Takes side slot `tag` for an appender's write: marks it [`SIDE_TAKEN`] once no
/// other appender holds it, and returns what it held; `None` if another held it past
/// [`SIDE_PATIENCE`].
///
/// Two appenders of a shard come to one slot when `slots` episode ends fall between
/// their counts, and writing it at once they interleaved their bytes under the tag of
/// whichever stored its tag last, a next value of two rows that the reader took whole
/// (two collectors ending episodes into one slot: 26,608 of 32,768 bytes of a row's
/// `next_obs` the other's). Taken with `Acquire`, the slot's new bytes also come
/// after the last holder's.
fn take_side(tag: &crate::sync::AtomicU64) -> Option<u64> {
    #[cfg(not(replaybuf_loom))]
    let started = std::time::Instant::now();
    let mut backoff = crate::sync::Backoff::new();
    loop {
        let cur = tag.load(Ordering::Relaxed);
        if cur & SIDE_TAKEN == 0
            && tag
                .compare_exchange(cur, SIDE_TAKEN, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return Some(cur);
        }
        #[cfg(not(replaybuf_loom))]
        if started.elapsed() > SIDE_PATIENCE {
            return None;
        }
        backoff.snooze();
    }
}

/// What a slot's frames word says about its row's step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StepWord(pub(crate) u64);

impl StepWord {
    /// Steps since the episode's first (saturating at 255).
    pub(crate) fn since(self) -> u64 {
        self.0 & SINCE_MASK
    }

    /// Whether the step ends its episode: its next value is in a side slot.
    pub(crate) fn is_terminal(self) -> bool {
        self.0 & TERMINAL != 0
    }

    fn side(self) -> u64 {
        self.0 >> SIDE_SHIFT
    }

    /// The word of the step after `prev` in its trajectory (`None`: none seen).
    fn after(prev: Option<StepWord>) -> StepWord {
        match prev {
            Some(p) if !p.is_terminal() => StepWord((p.since() + 1).min(SINCE_MASK)),
            _ => StepWord(0),
        }
    }
}

/// A frame stack: logical field `field` of `depth` frames of `frame` bytes.
#[derive(Clone, Copy, Debug)]
struct Stack {
    field: usize,
    depth: usize,
    frame: usize,
    offset: usize,
}

/// A `next_of` field: logical field `field` is the next step's `of`.
#[derive(Clone, Copy, Debug)]
struct Next {
    field: usize,
    of: usize,
    /// Bytes of the value the stored part is not (a stacked `of`'s older frames).
    skip: usize,
    /// The stored part: its offset in a stored row and its length.
    offset: usize,
    len: usize,
    /// Where the part sits in a side slot's data.
    side_at: usize,
}

/// Every shard's side slots, after the lane blocks.
#[derive(Clone, Debug)]
struct Side {
    /// Per shard: its counter word, followed by its slots.
    base: Box<[usize]>,
    slots: u64,
    /// Words of one slot: the tag and the data.
    slot_words: usize,
}

impl Side {
    /// Words of one shard's block: its counter, then its slots, padded so that each
    /// shard's counter is on a line of its own.
    fn shard_words(&self) -> Option<usize> {
        let words = 1 + usize::try_from(self.slots)
            .ok()?
            .checked_mul(self.slot_words)?;
        Some(words.next_multiple_of(8))
    }

    /// The word of shard `k`'s side slot `pos`: its tag, with the data after it.
    fn slot_at(&self, k: usize, pos: u64) -> usize {
        self.base[k] + 1 + pos as usize * self.slot_words
    }
}

impl FrameLayout {
    /// The word of shard `k`'s side slot `pos`'s tag.
    #[cfg(test)]
    pub(super) fn side_tag_at(&self, k: usize, pos: u64) -> usize {
        self.side.slot_at(k, pos)
    }
}

/// A buffer's frames, resolved against its spec.
#[derive(Clone, Debug)]
pub(crate) struct FrameLayout {
    /// The logical fields' keys, for messages.
    keys: Box<[Key]>,
    /// The row a slot stores.
    pub(crate) stored: Arc<Spec>,
    /// Per logical field, its stored part.
    places: Box<[Place]>,
    stacks: SmallVec<[Stack; 2]>,
    nexts: SmallVec<[Next; 2]>,
    /// The deepest stack (1 without stacks): how many steps back a row reads.
    depth: u64,
    fill: StackFill,
    checked: bool,
    done: Scalar,
    truncated: Option<Scalar>,
    side: Side,
}

/// Why an extend's stacks or next values do not follow its trajectory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub(crate) key: Key,
    /// The row of the extend's data.
    pub(crate) row: usize,
    pub(crate) what: &'static str,
}

impl FrameLayout {
    /// The layout of `frames` over rows of `spec` in `geometry`; an error says which
    /// choice does not fit the spec.
    pub(crate) fn new(
        spec: &Spec,
        frames: &Frames,
        geometry: &Geometry,
    ) -> Result<FrameLayout, String> {
        let find = |key: &Key| {
            spec.field(key)
                .map(|(i, _)| i)
                .ok_or_else(|| format!("no field {key} in the spec"))
        };
        let mut depth_of = vec![0usize; spec.fields().len()];
        for (key, depth) in &frames.stacks {
            let i = find(key)?;
            let shape = spec.fields()[i].shape();
            if *depth == 0 || *depth > MAX_DEPTH {
                return Err(format!(
                    "the stack {key} must be 1 to {MAX_DEPTH} frames deep, not {depth}"
                ));
            }
            if shape.first() != Some(depth) {
                return Err(format!(
                    "the stack {key} of {depth} frames needs the shape [{depth}, ..], not \
                     {shape:?}"
                ));
            }
            if depth_of[i] != 0 {
                return Err(format!("{key} is declared a stack twice"));
            }
            if spec.fields()[i].bytes() == 0 {
                return Err(format!("the stack {key}'s frames hold no bytes"));
            }
            depth_of[i] = *depth;
        }
        let mut next_of = vec![None; spec.fields().len()];
        for (key, next_key) in &frames.next_of {
            let (of, next) = (find(key)?, find(next_key)?);
            let (a, b) = (&spec.fields()[of], &spec.fields()[next]);
            if of == next || a.dtype() != b.dtype() || a.shape() != b.shape() {
                return Err(format!(
                    "next_of({key}, {next_key}) needs two fields of one dtype and shape"
                ));
            }
            if next_of[next].is_some() || depth_of[next] != 0 {
                return Err(format!("{next_key} is declared stored once twice"));
            }
            next_of[next] = Some(of);
        }
        for (i, n) in next_of.iter().enumerate() {
            if n.is_some_and(|of| next_of[of].is_some()) {
                return Err(format!(
                    "{} is the next of a field that is itself a next_of field",
                    spec.fields()[i].key()
                ));
            }
        }
        let (done, truncated) = ends(spec, frames)?;
        for end in std::iter::once(done).chain(truncated) {
            if next_of[end.field].is_some() {
                return Err("the done and truncated fields must be stored".to_owned());
            }
        }

        // The stored row: stacks keep one frame, next_of fields nothing.
        let mut builder = Spec::builder();
        for (i, f) in spec.fields().iter().enumerate() {
            if next_of[i].is_some() {
                continue;
            }
            let shape = if depth_of[i] > 0 {
                &f.shape()[1..]
            } else {
                f.shape()
            };
            builder = builder.field(f.key().clone(), f.dtype(), shape);
        }
        let stored = builder.build().map_err(|e| e.to_string())?;
        let mut places = Vec::with_capacity(spec.fields().len());
        let mut stacks: SmallVec<[Stack; 2]> = SmallVec::new();
        let mut nexts: SmallVec<[Next; 2]> = SmallVec::new();
        let mut side_bytes = 0;
        for (i, f) in spec.fields().iter().enumerate() {
            let source = next_of[i].unwrap_or(i);
            let (_, s) = stored
                .field(spec.fields()[source].key())
                .expect("replaybuf internal error: a stored field went missing");
            let skip = f.bytes() - s.bytes();
            if let Some(of) = next_of[i] {
                places.push(Place {
                    offset: 0,
                    skip: 0,
                    len: 0,
                });
                nexts.push(Next {
                    field: i,
                    of,
                    skip,
                    offset: s.offset(),
                    len: s.bytes(),
                    side_at: side_bytes,
                });
                side_bytes += s.bytes().next_multiple_of(8);
                continue;
            }
            places.push(Place {
                offset: s.offset(),
                skip,
                len: s.bytes(),
            });
            if depth_of[i] > 0 {
                stacks.push(Stack {
                    field: i,
                    depth: depth_of[i],
                    frame: s.bytes(),
                    offset: s.offset(),
                });
            }
        }
        let depth = stacks.iter().map(|s| s.depth as u64).max().unwrap_or(1);
        // A row reads `depth - 1` steps back and waits for the step after it: a lane
        // holding no more steps than `depth` could never return a row.
        let fewest = (0..geometry.shards())
            .map(|k| geometry.ring(k).steps)
            .min()
            .unwrap_or(0);
        if fewest <= depth {
            return Err(format!(
                "each environment of a shard holds {fewest} steps, and rows with frames \
                 {depth} deep need at least {} (raise the capacity, or use fewer shards)",
                depth + 1
            ));
        }
        let slots_per_shard = (0..geometry.shards())
            .map(|k| {
                let ring = geometry.ring(k);
                ring.steps * ring.width
            })
            .max()
            .unwrap_or(1);
        let slots = match frames.terminal_slots {
            Some(0) => return Err("terminal_slots must be at least 1".to_owned()),
            Some(n) => (n as u64).min(slots_per_shard),
            None => (slots_per_shard / 128).max(64).min(slots_per_shard),
        };
        Ok(FrameLayout {
            keys: spec.fields().iter().map(|f| f.key().clone()).collect(),
            stored: Arc::new(stored),
            places: places.into_boxed_slice(),
            stacks,
            nexts,
            depth,
            fill: frames.fill,
            checked: !frames.unchecked,
            done,
            truncated,
            side: Side {
                base: Box::new([]),
                slots,
                slot_words: 1 + side_bytes / 8,
            },
        })
    }

    /// Places the side slots of `shards` shards from word `at` on; returns the words
    /// they take.
    pub(crate) fn place_side(&mut self, shards: usize, at: usize) -> Option<usize> {
        let per_shard = self.side.shard_words()?;
        self.side.base = (0..shards).map(|k| at + k * per_shard).collect();
        per_shard.checked_mul(shards)
    }

    /// Bytes of every shard's side slots together (their counters included).
    pub(crate) fn side_bytes(&self) -> usize {
        let per_shard = self
            .side
            .shard_words()
            .expect("replaybuf internal error: side slots that place_side refused");
        self.side.base.len() * per_shard * 8
    }

    /// Per logical field, its stored part.
    pub(crate) fn places(&self) -> &[Place] {
        &self.places
    }

    /// Whether data row `r` of `src` ends its episode.
    fn ends(&self, src: &Source<'_>, r: usize) -> bool {
        self.done.get(src, r) != 0 || self.truncated.is_some_and(|t| t.get(src, r) != 0)
    }

    /// The sampleable part of a lane window `lo..hi` of a ring of `steps` steps: its
    /// last step waits for the next one (or is it), and its oldest rows whose stacks
    /// reach past the ring's oldest step are lapped.
    pub(crate) fn trim(&self, lo: u64, hi: u64, steps: u64) -> (u64, u64) {
        let lo = match hi.checked_sub(steps) {
            Some(oldest) if oldest > 0 => lo.max(oldest + self.depth - 1),
            _ => lo,
        };
        let hi = hi.saturating_sub(1);
        (lo.min(hi), hi)
    }
}

/// The done and truncated fields, as named or found in `spec`.
fn ends(spec: &Spec, frames: &Frames) -> Result<(Scalar, Option<Scalar>), String> {
    let scalar = |key: &Key| -> Result<Scalar, String> {
        let (i, f) = spec
            .field(key)
            .ok_or_else(|| format!("no field {key} in the spec"))?;
        if f.elements() != 1
            || matches!(
                f.dtype(),
                DType::F16 | DType::BF16 | DType::F32 | DType::F64
            )
        {
            return Err(format!("{key} must be one bool or integer a row"));
        }
        Ok(Scalar {
            field: i,
            dtype: f.dtype(),
        })
    };
    let first = |names: &[&[&str]]| {
        names
            .iter()
            .find(|n| spec.field(**n).is_some())
            .map(|n| n.to_key())
    };
    let done = match &frames.done {
        Some(k) => scalar(k)?,
        None => scalar(
            &first(&[
                &["done"],
                &["next", "done"],
                &["terminated"],
                &["next", "terminated"],
            ])
            .ok_or(
                "frames need to know where episodes end: the spec has no done field \
                        (name it with Frames::ends)",
            )?,
        )?,
    };
    let truncated = match (&frames.done, &frames.truncated) {
        (_, Some(k)) => Some(scalar(k)?),
        (Some(_), None) => None,
        (None, None) => first(&[&["truncated"], &["next", "truncated"]])
            .map(|k| scalar(&k))
            .transpose()?,
    };
    Ok((done, truncated))
}

/// One lane's trajectory as an append walks it: the word of the last step seen.
type Last = Option<StepWord>;

impl Storage {
    fn frames_layout(&self) -> &FrameLayout {
        self.frames
            .as_deref()
            .expect("replaybuf internal error: frames of a buffer without them")
    }

    /// The frames word of the slot (a frames buffer): the header's word after the
    /// stamp and raw priority.
    #[inline]
    pub(super) fn frames_word(&self, slot: u64) -> usize {
        self.slot_word(slot) + 1 + usize::from(!self.trees.is_empty())
    }

    /// The frames word of row `seq` of a lane, if that row is in its slot now,
    /// published and read whole.
    fn step_word(&self, k: usize, seq: u64, lane: u64) -> Option<StepWord> {
        let mut word = 0;
        self.read_frames(k, seq, lane, |slot| {
            word = self.words()[self.frames_word(slot)].load(Ordering::Relaxed);
        })
        .ok()
        .map(|()| StepWord(word))
    }

    /// The last step of each lane of shard `k` before sequence `first`, as its
    /// trajectory's next append continues from.
    pub(super) fn frames_last(&self, k: usize, first: u64) -> SmallVec<[Last; 8]> {
        let ring = self.shards[k].ring();
        (0..ring.width)
            .map(|lane| {
                first
                    .checked_sub(1)
                    .and_then(|prev| self.step_word(k, prev, lane))
            })
            .collect()
    }

    /// The frames word of step `j`, lane `lane` of an append to shard `k`, after
    /// `last`; moves `last` on. A step written at `seq` (`None`: one an append longer
    /// than the ring skips) that ends its episode gets its side slot written (the
    /// caller holds the row's slot).
    pub(super) fn frames_step(
        &self,
        k: usize,
        seq: Option<u64>,
        j: u64,
        lane: u64,
        src: &Source<'_>,
        last: &mut Last,
    ) -> u64 {
        let frames = self.frames_layout();
        let r = src.order.row(j, lane);
        let mut word = StepWord::after(*last);
        if frames.ends(src, r) {
            word.0 |= TERMINAL;
            // Without `next_of` fields a side slot holds nothing, and taking one over
            // would take the older rows out for nothing (200 rows of short episodes
            // kept 128).
            if let Some(seq) = seq.filter(|_| !frames.nexts.is_empty()) {
                word.0 |= self.write_side(k, seq, lane, src, r) << SIDE_SHIFT;
            }
        }
        *last = Some(word);
        word.0
    }

    /// Writes data row `r`'s next values into the shard's next side slot for row
    /// `seq`, `lane`; returns the slot. A row whose side slot this takes over leaves
    /// the buffer with every older row of the shard (see the module docs).
    fn write_side(&self, k: usize, seq: u64, lane: u64, src: &Source<'_>, r: usize) -> u64 {
        let frames = self.frames_layout();
        let side = &frames.side;
        let shard = &self.shards[k];
        let width = shard.ring().width;
        let words = self.words();
        let count = words[side.base[k]].fetch_add(1, Ordering::Relaxed);
        let pos = count % side.slots;
        let at = side.slot_at(k, pos);
        let tag = &words[at];
        let Some(old) = take_side(tag) else {
            return NO_SIDE;
        };
        if let Some(old_seq) = old.checked_sub(1).map(|t| t / width) {
            shard.evict_below(old_seq + 1);
        }
        // SYNC POINT: the taken tag is visible before any byte of the new data (pairs
        // with the reader's fence in `read_side`).
        fence(Ordering::Release);
        for n in &frames.nexts {
            let value = src.cols[n.field].value(r);
            atomic_copy::store(words, (at + 1) * 8 + n.side_at, &value[n.skip..][..n.len]);
        }
        // SYNC POINT: publishes the data (pairs with the reader's Acquire load).
        tag.store(seq * width + lane + 1, Ordering::Release);
        pos
    }

    /// Frees the side slots of shard `k` that an appender took and never gave back
    /// ([`SIDE_TAKEN`]: it died inside `write_side`), for a recovery of the shard,
    /// whose appenders are all gone. Left taken, each made every later episode end
    /// that came to it wait out [`SIDE_PATIENCE`].
    pub(super) fn free_dead_sides(&self, k: usize) {
        let Some(frames) = self.frames() else {
            return;
        };
        for pos in 0..frames.side.slots {
            let tag = &self.words()[frames.side.slot_at(k, pos)];
            if tag.load(Ordering::Acquire) & SIDE_TAKEN != 0 {
                tag.store(0, Ordering::Release);
            }
        }
    }

    /// Copies the side slot `pos` of shard `k` for row `seq`, `lane` into the next
    /// fields of output row `k_out`; a miss if a later episode end took it over.
    fn read_side(
        &self,
        k: usize,
        seq: u64,
        lane: u64,
        pos: u64,
        dst: &mut Dest<'_>,
        k_out: usize,
    ) -> Result<(), Miss> {
        let frames = self.frames_layout();
        let side = &frames.side;
        let width = self.shards[k].ring().width;
        if pos >= side.slots {
            // `NO_SIDE`: its appender never got one.
            return Err(Miss::Gone);
        }
        let at = side.slot_at(k, pos);
        let tag = &self.words()[at];
        let want = seq * width + lane + 1;
        // SYNC POINT: pairs with the writer's Release store of the tag.
        if tag.load(Ordering::Acquire) != want {
            return Err(Miss::Gone);
        }
        for n in &frames.nexts {
            let out = &mut dst.col_mut(n.field).value_mut(k_out)[n.skip..][..n.len];
            atomic_copy::load(self.words(), (at + 1) * 8 + n.side_at, out);
        }
        // SYNC POINT: pairs with the writer's Release fence after zeroing the tag.
        fence(Ordering::Acquire);
        if tag.load(Ordering::Relaxed) == want {
            Ok(())
        } else {
            Err(Miss::Gone)
        }
    }

    /// Rebuilds output row `k_out` of a row read whole at `seq` of shard `k`'s lane
    /// (its stored parts are in place): its stacks' older frames and its next values
    /// (see the module docs).
    pub(super) fn rebuild(
        &self,
        k: usize,
        lane: u64,
        seq: u64,
        word: StepWord,
        dst: &mut Dest<'_>,
        k_out: usize,
    ) -> Result<(), Miss> {
        let frames = self.frames_layout();
        let shard = &self.shards[k];
        if seq < shard.gone_below() {
            return Err(Miss::Gone);
        }
        let back = word.since().min(frames.depth - 1);
        for d in 1..=back {
            self.read_frames(k, seq - d, lane, |slot| {
                let (words, row) = (self.words(), self.row_offset(slot));
                for s in &frames.stacks {
                    let Some(j) = (s.depth - 1).checked_sub(d as usize) else {
                        continue;
                    };
                    let out = &mut dst.col_mut(s.field).value_mut(k_out)[j * s.frame..][..s.frame];
                    atomic_copy::load(words, row + s.offset, out);
                }
            })?;
        }
        for s in &frames.stacks {
            // Places before the episode's first step.
            let real = (word.since() as usize).min(s.depth - 1);
            let first = s.depth - 1 - real;
            let value = dst.col_mut(s.field).value_mut(k_out);
            let (before, from) = value.split_at_mut(first * s.frame);
            match frames.fill {
                StackFill::Zeros => before.fill(0),
                StackFill::Repeat => {
                    for place in before.chunks_exact_mut(s.frame) {
                        place.copy_from_slice(&from[..s.frame]);
                    }
                }
            }
        }
        if frames.nexts.is_empty() {
            return Ok(());
        }
        if word.is_terminal() {
            self.read_side(k, seq, lane, word.side(), dst, k_out)?;
        } else {
            self.read_frames(k, seq + 1, lane, |slot| {
                let (words, row) = (self.words(), self.row_offset(slot));
                for n in &frames.nexts {
                    let out = &mut dst.col_mut(n.field).value_mut(k_out)[n.skip..][..n.len];
                    atomic_copy::load(words, row + n.offset, out);
                }
            })?;
        }
        // A stacked next value's older frames are its row's newer ones.
        for n in frames.nexts.iter().filter(|n| n.skip > 0) {
            let [of, next] = dst.two_cols_mut(n.of, n.field);
            next.value_mut(k_out)[..n.skip].copy_from_slice(&of.value_mut(k_out)[n.len..]);
        }
        Ok(())
    }

    /// Runs `copy` on the slot of row `seq` of a lane of shard `k`, if that slot holds
    /// exactly that row, published, and whole across the copy (`Storage::read_slot`).
    fn read_frames(
        &self,
        k: usize,
        seq: u64,
        lane: u64,
        copy: impl FnOnce(u64),
    ) -> Result<(), Miss> {
        self.read_slot(k, seq, lane, Want::Exact, copy).map(drop)
    }

    /// Checks an extend's rows against their trajectories before anything is written
    /// (a frames buffer that checks): each stack is its previous step's shifted by one
    /// frame (the fill at an episode's first step), and each next value's older frames
    /// are its own step's newer ones; the first step of each lane is checked against
    /// the lane's last stored step in shard `k`.
    pub(crate) fn check_frames(
        &self,
        k: usize,
        steps: u64,
        src: &Source<'_>,
    ) -> Result<(), Mismatch> {
        let frames = self.frames_layout();
        if !frames.checked {
            return Ok(());
        }
        let shard = &self.shards[k];
        let ring = *shard.ring();
        let next = shard.window().hi;
        let mut last = self.frames_last(k, next);
        let mut scratch = Vec::new();
        for j in 0..steps {
            for lane in 0..ring.width {
                let r = src.order.row(j, lane);
                let word = StepWord::after(last[lane as usize]);
                for s in &frames.stacks {
                    let col = &src.cols[s.field];
                    let value = col.value(r);
                    let real = (word.since() as usize).min(s.depth - 1);
                    let mismatch = |what| Mismatch {
                        key: frames.keys[s.field].clone(),
                        row: r,
                        what,
                    };
                    // The fill before the episode's first step.
                    for place in value[..(s.depth - 1 - real) * s.frame].chunks_exact(s.frame) {
                        let fill_ok = match frames.fill {
                            StackFill::Repeat => {
                                place == &value[(s.depth - 1 - real) * s.frame..][..s.frame]
                            }
                            StackFill::Zeros => place.iter().all(|&b| b == 0),
                        };
                        if !fill_ok {
                            return Err(mismatch(
                                "the places before its episode's first step are not the fill",
                            ));
                        }
                    }
                    if real == 0 {
                        continue;
                    }
                    // The real older frames: the previous step's stack, shifted.
                    let older = &value[(s.depth - 1 - real) * s.frame..(s.depth - 1) * s.frame];
                    let prev: &[u8] = if j > 0 {
                        &col.value(src.order.row(j - 1, lane))[(s.depth - real) * s.frame..]
                    } else {
                        // A lane holds more steps than a stack reaches back
                        // (`FrameLayout::new`), so these are stored unless another
                        // writer laps this lane meanwhile.
                        scratch.resize(real * s.frame, 0);
                        for (i, d) in (1..=real as u64).rev().enumerate() {
                            let out = &mut scratch[i * s.frame..][..s.frame];
                            let read = self.read_frames(k, next - d, lane, |slot| {
                                let row = self.row_offset(slot);
                                atomic_copy::load(self.words(), row + s.offset, out);
                            });
                            if read.is_err() {
                                return Err(mismatch(
                                    "its trajectory's previous steps are no longer stored",
                                ));
                            }
                        }
                        &scratch
                    };
                    if older != prev {
                        return Err(mismatch(
                            "its stack is not the previous step's shifted by one frame",
                        ));
                    }
                }
                let ends = frames.ends(src, r);
                for n in frames.nexts.iter().filter(|n| n.skip > 0) {
                    let value = src.cols[n.field].value(r);
                    let of = src.cols[n.of].value(r);
                    if value[..n.skip] != of[n.len..] {
                        return Err(Mismatch {
                            key: frames.keys[n.field].clone(),
                            row: r,
                            what: "its older frames are not its step's newer ones",
                        });
                    }
                }
                last[lane as usize] = Some(StepWord(word.0 | if ends { TERMINAL } else { 0 }));
            }
        }
        Ok(())
    }
}
