//! A columnar batch: what collectors write and what learners get back.
//!
//! Each field of the spec is one contiguous column of shape `[..batch shape, ..field
//! shape]`, readable as a typed slice without copying. A sampled batch also carries the
//! storage `index` of every row (and its write `generation`). A [`Destination`] is
//! the same columns in memory the caller owns, for a sample written in place.
//!
//! Layer: algos.

use std::ptr::NonNull;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::dtype::{DType, Element};
use crate::error::{DataError, SampleError};
use crate::key::KeyLike;
use crate::sampler::slice::{Marks, SliceWindow};
use crate::spec::{Field, Spec};
use crate::storage::lanes::LaneView;
use crate::storage::shard::Window;
use crate::storage::{Draw, Located};

/// What every sampled batch says of its rows, one definition each: a batch type with
/// fields `index: Vec<u64>`, `generation: Vec<u64>` and `weight: Option<Vec<f32>>`
/// names the accessors it offers (`Batch`, `TypedBatch`, `ListBatch`).
macro_rules! draw_accessors {
    ($($name:ident),* $(,)?) => {
        $($crate::batch::draw_accessors!(@ $name);)*
    };
    (@ index) => {
        /// The storage index of every row (sampled batches; empty otherwise):
        /// [`PADDING_INDEX`](crate::batch::PADDING_INDEX) for a padding row after a
        /// short slice, which a priority update skips.
        pub fn index(&self) -> &[u64] {
            &self.index
        }
    };
    (@ generations) => {
        /// The write generation of every row (sampled batches): the stamp the row had
        /// when it was read. A later write to the same index has a different
        /// generation.
        pub fn generations(&self) -> &[u64] {
            &self.generation
        }
    };
    (@ weight) => {
        /// The importance weight of every row, when sampled by a prioritized sampler:
        /// `(N * P(i))^-beta`, normalised by the largest weight of any stored row.
        pub fn weight(&self) -> Option<&[f32]> {
            self.weight.as_deref()
        }
    };
}

pub(crate) use draw_accessors;

/// The storage index of a padding row (after a short slice, `strict_length(false)`):
/// no row's. A priority update skips rows of this index, so that a padded batch's
/// indices, generations and priorities go back whole.
pub const PADDING_INDEX: u64 = u64::MAX;

/// One field's values for every row of a batch, 8-byte aligned so that any element
/// type can be viewed in place; or, inside [`Batch::borrowing`], the caller's bytes.
#[derive(Debug, Default)]
pub(crate) struct Column {
    words: Vec<u64>,
    bytes: usize,
    /// The caller's bytes, aligned for the field's dtype, in a batch that
    /// [`Batch::borrowing`] lends for one call; `words` is empty then.
    borrowed: Option<NonNull<u8>>,
}

// SAFETY: a borrowed column is a `&[u8]` of the caller's, which is `Send` and `Sync`;
// `Batch::borrowing` keeps that borrow alive for as long as the batch lives.
unsafe impl Send for Column {}
// SAFETY: as above.
unsafe impl Sync for Column {}

impl Column {
    fn zeros(bytes: usize) -> Column {
        Column {
            words: vec![0; bytes.div_ceil(8)],
            bytes,
            borrowed: None,
        }
    }

    /// [`Column::zeros`], or `None` where the allocator cannot give the bytes.
    fn try_zeros(bytes: usize) -> Option<Column> {
        let len = bytes.div_ceil(8);
        let words = match std::alloc::Layout::array::<u64>(len).ok()? {
            layout if layout.size() == 0 => Vec::new(),
            layout => {
                // Zeroed by the allocator, as `vec![0; len]` is (pages the kernel
                // backs as they are first touched), but failing with null.
                // SAFETY: the layout's size is not zero.
                let words = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
                if words.is_null() {
                    return None;
                }
                // SAFETY: `words` comes from the global allocator with the layout of
                // `len` u64s, every one of them zero, a valid u64.
                unsafe { Vec::from_raw_parts(words, len, len) }
            }
        };
        Some(Column {
            words,
            bytes,
            borrowed: None,
        })
    }

