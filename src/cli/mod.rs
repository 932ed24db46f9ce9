//! The command line: demonstration, benchmark, and what they share.

pub mod bench;
pub mod demo;
pub mod persist;
pub mod shared_bench;
pub mod sim;
pub mod workloads;
