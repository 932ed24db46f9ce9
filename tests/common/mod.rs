//! Helpers the integration tests share: each test file takes what it needs with
//! `mod common;` (the command's tests too, by path). A helper lives here once two
//! files would otherwise write it twice.

// Each test file uses some of these, never all.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

/// How long a timed race runs: the environment variable `var` in milliseconds, or
/// 1.5 s (`REPLAYBUF_STRESS_MS` for the stress tests, `REPLAYBUF_RACE_MS` for the
/// deadlock races).
pub fn race_duration(var: &str) -> Duration {
    let ms = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    Duration::from_millis(ms)
}

/// A check word derived from a row's id: a row whose check is not `mix(id)` is torn.
pub fn mix(id: u64) -> u64 {
    id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed
}

/// Shared-memory regions of the tests: names unique to one test run, their files,
/// and their removal when a test ends.
pub mod shm {
    use super::PathBuf;

    /// A region name for test `test` of the suite `suite`, unique to this process.
    pub fn name(suite: &str, test: &str) -> String {
        format!("test-{suite}-{test}-{}", std::process::id())
    }

    /// The file of region `name`.
    pub fn path_of(name: &str) -> PathBuf {
        PathBuf::from(format!("/dev/shm/replaybuf.{name}"))
    }

    /// Removes a `/dev/shm` object when the test ends, passed or failed.
    pub struct Cleanup(pub PathBuf);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The learner-pipeline tests' buffer (`tests/pipeline.rs`, `tests/prefetch.rs`):
/// rows with an id, `obs = [id, -id]` and reward 1.
pub mod rewards {
    use replaybuf::{Batch, DType, ReplayBuffer, Spec};

    pub fn spec() -> Spec {
        Spec::builder()
            .field("obs", DType::F32, [2])
            .field("id", DType::I64, [])
            .field("reward", DType::F32, [])
            .build()
            .unwrap()
    }

    pub fn buffer(capacity: usize) -> ReplayBuffer {
        ReplayBuffer::builder(spec())
            .capacity(capacity)
            .seed(5)
            .build()
            .unwrap()
    }

    /// `n` rows with ids `first..`, `obs = [id, -id]`, reward 1.
    pub fn rows(rb: &ReplayBuffer, n: usize, first: i64) -> Batch {
        let mut b = rb.batch([n]);
        let ids: Vec<i64> = (first..first + n as i64).collect();
        let obs: Vec<f32> = ids.iter().flat_map(|&i| [i as f32, -(i as f32)]).collect();
        b.set("id", &ids).unwrap();
        b.set("obs", &obs).unwrap();
        b.column_mut::<f32>("reward").unwrap().fill(1.0);
        b
    }
}
