"""Rows that check themselves, and shared-region names, for the concurrency tests.

Every field of a row derives from its ``id``: ``check`` is ``CHECK_WORDS`` words of a
hash of it and ``obs`` counts up from its low bits, so a row torn between two writes,
or a row whose fields came from two rows, fails :func:`assert_whole`.
"""

import os
import time
import uuid

import numpy as np

CHECK_WORDS = 64
OBS = 16
SPEC = {
    "id": ("int64", ()),
    "check": ("uint64", (CHECK_WORDS,)),
    "obs": ("float32", (OBS,)),
}
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# The ids of collector ``w`` are ``w * ID_STRIDE + k``.
ID_STRIDE = 10**9


def rows(ids):
    """The rows of ``ids`` (a batch of ``SPEC``)."""
    ids = np.asarray(ids, dtype=np.int64)
    check = (ids.astype(np.uint64)[:, None] * GOLDEN) ^ np.arange(CHECK_WORDS, dtype=np.uint64)
    obs = (ids % 65536).astype(np.float32)[:, None] + np.arange(OBS, dtype=np.float32)
    return {"id": ids, "check": check, "obs": obs}


def assert_whole(batch):
    """Asserts every row of a sampled batch is one whole row; returns the ids."""
    expected = rows(batch["id"])
    for key in ("check", "obs"):
        bad = np.flatnonzero((batch[key] != expected[key]).any(axis=1))
        assert bad.size == 0, f"torn or mixed rows: ids {batch['id'][bad][:5].tolist()} ({key})"
    return batch["id"]


def shm_name(tag):
    """A shared-region name unique to this test run."""
    return f"pytest-{tag}-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def shm_path(name):
    return f"/dev/shm/replaybuf.{name}"


def remove_region(name):
    """Removes a region's name if it is still there (a test that failed midway)."""
    try:
        os.unlink(shm_path(name))
    except FileNotFoundError:
        pass


def wait_for(predicate, timeout, what):
    """Polls ``predicate`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)
