//! [`ReplayBufferBuilder`]: every choice of a buffer, validated before any memory is
//! reserved.
//!
//! Layer: api.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backing::file;
use crate::batch::Batch;
use crate::buffer::ReplayBuffer;
use crate::config::{
    key_meta, key_of, Config, ConfigError, FieldMeta, FramesMeta, ReductionMeta, SamplerMeta,
    WriterMeta,
};
use crate::dtype::DType;
use crate::error::persist::{PersistError, PersistKind};
use crate::error::{BuildError, BuildErrorKind};
use crate::frames::Frames;
use crate::key::Key;
use crate::policy::PolicyEngine;
use crate::policy::WritePolicy;
use crate::rate_limit::{Limiter, RateLimit, RateLimiter};
use crate::region::Block;
use crate::sampler::{Sampler, SamplerEngine};
use crate::settings::Settings;
#[cfg(not(replaybuf_loom))]
use crate::shared::procs::PROCS;
use crate::shared::procs::{Holder, ProcTable};
use crate::spec::Spec;
use crate::state::State;
use crate::storage::frames::FrameLayout;
use crate::storage::geometry::Geometry;
use crate::storage::lanes::Bounds;
use crate::storage::{Storage, StorageParts};

/// The most shards a storage may have.
pub const MAX_SHARDS: usize = 1024;

/// Builds a [`ReplayBuffer`]; [`ReplayBufferBuilder::build`] validates every choice.
#[derive(Clone, Debug)]
pub struct ReplayBufferBuilder {
    pub(crate) spec: Arc<Spec>,
    /// Capacity, shards, ndim, envs, `dim_extend`, batch size, seed, sampler, write
    /// policy: not chosen, a new buffer takes the defaults the setters name.
    pub(crate) settings: Settings,
    pub(crate) priority_key: Option<Key>,
    pub(crate) memmap: Option<PathBuf>,
    pub(crate) existsok: bool,
    /// Map the memmap directory's existing storage as a private copy: the file is
    /// never written (an offline dataset).
    pub(crate) private_copy: bool,
    /// The name of a shared region to create (or attach to).
    pub(crate) shared: Option<String>,
    /// Only attach to the shared region: never create it.
    #[cfg_attr(replaybuf_loom, allow(dead_code))]
    pub(crate) attach_only: bool,
    /// How far inserts and samples may run apart (`rate_limit.rs`).
    pub(crate) rate_limit: Option<RateLimit>,
    pub(crate) frames: Option<Frames>,
}

impl ReplayBufferBuilder {
    crate::settings::setters!(
        capacity,
        shards,
        ndim,
        envs,
        dim_extend,
        batch_size,
        seed,
        sampler,
        write_policy
    );

