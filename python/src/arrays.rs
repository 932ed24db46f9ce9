//! numpy arrays as the engine's memory: their data spans for GIL-free copies, new
//! uninitialised arrays, and a batch copied out into a dict of arrays.

use numpy::npyffi::{self, npy_intp, PY_ARRAY_API};
use numpy::{PyArray1, PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use replaybuf::{Batch, Spec};
use std::sync::Arc;

use crate::errors::py_err;
use crate::fields::{key_to_py, numpy_dtype};
use crate::gil;

/// Raw spans of arrays the GIL-free part of a call reads or writes.
pub(crate) struct Spans(pub(crate) Vec<(*mut u8, usize)>);

// SAFETY: the spans point into numpy arrays that the calling frame keeps alive (it
// holds references to them) for the whole GIL-free section that uses them.
unsafe impl Send for Spans {}

/// A span of an array's data: its pointer and byte length.
pub(crate) fn span(array: &Bound<'_, PyUntypedArray>) -> (*mut u8, usize) {
    // SAFETY: `as_array_ptr` points at a live array object (we hold a reference).
    let data = unsafe { (*array.as_array_ptr()).data } as *mut u8;
    let bytes = array.len() * array.dtype().itemsize();
    (data, bytes)
}

/// A new, uninitialised C-order array of `descr` and `shape`.
pub(crate) fn empty<'py>(
    py: Python<'py>,
    descr: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: the numpy C API, called with the GIL held: `PyArray_NewFromDescr` steals
    // the reference to the descriptor we pass (hence `into_dtype_ptr`), reads `dims`
    // (`shape.len()` of them), and returns a new reference or null with an error set.
    unsafe {
        let ptr = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.clone().into_dtype_ptr(),
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        Ok(Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked())
    }
}

/// A dict of `batch`'s fields, each a new array of `[..batch shape, ..field shape]` in
/// the field's dtype, and `index`.
pub(crate) fn dict_of_batch<'py>(py: Python<'py>, batch: &Batch) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    for field in batch.spec().fields() {
        let mut shape = batch.shape().to_vec();
        shape.extend_from_slice(field.shape());
        let array = empty(py, &numpy_dtype(py, field.dtype())?, &shape)?;
        let src = batch.column_bytes(field.key()).map_err(py_err)?;
        let (ptr, len) = span(&array);
        assert_eq!(len, src.len(), "a fresh array holds the column");
        // SAFETY: a fresh C-contiguous array of `len` bytes that nothing else sees yet.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }.copy_from_slice(src);
        out.set_item(key_to_py(py, field.key())?, array)?;
    }
    out.set_item("index", PyArray1::from_slice(py, batch.index()))?;
    Ok(out)
}

/// Runs `f`, with the GIL released, on a batch of `spec` and `shape` whose columns are
/// `arrays` (one per field, in the spec's order, each C-contiguous and of the field's
/// dtype and `[..shape, ..field shape]`: the caller checked), lent, not copied.
pub(crate) fn with_borrowed<R: Send>(
    py: Python<'_>,
    spec: Arc<Spec>,
    shape: &[usize],
    arrays: &[Bound<'_, PyUntypedArray>],
    f: impl FnOnce(&Batch) -> R + Send,
) -> PyResult<R> {
    let spans = Spans(arrays.iter().map(span).collect());
    gil::detach(py, || {
        let spans = spans;
        // SAFETY: each span is the data of a C-contiguous array of that many bytes,
        // kept alive by `arrays` for this call and only read.
        let columns: Vec<&[u8]> = spans
            .0
            .iter()
            .map(|&(ptr, len)| unsafe { std::slice::from_raw_parts(ptr.cast_const(), len) })
            .collect();
        Batch::borrowing(spec, shape, &columns, f)
    })
    .map_err(py_err)
}
