//! `from_checkpoint` and `restore`: a checkpoint written by `save` read back into a buffer.
//!
//! Every file is checked before its bytes count: its length against `meta.json`, its
//! xxh3 checksum once read, its size against the layout the configuration gives, and
//! the epochs file item by item against the storage's geometry. A load into a new
//! region (every heap buffer) reads each file once and drops the region if anything
//! is wrong; a load into a file-backed buffer checks every file first, then writes.
//! Either way a refused checkpoint leaves the buffer as it was.
//!
//! Layer: api.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::dump::{self, CompactFields, Meter};
use super::epochs;
use crate::backing::dir::{self, CheckpointMeta, FileMeta, Part};
use crate::backing::dir::{DirKind, DirMeta};
use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::builder::{Origin, ReplayBufferBuilder};
use crate::error::persist::{IoAt, PersistError, PersistKind};
use crate::hooks;
use crate::key::Key;
use crate::rate_limit::{Limiter, RateLimit};
use crate::sampler::slice::SliceWindow;
use crate::sampler::SamplerEngine;
use crate::state::State;
use crate::storage::layout::{Section, ShardWord};
use crate::storage::{atomic_copy, Draw, Storage};
use crate::sync::Ordering;

impl ReplayBuffer {
    /// A buffer rebuilt from a checkpoint that [`save`](Self::save) wrote (TorchRL's
    /// `restore` on a fresh buffer): same configuration and rate limit, on the heap,
    /// with every row, priority, trajectory table, open epoch and random-stream
    /// position of the buffer that was saved. Its `sample` calls then draw what the
    /// saved buffer's would have drawn next; its limit goes on from the saved one's
    /// counts of rows inserted and sampled (from a checkpoint that kept none, it
    /// counts the rows loaded as inserted, none sampled).
    ///
    /// A damaged, truncated or unreadable checkpoint is refused with an error naming
    /// the file and the problem.
    pub fn from_checkpoint(dir: impl AsRef<Path>) -> Result<ReplayBuffer, PersistError> {
        load_built(dir.as_ref(), |b, limit| match limit {
            Some(limit) => b.rate_limit(limit),
            None => b,
        })
    }

