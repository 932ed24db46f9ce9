//! Rust errors as Python exceptions.
//!
//! Every error the engine returns becomes an exception under one base class,
//! `replaybuf.ReplayBufferError`, that also derives from the built-in a Python caller
//! would catch for it (`ValueError`, `TypeError`, `IndexError`, `KeyError`, `OSError`),
//! with the engine's message unchanged. The classes are made once, at import, by
//! calling `type(name, bases, namespace)`: a class with two bases is not something
//! `create_exception!` can declare.

use pyo3::exceptions::{
    PyException, PyIndexError, PyKeyError, PyOSError, PyRuntimeError, PyStopIteration,
    PyTimeoutError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use replaybuf::error::{
    AccessError, BuildError, DataError, PersistError, PriorityError, RateLimitError, SampleError,
    SpecError, SwapError,
};

/// Which exception class an error is raised as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Value,
    Type,
    Index,
    Key,
    Os,
    EpochEnd,
    Timeout,
    Closed,
}

/// The classes, by [`Kind`], in declaration order after the base.
const CLASSES: [(Kind, &str, &str); 8] = [
    (
        Kind::Value,
        "ReplayBufferValueError",
        "A value the buffer cannot take: a wrong shape, a bad priority, a bad setting.",
    ),
    (
        Kind::Type,
        "ReplayBufferTypeError",
        "An array of the wrong dtype, or an object of the wrong type.",
    ),
    (
        Kind::Index,
        "ReplayBufferIndexError",
        "An index no stored row has.",
    ),
    (
        Kind::Key,
        "ReplayBufferKeyError",
        "A field the buffer's spec lacks, or one a batch is missing.",
    ),
    (
        Kind::Os,
        "ReplayBufferOSError",
        "A checkpoint, file or shared-memory region that cannot be used.",
    ),
    (
        Kind::EpochEnd,
        "EpochEnd",
        "A without-replacement epoch ran out (the next sample starts a new one).",
    ),
    (
        Kind::Timeout,
        "ReplayBufferTimeoutError",
        "A call waited its rate limit's whole timeout; nothing was written or drawn.",
    ),
    (
        Kind::Closed,
        "RateLimitClosed",
        "The rate limit was closed (close_rate_limit): a call that would wait fails.",
    ),
];

struct Classes {
    base: Py<PyType>,
    by_kind: Vec<(Kind, Py<PyType>)>,
}

static CLASSES_ONCE: PyOnceLock<Classes> = PyOnceLock::new();

fn builtin<'py>(py: Python<'py>, kind: Kind) -> Bound<'py, PyType> {
    match kind {
        Kind::Value => py.get_type::<PyValueError>(),
        Kind::Type => py.get_type::<PyTypeError>(),
        Kind::Index => py.get_type::<PyIndexError>(),
        Kind::Key => py.get_type::<PyKeyError>(),
        Kind::Os => py.get_type::<PyOSError>(),
        Kind::EpochEnd => py.get_type::<PyStopIteration>(),
        Kind::Timeout => py.get_type::<PyTimeoutError>(),
        Kind::Closed => py.get_type::<PyRuntimeError>(),
    }
}

fn make_class<'py>(
    py: Python<'py>,
    name: &str,
    doc: &str,
    bases: Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__doc__", doc)?;
    namespace.set_item("__module__", "replaybuf")?;
    let class = py
        .get_type::<PyType>()
        .call1((name, bases, namespace))?
        .cast_into::<PyType>()?;
    Ok(class)
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES_ONCE.get_or_try_init(py, || {
        let base = make_class(
            py,
            "ReplayBufferError",
            "The base of every error replaybuf raises.",
            PyTuple::new(py, [py.get_type::<PyException>()])?,
        )?;
        let by_kind = CLASSES
            .iter()
            .map(|&(kind, name, doc)| {
                let bases = PyTuple::new(py, [base.clone(), builtin(py, kind)])?;
                Ok((kind, make_class(py, name, doc, bases)?.unbind()))
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Classes {
            base: base.unbind(),
            by_kind,
        })
    })
}

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let classes = classes(py)?;
    m.add("ReplayBufferError", classes.base.bind(py))?;
    for ((_, name, _), (_, class)) in CLASSES.iter().zip(&classes.by_kind) {
        m.add(*name, class.bind(py))?;
    }
    Ok(())
}

