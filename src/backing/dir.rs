//! A directory that holds a buffer: its `meta.json`, and how files in it are written
//! so that a crash never leaves a half-written file under a name that is read.
//!
//! Two kinds of directory share the format: a file-backed storage (`storage.bin`, the
//! region itself, mapped) and a checkpoint (`save`: one file per region section,
//! named by generation). `meta.json` says which, and is always written last, to a
//! temporary name, flushed, then renamed into place: whatever it names is complete.
//!
//! Layer: core.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::persist::{IoAt, PersistError, PersistKind};
use crate::storage::layout::FORMAT_VERSION;

/// The `format` field of every `meta.json`.
pub(crate) const FORMAT: &str = "replaybuf";
/// The metadata file of a buffer directory.
pub(crate) const META: &str = "meta.json";
/// The largest `meta.json` read: far past any buffer's (a configuration and a record
/// per file and shard), short of a damaged one's gigabytes.
pub(crate) const MAX_META_BYTES: u64 = 64 << 20;
/// The region file of a file-backed storage.
pub(crate) const STORAGE: &str = "storage.bin";

/// What a directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DirKind {
    /// A file-backed storage: `storage.bin` is the live region.
    Memmap,
    /// A checkpoint written by `save`.
    Checkpoint,
}

/// A buffer directory's `meta.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DirMeta {
    pub(crate) format: String,
    pub(crate) version: u64,
    pub(crate) kind: DirKind,
    pub(crate) layout_hash: u64,
    pub(crate) config: Config,
    /// The xxh3 of `config` as written (see [`config_checksum`]): a damaged value that
    /// the layout hash does not cover (the seed, the batch size) is refused. Absent
    /// in directories written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) config_xxh3: Option<u64>,
    /// A checkpoint's files and state (absent for a file-backed storage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checkpoint: Option<CheckpointMeta>,
    /// The xxh3 of `checkpoint` as written (see [`checksum`]): a damaged value no file's
    /// checksum covers (its rate limit, its list of files) is refused. Absent in
    /// checkpoints written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) checkpoint_xxh3: Option<u64>,
}

impl DirMeta {
    pub(crate) fn new(kind: DirKind, config: Config) -> DirMeta {
        DirMeta {
            format: FORMAT.to_owned(),
            version: FORMAT_VERSION,
            kind,
            layout_hash: config.layout_hash(),
            config_xxh3: Some(config_checksum(&config)),
            config,
            checkpoint: None,
            checkpoint_xxh3: None,
        }
    }

    /// Parses a `meta.json`, checking its format and version before its fields, so that
    /// a file of a newer version is reported as such rather than as damaged.
    pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<DirMeta, PersistError> {
        let corrupt = |why: String| PersistError::new(path, PersistKind::Corrupt(why));
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
        if value.get("kind").and_then(|k| k.as_str()) == Some("list") {
            // `checkpoint/list.rs`'s: read by `ListBuffer::from_checkpoint`.
            return Err(PersistError::new(
                path,
                PersistKind::NotOurs(
                    "a list buffer's checkpoint: ListBuffer::from_checkpoint loads it".to_owned(),
                ),
            ));
        }
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(PersistError::new(
                path,
                PersistKind::NotOurs("its meta.json has no `\"format\": \"replaybuf\"`".to_owned()),
            ));
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(PersistError::new(
                    path,
                    PersistKind::Version {
                        found,
                        expected: FORMAT_VERSION,
                    },
                ))
            }
            None => return Err(corrupt("meta.json has no version".to_owned())),
        }
        let meta: DirMeta =
            serde_json::from_value(value).map_err(|e| corrupt(format!("meta.json: {e}")))?;
        let files = meta.checkpoint.iter().flat_map(|c| &c.files);
        if let Some(f) = files.into_iter().find(|f| !is_plain_name(&f.name)) {
            return Err(corrupt(format!(
                "meta.json names a file outside its directory: {:?}",
                f.name
            )));
        }
        if meta.layout_hash != meta.config.layout_hash() {
            return Err(corrupt(
                "meta.json's layout hash does not match its configuration".to_owned(),
            ));
        }
        if meta
            .config_xxh3
            .is_some_and(|sum| sum != config_checksum(&meta.config))
        {
            return Err(corrupt(
                "meta.json's configuration does not match its checksum".to_owned(),
            ));
        }
        if meta.checkpoint_xxh3.is_some()
            && meta.checkpoint_xxh3 != meta.checkpoint.as_ref().map(checksum)
        {
            return Err(corrupt(
                "meta.json's checkpoint record does not match its checksum".to_owned(),
            ));
        }
        Ok(meta)
    }

    /// Reads `dir/meta.json`; [`PersistKind::Missing`] if there is none.
    pub(crate) fn read(dir: &Path) -> Result<DirMeta, PersistError> {
        DirMeta::parse(&dir.join(META), &read_meta(dir)?)
    }

    /// Writes `dir/meta.json` crash-safely (see [`write_atomic`]).
    pub(crate) fn write(&self, dir: &Path) -> Result<(), PersistError> {
        let meta = DirMeta {
            config_xxh3: Some(config_checksum(&self.config)),
            checkpoint_xxh3: self.checkpoint.as_ref().map(checksum),
            ..self.clone()
        };
        let json = serde_json::to_vec_pretty(&meta).expect("a meta always serialises");
        write_atomic(dir, META, &json)
    }
}

