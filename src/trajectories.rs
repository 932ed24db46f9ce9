//! Cutting a collector batch into padded trajectories: TorchRL's
//! `torchrl.collectors.utils.split_trajectories`.
//!
//! A collector hands back the steps of several environments side by side: `[E, T]`,
//! time last, as TorchRL collectors lay them out, or `[T, E]`, time first, as an ndim-2
//! storage with `dim_extend(0)` takes them. [`split_trajectories`] cuts each
//! environment's steps into trajectories, where a trajectory-id field changes or after
//! a step whose end flag is set, and stacks them into one `[n_traj, max_len]` batch
//! padded with zero rows, with a mask of the real steps.
//!
//! Layer: faces.

use std::collections::HashMap;
use std::ops::Range;

use crate::batch::Batch;
use crate::dtype::DType;
use crate::error::DataError;
use crate::key::Key;
use crate::spec::Field;

/// How [`split_trajectories`] finds where trajectories end, and which axis of the batch
/// is time.
///
/// ```
/// use replaybuf::trajectories::Split;
///
/// // TorchRL's default: a trajectory ends at a step whose `("next", "done")` is set.
/// let by_done = Split::default();
/// assert_eq!(by_done, Split::by_end_key(("next", "done")));
/// // Truncation ends a trajectory too; the batch is `[T, E]`.
/// let by_done_or_truncated = Split::by_end_key(("next", "done"))
///     .truncated_key(("next", "truncated"))
///     .time_first(true);
/// // A collector's trajectory ids.
/// let by_id = Split::by_traj_key(("collector", "traj_ids"));
/// # let _ = (by_done_or_truncated, by_id);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    by: Boundary,
    /// A second end flag (end-flag splits only: a trajectory-id split refuses it).
    truncated: Option<Key>,
    /// Whether a 2-dim batch is `[T, E]` rather than `[E, T]`.
    time_first: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Boundary {
    /// A trajectory is a run of one environment's steps with the same id.
    TrajKey(Key),
    /// A trajectory ends at a step whose flag is set.
    EndKey(Key),
}

impl Split {
    /// Splits where the trajectory id of `key` changes: a trajectory is a run of one
    /// environment's steps with the same id. The field holds one integer per step (any
    /// integer dtype). An id must not appear in two environments, nor twice in one
    /// environment with another id between.
    pub fn by_traj_key(key: impl Into<Key>) -> Split {
        Split {
            by: Boundary::TrajKey(key.into()),
            truncated: None,
            time_first: false,
        }
    }

    /// Splits after every step whose flag `key` is set, and at the end of each
    /// environment's steps. The field holds one `bool` or integer per step (an integer
    /// flag is set when it is not 0).
    pub fn by_end_key(key: impl Into<Key>) -> Split {
        Split {
            by: Boundary::EndKey(key.into()),
            truncated: None,
            time_first: false,
        }
    }

    /// Also ends a trajectory after every step whose flag `key` is set (a truncated
    /// episode). Only for [`Split::by_end_key`]: with [`Split::by_traj_key`],
    /// [`split_trajectories`] returns [`TrajectoryError::TruncatedWithTrajKey`].
    pub fn truncated_key(mut self, key: impl Into<Key>) -> Split {
        self.truncated = Some(key.into());
        self
    }

    /// Whether a 2-dim batch is `[T, E]` (time first, how an ndim-2 storage with
    /// `dim_extend(0)` lays out its extends) rather than `[E, T]` (time last, as TorchRL
    /// collectors produce; the default). A 1-dim batch is `[T]` either way.
    pub fn time_first(mut self, time_first: bool) -> Split {
        self.time_first = time_first;
        self
    }
}

impl Default for Split {
    /// `Split::by_end_key(("next", "done"))`, TorchRL's default.
    fn default() -> Split {
        Split::by_end_key(("next", "done"))
    }
}

