//! Fuzz target: a small [`ReplayBuffer`] and the sequential [`ReferenceBuffer`] run one
//! decoded sequence of operations side by side, and must agree after every one.
//!
//! The operations are the buffer's whole single-threaded surface: extends through the
//! buffer and through writer handles, `add`, reads by index and in storage order,
//! in-place rewrites, `empty`, and samples (fresh, into a reused batch, through a
//! learner). Many of them are deliberately bad: batches of another spec, batch shapes
//! that do not fit, indices out of range, zero-size and oversized samples. The target
//! checks the indices every extend returns, `len`, `write_count`, the contents of every
//! read, the success and effect of every rewrite, that every sampled row is the model's
//! live row at its index, the epoch contract of sampling without replacement, and that
//! every rejected call returns the error that says why and changes nothing.
//!
//! Sizes are bounded (at most 64 rows, 4 shards, 64 operations) so that a run is quick
//! and a failing input minimizes to a few operations. The only panics are assertion
//! failures on a disagreement.

#![no_main]

use std::sync::Arc;

use arbitrary::{Arbitrary, Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use replaybuf::error::{AccessError, DataError, SampleError};
use replaybuf::reference::ReferenceBuffer;
use replaybuf::sampler::WithoutReplacement;
use replaybuf::{Batch, DType, Key, Learner, ReplayBuffer, Spec, Writer};

/// Rows of an ndim-1 buffer, at most.
const MAX_CAPACITY: usize = 64;
/// Steps of an ndim-2 buffer, at most.
const MAX_GRID_STEPS: usize = 8;
/// Environments of an ndim-2 buffer, at most.
const MAX_ENVS: usize = 6;
/// log2 of the most shards asked for (4).
const MAX_SHARD_BITS: u32 = 2;
/// Operations of one run, at most.
const MAX_OPS: usize = 64;
/// Rows of one ndim-1 extend or rewrite, at most: past the largest ring, so one call
/// can lap it.
const MAX_EXTEND_ROWS: usize = MAX_CAPACITY + 16;
/// Steps of one ndim-2 extend, at most: two laps of the longest ring.
const MAX_EXTEND_STEPS: usize = 2 * MAX_GRID_STEPS;
/// Rows of one sample, at most: twice the largest buffer.
const MAX_SAMPLE_ROWS: usize = 2 * MAX_CAPACITY + 2;
/// Indices of one `get_many`, at most.
const MAX_GET_MANY: usize = 8;
/// The builder's `batch_size`, at most.
const MAX_BATCH_SIZE: usize = 16;
/// Dimensions of an arbitrary batch shape, at most, and the size of each.
const MAX_SHAPE_DIMS: usize = 3;
const MAX_SHAPE_DIM_ROWS: usize = 8;

fn capacity(u: &mut Unstructured) -> ArbResult<usize> {
    u.int_in_range(1..=MAX_CAPACITY)
}

fn grid_steps(u: &mut Unstructured) -> ArbResult<usize> {
    u.int_in_range(1..=MAX_GRID_STEPS)
}

fn envs(u: &mut Unstructured) -> ArbResult<usize> {
    u.int_in_range(1..=MAX_ENVS)
}

fn shard_bits(u: &mut Unstructured) -> ArbResult<u32> {
    u.int_in_range(0..=MAX_SHARD_BITS)
}

fn batch_size(u: &mut Unstructured) -> ArbResult<Option<usize>> {
    Ok(if u.arbitrary()? {
        Some(u.int_in_range(1..=MAX_BATCH_SIZE)?)
    } else {
        None
    })
}

fn extend_rows(u: &mut Unstructured) -> ArbResult<usize> {
    u.int_in_range(0..=MAX_EXTEND_ROWS)
}

fn sample_rows(u: &mut Unstructured) -> ArbResult<usize> {
    u.int_in_range(0..=MAX_SAMPLE_ROWS)
}

/// A storage index: in range or just past it, now and then anything at all.
fn index(u: &mut Unstructured) -> ArbResult<u64> {
    if u.ratio(1, 16)? {
        u.arbitrary()
    } else {
        u.int_in_range(0..=MAX_CAPACITY as u64 + 8)
    }
}

fn indices(u: &mut Unstructured) -> ArbResult<Vec<u64>> {
    let len = u.int_in_range(0..=MAX_GET_MANY)?;
    (0..len).map(|_| index(u)).collect()
}

/// The `end` of a read or rewrite: none, in range or just past it, or huge.
fn end(u: &mut Unstructured) -> ArbResult<Option<usize>> {
    Ok(match u.int_in_range(0..=15u8)? {
        0..=3 => None,
        4 => Some(usize::MAX),
        _ => Some(u.int_in_range(0..=MAX_CAPACITY + 8)?),
    })
}

/// A batch shape of up to three small dimensions: mostly wrong for where it goes.
#[derive(Clone, Debug)]
struct Shape(Vec<usize>);

impl<'a> Arbitrary<'a> for Shape {
    fn arbitrary(u: &mut Unstructured<'a>) -> ArbResult<Self> {
        let dims = u.int_in_range(0..=MAX_SHAPE_DIMS)?;
        (0..dims)
            .map(|_| u.int_in_range(0..=MAX_SHAPE_DIM_ROWS))
            .collect::<ArbResult<_>>()
            .map(Shape)
    }
}

#[derive(Arbitrary, Debug)]
enum Layout {
    /// ndim 1.
    Flat {
        #[arbitrary(with = capacity)]
        capacity: usize,
    },
    /// ndim 2, shape `[steps, envs]`; `env_major` extends take `[envs, t]` batches
    /// (`dim_extend = 1`).
    Grid {
        #[arbitrary(with = grid_steps)]
        steps: usize,
        #[arbitrary(with = envs)]
        envs: usize,
        env_major: bool,
    },
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum SamplerChoice {
    Uniform,
    WithoutReplacement { drop_last: bool, shuffle: bool },
}

#[derive(Arbitrary, Debug)]
struct Setup {
    layout: Layout,
    /// log2 of the shards asked for, lowered to what the layout allows.
    #[arbitrary(with = shard_bits)]
    shard_bits: u32,
    sampler: SamplerChoice,
    #[arbitrary(with = batch_size)]
    batch_size: Option<usize>,
    seed: u64,
}

/// Who writes a batch.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Via {
    /// `ReplayBuffer::extend` / `add`.
    Buffer,
    /// `Writer::extend` / `add` through handle `k % handles`.
    Writer(u8),
}

/// The shape of a batch to extend with.
#[derive(Arbitrary, Debug)]
enum Rows {
    /// `n` rows (ndim 1) or `n % (MAX_EXTEND_STEPS + 1)` steps (ndim 2), in the shape
    /// the writer expects.
    Fit(#[arbitrary(with = extend_rows)] usize),
    /// Any shape.
    Shape(Shape),
}

/// A spec other than the buffer's own `Arc`.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Foreign {
    /// The same fields, built again: accepted everywhere.
    Rebuilt,
    /// The same fields in another order: accepted everywhere.
    Reordered,
    /// A field fewer.
    Missing,
    /// A field more.
    Extra,
    /// A field of another dtype.
    WrongDType,
    /// A field of another per-row shape.
    WrongFieldShape,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Extend {
        via: Via,
        rows: Rows,
        spec: Option<Foreign>,
    },
    /// One row (`[1]`), or a batch of `shape`.
    Add {
        via: Via,
        shape: Option<Shape>,
        spec: Option<Foreign>,
    },
    Get(#[arbitrary(with = index)] u64),
    GetMany(#[arbitrary(with = indices)] Vec<u64>),
    ReadAll(#[arbitrary(with = end)] Option<usize>),
    WriteAll {
        #[arbitrary(with = extend_rows)]
        rows: usize,
        #[arbitrary(with = end)]
        end: Option<usize>,
        spec: Option<Foreign>,
    },
    /// Rewrites the positions, from a batch of `rows` rows (mostly one a position).
    WriteAt {
        #[arbitrary(with = indices)]
        indices: Vec<u64>,
        rows: Option<u8>,
        spec: Option<Foreign>,
    },
    Empty,
    Sample {
        #[arbitrary(with = sample_rows)]
        n: usize,
        learner: bool,
    },
    SampleDefault,
    /// `sample_into` the reused batch.
    SampleInto {
        learner: bool,
    },
    /// Replaces the reused batch by a zeroed one.
    Reuse {
        shape: Shape,
        spec: Option<Foreign>,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    setup: Setup,
    ops: Vec<Op>,
}

/// The fields of the buffer's rows: four dtype widths, a nested key, a padded row.
fn fields() -> Vec<(Key, DType, Vec<usize>)> {
    vec![
        ("id".into(), DType::U64, vec![]),
        ("obs".into(), DType::F32, vec![3]),
        ("flag".into(), DType::Bool, vec![]),
        (("next", "small").into(), DType::I16, vec![2]),
    ]
}

fn build_spec(fields: Vec<(Key, DType, Vec<usize>)>) -> Arc<Spec> {
    let builder = fields
        .into_iter()
        .fold(Spec::builder(), |b, (key, dtype, shape)| {
            b.field(key, dtype, shape)
        });
    Arc::new(builder.build().expect("the fuzz specs are valid"))
}

fn foreign_spec(foreign: Foreign) -> Arc<Spec> {
    let mut fields = fields();
    match foreign {
        Foreign::Rebuilt => {}
        Foreign::Reordered => fields.reverse(),
        Foreign::Missing => {
            fields.remove(2);
        }
        Foreign::Extra => fields.push(("extra".into(), DType::U8, vec![2])),
        Foreign::WrongDType => fields[0].1 = DType::I64,
        Foreign::WrongFieldShape => fields[1].2 = vec![4],
    }
    build_spec(fields)
}

/// The error a write of a `foreign` batch gets, once its shape fits; `None` if the
/// write is accepted.
fn spec_error(foreign: Option<Foreign>) -> Option<DataError> {
    match foreign? {
        Foreign::Rebuilt | Foreign::Reordered => None,
        Foreign::Missing => Some(DataError::MissingField {
            key: Key::from("flag"),
        }),
        Foreign::Extra => Some(DataError::UnknownField {
            key: Key::from("extra"),
        }),
        Foreign::WrongDType => Some(DataError::DType {
            key: Key::from("id"),
            expected: DType::U64,
            found: DType::I64,
        }),
        Foreign::WrongFieldShape => Some(DataError::FieldShape {
            key: Key::from("obs"),
            expected: vec![3],
            found: vec![4],
        }),
    }
}

/// Fills every column of `batch` from its rows' numbers (`first`, `first + 1`, ...):
/// element `e` of row `id` is `8 * id + e`, so any mix-up of rows or fields shows.
fn fill(batch: &mut Batch, first: u64) {
    let spec = batch.spec().clone();
    let ids = first..first + batch.len() as u64;
    for f in spec.fields() {
        let elements = f.elements() as u64;
        let values = ids
            .clone()
            .flat_map(|id| (0..elements).map(move |e| 8 * id + e));
        let set = match f.dtype() {
            DType::U64 => batch.set(f.key(), &values.collect::<Vec<u64>>()),
            DType::I64 => batch.set(f.key(), &values.map(|v| v as i64).collect::<Vec<_>>()),
            DType::F32 => batch.set(f.key(), &values.map(|v| v as f32).collect::<Vec<_>>()),
            DType::I16 => batch.set(f.key(), &values.map(|v| v as i16).collect::<Vec<_>>()),
            DType::U8 => batch.set(f.key(), &values.map(|v| v as u8).collect::<Vec<_>>()),
            DType::Bool => batch.set(f.key(), &values.map(|v| v % 3 == 0).collect::<Vec<_>>()),
            other => unreachable!("the fuzz specs have no {other} field"),
        };
        set.expect("a column takes values of its own dtype and length");
    }
}

/// Checks that every row of `batch` is the model's live row at its index.
fn check_rows(model: &ReferenceBuffer, batch: &Batch) {
    let rows = batch.len();
    assert_eq!(batch.shape(), [rows], "a read batch is flat");
    assert_eq!(batch.index().len(), rows);
    assert_eq!(batch.generations().len(), rows);
    for f in batch.spec().fields() {
        let column = batch
            .column_bytes(f.key())
            .expect("the batch has its own fields");
        assert_eq!(column.len(), rows * f.bytes(), "column `{}`", f.key());
    }
    for (r, &index) in batch.index().iter().enumerate() {
        let stored = model
            .get(index)
            .unwrap_or_else(|| panic!("row {r} came from index {index}, which holds no live row"));
        assert_eq!(model.row_of(batch, r), stored, "row {r} at index {index}");
    }
}

/// What the target knows of the open without-replacement epoch.
#[derive(Debug)]
struct Epoch {
    /// Entries of the epoch: the rows live when it began.
    rows: usize,
    /// Entries handed out so far (a short last batch counts its full request).
    taken: usize,
    /// Indices returned in this epoch, in order.
    seen: Vec<u64>,
    /// No write since the epoch began: it must cover exactly the live rows.
    clean: bool,
}

/// The sampler's contract.
#[derive(Debug)]
enum Sampling {
    Uniform,
    WithoutReplacement(Epochs),
}

impl Sampling {
    /// `empty()` ends the open epoch: the next sample starts a new one.
    fn emptied(&mut self) {
        if let Sampling::WithoutReplacement(epochs) = self {
            epochs.epoch = None;
        }
    }

    /// Some write changed which rows are live.
    fn rows_changed(&mut self) {
        if let Sampling::WithoutReplacement(Epochs {
            epoch: Some(epoch), ..
        }) = self
        {
            epoch.clean = false;
        }
    }

    /// Checks the outcome of a sample of `n` rows against the model.
    fn check(&mut self, model: &ReferenceBuffer, n: usize, got: Result<&Batch, SampleError>) {
        match self {
            Sampling::Uniform => check_uniform(model, n, got),
            Sampling::WithoutReplacement(epochs) => epochs.check(model, n, got),
        }
    }
}

/// Sampling with replacement: `n` live rows, or `Empty`.
fn check_uniform(model: &ReferenceBuffer, n: usize, got: Result<&Batch, SampleError>) {
    let live = model.len();
    match got {
        Ok(batch) => {
            assert!(live > 0, "sample({n}) of an empty buffer");
            assert_eq!(batch.len(), n, "sample({n}) with replacement");
            check_rows(model, batch);
        }
        Err(SampleError::Empty) => assert_eq!(live, 0, "sample({n}): Empty"),
        Err(e) => panic!("sample({n}) of {live} rows with replacement: {e:?}"),
    }
}

/// Sampling without replacement, with the epoch state its outcomes imply.
#[derive(Debug)]
struct Epochs {
    drop_last: bool,
    shuffle: bool,
    /// The open epoch: one begins at the first successful sample after the last ended.
    epoch: Option<Epoch>,
}

impl Epochs {
    /// Checks the outcome of a sample of `n` rows, and moves the epoch on as it says.
    fn check(&mut self, model: &ReferenceBuffer, n: usize, got: Result<&Batch, SampleError>) {
        let live = model.len();
        let Epochs {
            drop_last,
            shuffle,
            ref mut epoch,
        } = *self;
        match got {
            Ok(batch) => {
                let epoch = epoch.get_or_insert_with(|| {
                    assert!(
                        live > 0 && (n <= live || !drop_last),
                        "sample({n}) began an epoch over {live} rows"
                    );
                    Epoch {
                        rows: live,
                        taken: 0,
                        seen: Vec::new(),
                        clean: true,
                    }
                });
                let left = epoch.rows.saturating_sub(epoch.taken);
                assert!(
                    n <= epoch.rows || !drop_last,
                    "sample({n}) of an epoch of {} with drop_last",
                    epoch.rows
                );
                assert!(left > 0, "sample({n}) past the end of the epoch");
                assert!(
                    !drop_last || left >= n,
                    "short batch of {left} with drop_last"
                );
                assert_eq!(batch.len(), n.min(left), "sample({n}) with {left} left");
                epoch.taken += n;
                for &index in batch.index() {
                    assert!(
                        !epoch.seen.contains(&index),
                        "index {index} came twice in one epoch: {:?}",
                        epoch.seen
                    );
                    if !shuffle {
                        assert!(
                            epoch.seen.last().is_none_or(|&last| last < index),
                            "unshuffled epoch out of storage order: {:?} then {index}",
                            epoch.seen
                        );
                    }
                    epoch.seen.push(index);
                }
                check_rows(model, batch);
            }
            Err(SampleError::EpochEnd) => {
                let ended = epoch.take().expect("EpochEnd with no epoch open");
                let left = ended.rows.saturating_sub(ended.taken);
                assert!(
                    left == 0 || (drop_last && left < n),
                    "EpochEnd for sample({n}) with {left} of {} left",
                    ended.rows
                );
                if ended.clean && !drop_last {
                    let mut seen = ended.seen;
                    seen.sort_unstable();
                    let want: Vec<u64> = model.live_rows().iter().map(|&(i, _)| i).collect();
                    assert_eq!(seen, want, "an epoch visits every live row once");
                }
            }
            Err(SampleError::NotEnough {
                requested,
                available,
            }) => {
                assert_eq!(requested, n);
                let rows = epoch.as_ref().map_or(live, |e| e.rows);
                assert!(
                    drop_last && rows > 0 && n > rows,
                    "NotEnough for sample({n}) of {rows}"
                );
                assert_eq!(available, rows);
            }
            Err(SampleError::Empty) => {
                assert!(epoch.is_none(), "Empty with an epoch open");
                assert_eq!(live, 0, "Empty with {live} rows live");
            }
            Err(e) => panic!("sample({n}) without replacement: {e:?}"),
        }
    }
}

/// The buffer, the model, and the handles and state one run drives them with.
struct Harness {
    rb: ReplayBuffer,
    model: ReferenceBuffer,
    /// Writer handles in the order handed out (handle `k` writes shard `k % shards`).
    writers: Vec<Writer>,
    learner: Learner,
    /// The batch `sample_into` reuses.
    reused: Batch,
    /// Whether the reused batch's spec has the buffer's fields.
    reused_fits: bool,
    sampling: Sampling,
    batch_size: Option<usize>,
    /// `Some(env_major)` for ndim 2.
    grid: Option<bool>,
    /// Buffer-level calls that picked a shard round robin.
    round_robin: usize,
    /// The number of the next row written.
    next_id: u64,
}

impl Harness {
    fn new(setup: &Setup) -> Harness {
        let spec = build_spec(fields());
        let shards_for = |limit: usize| (1usize << setup.shard_bits).min(1 << limit.ilog2());
        let builder = ReplayBuffer::builder(spec.clone()).seed(setup.seed);
        let (builder, model, grid) = match setup.layout {
            Layout::Flat { capacity } => {
                let shards = shards_for(capacity);
                (
                    builder.capacity(capacity).shards(shards),
                    ReferenceBuffer::new(spec, capacity, shards),
                    None,
                )
            }
            Layout::Grid {
                steps,
                envs,
                env_major,
            } => {
                let shards = shards_for(envs);
                let builder = builder
                    .capacity(steps * envs)
                    .ndim(2)
                    .envs(envs)
                    .dim_extend(usize::from(env_major))
                    .shards(shards);
                (
                    builder,
                    ReferenceBuffer::grid(spec, steps, envs, shards),
                    Some(env_major),
                )
            }
        };
        let (builder, sampling) = match setup.sampler {
            SamplerChoice::Uniform => (builder, Sampling::Uniform),
            SamplerChoice::WithoutReplacement { drop_last, shuffle } => (
                builder.sampler(
                    WithoutReplacement::new()
                        .drop_last(drop_last)
                        .shuffle(shuffle),
                ),
                Sampling::WithoutReplacement(Epochs {
                    drop_last,
                    shuffle,
                    epoch: None,
                }),
            ),
        };
        let builder = match setup.batch_size {
            Some(n) => builder.batch_size(n),
            None => builder,
        };
        let rb = builder.build().expect("the fuzz setups are valid");
        let shards = rb.shards();
        let writers: Vec<Writer> = (0..2 * shards).map(|_| rb.writer()).collect();
        for (k, w) in writers.iter().enumerate() {
            assert_eq!(w.shard(), k % shards, "writer handle {k}");
        }
        Harness {
            learner: rb.learner(),
            reused: rb.batch([0]),
            reused_fits: true,
            rb,
            model,
            writers,
            sampling,
            batch_size: setup.batch_size,
            grid,
            round_robin: 0,
            next_id: 0,
        }
    }

    fn spec(&self, foreign: Option<Foreign>) -> Arc<Spec> {
        foreign.map_or_else(|| self.rb.spec().clone(), foreign_spec)
    }

    /// A batch of `shape` of `spec`, filled with fresh row numbers.
    fn batch(&mut self, spec: Arc<Spec>, shape: &[usize]) -> Batch {
        let mut batch = Batch::zeros(spec, shape);
        fill(&mut batch, self.next_id);
        self.next_id += batch.len() as u64;
        batch
    }

    fn writer(&self, k: u8) -> &Writer {
        &self.writers[usize::from(k) % self.writers.len()]
    }

    /// The shard of the next buffer-level ndim-1 write. The buffer validates a batch
    /// before it takes its turn, so only an accepted write moves the turn on.
    fn next_shard(&mut self) -> usize {
        let k = self.round_robin % self.rb.shards();
        self.round_robin += 1;
        k
    }

    /// Environments on the env axis of a batch written through `via` (ndim 2).
    fn width(&self, via: Via) -> usize {
        match via {
            Via::Buffer => self.rb.envs(),
            Via::Writer(k) => self
                .writer(k)
                .envs()
                .expect("an ndim-2 writer owns environments")
                .len(),
        }
    }

    /// The steps a batch of `shape` appends through `via`, or `None` if it does not fit.
    fn steps_in(&self, via: Via, shape: &[usize]) -> Option<usize> {
        match (self.grid, shape) {
            (None, &[n]) => Some(n),
            (Some(env_major), &[a, b]) => {
                let (t, e) = if env_major { (b, a) } else { (a, b) };
                (e == self.width(via)).then_some(t)
            }
            _ => None,
        }
    }

    fn extend(&mut self, via: Via, rows: &Rows, foreign: Option<Foreign>) {
        let shape = match (rows, self.grid) {
            (Rows::Fit(n), None) => vec![*n],
            (Rows::Fit(n), Some(env_major)) => {
                let (t, width) = (n % (MAX_EXTEND_STEPS + 1), self.width(via));
                if env_major {
                    vec![width, t]
                } else {
                    vec![t, width]
                }
            }
            (Rows::Shape(shape), _) => shape.0.clone(),
        };
        let batch = self.batch(self.spec(foreign), &shape);
        let got = match via {
            Via::Buffer => self.rb.extend(&batch),
            Via::Writer(k) => self.writer(k).extend(&batch),
        };
        let Some(steps) = self.steps_in(via, &shape) else {
            return expect_bad_shape(got.map(|w| w.to_vec()), &shape);
        };
        if let Some(want) = spec_error(foreign) {
            return assert_eq!(got.map(|w| w.to_vec()), Err(want), "extend of {shape:?}");
        }
        let written = got.unwrap_or_else(|e| panic!("extend of {shape:?} via {via:?}: {e:?}"));
        assert_eq!(written.len(), batch.len());
        let shard = match (via, self.grid) {
            (Via::Buffer, None) => Some(self.next_shard()),
            (Via::Buffer, Some(_)) => None,
            (Via::Writer(k), _) => Some(self.writer(k).shard()),
        };
        let want = match (self.grid, shard) {
            (None, Some(k)) => self.model.extend(k, &batch),
            (Some(env_major), None) => self.model.extend_grid(&batch, env_major),
            (Some(env_major), Some(k)) => {
                let width = self.width(via);
                self.extend_group(k, steps, width, env_major, &batch)
            }
            (None, None) => unreachable!("an ndim-1 write goes to one shard"),
        };
        assert_eq!(written.to_vec(), want, "extend of {shape:?} via {via:?}");
        self.sampling.rows_changed();
    }

    /// Appends `steps` steps of the `width` environments of shard `k` to the model from
    /// `batch` (`[steps, width]`, or `[width, steps]` when `env_major`); returns the
    /// indices in batch row order.
    fn extend_group(
        &mut self,
        k: usize,
        steps: usize,
        width: usize,
        env_major: bool,
        batch: &Batch,
    ) -> Vec<u64> {
        let row = |j: usize, lane: usize| {
            if env_major {
                lane * steps + j
            } else {
                j * width + lane
            }
        };
        let data: Vec<Vec<u8>> = (0..batch.len())
            .map(|r| self.model.row_of(batch, r))
            .collect();
        let at = self
            .model
            .append(k, steps, |j, lane| data[row(j, lane)].clone());
        let mut indices = vec![0; batch.len()];
        for j in 0..steps {
            for lane in 0..width {
                indices[row(j, lane)] = at[j * width + lane];
            }
        }
        indices
    }

    fn add(&mut self, via: Via, shape: Option<&Shape>, foreign: Option<Foreign>) {
        let shape = shape.map_or(vec![1], |s| s.0.clone());
        let row = self.batch(self.spec(foreign), &shape);
        let got = match via {
            Via::Buffer => self.rb.add(&row),
            Via::Writer(k) => self.writer(k).add(&row),
        };
        if self.grid.is_some() || shape != [1] {
            return expect_bad_shape(got, &shape);
        }
        if let Some(want) = spec_error(foreign) {
            return assert_eq!(got, Err(want), "add");
        }
        let shard = match via {
            Via::Buffer => self.next_shard(),
            Via::Writer(k) => self.writer(k).shard(),
        };
        assert_eq!(
            got.map(|i| vec![i]),
            Ok(self.model.extend(shard, &row)),
            "add"
        );
        self.sampling.rows_changed();
    }

    /// The error `get_many(indices)` must return: the first index out of range or
    /// holding no live row.
    fn access_error(&self, indices: &[u64]) -> Option<AccessError> {
        let capacity = self.rb.capacity() as u64;
        indices.iter().find_map(|&index| {
            if index >= capacity {
                Some(AccessError::OutOfRange { index, capacity })
            } else if self.model.get(index).is_none() {
                Some(AccessError::NotWritten { index })
            } else {
                None
            }
        })
    }

    fn get_many(&self, indices: &[u64], got: Result<Batch, AccessError>) {
        match (got, self.access_error(indices)) {
            (Ok(batch), None) => {
                assert_eq!(batch.index(), indices);
                check_rows(&self.model, &batch);
            }
            (Err(e), Some(want)) => assert_eq!(e, want, "get_many({indices:?})"),
            (got, want) => panic!("get_many({indices:?}): buffer {got:?}, model {want:?}"),
        }
    }

    fn read_all(&self, end: Option<usize>) {
        let got = self.rb.read_all_in_order(end);
        let want: Vec<u64> = self
            .model
            .read_all_in_order(end)
            .iter()
            .map(|&(i, _)| i)
            .collect();
        assert_eq!(got.index(), want, "read_all_in_order({end:?})");
        check_rows(&self.model, &got);
    }

    fn write_all(&mut self, rows: usize, end: Option<usize>, foreign: Option<Foreign>) {
        let data = self.batch(self.spec(foreign), &[rows]);
        let got = self.rb.write_all(&data, end);
        let bad_spec = spec_error(foreign);
        if bad_spec.is_none() {
            let accepted = self.model.write_all(&data, end);
            assert_eq!(
                got.is_ok(),
                accepted,
                "write_all({end:?}) of {rows}: {got:?}"
            );
        }
        let Err(err) = got else {
            return assert!(bad_spec.is_none(), "write_all of a batch of another spec");
        };
        // Several reasons may apply; any of them may be the one reported.
        let end = end.unwrap_or(rows);
        let capacity = self.rb.capacity();
        let applies = match &err {
            AccessError::Data(DataError::BatchShape { .. }) => end > rows,
            AccessError::Data(e) => Some(e) == bad_spec.as_ref(),
            AccessError::OutOfRange {
                index,
                capacity: reported,
            } => end > capacity && *index == end as u64 - 1 && *reported == capacity as u64,
            AccessError::NotWritten { index } => {
                *index < end as u64
                    && self.access_error(&[*index])
                        == Some(AccessError::NotWritten { index: *index })
            }
            // The fuzzed buffers have no frames, and no slice sampler.
            AccessError::FramesRewrite | AccessError::TrajectoryRewrite { .. } => false,
        };
        assert!(applies, "write_all(end {end}) of {rows} rows: {err:?}");
    }

    fn write_at(&mut self, indices: &[u64], rows: Option<usize>, foreign: Option<Foreign>) {
        let rows = rows.unwrap_or(indices.len());
        let data = self.batch(self.spec(foreign), &[rows]);
        let got = self.rb.write_at(indices, &data);
        let bad_spec = spec_error(foreign);
        if bad_spec.is_none() {
            let accepted = self.model.write_at(indices, &data);
            assert_eq!(
                got.is_ok(),
                accepted,
                "write_at({indices:?}) of {rows}: {got:?}"
            );
        }
        let Err(err) = got else {
            return assert!(bad_spec.is_none(), "write_at of a batch of another spec");
        };
        // Several reasons may apply; any of them may be the one reported.
        let applies = match &err {
            AccessError::Data(DataError::BatchShape { .. }) => rows != indices.len(),
            AccessError::Data(e) => Some(e) == bad_spec.as_ref(),
            AccessError::OutOfRange { .. } | AccessError::NotWritten { .. } => {
                self.access_error(indices).as_ref() == Some(&err)
            }
            // The fuzzed buffers have no frames, and no slice sampler.
            AccessError::FramesRewrite | AccessError::TrajectoryRewrite { .. } => false,
        };
        assert!(applies, "write_at({indices:?}) of {rows} rows: {err:?}");
    }

    fn sample(&mut self, n: usize, learner: bool) {
        let got = if learner {
            self.learner.sample(n)
        } else {
            self.rb.sample(n)
        };
        self.sampling
            .check(&self.model, n, got.as_ref().map_err(Clone::clone));
    }

    fn sample_default(&mut self) {
        let got = self.rb.sample_default();
        match self.batch_size {
            Some(n) => self
                .sampling
                .check(&self.model, n, got.as_ref().map_err(Clone::clone)),
            None => assert_eq!(got.unwrap_err(), SampleError::NoBatchSize),
        }
    }

    fn sample_into(&mut self, learner: bool) {
        let before = self.reused.shape().to_vec();
        let n = self.batch_size.unwrap_or(self.reused.len());
        let got = if learner {
            self.learner.sample_into(&mut self.reused)
        } else {
            self.rb.sample_into(&mut self.reused)
        };
        let no_size = n == 0 && self.batch_size.is_none();
        match got {
            Err(SampleError::NoBatchSize) => assert!(no_size, "NoBatchSize for {before:?}"),
            Err(SampleError::SpecMismatch) => assert!(!self.reused_fits, "SpecMismatch"),
            _ if no_size || !self.reused_fits => {
                panic!(
                    "sample_into a batch of {before:?} that fits {}: {got:?}",
                    self.reused_fits
                )
            }
            got => {
                let ok = got.is_ok();
                self.sampling
                    .check(&self.model, n, got.map(|()| &self.reused));
                if !ok {
                    assert_eq!(
                        self.reused.shape(),
                        before,
                        "a failed sample_into kept its batch"
                    );
                }
            }
        }
    }

    fn check_state(&self) {
        assert_eq!(self.rb.len(), self.model.len(), "len");
        assert_eq!(
            self.rb.write_count(),
            self.model.write_count(),
            "write_count"
        );
        self.read_all(None);
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::Extend { via, rows, spec } => self.extend(*via, rows, *spec),
            Op::Add { via, shape, spec } => self.add(*via, shape.as_ref(), *spec),
            Op::Get(index) => self.get_many(&[*index], self.rb.get(*index)),
            Op::GetMany(indices) => self.get_many(indices, self.rb.get_many(indices)),
            Op::ReadAll(end) => self.read_all(*end),
            Op::WriteAll { rows, end, spec } => self.write_all(*rows, *end, *spec),
            Op::WriteAt {
                indices,
                rows,
                spec,
            } => self.write_at(indices, rows.map(usize::from), *spec),
            Op::Empty => {
                self.rb.clear().expect("a round-robin buffer clears");
                self.model.clear();
                self.sampling.emptied();
            }
            Op::Sample { n, learner } => self.sample(*n, *learner),
            Op::SampleDefault => self.sample_default(),
            Op::SampleInto { learner } => self.sample_into(*learner),
            Op::Reuse { shape, spec } => {
                self.reused = Batch::zeros(self.spec(*spec), &shape.0);
                self.reused_fits = spec_error(*spec).is_none();
            }
        }
        self.check_state();
    }
}

/// Checks that a write of a batch of `shape` that does not fit was rejected for its
/// shape.
fn expect_bad_shape<T: std::fmt::Debug>(got: Result<T, DataError>, shape: &[usize]) {
    match got {
        Err(DataError::BatchShape { found, .. }) => assert_eq!(found, shape),
        got => panic!("a batch of shape {shape:?} that does not fit: {got:?}"),
    }
}

fuzz_target!(|input: Input| {
    let mut harness = Harness::new(&input.setup);
    for op in input.ops.iter().take(MAX_OPS) {
        harness.run(op);
    }
});
