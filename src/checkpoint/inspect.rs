//! [`inspect`]: what a buffer directory holds, and whether its files are whole, for
//! `replaybuf inspect DIR` and for programs that check a checkpoint before using it.
//!
//! Layer: api.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use super::dump::CHUNK_BYTES;
use crate::backing::dir::{self, DirKind, DirMeta, STORAGE};
use crate::buffer::{ReplayBuffer, RowBytes};
use crate::config::{Config, SamplerMeta};
use crate::error::persist::{IoAt, PersistError, PersistKind};

/// What [`inspect`] found in a buffer directory.
#[derive(Clone, Debug)]
pub struct Inspection {
    path: PathBuf,
    kind: DirKind,
    config: Config,
    generation: Option<u64>,
    files: Vec<FileCheck>,
    contents: Result<Contents, String>,
    /// A file-backed directory another buffer has open for writing: its contents were
    /// not read (they change as it writes), which says nothing of damage.
    in_use: bool,
}

/// One file and whether it is whole.
#[derive(Clone, Debug)]
struct FileCheck {
    name: String,
    bytes: u64,
    /// `None`: whole; `Some(why)`: not.
    problem: Option<String>,
}

/// What the rows and priorities are, from the buffer the directory loads as.
#[derive(Clone, Debug)]
struct Contents {
    rows: usize,
    write_count: u64,
    per_shard: Vec<usize>,
    priorities: Option<PriorityStats>,
    row_bytes: RowBytes,
}

#[derive(Clone, Copy, Debug)]
struct PriorityStats {
    alpha: f64,
    beta: f64,
    min: f64,
    mean: f64,
    max: f64,
}

impl Inspection {
    /// Whether every file is whole (checksums hold, lengths match) and the buffer
    /// loads, or another buffer has it open for writing (its contents are not read).
    pub fn is_whole(&self) -> bool {
        self.files.iter().all(|f| f.problem.is_none()) && (self.contents.is_ok() || self.in_use)
    }

    /// Rows stored, if the buffer loads.
    pub fn rows(&self) -> Option<usize> {
        self.contents.as_ref().ok().map(|c| c.rows)
    }

    /// What a row takes, as sampled and as stored, if the buffer loads.
    pub fn row_bytes(&self) -> Option<RowBytes> {
        self.contents.as_ref().ok().map(|c| c.row_bytes)
    }
}

/// Looks into a checkpoint written by `save` or a file-backed storage's directory:
/// its configuration, its files and whether their checksums hold, how full the buffer
/// is, and its priorities. Fails only if `dir` holds no readable `meta.json`; damage
/// below that is reported in the [`Inspection`].
pub fn inspect(dir: impl AsRef<Path>) -> Result<Inspection, PersistError> {
    let dir = dir.as_ref();
    let meta = DirMeta::read(dir)?;
    let mut files = Vec::new();
    match &meta.checkpoint {
        Some(c) => {
            for f in &c.files {
                let path = dir.join(&f.name);
                let problem = check_file(&path, f.bytes, f.xxh3).err();
                files.push(FileCheck {
                    name: f.name.clone(),
                    bytes: f.bytes,
                    problem,
                });
            }
        }
        None => {
            let path = dir.join(STORAGE);
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            files.push(FileCheck {
                name: STORAGE.to_owned(),
                bytes,
                problem: (bytes == 0).then(|| "missing or empty".to_owned()),
            });
        }
    }
    let contents = match meta.kind {
        DirKind::Checkpoint if files.iter().any(|f| f.problem.is_some()) => Err(PersistError::new(
            dir,
            PersistKind::Corrupt("a file is damaged".to_owned()),
        )),
        DirKind::Checkpoint => ReplayBuffer::from_checkpoint(dir).map(|rb| contents_of(&rb)),
        DirKind::Memmap => super::dataset::open_copy(dir).map(|rb| contents_of(&rb)),
    };
    let in_use = matches!(&contents, Err(e) if e.is_in_use());
    let contents = contents.map_err(|e| e.to_string());
    Ok(Inspection {
        path: dir.to_path_buf(),
        kind: meta.kind,
        generation: meta.checkpoint.as_ref().map(|c| c.generation),
        config: meta.config,
        files,
        contents,
        in_use,
    })
}

/// Reads a file whole, checking its length and checksum.
fn check_file(path: &Path, bytes: u64, xxh3: u64) -> Result<(), String> {
    let run = || -> Result<(), PersistError> {
        let mut file = dir::open_file(path).at(path)?;
        let len = file.metadata().at(path)?.len();
        if len != bytes {
            return Err(PersistError::new(
                path,
                crate::error::persist::PersistKind::Length {
                    expected: bytes,
                    found: len,
                },
            ));
        }
        let mut hasher = Xxh3::new();
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = file.read(&mut buf).at(path)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let found = hasher.digest();
        if found != xxh3 {
            return Err(PersistError::new(
                path,
                crate::error::persist::PersistKind::Checksum {
                    expected: xxh3,
                    found,
                },
            ));
        }
        Ok(())
    };
    run().map_err(|e| e.to_string())
}