    fn settings_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }

    pub(crate) fn new(spec: Arc<Spec>) -> ReplayBufferBuilder {
        ReplayBufferBuilder {
            spec,
            settings: Settings::default(),
            priority_key: None,
            memmap: None,
            existsok: false,
            private_copy: false,
            shared: None,
            attach_only: false,
            rate_limit: None,
            frames: None,
        }
    }

    /// The field holding priorities (TorchRL's `priority_key`, e.g. `"td_error"`): an
    /// extended batch's values of it seed its rows' priorities, and
    /// [`ReplayBuffer::update_priority_from`] reads updates from it. A float field of
    /// any shape; a row's several values reduce to one by the sampler's `reduction`.
    /// Needs a prioritized sampler.
    pub fn priority_key(mut self, key: impl Into<Key>) -> Self {
        self.priority_key = Some(key.into());
        self
    }

    /// Keeps the storage in files under `dir` (TorchRL's `LazyMemmapStorage`): the
    /// rows, stamps, cursors, trees and trajectory tables live in `dir/storage.bin`,
    /// mapped into memory, and `dir/meta.json` records this configuration. The file
    /// grows on disk only as rows are written, and the buffer outlives the process: a
    /// later `build` with [`existsok`](Self::existsok) reopens it with its contents.
    /// A directory that already holds a buffer is refused otherwise.
    pub fn memmap(mut self, dir: impl Into<PathBuf>) -> Self {
        self.memmap = Some(dir.into());
        self
    }

    /// Keeps the storage in the named shared-memory region `name` (TorchRL's
    /// `shared=True`), which other processes attach to with
    /// [`ReplayBuffer::attach`](crate::ReplayBuffer::attach) (or this builder and
    /// [`existsok`](Self::existsok)): collector processes extend while learner
    /// processes sample and update priorities, with no lock between them. The region
    /// is created owner-only; a name already taken is refused unless `existsok`, and
    /// an existing region is opened only if it is this user's alone (owned by this
    /// user, no group or other permission bits: see
    /// [`PersistError::is_foreign`](crate::error::PersistError::is_foreign)). Each
    /// process's writers hold the leases of the shards they write, so a process that
    /// dies in the middle of a write is repaired around by the others (see the
    /// crate's `shared` module). The creator's buffer removes the name when its last
    /// handle drops, unless the name was removed and now stands for a newer region;
    /// a crashed creator's region is found and removed with
    /// `replaybuf shm list` / `replaybuf shm remove --stale`. Linux and other Unix.
    pub fn shared(mut self, name: impl Into<String>) -> Self {
        self.shared = Some(name.into());
        self
    }

    /// Stores fields once a step: frame stacks and `next_of` fields (see
    /// [`Frames`]). Extends and samples keep the spec's fields as they are.
    pub fn frames(mut self, frames: Frames) -> Self {
        self.frames = Some(frames).filter(|f| !f.is_empty());
        self
    }

    /// Keeps inserts and samples within `limit` of each other (Reverb's rate limiters):
    /// a sample waits for `min_size_to_sample` rows and while learners are too far
    /// ahead, an insert while collectors are (see [`RateLimit`]). Every handle of the
    /// buffer goes through one limiter; waits use no CPU and end at the limit's
    /// timeouts (a [`RateLimitError`](crate::RateLimitError) then) or when the limiter
    /// is closed. A [`shared`](Self::shared) buffer's processes keep one limit
    /// together, in the region: the processes that attach count into it, and a limit
    /// set in one holds in all (Linux only: its sleepers wait on a futex).
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = Some(limit);
        self
    }

    /// Opens the buffer a [`memmap`](Self::memmap) directory already holds instead of
    /// refusing it (TorchRL's `existsok`), or attaches to the [`shared`](Self::shared)
    /// region of that name if there is one. Its layout (spec, capacity, shards, ndim,
    /// sampler, priority key) must be this builder's; without an explicit
    /// [`seed`](Self::seed) it keeps its own, and its random streams go on where they
    /// stopped.
    pub fn existsok(mut self, existsok: bool) -> Self {
        self.existsok = existsok;
        self
    }

    /// The write policy chosen so far.
    pub(crate) fn chosen_write_policy(&self) -> &WritePolicy {
        &self.settings.write_policy
    }

    pub(crate) fn chosen_sampler(&self) -> &Sampler {
        &self.settings.sampler
    }

    /// Checks every choice and reserves the storage (lazily: no page is touched until
    /// written).
    pub fn build(self) -> Result<ReplayBuffer, BuildError> {
        let limit = self.rate_limit;
        let mut rb = ReplayBuffer::from_state(self.build_inner()?);
        rb.limiter = match rb.state().core.storage.limiter_block() {
            // A shared region: its processes keep one limit together. Every handle
            // gets the region's limiter, which lets every call through while the
            // region has no limit; a builder with a limit (its creator's) puts it in.
            Some(block) => {
                let member = rb.state().core.storage.member_entry();
                shared_limiter(block, member, limit)?.map(Arc::new)
            }
            None => limit.map(|l| {
                // A reopened file's rows count as inserted, as a checkpoint's do.
                let limiter = RateLimiter::new(l);
                limiter.restart(rb.len() as u64);
                Arc::new(Limiter::Local(limiter))
            }),
        };
        Ok(rb)
    }

    /// Checks every choice, reserving nothing.
    pub(crate) fn check(&self) -> Result<Checked, BuildError> {
        let err = |k| Err(BuildError::new(k));
        let geometry = geometry(
            self.settings.capacity(),
            self.settings.shards(),
            self.settings.ndim(),
            self.settings.envs,
        )?;
        let dim_extend = self.settings.dim_extend.unwrap_or(self.settings.ndim() - 1);
        if dim_extend >= self.settings.ndim() {
            return err(BuildErrorKind::DimExtend {
                dim_extend,
                ndim: self.settings.ndim(),
            });
        }
        if self.settings.batch_size == Some(0) {
            return err(BuildErrorKind::ZeroBatchSize);
        }
        let policy = PolicyEngine::new(
            self.settings.write_policy.clone(),
            &self.spec,
            self.settings.ndim(),
            &self.settings.sampler,
            self.settings.capacity(),
        )?;
        // Trees for a prioritized sampler; a max tree too if new rows take the max
        // priority stored now.
        let priorities = match &self.settings.sampler {
            Sampler::Prioritized(p) => Some(p),
            Sampler::Slice(slice) => slice.prioritized.as_ref().map(|(p, _)| p),
            _ => None,
        };
        let trees = match priorities {
            Some(p) => {
                if let Some(reason) = p.check(self.settings.capacity()) {
                    return err(BuildErrorKind::Sampler { reason });
                }
                Some(p.max_priority_within_buffer)
            }
            _ => None,
        };
        let prioritized = trees.is_some();
        let slices = match &self.settings.sampler {
            Sampler::Slice(slice) => {
                let bounds = slice.bounds(&self.spec).map_err(BuildError::new)?;
                if let Some(batch_size) = self.settings.batch_size {
                    if slice.layout(batch_size).is_none() {
                        return err(BuildErrorKind::SliceBatchSize {
                            batch_size,
                            divisor: slice.divisor(),
                        });
                    }
                }
                Some(bounds)
            }
            _ => None,
        };
        let priority_field = match &self.priority_key {
            None => None,
            Some(key) => {
                let reason = |reason| {
                    err(BuildErrorKind::PriorityKey {
                        key: key.clone(),
                        reason,
                    })
                };
                let Some((i, field)) = self.spec.field(&key) else {
                    return reason("no such field in the spec");
                };
                if !matches!(
                    field.dtype(),
                    DType::F16 | DType::BF16 | DType::F32 | DType::F64
                ) {
                    return reason("priorities must be a float field");
                }
                if field.elements() == 0 {
                    return reason("a priority field needs at least one value a row");
                }
                if !prioritized {
                    return reason("a priority field needs a prioritized sampler");
                }
                Some(i)
            }
        };
        let frames = match &self.frames {
            None => None,
            Some(frames) => {
                if matches!(self.settings.write_policy, WritePolicy::MaxValue { .. }) {
                    return err(BuildErrorKind::Writer {
                        reason: "a max-value writer rewrites rows in place, which a \
                                 buffer with frames cannot: its rows are other rows' frames",
                    });
                }
                let layout = FrameLayout::new(&self.spec, frames, &geometry)
                    .map_err(|reason| BuildError::new(BuildErrorKind::Frames { reason }))?;
                if priority_field.is_some_and(|i| layout.places()[i].len == 0) {
                    return err(BuildErrorKind::Frames {
                        reason: "the priority field must be stored, not a next_of field".into(),
                    });
                }
                Some(layout)
            }
        };
        Ok(Checked {
            geometry,
            dim_extend,
            policy,
            trees,
            slices,
            frames,
            priority_field,
        })
    }

    /// The state of a new buffer: checked, with its storage reserved (or reopened).
    pub(crate) fn build_inner(self) -> Result<State, BuildError> {
        let err = |k| Err(BuildError::new(k));
        let checked = self.check()?;
        let (geometry, trees) = (checked.geometry, checked.trees);
        let slices = checked.slices;
        let frames = &checked.frames;
        // The storage's layout with `meta` bytes of meta and `procs` process entries.
        let parts = |meta, procs| {
            StorageParts::new(
                self.spec.clone(),
                geometry,
                trees,
                slices,
                frames.clone(),
                meta,
                procs,
            )
        };
        let mut seed = self.settings.seed.unwrap_or_else(crate::sync::entropy_seed);
        let mut config = self.config(seed);
        let (storage, origin) = match (&self.memmap, &self.shared) {
            (Some(_), Some(_)) => {
                return err(BuildErrorKind::Writer {
                    reason: "memmap and shared are two storages: choose one",
                })
            }
            #[cfg(not(replaybuf_loom))]
            (None, Some(name)) => {
                if matches!(self.settings.write_policy, WritePolicy::MaxValue { .. }) {
                    return err(BuildErrorKind::Writer {
                        reason: "a max-value writer keeps its ranks in one process; a \
                                 shared buffer takes round-robin or immutable writers",
                    });
                }
                let mode = match (self.attach_only, self.existsok) {
                    (true, _) => crate::backing::shm::AttachMode::Attach,
                    (false, true) => crate::backing::shm::AttachMode::CreateOrAttach,
                    (false, false) => crate::backing::shm::AttachMode::Create,
                };
                let opened =
                    crate::backing::shm::open(name, &config, mode, |meta| parts(meta, PROCS))
                        .map_err(|e| BuildError::new(BuildErrorKind::Persist(e)))?;
                let mut storage = opened.storage;
                if !storage.join(opened.fresh) {
                    // Not damage: the region is full of live processes (an attach
                    // reported it as a damaged configuration).
                    return err(BuildErrorKind::Persist(PersistError::new(
                        crate::backing::shm::shown(name),
                        PersistKind::Busy(
                            "every entry of the shared region's process table is held by a \
                             live process (64 at most)",
                        ),
                    )));
                }
                // Marked for a restore after the attach looked (`Storage::begin_restore`):
                // the restorer, which did not see this process join, copies on.
                if !opened.fresh && storage.restoring() {
                    return err(BuildErrorKind::Persist(PersistError::new(
                        crate::backing::shm::shown(name),
                        PersistKind::Busy(crate::backing::shm::RESTORING),
                    )));
                }
                if !opened.fresh && self.settings.seed.is_none() {
                    seed = opened.config.seed;
                    config.seed = seed;
                }
                // Attached: other processes may be using it; nothing to recover.
                (
                    storage,
                    if opened.fresh {
                        Origin::Fresh
                    } else {
                        Origin::Reused
                    },
                )
            }
            #[cfg(replaybuf_loom)]
            (None, Some(_)) => {
                return err(BuildErrorKind::Writer {
                    reason: "shared mode is not built under loom",
                })
            }
            (None, None) => (
                Storage::new(
                    self.spec.clone(),
                    geometry,
                    trees,
                    slices,
                    frames.clone(),
                    config.layout_hash(),
                )
                .map_err(|e| BuildError::new(BuildErrorKind::Region(e)))?,
                Origin::Fresh,
            ),
            (Some(dir), None) => {
                let parts = |meta| parts(meta, 0);
                let opened = if self.private_copy {
                    file::open_copy(dir, &config, parts)
                } else {
                    file::open(dir, &config, self.existsok, parts)
                }
                .map_err(|e| BuildError::new(BuildErrorKind::Persist(e)))?;
                if !opened.fresh && self.settings.seed.is_none() {
                    seed = opened.seed;
                    config.seed = seed;
                }
                (
                    opened.storage,
                    if opened.fresh {
                        Origin::Fresh
                    } else {
                        Origin::Reopened
                    },
                )
            }
        };
        // A region made before (opened again, attached to) holds the sampler's words
        // as it was left: damaged ones are refused here, before a reopen's recovery
        // computes masses from them (from an alpha of NaN it never returned).
        if origin != Origin::Fresh {
            let engine = SamplerEngine::new(self.settings.sampler.clone(), seed, storage.globals());
            let why = engine
                .damage()
                .map(|why| format!("its sampler's state: {why}"));
            // A reopened region's rows too (an attached one's are in use: other
            // processes' appends claim and write them as this looks).
            let why = why.or_else(|| {
                (origin == Origin::Reopened)
                    .then(|| storage.unclaimed_row())
                    .flatten()
            });
            if let Some(why) = why {
                let region = match (&self.memmap, &self.shared) {
                    (Some(dir), _) => dir.clone(),
                    #[cfg(not(replaybuf_loom))]
                    (_, Some(name)) => crate::backing::shm::shown(name),
                    _ => PathBuf::new(),
                };
                let why = PersistKind::Corrupt(why);
                return err(BuildErrorKind::Persist(PersistError::new(region, why)));
            }
        }
        Ok(self.assemble(checked, config, storage, seed, origin))
    }

    /// The state of this configuration (`checked` by [`check`](Self::check)) over
    /// `storage`, which comes from `origin`.
    pub(crate) fn assemble(
        self,
        checked: Checked,
        config: Config,
        storage: Storage,
        seed: u64,
        origin: Origin,
    ) -> State {
        let engine = SamplerEngine::new(self.settings.sampler, seed, storage.globals());
        match origin {
            Origin::Fresh => engine.initialize(),
            Origin::Reopened => {
                engine.recover(&storage);
            }
            Origin::Reused => {}
        }
        let mut inner = State::new(
            config,
            storage,
            engine,
            seed,
            self.settings.batch_size,
            checked.dim_extend,
            checked.priority_field,
        );
        inner.memmap = self.memmap.filter(|_| !self.private_copy);
        inner.policy = checked.policy;
        if !matches!(origin, Origin::Fresh) {
            inner.policy.reload(&inner.core);
        }
        inner
    }
}

