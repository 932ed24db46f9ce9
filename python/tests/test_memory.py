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
        # Fresh arrays that own their memory: nothing points back into the buffer.
        assert obs.flags.owndata and obs.base is None
        assert sys.getrefcount(obs) == 3  # the dict's, `obs`, getrefcount's argument
        expected = {k: v.copy() for k, v in batch.items()}
        del rb
        gc.collect()
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
