//! Attaching to a shared region another process created.
//!
//! Layer: api.

use crate::backing::shm::{read_config, shown};
use crate::buffer::ReplayBuffer;
use crate::builder::ReplayBufferBuilder;
use crate::error::persist::{PersistError, PersistKind};

impl ReplayBuffer {
    /// Attaches to the shared region `name` that another process created with
    /// [`ReplayBufferBuilder::shared`](crate::ReplayBufferBuilder::shared), with the
    /// configuration the region records (its seed included). Refused, with an error
    /// that says why, if there is no such region, if it is of another format version,
    /// or if its creator has not finished laying it out (after waiting two seconds
    /// for it). A region that is not this user's alone (another user owns it, or
    /// group or others may open it) is refused unread
    /// ([`PersistError::is_foreign`]).
    pub fn attach(name: &str) -> Result<ReplayBuffer, PersistError> {
        let config = read_config(name)?;
        let refused = |why: String| {
            PersistError::new(
                shown(name),
                PersistKind::Corrupt(format!("its configuration: {why}")),
            )
        };
        let mut builder = ReplayBufferBuilder::from_config(&config)
            .map_err(|e| refused(format!("{e:?}")))?
            .shared(name);
        builder.attach_only = true;
        builder.build().map_err(|e| match e.into_persist() {
            Ok(p) => p,
            Err(e) => refused(e.to_string()),
        })
    }
}