/// What [`ReplayBufferBuilder::check`] found: the choices a state is made of.
pub(crate) struct Checked {
    geometry: Geometry,
    dim_extend: usize,
    policy: PolicyEngine,
    /// With trees (a prioritized sampler): whether with a max tree too.
    trees: Option<bool>,
    /// A slice sampler's trajectory bounds.
    slices: Option<Bounds>,
    /// Fields stored once a step.
    frames: Option<FrameLayout>,
    priority_field: Option<usize>,
}

/// Where a new state's storage comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Made now: the sampler writes its initial state into it.
    Fresh,
    /// A file-backed storage opened again: recovered from writers that died.
    Reopened,
    /// A live storage another state of the buffer used (a swap that keeps the rows
    /// in place), or a shared region other processes use: taken as it is.
    Reused,
}

/// The storage shape of `capacity` rows in `shards` shards: ndim 1, or ndim 2 with
/// `envs` environments. Checks every shape choice.
pub(crate) fn geometry(
    capacity: usize,
    shards: usize,
    ndim: usize,
    envs: Option<usize>,
) -> Result<Geometry, BuildError> {
    let err = |k| Err(BuildError::new(k));
    if capacity == 0 {
        return err(BuildErrorKind::ZeroCapacity);
    }
    if !shards.is_power_of_two() {
        return err(BuildErrorKind::ShardsNotPowerOfTwo { shards });
    }
    // Every shard needs a slot (ndim 1) or an environment (ndim 2).
    let parts = match (ndim, envs) {
        (1, None) => capacity,
        (1, Some(_)) => return err(BuildErrorKind::EnvsWithoutNdim2),
        (2, None) => return err(BuildErrorKind::EnvsRequired),
        (2, Some(envs)) if envs == 0 || !capacity.is_multiple_of(envs) => {
            return err(BuildErrorKind::EnvsDoNotDivide { capacity, envs })
        }
        (2, Some(envs)) => envs,
        (ndim, _) => return err(BuildErrorKind::Ndim { ndim }),
    };
    let limit = parts.min(MAX_SHARDS);
    if shards > limit {
        return err(BuildErrorKind::TooManyShards { shards, limit });
    }
    Ok(match envs {
        None => Geometry::flat(capacity as u64, shards as u64),
        Some(envs) => Geometry::grid((capacity / envs) as u64, envs as u64, shards as u64),
    })
}

