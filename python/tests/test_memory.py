"""Reference counting and memory: sampled arrays own their memory and outlive the buffer
(heap, file-backed, shared, tmrl); a million sample calls leave resident memory flat.

``test_a_million_samples_leave_resident_memory_flat`` is the slow one (seconds, not
minutes): marked ``slow`` so that ``-m "not slow"`` can leave it out; the normal suite
runs it."""

import gc
import os
import resource
import sys
import time

import numpy as np
import pytest
import replaybuf
from _helpers import SPEC, assert_whole, remove_region, rows, shm_name

PAGE = resource.getpagesize()


def rss_bytes():
    """Resident memory of this process, from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def make(kind, tmp_path, name):
    if kind == "heap":
        return replaybuf.ReplayBuffer(256, spec=SPEC, seed=1)
    if kind == "memmap":
        return replaybuf.ReplayBuffer(256, spec=SPEC, seed=1, memmap=tmp_path / "m")
    return replaybuf.ReplayBuffer(256, spec=SPEC, seed=1, shared=name)


@pytest.mark.parametrize("kind", ["heap", "memmap", "shared"])
def test_sampled_arrays_outlive_the_buffer(kind, tmp_path):
    name = shm_name("outlive")
    try:
        rb = make(kind, tmp_path, name)
        rb.extend(rows(np.arange(200)))
        batch = rb.sample(64)
        got = rb.get(np.arange(10))
        everything = rb.read_all_in_order()
        obs = batch["obs"]
        # Arrays that own their memory: nothing points back into the storage.
        assert obs.flags.owndata and obs.base is None
        # The dict's, `obs`, getrefcount's argument, and the buffer's recycler's.
        assert sys.getrefcount(obs) == 4
        expected = {k: v.copy() for k, v in batch.items()}
        del rb
        gc.collect()
        assert sys.getrefcount(obs) == 3  # the recycler went with the buffer
        # The storage is gone (a shared region unmapped, its name removed); the arrays
        # read as they were, and writing them harms nothing.
        for key, value in expected.items():
            np.testing.assert_array_equal(batch[key], value)
        assert_whole(batch)
        assert_whole(got)
        assert sorted(everything["id"].tolist()) == list(range(200))
        obs += 1
        del batch
        gc.collect()
        np.testing.assert_array_equal(obs, expected["obs"] + 1)
    finally:
        remove_region(name)


def test_a_short_batch_is_a_view_that_keeps_its_base_alive():
    rb = replaybuf.ReplayBuffer(16, spec=SPEC, sampler=replaybuf.WithoutReplacement(), seed=1)
    rb.extend(rows(np.arange(10)))
    rb.sample(8)
    short = rb.sample(8)  # the epoch's last 2 rows, cut from arrays of 8
    ids = short["id"]
    assert len(ids) == 2 and ids.base is not None
    del rb, short
    gc.collect()
    assert sorted(ids.tolist()) == sorted(set(ids.tolist())) and all(0 <= i < 10 for i in ids)


def test_tensors_and_tmrl_batches_outlive_their_memory():
    torch = pytest.importorskip("torch")
    from replaybuf.tmrl import Memory

    rb = replaybuf.ReplayBuffer(64, spec=SPEC, seed=2)
    rb.extend(rows(np.arange(64)))
    tensor = torch.from_numpy(rb.sample(16)["obs"])  # shares the array's memory
    memory = Memory(batch_size=8, seed=2)
    memory.append_buffer(
        [
            (np.ones(2, np.float32), np.full(3, i, np.float32), 0.0, False, False, {})
            for i in range(9)
        ]
    )
    prev_obs, act, rew, new_obs, terminated, truncated = memory.sample()
    as_numpy = memory._native.sample()  # the engine's arrays, owned by numpy
    transition = memory.get_transition(0)
    expected = tensor.clone()
    del rb, memory
    gc.collect()
    torch.testing.assert_close(tensor, expected)
    torch.testing.assert_close(new_obs - prev_obs, torch.ones_like(prev_obs))
    np.testing.assert_array_equal(as_numpy[3] - as_numpy[0], np.ones((8, 3), np.float32))
    np.testing.assert_array_equal(transition[3], np.ones(3, np.float32))


def data_address(array):
    return array.__array_interface__["data"][0]


def test_a_dropped_batch_is_written_again():
    """sample's arrays are kept once dropped, and the next sample of that shape
    writes into them rather than making new ones (the recycler)."""
    rb = replaybuf.ReplayBuffer(256, spec=SPEC, seed=5)
    rb.extend(rows(np.arange(256)))
    first = rb.sample(32)
    addresses = {key: data_address(a) for key, a in first.items()}
    del first
    again = rb.sample(32)
    assert {key: data_address(a) for key, a in again.items()} == addresses
    assert_whole(again)
    assert again["id"].tolist() == rb.get(again["index"])["id"].tolist()
    # Another batch size gets arrays of its own shape.
    other = rb.sample(8)
    assert other["obs"].shape == (8, 16) and other["check"].shape == (8, 64)
    assert_whole(other)


def holders(batch, torch):
    """Every way of keeping a batch's memory without keeping the batch dict."""
    kept = [
        batch["obs"][2:5],  # a numpy view
        memoryview(batch["check"]),  # a buffer export
        np.frombuffer(batch["id"], dtype=np.int64),  # a view through the buffer protocol
    ]
    if torch is not None:
        tensor = torch.from_numpy(batch["index"])
        kept += [tensor[1:], tensor.detach(), tensor.numpy()]
        kept.append(torch.from_numpy(batch["generation"]).view(torch.int64))
    return kept


