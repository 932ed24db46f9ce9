//! Shared helpers of the loom tests live in `tests/common`.
