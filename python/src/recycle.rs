//! Sample arrays written again once nothing else holds them.
//!
//! `sample` hands out fresh arrays, and a training loop drops each batch a step or two
//! later: making and freeing seven arrays a call is a tenth of a sample from Python. A
//! [`Recycler`] keeps a reference to the last few arrays of each output (a field,
//! `index`, ...), and a later sample writes into one of them again instead of making a
//! new one, but only when the recycler's reference is the array's only one.
//!
//! That test is exact. Everything that can see an array's memory holds a reference to
//! the array: a view (its `base`), a torch tensor from `torch.from_numpy` (its storage,
//! shared by every view and detached copy of the tensor), a `memoryview` or other
//! buffer export, a DLPack capsule, the dict a sample returned. So a reference count
//! of one means no Python object can read the memory, and writing it is as private as
//! writing a new array. All but a weak reference, which counts nothing and can still
//! hand the array back: an array someone refers to weakly is never taken again.
//! Numpy relies on the same fact to reuse temporaries in place.
//! The test runs with the GIL held, the only time a count can change, and a recycled
//! array is referenced by the sample that takes it before the GIL is released, so no
//! other sample takes it too. A free-threaded interpreter running without the GIL gives
//! no such moment: there every array is new.
//!
//! A holder can also change an array in place: its shape, strides, dtype or flags
//! (`a.shape = ...`, `a.dtype = ...`, `a.setflags(write=False)`). An array is taken
//! again only if it is still exactly what a fresh one would be: the same dtype object,
//! shape and C-order strides, aligned, writeable, owning its data.
//!
//! Layer: python.

use numpy::npyffi::{self, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray};
use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::arrays::empty;

/// Arrays kept per output: a loop holding its latest batch or two while it samples the
/// next still finds one free.
const DEPTH: usize = 4;

/// The arrays kept for each output of a sample, in the order the caller numbers them.
pub(crate) struct Recycler {
    outputs: Mutex<Vec<Kept>>,
    /// Off where reference counts change without the GIL.
    enabled: bool,
}

/// One output's kept arrays, replaced oldest first.
#[derive(Default)]
struct Kept {
    arrays: Vec<Py<PyUntypedArray>>,
    next: usize,
}

/// What one output of a sample must be.
pub(crate) struct Want<'a, 'py> {
    pub(crate) descr: &'a Bound<'py, PyArrayDescr>,
    pub(crate) shape: &'a [usize],
}

impl Recycler {
    pub(crate) fn new(py: Python<'_>) -> Recycler {
        // `sys._is_gil_enabled` exists from Python 3.13; before it, the GIL always is.
        let gil = py
            .import("sys")
            .and_then(|sys| sys.call_method0("_is_gil_enabled"))
            .and_then(|on| on.extract::<bool>())
            .unwrap_or(true);
        Recycler {
            outputs: Mutex::new(Vec::new()),
            enabled: gil,
        }
    }

    /// An array for each of `wants`: a kept one that nothing else holds and that is
    /// still as a fresh one would be, else a new one (kept in place of the oldest).
    pub(crate) fn arrays<'py>(
        &self,
        py: Python<'py>,
        wants: &[Want<'_, 'py>],
    ) -> PyResult<Vec<Bound<'py, PyUntypedArray>>> {
        if !self.enabled {
            return wants.iter().map(|w| empty(py, w.descr, w.shape)).collect();
        }
        // Taken under the lock: references cloned, no Python code run, so no other
        // thread can run in between (it would need the GIL, which we hold) nor find
        // the lock held while it waits for the GIL.
        let taken: Vec<Option<Bound<'py, PyUntypedArray>>> = {
            let mut outputs = self.outputs.lock();
            if outputs.len() < wants.len() {
                outputs.resize_with(wants.len(), Kept::default);
            }
            wants
                .iter()
                .zip(outputs.iter())
                .map(|(want, kept)| {
                    kept.arrays
                        .iter()
                        .find(|a| reusable(a, want))
                        .map(|a| a.bind(py).clone())
                })
                .collect()
        };
        let mut out = Vec::with_capacity(wants.len());
        let mut fresh = Vec::new();
        for (i, (want, taken)) in wants.iter().zip(taken).enumerate() {
            match taken {
                Some(array) => out.push(array),
                None => {
                    let array = empty(py, want.descr, want.shape)?;
                    fresh.push((i, array.clone().unbind()));
                    out.push(array);
                }
            }
        }
        if !fresh.is_empty() {
            // Dropped after the lock: freeing an array may run Python code.
            let mut dropped = Vec::new();
            let mut outputs = self.outputs.lock();
            for (i, array) in fresh {
                let kept = &mut outputs[i];
                if kept.arrays.len() < DEPTH {
                    kept.arrays.push(array);
                } else {
                    dropped.push(std::mem::replace(&mut kept.arrays[kept.next], array));
                    kept.next = (kept.next + 1) % DEPTH;
                }
            }
            drop(outputs);
            drop(dropped);
        }
        Ok(out)
    }
}

/// Whether `array` is referenced by the recycler alone and is still a C-order,
/// aligned, writeable array owning its data, of `want`'s dtype object and shape.
fn reusable(array: &Py<PyUntypedArray>, want: &Want<'_, '_>) -> bool {
    let ptr = array.as_ptr();
    // SAFETY: called with the GIL held (the caller has a `Python` token through
    // `want.descr`), on a live array we hold a reference to: reading its reference
    // count and its fields races with nothing.
    unsafe {
        if pyo3::ffi::Py_REFCNT(ptr) != 1 {
            return false;
        }
        let a = &*ptr.cast::<npyffi::PyArrayObject>();
        let flags = npyffi::NPY_ARRAY_C_CONTIGUOUS
            | npyffi::NPY_ARRAY_ALIGNED
            | npyffi::NPY_ARRAY_WRITEABLE
            | npyffi::NPY_ARRAY_OWNDATA;
        if a.flags & flags != flags
            || !a.base.is_null()
            || !a.weakreflist.is_null()
            || a.descr != want.descr.as_ptr().cast()
            || a.nd as usize != want.shape.len()
        {
            return false;
        }
        let dims = std::slice::from_raw_parts(a.dimensions, want.shape.len());
        let strides = std::slice::from_raw_parts(a.strides, want.shape.len());
        let mut stride = want.descr.itemsize() as npy_intp;
        for k in (0..want.shape.len()).rev() {
            if dims[k] != want.shape[k] as npy_intp || strides[k] != stride {
                return false;
            }
            stride *= dims[k];
        }
        true
    }
}
