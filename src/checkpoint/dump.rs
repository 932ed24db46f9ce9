//! `save`: a buffer's whole state written to a directory, crash-safely.
//!
//! # The checkpoint
//!
//! ```text
//! dir/meta.json            format, version, configuration, layout hash, and for
//!                          each file below its size and xxh3 checksum
//! dir/control.G.bin        the shard blocks and globals: cursors, floors, the
//!                          prioritized sampler's alpha/beta/max, the random-stream
//!                          counters
//! dir/slots.G.bin          every slot: stamp, header words, row
//! dir/trees.G.bin          the sum/min/max trees (prioritized samplers)
//! dir/lanes.G.bin          the trajectory tables (slice samplers)
//! dir/epochs.G.bin         the open without-replacement epoch (`epochs.rs`)
//! ```
//!
//! `G` is the checkpoint's generation. A dump writes generation `G + 1` beside the
//! files of `G`, flushes them, and only then replaces `meta.json` (temporary name,
//! flush, rename, flush the directory). A process killed at any point therefore
//! leaves a `meta.json` that names complete files: the old checkpoint until the
//! rename, the new one after. The old generation's files are removed last.
//!
//! In the compact format (TorchRL's `TED2Flat`), a row's next observation is left out
//! when it equals the observation of the row after it in the same lane, byte for
//! byte: `slots.G.bin` holds rows without that field, `omit.G.bin` one bit per slot
//! (set: left out), and `kept.G.bin` the values that were kept.
//!
//! While the region is copied the storage is frozen (`storage/freeze.rs`): collectors
//! and priority updates wait, learners go on sampling. The files are flushed after the
//! thaw.
//!
//! Layer: api.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use super::epochs;
use crate::backing::dir::{self, CheckpointMeta, DirKind, DirMeta, FileMeta, Part};
use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::error::persist::{IoAt, PersistError, PersistKind};
use crate::hooks;
use crate::key::Key;
use crate::rate_limit::Limiter;
use crate::sampler::SamplerEngine;
use crate::state::State;
use crate::storage::layout::Section;
use crate::storage::plan::{Dest, DstCol};
use crate::storage::stamp::Stamp;
use crate::storage::{atomic_copy, Storage};

/// Bytes moved per read or write call.
pub(crate) const CHUNK_BYTES: usize = 8 << 20;
/// A caller's report of a dump's progress: called with the bytes written so far and
/// the bytes in all, after each chunk; the last report's two are equal (a compact
/// dump's total, counted before its slots shrink, comes down to what was written).
/// The library draws nothing itself; the caller decides what progress looks like (a
/// bar, a log line, nothing). It runs while the buffer's writers are held still: it
/// must not write to the buffer being saved (an `extend`, a `clear`, a priority
/// update, another save of it), which would wait for this save to end; such a write
/// panics, saying so.
pub type ProgressFn = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// How a checkpoint is written (see [`ReplayBuffer::save_with`]).
#[derive(Clone, Default)]
pub struct SaveOptions {
    pub(crate) compact: Option<(Key, Key)>,
    pub(crate) progress: Option<ProgressFn>,
}

impl std::fmt::Debug for SaveOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveOptions")
            .field("compact", &self.compact)
            .field("progress", &self.progress.as_ref().map(|_| "Fn"))
            .finish()
    }
}

impl SaveOptions {
    /// The default: every row as stored, no progress reports.
    pub fn new() -> SaveOptions {
        SaveOptions::default()
    }

    /// The compact trajectory format (TorchRL's `TED2Flat` / `Flat2TED`): a row's
    /// `next_obs` is stored only where it differs from the following step's `obs` in
    /// the same lane (an episode's end, a lapped ring). Loading puts it back. The two
    /// fields must have one dtype and shape.
    pub fn compact(mut self, obs: impl Into<Key>, next_obs: impl Into<Key>) -> SaveOptions {
        self.compact = Some((obs.into(), next_obs.into()));
        self
    }

    /// Reports progress to `report(bytes_done, bytes_total)` after each chunk written.
    pub fn progress(mut self, report: impl Fn(u64, u64) + Send + Sync + 'static) -> SaveOptions {
        self.progress = Some(Arc::new(report));
        self
    }
}