/// A builder's configuration as plain data, and back (`config.rs`).
impl ReplayBufferBuilder {
    /// The configuration this builder builds with `seed` (for checkpoints and regions).
    pub(crate) fn config(&self, seed: u64) -> Config {
        Config {
            spec: self
                .spec
                .fields()
                .iter()
                .map(|f| FieldMeta {
                    key: key_meta(f.key()),
                    dtype: f.dtype(),
                    shape: f.shape().to_vec(),
                })
                .collect(),
            capacity: self.settings.capacity(),
            shards: self.settings.shards(),
            ndim: self.settings.ndim(),
            envs: self.settings.envs,
            dim_extend: self
                .settings
                .dim_extend
                .unwrap_or(self.settings.ndim().saturating_sub(1)),
            batch_size: self.settings.batch_size,
            seed,
            sampler: SamplerMeta::of(&self.settings.sampler),
            writer: match &self.settings.write_policy {
                WritePolicy::RoundRobin => WriterMeta::RoundRobin,
                WritePolicy::Immutable => WriterMeta::Immutable,
                WritePolicy::MaxValue {
                    rank_key,
                    reduction,
                } => WriterMeta::MaxValue {
                    rank_key: key_meta(rank_key),
                    reduction: ReductionMeta::of(*reduction),
                },
            },
            priority_key: self.priority_key.as_ref().map(key_meta),
            frames: self.frames.as_ref().map(FramesMeta::of),
        }
    }

