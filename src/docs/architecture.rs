//! # The crate's layers
//!
//! Every module sits in one layer, and imports only from its own layer or the ones
//! below. Each module's docs name its layer (`Layer: core.`); `tests/layers.rs` reads
//! those lines and the code's `crate::` and `super::` paths, and fails on an import
//! from a layer above, or on two modules that import each other. The one circle left
//! is the facade's: [`ReplayBuffer`](crate::ReplayBuffer) hands out its builder,
//! [`Writer`](crate::Writer) and [`Learner`](crate::Learner), and each holds a
//! `ReplayBuffer` (crossbeam's `channel.rs` and its `Sender` / `Receiver` are the same
//! shape). A module's own children (`storage` and `storage/member.rs`) are a family,
//! not a circle.
//!
//! ```text
//! cli/ (its own package)   the demonstration, the benchmark, shm and inspect commands
//!            |
//! faces      typed, list (+ checkpoint/list), ensemble, tmrl, trainer, loader,
//!            prefetch, iter, trajectories, reference
//!            |
//! api        buffer/ (ReplayBuffer: build, write, sample, read; priorities.rs,
//!            transforms.rs, attach.rs), builder, writer, learner, checkpoint/,
//!            swap/, shared (list and remove regions)
//!            |
//! state      state (State: core + write policy + config + hooks + transforms;
//!            StateCell, what every handle of a buffer shares), hooks
//!            |
//! gates      policy (WritePolicy and its gate), max_value, transform: each given
//!            the &Core it works on, never the state or the buffer
//!            |
//! core       core/ (Core: storage + sampler engine + how batches map onto them;
//!            row priorities, slice reads, Written, Attempt), config (plain data),
//!            backing/ (dir, file, shm: where a region lives and how it is opened)
//!            |
//! algos      sampler/ -> storage/ (+ lanes, member) -> sumtree/, region/,
//!            shared/procs + liveness; batch
//!            |
//! base       sync, rng, cpu, powers, dtype, key, spec, error/ (+ persist), docs
//! ```
//!
//! # Where a type lives, and why
//!
//! - **base** holds what every layer names and that names nothing of the crate above
//!   it: the loom facade of atomics and locks (`sync.rs`), random streams (`rng.rs`),
//!   what the CPU offers the vector paths (`cpu.rs`), a batch's powers (`powers.rs`),
//!   dtypes, field [`Key`](crate::Key)s, the [`Spec`](crate::Spec) and its row
//!   layout, every error type ([`PersistError`](crate::error::PersistError) in
//!   `error/persist.rs`).
//! - **algos** are the concurrent algorithms, each knowing only the ones it stands
//!   on: the regions (heap, file, shared memory), the sum/min/max trees, the storage
//!   (shards, slot stamps, freezes, trajectory lanes, recovery, this process's
//!   membership of a shared region), the process table and its liveness locks, and
//!   the samplers' engines over the storage (uniform, without replacement,
//!   prioritized with its mass scale and leaf writes, slices). A [`Batch`](crate::Batch)
//!   is here too: it carries the draws and slice marks the samplers produce.
//! - **core** is one buffer state's storage and sampler engine with the settings that
//!   map batches onto them (`Core`): extend after the gate,
//!   sample, read and rewrite by position, row priorities, slice reads. Beside it the
//!   configuration as plain data (`config.rs`, what checkpoints and shared regions
//!   record) and the backings that open a region for a storage.
//! - **gates** decide what a write does before the core writes it: the write policy
//!   (round robin, immutable, max value) and transforms' inverses. A gate gets the
//!   one thing it works on, `&Core`, as arc-swap's strategies get the one `AtomicPtr`.
//! - **state** is what a swap replaces whole (`State`) and the
//!   cell every handle loads it from (`StateCell`); the
//!   write paths that pass a gate start here.
//! - **api** is [`ReplayBuffer`](crate::ReplayBuffer) and what builds, writes,
//!   samples, checkpoints and swaps it.
//! - **faces** are the other ways to hold a buffer: typed and list buffers, the
//!   ensemble, the TorchRL trainer and tmrl adapters, the loader and its prefetch
//!   workers, iteration, the trajectory splitter, and the sequential reference model
//!   the tests compare against.
//!
//! # What is checked
//!
//! `cargo test --test layers`: every module names a known layer; no import from a
//! layer above; no two modules (nor a longer chain) import each other, but the
//! facade's.