    /// Resizes to `bytes`, reusing the allocation when it is large enough.
    fn resize(&mut self, bytes: usize) {
        self.own();
        self.words.resize(bytes.div_ceil(8), 0);
        self.bytes = bytes;
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self.borrowed {
            // SAFETY: `Batch::borrowing` made this from a live `&[u8]` of `bytes` bytes
            // that outlives the batch.
            Some(ptr) => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), self.bytes) },
            None => &bytemuck::cast_slice(&self.words)[..self.bytes],
        }
    }

    pub(crate) fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.own();
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.bytes]
    }

    /// Copies borrowed bytes into words of its own: the caller's are read-only.
    fn own(&mut self) {
        if self.borrowed.is_some() {
            *self = self.clone();
        }
    }
}

impl<'a> From<&'a mut Column> for &'a mut [u8] {
    fn from(column: &'a mut Column) -> &'a mut [u8] {
        column.as_bytes_mut()
    }
}

impl Clone for Column {
    /// A copy that owns its bytes, borrowed or not: a clone may outlive the borrow.
    fn clone(&self) -> Column {
        let mut words = vec![0u64; self.bytes.div_ceil(8)];
        bytemuck::cast_slice_mut(&mut words)[..self.bytes].copy_from_slice(self.as_bytes());
        Column {
            words,
            bytes: self.bytes,
            borrowed: None,
        }
    }
}

impl PartialEq for Column {
    fn eq(&self, other: &Column) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

/// Reusable scratch of the sampling path, kept inside a batch (and a learner, for
/// `sample_to`) so that a sample allocates nothing once warm.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scratch {
    pub(crate) windows: Vec<Window>,
    pub(crate) draws: Vec<Draw>,
    /// Where each draw's row lies, worked out once a batch (`Core::gather`).
    pub(crate) located: Vec<Located>,
    /// Slice sampling: every lane's snapshot, and their running trajectory counts.
    pub(crate) lanes: Vec<LaneView>,
    pub(crate) cumulative: Vec<u64>,
    /// Slice sampling: the batch's windows.
    pub(crate) slices: Vec<SliceWindow>,
}

impl Scratch {
    /// Room for the draws of a sample of `rows` rows, or [`SampleError::TooLarge`]
    /// where the allocator cannot give it: a sample's size is the caller's to choose,
    /// and one past memory is refused rather than aborting the process.
    pub(crate) fn room(&mut self, rows: usize) -> Result<(), SampleError> {
        room(&mut self.draws, rows, rows)?;
        room(&mut self.located, rows, rows)
    }
}

/// Reserves room for `len` items in `items`, a sample of `rows` rows' part.
pub(crate) fn room<T>(items: &mut Vec<T>, len: usize, rows: usize) -> Result<(), SampleError> {
    items
        .try_reserve(len.saturating_sub(items.len()))
        .map_err(|_| SampleError::TooLarge { rows })
}

/// Each column's bytes in a batch of `shape` of `spec`, or `None` where they (or
/// all of them together) overflow the address space.
fn column_sizes(spec: &Spec, shape: &[usize]) -> Option<Vec<usize>> {
    let rows = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    rows.checked_mul(spec.row_bytes())
        .filter(|&total| total <= isize::MAX as usize)?;
    Some(spec.fields().iter().map(|f| rows * f.bytes()).collect())
}

/// The parts of a batch the sampling path fills, borrowed apart.
pub(crate) struct BatchParts<'a> {
    pub(crate) columns: &'a mut [Column],
    pub(crate) index: &'a mut [u64],
    pub(crate) generation: &'a mut [u64],
    pub(crate) weight: Option<&'a mut [f32]>,
    pub(crate) marks: Option<&'a mut [Marks]>,
}

