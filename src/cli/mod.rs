//! The command line: demonstration, benchmark, and what they share.

pub mod bench;
pub mod demo;
pub mod persist;
pub mod sim;
pub mod workloads;
