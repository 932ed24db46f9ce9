//! Finding and removing shared regions: `replaybuf shm list` and `replaybuf shm remove`.
//!
//! Layer: api.

use std::sync::Arc;

use super::procs::ProcTable;
use crate::backing::shm::shown;
use crate::error::persist::{PersistError, PersistKind};
use crate::region::shared::{self, object_name, OpenError};
use crate::region::Region;
use crate::storage::layout;

/// One shared region on this machine, as [`list`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// Its name (what `shared(name)` and `attach(name)` take).
    pub name: String,
    /// Bytes it maps.
    pub bytes: u64,
    /// The pid of the process that created it, if its header says.
    pub creator: Option<u64>,
    /// Pids of the live processes attached to it.
    pub live: Vec<u32>,
    /// Process-table entries of processes that are gone.
    pub dead: usize,
    /// Why it is not a usable region, if it is not (its creator died while laying it
    /// out, another format version, ...).
    pub problem: Option<String>,
    /// Whether it is not this user's alone (another user owns it, or group or others
    /// may open it): it was not opened, so nothing but its name is known of it, and it
    /// is never stale (`problem` says its owner and mode).
    pub foreign: bool,
    /// Whether it changed in the last [`RECENT`] (its modification time), as a
    /// region being made does.
    pub recent: bool,
}

/// How long after its last change a region with a problem may still be one its
/// creator is making (before its header names the creator: sized 0, or all zeros).
pub const RECENT: std::time::Duration = std::time::Duration::from_secs(10);

impl RegionInfo {
    /// Whether no live process uses it: left behind by crashed processes, safe to
    /// remove.
    pub fn is_stale(&self) -> bool {
        if self.foreign {
            // Unread: whether anyone uses it is not known, and it is not ours to clear.
            return false;
        }
        // A region still being laid out has no process yet, but a live creator; one
        // whose header does not name it yet has changed just now.
        let being_made = self.problem.is_some()
            && (self.recent
                || self
                    .creator
                    .is_some_and(|pid| super::procs::runs(pid as u32)));
        self.live.is_empty() && !being_made
    }
}

/// Every shared region of this crate on this machine (Linux: under `/dev/shm`).
pub fn list() -> Vec<RegionInfo> {
    shared::list().into_iter().map(|name| info(&name)).collect()
}

fn info(name: &str) -> RegionInfo {
    let mut found = RegionInfo {
        name: name.to_owned(),
        bytes: 0,
        creator: None,
        live: Vec::new(),
        dead: 0,
        problem: None,
        foreign: false,
        recent: std::fs::symlink_metadata(shown(name))
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().map_or(true, |age| age < RECENT)),
    };
    let region = match object_name(name).map(|o| Region::open_shared(&o)) {
        Ok(Ok(r)) => Arc::new(r),
        Ok(Err(OpenError::Foreign(f))) => {
            found.foreign = true;
            found.problem = Some(format!(
                "not this user's alone: owned by uid {} with mode {:04o}; not opened",
                f.owner, f.mode
            ));
            return found;
        }
        Ok(Err(OpenError::Io(e))) => {
            found.problem = Some(e.to_string());
            return found;
        }
        Err(why) => {
            found.problem = Some(why.to_owned());
            return found;
        }
    };
    found.bytes = region.reserved_bytes() as u64;
    found.creator =
        Some(layout::header(region.words(), layout::Header::CreatorPid)).filter(|&p| p != 0);
    match layout::read_header(region.words()) {
        Err(p) => found.problem = Some(p.to_string()),
        Ok(h) => match ProcTable::in_region(&region, h.procs) {
            None => found.problem = Some("no process table (not a shared buffer)".to_owned()),
            Some(table) => {
                found.live = table.live();
                found.dead = table.dead();
            }
        },
    }
    found
}

/// Removes the shared region `name`: its name goes at once; processes that have it
/// mapped keep using it until they let go.
pub fn remove(name: &str) -> Result<(), PersistError> {
    let object = object_name(name)
        .map_err(|why| PersistError::new(shown(name), PersistKind::Unsupported(why)))?;
    match shared::unlink(&object) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(PersistError::new(shown(name), PersistKind::Missing))
        }
        Err(e) => Err(PersistError::io(shown(name), e)),
    }
}