/// A typed view of one column, with its full shape.
#[derive(Clone, Copy, Debug)]
pub struct View<'a, T> {
    /// The values, row after row.
    pub data: &'a [T],
    /// `[..batch shape, ..field shape]`.
    pub shape: &'a [usize],
}

/// A batch of transitions, stored column by column.
///
/// ```
/// use replaybuf::{Batch, DType, Spec};
///
/// let spec = Spec::builder()
///     .field("obs", DType::F32, [3])
///     .field("done", DType::Bool, [])
///     .build()?;
/// let mut batch = Batch::zeros(spec, [2]);
/// batch.set("obs", &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
/// batch.column_mut::<bool>("done")?[1] = true;
/// assert_eq!(batch.column::<f32>("obs")?[3], 4.0);
/// assert_eq!(batch.view::<f32>("obs")?.shape, &[2, 3]);
/// assert!(batch.column::<i64>("obs").is_err()); // wrong dtype
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Batch {
    spec: Arc<Spec>,
    /// The batch shape: `[n]`, or `[t, E]` / `[E, t]` for a multi-environment extend.
    shape: Vec<usize>,
    /// One column per spec field, in declared order.
    columns: Vec<Column>,
    /// `[..shape, ..field shape]` of every column, kept for views.
    full_shapes: Vec<Vec<usize>>,
    index: Vec<u64>,
    generation: Vec<u64>,
    /// Importance weights, when sampled by a prioritized sampler.
    weight: Option<Vec<f32>>,
    /// Per-row marks, when sampled by a slice sampler.
    marks: Option<Vec<Marks>>,
    scratch: Scratch,
}

impl Batch {
    /// A batch of zeroes with the given batch shape (`[n]`, or `[t, E]`).
    ///
    /// # Panics
    ///
    /// If the batch's bytes overflow the address space (as `vec!` does); where
    /// memory cannot hold them, the allocator aborts.
    pub fn zeros(spec: impl Into<Arc<Spec>>, shape: impl AsRef<[usize]>) -> Batch {
        let spec = spec.into();
        let shape = shape.as_ref().to_vec();
        let Some(bytes) = column_sizes(&spec, &shape) else {
            panic!(
                "a batch of shape {shape:?} of {}-byte rows overflows the address space",
                spec.row_bytes()
            )
        };
        let columns = bytes.into_iter().map(Column::zeros).collect();
        Batch::with_columns(spec, shape, columns)
    }

    /// [`Batch::zeros`], or `None` where the bytes overflow the address space or the
    /// allocator cannot give them: for a batch whose size comes from the data, which
    /// is refused rather than aborting the process.
    pub(crate) fn try_zeros(spec: Arc<Spec>, shape: &[usize]) -> Option<Batch> {
        let columns = column_sizes(&spec, shape)?
            .into_iter()
            .map(Column::try_zeros)
            .collect::<Option<_>>()?;
        Some(Batch::with_columns(spec, shape.to_vec(), columns))
    }

    fn with_columns(spec: Arc<Spec>, shape: Vec<usize>, columns: Vec<Column>) -> Batch {
        let mut batch = Batch {
            full_shapes: Vec::new(),
            spec,
            shape,
            columns,
            index: Vec::new(),
            generation: Vec::new(),
            weight: None,
            marks: None,
            scratch: Scratch::default(),
        };
        batch.refresh_shapes();
        batch
    }