/// Where a trajectory of [`Trajectories`] came from: step `k` of the trajectory is step
/// `step + k` of environment `env` in the input batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TrajectoryOrigin {
    /// The environment: the index along the batch's environment axis (0 for a 1-dim
    /// batch).
    pub env: usize,
    /// The time step of the trajectory's first step.
    pub step: usize,
}

/// A batch cut into trajectories by [`split_trajectories`].
///
/// Trajectory `i` fills rows `i * max_len ..` of a `[count, max_len]` batch with the
/// input's spec, and zero rows pad it to `max_len`. Trajectories are ordered by
/// environment, then time.
#[derive(Clone, Debug)]
pub struct Trajectories {
    /// Shape `[count, max_len]`, the input's spec.
    batch: Batch,
    /// One per row of `batch`: true on a real step, false on padding.
    mask: Vec<bool>,
    /// One per trajectory, each in `1..=max_len`.
    lengths: Vec<usize>,
    /// One per trajectory.
    origins: Vec<TrajectoryOrigin>,
}

impl Trajectories {
    /// The padded trajectories, shape `[count, max_len]`, with the input's spec.
    pub fn batch(&self) -> &Batch {
        &self.batch
    }

    /// The padded batch, without the mask, lengths and origins.
    pub fn into_batch(self) -> Batch {
        self.batch
    }

    /// One flag per row of [`Trajectories::batch`] (`count * max_len`, row-major): true
    /// on a real step, false on padding.
    pub fn mask(&self) -> &[bool] {
        &self.mask
    }

    /// The number of real steps of each trajectory (each at least 1).
    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// Where each trajectory starts in the input batch.
    pub fn origins(&self) -> &[TrajectoryOrigin] {
        &self.origins
    }

    /// The number of trajectories (at least 1).
    pub fn count(&self) -> usize {
        self.lengths.len()
    }

    /// The length of the longest trajectory: the padded length of all of them.
    pub fn max_len(&self) -> usize {
        self.batch.shape()[1]
    }

    /// The rows of [`Trajectories::batch`] that hold trajectory `i`'s real steps, or
    /// `None` if there is no trajectory `i`.
    pub fn rows(&self, i: usize) -> Option<Range<usize>> {
        let start = i.checked_mul(self.max_len())?;
        Some(start..start + self.lengths.get(i)?)
    }
}

/// Why a batch could not be split into trajectories.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum TrajectoryError {
    /// A key of the [`Split`] names no field of the batch.
    #[error("field `{key}` is not in the batch")]
    MissingKey {
        /// The key.
        key: Key,
    },
    /// The field of a key holds more or fewer than one element per step.
    #[error("field `{key}` has shape {shape:?} per step; a split key needs one element per step")]
    NotScalar {
        /// The key.
        key: Key,
        /// The field's per-step shape.
        shape: Vec<usize>,
    },
    /// The trajectory-id field is not of an integer dtype.
    #[error("trajectory-id field `{key}` is {found}; trajectory ids must be integers")]
    TrajKeyDType {
        /// The key.
        key: Key,
        /// The field's dtype.
        found: DType,
    },
    /// An end (or truncated) flag field is neither `bool` nor an integer dtype.
    #[error("end-flag field `{key}` is {found}; end flags must be bool or integers")]
    EndKeyDType {
        /// The key.
        key: Key,
        /// The field's dtype.
        found: DType,
    },
    /// A truncated key was set on a trajectory-id split, which would ignore it.
    #[error(
        "truncated key `{key}` only applies to end-flag splits; a trajectory-id split \
         takes its boundaries from the ids alone"
    )]
    TruncatedWithTrajKey {
        /// The truncated key.
        key: Key,
    },
    /// The batch is neither `[T]` nor `[E, T]` / `[T, E]`.
    #[error("batch shape {shape:?} has {} dims; trajectories are split from 1- or 2-dim batches", shape.len())]
    BatchDims {
        /// The batch's shape.
        shape: Vec<usize>,
    },
    /// The batch holds no step.
    #[error("batch shape {shape:?} holds no step to split")]
    Empty {
        /// The batch's shape.
        shape: Vec<usize>,
    },
    /// A trajectory id appears in two environments.
    #[error("trajectory id {id} appears in environment {first_env} and in environment {env}")]
    IdInTwoEnvs {
        /// The id, widened to `i128` so that every integer dtype fits.
        id: i128,
        /// The environment where it first appears.
        first_env: usize,
        /// Another environment where it appears.
        env: usize,
    },
    /// A trajectory id reappears in one environment after another id came between: a
    /// trajectory's steps must be contiguous.
    #[error(
        "trajectory id {id} reappears at step {step} of environment {env} after another id; \
         a trajectory's steps must be contiguous"
    )]
    IdNotContiguous {
        /// The id, widened to `i128` so that every integer dtype fits.
        id: i128,
        /// The environment.
        env: usize,
        /// The step where it reappears.
        step: usize,
    },
    /// The padded batch (`count * max_len` rows) would not fit in memory's address
    /// space.
    #[error("{count} trajectories padded to {max_len} steps are too large to allocate")]
    TooLarge {
        /// Trajectories found.
        count: usize,
        /// The longest one.
        max_len: usize,
    },
    /// Reading a key's column failed (a bool column holding a byte other than 0 or 1).
    #[error(transparent)]
    Data(#[from] DataError),
}

