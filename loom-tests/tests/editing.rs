//! An in-place rewrite (`write_all`, an editor) racing a collector's extend: the
//! appender/editor handshake of `storage/shard.rs` keeps them out of each other's slot,
//! and neither deadlocks.
#![cfg(replaybuf_loom)]

mod common;

use common::{pair_spec, pairs, run_model, whole_rows};
use replaybuf::ReplayBuffer;

#[test]
fn write_all_racing_extend() {
    run_model("write_all vs extend", || {
        let rb = ReplayBuffer::builder(pair_spec())
            .capacity(2)
            .seed(4)
            .build()
            .unwrap();
        rb.extend(&pairs(&rb, &[2], 0)).unwrap();
        let editor = {
            let rb = rb.clone();
            loom::thread::spawn(move || rb.write_all(&pairs(&rb, &[2], 100), None))
        };
        rb.extend(&pairs(&rb, &[1], 7)).unwrap();
        editor.join().unwrap().expect("both positions held rows");
        let ids = whole_rows(&rb.read_all_in_order(None));
        // Position 1 was only ever edited. Position 0 ends with whichever came last:
        // the append (7) or the edit of the appended row (100).
        assert_eq!(ids[1], 101);
        assert!(ids[0] == 7 || ids[0] == 100, "position 0 holds {}", ids[0]);
    });
}