    /// Runs `f` with a batch of `shape` whose columns are `columns` themselves, not
    /// copies: one byte slice per field of `spec`, in its order, each `rows * field
    /// bytes` long (row-major, elements in native byte order). What a binding that
    /// holds its data elsewhere (numpy arrays, a tensor's memory) extends from, with
    /// one copy, into the storage. A column not aligned for its dtype is copied. A
    /// clone of the batch owns its bytes.
    ///
    /// ```
    /// use replaybuf::{Batch, DType, ReplayBuffer, Spec};
    ///
    /// let spec = Spec::builder().field("x", DType::U16, [2]).build()?;
    /// let rb = ReplayBuffer::builder(spec).capacity(8).build()?;
    /// let x: Vec<u16> = vec![1, 2, 3, 4];
    /// let written = Batch::borrowing(rb.spec().clone(), [2], &[bytemuck::cast_slice(&x)], |b| {
    ///     rb.extend(b)
    /// })??;
    /// assert_eq!(written.len(), 2);
    /// assert_eq!(rb.get(1)?.column::<u16>("x")?, &[3, 4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn borrowing<R>(
        spec: impl Into<Arc<Spec>>,
        shape: impl AsRef<[usize]>,
        columns: &[&[u8]],
        f: impl FnOnce(&Batch) -> R,
    ) -> Result<R, DataError> {
        let spec = spec.into();
        let shape = shape.as_ref().to_vec();
        if columns.len() != spec.fields().len() {
            return Err(DataError::ColumnCount {
                expected: spec.fields().len(),
                found: columns.len(),
            });
        }
        // Bytes past the address space: no slice holds them.
        let sizes = column_sizes(&spec, &shape).ok_or_else(|| DataError::BatchShape {
            expected: "a shape whose rows fit in memory",
            found: shape.clone(),
        })?;
        let mut owned = Vec::with_capacity(columns.len());
        for ((f, data), bytes) in spec.fields().iter().zip(columns).zip(sizes) {
            if data.len() != bytes {
                return Err(DataError::ColumnBytes {
                    key: f.key().clone(),
                    expected: bytes,
                    found: data.len(),
                });
            }
            let aligned = (data.as_ptr() as usize).is_multiple_of(f.dtype().size());
            owned.push(if aligned {
                Column {
                    words: Vec::new(),
                    bytes,
                    borrowed: NonNull::new(data.as_ptr().cast_mut()),
                }
            } else {
                let mut c = Column::zeros(bytes);
                c.as_bytes_mut().copy_from_slice(data);
                c
            });
        }
        let mut batch = Batch {
            full_shapes: Vec::new(),
            spec,
            shape,
            columns: owned,
            index: Vec::new(),
            generation: Vec::new(),
            weight: None,
            marks: None,
            scratch: Scratch::default(),
        };
        batch.refresh_shapes();
        // The borrowed columns live in `batch`, which `f` only sees by reference and
        // which is dropped here, inside the borrow of `columns`.
        Ok(f(&batch))
    }

    fn refresh_shapes(&mut self) {
        let (spec, shape) = (&self.spec, &self.shape);
        self.full_shapes.resize(spec.fields().len(), Vec::new());
        for (full, f) in self.full_shapes.iter_mut().zip(spec.fields()) {
            full.clear();
            full.extend_from_slice(shape);
            full.extend_from_slice(f.shape());
        }
    }

    /// The spec of the rows.
    pub fn spec(&self) -> &Arc<Spec> {
        &self.spec
    }

    /// The batch shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Rows in the batch (the product of the batch shape).
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the batch holds no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn find(&self, key: impl KeyLike) -> Result<(usize, &Field), DataError> {
        self.spec
            .field(&key)
            .ok_or_else(|| DataError::UnknownField { key: key.to_key() })
    }

    fn typed<T: Element>(field: &Field) -> Result<(), DataError> {
        if field.dtype() == T::DTYPE {
            Ok(())
        } else {
            Err(DataError::DType {
                key: field.key().clone(),
                expected: field.dtype(),
                found: T::DTYPE,
            })
        }
    }

    /// The column of `key` as a typed slice. Fails if the field does not exist or has
    /// another dtype.
    pub fn column<T: Element>(&self, key: impl KeyLike) -> Result<&[T], DataError> {
        let (i, field) = self.find(key)?;
        Self::typed::<T>(field)?;
        bytemuck::checked::try_cast_slice(self.columns[i].as_bytes()).map_err(|_| {
            DataError::InvalidBool {
                key: field.key().clone(),
            }
        })
    }

    /// The column of `key` as a mutable typed slice.
    pub fn column_mut<T: Element>(&mut self, key: impl KeyLike) -> Result<&mut [T], DataError> {
        let (i, field) = self.find(key)?;
        Self::typed::<T>(field)?;
        let key = field.key().clone();
        bytemuck::checked::try_cast_slice_mut(self.columns[i].as_bytes_mut())
            .map_err(|_| DataError::InvalidBool { key })
    }

    /// The column of `key` with its full shape `[..batch shape, ..field shape]`.
    pub fn view<T: Element>(&self, key: impl KeyLike) -> Result<View<'_, T>, DataError> {
        let (i, _) = self.find(&key)?;
        Ok(View {
            data: self.column(&key)?,
            shape: &self.full_shapes[i],
        })
    }

    /// The raw bytes of a column, whatever its dtype.
    pub fn column_bytes(&self, key: impl KeyLike) -> Result<&[u8], DataError> {
        let (i, _) = self.find(key)?;
        Ok(self.columns[i].as_bytes())
    }

    /// The dtype of a column.
    pub fn dtype(&self, key: impl KeyLike) -> Result<DType, DataError> {
        Ok(self.find(key)?.1.dtype())
    }

    /// Copies `values` into the column of `key`; they must fill it exactly.
    pub fn set<T: Element>(&mut self, key: impl KeyLike, values: &[T]) -> Result<(), DataError> {
        let (i, field) = self.find(key)?;
        Self::typed::<T>(field)?;
        let expected = self.len() * field.elements();
        if values.len() != expected {
            return Err(DataError::Length {
                key: field.key().clone(),
                expected,
                found: values.len(),
            });
        }
        self.columns[i]
            .as_bytes_mut()
            .copy_from_slice(bytemuck::cast_slice(values));
        Ok(())
    }

    draw_accessors!(index, generations, weight);

    /// The marks of every row, when sampled by a slice sampler: which rows are
    /// padding, and where trajectories start, end or are cut off. Row `s * slice_len +
    /// t` is step `t` of slice `s`.
    pub fn marks(&self) -> Option<&[Marks]> {
        self.marks.as_deref()
    }

    /// Turns this batch into one of `rows` rows of `spec` with shape `[rows]`, keeping
    /// its allocations; the contents are whatever the next writer puts there. With
    /// `weighted`, it also keeps a weight per row.
    pub(crate) fn reshape_for_sample(&mut self, rows: usize, weighted: bool) {
        match (&mut self.weight, weighted) {
            (Some(w), true) => w.resize(rows, 0.0),
            (w, true) => *w = Some(vec![0.0; rows]),
            (w, false) => *w = None,
        }
        self.marks = None;
        self.reshape(&[rows]);
    }

    /// Makes room for a sample of `rows` rows (with a weight each when `weighted`) and
    /// its draws, writing nothing, or refuses it as [`SampleError::TooLarge`]: called
    /// before a sample is counted or drawn, so that one past memory fails cleanly.
    pub(crate) fn room_for_sample(
        &mut self,
        rows: usize,
        weighted: bool,
    ) -> Result<(), SampleError> {
        for (c, f) in self.columns.iter_mut().zip(self.spec.fields()) {
            let bytes = rows
                .checked_mul(f.bytes())
                .ok_or(SampleError::TooLarge { rows })?;
            c.own();
            room(&mut c.words, bytes.div_ceil(8), rows)?;
        }
        room(&mut self.index, rows, rows)?;
        room(&mut self.generation, rows, rows)?;
        if weighted {
            room(self.weight.get_or_insert_with(Vec::new), rows, rows)?;
        }
        self.scratch.room(rows)
    }

    /// Turns this batch into a slice batch of shape `[slices, len]` (see
    /// [`Batch::reshape_for_sample`]), with marks.
    pub(crate) fn reshape_for_slices(&mut self, slices: usize, len: usize, weighted: bool) {
        let rows = slices * len;
        match (&mut self.weight, weighted) {
            (Some(w), true) => w.resize(rows, 0.0),
            (w, true) => *w = Some(vec![0.0; rows]),
            (w, false) => *w = None,
        }
        match &mut self.marks {
            Some(m) => m.resize(rows, Marks::default()),
            m => *m = Some(vec![Marks::default(); rows]),
        }
        self.reshape(&[slices, len]);
    }

    fn reshape(&mut self, shape: &[usize]) {
        let rows = shape.iter().product::<usize>();
        if self.shape != shape {
            self.shape.clear();
            self.shape.extend_from_slice(shape);
            for (c, f) in self.columns.iter_mut().zip(self.spec.fields()) {
                c.resize(rows * f.bytes());
            }
            self.refresh_shapes();
        }
        self.index.resize(rows, 0);
        self.generation.resize(rows, 0);
    }

    pub(crate) fn columns(&self) -> &[Column] {
        &self.columns
    }

    pub(crate) fn parts_mut(&mut self) -> BatchParts<'_> {
        BatchParts {
            columns: &mut self.columns,
            index: &mut self.index,
            generation: &mut self.generation,
            weight: self.weight.as_deref_mut(),
            marks: self.marks.as_deref_mut(),
        }
    }

    pub(crate) fn scratch_mut(&mut self) -> &mut Scratch {
        &mut self.scratch
    }

    /// Checks that this batch can be written to a storage of `spec`, and returns, for
    /// each field of `spec`, the column of this batch that holds it.
    pub(crate) fn columns_for(&self, spec: &Spec) -> Result<SmallVec<[usize; 8]>, DataError> {
        columns_for(&self.spec, spec)
    }
}