    /// Loads a checkpoint into this buffer (TorchRL's `loads`): its rows, sampler
    /// state and random streams replace this buffer's, and its seed becomes this
    /// buffer's; load hooks run on the rows. The checkpoint must be of this buffer's
    /// layout (spec, capacity, shards, ndim, sampler, priority key), and no other
    /// handle of this buffer may exist (writers, learners, clones), nor, for a shared
    /// buffer, another live process attached to it: they would see their rows
    /// replaced under them.
    ///
    /// On any error the buffer is left as it was, but for one: a file-backed or shared
    /// buffer's region is its file or its memory, and the checkpoint's rows go straight
    /// into it (every file checked first), so a load hook that fails on them, or a
    /// compact or epochs part that fails to decode, leaves the region holding the
    /// checkpoint's rows, some hooked and some not. Such a buffer's hooks should not
    /// fail on rows its checkpoints hold. A file-backed buffer's directory then records
    /// the checkpoint's seed; if that write fails, the error comes after the buffer
    /// holds the checkpoint.
    pub fn restore(&mut self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        let dir = dir.as_ref();
        // Held until every file is read: a save meanwhile deleted the generation a
        // file-backed buffer's region was half written from.
        let _reading = crate::backing::dir::lock_shared(dir)?;
        let (meta, checkpoint) = read_meta(dir)?;
        let old: Arc<State> = Arc::clone(&self.state());
        if let Some(what) = old.config.layout_difference(&meta.config) {
            return Err(PersistError::new(dir, PersistKind::Mismatch(what)));
        }
        if Arc::get_mut(&mut self.cell).is_none() {
            return Err(PersistError::new(
                dir,
                PersistKind::Busy(
                    "this buffer has other handles (writers, learners or clones); load \
                     into a buffer no other handle uses, or build one with \
                     ReplayBuffer::from_checkpoint",
                ),
            ));
        }
        // Looked for again as the region is marked (`read_into`): one that attaches
        // while the files are checked is refused then.
        if !old.core.storage.other_members().is_empty() {
            return Err(PersistError::new(dir, PersistKind::Busy(ATTACHED)));
        }
        // This buffer's own configuration, with the checkpoint's seed: the layouts agree.
        let refused = |why: String| {
            PersistError::new(
                dir,
                PersistKind::Corrupt(format!("its configuration: {why}")),
            )
        };
        let builder = ReplayBufferBuilder::from_config(&old.config)
            .map_err(|e| refused(format!("{e:?}")))?
            .seed(meta.config.seed);
        // A file-backed or shared buffer's region is the file or the shared memory: a
        // state over it, and every file checked before anything is written.
        let region = old.core.storage.is_file_backed() || old.core.storage.is_shared();
        let mut new = if region {
            let checked = builder.check().map_err(|e| refused(e.to_string()))?;
            let config = builder.config(meta.config.seed);
            builder.assemble(
                checked,
                config,
                old.core.storage.view(),
                meta.config.seed,
                Origin::Reused,
            )
        } else {
            builder.build_inner().map_err(|e| refused(e.to_string()))?
        };
        // The hooks belong to this buffer: the rows read pass through them (a
        // file-backed or shared buffer's restore skipped them, set after the read).
        new.hooks = Arc::clone(&old.hooks);
        read_into(&new, dir, &checkpoint, region)?;
        new.transforms = Arc::clone(&old.transforms);
        new.memmap = old.memmap.clone();
        new.policy.reload(&new.core);
        let rows = new.core.storage.len();
        #[cfg(not(replaybuf_loom))]
        let record = new.memmap.clone().map(|dir| (dir, new.config.clone()));
        self.cell.publish(new);
        // The limit goes on from the checkpoint's counts; from one that kept none,
        // the rows loaded count as inserted: a limit's samples wait for rows the
        // buffer holds, not for ones it already has (they waited for good).
        if let Some(limiter) = &self.limiter {
            restart_limit(limiter, &checkpoint, rows);
        }
        // A file-backed buffer's directory records the checkpoint's seed, which its
        // region's stream counters go on from: reopened, it took the old one and
        // sampled other rows than the checkpoint's buffer.
        #[cfg(not(replaybuf_loom))]
        if let Some((store, config)) = record {
            DirMeta::new(DirKind::Memmap, config).write(&store)?;
        }
        Ok(())
    }
}

/// A buffer of a checkpoint's configuration, changed by `tweak` (given the rate limit
/// the checkpoint records, if any), loaded with the checkpoint. A limit's counts start
/// at the rows loaded, as [`ReplayBuffer::restore`]'s do.
pub(crate) fn load_built(
    dir: &Path,
    tweak: impl FnOnce(ReplayBufferBuilder, Option<RateLimit>) -> ReplayBufferBuilder,
) -> Result<ReplayBuffer, PersistError> {
    // Held until every file is read: a save meanwhile deleted them.
    let _reading = crate::backing::dir::lock_shared(dir)?;
    let (meta, checkpoint) = read_meta(dir)?;
    let limit = match &checkpoint.rate_limit {
        Some(recorded) => Some(RateLimit::recorded(recorded).map_err(|e| {
            PersistError::new(
                dir,
                PersistKind::Corrupt(format!("meta.json's rate limit: {e}")),
            )
        })?),
        None => None,
    };
    let rb = build(dir, &meta, |b| tweak(b, limit))?;
    let inner = rb.state();
    read_into(&inner, dir, &checkpoint, false)?;
    inner.policy.reload(&inner.core);
    let rows = inner.core.storage.len();
    drop(inner);
    if let Some(limiter) = &rb.limiter {
        restart_limit(limiter, &checkpoint, rows);
    }
    Ok(rb)
}

/// Puts a loaded buffer's limit at the checkpoint's counts (its learners held to the
/// ratio they were at: counted afresh, the rows loaded allowed a burst of
/// `samples_per_insert` samples each), or, from a checkpoint without them, at `rows`
/// inserted and none sampled.
fn restart_limit(limiter: &Limiter, checkpoint: &CheckpointMeta, rows: u64) {
    match checkpoint.rate_counts {
        Some((inserts, samples)) => limiter.restart_at(inserts, samples),
        None => limiter.restart(rows),
    }
}

