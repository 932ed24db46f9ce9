//! Long-form documentation, as doc-only modules.

pub mod orderings;

/// The README: its examples run as doctests, so they stay true.
#[doc = include_str!("../../README.md")]
pub mod readme {}
