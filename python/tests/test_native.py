"""The native face, replaybuf.ReplayBuffer: every sampler, ndim-2 storage, write
policies, file-backed storage, checkpoints, sample_into, priority updates, and bad
input that changes nothing. Every error is a ReplayBufferError and its builtin."""

import gc
import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest
import replaybuf
from replaybuf import (
    MARK_END,
    MARK_START,
    MARK_TRUNCATED,
    MARK_VALID,
    ReplayBuffer,
    ReplayBufferError,
)

# Every field derives from `id`: a row read back is checked whole by `check`.
SPEC = {
    "id": ("int64", ()),
    "obs": ("float32", (3,)),
    "reward": ("float32", ()),
    "traj": ("int64", ()),
    ("next", "done"): ("bool", ()),
}
TRAJ = 5  # steps per trajectory: ids 5t .. 5t+4


def data(ids):
    ids = np.asarray(ids, np.int64)
    return {
        "id": ids,
        "obs": (ids[..., None] * np.array([1, 2, 3])).astype(np.float32),
        "reward": (ids % 97).astype(np.float32),
        "traj": ids // TRAJ,
        ("next", "done"): ids % TRAJ == TRAJ - 1,
    }


def check(batch):
    """Asserts every row is whole; returns the ids."""
    ids = batch["id"]
    want = data(ids)
    for key in ("obs", "reward", "traj", ("next", "done")):
        np.testing.assert_array_equal(batch[key], want[key], err_msg=str(key))
    return ids


def buffer(capacity=32, n=10, **kw):
    kw.setdefault("seed", 1)
    rb = ReplayBuffer(capacity, spec=SPEC, **kw)
    if n:
        rb.extend(data(np.arange(n)))
    return rb


def raises(builtin, match=None):
    """pytest.raises of a ReplayBufferError that is also ``builtin``."""

    class Both:
        def __enter__(self):
            self.ctx = pytest.raises(builtin, match=match)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            out = self.ctx.__exit__(*exc)
            assert isinstance(self.info.value, ReplayBufferError), type(self.info.value).__mro__
            return out

    return Both()


# Samplers -----------------------------------------------------------------------------


def test_uniform():
    rb = buffer(n=10)
    seen = set()
    for _ in range(50):
        batch = rb.sample(8)
        assert set(batch) == set(SPEC) | {"index", "generation"}
        ids = check(batch)
        assert batch["index"].dtype == batch["generation"].dtype == np.uint64
        # A row's index reads back the same row.
        np.testing.assert_array_equal(rb.get(batch["index"])["id"], ids)
        seen |= set(ids.tolist())
    assert seen == set(range(10))
    assert not rb.prioritized and not rb.samples_slices
    with raises(ValueError, "batch size"):
        rb.sample()
    assert len(buffer(n=10, batch_size=6).sample()["id"]) == 6


def test_without_replacement_epochs():
    rb = buffer(n=10, sampler=replaybuf.WithoutReplacement())
    epoch = [check(rb.sample(4)) for _ in range(3)]
    assert [len(b) for b in epoch] == [4, 4, 2]  # the last batch short
    assert sorted(np.concatenate(epoch).tolist()) == list(range(10))
    with pytest.raises(replaybuf.EpochEnd):  # the call after the epoch's last batch
        rb.sample(4)
    assert sorted(np.concatenate([rb.sample(4)["id"] for _ in range(3)]).tolist()) == list(
        range(10)
    )
    # drop_last: the epoch ends rather than give 2 rows; EpochEnd is a StopIteration.
    rb = buffer(n=10, sampler=replaybuf.WithoutReplacement(drop_last=True))
    assert [len(rb.sample(4)["id"]) for _ in range(2)] == [4, 4]
    with raises(StopIteration):
        rb.sample(4)
    # No shuffle: storage order.
    rb = buffer(n=10, sampler=replaybuf.WithoutReplacement(shuffle=False))
    assert [rb.sample(4)["id"].tolist() for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_prioritized():
    rb = buffer(n=10, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.5))
    assert rb.prioritized and (rb.alpha, rb.beta) == (1.0, 0.5)
    # New rows come in at the largest priority: all equal, so weights are all 1.
    batch = rb.sample(16)
    check(batch)
    assert batch["weight"].dtype == np.float32
    np.testing.assert_allclose(batch["weight"], 1.0)
    # Only row 3 has priority: it is drawn every time, with the smallest weight
    # ((N P)^-beta over the largest of any row: (10 * 1)^-0.5 / (10 * 1e-8)^-0.5).
    assert rb.update_priority(np.arange(10), np.where(np.arange(10) == 3, 1.0, 0.0)) == (10, 0)
    batch = rb.sample(64)
    assert set(batch["id"].tolist()) == {3}
    np.testing.assert_allclose(batch["weight"], 1e-4, rtol=1e-3)
    assert rb.priority(3) == 1.0 and rb.priority(4) == 0.0
    rb.beta = 0.0
    np.testing.assert_allclose(rb.sample(4)["weight"], 1.0)
    # Proportional: priorities 1 and 3 draw about 1:3.
    rb = buffer(n=2, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.4), seed=5)
    rb.update_priority([0, 1], [1.0, 3.0])
    counts = np.bincount(rb.sample(20_000)["id"], minlength=2)
    assert abs(counts[1] / counts.sum() - 0.75) < 0.02