/// The xxh3 of `config`'s compact JSON (see [`checksum`]).
pub(crate) fn config_checksum(config: &Config) -> u64 {
    checksum(config)
}

/// The xxh3 of `value`'s compact JSON: the same for a value read back from
/// `meta.json` as for the one written (fields in declaration order; floats written
/// as the shortest text that reads back to the same value).
pub(crate) fn checksum(value: &impl Serialize) -> u64 {
    let json = serde_json::to_vec(value).expect("a meta always serialises");
    xxhash_rust::xxh3::xxh3_64(&json)
}

/// Writes `dir/name` so that a crash leaves either the old file or the new one: the
/// bytes go to a temporary name, are flushed to disk, renamed into place, and the
/// directory is flushed so that the rename itself is durable.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), PersistError> {
    let tmp = temp_name(dir, name);
    let mut file = File::create(&tmp).at(&tmp)?;
    file.write_all(bytes).at(&tmp)?;
    file.sync_all().at(&tmp)?;
    drop(file);
    let path = dir.join(name);
    fs::rename(&tmp, &path).at(&path)?;
    sync_dir(dir)
}

/// A temporary name beside `dir/name`, unique to this process and call.
pub(crate) fn temp_name(dir: &Path, name: &str) -> PathBuf {
    let nonce = crate::sync::entropy_seed();
    dir.join(format!(".{name}.tmp-{}-{nonce:016x}", std::process::id()))
}

/// The lock file of a buffer directory (see [`lock`]).
pub(crate) const LOCK: &str = ".lock";

/// Takes `dir`'s lock, waiting while another thread or process holds it: an
/// exclusive `flock` of `dir/.lock`, given back when the guard drops (or its process
/// dies: the kernel lets go of a dead process's locks, so the wait ends).
pub(crate) fn lock(dir: &Path) -> Result<DirLock, PersistError> {
    let path = dir.join(LOCK);
    let held = DirLock::enter(dir)?;
    let file = lock_held(open_lock_file(&path).at(&path)?);
    file.lock().at(&path)?;
    Ok(held.with(file))
}

/// Opens `path`, a directory's lock file, making it if there is none.
fn open_lock_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
}

/// Whether `name` names a file in a directory itself (not a path out of it, nor a
/// hidden file such as the lock).
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['/', '\\']) && !name.starts_with('.')
}

/// Opens `path` for reading if it is a regular file. A FIFO or a device where a
/// checkpoint's file belongs (a damaged directory) is refused rather than waited on (a
/// FIFO's open waits for a writer: `O_NONBLOCK` opens it at once) or read without end
/// (`/dev/zero`).
pub(crate) fn open_file(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// The bytes of `dir/meta.json` (a regular file of at most [`MAX_META_BYTES`]);
/// [`PersistKind::Missing`] if there is none.
pub(crate) fn read_meta(dir: &Path) -> Result<Vec<u8>, PersistError> {
    let path = dir.join(META);
    match read_file(&path, MAX_META_BYTES) {
        Ok(bytes) if bytes.len() as u64 > MAX_META_BYTES => Err(PersistError::new(
            &path,
            PersistKind::Corrupt(format!("meta.json is larger than {MAX_META_BYTES} bytes")),
        )),
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(PersistError::new(dir, PersistKind::Missing))
        }
        Err(e) => Err(PersistError::io(&path, e)),
    }
}