/// An exception of `kind` with `message`.
pub(crate) fn raise(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match classes(py) {
        Ok(classes) => {
            let class = classes
                .by_kind
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, c)| c.bind(py).clone())
                .expect("every kind has a class");
            PyErr::from_type(class, message)
        }
        Err(e) => e,
    })
}

/// Turns an engine error into its exception.
pub(crate) trait IntoPy {
    fn kind(&self) -> Kind;
}

/// `result.map_err(py_err)`: an engine error as its exception, its message followed by
/// its causes' (an I/O error's "No space left on device"), each that it does not
/// already say.
pub(crate) fn py_err<E: IntoPy + std::error::Error>(e: E) -> PyErr {
    // A wait a signal handler ended (`RateLimitError::Interrupted`): its exception.
    if let Some(raised) = crate::gil::take_raised() {
        return raised;
    }
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !message.contains(&said) {
            message = format!("{message}: {said}");
        }
        cause = c.source();
    }
    raise(e.kind(), message)
}

impl IntoPy for DataError {
    fn kind(&self) -> Kind {
        match self {
            DataError::MissingField { .. } | DataError::UnknownField { .. } => Kind::Key,
            DataError::DType { .. } | DataError::InvalidBool { .. } => Kind::Type,
            DataError::RateLimited(e) => e.kind(),
            _ => Kind::Value,
        }
    }
}

impl IntoPy for SampleError {
    fn kind(&self) -> Kind {
        match self {
            SampleError::EpochEnd => Kind::EpochEnd,
            SampleError::RateLimited(e) => e.kind(),
            _ => Kind::Value,
        }
    }
}

impl IntoPy for RateLimitError {
    fn kind(&self) -> Kind {
        match self {
            RateLimitError::Timeout { .. } => Kind::Timeout,
            RateLimitError::Closed => Kind::Closed,
            _ => Kind::Value,
        }
    }
}

impl IntoPy for AccessError {
    fn kind(&self) -> Kind {
        match self {
            AccessError::Data(e) => e.kind(),
            AccessError::FramesRewrite | AccessError::TrajectoryRewrite { .. } => Kind::Value,
            _ => Kind::Index,
        }
    }
}

impl IntoPy for PriorityError {
    fn kind(&self) -> Kind {
        match self {
            PriorityError::OutOfRange { .. } | PriorityError::UnknownRow { .. } => Kind::Index,
            _ => Kind::Value,
        }
    }
}

impl IntoPy for PersistError {
    fn kind(&self) -> Kind {
        Kind::Os
    }
}

impl IntoPy for BuildError {
    fn kind(&self) -> Kind {
        match std::error::Error::source(self) {
            Some(s) if s.is::<PersistError>() || s.is::<std::io::Error>() => Kind::Os,
            _ => Kind::Value,
        }
    }
}

impl IntoPy for SwapError {
    fn kind(&self) -> Kind {
        match std::error::Error::source(self) {
            Some(s) if s.is::<PersistError>() => Kind::Os,
            _ => Kind::Value,
        }
    }
}

impl IntoPy for SpecError {
    fn kind(&self) -> Kind {
        Kind::Value
    }
}

/// A `ValueError` of ours, for input checked on this side.
pub(crate) fn value_error(message: impl Into<String>) -> PyErr {
    raise(Kind::Value, message)
}

/// A `TypeError` of ours.
pub(crate) fn type_error(message: impl Into<String>) -> PyErr {
    raise(Kind::Type, message)
}

/// A `KeyError` of ours.
pub(crate) fn key_error(message: impl Into<String>) -> PyErr {
    raise(Kind::Key, message)
}

/// An `IndexError` of ours.
pub(crate) fn index_error(message: impl Into<String>) -> PyErr {
    raise(Kind::Index, message)
}
