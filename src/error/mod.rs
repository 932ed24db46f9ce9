//! Errors. Hot-path errors are small enums saying what happened; the setup error is an
//! opaque struct over a private kind, with `source()` for the I/O error underneath.
//!
//! Every error is returned before anything changes: a rejected `extend` wrote no row,
//! a rejected `sample` moved no epoch, a rejected `write_all` touched no slot.
//!
//! Layer: base. Checkpoint and attach errors ([`PersistError`]) are in `persist.rs`.

use std::fmt;
use std::io;

use crate::dtype::DType;
use crate::key::Key;

pub(crate) mod persist;

pub use persist::PersistError;

/// A [`Spec`](crate::Spec) that cannot be laid out.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The spec has no fields.
    #[error("a spec needs at least one field")]
    NoFields,
    /// A key, or one component of a nested key, is empty.
    #[error("field {position} has an empty key or key component")]
    EmptyKey {
        /// Position of the field in declaration order.
        position: usize,
    },
    /// Two fields share a key.
    #[error("field `{key}` is declared twice")]
    DuplicateKey {
        /// The repeated key.
        key: Key,
    },
    /// A key is both a field and the parent of another field.
    #[error("field `{key}` and field `{other}`: one key is the parent of the other")]
    KeyIsPrefix {
        /// The key being added.
        key: Key,
        /// The key it collides with.
        other: Key,
    },
    /// The row would exceed [`MAX_ROW_BYTES`](crate::spec::MAX_ROW_BYTES).
    #[error("field `{key}` makes the row larger than 1 GiB")]
    RowTooLarge {
        /// The field that overflowed the row.
        key: Key,
    },
}

/// Why a buffer could not be built.
#[derive(Debug)]
pub struct BuildError {
    kind: BuildErrorKind,
}