def values_of(held):
    """A copy of what a holder sees."""
    return held.numpy().copy() if hasattr(held, "numpy") else np.array(held)


def test_memory_anything_still_sees_is_never_written():
    """However a batch's memory is still reachable (a view, a buffer export, a tensor,
    a tensor's detached copy or numpy view), later samples never write it."""
    try:
        import torch
    except ImportError:
        torch = None
    rb = replaybuf.ReplayBuffer(4096, spec=SPEC, seed=6)
    rb.extend(rows(np.arange(4096)))
    kept, expected = [], []
    for _ in range(20):
        batch = rb.sample(64)
        held = holders(batch, torch)
        kept.append(held)
        expected.append([values_of(h) for h in held])
        del batch, held
        for _ in range(10):
            assert_whole(rb.sample(64))
    for held, values in zip(kept, expected):
        for h, v in zip(held, values):
            np.testing.assert_array_equal(values_of(h), v)


def test_an_array_changed_in_place_is_not_taken_again():
    """A dropped array whose shape, dtype or flags its holder changed is left alone:
    the next batch has the shape, dtype and flags of a fresh one."""
    rb = replaybuf.ReplayBuffer(256, spec=SPEC, seed=7)
    rb.extend(rows(np.arange(256)))
    for change in (
        lambda a: setattr(a, "shape", (a.size,)),
        lambda a: setattr(a, "dtype", np.int32),
        lambda a: a.setflags(write=False),
    ):
        for _ in range(6):  # every kept array changed
            batch = rb.sample(16)
            obs = batch["obs"]
            del batch
            change(obs)
            del obs
        batch = rb.sample(16)
        obs = batch["obs"]
        assert obs.shape == (16, 16) and obs.dtype == np.float32 and obs.flags.writeable
        assert obs.flags.c_contiguous and obs.flags.owndata
        assert_whole(batch)


def test_threads_sampling_at_once_get_arrays_of_their_own():
    """Two threads sampling one buffer while each holds its latest batch: no batch is
    written while held (each is rechecked after the other thread's samples)."""
    import threading

    rb = replaybuf.ReplayBuffer(8192, spec=SPEC, seed=8)
    rb.extend(rows(np.arange(8192)))
    errors = []

    def learner():
        try:
            held, held_ids = None, None
            for _ in range(3000):
                batch = rb.sample(32)
                assert_whole(batch)
                if held is not None:
                    assert_whole(held)
                    np.testing.assert_array_equal(held["id"], held_ids)
                held, held_ids = batch, batch["id"].copy()
        except AssertionError as e:
            errors.append(e)

    threads = [threading.Thread(target=learner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.slow
def test_a_million_samples_leave_resident_memory_flat():
    calls, warm = 1_000_000, 20_000
    rb = replaybuf.ReplayBuffer(1024, spec={"x": ("float32", (2,))}, seed=3)
    rb.extend({"x": np.ones((1024, 2), np.float32)})
    sample = rb.sample
    for _ in range(warm):
        sample(1)
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    for _ in range(calls - warm):
        sample(1)
    elapsed = time.perf_counter() - t0
    gc.collect()
    grown = rss_bytes() - before
    # A leak of even 8 bytes a call would be 8 MB; allow 1 MB of allocator noise.
    assert grown < 1 << 20, f"resident memory grew {grown} bytes over {calls - warm} samples"
    assert elapsed < 60, f"{calls - warm} samples took {elapsed:.1f} s"


def test_sample_into_and_get_leave_resident_memory_flat():
    rb = replaybuf.ReplayBuffer(1024, spec=SPEC, seed=4)
    rb.extend(rows(np.arange(1024)))
    out = {key: np.empty((32,) + shape, dtype) for key, dtype, shape in rb.spec}
    out["index"] = np.empty(32, np.uint64)
    out["generation"] = np.empty(32, np.uint64)
    index = np.arange(32)

    def work(n):
        for _ in range(n):
            rb.sample_into(out)
            rb.get(index)
            rb.extend(rows(index))

    work(5_000)
    gc.collect()
    before = rss_bytes()
    work(50_000)
    gc.collect()
    grown = rss_bytes() - before
    assert grown < 1 << 20, f"resident memory grew {grown} bytes"


def test_statm_reads_resident_memory():
    """The measure itself: touching 64 MB shows."""
    before = rss_bytes()
    block = np.ones(64 << 20, np.uint8)
    assert rss_bytes() - before > 48 << 20
    del block
    assert os.path.exists("/proc/self/statm")