def test_update_priority_takes_any_array_like():
    rb = buffer(n=8, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.5))
    rows = rb.read_all_in_order()
    index, generation = rows["index"][:4], rows["generation"][:4]
    # Reversed views, lists, float32, a column, and uint64s unaligned in a byte buffer:
    # each is read as the flat array it holds.
    raw = np.zeros(8 * 4 + 1, np.uint8)
    unaligned = raw[1:].view(np.uint64)
    unaligned[:] = index
    assert not unaligned.flags.aligned
    for idx, prio, gen in [
        (index[::-1], np.arange(8.0)[::2][::-1] + 1, generation[::-1]),
        (list(index), [1.0, 3.0, 5.0, 7.0], list(generation)),
        (index, np.array([[1], [3], [5], [7]], np.float32), generation),
        (unaligned, np.array([1.0, 3.0, 5.0, 7.0]), generation),
    ]:
        assert rb.update_priority(idx, prio, generation=gen) == (4, 0)
        for i, p in zip(index, [1.0, 3.0, 5.0, 7.0]):
            assert rb.priority(int(i)) == p


def test_slices_of_trajectories():
    rb = buffer(capacity=64, n=30, sampler=replaybuf.Slice(slice_len=4, traj_key="traj"))
    assert rb.samples_slices
    batch = rb.sample(12)
    ids, marks = check(batch), batch["marks"]
    assert marks.dtype == np.uint8
    for s in range(3):
        part, m = ids[4 * s : 4 * s + 4], marks[4 * s : 4 * s + 4]
        # Consecutive steps of one trajectory.
        assert (np.diff(part) == 1).all() and len(set(part // TRAJ)) == 1
        assert (m & MARK_VALID).all()
        # Start and end mark a trajectory's first and last step, truncated a slice
        # cut before its trajectory's end.
        assert bool(m[0] & MARK_START) == (part[0] % TRAJ == 0)
        assert not (m[1:] & MARK_START).any() and not (m[:-1] & (MARK_END | MARK_TRUNCATED)).any()
        last = m[-1]
        ends_there = part[-1] % TRAJ == TRAJ - 1
        assert bool(last & MARK_END) == ends_there
        assert bool(last & MARK_TRUNCATED) == (not ends_there)
    # Trajectories told apart by their end flag (the default end key) read the same.
    rb = buffer(capacity=64, n=30, sampler=replaybuf.Slice(num_slices=3))
    ids = check(rb.sample(12))
    for s in range(3):
        part = ids[4 * s : 4 * s + 4]
        assert (np.diff(part) == 1).all() and len(set(part // TRAJ)) == 1


def test_slices_without_replacement_and_prioritized():
    slices = replaybuf.Slice(
        slice_len=4, traj_key="traj", without_replacement=replaybuf.WithoutReplacement()
    )
    rb = buffer(capacity=64, n=30, sampler=slices)
    starts = []
    for _ in range(3):
        ids = check(rb.sample(8))
        starts += [ids[0] // TRAJ, ids[4] // TRAJ]
    assert sorted(starts) == list(range(6))  # each trajectory once in the epoch
    with pytest.raises(replaybuf.EpochEnd):
        rb.sample(8)
    p = replaybuf.Prioritized(alpha=1.0, beta=0.4)
    rb = buffer(
        capacity=64, n=30, sampler=replaybuf.Slice(slice_len=4, traj_key="traj", prioritized=p)
    )
    batch = rb.sample(8)
    check(batch)
    assert {"weight", "marks"} <= set(batch)


# ndim 2 -------------------------------------------------------------------------------


def steps(t0, t, envs):
    """``t`` steps of ``envs`` environments: id ``100 * env + step``."""
    ids = np.arange(t0, t0 + t)[:, None] + 100 * np.arange(envs)[None, :]
    return data(ids)


def test_ndim2_storage():
    envs = 3
    rb = ReplayBuffer(8 * envs, spec=SPEC, ndim=2, envs=envs, seed=2)
    assert (rb.ndim, rb.envs, rb.capacity) == (2, 3, 24)
    index = rb.extend(steps(0, 4, envs))
    assert index.shape == (4, envs) and len(rb) == 12
    rb.extend(steps(4, 6, envs))  # 10 steps into 8: the 2 oldest of each env go
    assert len(rb) == 24 and rb.write_count == 30
    ids = check(rb.read_all_in_order())
    assert sorted(ids.tolist()) == sorted(s + 100 * e for s in range(2, 10) for e in range(envs))
    check(rb.sample(32))
    # (t, E) with E not the storage's: refused, nothing written.
    with raises(ValueError):
        rb.extend(steps(10, 2, envs + 1))
    with raises(ValueError, match="ndim-1 buffer only"):  # one transition: ndim 1
        rb.add({k: v[0, 0] for k, v in steps(0, 1, envs).items()})
    assert rb.write_count == 30
    # dim_extend=1: batches of (E, t).
    rb = ReplayBuffer(8 * envs, spec=SPEC, ndim=2, envs=envs, dim_extend=1, seed=2)
    flipped = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in steps(0, 4, envs).items()}
    assert rb.extend(flipped).shape == (envs, 4)
    assert sorted(check(rb.read_all_in_order()).tolist()) == sorted(
        steps(0, 4, envs)["id"].ravel().tolist()
    )


def test_ndim2_rows_read_by_position_write_back_by_position():
    envs = 2
    rb = ReplayBuffer(4 * envs, spec=SPEC, ndim=2, envs=envs, seed=2)
    rb.extend(steps(0, 4, envs))
    got = rb.get([1, 6])
    # The flat rows `get` gives go back where they came from, as does all of it.
    new = data(got["id"] + 1000)
    rb.write_at(got["index"], new)
    assert check(rb.get([1, 6])).tolist() == (got["id"] + 1000).tolist()
    every = rb.read_all_in_order()
    rb.write_all(data(every["id"] + 5000))
    assert check(rb.read_all_in_order()).tolist() == (every["id"] + 5000).tolist()
    # Rows shaped (t, E) still go in storage order.
    rb.write_all(steps(0, 4, envs))
    with raises(ValueError):
        rb.write_at([0, 1], data([1, 2, 3]))


# Write policies -----------------------------------------------------------------------


def test_max_value_keeps_the_top_rows():
    rb = ReplayBuffer(4, spec=SPEC, write_policy=replaybuf.MaxValue(rank_key="reward"))
    index = rb.extend(data([5, 1, 7, 3, 9, 2]))  # rewards are the ids here
    rejected = 2**64 - 1
    assert (index == rejected).sum() == 2
    assert sorted(check(rb.read_all_in_order()).tolist()) == [3, 5, 7, 9]
    assert rb.extend(data([2]))[0] == rejected  # below every kept row
    rb.extend(data([8]))  # replaces the lowest (3)
    assert sorted(rb.read_all_in_order()["id"].tolist()) == [5, 7, 8, 9]


def test_immutable_refuses_writes():
    rb = ReplayBuffer(4, spec=SPEC, write_policy=replaybuf.Immutable())
    with raises(ValueError, "immutable"):
        rb.extend(data([1, 2]))
    with raises(ValueError, "immutable"):
        rb.add({k: v[0] for k, v in data([1]).items()})
    assert len(rb) == 0 and rb.write_count == 0


# Files and checkpoints ----------------------------------------------------------------


def test_file_backed_storage_is_reopened_with_its_rows(tmp_path):
    d = tmp_path / "rows"
    rb = buffer(capacity=16, n=10, memmap=d)
    rb.flush()
    del rb
    gc.collect()
    with raises(OSError, "already holds a buffer"):
        ReplayBuffer(16, spec=SPEC, memmap=d)
    again = ReplayBuffer(16, spec=SPEC, memmap=d, existsok=True)
    assert len(again) == 10
    assert check(again.read_all_in_order()).tolist() == list(range(10))
    again.extend(data([10, 11]))
    del again
    gc.collect()
    ds = ReplayBuffer.open_dataset(d)
    assert sorted(check(ds.sample(64)).tolist())[-1] == 11 and len(ds) == 12
    with raises(ValueError, "immutable"):
        ds.extend(data([12]))
    assert len(ds) == 12


def test_a_buffer_that_sampled_before_its_checkpoint_and_the_loaded_copy_draw_alike(tmp_path):
    # Each sample drew from a pooled learner's own stream, which no checkpoint holds:
    # the copy went on from a fresh one, and a refused loads dropped the pool and
    # changed the draws too.
    for sampler in (None, replaybuf.Prioritized(alpha=0.6, beta=0.4)):
        rb = buffer(capacity=100, n=100, sampler=sampler, seed=5)
        twin = buffer(capacity=100, n=100, sampler=sampler, seed=5)
        for b in (rb, twin):
            for _ in range(3):
                b.sample(8)
        rb.dumps(tmp_path / "c")
        copy = ReplayBuffer.from_checkpoint(tmp_path / "c")
        with raises(OSError):
            twin.loads(tmp_path / "missing")
        ahead = [rb.sample(8)["id"].tolist() for _ in range(3)]
        assert [copy.sample(8)["id"].tolist() for _ in range(3)] == ahead
        assert [twin.sample(8)["id"].tolist() for _ in range(3)] == ahead


def test_checkpoints_round_trip(tmp_path):
    sampler = replaybuf.Prioritized(alpha=0.6, beta=0.4)
    rb = buffer(capacity=32, n=20, sampler=sampler, seed=3)
    rb.update_priority(np.arange(20), np.arange(20) + 1.0)
    rb.dumps(tmp_path / "c")
    ahead = [rb.sample(8)["id"].tolist() for _ in range(3)]
    # from_checkpoint: the same rows, priorities, configuration and random streams.
    copy = ReplayBuffer.from_checkpoint(tmp_path / "c")
    assert (len(copy), copy.capacity, copy.seed, copy.alpha, copy.beta) == (20, 32, 3, 0.6, 0.4)
    assert [copy.priority(i) for i in range(20)] == [i + 1.0 for i in range(20)]
    assert [copy.sample(8)["id"].tolist() for _ in range(3)] == ahead
    # loads: into a buffer of the same layout, replacing what it held.
    other = buffer(capacity=32, n=5, sampler=sampler, seed=99)
    other.loads(tmp_path / "c")
    assert len(other) == 20 and other.seed == 3
    assert check(other.read_all_in_order()).tolist() == list(range(20))
    # open_dataset: read-only.
    ds = ReplayBuffer.open_dataset(tmp_path / "c")
    assert len(ds) == 20 and len(check(ds.sample(16))) == 16
    with raises(ValueError, "immutable"):
        ds.extend(data([1]))
    # clear too (it emptied the dataset's rows).
    with raises(ValueError, "read-only"):
        ds.clear()
    assert len(ds) == 20
    # A checkpoint of another layout is refused by loads, which changes nothing.
    small = ReplayBuffer(8, spec={"x": ("float32", ())})
    small.extend({"x": np.ones(3, np.float32)})
    with raises(OSError):
        small.loads(tmp_path / "c")
    assert len(small) == 3


# sample_into --------------------------------------------------------------------------


def out_arrays(rb, n, extra=()):
    out = {key: np.empty((n,) + shape, dtype) for key, dtype, shape in rb.spec}
    out["index"] = np.empty(n, rb.index_dtype)
    out["generation"] = np.empty(n, np.uint64)
    for name, dtype in extra:
        out[name] = np.empty(n, dtype)
    return out


def test_sample_into_allocates_nothing():
    rb = buffer(capacity=1024, n=1024, sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4))
    out = out_arrays(rb, 32, [("weight", np.float32)])
    assert rb.sample_into(out) == 32
    check(out)
    before = {k: v.__array_interface__["data"][0] for k, v in out.items()}
    for _ in range(100):
        rb.sample_into(out)
    gc.collect()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(5000):
            rb.sample_into(out)
        current, peak = tracemalloc.get_traced_memory()
        into = (current - base, peak - base)
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(10):
            rb.sample(32)
        _, sample_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Nothing grows or comes and goes; sample() by contrast allocates its batch.
    assert into[0] < 1024 and into[1] < 1024, into
    assert sample_peak - base > 32 * 4 * 3
    assert {k: v.__array_interface__["data"][0] for k, v in out.items()} == before
    check(out)


def test_sample_into_refuses_arrays_it_cannot_fill():
    rb = buffer(n=10)
    good = out_arrays(rb, 4)
    bad_dtype = dict(good, obs=np.empty((4, 3), np.float64))
    with raises(TypeError):
        rb.sample_into(bad_dtype)
    with raises(KeyError):
        rb.sample_into({k: v for k, v in good.items() if k != "reward"})
    with raises(ValueError, "C-contiguous"):
        rb.sample_into(dict(good, obs=np.empty((3, 4), np.float32).T))
    with raises(ValueError, "share memory"):
        rb.sample_into(dict(good, traj=good["id"]))
    with raises(ValueError, "shape"):
        rb.sample_into(dict(good, obs=np.empty((4, 2), np.float32)))
    assert rb.sample_into(good) == 4


def misaligned_empty(dtype):
    """An empty array whose data sits one byte off its dtype's alignment: numpy calls
    it aligned (it has no elements)."""
    return np.ndarray((0,), dtype, buffer=bytearray(9), offset=1)


def test_empty_arrays_anywhere_in_memory_are_taken_not_a_panic():
    # A cast of no bytes checked their address: a PanicException from inside the call.
    rb = buffer(n=10, sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4))
    out = out_arrays(rb, 0)
    out["index"] = misaligned_empty(rb.index_dtype)
    out["generation"] = misaligned_empty(np.uint64)
    out["weight"] = misaligned_empty(np.float32)
    try:
        assert rb.sample_into(out) == 0
    except ReplayBufferError:
        pass
    assert rb.update_priority(
        misaligned_empty(np.uint64), misaligned_empty(np.float64), misaligned_empty(np.uint64)
    ) == (0, 0)
    assert rb.update_priority(np.zeros(0, np.int64), [], np.zeros(0, np.int64)) == (0, 0)


def test_sample_into_names_an_index_of_the_wrong_shape():
    rb = buffer(capacity=32, n=10)
    out = out_arrays(rb, 3)
    out["index"] = np.zeros((3, 2), np.uint64)
    with raises(ValueError, "`index` has shape"):
        rb.sample_into(out)


def test_index_dtype_none_is_refused_by_name():
    rb = buffer()
    with raises(TypeError, "not a dtype: None"):
        rb.index_dtype = None
    assert rb.index_dtype == np.uint64


def test_index_dtype_int64_gives_the_same_positions_signed():
    rb = buffer(n=10)
    assert rb.index_dtype == np.uint64
    rb.index_dtype = np.int64
    assert rb.index_dtype == np.int64
    batch = rb.sample(6)
    assert batch["index"].dtype == np.int64
    # Each row's index is its position: ids 0..9 went to positions 0..9.
    np.testing.assert_array_equal(batch["index"], check(batch))
    out = out_arrays(rb, 4)
    assert out["index"].dtype == np.int64
    assert rb.sample_into(out) == 4
    np.testing.assert_array_equal(out["index"], check(out))
    with raises(TypeError, "index_dtype"):
        rb.index_dtype = np.float32
    assert rb.index_dtype == np.int64


def test_an_int64_padding_index_is_skipped_by_a_priority_update():
    # A short slice's padding is index -1 in int64: the update refused the sample's
    # own index as negative.
    p = replaybuf.Prioritized(alpha=1.0, beta=0.4)
    sampler = replaybuf.Slice(slice_len=8, traj_key="traj", strict_length=False, prioritized=p)
    rb = buffer(capacity=64, n=30, sampler=sampler)
    rb.index_dtype = np.int64
    batch = rb.sample(16)
    padding = batch["index"] == -1
    assert padding.any() and (batch["marks"][padding] & MARK_VALID == 0).all()
    applied, stale = rb.update_priority(batch["index"], np.full(16, 2.0), batch["generation"])
    assert applied == (~padding).sum() and stale == 0
    with raises(IndexError, "negative"):
        rb.update_priority(np.array([-2, 0]), [1.0, 1.0])


# Priorities ---------------------------------------------------------------------------


def test_stale_priority_updates_are_dropped_and_counted():
    rb = buffer(capacity=4, n=4, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.4))
    rb.update_priority(np.arange(4), [1.0, 1.0, 1.0, 1.0])
    batch = rb.sample(1)
    (i,) = batch["index"]
    rb.extend(data(np.arange(4, 8)))  # every row replaced: the sampled one too
    assert rb.update_priority(batch["index"], [5.0], batch["generation"]) == (0, 1)
    assert rb.priority(i) != 5.0
    # With the row's current generation the update applies; without one, it goes to
    # whatever row is at the index now (TorchRL's behaviour).
    now = rb.get(batch["index"])["generation"]
    assert rb.update_priority(batch["index"], [5.0], now) == (1, 0)
    assert rb.update_priority(batch["index"], [6.0]) == (1, 0) and rb.priority(i) == 6.0


# Bad input changes nothing ------------------------------------------------------------


def state(rb):
    rows = rb.read_all_in_order()
    prio = [rb.priority(int(i)) for i in rows["index"]] if rb.prioritized else None
    return len(rb), rb.write_count, {str(k): v.tolist() for k, v in rows.items()}, prio


def wrong(**changes):
    batch = data(np.arange(100, 104))
    for key, value in changes.items():
        if value is None:
            del batch[key]
        else:
            batch[key] = value
    return batch


BAD_EXTENDS = [
    ("dtype", TypeError, wrong(obs=np.zeros((4, 3), np.float64))),
    ("dtype of id", TypeError, wrong(id=np.arange(4, dtype=np.int32))),
    ("shape", ValueError, wrong(obs=np.zeros((4, 2), np.float32))),
    ("batch shape", ValueError, wrong(reward=np.zeros(5, np.float32))),
    ("non-contiguous", ValueError, wrong(obs=np.zeros((3, 4), np.float32).T)),
    ("missing key", KeyError, wrong(reward=None)),
    ("unknown key", KeyError, dict(wrong(), extra=np.zeros(4))),
    ("not a dict", TypeError, [1, 2, 3]),
]


@pytest.mark.parametrize("what,builtin,batch", BAD_EXTENDS, ids=[b[0] for b in BAD_EXTENDS])
def test_a_bad_extend_changes_nothing(what, builtin, batch):
    rb = buffer(capacity=8, n=6, sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4))
    before = state(rb)
    with raises(builtin):
        rb.extend(batch)
    assert state(rb) == before
    # Not even the cursor moved: the next rows go where they would have gone.
    assert rb.extend(data([6, 7])).tolist() == [6, 7]


