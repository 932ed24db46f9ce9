//! Field specs, keys and dtypes between Python and the engine.
//!
//! A key is a `str`, or a tuple of `str` for a nested key (`("next", "obs")`). A
//! dtype is anything `numpy.dtype` takes (`np.float32`, `"float32"`, `"f4"`), or
//! `"bfloat16"`: numpy has no bfloat16, so a bf16 field is read and written as
//! `uint16` holding the raw bits (`torch.from_numpy(a).view(torch.bfloat16)`).

use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use replaybuf::{DType, Key, Spec};

use crate::convert::asarray;
use crate::errors::{key_error, py_err, type_error, value_error};

/// A key as Python spells it: `"obs"`, or `("next", "obs")` when nested.
pub(crate) fn key_to_py<'py>(py: Python<'py>, key: &Key) -> PyResult<Bound<'py, PyAny>> {
    let parts: Vec<&str> = key.components().collect();
    Ok(match parts.as_slice() {
        [one] => PyString::new(py, one).into_any(),
        many => PyTuple::new(py, many)?.into_any(),
    })
}

/// A key from Python: a `str`, or a tuple of them.
pub(crate) fn key_from_py(key: &Bound<'_, PyAny>) -> PyResult<Key> {
    if let Ok(s) = key.cast::<PyString>() {
        return Ok(Key::from(s.to_str()?));
    }
    if let Ok(t) = key.cast::<PyTuple>() {
        let parts = t
            .iter()
            .map(|p| p.extract::<String>())
            .collect::<PyResult<Vec<String>>>()
            .map_err(|_| type_error(format!("a nested key is a tuple of str, got {t}")))?;
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        return Ok(Key::from(parts.as_slice()));
    }
    Err(type_error(format!(
        "a key is a str or a tuple of str, got {}",
        key.get_type().name()?
    )))
}

/// The numpy dtype a field of `dtype` is read and written as.
pub(crate) fn numpy_dtype(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    let name = match dtype {
        DType::Bool => "bool",
        DType::U8 => "uint8",
        DType::I8 => "int8",
        DType::I16 => "int16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::U16 | DType::BF16 => "uint16",
        DType::U32 => "uint32",
        DType::U64 => "uint64",
        DType::F16 => "float16",
        DType::F32 => "float32",
        DType::F64 => "float64",
    };
    PyArrayDescr::new(py, name)
}

/// The field dtype of a numpy dtype (or anything `numpy.dtype` takes, or "bfloat16").
pub(crate) fn dtype_from_py(dtype: &Bound<'_, PyAny>) -> PyResult<DType> {
    if dtype.is_none() {
        // numpy reads None as float64; no field or index means that.
        return Err(type_error("not a dtype: None"));
    }
    if let Ok(s) = dtype.extract::<String>() {
        if s == "bfloat16" || s == "bf16" {
            return Ok(DType::BF16);
        }
    }
    let descr = PyArrayDescr::new(dtype.py(), dtype)
        .map_err(|e| type_error(format!("not a dtype: {e}")))?;
    dtype_of_descr(&descr)
}

/// The field dtype of a numpy array's dtype.
pub(crate) fn dtype_of_descr(descr: &Bound<'_, PyArrayDescr>) -> PyResult<DType> {
    if !descr.is_native_byteorder().unwrap_or(true) {
        return Err(type_error(format!(
            "dtype {descr} is not in native byte order"
        )));
    }
    Ok(match (descr.kind(), descr.itemsize()) {
        (b'b', 1) => DType::Bool,
        (b'u', 1) => DType::U8,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        _ => {
            return Err(type_error(format!(
                "dtype {descr} cannot be stored: use bool, an integer type or float16/32/64"
            )))
        }
    })
}