/// Counts the bytes a dump or load has moved, for the caller's progress report.
pub(crate) struct Meter {
    report: Option<ProgressFn>,
    total: u64,
    done: u64,
}

impl Meter {
    pub(crate) fn new(report: Option<ProgressFn>, total: u64) -> Meter {
        Meter {
            report,
            total,
            done: 0,
        }
    }

    pub(crate) fn add(&mut self, bytes: u64) {
        self.done += bytes;
        if let Some(report) = &self.report {
            report(self.done, self.total);
        }
    }

    /// `bytes` more to move than the total said.
    pub(crate) fn expect(&mut self, bytes: u64) {
        self.total += bytes;
    }

    /// Everything is moved: a total that was more than the bytes moved (a compact
    /// dump's slots) comes down to them, in one last report, so that the last report
    /// is always `(total, total)`.
    pub(crate) fn finish(&mut self) {
        if self.done != self.total {
            self.total = self.done;
            if let Some(report) = &self.report {
                report(self.done, self.total);
            }
        }
    }
}

/// A checkpoint file being written: its bytes are hashed as they go.
///
/// A sink dropped before it is closed (its part failed: a hook's error, a failed
/// write) removes its file: the dump's cleanup lists closed files only.
struct Sink {
    part: Part,
    name: String,
    path: PathBuf,
    /// `None` once closed.
    file: Option<File>,
    hasher: Xxh3,
    bytes: u64,
}

impl Drop for Sink {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

impl Sink {
    fn create(dir: &Path, part: Part, g: u64) -> Result<Sink, PersistError> {
        let name = part.file(g);
        let path = dir.join(&name);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .at(&path)?;
        Ok(Sink {
            part,
            name,
            path,
            file: Some(file),
            hasher: Xxh3::new(),
            bytes: 0,
        })
    }

    fn put(&mut self, buf: &[u8], meter: &mut Meter) -> Result<(), PersistError> {
        let file = self.file.as_mut().expect("a sink is written until closed");
        file.write_all(buf).at(&self.path)?;
        self.hasher.update(buf);
        self.bytes += buf.len() as u64;
        meter.add(buf.len() as u64);
        Ok(())
    }

    /// The file's record, and the file to flush.
    fn close(mut self) -> (FileMeta, File, PathBuf) {
        let meta = FileMeta {
            part: self.part,
            name: std::mem::take(&mut self.name),
            bytes: self.bytes,
            xxh3: self.hasher.digest(),
        };
        let file = self.file.take().expect("a sink is closed once");
        (meta, file, std::mem::take(&mut self.path))
    }
}

/// The files of a dump in progress, removed if it fails.
struct WrittenFiles {
    sinks: Vec<(FileMeta, File, PathBuf)>,
}

impl WrittenFiles {
    fn discard(self) {
        for (_, _, path) in self.sinks {
            let _ = fs::remove_file(path);
        }
    }
}

/// Copies words `range` of the region into `sink`, a chunk at a time.
fn copy_words(
    storage: &Storage,
    range: std::ops::Range<usize>,
    sink: &mut Sink,
    buf: &mut Vec<u8>,
    meter: &mut Meter,
) -> Result<(), PersistError> {
    let (mut at, end) = (range.start * 8, range.end * 8);
    while at < end {
        let n = (end - at).min(CHUNK_BYTES);
        buf.resize(n, 0);
        atomic_copy::load(storage.words(), at, buf);
        sink.put(buf, meter)?;
        at += n;
    }
    Ok(())
}

impl ReplayBuffer {
    /// Saves the buffer's whole state under `dir` (TorchRL's `dumps`): rows, stamps
    /// and cursors, the sampler's trees, trajectory tables and open epoch, the random
    /// streams' counters, and the configuration, each file with its checksum. Loading
    /// it ([`ReplayBuffer::from_checkpoint`], [`ReplayBuffer::restore`]) gives a buffer that samples
    /// what this one would sample next.
    ///
    /// Crash-safe: a process killed during a dump leaves the previous checkpoint in
    /// `dir` loadable (see the format in the crate's `checkpoint` module docs). Safe
    /// while other threads use the buffer: collectors and priority updates wait while
    /// the region is copied, learners keep sampling.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        self.save_with(dir, &SaveOptions::new())
    }

