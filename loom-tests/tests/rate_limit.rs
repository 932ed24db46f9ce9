//! The rate limiters' waits: an inserter and a sampler that wait on each other are
//! always woken (neither sleeps forever), and closing or a new limit frees a waiter.
//! Each model runs against both limiters: a heap buffer's (`RateLimiter`: counts
//! behind a mutex, waits on condition variables) and a shared region's
//! (`RegionRateLimiter`: atomic counts, sleepers on a futex, here its loom twin).
//! Under loom a wait has no timeout, so a lost wakeup is a deadlock loom reports.
#![cfg(replaybuf_loom)]

mod common;

use common::run_model;
use loom::sync::Arc;
use replaybuf::internals::{RateLimiter, RegionRateLimiter};
use replaybuf::{RateLimit, RateLimitError, RateLimitStats};

/// What the models ask of a limiter.
trait Limiter: Send + Sync + 'static {
    const KIND: &'static str;
    fn new(limit: RateLimit) -> Self;
    fn insert(&self, rows: u64) -> Result<(), RateLimitError>;
    fn sample(&self, rows: u64) -> Result<(), RateLimitError>;
    fn set(&self, limit: RateLimit);
    fn close(&self);
    fn stats(&self) -> RateLimitStats;
}

impl Limiter for RateLimiter {
    const KIND: &'static str = "heap";
    fn new(limit: RateLimit) -> Self {
        RateLimiter::new(limit)
    }
    fn insert(&self, rows: u64) -> Result<(), RateLimitError> {
        RateLimiter::insert(self, rows)
    }
    fn sample(&self, rows: u64) -> Result<(), RateLimitError> {
        RateLimiter::sample(self, rows)
    }
    fn set(&self, limit: RateLimit) {
        RateLimiter::set(self, limit)
    }
    fn close(&self) {
        RateLimiter::close(self, true)
    }
    fn stats(&self) -> RateLimitStats {
        RateLimiter::stats(self)
    }
}

impl Limiter for RegionRateLimiter {
    const KIND: &'static str = "shared";
    fn new(limit: RateLimit) -> Self {
        RegionRateLimiter::new(limit)
    }
    fn insert(&self, rows: u64) -> Result<(), RateLimitError> {
        RegionRateLimiter::insert(self, rows)
    }
    fn sample(&self, rows: u64) -> Result<(), RateLimitError> {
        RegionRateLimiter::sample(self, rows)
    }
    fn set(&self, limit: RateLimit) {
        RegionRateLimiter::set(self, limit).unwrap()
    }
    fn close(&self) {
        RegionRateLimiter::close(self, true).unwrap()
    }
    fn stats(&self) -> RateLimitStats {
        RegionRateLimiter::stats(self)
    }
}

/// A queue of one row: each insert waits for the sample of the row before it, and
/// each sample for an insert.
fn lockstep<L: Limiter>() {
    run_model(
        &format!("{}: queue of one, two rows each way", L::KIND),
        || {
            let l = Arc::new(L::new(RateLimit::queue(1).unwrap()));
            let sampler = {
                let l = l.clone();
                loom::thread::spawn(move || {
                    l.sample(1).unwrap();
                    l.sample(1).unwrap();
                })
            };
            l.insert(1).unwrap();
            l.insert(1).unwrap();
            sampler.join().unwrap();
            let s = l.stats();
            assert_eq!((s.inserts, s.samples), (2, 2));
        },
    );
}

/// Closing wakes a sample waiting on an empty buffer; it either went first (it could
/// not) or fails as closed.
fn closing<L: Limiter>() {
    run_model(&format!("{}: close while a sample waits", L::KIND), || {
        let l = Arc::new(L::new(RateLimit::min_size(1)));
        let sampler = {
            let l = l.clone();
            loom::thread::spawn(move || l.sample(1))
        };
        l.close();
        assert_eq!(sampler.join().unwrap(), Err(RateLimitError::Closed));
    });
}

/// A new limit wakes an insert waiting on a full queue, and it goes.
fn widening<L: Limiter>() {
    run_model(
        &format!("{}: widen the queue while an insert waits", L::KIND),
        || {
            let l = Arc::new(L::new(RateLimit::queue(1).unwrap()));
            l.insert(1).unwrap();
            let inserter = {
                let l = l.clone();
                loom::thread::spawn(move || l.insert(1))
            };
            l.set(RateLimit::queue(2).unwrap());
            inserter.join().unwrap().unwrap();
            assert_eq!(l.stats().inserts, 2);
        },
    );
}

#[test]
fn an_inserter_and_a_sampler_in_lockstep_both_finish() {
    lockstep::<RateLimiter>();
}

#[test]
fn closing_frees_a_waiting_sample() {
    closing::<RateLimiter>();
}

#[test]
fn a_wider_limit_frees_a_waiting_insert() {
    widening::<RateLimiter>();
}

#[test]
fn shared_an_inserter_and_a_sampler_in_lockstep_both_finish() {
    lockstep::<RegionRateLimiter>();
}

#[test]
fn shared_closing_frees_a_waiting_sample() {
    closing::<RegionRateLimiter>();
}

#[test]
fn shared_a_wider_limit_frees_a_waiting_insert() {
    widening::<RegionRateLimiter>();
}