CONVERTED = {"i": ("int64", ()), "u": ("uint8", ()), "f": ("float32", ())}
FITS = {"i": [1, -2], "u": [0, 255], "f": [0.1, 2]}
# Values numpy's own cast would change without a word: floats truncated into an
# integer field, integers wrapped around the field's range, a float made infinite.
CHANGED = [
    ("floats into int64", {"i": [0.7, 1.9]}, "got float64 values"),
    ("ints outside uint8", {"u": [300, -1]}, "outside its range"),
    ("float beyond float32", {"f": [1e300, 0.0]}, "outside its range"),
    # Rounded to 16777216: stored without a word.
    ("int float32 rounds", {"f": [16777217, 0]}, "cannot hold exactly"),
]


def assert_converted_only_where_values_survive(to_value):
    """``to_value`` turns a list into what the caller passes (the list itself, a
    tensor): values that fit go in as they are, others are refused as an ndarray of
    the wrong dtype is, with nothing written."""
    rb = ReplayBuffer(8, spec=CONVERTED)
    for _, bad, match in CHANGED:
        batch = {key: to_value(v) for key, v in {**FITS, **bad}.items()}
        with raises(TypeError, match):
            rb.extend(batch)
        with raises(TypeError, match):
            rb.add({key: v[0] for key, v in batch.items()})
    assert len(rb) == 0
    rb.extend({key: to_value(v) for key, v in FITS.items()})
    rb.add({key: to_value(v)[0] for key, v in FITS.items()})
    rows = rb.read_all_in_order()
    assert rows["i"].tolist() == [1, -2, 1] and rows["u"].tolist() == [0, 255, 0]
    np.testing.assert_array_equal(rows["f"], np.float32([0.1, 2, 0.1]))