/// Cuts a collector batch into trajectories and stacks them, padded with zero rows,
/// into a `[count, max_len]` batch with the same spec: TorchRL's
/// `split_trajectories`.
///
/// `batch` is `[E, T]` (or `[T, E]` with [`Split::time_first`]) or `[T]` for one
/// environment. Each environment's steps are cut where `split` says (see
/// [`Split::by_end_key`] and [`Split::by_traj_key`]), and always at the end of its
/// steps; trajectories are ordered by environment, then time. Storage indices and
/// generations of a sampled batch are not carried over.
///
/// Fails, without panicking, on a missing key, a key field that is not one integer (or,
/// for end flags, `bool`) per step, a batch that is not 1- or 2-dim or holds no step,
/// and trajectory ids that appear in two environments or are not contiguous.
///
/// ```
/// use replaybuf::{Batch, DType, Spec};
/// use replaybuf::trajectories::{split_trajectories, Split, TrajectoryOrigin};
///
/// let spec = Spec::builder()
///     .field("obs", DType::I64, [])
///     .field(("next", "done"), DType::Bool, [])
///     .build()?;
/// // Two environments, three steps each: `[E, T] = [2, 3]`.
/// let mut batch = Batch::zeros(spec, [2, 3]);
/// batch.set("obs", &[0i64, 1, 2, 10, 11, 12])?;
/// // Environment 0's episode ends after its step 0.
/// batch.set(("next", "done"), &[true, false, false, false, false, false])?;
///
/// let trajs = split_trajectories(&batch, &Split::default())?;
/// assert_eq!(trajs.lengths(), &[1, 2, 3]);
/// assert_eq!(trajs.batch().shape(), &[3, 3]);
/// assert_eq!(trajs.batch().column::<i64>("obs")?, &[0, 0, 0, 1, 2, 0, 10, 11, 12]);
/// assert_eq!(
///     trajs.mask(),
///     &[true, false, false, true, true, false, true, true, true]
/// );
/// assert_eq!(trajs.origins()[1], TrajectoryOrigin { env: 0, step: 1 });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn split_trajectories(batch: &Batch, split: &Split) -> Result<Trajectories, TrajectoryError> {
    let layout = Axes::of(batch.shape(), split.time_first)?;
    let pieces = match (&split.by, &split.truncated) {
        (Boundary::TrajKey(_), Some(truncated)) => {
            return Err(TrajectoryError::TruncatedWithTrajKey {
                key: truncated.clone(),
            })
        }
        (Boundary::TrajKey(key), None) => cut_at_id_changes(&trajectory_ids(batch, key)?, layout)?,
        (Boundary::EndKey(key), truncated) => {
            let mut ends = end_flags(batch, key)?;
            if let Some(truncated) = truncated {
                for (end, cut) in ends.iter_mut().zip(end_flags(batch, truncated)?) {
                    *end |= cut;
                }
            }
            cut_after_ends(&ends, layout)
        }
    };
    pad(batch, layout, pieces)
}