    /// [`save`](Self::save) with options: the compact trajectory format, progress.
    pub fn save_with(
        &self,
        dir: impl AsRef<Path>,
        options: &SaveOptions,
    ) -> Result<(), PersistError> {
        // A dump that froze a storage a swap has just replaced dumps the new one.
        while !dump(
            &self.state(),
            dir.as_ref(),
            options,
            self.limiter.as_deref(),
        )? {}
        Ok(())
    }

    /// Adds a save hook (TorchRL's `register_save_hook`): every later dump passes the
    /// rows it writes through `hook`, a chunk of stored rows at a time in storage
    /// order, and stores what the hooks leave; the buffer itself is not changed. Hooks
    /// run in the order they were added; one that fails fails the dump. A frames
    /// buffer's hooks get its rows as stored (one frame of each stack, no `next_of`
    /// fields). A hook runs while the buffer's writers are held still: it must not
    /// write to the buffer being saved (an `extend`, a `clear`, a priority update,
    /// another save of it), which would wait for this save to end; such a write
    /// panics, saying so.
    pub fn register_save_hook(
        &self,
        hook: impl Fn(&mut Batch) -> hooks::HookResult + Send + Sync + 'static,
    ) {
        self.state().hooks.add_save(Arc::new(hook));
    }

    /// Adds a load hook (TorchRL's `register_load_hook`): every later load passes the
    /// rows it read through `hook`, as save hooks do, before they become the buffer's.
    pub fn register_load_hook(
        &self,
        hook: impl Fn(&mut Batch) -> hooks::HookResult + Send + Sync + 'static,
    ) {
        self.state().hooks.add_load(Arc::new(hook));
    }
}

/// The compact format's two fields: (obs, next obs), with their offsets in a row and
/// their length.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompactFields {
    pub(crate) obs: usize,
    pub(crate) next: usize,
    pub(crate) bytes: usize,
}

impl CompactFields {
    /// The fields `(obs, next)` of `spec`, or why they cannot be compacted.
    pub(crate) fn of(spec: &crate::Spec, obs: &Key, next: &Key) -> Result<CompactFields, String> {
        let field = |k: &Key| {
            spec.field(k)
                .map(|(_, f)| f)
                .ok_or_else(|| format!("compact format: no field `{k}` in the spec"))
        };
        let (o, n) = (field(obs)?, field(next)?);
        if o.dtype() != n.dtype() || o.shape() != n.shape() || obs == next {
            return Err(format!(
                "compact format: `{obs}` and `{next}` must be two fields of one dtype and shape"
            ));
        }
        if n.bytes() == 0 {
            // Nothing to leave out (a load split the rows into chunks of 0 bytes).
            return Err(format!(
                "compact format: `{obs}` and `{next}` hold no bytes"
            ));
        }
        Ok(CompactFields {
            obs: o.offset(),
            next: n.offset(),
            bytes: n.bytes(),
        })
    }
}

