//! `dumps` and `loads`: a buffer's whole state to a directory and back.

use serde::{Deserialize, Serialize};

/// What a checkpoint's `meta.json` records beyond the configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CheckpointMeta {
    pub(crate) generation: u64,
}