def test_lists_are_converted_only_where_every_value_survives():
    assert_converted_only_where_values_survive(list)
    flags = ReplayBuffer(4, spec={"done": ("bool", ())})
    with raises(TypeError, "got int64 values"):
        flags.extend({"done": [0, 2]})
    flags.extend({"done": [True, False]})
    assert flags.read_all_in_order()["done"].tolist() == [True, False]


def test_tensors_are_converted_only_where_every_value_survives():
    torch = pytest.importorskip("torch")
    assert_converted_only_where_values_survive(lambda v: torch.from_numpy(np.asarray(v)))
    # The tester's case: a float32 tensor into an int64 field, truncated before.
    rb = ReplayBuffer(4, spec={"i": ("int64", ())})
    with raises(TypeError, "got float32 values"):
        rb.extend({"i": torch.tensor([2.7, -0.9])})
    assert len(rb) == 0


@pytest.mark.parametrize(
    "priority",
    [[float("nan")], [-1.0], [float("inf")], [1.0, float("nan")]],
    ids=["nan", "negative", "inf", "one of two"],
)
def test_bad_priorities_change_nothing(priority):
    rb = buffer(capacity=8, n=6, sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4))
    rb.update_priority(np.arange(6), np.arange(6) + 1.0)
    before = state(rb)
    with raises(ValueError, "finite"):
        rb.update_priority(np.arange(len(priority)), priority)
    assert state(rb) == before