/// Caller-owned memory one sample is written into: a byte slice per spec field, in the
/// spec's field order, each room for `rows * field.bytes()` bytes (row-major, the
/// field's elements in native byte order), plus `rows` of index and generation, and,
/// for prioritized samplers, `rows` of weight; slice samplers also write `rows` marks.
///
/// [`Learner::sample_to`](crate::Learner::sample_to) writes here directly: no
/// intermediate [`Batch`], and no allocation once the learner is warm.
///
/// ```
/// use replaybuf::{DType, Destination, ReplayBuffer, Spec};
///
/// let spec = Spec::builder()
///     .field("obs", DType::F32, [3])
///     .field("done", DType::Bool, [])
///     .build()?;
/// let rb = ReplayBuffer::builder(spec).capacity(100).seed(0).build()?;
/// rb.extend(&rb.batch([10]))?;
///
/// // Memory the caller owns (numpy arrays', pinned host memory, ...).
/// let (mut obs, mut done) = (vec![0u8; 4 * 12], vec![0u8; 4]);
/// let (mut index, mut generation) = ([0u64; 4], [0u64; 4]);
/// let spec = rb.spec().clone();
/// let mut dest = Destination::new(
///     &spec,
///     4,
///     [&mut obs[..], &mut done[..]],
///     &mut index,
///     &mut generation,
/// )?;
/// let mut learner = rb.learner();
/// assert_eq!(learner.sample_to(&mut dest)?, 4);
/// drop(dest); // the memory is the caller's again
/// assert!(index.iter().all(|&i| i < 10));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Destination<'a> {
    /// The spec the columns were checked against: a sample pairs its fields with the
    /// storage's by key, or refuses a storage of other fields.
    pub(crate) spec: &'a Spec,
    pub(crate) rows: usize,
    /// Column `i` holds field `i` of `spec`: exactly `rows * bytes()` bytes.
    pub(crate) columns: SmallVec<[&'a mut [u8]; 8]>,
    /// Exactly `rows` entries each, as are `weight` and `marks` when given.
    pub(crate) index: &'a mut [u64],
    pub(crate) generation: &'a mut [u64],
    pub(crate) weight: Option<&'a mut [f32]>,
    pub(crate) marks: Option<&'a mut [Marks]>,
}