    /// A builder that builds `config` again (the builder checks it).
    pub(crate) fn from_config(config: &Config) -> Result<ReplayBufferBuilder, ConfigError> {
        let spec = config.spec().map_err(ConfigError::Spec)?;
        let mut b = ReplayBufferBuilder::new(Arc::new(spec))
            .capacity(config.capacity)
            .shards(config.shards)
            .ndim(config.ndim)
            .dim_extend(config.dim_extend)
            .seed(config.seed)
            .sampler(config.sampler.sampler().ok_or(ConfigError::Sampler)?)
            .write_policy(match &config.writer {
                WriterMeta::RoundRobin => WritePolicy::RoundRobin,
                WriterMeta::Immutable => WritePolicy::Immutable,
                WriterMeta::MaxValue {
                    rank_key,
                    reduction,
                } => WritePolicy::MaxValue {
                    rank_key: key_of(rank_key),
                    reduction: reduction.reduction(),
                },
            });
        if let Some(envs) = config.envs {
            b = b.envs(envs);
        }
        if let Some(n) = config.batch_size {
            b = b.batch_size(n);
        }
        if let Some(k) = &config.priority_key {
            b = b.priority_key(key_of(k));
        }
        if let Some(f) = &config.frames {
            b = b.frames(f.frames());
        }
        Ok(b)
    }
}

