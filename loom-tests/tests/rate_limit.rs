//! The rate limiter's waits: an inserter and a sampler that wait on each other are
//! always woken (neither sleeps forever), and closing or a new limit frees a waiter.
//! Under loom a wait has no timeout, so a lost wakeup is a deadlock loom reports.
#![cfg(replaybuf_loom)]

mod common;

use common::run_model;
use loom::sync::Arc;
use replaybuf::internals::RateLimiter;
use replaybuf::{RateLimit, RateLimitError};

/// A queue of one row: each insert waits for the sample of the row before it, and
/// each sample for an insert.
#[test]
fn an_inserter_and_a_sampler_in_lockstep_both_finish() {
    run_model("queue of one, two rows each way", || {
        let l = Arc::new(RateLimiter::new(RateLimit::queue(1).unwrap()));
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
    });
}

/// Closing wakes a sample waiting on an empty buffer; it either went first (it could
/// not) or fails as closed.
#[test]
fn closing_frees_a_waiting_sample() {
    run_model("close while a sample waits", || {
        let l = Arc::new(RateLimiter::new(RateLimit::min_size(1)));
        let sampler = {
            let l = l.clone();
            loom::thread::spawn(move || l.sample(1))
        };
        l.close(true);
        assert_eq!(sampler.join().unwrap(), Err(RateLimitError::Closed));
    });
}

/// A new limit wakes an insert waiting on a full queue, and it goes.
#[test]
fn a_wider_limit_frees_a_waiting_insert() {
    run_model("widen the queue while an insert waits", || {
        let l = Arc::new(RateLimiter::new(RateLimit::queue(1).unwrap()));
        l.insert(1).unwrap();
        let inserter = {
            let l = l.clone();
            loom::thread::spawn(move || l.insert(1))
        };
        l.set(RateLimit::queue(2).unwrap());
        inserter.join().unwrap().unwrap();
        assert_eq!(l.stats().inserts, 2);
    });
}
