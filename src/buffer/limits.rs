//! The rate limit's controls: its counts, a new limit at run time, closing it.

use super::ReplayBuffer;
use crate::error::RateLimitError;
use crate::rate_limit::{Limiter, RateLimit, RateLimitStats};

/// The rate limit (see [`ReplayBufferBuilder::rate_limit`]).
///
/// [`ReplayBufferBuilder::rate_limit`]: crate::ReplayBufferBuilder::rate_limit
impl ReplayBuffer {
    /// What the rate limit has counted (rows inserted and sampled through it, waits
    /// and their time), or `None` if the buffer has no rate limit.
    pub fn rate_limit_stats(&self) -> Option<RateLimitStats> {
        self.limiter.as_ref().and_then(|l| l.stats())
    }

    /// Puts `limit` in force from now on, counts kept: every waiting call judges
    /// itself again by it (Reverb #134: a ratio changed mid-training). Refused if the
    /// buffer was built without a rate limit.
    pub fn set_rate_limit(&self, limit: RateLimit) -> Result<(), RateLimitError> {
        self.limiter()?.set(limit)
    }

    /// Closes the rate limit: every call waiting on it, and every later call that
    /// would wait, fails with [`RateLimitError::Closed`] (calls that may go still go).
    /// For shutting down: collectors blocked on learners that have stopped, or the
    /// other way round, return instead of waiting out their timeouts.
    pub fn close_rate_limit(&self) -> Result<(), RateLimitError> {
        self.limiter()?.close(true)
    }

    /// Opens a closed rate limit again: calls wait for their turn as before.
    pub fn reopen_rate_limit(&self) -> Result<(), RateLimitError> {
        self.limiter()?.close(false)
    }

    /// The limiter, or [`RateLimitError::NoLimit`] for a buffer built without one.
    fn limiter(&self) -> Result<&Limiter, RateLimitError> {
        self.limiter.as_deref().ok_or(RateLimitError::NoLimit)
    }
}
