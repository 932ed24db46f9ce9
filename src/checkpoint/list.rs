//! Checkpoints of list buffers (TorchRL's `ListStorage` dumps): values of any type that
//! serde can write, beside the cursors, random-stream counters and open epoch.
//!
//! ```text
//! dir/meta.json          format, version, kind `list`, the configuration, each
//!                        shard's cursor and floor, the counters, and every file's
//!                        size and xxh3 checksum
//! dir/items.G.bin        each stored value: slot (u64), sequence number (u64), the
//!                        length of its JSON (u64), its JSON
//! dir/epochs.G.bin       the open without-replacement epoch (`epochs.rs`)
//! ```
//!
//! Written and made current as `dump.rs` does its checkpoints: files of the new
//! generation first, then `meta.json` renamed into place.
//!
//! Layer: faces (the list face's own checkpoints, beside the buffer's in this module).

use crate::sync::Arc;
use std::fs;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64;

use super::dump::encode_epochs;
use super::epochs;
use crate::backing::dir::{self, FORMAT};
use crate::backing::dir::{FileMeta, Part};
use crate::config::SamplerMeta;
use crate::error::persist::{IoAt, PersistError, PersistKind};
use crate::list::{Entry, ListBuffer};
use crate::policy::WritePolicy;
use crate::sampler::SamplerEngine;
use crate::storage::layout::{Global, ShardWord, FORMAT_VERSION};
use crate::storage::Draw;
use crate::sync::Ordering;

/// A list checkpoint's `meta.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListMeta {
    format: String,
    version: u64,
    kind: String,
    capacity: usize,
    shards: usize,
    seed: u64,
    sampler: SamplerMeta,
    immutable: bool,
    /// (cursor, floor) of each shard.
    cursors: Vec<(u64, u64)>,
    /// A FIFO sampler's rows taken from each shard (absent before it was kept: the
    /// queue started over at its oldest row).
    #[serde(default)]
    popped: Vec<u64>,
    calls: u64,
    next_shard: u64,
    generation: u64,
    files: Vec<FileMeta>,
    /// The xxh3 of this meta as written with no checksum ([`dir::checksum`]): a seed,
    /// a cursor or a file list damaged in the text loaded silently (absent in
    /// checkpoints from before it was kept).
    #[serde(default)]
    meta_xxh3: Option<u64>,
}

impl ListMeta {
    /// Whether the fields are those the checksum was taken of (or there is none).
    fn whole(&self) -> bool {
        let Some(sum) = self.meta_xxh3 else {
            return true;
        };
        let plain = ListMeta {
            meta_xxh3: None,
            ..self.clone()
        };
        dir::checksum(&plain) == sum
    }
}

const KIND: &str = "list";