#[derive(Debug)]
pub(crate) enum BuildErrorKind {
    ZeroCapacity,
    ShardsNotPowerOfTwo { shards: usize },
    TooManyShards { shards: usize, limit: usize },
    Ndim { ndim: usize },
    EnvsRequired,
    EnvsWithoutNdim2,
    EnvsDoNotDivide { capacity: usize, envs: usize },
    DimExtend { dim_extend: usize, ndim: usize },
    ZeroBatchSize,
    ZeroSizedRow,
    Sampler { reason: &'static str },
    PriorityKey { key: Key, reason: &'static str },
    SliceKey { key: Key, reason: &'static str },
    SliceBatchSize { batch_size: usize, divisor: usize },
    Writer { reason: &'static str },
    RateLimit { reason: &'static str },
    Frames { reason: String },
    RankKey { key: Key, reason: &'static str },
    Spec(SpecError),
    Region(io::Error),
    Persist(crate::error::persist::PersistError),
    Rows(DataError),
    Loader { reason: &'static str },
    Spawn(io::Error),
    Ensemble { reason: &'static str },
    Trainer { reason: &'static str },
    Tmrl { key: Key, reason: &'static str },
}

impl BuildError {
    pub(crate) fn new(kind: BuildErrorKind) -> Self {
        Self { kind }
    }

    /// The persistence error underneath, if that is what this is.
    pub(crate) fn into_persist(self) -> Result<crate::error::PersistError, BuildError> {
        match self.kind {
            BuildErrorKind::Persist(p) => Ok(p),
            kind => Err(BuildError { kind }),
        }
    }

    /// Whether the capacity was zero.
    pub fn is_zero_capacity(&self) -> bool {
        matches!(self.kind, BuildErrorKind::ZeroCapacity)
    }

    /// Whether the shard count was rejected (not a power of two, or too many).
    pub fn is_bad_shards(&self) -> bool {
        matches!(
            self.kind,
            BuildErrorKind::ShardsNotPowerOfTwo { .. } | BuildErrorKind::TooManyShards { .. }
        )
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use BuildErrorKind::*;
        match &self.kind {
            ZeroCapacity => f.write_str("capacity must be at least 1"),
            ShardsNotPowerOfTwo { shards } => {
                write!(f, "shards must be a power of two, got {shards}")
            }
            TooManyShards { shards, limit } => write!(
                f,
                "{shards} shards is more than this buffer can use (at most {limit}: \
                 every shard needs at least one slot, and an ndim-2 shard at least one env)"
            ),
            Ndim { ndim } => write!(f, "ndim must be 1 or 2, got {ndim}"),
            EnvsRequired => f.write_str("an ndim-2 storage needs `envs(E)`: its shape is [capacity / E, E]"),
            EnvsWithoutNdim2 => f.write_str("`envs` only applies to an ndim-2 storage; set `ndim(2)`"),
            EnvsDoNotDivide { capacity, envs } => write!(
                f,
                "capacity {capacity} is not a multiple of envs {envs}: an ndim-2 storage has shape [capacity / envs, envs]"
            ),
            DimExtend { dim_extend, ndim } => write!(
                f,
                "dim_extend {dim_extend} must be below ndim {ndim}"
            ),
            ZeroBatchSize => f.write_str("batch_size must be at least 1"),
            ZeroSizedRow => f.write_str("a typed buffer's row type must not be zero-sized"),
            Sampler { reason } => write!(f, "sampler: {reason}"),
            PriorityKey { key, reason } => write!(f, "priority key `{key}`: {reason}"),
            SliceKey { key, reason } => write!(f, "slice sampler key `{key}`: {reason}"),
            SliceBatchSize { batch_size, divisor } => write!(
                f,
                "batch_size {batch_size} is not a multiple of the slice sampler's {divisor} \
                 (num_slices or slice_len)"
            ),
            Writer { reason } => write!(f, "write policy: {reason}"),
            RateLimit { reason } => write!(f, "rate limit: {reason}"),
            Frames { reason } => write!(f, "frames: {reason}"),
            RankKey { key, reason } => write!(f, "max-value writer's rank key `{key}`: {reason}"),
            Spec(e) => write!(f, "spec: {e}"),
            Region(e) => write!(f, "could not reserve the storage memory: {e}"),
            Persist(e) => write!(f, "{e}"),
            Rows(e) => write!(f, "the initial rows do not fit the buffer: {e}"),
            Loader { reason } => write!(f, "loader: {reason}"),
            Spawn(e) => write!(f, "could not start a prefetch worker thread: {e}"),
            Ensemble { reason } => write!(f, "ensemble: {reason}"),
            Trainer { reason } => write!(f, "trainer: {reason}"),
            Tmrl { key, reason } => write!(f, "tmrl memory field `{key}`: {reason}"),
        }
    }
}

impl std::error::Error for BuildError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            BuildErrorKind::Region(e) => Some(e),
            BuildErrorKind::Spec(e) => Some(e),
            BuildErrorKind::Persist(e) => Some(e),
            BuildErrorKind::Rows(e) => Some(e),
            BuildErrorKind::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SpecError> for BuildError {
    fn from(e: SpecError) -> Self {
        Self::new(BuildErrorKind::Spec(e))
    }
}

/// Why a sampler, write policy or storage could not be swapped into a built buffer
/// ([`ReplayBuffer::set_sampler`](crate::ReplayBuffer::set_sampler) and its
/// siblings). Nothing changed: the buffer keeps its rows, sampler, policy and storage.
#[derive(Debug)]
pub struct SwapError {
    kind: SwapErrorKind,
}

#[derive(Debug)]
pub(crate) enum SwapErrorKind {
    /// The new configuration is refused as a builder would refuse it, or its storage
    /// could not be made.
    Build(BuildError),
    /// A file-backed directory's record of the configuration could not be rewritten.
    #[cfg_attr(replaybuf_loom, allow(dead_code))]
    Persist(crate::error::persist::PersistError),
    /// A file-backed storage asked to change what its file's layout records.
    FileBacked,
    /// The buffer's recorded configuration does not build again.
    Config,
    /// The buffer is in shared memory: other processes hold its state.
    Shared,
    /// A buffer with frames asked to move its rows into a new storage.
    Frames,
}

impl SwapError {
    pub(crate) fn new(kind: SwapErrorKind) -> Self {
        Self { kind }
    }

    pub(crate) fn build(e: BuildError) -> Self {
        Self::new(SwapErrorKind::Build(e))
    }

    /// The builder's error, if the new configuration was refused as a builder would
    /// refuse it (or its storage could not be made).
    pub fn build_error(&self) -> Option<&BuildError> {
        match &self.kind {
            SwapErrorKind::Build(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Display for SwapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            SwapErrorKind::Build(e) => write!(f, "the new configuration is refused: {e}"),
            SwapErrorKind::Persist(e) => write!(f, "{e}"),
            SwapErrorKind::FileBacked => f.write_str(
                "a file-backed storage's layout (its sampler's trees and tables, its \
                 priority key) is fixed in its file: move the buffer to a new directory \
                 in the same swap, `reconfigure().sampler(..).storage(StorageConfig::memmap(dir))`",
            ),
            SwapErrorKind::Config => {
                f.write_str("the buffer's own configuration no longer builds (a bug)")
            }
            SwapErrorKind::Shared => f.write_str(
                "a shared buffer's sampler, writer and storage are every attached \
                 process's: they cannot be swapped by one (dump it, and load the \
                 checkpoint into a buffer built the new way)",
            ),
            SwapErrorKind::Frames => f.write_str(
                "a buffer with frames cannot move its rows into a new storage (a new \
                 capacity, shards or backing, or a sampler that needs trees or tables it \
                 lacks): its stacks are rebuilt from the rows before them, which a copy \
                 row by row does not keep",
            ),
        }
    }
}

impl std::error::Error for SwapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            SwapErrorKind::Build(e) => Some(e),
            SwapErrorKind::Persist(e) => Some(e),
            _ => None,
        }
    }
}

/// Data that does not match the buffer's spec or storage shape. Nothing was written.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum DataError {
    /// A frames buffer's stacks or next values do not follow their trajectory (see
    /// [`Frames`](crate::Frames)); nothing was written.
    #[error(
        "field `{key}` of data row {row}: {what} (a buffer with frames stores one frame a \
         step; feed each trajectory's steps in order, or declare the stacks unchecked)"
    )]
    Frames {
        /// The field.
        key: Key,
        /// The row of the extend's data.
        row: usize,
        /// What does not follow.
        what: &'static str,
    },
    /// The spec has a field the data lacks.
    #[error("field `{key}` is missing")]
    MissingField {
        /// The missing field.
        key: Key,
    },
    /// The data has a field the spec lacks.
    #[error("field `{key}` is not in the spec")]
    UnknownField {
        /// The extra field.
        key: Key,
    },
    /// A field's dtype differs from the spec's.
    #[error("field `{key}` is {found}, the spec says {expected}")]
    DType {
        /// The field.
        key: Key,
        /// The spec's dtype.
        expected: DType,
        /// The data's dtype.
        found: DType,
    },
    /// A field's per-transition shape differs from the spec's.
    #[error("field `{key}` has shape {found:?} per transition, the spec says {expected:?}")]
    FieldShape {
        /// The field.
        key: Key,
        /// The spec's shape.
        expected: Vec<usize>,
        /// The data's shape.
        found: Vec<usize>,
    },
    /// A column holds the wrong number of elements for the batch shape.
    #[error("field `{key}` holds {found} elements, the batch shape needs {expected}")]
    Length {
        /// The field.
        key: Key,
        /// Elements the batch shape needs.
        expected: usize,
        /// Elements given.
        found: usize,
    },
    /// A [`Destination`](crate::Destination) was given another number of columns
    /// than its spec has fields.
    #[error("{found} columns given for a spec of {expected} fields")]
    ColumnCount {
        /// Fields of the spec.
        expected: usize,
        /// Columns given.
        found: usize,
    },
    /// A [`Destination`](crate::Destination)'s column is not `rows * field bytes`
    /// long.
    #[error("the column of field `{key}` has {found} bytes, the rows need {expected}")]
    ColumnBytes {
        /// The field.
        key: Key,
        /// Bytes the rows need.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
    /// A [`Destination`](crate::Destination)'s index, generation, weight or marks
    /// slice does not hold one entry per row.
    #[error("the {part} slice holds {found} entries, the rows need {expected}")]
    RowSlice {
        /// Which slice: "index", "generation", "weight" or "marks".
        part: &'static str,
        /// Rows of the destination.
        expected: usize,
        /// Entries given.
        found: usize,
    },
    /// The batch shape does not fit the storage (`[n]` for ndim 1; `[t, E]` or `[E, t]`
    /// for ndim 2 depending on `dim_extend`).
    #[error("batch shape {found:?} does not fit: {expected}")]
    BatchShape {
        /// What the storage expects, in words.
        expected: &'static str,
        /// The batch's shape.
        found: Vec<usize>,
    },
    /// A bool field holds a byte other than 0 or 1.
    #[error("field `{key}` is bool but holds a byte other than 0 or 1")]
    InvalidBool {
        /// The field.
        key: Key,
    },
    /// The rank field of a row (a max-value writer's) reduces to NaN (a NaN value, or
    /// infinities of both signs summed).
    #[error("rank field `{key}` of row {row} ranks as {value}; a rank must be a number")]
    InvalidRank {
        /// The rank field.
        key: Key,
        /// The row of the batch.
        row: usize,
        /// The value found.
        value: f64,
    },
    /// The buffer is read-only ([`WritePolicy::Immutable`](crate::WritePolicy::Immutable)).
    #[error("the buffer is immutable (a read-only dataset): nothing was written")]
    Immutable,
    /// A shared buffer's every shard is leased to another live process: this process
    /// has no shard to write (build the region with more shards).
    #[error(
        "all {shards} shards of the shared buffer are held by other live processes' \
         writers; nothing was written (build it with more shards)"
    )]
    NoFreeShard {
        /// Shards of the buffer.
        shards: usize,
    },
    /// A buffer-level extend of a shared ndim-2 buffer writes every shard, and so must
    /// hold every shard's writer lease; another live process holds this one.
    #[error(
        "shard {shard} of the shared buffer is held by another live process's writer,          and a buffer-level extend of an ndim-2 buffer writes every shard; nothing was          written (extend through a writer handle, which owns its shard's environments)"
    )]
    ShardLeased {
        /// The shard another process holds.
        shard: usize,
    },
    /// The priority field of a row holds a NaN, infinite or negative value.
    #[error(
        "priority field `{key}` of row {row} is {value}; priorities must be finite and at least 0"
    )]
    InvalidPriority {
        /// The priority field.
        key: Key,
        /// The row of the batch.
        row: usize,
        /// The value found.
        value: f64,
    },
    /// The buffer's rate limit ([`RateLimit`](crate::RateLimit)) held the insert back
    /// past its timeout, or its limiter is closed; nothing was written.
    #[error(transparent)]
    RateLimited(#[from] RateLimitError),
}

/// Why a priority update was refused. Nothing was changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PriorityError {
    /// The buffer's sampler is not prioritized.
    #[error("the buffer's sampler is not prioritized")]
    NotPrioritized,
    /// The slices do not line up: one generation per index, and a whole number (at
    /// least one) of priorities per index.
    #[error(
        "{indices} indices, {generations} generations and {priorities} priorities do not line up"
    )]
    Lengths {
        /// Indices given.
        indices: usize,
        /// Generations given.
        generations: usize,
        /// Priorities given.
        priorities: usize,
    },
    /// A priority is NaN, infinite or negative; or a row's priorities reduce to an
    /// infinite one (the sum or mean of huge ones), `position` the row's first.
    #[error("priority {position} is {value}; it must be finite and at least 0")]
    Invalid {
        /// Its position in the slice given.
        position: usize,
        /// The value.
        value: f64,
    },
    /// An alpha or beta given to `set_alpha` or `set_beta` is NaN, infinite or
    /// negative (or an alpha past 2^20, which no mass can take).
    #[error(
        "{name} is {value}; it must be finite and at least 0{limit}",
        limit = if *name == "alpha" { ", and at most 2^20" } else { "" }
    )]
    InvalidSetting {
        /// `"alpha"` or `"beta"`.
        name: &'static str,
        /// The value.
        value: f64,
    },
    /// An index is outside the storage.
    #[error("index {index} is out of range for capacity {capacity}")]
    OutOfRange {
        /// The index given.
        index: u64,
        /// The storage capacity.
        capacity: u64,
    },
    /// A row was replaced (overwritten, rewritten in place or emptied) since it was
    /// sampled; only [`ReplayBuffer::update_priority_all`] refuses for this.
    ///
    /// [`ReplayBuffer::update_priority_all`]: crate::ReplayBuffer::update_priority_all
    #[error(
        "the row at index {index} (update position {position}) was replaced since it was sampled"
    )]
    Replaced {
        /// Its position in the slices given.
        position: usize,
        /// Its storage index.
        index: u64,
    },
    /// An index and generation name no row this buffer has held: the slot was never
    /// written, or the generation is ahead of the slot's (from another buffer, or made
    /// up).
    #[error("index {index} never held generation {generation} (update position {position})")]
    UnknownRow {
        /// Its position in the slices given.
        position: usize,
        /// The index given.
        index: u64,
        /// The generation given.
        generation: u64,
    },
    /// The batch lacks the buffer's priority field, or the buffer has none.
    #[error(
        "no priority field: set `priority_key` on the builder and sample a batch that holds it"
    )]
    NoPriorityField,
}

