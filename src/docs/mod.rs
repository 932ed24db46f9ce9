//! Long-form documentation, as doc-only modules.

pub mod orderings;