impl<'a> Destination<'a> {
    /// Room for `rows` rows of `spec`: `columns` holds one byte slice per field of
    /// `spec`, in its order, of `rows * field.bytes()` bytes; `index` and `generation`
    /// hold `rows` entries. A wrong count of columns or a wrong length is refused.
    pub fn new(
        spec: &'a Spec,
        rows: usize,
        columns: impl IntoIterator<Item = &'a mut [u8]>,
        index: &'a mut [u64],
        generation: &'a mut [u64],
    ) -> Result<Destination<'a>, DataError> {
        let columns: SmallVec<[&'a mut [u8]; 8]> = columns.into_iter().collect();
        if columns.len() != spec.fields().len() {
            return Err(DataError::ColumnCount {
                expected: spec.fields().len(),
                found: columns.len(),
            });
        }
        for (f, c) in spec.fields().iter().zip(&columns) {
            let expected = rows.saturating_mul(f.bytes());
            if c.len() != expected {
                return Err(DataError::ColumnBytes {
                    key: f.key().clone(),
                    expected,
                    found: c.len(),
                });
            }
        }
        row_slice("index", rows, index.len())?;
        row_slice("generation", rows, generation.len())?;
        Ok(Destination {
            spec,
            rows,
            columns,
            index,
            generation,
            weight: None,
            marks: None,
        })
    }

