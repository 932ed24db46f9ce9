//! `replaybuf._native`: the engine's Python face, wrapped by the `replaybuf` package
//! (see `python/replaybuf/`). Every class and function here is reached through that
//! package; its docs are the user's.

mod arrays;
mod buffer;
mod config;
mod convert;
mod errors;
mod fields;
mod gil;
mod recycle;
mod tmrl;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    gil::register(m)?;
    m.add_class::<buffer::Buffer>()?;
    m.add_function(wrap_pyfunction!(buffer::_forked, m)?)?;
    m.add_class::<tmrl::Memory>()?;
    m.add("MARK_VALID", 1u8)?;
    m.add("MARK_START", 2u8)?;
    m.add("MARK_END", 4u8)?;
    m.add("MARK_TRUNCATED", 8u8)?;
    // The index of a slice batch's padding rows (no row), which an update skips.
    m.add("PADDING_INDEX", replaybuf::PADDING_INDEX)?;
    Ok(())
}