/// Where step `step` of environment `env` sits in the rows of the input batch.
#[derive(Clone, Copy, Debug)]
struct Axes {
    envs: usize,
    steps: usize,
    /// `[T, E]`: one environment's steps are `envs` rows apart.
    time_first: bool,
}

impl Axes {
    fn of(shape: &[usize], time_first: bool) -> Result<Axes, TrajectoryError> {
        let layout = match *shape {
            [steps] => Axes {
                envs: 1,
                steps,
                time_first: false,
            },
            [steps, envs] if time_first => Axes {
                envs,
                steps,
                time_first,
            },
            [envs, steps] => Axes {
                envs,
                steps,
                time_first,
            },
            _ => {
                return Err(TrajectoryError::BatchDims {
                    shape: shape.to_vec(),
                })
            }
        };
        if layout.envs == 0 || layout.steps == 0 {
            return Err(TrajectoryError::Empty {
                shape: shape.to_vec(),
            });
        }
        Ok(layout)
    }

    fn row(self, env: usize, step: usize) -> usize {
        if self.time_first {
            step * self.envs + env
        } else {
            env * self.steps + step
        }
    }

    /// Whether an environment's consecutive steps are consecutive rows.
    fn steps_adjacent(self) -> bool {
        !self.time_first || self.envs == 1
    }
}

/// One trajectory before padding.
#[derive(Clone, Copy, Debug)]
struct Piece {
    origin: TrajectoryOrigin,
    len: usize,
}

fn cut_at_id_changes(ids: &[i128], layout: Axes) -> Result<Vec<Piece>, TrajectoryError> {
    // The environment of every id met so far; only looked up, never iterated.
    let mut env_of: HashMap<i128, usize> = HashMap::new();
    let mut pieces = Vec::new();
    for env in 0..layout.envs {
        let mut step = 0;
        while step < layout.steps {
            let id = ids[layout.row(env, step)];
            if let Some(&first_env) = env_of.get(&id) {
                return Err(if first_env == env {
                    TrajectoryError::IdNotContiguous { id, env, step }
                } else {
                    TrajectoryError::IdInTwoEnvs { id, first_env, env }
                });
            }
            env_of.insert(id, env);
            let start = step;
            while step < layout.steps && ids[layout.row(env, step)] == id {
                step += 1;
            }
            pieces.push(Piece {
                origin: TrajectoryOrigin { env, step: start },
                len: step - start,
            });
        }
    }
    Ok(pieces)
}

fn cut_after_ends(ends: &[bool], layout: Axes) -> Vec<Piece> {
    let mut pieces = Vec::new();
    for env in 0..layout.envs {
        let mut start = 0;
        for step in 0..layout.steps {
            if ends[layout.row(env, step)] || step + 1 == layout.steps {
                pieces.push(Piece {
                    origin: TrajectoryOrigin { env, step: start },
                    len: step + 1 - start,
                });
                start = step + 1;
            }
        }
    }
    pieces
}

/// The field `key` names, checked to hold one element per step.
fn per_step_field<'b>(batch: &'b Batch, key: &Key) -> Result<&'b Field, TrajectoryError> {
    let (_, field) = batch
        .spec()
        .field(key)
        .ok_or_else(|| TrajectoryError::MissingKey { key: key.clone() })?;
    if field.elements() != 1 {
        return Err(TrajectoryError::NotScalar {
            key: key.clone(),
            shape: field.shape().to_vec(),
        });
    }
    Ok(field)
}