impl ReplayBufferBuilder {
    /// Builds the buffer and writes `rows` into it before any handle exists: how a
    /// read-only dataset ([`WritePolicy::Immutable`]) gets its rows, and a quick way
    /// to start any buffer from data. ndim 1: `[n]` rows, spread evenly over the
    /// shards in order (so `n` up to the capacity all stay); ndim 2: `[t, envs]` steps
    /// (or `[envs, t]` with `dim_extend = 1`).
    ///
    /// ```
    /// use replaybuf::{DType, ReplayBuffer, Spec, WritePolicy};
    /// use replaybuf::error::DataError;
    ///
    /// let spec = Spec::builder().field("obs", DType::F32, [2]).build()?;
    /// let mut rows = replaybuf::Batch::zeros(spec.clone(), [100]);
    /// rows.column_mut::<f32>("obs")?.fill(1.0);
    /// let dataset = ReplayBuffer::builder(spec)
    ///     .capacity(100)
    ///     .write_policy(WritePolicy::Immutable)
    ///     .build_from(&rows)?;
    /// assert_eq!(dataset.len(), 100);
    /// assert_eq!(dataset.extend(&rows).unwrap_err(), DataError::Immutable);
    /// assert_eq!(dataset.sample(8)?.column::<f32>("obs")?, &[1.0; 16]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build_from(self, rows: &Batch) -> Result<ReplayBuffer, BuildError> {
        let rb = self.build()?;
        rb.state()
            .write_initial(rows)
            .map_err(|e| BuildError::new(BuildErrorKind::Rows(e)))?;
        Ok(rb)
    }
}