/// Reads the regular file `path` ([`open_file`]) up to `max` bytes and one more: a
/// longer one is read no further than shows it is (the caller checks the length).
pub(crate) fn read_file(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = open_file(path)?;
    let len = file.metadata()?.len().min(max.saturating_add(1));
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len as usize).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            "the file does not fit in memory",
        )
    })?;
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A reader's hold on checkpoint directory `dir`: a shared `flock` of `dir/.lock`, so
/// that no save (which holds it exclusively, [`lock`]) deletes the generation being
/// read; loads hold it together. Without a lock file where this process may not
/// write one (read-only media), no save can have run: the read goes on unlocked.
pub(crate) fn lock_shared(dir: &Path) -> Result<DirLock, PersistError> {
    let path = dir.join(LOCK);
    let held = DirLock::enter(dir)?;
    let file = match File::open(&path) {
        Ok(file) => lock_held(file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match open_lock_file(&path) {
            Ok(file) => lock_held(file),
            // Not a directory at all: the read that follows names the problem.
            Err(_) => return Ok(held),
        },
        Err(e) => return Err(PersistError::io(&path, e)),
    };
    file.lock_shared().at(&path)?;
    Ok(held.with(file))
}

thread_local! {
    /// The directories this thread holds the lock of ([`lock`], [`lock_shared`]).
    static HELD: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A directory's lock, held until dropped.
#[derive(Debug)]
pub(crate) struct DirLock {
    dir: PathBuf,
    _file: Option<LockHeld>,
}

/// A lock file's descriptor, which a child forked while the lock is held points at
/// `/dev/null` (`region/shared.rs`, `LockFile`): the lock belongs to the file's
/// description, and a child forked during a save (a worker started by another thread)
/// held it on through its copy, never dropped, so that the next save waited for the
/// child to exit.
#[cfg(not(replaybuf_loom))]
type LockHeld = crate::region::shared::LockFile;
#[cfg(replaybuf_loom)]
type LockHeld = File;

/// `file` as a [`LockHeld`], before it is locked.
fn lock_held(file: File) -> LockHeld {
    #[cfg(not(replaybuf_loom))]
    return LockHeld::new(file);
    #[cfg(replaybuf_loom)]
    file
}

impl DirLock {
    /// Notes that this thread takes `dir`'s lock; refused if it holds it already: a
    /// save's hook that loads the checkpoint it writes (or a load's hook that saves
    /// into it) would wait on its own lock for good.
    fn enter(dir: &Path) -> Result<DirLock, PersistError> {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        HELD.with(|held| {
            let mut held = held.borrow_mut();
            if held.contains(&dir) {
                return Err(PersistError::new(
                    &dir,
                    PersistKind::Busy(
                        "this thread is saving or loading this directory already (a hook \
                         that loads or saves the checkpoint it is part of)",
                    ),
                ));
            }
            held.push(dir.clone());
            Ok(())
        })?;
        Ok(DirLock { dir, _file: None })
    }

    fn with(mut self, file: LockHeld) -> DirLock {
        self._file = Some(file);
        self
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if let Some(at) = held.iter().rposition(|d| *d == self.dir) {
                held.swap_remove(at);
            }
        });
    }
}

/// Flushes a directory's entries (new names, renames) to disk.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), PersistError> {
    let d = OpenOptions::new().read(true).open(dir).at(dir)?;
    d.sync_all().at(dir)
}

/// What a checkpoint's `meta.json` records beyond the configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointMeta {
    pub(crate) generation: u64,
    pub(crate) created_unix_ms: u64,
    pub(crate) files: Vec<FileMeta>,
    /// The compact format's (obs, next obs) keys.
    pub(crate) compact: Option<(Vec<String>, Vec<String>)>,
    /// Save hooks the rows went through.
    pub(crate) save_hooks: usize,
    pub(crate) rows: u64,
    pub(crate) write_count: u64,
    /// The buffer's rate limit, which [`ReplayBuffer::from_checkpoint`] puts back
    /// (absent: none, or a checkpoint written before limits were recorded).
    ///
    /// [`ReplayBuffer::from_checkpoint`]: crate::ReplayBuffer::from_checkpoint
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate_limit: Option<LimitMeta>,
    /// The limit's counts when the rows were copied: `(inserts, samples)`, which a
    /// loaded buffer's limit goes on from, as Reverb's checkpoints keep their
    /// limiter's (absent: no limit, or a checkpoint written before counts were
    /// recorded; the rows loaded then count as inserted, none sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate_counts: Option<(u64, u64)>,
}

/// A limit as a checkpoint's `meta.json` records it. JSON has no infinities: an
/// unbounded side of the band is left out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LimitMeta {
    pub(crate) min_size_to_sample: u64,
    pub(crate) samples_per_insert: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min_diff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_diff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) insert_timeout: Option<std::time::Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sample_timeout: Option<std::time::Duration>,
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileMeta {
    pub(crate) part: Part,
    pub(crate) name: String,
    pub(crate) bytes: u64,
    pub(crate) xxh3: u64,
}

/// What a checkpoint file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Part {
    Control,
    Slots,
    Omit,
    Kept,
    Trees,
    Lanes,
    Epochs,
}

impl Part {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Part::Control => "control",
            Part::Slots => "slots",
            Part::Omit => "omit",
            Part::Kept => "kept",
            Part::Trees => "trees",
            Part::Lanes => "lanes",
            Part::Epochs => "epochs",
        }
    }

    /// The file of this part in generation `g`.
    pub(crate) fn file(self, g: u64) -> String {
        format!("{}.{g}.bin", self.name())
    }
}
