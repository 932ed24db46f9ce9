//! What every loom test shares.
#![allow(dead_code)]

use replaybuf::{Batch, DType, ReplayBuffer, Spec};

/// Runs `f` under loom's model checker, in every interleaving its preemption bound
/// allows (`LOOM_MAX_PREEMPTIONS`, default 2 here: loom's docs find 2-3 catch most
/// bugs).
pub fn run_model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    run_model_at_most(usize::MAX, name, f);
}

/// [`run_model`] at a preemption bound of at most `bound`: for a model in which two
/// threads wait on a third (each looping on a load, with `yield_now` between), which
/// loom 0.7 cannot explore far. Once the third thread has been preempted, the two
/// waiters can take turns yielding to each other without it ever running again, and
/// the model ends in loom's "exceeded maximum number of branches", however high that
/// limit. (Three threads, one storing a flag after three other stores and two looping
/// on the flag, fail so at bound 2; with one waiter they pass at 3.)
pub fn run_model_at_most(bound: usize, name: &str, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(2).min(bound));
    eprintln!("loom model: {name}");
    builder.check(f);
}

/// A row of two words that must always agree: `a == b`, and both name the row.
pub fn pair_spec() -> Spec {
    Spec::builder()
        .field("a", DType::U64, [])
        .field("b", DType::U64, [])
        .build()
        .expect("a valid spec")
}

/// A batch of `shape` whose rows are `first, first + 1, ...` in both fields.
pub fn pairs(rb: &ReplayBuffer, shape: &[usize], first: u64) -> Batch {
    let mut batch = rb.batch(shape);
    let ids: Vec<u64> = (first..first + batch.len() as u64).collect();
    batch.set("a", &ids).expect("field a");
    batch.set("b", &ids).expect("field b");
    batch
}

/// Asserts every row of `batch` is whole, and returns the ids.
pub fn whole_rows(batch: &Batch) -> Vec<u64> {
    let a = batch.column::<u64>("a").expect("field a");
    let b = batch.column::<u64>("b").expect("field b");
    assert_eq!(a, b, "a torn row: fields from different writes");
    a.to_vec()
}