fn contents_of(rb: &ReplayBuffer) -> Contents {
    let inner = rb.state();
    let storage = &inner.core.storage;
    let per_shard = storage
        .shards()
        .iter()
        .map(|s| (s.window().steps() * s.ring().width) as usize)
        .collect();
    let priorities = rb.alpha().zip(rb.beta()).map(|(alpha, beta)| {
        let (mut min, mut max, mut sum, mut n) = (f64::INFINITY, 0.0f64, 0.0, 0u64);
        for i in 0..rb.capacity() as u64 {
            if let Some(p) = rb.priority(i) {
                min = min.min(p);
                max = max.max(p);
                sum += p;
                n += 1;
            }
        }
        PriorityStats {
            alpha,
            beta,
            min: if n == 0 { 0.0 } else { min },
            mean: if n == 0 { 0.0 } else { sum / n as f64 },
            max,
        }
    });
    Contents {
        rows: rb.len(),
        write_count: rb.write_count(),
        per_shard,
        priorities,
        row_bytes: rb.row_bytes(),
    }
}

impl fmt::Display for Inspection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        match (self.kind, self.generation) {
            (DirKind::Checkpoint, Some(g)) => {
                writeln!(f, "{}: checkpoint, generation {g}", self.path.display())?
            }
            _ => writeln!(f, "{}: file-backed storage", self.path.display())?,
        }
        writeln!(f, "spec:")?;
        for field in &c.spec {
            writeln!(
                f,
                "  {:<24} {:<5} {:?}",
                field.key.join("."),
                field.dtype.name(),
                field.shape
            )?;
        }
        let shape = match c.envs {
            Some(e) => format!("[{}, {e}]", c.capacity / e.max(1)),
            None => format!("[{}]", c.capacity),
        };
        writeln!(
            f,
            "storage: capacity {} (shape {shape}), {} shard(s), seed {}",
            c.capacity, c.shards, c.seed
        )?;
        let sampler = match &c.sampler {
            SamplerMeta::Uniform => "uniform".to_owned(),
            SamplerMeta::Fifo => "fifo".to_owned(),
            SamplerMeta::WithoutReplacement { drop_last, shuffle } => {
                format!("without replacement (drop_last {drop_last}, shuffle {shuffle})")
            }
            SamplerMeta::Prioritized(p) => {
                format!(
                    "prioritized (alpha {}, beta {}, eps {})",
                    p.alpha, p.beta, p.eps
                )
            }
            SamplerMeta::Slice {
                num_slices,
                slice_len,
                ..
            } => match (num_slices, slice_len) {
                (Some(n), _) => format!("slices ({n} per batch)"),
                (_, Some(l)) => format!("slices ({l} steps)"),
                _ => "slices".to_owned(),
            },
        };
        writeln!(f, "sampler: {sampler}")?;
        if let Some(frames) = &c.frames {
            writeln!(f, "frames: {frames}")?;
        }
        match &self.contents {
            Ok(ct) => {
                let fill = 100.0 * ct.rows as f64 / c.capacity.max(1) as f64;
                writeln!(
                    f,
                    "fill: {} of {} rows ({fill:.1}%), {} written in all; per shard {:?}",
                    ct.rows, c.capacity, ct.write_count, ct.per_shard
                )?;
                let b = ct.row_bytes;
                write!(
                    f,
                    "row: {} bytes as sampled, {} bytes a slot as stored ({:.2}x)",
                    b.logical,
                    b.slot,
                    b.logical as f64 / b.slot.max(1) as f64
                )?;
                if b.side > 0 {
                    write!(f, ", side slots {} bytes", b.side)?;
                }
                writeln!(f)?;
                if let Some(p) = ct.priorities {
                    writeln!(
                        f,
                        "priorities: min {:.6}, mean {:.6}, max {:.6} (alpha {}, beta {})",
                        p.min, p.mean, p.max, p.alpha, p.beta
                    )?;
                }
            }
            Err(why) => writeln!(f, "contents: {why}")?,
        }
        writeln!(f, "files:")?;
        for file in &self.files {
            match &file.problem {
                None => writeln!(f, "  {:<20} {:>14} bytes  ok", file.name, file.bytes)?,
                Some(why) => writeln!(
                    f,
                    "  {:<20} {:>14} bytes  DAMAGED: {why}",
                    file.name, file.bytes
                )?,
            }
        }
        write!(
            f,
            "{}",
            if self.in_use && self.is_whole() {
                "in use: another buffer writes it; its contents were not read"
            } else if self.is_whole() {
                "whole: every checksum holds"
            } else {
                "NOT WHOLE"
            }
        )
    }
}