/// Dumps `inner`; `false` (nothing written) if a swap retired its storage meanwhile.
fn dump(
    inner: &State,
    dir: &Path,
    options: &SaveOptions,
    limiter: Option<&Limiter>,
) -> Result<bool, PersistError> {
    // A save from this save's hooks or progress reports panics, saying why, before it
    // takes the directory's lock, which this save holds if it names the same one
    // (it waited there for good).
    inner.core.storage.refuse_reentry();
    fs::create_dir_all(dir).at(dir)?;
    // One dump into a directory at a time, from any thread or process: two would
    // both write the next generation's files over each other and delete the one
    // before, leaving a `meta.json` whose checksums fit neither.
    let _dumping = dir::lock(dir)?;
    let previous = match DirMeta::read(dir) {
        Ok(m) if m.kind == DirKind::Memmap => {
            return Err(PersistError::new(
                dir,
                PersistKind::Unsupported(
                    "this directory holds a file-backed storage, not a checkpoint",
                ),
            ))
        }
        Ok(m) => m.checkpoint.map(|c| (c.generation, c.files)),
        // A damaged or missing meta names no checkpoint worth keeping.
        Err(e) if e.is_missing() || e.is_corrupt() || e.is_version() => None,
        Err(e) => return Err(e),
    };
    let storage = &inner.core.storage;
    let spec = storage.spec();
    let compact = match &options.compact {
        None => None,
        Some((obs, next)) => Some(
            CompactFields::of(spec, obs, next)
                .map_err(|why| PersistError::new(dir, PersistKind::Options(why)))?,
        ),
    };
    let save_hooks = inner.hooks.save();
    if compact.is_some() && inner.core.storage.frames().is_some() {
        return Err(PersistError::new(
            dir,
            PersistKind::Unsupported(
                "the compact format and frames do not combine: a buffer with frames is \
                 saved compact already",
            ),
        ));
    }
    if compact.is_some() && !save_hooks.is_empty() {
        return Err(PersistError::new(
            dir,
            PersistKind::Unsupported("the compact format and save hooks do not combine"),
        ));
    }
    let g = previous.as_ref().map_or(1, |(g, _)| g + 1);
    remove_generation(dir, g);
    let layout = storage.layout();
    // The sections copied as they are (a compact dump's slots take fewer bytes, and
    // the epochs' are known once written: `Meter::finish` settles the total).
    let total = [
        Section::Control,
        Section::Trees,
        Section::Lanes,
        Section::Slots,
    ]
    .map(|s| layout.section(s).len() as u64 * 8)
    .iter()
    .sum();
    let mut meter = Meter::new(options.progress.clone(), total);
    let mut written = WrittenFiles { sinks: Vec::new() };
    // A max-value writer places a batch row by row, under its lock: held first (as a
    // swap holds it), so that a checkpoint holds whole batches, never part of one.
    let placing = inner.policy.hold();
    let frozen = storage.freeze();
    if storage.is_retired() {
        return Ok(false);
    }
    let result = write_sections(
        inner,
        dir,
        g,
        compact,
        &save_hooks,
        &mut meter,
        &mut written,
    );
    let (rows, write_count) = (storage.len(), storage.write_count());
    // The limit's counts beside the rows, read while they are frozen: an insert the
    // limit counted and the freeze holds back counts without its rows (a batch a
    // writer at most), and samples, which no freeze holds, may be a few more.
    let limit = limiter.and_then(Limiter::stats);
    drop(frozen);
    drop(placing);
    if let Err(e) = result {
        written.discard();
        return Err(e);
    }
    // The data is copied; flush it while collectors carry on.
    for (_, file, path) in &written.sinks {
        if let Err(e) = file.sync_all() {
            let err = PersistError::io(path, e);
            written.discard();
            return Err(err);
        }
    }
    let mut meta = DirMeta::new(DirKind::Checkpoint, inner.config.clone());
    meta.checkpoint = Some(CheckpointMeta {
        generation: g,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        files: written.sinks.iter().map(|(m, _, _)| m.clone()).collect(),
        compact: options.compact.as_ref().map(|(o, n)| {
            (
                o.components().map(str::to_owned).collect(),
                n.components().map(str::to_owned).collect(),
            )
        }),
        save_hooks: save_hooks.len(),
        rows,
        write_count,
        rate_limit: limit.map(|s| s.limit.into()),
        rate_counts: limit.map(|s| (s.inserts, s.samples)),
    });
    dir::sync_dir(dir)?;
    if let Err(e) = meta.write(dir) {
        written.discard();
        return Err(e);
    }
    // The new checkpoint stands: the old generation's files go.
    if let Some((old, files)) = previous {
        // Only files in the directory itself (meta.json refuses other names).
        for f in files.iter().filter(|f| dir::is_plain_name(&f.name)) {
            let _ = fs::remove_file(dir.join(&f.name));
        }
        remove_generation(dir, old);
    }
    Ok(true)
}

/// Removes any file of generation `g` (left by a dump that died before its meta).
fn remove_generation(dir: &Path, g: u64) {
    for part in [
        Part::Control,
        Part::Slots,
        Part::Omit,
        Part::Kept,
        Part::Trees,
        Part::Lanes,
        Part::Epochs,
    ] {
        let _ = fs::remove_file(dir.join(part.file(g)));
    }
}