/// A checkpoint directory's meta.
fn read_meta(dir: &Path) -> Result<(DirMeta, CheckpointMeta), PersistError> {
    let meta = DirMeta::read(dir)?;
    if meta.kind != DirKind::Checkpoint {
        return Err(PersistError::new(
            dir,
            PersistKind::Unsupported(
                "this directory holds a file-backed storage; open it with \
                 `ReplayBuffer::builder(..).memmap(dir).existsok(true)` or \
                 `ReplayBuffer::open_dataset`",
            ),
        ));
    }
    let checkpoint = meta.checkpoint.clone().ok_or_else(|| {
        PersistError::new(
            dir,
            PersistKind::Corrupt("meta.json of a checkpoint lists no files".to_owned()),
        )
    })?;
    Ok((meta, checkpoint))
}

/// A new heap buffer of the checkpoint's configuration, changed by `tweak`.
fn build(
    dir: &Path,
    meta: &DirMeta,
    tweak: impl FnOnce(ReplayBufferBuilder) -> ReplayBufferBuilder,
) -> Result<ReplayBuffer, PersistError> {
    let refused = |why: String| {
        PersistError::new(
            dir,
            PersistKind::Corrupt(format!("its configuration: {why}")),
        )
    };
    tweak(ReplayBufferBuilder::from_config(&meta.config).map_err(|e| refused(format!("{e:?}")))?)
        .build()
        .map_err(|e| refused(e.to_string()))
}

/// One checkpoint file, opened and checked against its record.
struct PartFile {
    path: std::path::PathBuf,
    file: File,
    hasher: Xxh3,
    record: FileMeta,
}

impl PartFile {
    fn open(
        dir: &Path,
        record: &FileMeta,
        expected: Option<u64>,
    ) -> Result<PartFile, PersistError> {
        if !dir::is_plain_name(&record.name) {
            return Err(PersistError::new(
                dir,
                PersistKind::Corrupt(format!(
                    "meta.json names a file outside it: {:?}",
                    record.name
                )),
            ));
        }
        let path = dir.join(&record.name);
        if let Some(expected) = expected.filter(|&e| e != record.bytes) {
            return Err(PersistError::new(
                &path,
                PersistKind::Corrupt(format!(
                    "meta.json says {} bytes, but this buffer's layout needs {expected}",
                    record.bytes
                )),
            ));
        }
        let file = match dir::open_file(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PersistError::new(&path, PersistKind::Missing))
            }
            Err(e) => return Err(PersistError::io(&path, e)),
        };
        let found = file.metadata().at(&path)?.len();
        if found != record.bytes {
            return Err(PersistError::new(
                &path,
                PersistKind::Length {
                    expected: record.bytes,
                    found,
                },
            ));
        }
        Ok(PartFile {
            path,
            file,
            hasher: Xxh3::new(),
            record: record.clone(),
        })
    }

    /// Reads the file a chunk at a time, handing each to `f` with its offset.
    fn stream(
        mut self,
        meter: &mut Meter,
        buf: &mut Vec<u8>,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), PersistError>,
    ) -> Result<(), PersistError> {
        let mut at = 0;
        while at < self.record.bytes {
            let n = (self.record.bytes - at).min(dump::CHUNK_BYTES as u64) as usize;
            buf.resize(n, 0);
            self.file.read_exact(buf).at(&self.path)?;
            self.hasher.update(buf);
            f(at, buf)?;
            meter.add(n as u64);
            at += n as u64;
        }
        let found = self.hasher.digest();
        if found != self.record.xxh3 {
            return Err(PersistError::new(
                &self.path,
                PersistKind::Checksum {
                    expected: self.record.xxh3,
                    found,
                },
            ));
        }
        Ok(())
    }

    /// The whole file, checked.
    fn read_all(self, meter: &mut Meter) -> Result<Vec<u8>, PersistError> {
        let mut all = Vec::with_capacity(self.record.bytes as usize);
        let mut buf = Vec::new();
        self.stream(meter, &mut buf, |_, chunk| {
            all.extend_from_slice(chunk);
            Ok(())
        })?;
        Ok(all)
    }
}

