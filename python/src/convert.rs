//! Values that are not numpy arrays (lists, scalars, torch tensors) as arrays of a
//! field's dtype.
//!
//! An ndarray of another dtype is refused outright: its dtype was the caller's choice.
//! Other values are converted, but numpy's own cast (`asarray(value, dtype)`) is
//! unsafe: it truncates floats into an integer field (`[2.7, -0.9]` stored as
//! `[2, 0]`) and wraps integers outside the field's range (`[300, -1]` into uint8
//! stored as `[44, 255]`), silently. So a value becomes numpy's array of it first, in
//! the dtype numpy picks, and is cast to the field's dtype only where the cast keeps
//! what it says: one numpy calls "same_kind" (no float into an integer, no integer
//! into a bool), or one between signed and unsigned integers (numpy keeps those
//! apart; a list of ints is int64 to numpy, and must still fill a uint8 field), that
//! leaves every value as it was (an integer in the field's range; a float rounded to
//! the field's precision, as any float field rounds, but not made infinite).

use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::IntoPyDict;

use crate::errors::{type_error, value_error};

/// numpy's array of `value` (`what` names it in an error). A tensor that requires
/// grad (a TD error straight from the loss) is read as its detached self, as TorchRL
/// reads it. What numpy cannot make an array of (a ragged list, a tensor of a dtype
/// numpy lacks) is one of our errors, numpy's or torch's as its cause.
pub(crate) fn asarray<'py>(value: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyAny>> {
    let py = value.py();
    let detached;
    let value = if value.hasattr("requires_grad")? && value.getattr("requires_grad")?.is_truthy()? {
        detached = value.call_method0("detach")?;
        &detached
    } else {
        value
    };
    py.import("numpy")?
        .call_method1("asarray", (value,))
        .map_err(|cause| {
            let message = format!("{what} cannot be read as an array: {cause}");
            let err = if cause.is_instance_of::<pyo3::exceptions::PyValueError>(py) {
                value_error(message)
            } else {
                type_error(message)
            };
            err.set_cause(py, Some(cause));
            err
        })
}

/// `value` (anything but an ndarray) as an array of `descr`, the dtype of the field
/// `key`; refused with a type error where the conversion would change a value.
pub(crate) fn field_array<'py>(
    value: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    descr: &Bound<'py, PyArrayDescr>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let np = value.py().import("numpy")?;
    let array = asarray(value, &format!("`{key}`"))?.cast_into::<PyUntypedArray>()?;
    let found = array.dtype();
    if found.is_equiv_to(descr) {
        return Ok(array);
    }
    let integer = |d: &Bound<'py, PyArrayDescr>| matches!(d.kind(), b'i' | b'u');
    let same_kind = (integer(&found) && integer(descr))
        || np
            .call_method1("can_cast", (&found, descr, "same_kind"))?
            .is_truthy()?;
    if !same_kind {
        return Err(type_error(format!(
            "`{key}` must be {descr}, got {found} values, which it cannot hold as they are: \
             pass them as {descr}"
        )));
    }
    // A float too large for the field is refused below, not warned about by numpy.
    let quiet = np.call_method(
        "errstate",
        (),
        Some(&[("all", "ignore")].into_py_dict(value.py())?),
    )?;
    quiet.call_method0("__enter__")?;
    let cast = array.call_method1("astype", (descr,));
    // Integers are exact: one the float rounds (16777217 into float32) changes (cast
    // back, quietly: past the integers' range it is invalid, and unequal).
    let back = match &cast {
        Ok(c) if descr.kind() == b'f' && integer(&found) => {
            Some(c.call_method1("astype", (&found,)))
        }
        _ => None,
    };
    quiet.call_method1("__exit__", (None::<()>, None::<()>, None::<()>))?;
    let cast = cast?;
    let kept = if let Some(back) = back {
        np.call_method1("array_equal", (back?, &array))?
    } else if descr.kind() == b'f' {
        let finite = |a: &Bound<'py, PyAny>| np.call_method1("isfinite", (a,));
        np.call_method1("array_equal", (finite(array.as_any())?, finite(&cast)?))?
    } else {
        np.call_method1("array_equal", (&cast, &array))?
    };
    if !kept.is_truthy()? {
        return Err(type_error(format!(
            "`{key}` must be {descr}, got {found} values outside its range or that it \
             cannot hold exactly"
        )));
    }
    Ok(cast.cast_into::<PyUntypedArray>()?)
}