impl<T: Clone + Send + Sync + Serialize + DeserializeOwned> ListBuffer<T> {
    /// Saves the buffer under `dir` (see the module docs of `checkpoint/list.rs`): every
    /// stored value as JSON, the cursors, the open epoch and the random streams'
    /// counters, each file checksummed; crash-safe as
    /// [`ReplayBuffer::save`](crate::ReplayBuffer::save). Appends wait while the values are copied.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<(), PersistError> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).at(dir)?;
        // One save at a time, as `ReplayBuffer::save`'s: two wrote one generation's
        // files over each other and deleted the one before.
        let _saving = dir::lock(dir)?;
        let meta = fs::read(dir.join(dir::META)).ok();
        let value = meta
            .as_deref()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok());
        if let Some(kind) = value.as_ref().and_then(|v| v.get("kind")?.as_str()) {
            if kind != KIND {
                // A row buffer's checkpoint or a file-backed storage: its meta.json
                // replaced, it could be opened no more.
                return Err(PersistError::new(
                    dir,
                    PersistKind::Unsupported(
                        "this directory holds a row buffer's checkpoint or a file-backed                          storage, not a list buffer's checkpoint",
                    ),
                ));
            }
        }
        let previous = meta.and_then(|b| serde_json::from_slice::<ListMeta>(&b).ok());
        let g = previous.as_ref().map_or(1, |m| m.generation + 1);
        let inner = &self.inner;
        let frozen: Vec<_> = inner.shards.iter().map(|s| s.begin_freeze(1)).collect();
        for s in inner.shards.iter() {
            let mut backoff = crate::sync::Backoff::new();
            while !s.drained() {
                backoff.snooze();
            }
        }
        let mut items = Vec::new();
        for (slot, cell) in inner.slots.iter().enumerate() {
            if let Some(entry) = cell.load() {
                let json = serde_json::to_vec(&entry.value).map_err(|e| {
                    PersistError::new(
                        dir,
                        PersistKind::Hook(format!("a value does not serialise: {e}")),
                    )
                })?;
                // Read back as a load will: JSON writes a NaN or an infinity as
                // `null`, which no f64 reads, and the checkpoint would load never.
                if let Err(e) = serde_json::from_slice::<T>(&json) {
                    return Err(PersistError::new(
                        dir,
                        PersistKind::Hook(format!(
                            "a value does not read back from JSON (a NaN or infinite float \
                             is written as null): {e}"
                        )),
                    ));
                }
                for w in [slot as u64, entry.seq, json.len() as u64] {
                    items.extend_from_slice(&w.to_le_bytes());
                }
                items.extend_from_slice(&json);
            }
        }
        let word = |k: usize, w: ShardWord| inner.shards[k].word(w).load(Ordering::Acquire);
        let cursors = (0..inner.shards.len())
            .map(|k| (word(k, ShardWord::Cursor), word(k, ShardWord::Floor)))
            .collect();
        let popped = (0..inner.shards.len())
            .map(|k| word(k, ShardWord::Popped))
            .collect();
        let epochs = encode_epochs(&inner.sampler);
        drop(frozen);
        let mut files = Vec::new();
        for (part, bytes) in [(Part::Slots, Some(items)), (Part::Epochs, epochs)] {
            let Some(bytes) = bytes else { continue };
            let name = format!(
                "{}.{g}.bin",
                if part == Part::Slots {
                    "items"
                } else {
                    part.name()
                }
            );
            let path = dir.join(&name);
            fs::write(&path, &bytes).at(&path)?;
            fs::File::open(&path).and_then(|f| f.sync_all()).at(&path)?;
            files.push(FileMeta {
                part,
                name,
                bytes: bytes.len() as u64,
                xxh3: xxh3_64(&bytes),
            });
        }
        let meta = ListMeta {
            format: FORMAT.to_owned(),
            version: FORMAT_VERSION,
            kind: KIND.to_owned(),
            capacity: self.capacity(),
            shards: inner.shards.len(),
            seed: inner.seed,
            sampler: SamplerMeta::of_engine(&inner.sampler),
            immutable: inner.immutable,
            cursors,
            popped,
            calls: inner.global(Global::Calls).load(Ordering::Relaxed),
            next_shard: inner.global(Global::NextShard).load(Ordering::Relaxed),
            generation: g,
            files,
            meta_xxh3: None,
        };
        let meta = ListMeta {
            meta_xxh3: Some(dir::checksum(&meta)),
            ..meta
        };
        dir::sync_dir(dir)?;
        dir::write_atomic(
            dir,
            dir::META,
            &serde_json::to_vec_pretty(&meta).expect("serialises"),
        )?;
        if let Some(old) = previous {
            // Only files in the directory itself: the old meta.json was not checked.
            for f in old.files.iter().filter(|f| dir::is_plain_name(&f.name)) {
                let _ = fs::remove_file(dir.join(&f.name));
            }
        }
        Ok(())
    }

    /// A list buffer rebuilt from a checkpoint [`save`](Self::save) wrote: the same
    /// configuration, values, cursors, epoch and random streams. Damage is refused with
    /// an error naming the file.
    pub fn from_checkpoint(dir: impl AsRef<Path>) -> Result<ListBuffer<T>, PersistError> {
        let dir = dir.as_ref();
        let _reading = dir::lock_shared(dir)?;
        let meta_path = dir.join(dir::META);
        let bytes = dir::read_meta(dir)?;
        let corrupt = |path: &Path, why: String| PersistError::new(path, PersistKind::Corrupt(why));
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| corrupt(&meta_path, format!("not JSON: {e}")))?;
        if value.get("kind").and_then(|k| k.as_str()) != Some(KIND) {
            return Err(PersistError::new(
                dir,
                PersistKind::NotOurs("not a list buffer's checkpoint".to_owned()),
            ));
        }
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(PersistError::new(
                    &meta_path,
                    PersistKind::Version {
                        found,
                        expected: FORMAT_VERSION,
                    },
                ))
            }
            None => return Err(corrupt(&meta_path, "no version".to_owned())),
        }
        let meta: ListMeta = serde_json::from_value(value)
            .map_err(|e| corrupt(&meta_path, format!("meta.json: {e}")))?;
        if !meta.whole() {
            return Err(corrupt(
                &meta_path,
                "its fields do not match its checksum".to_owned(),
            ));
        }
        let sampler = meta
            .sampler
            .sampler()
            .ok_or_else(|| corrupt(&meta_path, "its sampler".to_owned()))?;
        let rb = ListBuffer::<T>::builder()
            .capacity(meta.capacity)
            .shards(meta.shards)
            .seed(meta.seed)
            .sampler(sampler)
            .write_policy(if meta.immutable {
                WritePolicy::Immutable
            } else {
                WritePolicy::RoundRobin
            })
            .build()
            .map_err(|e| corrupt(&meta_path, format!("its configuration: {e}")))?;
        let inner = &rb.inner;
        if meta.cursors.len() != inner.shards.len() {
            return Err(corrupt(&meta_path, "a cursor per shard".to_owned()));
        }
        let read = |part: Part| -> Result<Option<Vec<u8>>, PersistError> {
            let Some(f) = meta.files.iter().find(|f| f.part == part) else {
                return Ok(None);
            };
            if !dir::is_plain_name(&f.name) {
                return Err(corrupt(
                    &meta_path,
                    format!("a file outside it: {:?}", f.name),
                ));
            }
            let path = dir.join(&f.name);
            let bytes = match dir::read_file(&path, f.bytes) {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(PersistError::new(&path, PersistKind::Missing))
                }
                Err(e) => return Err(PersistError::io(&path, e)),
            };
            if bytes.len() as u64 != f.bytes {
                return Err(PersistError::new(
                    &path,
                    PersistKind::Length {
                        expected: f.bytes,
                        found: bytes.len() as u64,
                    },
                ));
            }
            let found = xxh3_64(&bytes);
            if found != f.xxh3 {
                return Err(PersistError::new(
                    &path,
                    PersistKind::Checksum {
                        expected: f.xxh3,
                        found,
                    },
                ));
            }
            Ok(Some(bytes))
        };
        let items = read(Part::Slots)?.unwrap_or_default();
        let items_path = dir.join(format!("items.{}.bin", meta.generation));
        let mut at = 0;
        let word =
            |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        while at < items.len() {
            let bad = |why: &str| corrupt(&items_path, why.to_owned());
            if items.len() - at < 24 {
                return Err(bad("a value's header is cut short"));
            }
            let (slot, seq, len) = (
                word(&items, at),
                word(&items, at + 8),
                word(&items, at + 16),
            );
            at += 24;
            let end = usize::try_from(len)
                .ok()
                .and_then(|l| at.checked_add(l))
                .filter(|&e| e <= items.len())
                .ok_or_else(|| bad("a value runs past the file's end"))?;
            let cell = usize::try_from(slot)
                .ok()
                .and_then(|s| inner.slots.get(s))
                .ok_or_else(|| bad("a value names a slot the buffer has not"))?;
            let value: T = serde_json::from_slice(&items[at..end])
                .map_err(|e| bad(&format!("a value does not deserialise: {e}")))?;
            cell.store(Some(Arc::new(Entry { seq, value })));
            at = end;
        }
        for (k, &(cursor, floor)) in meta.cursors.iter().enumerate() {
            let s = &inner.shards[k];
            // Every value the cursors say is live must be there: a cursor ahead of
            // the items (a damaged meta.json) left reads waiting for values no
            // append would ever store.
            let ring = *s.ring();
            let lo = floor.max(cursor.saturating_sub(ring.steps));
            if let Some(seq) = (lo..cursor).find(|&seq| {
                inner.slots[ring.slot(ring.pos(seq), 0) as usize]
                    .load()
                    .is_none_or(|e| e.seq != seq)
            }) {
                return Err(corrupt(
                    &meta_path,
                    format!("shard {k}'s cursor names value {seq}, which its items lack"),
                ));
            }
            s.word(ShardWord::Cursor).store(cursor, Ordering::Release);
            s.word(ShardWord::Floor)
                .store(floor.min(cursor), Ordering::Release);
            if let Some(&popped) = meta.popped.get(k) {
                s.word(ShardWord::Popped)
                    .store(popped.min(cursor), Ordering::Release);
            }
        }
        inner
            .global(Global::Calls)
            .store(meta.calls, Ordering::Relaxed);
        inner
            .global(Global::NextShard)
            .store(meta.next_shard, Ordering::Relaxed);
        if let (Some(bytes), SamplerEngine::WithoutReplacement(e)) =
            (read(Part::Epochs)?, &inner.sampler)
        {
            let epochs_path = dir.join(format!("epochs.{}.bin", meta.generation));
            e.restore(
                epochs::decode::<Draw>(&bytes, &inner.geometry)
                    .map_err(|why| corrupt(&epochs_path, why))?,
            );
        }
        Ok(rb)
    }
}