/// The record of `part`, if the checkpoint has one.
fn record(checkpoint: &CheckpointMeta, part: Part) -> Option<&FileMeta> {
    checkpoint.files.iter().find(|f| f.part == part)
}

/// Reads a checkpoint into `inner`'s storage and sampler. With `verify_first`, every
/// file is read and checked once before any byte is written.
fn read_into(
    inner: &State,
    dir: &Path,
    checkpoint: &CheckpointMeta,
    verify_first: bool,
) -> Result<(), PersistError> {
    let storage = &inner.core.storage;
    let layout = storage.layout();
    // Sizes from meta.json, checked against the layout below: they must not overflow
    // before they are.
    let total = checkpoint
        .files
        .iter()
        .fold(0u64, |sum, f| sum.saturating_add(f.bytes));
    let mut meter = Meter::new(None, total.saturating_mul(1 + u64::from(verify_first)));
    let missing = |part: Part| {
        PersistError::new(
            dir,
            PersistKind::Corrupt(format!("meta.json lists no {} file", part.name())),
        )
    };
    let compact = match &checkpoint.compact {
        None => None,
        // No save writes it (`dump`), and a frames slot is not a row to split.
        Some(_) if storage.frames().is_some() => {
            return Err(PersistError::new(
                dir,
                PersistKind::Corrupt("a compact checkpoint of a buffer with frames".to_owned()),
            ))
        }
        Some((obs, next)) => {
            let key =
                |k: &Vec<String>| Key::from(&k.iter().map(String::as_str).collect::<Vec<_>>()[..]);
            Some(
                CompactFields::of(storage.spec(), &key(obs), &key(next))
                    .map_err(|why| PersistError::new(dir, PersistKind::Corrupt(why)))?,
            )
        }
    };
    let slots_bytes = |c: Option<CompactFields>| {
        let per = storage.slot_bytes() - c.map_or(0, |c| c.bytes);
        per as u64 * storage.geometry().capacity()
    };
    // What every part must hold, by the layout.
    let mut plan: Vec<(Part, Option<u64>)> = vec![
        (
            Part::Control,
            Some(layout.section(Section::Control).len() as u64 * 8),
        ),
        (Part::Slots, Some(slots_bytes(compact))),
    ];
    for (part, section) in [(Part::Trees, Section::Trees), (Part::Lanes, Section::Lanes)] {
        let words = layout.section(section).len() as u64;
        if words > 0 {
            plan.push((part, Some(words * 8)));
        }
    }
    if compact.is_some() {
        plan.push((Part::Omit, Some(storage.geometry().capacity().div_ceil(8))));
        plan.push((Part::Kept, None));
    }
    if dump::encode_epochs(&inner.core.sampler).is_some()
        && record(checkpoint, Part::Epochs).is_some()
    {
        plan.push((Part::Epochs, None));
    }
    if let Some(extra) = checkpoint
        .files
        .iter()
        .find(|f| !plan.iter().any(|(p, _)| *p == f.part))
    {
        return Err(PersistError::new(
            dir,
            PersistKind::Corrupt(format!(
                "meta.json lists a {} file that a buffer of this layout has no use for",
                extra.part.name()
            )),
        ));
    }
    let mut buf = Vec::with_capacity(dump::CHUNK_BYTES);
    if verify_first {
        for &(part, expected) in &plan {
            let rec = record(checkpoint, part).ok_or_else(|| missing(part))?;
            PartFile::open(dir, rec, expected)?.stream(&mut meter, &mut buf, |_, _| Ok(()))?;
        }
    }
    // A region (file-backed or shared: `verify_first`) is the buffer: marked while
    // the checkpoint goes into it, rows and stamps in any order, so that a process
    // killed meanwhile leaves a region refused when opened again, not one of torn
    // rows under published stamps. The mark goes once everything is in.
    if verify_first && storage.begin_restore().is_err() {
        return Err(PersistError::new(dir, PersistKind::Busy(ATTACHED)));
    }
    let mut omit = Vec::new();
    let mut kept = Vec::new();
    let mut epochs_file = None;
    for &(part, expected) in &plan {
        let rec = record(checkpoint, part).ok_or_else(|| missing(part))?;
        let src = PartFile::open(dir, rec, expected)?;
        let region_at = |s: Section| layout.section(s).start * 8;
        match part {
            Part::Control | Part::Trees | Part::Lanes => {
                let section = match part {
                    Part::Control => Section::Control,
                    Part::Trees => Section::Trees,
                    _ => Section::Lanes,
                };
                let base = region_at(section);
                // A shared region's leases and editor words say which live process
                // writes or edits each shard now: the saver's, copied over them,
                // freed this process's shard to another writer, or, their saver
                // dead, to its next recovery.
                let holders =
                    (part == Part::Control && storage.is_shared()).then(|| shard_holders(storage));
                src.stream(&mut meter, &mut buf, |at, chunk| {
                    atomic_copy::store(storage.words(), base + at as usize, chunk);
                    Ok(())
                })?;
                if let Some(holders) = holders {
                    for (shard, words) in storage.shards().iter().zip(holders) {
                        for (w, value) in HOLDER_WORDS.into_iter().zip(words) {
                            shard.word(w).store(value, Ordering::Release);
                        }
                    }
                }
            }
            Part::Slots => match compact {
                None => {
                    let base = region_at(Section::Slots);
                    src.stream(&mut meter, &mut buf, |at, chunk| {
                        atomic_copy::store(storage.words(), base + at as usize, chunk);
                        Ok(())
                    })?;
                }
                Some(fields) => read_stripped(storage, fields, src, &mut meter, &mut buf)?,
            },
            Part::Omit => omit = src.read_all(&mut meter)?,
            Part::Kept => kept = src.read_all(&mut meter)?,
            Part::Epochs => epochs_file = Some(src.read_all(&mut meter)?),
        }
    }
    if let Some(fields) = compact {
        fill_next(storage, fields, &omit, &kept)
            .map_err(|why| PersistError::new(dir, PersistKind::Corrupt(why)))?;
    }
    if let Some(bytes) = epochs_file {
        restore_epochs(&inner.core.sampler, storage, &bytes).map_err(|why| {
            PersistError::new(
                dir.join(Part::Epochs.file(checkpoint.generation)),
                PersistKind::Corrupt(why),
            )
        })?;
    }
    let load_hooks = inner.hooks.load();
    if !load_hooks.is_empty() {
        run_load_hooks(storage, &load_hooks)
            .map_err(|why| PersistError::new(dir, PersistKind::Hook(why)))?;
    }
    // What a reopened region is checked for (`ReplayBufferBuilder::build`): the
    // files' checksums hold for words whose values no save writes (an alpha of NaN:
    // the recovery below never returned; a cursor moved back over written rows: the
    // next append waited for good).
    let damage = inner
        .core
        .sampler
        .damage()
        .map(|why| format!("its sampler's state: {why}"))
        .or_else(|| storage.unclaimed_row());
    if let Some(why) = damage {
        return Err(PersistError::new(dir, PersistKind::Corrupt(why)));
    }
    inner.core.sampler.recover(storage);
    // Left set by every `?` above: a region whose copy failed is as one cut short.
    if verify_first {
        storage.set_restoring(false);
    }
    Ok(())
}