/// What a priority update did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PriorityUpdate {
    /// Rows whose priority was set.
    pub applied: usize,
    /// Rows skipped because a newer row has replaced them (or they were emptied) since
    /// their generation was read: their priorities would belong to another row.
    pub stale: usize,
}

/// A sample that failed, and the rows it drew before it did: a transform fails after
/// the draw, whose rows an epoch or a FIFO queue gave up, so they count as sampled.
/// Given back, a FIFO queue's rate limit counted 4 rows waiting in an empty queue,
/// and its collectors waited for learners that had nothing to take.
#[derive(Debug)]
pub(crate) struct SampleFailed {
    pub(crate) drawn: usize,
    pub(crate) error: SampleError,
}

impl From<SampleError> for SampleFailed {
    fn from(error: SampleError) -> Self {
        SampleFailed { drawn: 0, error }
    }
}

/// Why a sample was not drawn. The buffer and the sampler's state are unchanged, except
/// for [`SampleError::EpochEnd`], which closes the epoch it reports.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SampleError {
    /// The buffer holds no rows.
    #[error("the buffer is empty")]
    Empty,
    /// A prioritized sample found every stored row at priority 0 with `eps` 0: their
    /// masses are 0, and none can be drawn (TorchRL raises "non-positive p_sum").
    #[error("the buffer's {rows} rows all have priority 0 (and eps 0): none can be drawn")]
    NoMass {
        /// Rows stored at priority 0.
        rows: u64,
    },
    /// Sampling without replacement with `drop_last` asked for more rows than are
    /// stored: no batch of an epoch could be whole. (Without `drop_last` the epoch's
    /// one batch is every stored row.)
    #[error("asked for {requested} rows without replacement but only {available} are stored")]
    NotEnough {
        /// Rows asked for.
        requested: usize,
        /// Rows stored.
        available: usize,
    },
    /// A sample of more rows than memory can hold: nothing was drawn or counted.
    #[error("a sample of {rows} rows does not fit in memory")]
    TooLarge {
        /// Rows asked for.
        rows: usize,
    },
    /// The without-replacement epoch ran out; the next call starts a new epoch.
    #[error("the epoch ran out; the next sample starts a new one")]
    EpochEnd,
    /// No batch size was given, here or at build time.
    #[error("no batch size: pass one to `sample` or set `batch_size` on the builder")]
    NoBatchSize,
    /// Every slot the sampler drew was being written (or, for slices, could not
    /// serve a window: its row overwritten under the pick), `attempts` times in a
    /// row: only possible while writers hold nearly all stored slots.
    #[error("{attempts} draws in a row landed on slots being written or overwritten")]
    Starved {
        /// Draws tried for one row.
        attempts: u32,
    },
    /// The batch passed to `sample_into` has another spec.
    #[error("the batch has a different spec from the buffer")]
    SpecMismatch,
    /// A slice sample's batch size is not a multiple of `num_slices` or `slice_len`.
    #[error("a batch of {batch} rows does not split into slices: it must be a multiple of {divisor} (num_slices or slice_len)")]
    SliceBatchSize {
        /// Rows asked for.
        batch: usize,
        /// What it must be a multiple of.
        divisor: usize,
    },
    /// A step of the learner's pipeline (a transform, the preprocessor, the collate
    /// step) refused the sampled batch; the rows were drawn.
    #[error("{stage} failed: {error}")]
    Pipeline {
        /// Which step.
        stage: Stage,
        /// What it reported.
        error: Box<DataError>,
    },
    /// A prioritized sample writes importance weights, and the
    /// [`Destination`](crate::Destination) has no room for them.
    #[error("a prioritized sample writes importance weights: give the destination room for them (`with_weight`)")]
    NoWeightRoom,
    /// The buffer has transforms, which run on a [`Batch`](crate::Batch): a sample
    /// into a [`Destination`](crate::Destination) would skip them.
    #[error("the buffer has transforms, which run on a Batch: sample into one (`sample_into`), or clear them")]
    TransformsNeedBatch,
    /// The buffer's rate limit ([`RateLimit`](crate::RateLimit)) held the sample back
    /// past its timeout, or its limiter is closed; nothing was drawn.
    #[error(transparent)]
    RateLimited(#[from] RateLimitError),
    /// With `strict_length`, no stored trajectory is as long as a slice.
    #[error("no stored trajectory is {slice_len} steps long (the longest has {longest}); store longer ones or set strict_length(false)")]
    TrajectoriesTooShort {
        /// Steps per slice.
        slice_len: usize,
        /// The longest stored trajectory's live steps.
        longest: u64,
    },
}