fn trajectory_ids(batch: &Batch, key: &Key) -> Result<Vec<i128>, TrajectoryError> {
    let field = per_step_field(batch, key)?;
    match field.dtype() {
        DType::Bool => None,
        _ => widened(batch, field)?,
    }
    .ok_or_else(|| TrajectoryError::TrajKeyDType {
        key: key.clone(),
        found: field.dtype(),
    })
}

fn end_flags(batch: &Batch, key: &Key) -> Result<Vec<bool>, TrajectoryError> {
    let field = per_step_field(batch, key)?;
    let values = widened(batch, field)?.ok_or_else(|| TrajectoryError::EndKeyDType {
        key: key.clone(),
        found: field.dtype(),
    })?;
    Ok(values.into_iter().map(|v| v != 0).collect())
}

/// The values of a one-element-per-step field of `bool` or integer dtype, widened to
/// `i128` (which holds every `u64` and `i64` exactly); `None` for a float dtype.
fn widened(batch: &Batch, field: &Field) -> Result<Option<Vec<i128>>, DataError> {
    macro_rules! widen {
        ($($dtype:ident => $ty:ty),* $(,)?) => {
            match field.dtype() {
                $(DType::$dtype => batch
                    .column::<$ty>(field.key())?
                    .iter()
                    .map(|&v| i128::from(v))
                    .collect(),)*
                DType::F16 | DType::BF16 | DType::F32 | DType::F64 => return Ok(None),
            }
        };
    }
    Ok(Some(widen! {
        Bool => bool,
        U8 => u8,
        I8 => i8,
        I16 => i16,
        I32 => i32,
        I64 => i64,
        U16 => u16,
        U32 => u32,
        U64 => u64,
    }))
}

/// Copies every piece's rows, field by field, into a zeroed `[count, max_len]` batch.
fn pad(batch: &Batch, layout: Axes, pieces: Vec<Piece>) -> Result<Trajectories, TrajectoryError> {
    let count = pieces.len();
    let max_len = pieces.iter().map(|p| p.len).max().unwrap_or(0);
    let spec = batch.spec();
    // `count * max_len` rows grow with the square of the input's length: past
    // memory, refused rather than aborting the process.
    let too_large = TrajectoryError::TooLarge { count, max_len };
    let mut out = Batch::try_zeros(spec.clone(), &[count, max_len]).ok_or(too_large.clone())?;
    let rows = out.len();
    let mut mask = Vec::new();
    mask.try_reserve_exact(rows).map_err(|_| too_large)?;
    mask.resize(rows, false);
    let columns = out.parts_mut().columns;
    for (field, column) in spec.fields().iter().zip(columns.iter_mut()) {
        let bytes = field.bytes();
        let src = batch.column_bytes(field.key())?;
        let dst = column.as_bytes_mut();
        for (i, piece) in pieces.iter().enumerate() {
            let TrajectoryOrigin { env, step } = piece.origin;
            let to = i * max_len * bytes;
            if layout.steps_adjacent() {
                let from = layout.row(env, step) * bytes;
                let len = piece.len * bytes;
                dst[to..to + len].copy_from_slice(&src[from..from + len]);
            } else {
                for k in 0..piece.len {
                    let from = layout.row(env, step + k) * bytes;
                    dst[to + k * bytes..to + (k + 1) * bytes]
                        .copy_from_slice(&src[from..from + bytes]);
                }
            }
        }
    }

    for (i, piece) in pieces.iter().enumerate() {
        mask[i * max_len..i * max_len + piece.len].fill(true);
    }
    Ok(Trajectories {
        batch: out,
        mask,
        lengths: pieces.iter().map(|p| p.len).collect(),
        origins: pieces.into_iter().map(|p| p.origin).collect(),
    })
}
