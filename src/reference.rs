//! A sequential reference model.