/// Why a shared buffer's restore is refused while another member is attached.
const ATTACHED: &str = "other processes (or other buffers of this one) are attached to this \
                        shared buffer; a load would replace their rows under them";

/// A shard's words that name the process holding it, not the rows.
const HOLDER_WORDS: [ShardWord; 2] = [ShardWord::Lease, ShardWord::Editor];

/// Every shard's [`HOLDER_WORDS`], as they are.
fn shard_holders(storage: &Storage) -> Vec<[u64; 2]> {
    storage
        .shards()
        .iter()
        .map(|s| HOLDER_WORDS.map(|w| s.word(w).load(Ordering::Acquire)))
        .collect()
}

/// Slots without the next-observation field, spread back into their slots.
fn read_stripped(
    storage: &Storage,
    fields: CompactFields,
    src: PartFile,
    meter: &mut Meter,
    buf: &mut Vec<u8>,
) -> Result<(), PersistError> {
    let slot_bytes = storage.slot_bytes();
    let stripped = slot_bytes - fields.bytes;
    let next_at = storage.header_bytes() + fields.next;
    let mut partial: Vec<u8> = Vec::with_capacity(stripped);
    let mut slot = 0u64;
    src.stream(meter, buf, |_, chunk| {
        let mut rest = chunk;
        while !rest.is_empty() {
            let take = (stripped - partial.len()).min(rest.len());
            partial.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if partial.len() == stripped {
                let at = storage.slot_offset(slot);
                atomic_copy::store(storage.words(), at, &partial[..next_at]);
                atomic_copy::store(
                    storage.words(),
                    at + next_at + fields.bytes,
                    &partial[next_at..],
                );
                partial.clear();
                slot += 1;
            }
        }
        Ok(())
    })
}