/// Why a rate-limited call did not go, or a limit was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RateLimitError {
    /// The call waited its side's whole timeout; nothing was written or drawn.
    #[error("rate limited: waited {waited:?} for the other side (samples per insert {samples_per_insert}, {inserts} rows inserted, {samples} sampled)")]
    Timeout {
        /// How long it waited.
        waited: std::time::Duration,
        /// The limit's ratio.
        samples_per_insert: f64,
        /// Rows inserted when it gave up.
        inserts: u64,
        /// Rows sampled when it gave up.
        samples: u64,
    },
    /// The limiter was closed ([`ReplayBuffer::close_rate_limit`]): a call that would
    /// wait fails at once.
    ///
    /// [`ReplayBuffer::close_rate_limit`]: crate::ReplayBuffer::close_rate_limit
    #[error("the rate limiter is closed: a call that would wait fails")]
    Closed,
    /// A limit that cannot be kept.
    #[error("invalid rate limit: {reason}")]
    Invalid {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The buffer was built without a rate limit.
    #[error(
        "this buffer has no rate limit: build it with one (`ReplayBufferBuilder::rate_limit`)"
    )]
    NoLimit,
    /// The wait was ended by the check in force on its thread
    /// ([`RateLimit::interruptible`](crate::RateLimit::interruptible)): nothing was
    /// counted, written or drawn.
    #[error("the rate-limited wait was interrupted; nothing was written or drawn")]
    Interrupted,
    /// A shared buffer's limit could not be set: another process kept setting one
    /// for seconds (it is stopped, or it is not setting one and its pid was reused).
    #[error(
        "process {pid} has been setting this shared buffer's rate limit for seconds: try again"
    )]
    SetterBusy {
        /// The process that holds the setter's turn.
        pid: u32,
    },
}

