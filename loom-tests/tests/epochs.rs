//! Two learners sharing a without-replacement epoch: each row comes out once per
//! epoch, whoever draws it, and the epoch's turnover happens once.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::error::SampleError;
use replaybuf::sampler::WithoutReplacement;
use replaybuf::ReplayBuffer;

#[test]
fn learners_split_one_epoch() {
    run_model("two learners, one epoch", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .sampler(WithoutReplacement::new().shuffle(false))
            .seed(5)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[2], 0)).unwrap();
        let other = {
            let rb = rb.clone();
            loom::thread::spawn(move || whole_rows(&rb.sample(1).unwrap()))
        };
        let mut ids = whole_rows(&rb.sample(1).unwrap());
        ids.extend(other.join().unwrap());
        ids.sort_unstable();
        assert_eq!(ids, [0, 1], "a row came twice in one epoch");
        assert_eq!(rb.sample(1).unwrap_err(), SampleError::EpochEnd);
        assert_eq!(
            whole_rows(&rb.sample(1).unwrap()),
            [0],
            "a new epoch starts over"
        );
    });
}
