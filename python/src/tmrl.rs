//! `replaybuf._native.TmrlMemory`: the engine's tmrl-style memory
//! (`replaybuf::tmrl::TmrlMemory`) with numpy arrays in and out, wrapped by
//! `replaybuf.tmrl.Memory`, which speaks tmrl's names.
//!
//! A collector's buffer of samples comes in as a dict of columns (`act`, `obs`, `rew`,
//! `terminated`, `truncated`, each `(n, ..)`) and is paired into transitions by the
//! engine. A sampled batch comes out as the six `float32` arrays the engine collated,
//! handed to numpy without a copy; stored transitions come out as a dict of arrays in
//! their stored dtypes.
//!
//! The engine's memory needs `&mut` to append (it keeps the last sample, to link an
//! episode that the next buffer continues) and to sample (its loader), so it sits
//! behind a lock. The lock is taken only with the GIL released, inside `py.detach`:
//! a thread that held it and waited for the GIL while another thread held the GIL and
//! waited for it would deadlock. Reads of stored rows go through a second handle of
//! the same buffer and take no lock.

// The crate-wide list of disallowed locks keeps the engine's synchronisation in its
// loom facade; this lock guards a Python object's state, which loom never models.
#![allow(
    clippy::disallowed_types,
    reason = "the binding's lock is outside the engine's loom-checked protocols"
)]

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use replaybuf::tmrl::{Tensor, TmrlMemory};
use replaybuf::{Batch, ReplayBuffer, Spec};
use std::path::PathBuf;
use std::sync::Arc;

use crate::arrays::{dict_of_batch, with_borrowed};
use crate::errors::{key_error, py_err, type_error, value_error};
use crate::fields::{key_to_py, numpy_dtype, spec_from_py};
use crate::gil;

/// A tmrl-style memory of transitions (see `replaybuf.tmrl.Memory` for the user's face).
#[pyclass(frozen, module = "replaybuf._native", name = "TmrlMemory")]
pub(crate) struct Memory {
    /// Locked only inside `py.detach` (see the module docs).
    memory: Mutex<TmrlMemory>,
    /// Another handle of the memory's buffer: lengths and reads, no lock.
    buffer: ReplayBuffer,
    /// What `append_buffer` takes: act, obs, rew, terminated, truncated.
    sample_spec: Arc<Spec>,
    nb_steps: usize,
    batch_size: usize,
}

impl Memory {
    fn wrap(memory: TmrlMemory) -> Memory {
        Memory {
            buffer: memory.buffer().clone(),
            sample_spec: memory.collector_buffer(0).spec().clone(),
            nb_steps: memory.nb_steps(),
            batch_size: memory.batch_size(),
            memory: Mutex::new(memory),
        }
    }