def test_negative_indices_count_from_the_end():
    rb = buffer(capacity=32, n=10)
    assert check(rb.get(-1)).tolist() == [9]
    assert check(rb.get([-10, 0, -2])).tolist() == [0, 0, 8]
    assert check(rb.get(np.array([-1], np.int8))).tolist() == [9]
    assert check(rb.get(np.array([3], np.uint64))).tolist() == [3]
    assert check(rb.get([])).tolist() == []
    # One before the first row, as a list's index (it was an OverflowError).
    for index in (-11, [0, -11], np.array([-(2**40)])):
        with raises(IndexError, "out of bounds"):
            rb.get(index)
    with raises(TypeError, "integers"):
        rb.get([1.5])
    # Integers past 64 bits are positions out of range, not values of the wrong type.
    for index in (2**70, -(2**70), [-1, 2**64 - 1], [2**70]):
        with raises(IndexError, "out of range"):
            rb.get(index)
    with raises(IndexError, "out of range"):
        rb.write_at(2**64, data([1]))


def test_a_boolean_index_is_a_mask_of_the_stored_rows():
    rb = buffer(capacity=32, n=5)
    mask = np.array([False, False, True, False, True])
    # Not the positions 0 and 1 that its cast to integers names.
    assert check(rb.get(mask)).tolist() == [2, 4]
    rb.write_at(mask, data([102, 104]))
    assert check(rb.read_all_in_order()).tolist() == [0, 1, 102, 3, 104]
    with raises(IndexError, "one boolean a row"):
        rb.get(np.array([True, False]))
    assert check(rb.get(np.zeros(5, bool))).tolist() == []