/// A spec from Python: a list of `(key, dtype, shape)`, or a dict `{key: (dtype,
/// shape)}`, or a dict `{key: {"dtype": .., "shape": ..}}`.
pub(crate) fn spec_from_py(spec: &Bound<'_, PyAny>) -> PyResult<Spec> {
    let mut fields = Vec::new();
    let mut add = |key: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>, shape: &Bound<'_, PyAny>| {
        let shape: Vec<usize> = shape.extract().map_err(|_| {
            type_error(format!(
                "the shape of `{key}` is a tuple of ints, got {shape}"
            ))
        })?;
        fields.push((key_from_py(key)?, dtype_from_py(dtype)?, shape));
        PyResult::Ok(())
    };
    if let Ok(d) = spec.cast::<PyDict>() {
        // A snapshot: a dtype or shape object's own code may change the dict (pyo3's
        // iterator panics when it does).
        for (key, value) in d
            .items()
            .iter()
            .map(|kv| kv.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>())
            .collect::<PyResult<Vec<_>>>()?
        {
            if let Ok(inner) = value.cast::<PyDict>() {
                let dtype = inner
                    .get_item("dtype")?
                    .ok_or_else(|| value_error(format!("field `{key}` has no \"dtype\"")))?;
                let shape = match inner.get_item("shape")? {
                    Some(s) => s,
                    None => PyTuple::empty(spec.py()).into_any(),
                };
                add(&key, &dtype, &shape)?;
            } else {
                let (dtype, shape): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
                    value.extract().map_err(|_| {
                        type_error(format!("field `{key}`: give (dtype, shape), got {value}"))
                    })?;
                add(&key, &dtype, &shape)?;
            }
        }
    } else if let Ok(l) = spec.cast::<PyList>() {
        for item in l.iter() {
            let (key, dtype, shape): (Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>) = item
                .extract()
                .map_err(|_| type_error(format!("a field is (key, dtype, shape), got {item}")))?;
            add(&key, &dtype, &shape)?;
        }
    } else {
        return Err(type_error(
            "a spec is a list of (key, dtype, shape) or a dict {key: (dtype, shape)}",
        ));
    }
    let spec = fields
        .into_iter()
        .fold(Spec::builder(), |b, (key, dtype, shape)| {
            b.field(key, dtype, shape)
        })
        .build()
        .map_err(py_err)?;
    refuse_reserved(&spec)?;
    Ok(spec)
}

/// The names a sample's dict gives what it carries besides the fields.
const SAMPLE_ENTRIES: [&str; 4] = ["index", "generation", "weight", "marks"];

/// Refuses a spec with a top-level field a sample's own entries would overwrite.
pub(crate) fn refuse_reserved(spec: &Spec) -> PyResult<()> {
    match spec.fields().iter().find_map(|f| {
        let mut parts = f.key().components();
        match (parts.next(), parts.len()) {
            (Some(name), 0) if SAMPLE_ENTRIES.contains(&name) => Some(name),
            _ => None,
        }
    }) {
        Some(name) => Err(value_error(format!(
            "a field may not be named `{name}`: a sample's dict holds its {name} under \
             that key (one of {SAMPLE_ENTRIES:?}); nest it, e.g. (\"data\", \"{name}\")"
        ))),
        None => Ok(()),
    }
}

/// A spec from one example transition: a dict (nested dicts for nested keys) of arrays
/// or scalars, each a field of that array's dtype and shape, after dropping
/// `batch_dims` leading dimensions.
pub(crate) fn spec_from_example(example: &Bound<'_, PyAny>, batch_dims: usize) -> PyResult<Spec> {
    let py = example.py();
    let mut builder = Spec::builder();
    for (key, value) in flatten(example)? {
        let array = asarray(&value, &format!("the example's `{}`", key_to_py(py, &key)?))?;
        let shape: Vec<usize> = array.getattr("shape")?.extract()?;
        if shape.len() < batch_dims {
            return Err(value_error(format!(
                "the example's `{}` has {} dimensions, fewer than the {batch_dims} batch dimensions",
                key_to_py(py, &key)?,
                shape.len()
            )));
        }
        let dtype = dtype_from_py(&array.getattr("dtype")?)?;
        builder = builder.field(key, dtype, &shape[batch_dims..]);
    }
    let spec = builder.build().map_err(py_err)?;
    refuse_reserved(&spec)?;
    Ok(spec)
}

/// A dict's leaves with their full keys: nested dicts open into tuple keys, and a
/// tuple key names a nested field directly.
pub(crate) fn flatten<'py>(data: &Bound<'py, PyAny>) -> PyResult<Vec<(Key, Bound<'py, PyAny>)>> {
    let dict = data.cast::<PyDict>().map_err(|_| {
        type_error(format!(
            "expected a dict of arrays, got {}",
            data.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let mut out = Vec::with_capacity(dict.len());
    flatten_into(dict, &mut Vec::new(), &mut out)?;
    Ok(out)
}

fn flatten_into<'py>(
    dict: &Bound<'py, PyDict>,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Key, Bound<'py, PyAny>)>,
) -> PyResult<()> {
    for (key, value) in dict.iter() {
        let key = key_from_py(&key)?;
        let depth = prefix.len();
        prefix.extend(key.components().map(str::to_owned));
        if let Ok(inner) = value.cast::<PyDict>() {
            if inner.is_empty() {
                // No field of the spec is an empty group: a key that names none.
                return Err(key_error(format!(
                    "`{}` is an empty dict: no field of the spec",
                    prefix.join(".")
                )));
            }
            flatten_into(inner, prefix, out)?;
        } else {
            let parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
            out.push((Key::from(parts.as_slice()), value));
        }
        prefix.truncate(depth);
    }
    Ok(())
}
