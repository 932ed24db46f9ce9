//! A first smoke test of the public API.
use replaybuf::*;

fn spec() -> Spec {
    Spec::builder()
        .field("obs", DType::F32, [3])
        .field("id", DType::U64, [])
        .field("done", DType::Bool, [])
        .build()
        .unwrap()
}

#[test]
fn smoke() {
    let rb = ReplayBuffer::builder(spec())
        .capacity(10)
        .seed(1)
        .build()
        .unwrap();
    let mut b = rb.batch([4]);
    b.column_mut::<u64>("id")
        .unwrap()
        .copy_from_slice(&[1, 2, 3, 4]);
    let w = rb.extend(&b).unwrap();
    assert_eq!(w.to_vec(), vec![0, 1, 2, 3]);
    let s = rb.sample(100).unwrap();
    for (i, id) in s.index().iter().zip(s.column::<u64>("id").unwrap()) {
        assert_eq!(*id, i + 1);
    }
    for _ in 0..3 {
        rb.extend(&b).unwrap();
    }
    assert_eq!(rb.len(), 10);
    assert_eq!(rb.write_count(), 16);
    let all = rb.read_all_in_order(None);
    println!("{:?} {:?}", all.index(), all.column::<u64>("id").unwrap());
    let g = rb.get(0).unwrap();
    assert_eq!(g.column::<u64>("id").unwrap(), &[3]);
}