def test_an_io_error_says_its_cause_and_a_huge_position_has_no_priority(tmp_path):
    rb = buffer(capacity=8, n=4, sampler=replaybuf.Prioritized(alpha=1.0, beta=1.0))
    assert rb.priority(2**64) is None  # an OverflowError before
    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    with raises(OSError) as e:
        rb.dumps(afile)
    # Not only "I/O failed": what the system said.
    assert "os error" in str(e.value), e.value


def test_write_at_rewrites_the_rows_it_names_or_none():
    rb = buffer(capacity=32, n=10)
    rb.write_at([-1, 2, 2], data([109, 102, 202]))
    rb.write_at(np.array([0], np.uint8), data([100]))
    assert check(rb.read_all_in_order()).tolist() == [100, 1, 202, 3, 4, 5, 6, 7, 8, 109]
    before = check(rb.read_all_in_order()).tolist()
    with raises(IndexError):
        rb.write_at([1, 10], data([1, 2]))  # position 10 holds no row
    with raises(IndexError, "out of bounds"):
        rb.write_at([-11], data([1]))
    with raises(ValueError):
        rb.write_at([1, 2], data([1, 2, 3]))
    with raises(TypeError, "integers"):
        rb.write_at([1.0], data([1]))
    assert check(rb.read_all_in_order()).tolist() == before
    assert rb.write_count == 10


def test_bad_updates_change_nothing():
    rb = buffer(capacity=8, n=6, sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4))
    before = state(rb)
    with raises(ValueError, "line up"):
        rb.update_priority([0, 1], [1.0])
    with raises(IndexError):
        rb.update_priority([99], [1.0], [0])
    with raises(IndexError):
        rb.get(99)
    # Indices are integers, never negative: a float was truncated (1.9 updated row 1),
    # a negative one an OverflowError, a string numpy's own ValueError.
    with raises(TypeError, "integers"):
        rb.update_priority([1.9], [5.0])
    with raises(IndexError, "negative"):
        rb.update_priority([-1], [5.0])
    with raises(TypeError, "numbers"):
        rb.update_priority([0], ["a"])
    with raises(IndexError, "negative"):
        rb.priority(-1)
    with raises(ValueError, "count of rows"):
        rb.sample(-1)
    assert state(rb) == before


def test_sample_into_takes_a_batch_size_under_the_arrays_room():
    # batch_size rows into arrays with room for more: the first rows filled (it was
    # refused: "the column of field x has 16 bytes, the rows need 8"); a field array
    # of the right size but the wrong shape is refused.
    rb = buffer(capacity=32, n=10, batch_size=2)
    out = {key: np.full((4,) + shape, -1, dtype) for key, dtype, shape in rb.spec}
    out["index"] = np.zeros(4, np.uint64)
    out["generation"] = np.zeros(4, np.uint64)
    assert rb.sample_into(out) == 2
    check({key: v[:2] for key, v in out.items()})
    assert (out["id"][2:] == -1).all()
    out["obs"] = np.zeros((2, 6), np.float32)
    with raises(ValueError, "shape"):
        rb.sample_into(out)


@pytest.mark.parametrize(
    "kwargs,builtin",
    [
        (dict(capacity=0), ValueError),
        (dict(shards=3), ValueError),
        (dict(spec={"x": ("complex64", ())}), TypeError),
        (dict(sampler="uniform"), TypeError),
        (dict(sampler={"kind": "nonsense"}), ValueError),
        (dict(ndim=2), ValueError),
    ],
    ids=[
        "zero capacity",
        "shards not a power of 2",
        "bad dtype",
        "bad sampler",
        "no sampler",
        "ndim2 without envs",
    ],
)
def test_bad_settings_are_refused(kwargs, builtin):
    kwargs = dict(dict(capacity=8, spec=SPEC), **kwargs)
    with raises(builtin):
        ReplayBuffer(kwargs.pop("capacity"), **kwargs)