    /// Room for importance weights, `rows` of them: a prioritized sampler writes them,
    /// and refuses to sample into a destination without it.
    pub fn with_weight(self, weight: &'a mut [f32]) -> Result<Self, DataError> {
        row_slice("weight", self.rows, weight.len())?;
        Ok(Destination {
            weight: Some(weight),
            ..self
        })
    }

    /// Room for slice marks, `rows` of them (see [`Batch::marks`]): slice samplers
    /// write them when given, and other samplers leave them as they are.
    pub fn with_marks(self, marks: &'a mut [Marks]) -> Result<Self, DataError> {
        row_slice("marks", self.rows, marks.len())?;
        Ok(Destination {
            marks: Some(marks),
            ..self
        })
    }

    /// The rows this destination has room for.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Checks that a destination's slice `part` holds one entry per row.
fn row_slice(part: &'static str, rows: usize, found: usize) -> Result<(), DataError> {
    if found == rows {
        Ok(())
    } else {
        Err(DataError::RowSlice {
            part,
            expected: rows,
            found,
        })
    }
}

/// Checks that columns of `mine` (in its order) can hold rows of `spec`, and returns,
/// for each field of `spec`, the column of `mine` that holds it.
pub(crate) fn columns_for(mine: &Spec, spec: &Spec) -> Result<SmallVec<[usize; 8]>, DataError> {
    if std::ptr::eq(mine, spec) {
        return Ok((0..spec.fields().len()).collect());
    }
    let mut map = SmallVec::new();
    for f in spec.fields() {
        let (i, theirs) = mine.field(f.key()).ok_or_else(|| DataError::MissingField {
            key: f.key().clone(),
        })?;
        if theirs.dtype() != f.dtype() {
            return Err(DataError::DType {
                key: f.key().clone(),
                expected: f.dtype(),
                found: theirs.dtype(),
            });
        }
        if theirs.shape() != f.shape() {
            return Err(DataError::FieldShape {
                key: f.key().clone(),
                expected: f.shape().to_vec(),
                found: theirs.shape().to_vec(),
            });
        }
        map.push(i);
    }
    if let Some(extra) = mine.fields().iter().find(|m| spec.field(m.key()).is_none()) {
        return Err(DataError::UnknownField {
            key: extra.key().clone(),
        });
    }
    Ok(map)
}