#[cfg(all(test, not(replaybuf_loom)))]
mod config_tests {
    //! A builder round-trips through its configuration (`config.rs`).
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::sampler::{
        Prioritized, Reduction, Sampler, Slice, SlicePriority, Uniform, WithoutReplacement,
    };
    use crate::DType;

    fn spec() -> Arc<Spec> {
        Arc::new(
            Spec::builder()
                .field("obs", DType::F32, [3])
                .field(("next", "done"), DType::Bool, [])
                .field("traj", DType::I64, [])
                .field("td", DType::F32, [2])
                .build()
                .unwrap(),
        )
    }

    #[test]
    fn every_sampler_round_trips_through_json() {
        let p = Prioritized::new(0.6, 0.4)
            .eps(1e-3)
            .max_capacity(1000)
            .reduction(Reduction::Median)
            .max_priority_within_buffer(true);
        let samplers: Vec<Sampler> = vec![
            Uniform.into(),
            WithoutReplacement::new()
                .drop_last(true)
                .shuffle(false)
                .into(),
            p.into(),
            Slice::num_slices(4).traj_key("traj").span(1, 2).into(),
            Slice::slice_len(8)
                .truncated_key(("next", "done"))
                .strict_length(false)
                .without_replacement(WithoutReplacement::new())
                .into(),
            Slice::slice_len(8)
                .traj_key("traj")
                .prioritized(p, SlicePriority::Window)
                .into(),
        ];
        for sampler in samplers {
            let builder = ReplayBufferBuilder::new(spec())
                .capacity(64)
                .shards(2)
                .batch_size(16)
                .sampler(sampler.clone())
                .priority_key("td");
            let config = builder.config(7);
            let json = serde_json::to_string(&config).unwrap();
            let back: Config = serde_json::from_str(&json).unwrap();
            assert_eq!(back, config);
            assert_eq!(back.sampler.sampler(), Some(sampler));
            assert_eq!(
                ReplayBufferBuilder::from_config(&back).unwrap().config(7),
                config
            );
        }
    }

    #[test]
    fn the_layout_hash_ignores_run_time_settings_only() {
        let base = ReplayBufferBuilder::new(spec())
            .capacity(64)
            .sampler(Prioritized::new(0.6, 0.4));
        let config = base.config(1);
        let same = base
            .clone()
            .sampler(Prioritized::new(0.9, 0.1))
            .batch_size(8)
            .config(2);
        assert_eq!(config.layout_hash(), same.layout_hash());
        assert_eq!(config.layout_difference(&same), None);
        let other = base.clone().capacity(128).config(1);
        assert_ne!(config.layout_hash(), other.layout_hash());
        assert_eq!(
            config.layout_difference(&other).unwrap(),
            "capacity 64 vs 128"
        );
        let eps = base.sampler(Prioritized::new(0.6, 0.4).eps(0.1)).config(1);
        assert_eq!(config.layout_difference(&eps).unwrap(), "the sampler");
    }
}

/// A shared region's limiter, with `limit` put in (by the region's creator).
#[cfg(target_os = "linux")]
fn shared_limiter(
    block: Block,
    member: Option<(ProcTable, Holder)>,
    limit: Option<RateLimit>,
) -> Result<Option<Limiter>, BuildError> {
    let shared = crate::rate_limit::shared::SharedLimiter::new(block, member);
    if let Some(limit) = limit {
        shared.install(limit).map_err(|_| {
            BuildError::new(BuildErrorKind::RateLimit {
                reason: "another process was setting the new region's rate limit",
            })
        })?;
    }
    Ok(Some(Limiter::Shared(shared)))
}

/// Shared regions keep their rate limit with futexes, which only Linux has: elsewhere
/// a shared buffer has no limiter, and one built with a limit is refused.
#[cfg(not(target_os = "linux"))]
fn shared_limiter(
    _: Block,
    _: Option<(ProcTable, Holder)>,
    limit: Option<RateLimit>,
) -> Result<Option<Limiter>, BuildError> {
    match limit {
        None => Ok(None),
        Some(_) => Err(BuildError::new(BuildErrorKind::RateLimit {
            reason: "a shared buffer's rate limit needs Linux (futexes)",
        })),
    }
}