@pytest.mark.parametrize("damage", ["truncate rows", "flip a byte", "garbage meta", "missing file"])
def test_a_corrupted_checkpoint_changes_nothing(tmp_path, damage):
    rb = buffer(capacity=16, n=12, seed=4)
    rb.dumps(tmp_path / "c")
    files = {p.name: p for p in (tmp_path / "c").iterdir()}
    slots = next(p for name, p in files.items() if name.startswith("slots"))
    raw = slots.read_bytes()
    if damage == "truncate rows":
        slots.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip a byte":
        slots.write_bytes(raw[:100] + bytes([raw[100] ^ 0xFF]) + raw[101:])
    elif damage == "garbage meta":
        (tmp_path / "c" / "meta.json").write_text("{not json")
    else:
        slots.unlink()
    target = buffer(capacity=16, n=3, seed=4)
    before = state(target)
    with raises(OSError):
        target.loads(tmp_path / "c")
    assert state(target) == before
    target.extend(data([3]))
    with raises(OSError):
        ReplayBuffer.from_checkpoint(tmp_path / "c")
    with raises(OSError):
        ReplayBuffer.open_dataset(tmp_path / "c")


def test_a_checkpoint_meta_of_another_version_is_refused(tmp_path):
    rb = buffer(n=5)
    rb.dumps(tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    meta["version"] = meta["version"] + 100
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    with raises(OSError):
        ReplayBuffer.from_checkpoint(tmp_path / "c")
    shutil.rmtree(tmp_path / "c")
    with raises(OSError, "no buffer there"):
        ReplayBuffer.from_checkpoint(tmp_path / "c")


def test_every_exception_class_is_a_replaybuffer_error_and_its_builtin():
    pairs = [
        (replaybuf.ReplayBufferValueError, ValueError),
        (replaybuf.ReplayBufferTypeError, TypeError),
        (replaybuf.ReplayBufferIndexError, IndexError),
        (replaybuf.ReplayBufferKeyError, KeyError),
        (replaybuf.ReplayBufferOSError, OSError),
        (replaybuf.EpochEnd, StopIteration),
    ]
    for cls, builtin in pairs:
        assert issubclass(cls, ReplayBufferError) and issubclass(cls, builtin)
        assert cls.__module__ == "replaybuf"


# ------------------------------------------- found by the forty-first session's hunt


def test_sample_into_checks_every_array_against_the_index_under_a_batch_size():
    # A generation or weight of another length than the index, with a batch size
    # below the arrays' room, panicked (a PanicException, no Exception at all).
    rb = ReplayBuffer(
        16,
        spec={"x": ("float32", ())},
        batch_size=1,
        sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4),
    )
    rb.extend({"x": np.arange(8, dtype=np.float32)})
    for short in ("generation", "weight"):
        out = {
            "x": np.zeros(4, np.float32),
            "index": np.zeros(4, np.uint64),
            "generation": np.zeros(4, np.uint64),
            "weight": np.zeros(4, np.float32),
        }
        out[short] = out[short][:3].copy()
        with pytest.raises(ReplayBufferError, match=f"`{short}` has shape"):
            rb.sample_into(out)
    out["weight"] = np.zeros(4, np.float32)
    assert rb.sample_into(out) == 1


