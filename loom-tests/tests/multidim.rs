//! ndim 2: two collectors each own one environment's column of a `[2, 2]` storage and
//! extend it concurrently while a learner reads; every environment's column holds its
//! own trajectory, in time order, and no read is torn.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::ReplayBuffer;

#[test]
fn collectors_own_their_environment_columns() {
    run_model("ndim-2 extends by env group", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(4)
            .ndim(2)
            .envs(2)
            .dim_extend(0)
            .shards(2)
            .seed(3)
            .build()
            .unwrap();
        let spawn = |base: u64| {
            let writer = rb.writer();
            loom::thread::spawn(move || {
                // Env `e`'s steps carry ids base + t; three steps lap its 2-step ring.
                for t in 0..3 {
                    writer
                        .extend(&pairs(writer.buffer(), &[1, 1], base + t))
                        .unwrap();
                }
                writer.envs().unwrap().start
            })
        };
        let (a, b) = (spawn(100), spawn(200));
        if let Ok(row) = rb.get(0) {
            whole_rows(&row);
        }
        let a_env = a.join().unwrap();
        let b_env = b.join().unwrap();
        assert_ne!(a_env, b_env);
        // Index t * 2 + e. Steps 1 and 2 survive; step 2 sits at t = 0.
        let all = rb.read_all_in_order(None);
        let ids = whole_rows(&all);
        let base = |env: usize| if env == a_env { 100 } else { 200 };
        let expect: Vec<u64> = [(0, 0), (0, 1), (1, 0), (1, 1)]
            .iter()
            .map(|&(t, e)| base(e) + if t == 0 { 2 } else { 1 })
            .collect();
        assert_eq!(ids, expect);
    });
}