    /// Runs `f`, with the GIL released, on the collector batch of `samples` (a dict of
    /// columns): every array checked first, then lent to the batch, not copied.
    fn with_samples<R: Send>(
        &self,
        py: Python<'_>,
        samples: &Bound<'_, PyDict>,
        f: impl FnOnce(&Batch) -> R + Send,
    ) -> PyResult<R> {
        let mut arrays = Vec::with_capacity(self.sample_spec.fields().len());
        let mut rows: Option<usize> = None;
        for field in self.sample_spec.fields() {
            let key = key_to_py(py, field.key())?;
            let value = samples
                .get_item(&key)?
                .ok_or_else(|| key_error(format!("append_buffer: no column `{key}`")))?;
            let array = value
                .cast_into::<PyUntypedArray>()
                .map_err(|_| type_error(format!("append_buffer: `{key}` is not a numpy array")))?;
            let descr = numpy_dtype(py, field.dtype())?;
            if !array.dtype().is_equiv_to(&descr) {
                return Err(type_error(format!(
                    "append_buffer: `{key}` must be {descr}, got {}",
                    array.dtype()
                )));
            }
            if !array.is_c_contiguous() {
                return Err(value_error(format!(
                    "append_buffer: `{key}` is not C-contiguous"
                )));
            }
            let dims = array.shape();
            if dims.is_empty() || dims[1..] != *field.shape() {
                return Err(value_error(format!(
                    "append_buffer: `{key}` has shape {dims:?}; expected (n, {})",
                    field
                        .shape()
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
            match rows {
                None => rows = Some(dims[0]),
                Some(n) if n != dims[0] => {
                    return Err(value_error(format!(
                        "append_buffer: `{key}` has {} samples, the other columns {n}",
                        dims[0]
                    )))
                }
                Some(_) => {}
            }
            arrays.push(array);
        }
        with_borrowed(
            py,
            self.sample_spec.clone(),
            &[rows.unwrap_or(0)],
            &arrays,
            f,
        )
    }
}

/// A collated tensor as a numpy array that owns the engine's values (no copy).
fn array_of(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    Ok(PyArray1::from_vec(py, t.data).reshape(t.shape)?.into_any())
}

#[pymethods]
impl Memory {
    /// A new, empty memory of `capacity` transitions of `spec` (the six fields `obs`,
    /// `act`, `rew`, `("next", "obs")`, `terminated`, `truncated`), on the heap or
    /// file-backed under `memmap`.
    #[new]
    #[pyo3(signature = (
        capacity,
        spec,
        *,
        batch_size = 256,
        nb_steps = 1,
        seed = None,
        memmap = None,
        existsok = false,
        prefetch = 0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: usize,
        spec: &Bound<'_, PyAny>,
        batch_size: usize,
        nb_steps: usize,
        seed: Option<u64>,
        memmap: Option<PathBuf>,
        existsok: bool,
        prefetch: usize,
    ) -> PyResult<Memory> {
        let mut b = ReplayBuffer::builder(spec_from_py(spec)?)
            .capacity(capacity)
            .existsok(existsok);
        if let Some(seed) = seed {
            b = b.seed(seed);
        }
        if let Some(dir) = memmap {
            b = b.memmap(dir);
        }
        let memory = gil::detach(py, || {
            let buffer = b.build()?;
            TmrlMemory::builder(buffer)
                .batch_size(batch_size)
                .nb_steps(nb_steps)
                .prefetch(prefetch)
                .build()
        })
        .map_err(py_err)?;
        Ok(Memory::wrap(memory))
    }

    /// A memory over a dataset directory: a checkpoint (`save`, or a `ReplayBuffer`'s
    /// `dumps`) loaded into memory, or a file-backed storage reopened in place. It
    /// draws from `seed`, or without one from the seed the directory records.
    #[staticmethod]
    #[pyo3(signature = (path, *, batch_size = 256, nb_steps = 1, prefetch = 0, seed = None))]
    fn from_dataset(
        py: Python<'_>,
        path: PathBuf,
        batch_size: usize,
        nb_steps: usize,
        prefetch: usize,
        seed: Option<u64>,
    ) -> PyResult<Memory> {
        let builder = gil::detach(py, || match seed {
            Some(seed) => TmrlMemory::from_dataset_seeded(&path, seed),
            None => TmrlMemory::from_dataset(&path),
        })
        .map_err(py_err)?;
        let memory = gil::detach(py, || {
            builder
                .batch_size(batch_size)
                .nb_steps(nb_steps)
                .prefetch(prefetch)
                .build()
        })
        .map_err(py_err)?;
        Ok(Memory::wrap(memory))
    }

    /// Transitions stored.
    fn __len__(&self) -> usize {
        self.buffer.len()
    }

    /// Transitions the memory holds when full.
    #[getter]
    fn memory_size(&self) -> usize {
        self.buffer.capacity()
    }

    /// Transitions per sampled batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Batches per pass.
    #[getter]
    fn nb_steps(&self) -> usize {
        self.nb_steps
    }

    /// The fields: a list of `(key, numpy dtype, shape)`.
    #[getter]
    fn spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .buffer
            .spec()
            .fields()
            .iter()
            .map(|f| {
                PyTuple::new(
                    py,
                    [
                        key_to_py(py, f.key())?,
                        numpy_dtype(py, f.dtype())?.into_any(),
                        PyTuple::new(py, f.shape())?.into_any(),
                    ],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Appends a collector's samples in order (a dict of C-contiguous columns `act`,
    /// `obs`, `rew`, `terminated`, `truncated` of the fields' dtypes, each `(n, ..)`)
    /// and returns the storage index of every transition they made.
    fn append_buffer<'py>(
        &self,
        py: Python<'py>,
        samples: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let written = self
            .with_samples(py, samples, |b| self.memory.lock().append_buffer(b))?
            .map_err(py_err)?;
        let index: Vec<u64> = (0..written.len()).filter_map(|r| written.get(r)).collect();
        Ok(PyArray1::from_vec(py, index))
    }

    /// Transition `item`, oldest first (as tmrl's lists hold them): a dict of the six
    /// fields (each of the field's shape, in a leading axis of one) and `index`.
    fn get_transition<'py>(&self, py: Python<'py>, item: u64) -> PyResult<Bound<'py, PyDict>> {
        let batch =
            gil::detach(py, || TmrlMemory::transition_in(&self.buffer, item)).map_err(py_err)?;
        dict_of_batch(py, &batch)
    }

    /// `batch_size` transitions drawn uniformly, not collated: a dict of the six
    /// fields in their stored dtypes and `index`.
    fn sample_rows<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let n = self.batch_size;
        let batch = gil::detach(py, || self.buffer.sample(n)).map_err(py_err)?;
        dict_of_batch(py, &batch)
    }

    /// `batch_size` transitions drawn uniformly and collated: `(prev_obs, act, rew,
    /// new_obs, terminated, truncated)`, all `float32`: the reward and the flags
    /// `(batch,)`, the others `(batch, ..field shape)`.
    fn sample<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let batch = gil::detach(py, || self.memory.lock().sample()).map_err(py_err)?;
        let (prev_obs, act, rew, new_obs, terminated, truncated) = batch.into_tuple();
        PyTuple::new(
            py,
            [
                array_of(py, prev_obs)?,
                array_of(py, act)?,
                array_of(py, rew)?,
                array_of(py, new_obs)?,
                array_of(py, terminated)?,
                array_of(py, truncated)?,
            ],
        )
    }

    /// Saves every transition under the directory `path`, as a checkpoint that
    /// `from_dataset` (and `ReplayBuffer.from_checkpoint`) opens.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        gil::detach(py, || self.buffer.save(&path)).map_err(py_err)
    }

    /// Writes a file-backed memory through to its files and the disk.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        gil::detach(py, || self.buffer.flush()).map_err(py_err)
    }

    fn __repr__(&self) -> String {
        format!(
            "TmrlMemory(len={}, memory_size={}, batch_size={}, nb_steps={})",
            self.buffer.len(),
            self.buffer.capacity(),
            self.batch_size,
            self.nb_steps
        )
    }
}