def test_a_padded_slice_batch_updates_its_priorities_without_generations():
    rb = ReplayBuffer(
        64,
        spec={"x": ("float32", ()), "traj": ("int64", ())},
        seed=0,
        sampler=replaybuf.Slice(
            slice_len=4,
            traj_key="traj",
            strict_length=False,
            prioritized=replaybuf.Prioritized(1.0, 0.4),
        ),
    )
    ids = np.arange(20)
    rb.extend({"x": ids.astype(np.float32), "traj": ids // 2})  # trajectories of 2 steps
    b = rb.sample(8)
    padding = b["index"] == replaybuf.PADDING_INDEX
    assert padding.any()
    applied, stale = rb.update_priority(b["index"], np.full(8, 5.0))
    assert (applied, stale) == (int((~padding).sum()), 0)
    for i in b["index"][~padding]:
        assert rb.priority(int(i)) == 5.0


@pytest.mark.parametrize("name", ["index", "generation", "weight", "marks"])
def test_a_field_named_as_a_sample_entry_is_refused(name):
    # Its values came back as the sample's own entry, silently.
    with pytest.raises(ReplayBufferError, match=f"may not be named `{name}`"):
        ReplayBuffer(8, spec={name: ("float32", ()), "x": ("float32", ())})
    with pytest.raises(ReplayBufferError, match=f"may not be named `{name}`"):
        ReplayBuffer(8, example={name: np.float32(1), "x": np.float32(2)})
    rb = ReplayBuffer(8, spec={("data", name): ("float32", ())})  # nested: its own key
    rb.extend({("data", name): np.array([7.0, 8.0], np.float32)})
    assert rb.get(1)[("data", name)].tolist() == [8.0]


def test_a_dataset_refuses_loads_as_it_refuses_clear(tmp_path):
    rb = ReplayBuffer(16, spec={"x": ("int64", ())})
    rb.extend({"x": np.arange(10)})
    rb.dumps(tmp_path / "c")
    rb.extend({"x": np.array([100])})
    rb.dumps(tmp_path / "o")
    ds = ReplayBuffer.open_dataset(tmp_path / "c")
    for call in (lambda: ds.loads(tmp_path / "o"), ds.clear):
        with pytest.raises(ReplayBufferError, match="read-only"):
            call()
    assert ds.read_all_in_order()["x"].tolist() == list(range(10))


def test_a_sample_array_someone_refers_to_weakly_is_not_written_again():
    import weakref

    rb = ReplayBuffer(32, spec={"x": ("float32", ())}, seed=1)
    rb.extend({"x": np.arange(32, dtype=np.float32)})
    b = rb.sample(4)
    kept, first = weakref.ref(b["x"]), b["x"].copy()
    del b
    gc.collect()
    for _ in range(8):
        later = rb.sample(4)
        assert later["x"] is not kept()
    assert (kept() == first).all()


def test_inputs_numpy_cannot_read_are_our_errors_and_grad_tensors_are_read_detached():
    torch = pytest.importorskip("torch")
    rb = ReplayBuffer(
        8, spec={"x": ("float32", (2,))}, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.4)
    )
    with pytest.raises(replaybuf.ReplayBufferValueError, match="cannot be read as an array") as e:
        rb.extend({"x": [[1.0, 2.0], [3.0]]})  # ragged
    assert e.value.__cause__ is not None
    x = torch.ones(3, 2, requires_grad=True)
    rb.extend({"x": x * 2})
    b = rb.sample(3)
    td_error = (torch.ones(3, requires_grad=True) * 4).abs()
    assert rb.update_priority(b["index"], td_error) == (3, 0)
    assert rb.priority(int(b["index"][0])) == 4.0
    with pytest.raises(replaybuf.ReplayBufferTypeError, match="one int index"):
        rb.priority(1.5)
    assert rb.priority(np.uint64(2**64 - 1)) is None
    with pytest.raises(IndexError, match="negative"):
        rb.priority(np.int64(-1))


def test_negative_indices_and_masks_count_the_positions_that_hold_rows():
    # After a clear the ring goes on from its cursor, and two shards leave a gap: -1
    # and a mask named positions 0..len, which held no row.
    import threading

    rb = ReplayBuffer(32, spec={"x": ("int64", ())})
    rb.extend({"x": np.arange(10)})
    rb.clear()
    rb.extend({"x": np.array([100, 101, 102])})
    assert rb.get(-1)["x"].tolist() == [102]
    assert rb.get([-3, -1])["x"].tolist() == [100, 102]
    assert rb.get(np.array([True, False, True]))["x"].tolist() == [100, 102]
    rb.write_at(-2, {"x": np.array([7])})
    assert rb.read_all_in_order()["x"].tolist() == [100, 7, 102]
    with pytest.raises(IndexError):
        rb.get(-4)

    rb = ReplayBuffer(32, spec={"x": ("int64", ())}, shards=2)
    rb.extend({"x": np.arange(4)})
    t = threading.Thread(target=lambda: rb.extend({"x": np.array([100, 101])}))
    t.start()
    t.join()
    stored = rb.read_all_in_order()
    assert len(stored["x"]) == 6
    assert rb.get(-1)["x"].tolist() == stored["x"][-1:].tolist()
    assert rb.get(np.ones(6, bool))["x"].tolist() == stored["x"].tolist()


def test_ambiguous_or_wrongly_typed_arguments_are_refused():
    rb = buffer(n=5, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.4))
    before = rb.read_all_in_order()
    # One field given twice (by its key and by its parts): the last one was stored.
    with raises(KeyError, "given twice"):
        rb.extend({**data([7]), ("id",): np.array([8])})
    with raises(KeyError, "empty dict"):
        rb.extend({**data([7]), "zz": {}})
    # A bool is not an index nor a count (True read row 1).
    with raises(TypeError, "bool"):
        rb.get(True)
    with raises(TypeError, "bool"):
        rb.priority(True)
    with raises(ValueError, "count of rows"):
        rb.sample(True)
    with raises(TypeError, "batch size is an int"):
        rb.sample(1.5)
    # Far below zero is negative, as -1 is (it answered None).
    with raises(IndexError, "negative"):
        rb.priority(-(2**70))
    # An empty mask is a mask of the wrong length, not an empty index.
    with raises(IndexError, "mask"):
        rb.get(np.zeros(0, bool))
    # Two priorities a row for three rows, given as two rows of three: regrouped.
    with raises(ValueError, "one row of them an index"):
        rb.update_priority([1, 2, 3], [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    after = rb.read_all_in_order()
    np.testing.assert_array_equal(after["id"], before["id"])


def test_a_spec_dict_changed_while_it_is_read_is_an_error_not_a_panic():
    spec = {}

    class Grows:
        @property
        def dtype(self):
            spec["y"] = ("float32", ())
            return np.dtype("float32")

    spec["x"] = (Grows(), ())
    try:
        ReplayBuffer(4, spec=spec)
    except ReplayBufferError:
        pass


def test_reconfigure_swaps_the_sampler_writer_and_capacity_keeping_the_rows():
    rb = buffer(capacity=16, n=10)
    rb.reconfigure(sampler=replaybuf.Prioritized(alpha=1.0, beta=1.0))
    assert rb.prioritized and len(rb) == 10
    batch = rb.sample(8)
    assert "weight" in batch and set(check(batch)) <= set(range(10))
    rb.update_priority(batch["index"], np.zeros(8))
    rb.reconfigure(capacity=4)  # the newest rows, priorities kept
    assert len(rb) == 4 and sorted(check(rb.read_all_in_order()).tolist()) == [6, 7, 8, 9]
    rb.reconfigure(sampler=replaybuf.Uniform())
    assert not rb.prioritized and "weight" not in rb.sample(4)
    with raises(ValueError):
        rb.reconfigure(sampler={"kind": "no such sampler"})
    assert len(rb) == 4 and rb.capacity == 4  # nothing changed


def test_a_shared_buffer_refuses_a_reconfigure(tmp_path):
    name = f"test-reconfigure-{os.getpid()}"
    rb = ReplayBuffer(16, spec=SPEC, shared=name)
    rb.extend(data(np.arange(4)))
    with pytest.raises(ReplayBufferError):
        rb.reconfigure(capacity=8)
    assert len(rb) == 4
