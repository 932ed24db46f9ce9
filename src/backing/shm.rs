//! Creating a shared region, and attaching to one.
//!
//! Layer: core.

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::backing::dir::{DirKind, DirMeta};
use crate::backing::file::header_error;
use crate::config::Config;
use crate::error::persist::{PersistError, PersistKind};
use crate::region::shared::{object_name, Foreign, OpenError};
use crate::region::Region;
use crate::storage::layout::{self, HeaderProblem};
use crate::storage::{Storage, StorageParts};
use std::sync::Arc;

/// How long an attach waits for a region whose creator is still laying it out.
const READY_WAIT: Duration = Duration::from_secs(2);

/// A shared storage, and whether this process created it.
pub(crate) struct OpenedRegion {
    pub(crate) storage: Storage,
    pub(crate) fresh: bool,
    pub(crate) config: Config,
}

/// The path shown in errors about region `name`.
pub(crate) fn shown(name: &str) -> std::path::PathBuf {
    Path::new("/dev/shm").join(format!("{}{name}", crate::region::shared::PREFIX))
}

/// What to do about a region's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AttachMode {
    /// Create it; a region of that name already there is refused.
    Create,
    /// Create it, or attach to the one of that name.
    CreateOrAttach,
    /// Attach to the one of that name; none there is an error.
    Attach,
}

/// Creates the shared region `name` for `config`, or attaches to it, as `mode` says
/// (an attached region must hold a region of `config`'s layout).
pub(crate) fn open(
    name: &str,
    config: &Config,
    mode: AttachMode,
    parts: impl Fn(usize) -> io::Result<StorageParts>,
) -> Result<OpenedRegion, PersistError> {
    let object = object_name(name)
        .map_err(|why| PersistError::new(shown(name), PersistKind::Unsupported(why)))?;
    let meta = serde_json::to_vec(&DirMeta::new(DirKind::Memmap, config.clone()))
        .expect("a meta always serialises");
    let laid_out = parts(meta.len()).map_err(|e| PersistError::io(shown(name), e))?;
    let created = match mode {
        AttachMode::Attach => Err(io::Error::from(io::ErrorKind::AlreadyExists)),
        AttachMode::Create | AttachMode::CreateOrAttach => {
            Region::create_shared(&object, laid_out.layout.words)
        }
    };
    match created {
        Ok(region) => {
            layout::write_header(
                region.words(),
                &laid_out.layout,
                config.layout_hash(),
                &meta,
            );
            Ok(OpenedRegion {
                storage: laid_out.into_storage(Arc::new(region)),
                fresh: true,
                config: config.clone(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if mode == AttachMode::Create {
                return Err(PersistError::new(shown(name), PersistKind::Exists));
            }
            let (region, found, meta_bytes) = attach_region(name, &object)?;
            if let Some(what) = config.layout_difference(&found) {
                return Err(PersistError::new(shown(name), PersistKind::Mismatch(what)));
            }
            // Laid out after the meta its creator wrote, whatever the length of the
            // meta this configuration would write (another seed's digits).
            let parts = parts(meta_bytes).map_err(|e| PersistError::io(shown(name), e))?;
            finish(name, region, parts, found)
        }
        Err(e) => Err(PersistError::io(shown(name), e)),
    }
}

/// Why an attach is refused while a live process restores a checkpoint into the region.
pub(crate) const RESTORING: &str =
    "another process is restoring a checkpoint into it: attach once it is done";

/// Whether a live process holds an entry of `region`'s process table, at `procs`
/// (as the header says).
fn anyone_lives(region: Region, procs: (u64, u64)) -> bool {
    crate::shared::procs::ProcTable::in_region(&Arc::new(region), procs)
        .is_some_and(|table| !table.live().is_empty())
}

/// The configuration the shared region `name` records.
pub(crate) fn read_config(name: &str) -> Result<Config, PersistError> {
    let object = object_name(name)
        .map_err(|why| PersistError::new(shown(name), PersistKind::Unsupported(why)))?;
    attach_region(name, &object).map(|(_, config, _)| config)
}

/// Maps region `object`, waits for it to be ready, and reads its configuration and the
/// bytes of meta its header records.
fn attach_region(name: &str, object: &str) -> Result<(Region, Config, usize), PersistError> {
    let started = Instant::now();
    let region = loop {
        let not_ready = || -> Result<(), PersistError> {
            if started.elapsed() >= READY_WAIT {
                return Err(header_error(&shown(name), HeaderProblem::NotReady));
            }
            std::thread::sleep(Duration::from_millis(5));
            Ok(())
        };
        let region = match Region::open_shared(object) {
            Ok(r) => r,
            // Made but not sized yet: its creator is on its way. It was refused as
            // corrupt (0 bytes) when an attach raced the build.
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                not_ready()?;
                continue;
            }
            Err(OpenError::Foreign(Foreign { owner, mode, me })) => {
                return Err(PersistError::new(
                    shown(name),
                    PersistKind::Foreign { owner, mode, me },
                ))
            }
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {
                return Err(PersistError::new(shown(name), PersistKind::Missing))
            }
            Err(OpenError::Io(e)) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(PersistError::new(
                    shown(name),
                    PersistKind::Corrupt(e.to_string()),
                ))
            }
            Err(OpenError::Io(e)) => return Err(PersistError::io(shown(name), e)),
        };
        match layout::read_header(region.words()) {
            // Its creator is still sizing it or laying it out: a new region reads
            // as zeroes until its header is written, and is ready last.
            Err(HeaderProblem::NotReady)
            | Err(HeaderProblem::TooShort { .. })
            | Err(HeaderProblem::Magic { found: 0 }) => not_ready()?,
            Err(p) => return Err(header_error(&shown(name), p)),
            Ok(_) => break region,
        }
    };
    let info = layout::read_header(region.words()).map_err(|p| header_error(&shown(name), p))?;
    if info.restoring {
        // A live process in the table is the restorer (a restore into a shared region
        // has it alone): not damage, and not to be removed.
        let kind = match anyone_lives(region, info.procs) {
            true => PersistKind::Busy(RESTORING),
            false => PersistKind::Corrupt(crate::backing::file::INTERRUPTED_RESTORE.to_owned()),
        };
        return Err(PersistError::new(shown(name), kind));
    }
    let meta = DirMeta::parse(&shown(name), &info.meta)?;
    if meta.layout_hash != info.layout_hash {
        return Err(PersistError::new(
            shown(name),
            PersistKind::Corrupt("its header's layout hash is not its meta's".to_owned()),
        ));
    }
    Ok((region, meta.config, info.meta.len()))
}

/// The storage over an attached region, checked against the layout `parts` expects.
fn finish(
    name: &str,
    region: Region,
    parts: StorageParts,
    config: Config,
) -> Result<OpenedRegion, PersistError> {
    if region.words().len() != parts.layout.words {
        return Err(PersistError::new(
            shown(name),
            PersistKind::Length {
                expected: parts.layout.words as u64 * 8,
                found: region.words().len() as u64 * 8,
            },
        ));
    }
    Ok(OpenedRegion {
        storage: parts.into_storage(Arc::new(region)),
        fresh: false,
        config,
    })
}