/// Writes every section of a frozen storage as generation `g`.
fn write_sections(
    inner: &State,
    dir: &Path,
    g: u64,
    compact: Option<CompactFields>,
    save_hooks: &[hooks::Hook],
    meter: &mut Meter,
    written: &mut WrittenFiles,
) -> Result<(), PersistError> {
    let storage = &inner.core.storage;
    let layout = storage.layout();
    let mut buf = Vec::with_capacity(CHUNK_BYTES);
    let mut section = |part: Part, written: &mut WrittenFiles, meter: &mut Meter, s: Section| {
        let range = layout.section(s);
        if range.is_empty() {
            return Ok(());
        }
        let mut sink = Sink::create(dir, part, g)?;
        copy_words(storage, range, &mut sink, &mut buf, meter)?;
        written.sinks.push(sink.close());
        Ok::<(), PersistError>(())
    };
    section(Part::Control, written, meter, Section::Control)?;
    section(Part::Trees, written, meter, Section::Trees)?;
    section(Part::Lanes, written, meter, Section::Lanes)?;
    match (compact, save_hooks.is_empty()) {
        (Some(fields), _) => write_compact(storage, fields, dir, g, meter, written)?,
        (None, false) => write_hooked(storage, save_hooks, dir, g, meter, written)?,
        (None, true) => section(Part::Slots, written, meter, Section::Slots)?,
    }
    if let Some(bytes) = encode_epochs(&inner.core.sampler) {
        let mut sink = Sink::create(dir, Part::Epochs, g)?;
        meter.expect(bytes.len() as u64);
        sink.put(&bytes, meter)?;
        written.sinks.push(sink.close());
    }
    meter.finish();
    Ok(())
}

/// The epochs file of the sampler's open epoch, if it samples without replacement.
pub(crate) fn encode_epochs(engine: &SamplerEngine) -> Option<Vec<u8>> {
    match engine {
        SamplerEngine::WithoutReplacement(e) => Some(epochs::encode(&e.state())),
        SamplerEngine::Slice(crate::sampler::slice::SliceState {
            epochs: Some(e), ..
        }) => Some(epochs::encode(&e.state())),
        _ => None,
    }
}

/// Every slot's bytes through the save hooks: the rows of each chunk of written
/// slots go through the hooks as one batch, and are stored as the hooks leave them.
fn write_hooked(
    storage: &Storage,
    save_hooks: &[hooks::Hook],
    dir: &Path,
    g: u64,
    meter: &mut Meter,
    written: &mut WrittenFiles,
) -> Result<(), PersistError> {
    let (slot_bytes, header) = (storage.slot_bytes(), storage.header_bytes());
    let capacity = storage.geometry().capacity();
    let chunk = (CHUNK_BYTES / slot_bytes).max(1) as u64;
    let mut sink = Sink::create(dir, Part::Slots, g)?;
    let mut out = vec![0u8; chunk as usize * slot_bytes];
    let mut batch = Batch::zeros(storage.spec().clone(), [0]);
    let mut rows: Vec<u64> = Vec::new();
    let mut first = 0;
    while first < capacity {
        let n = chunk.min(capacity - first);
        let bytes = &mut out[..n as usize * slot_bytes];
        atomic_copy::load(storage.words(), storage.slot_offset(first), bytes);
        rows.clear();
        rows.extend((first..first + n).filter(|&s| storage.stamp_at(s).is_written()));
        with_rows(storage, &rows, &mut batch, |batch| {
            hooks::run(save_hooks, batch)
                .map_err(|why| PersistError::new(dir, PersistKind::Hook(why)))
        })?;
        // The hooked rows go back over the copied ones, in their stored form (a
        // frames buffer's: one frame of each stack, as `with_rows` read them).
        for (k, &slot) in rows.iter().enumerate() {
            let at = (slot - first) as usize * slot_bytes + header;
            for (f, col) in storage.row_spec().fields().iter().zip(batch.columns()) {
                bytes[at + f.offset()..][..f.bytes()]
                    .copy_from_slice(&col.as_bytes()[k * f.bytes()..][..f.bytes()]);
            }
        }
        sink.put(bytes, meter)?;
        first += n;
    }
    written.sinks.push(sink.close());
    Ok(())
}