/// Puts back every slot's next observation: the next row's observation where the
/// bitmap says it was left out, the kept values elsewhere.
fn fill_next(
    storage: &Storage,
    fields: CompactFields,
    omit: &[u8],
    kept: &[u8],
) -> Result<(), String> {
    let mut kept = kept.chunks_exact(fields.bytes);
    let mut value = vec![0u8; fields.bytes];
    for (k, shard) in storage.shards().iter().enumerate() {
        let ring = *shard.ring();
        for pos in 0..ring.steps {
            for lane in 0..ring.width {
                let slot = ring.slot(pos, lane);
                let at = storage.row_offset_of(slot) + fields.next;
                if omit[slot as usize / 8] & (1 << (slot % 8)) != 0 {
                    let next = dump::successor(storage, k, pos, lane).ok_or_else(|| {
                        format!(
                            "slot {slot}'s next observation was left out, but no row follows it"
                        )
                    })?;
                    atomic_copy::load(
                        storage.words(),
                        storage.row_offset_of(next) + fields.obs,
                        &mut value,
                    );
                    atomic_copy::store(storage.words(), at, &value);
                } else {
                    let v = kept
                        .next()
                        .ok_or("the kept values run out before the slots")?;
                    atomic_copy::store(storage.words(), at, v);
                }
            }
        }
    }
    if kept.next().is_some() || !kept.remainder().is_empty() {
        return Err("more kept values than slots that keep one".to_owned());
    }
    Ok(())
}

/// Puts the checkpoint's epochs into the sampler.
fn restore_epochs(engine: &SamplerEngine, storage: &Storage, bytes: &[u8]) -> Result<(), String> {
    let geometry = storage.geometry();
    match engine {
        SamplerEngine::WithoutReplacement(e) => e.restore(epochs::decode::<Draw>(bytes, geometry)?),
        SamplerEngine::Slice(crate::sampler::slice::SliceState {
            epochs: Some(e), ..
        }) => e.restore(epochs::decode::<SliceWindow>(bytes, geometry)?),
        _ => {}
    }
    Ok(())
}

/// Runs the load hooks over every written slot's row, a chunk at a time, and stores
/// the rows they leave.
fn run_load_hooks(storage: &Storage, load_hooks: &[hooks::Hook]) -> Result<(), String> {
    let capacity = storage.geometry().capacity();
    let chunk = (dump::CHUNK_BYTES / storage.slot_bytes()).max(1) as u64;
    let mut batch = Batch::zeros(storage.spec().clone(), [0]);
    let mut rows = Vec::new();
    let mut first = 0;
    while first < capacity {
        let n = chunk.min(capacity - first);
        rows.clear();
        rows.extend((first..first + n).filter(|&s| storage.stamp_at(s).is_written()));
        dump::with_rows(storage, &rows, &mut batch, |b| hooks::run(load_hooks, b))?;
        for (k, &slot) in rows.iter().enumerate() {
            let at = storage.row_offset_of(slot);
            // The stored form, as `with_rows` read them (frames: one frame a stack).
            for (f, col) in storage.row_spec().fields().iter().zip(batch.columns()) {
                atomic_copy::store(
                    storage.words(),
                    at + f.offset(),
                    &col.as_bytes()[k * f.bytes()..][..f.bytes()],
                );
            }
        }
        first += n;
    }
    Ok(())
}
