//! A columnar batch: what collectors write and what learners get back.
//!
//! Each field of the spec is one contiguous column of shape `[..batch shape, ..field
//! shape]`, readable as a typed slice without copying. A sampled batch also carries the
//! storage `index` of every row (and its write `generation`).
//!
//! Layer: algos.

use std::sync::Arc;

use crate::dtype::{DType, Element};
use crate::error::DataError;
use crate::key::KeyLike;
use crate::sampler::slice::{Marks, SliceWindow};
use crate::spec::{Field, Spec};
use crate::storage::lanes::LaneView;
use crate::storage::shard::Window;
use crate::storage::Draw;

/// What every sampled batch says of its rows, one definition each: a batch type with
/// fields `index: Vec<u64>`, `generation: Vec<u64>` and `weight: Option<Vec<f32>>`
/// names the accessors it offers (`Batch`, `TypedBatch`, `ListBatch`).
macro_rules! draw_accessors {
    ($($name:ident),* $(,)?) => {
        $($crate::batch::draw_accessors!(@ $name);)*
    };
    (@ index) => {
        /// The storage index of every row (sampled batches; empty otherwise).
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

/// One field's values for every row of a batch, 8-byte aligned so that any element
/// type can be viewed in place.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Column {
    words: Vec<u64>,
    bytes: usize,
}

impl Column {
    fn zeros(bytes: usize) -> Column {
        Column {
            words: vec![0; bytes.div_ceil(8)],
            bytes,
        }
    }

    /// Resizes to `bytes`, reusing the allocation when it is large enough.
    fn resize(&mut self, bytes: usize) {
        self.words.resize(bytes.div_ceil(8), 0);
        self.bytes = bytes;
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.bytes]
    }

    pub(crate) fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.bytes]
    }
}

/// Reusable scratch of the sampling path, kept inside a batch so that `sample_into`
/// allocates nothing once warm.
#[derive(Clone, Debug, Default)]
pub(crate) struct Scratch {
    pub(crate) windows: Vec<Window>,
    pub(crate) draws: Vec<Draw>,
    /// Slice sampling: every lane's snapshot, and their running trajectory counts.
    pub(crate) lanes: Vec<LaneView>,
    pub(crate) cumulative: Vec<u64>,
    /// Slice sampling: the batch's windows.
    pub(crate) slices: Vec<SliceWindow>,
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
    pub fn zeros(spec: impl Into<Arc<Spec>>, shape: impl AsRef<[usize]>) -> Batch {
        let spec = spec.into();
        let shape = shape.as_ref().to_vec();
        let rows: usize = shape.iter().product();
        let columns = spec
            .fields()
            .iter()
            .map(|f| Column::zeros(rows * f.bytes()))
            .collect();
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
    pub(crate) fn columns_for(
        &self,
        spec: &Spec,
    ) -> Result<smallvec::SmallVec<[usize; 8]>, DataError> {
        if std::ptr::eq(&*self.spec, spec) {
            return Ok((0..spec.fields().len()).collect());
        }
        let mut map = smallvec::SmallVec::new();
        for f in spec.fields() {
            let (i, mine) = self
                .spec
                .field(f.key())
                .ok_or_else(|| DataError::MissingField {
                    key: f.key().clone(),
                })?;
            if mine.dtype() != f.dtype() {
                return Err(DataError::DType {
                    key: f.key().clone(),
                    expected: f.dtype(),
                    found: mine.dtype(),
                });
            }
            if mine.shape() != f.shape() {
                return Err(DataError::FieldShape {
                    key: f.key().clone(),
                    expected: f.shape().to_vec(),
                    found: mine.shape().to_vec(),
                });
            }
            map.push(i);
        }
        if let Some(extra) = self
            .spec
            .fields()
            .iter()
            .find(|m| spec.field(m.key()).is_none())
        {
            return Err(DataError::UnknownField {
                key: extra.key().clone(),
            });
        }
        Ok(map)
    }
}