/// A step of the learner's pipeline, as [`SampleError::Pipeline`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// The buffer's transform at this position of its list.
    Transform(usize),
    /// A loader's sample preprocessor.
    Preprocess,
    /// A loader's collate step.
    Collate,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stage::Transform(i) => write!(f, "transform {i}"),
            Stage::Preprocess => f.write_str("the sample preprocessor"),
            Stage::Collate => f.write_str("the collate step"),
        }
    }
}

/// `insert_transform` was given a position past the end of the list; nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("transform position {position} is past the end of the list ({len} transforms)")]
pub struct TransformIndexError {
    /// The position given.
    pub position: usize,
    /// Transforms in the list.
    pub len: usize,
}

/// Why a read or write at a storage position failed. Nothing was changed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AccessError {
    /// The position is outside the storage.
    #[error("index {index} is out of range for capacity {capacity}")]
    OutOfRange {
        /// The index given.
        index: u64,
        /// The storage capacity.
        capacity: u64,
    },
    /// The position holds no row (never written, or emptied).
    #[error("index {index} holds no row")]
    NotWritten {
        /// The index given.
        index: u64,
    },
    /// The data does not fit the spec.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A buffer with frames rewrites no row in place: its rows are other rows'
    /// frames and next values.
    #[error("a buffer with frames (frame stacks or next_of) cannot rewrite rows in place")]
    FramesRewrite,
    /// A rewrite of a slice buffer's rows would change where a trajectory begins or
    /// ends (a trajectory id, or an end or truncation flag), which the slice sampler
    /// reads from the rows as they were appended.
    #[error(
        "row {index}'s rewrite changes its trajectory (its id, or its end or truncation \
         flag): a slice buffer rewrites rows in place only within their trajectories"
    )]
    TrajectoryRewrite {
        /// The first such row's index.
        index: u64,
    },
}
