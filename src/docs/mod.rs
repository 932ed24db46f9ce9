//! Long-form documentation, as doc-only modules.
//!
//! Layer: base.

pub mod architecture;
pub mod orderings;

/// The README: its examples run as doctests, so they stay true.
#[doc = include_str!("../../README.md")]
pub mod readme {}