/// Reads the rows of `slots` into `batch` (shaped `[slots.len()]`), runs `f` on it.
pub(crate) fn with_rows<T>(
    storage: &Storage,
    slots: &[u64],
    batch: &mut Batch,
    f: impl FnOnce(&mut Batch) -> T,
) -> T {
    // The rows as stored (with frames: one frame of each stack, no next_of fields).
    let spec = storage.row_spec();
    *batch = Batch::zeros(spec.clone(), [slots.len()]);
    {
        let parts = batch.parts_mut();
        let mut dest = Dest::new(
            spec.fields()
                .iter()
                .zip(parts.columns)
                .map(|(f, c)| DstCol::whole(c.as_bytes_mut(), f.bytes(), f.offset()))
                .collect(),
        );
        for (k, &slot) in slots.iter().enumerate() {
            dest.read_row(storage.words(), storage.row_offset_of(slot), k);
        }
    }
    f(batch)
}

/// The compact format: slots without the next-observation field, a bitmap of the
/// slots whose next observation is the next row's observation, and the others' values.
fn write_compact(
    storage: &Storage,
    fields: CompactFields,
    dir: &Path,
    g: u64,
    meter: &mut Meter,
    written: &mut WrittenFiles,
) -> Result<(), PersistError> {
    let (slot_bytes, header) = (storage.slot_bytes(), storage.header_bytes());
    let stripped = slot_bytes - fields.bytes;
    let next_at = header + fields.next;
    let capacity = storage.geometry().capacity();
    let mut slots = Sink::create(dir, Part::Slots, g)?;
    let mut kept = Sink::create(dir, Part::Kept, g)?;
    let mut omit = vec![0u8; (capacity as usize).div_ceil(8)];
    let (mut row, mut succ) = (vec![0u8; slot_bytes], vec![0u8; fields.bytes]);
    let mut out = Vec::with_capacity(CHUNK_BYTES + slot_bytes);
    let mut kept_out = Vec::with_capacity(CHUNK_BYTES + fields.bytes);
    for (k, shard) in storage.shards().iter().enumerate() {
        let ring = *shard.ring();
        for pos in 0..ring.steps {
            for lane in 0..ring.width {
                let slot = ring.slot(pos, lane);
                atomic_copy::load(storage.words(), storage.slot_offset(slot), &mut row);
                let omitted = successor(storage, k, pos, lane).is_some_and(|next| {
                    atomic_copy::load(
                        storage.words(),
                        storage.row_offset_of(next) + fields.obs,
                        &mut succ,
                    );
                    row[next_at..next_at + fields.bytes] == succ[..]
                });
                out.extend_from_slice(&row[..next_at]);
                out.extend_from_slice(&row[next_at + fields.bytes..]);
                if omitted {
                    omit[slot as usize / 8] |= 1 << (slot % 8);
                } else {
                    kept_out.extend_from_slice(&row[next_at..next_at + fields.bytes]);
                }
                if out.len() >= CHUNK_BYTES {
                    slots.put(&out, meter)?;
                    out.clear();
                }
                if kept_out.len() >= CHUNK_BYTES {
                    kept.put(&kept_out, meter)?;
                    kept_out.clear();
                }
            }
        }
    }
    debug_assert_eq!(
        stripped * capacity as usize,
        slots.bytes as usize + out.len()
    );
    slots.put(&out, meter)?;
    kept.put(&kept_out, meter)?;
    written.sinks.push(slots.close());
    written.sinks.push(kept.close());
    let mut sink = Sink::create(dir, Part::Omit, g)?;
    sink.put(&omit, meter)?;
    written.sinks.push(sink.close());
    Ok(())
}

/// The slot of the row after the one at (`pos`, `lane`) of shard `k` in its lane, if
/// both rows are published and the second is the first's successor (one sequence
/// number later).
pub(crate) fn successor(storage: &Storage, k: usize, pos: u64, lane: u64) -> Option<u64> {
    let ring = *storage.shards()[k].ring();
    let here = storage.stamp_at(ring.slot(pos, lane));
    if !here.is_published() {
        return None;
    }
    let seq = u64::from(here.lap()) * ring.steps + pos;
    let next_seq = seq + 1;
    let next = ring.slot(ring.pos(next_seq), lane);
    let there: Stamp = storage.stamp_at(next);
    (there.is_published() && there.lap() == ring.lap(next_seq)).then_some(next)
}
