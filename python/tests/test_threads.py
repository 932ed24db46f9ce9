"""Python threads extending and sampling one buffer at once: every sampled row is whole
and was written by a collector. (Throughput beside each other: python/bench/threads.py.)"""

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import replaybuf
from _helpers import ID_STRIDE, SPEC, assert_whole, rows

CHUNK = 64
JOIN_S = 60


def run_threads(targets):
    """Runs the callables on threads at once; re-raises the first error of any."""
    errors = []

    def guard(f):
        try:
            f()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=guard, args=(f,), daemon=True) for f in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), "a thread did not finish"
    if errors:
        raise errors[0]


class Collectors:
    """Collector ``w`` extends its ids ``w * ID_STRIDE + k`` in order, at least
    ``chunks`` chunks and until ``stop`` is set; ``written[w]`` is how many rows it has
    finished."""

    def __init__(self, rb, workers, chunks):
        self.rb, self.chunks = rb, chunks
        self.written = {w: 0 for w in range(1, workers + 1)}
        self.stop = threading.Event()

    def collector(self, w):
        def run():
            k = 0
            while k < self.chunks * CHUNK or not self.stop.is_set():
                self.rb.extend(rows(w * ID_STRIDE + np.arange(k, k + CHUNK)))
                k += CHUNK
                self.written[w] = k

        return run

    def learners(self, learner, count):
        """``count`` threads of ``learner``; the collectors stop once all are done, so
        every learner samples while collectors extend."""
        left = [count]
        lock = threading.Lock()

        def run():
            try:
                learner()
            finally:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        self.stop.set()

        return [run] * count

    def check(self, ids):
        """Every id was written (or was being written) by its collector."""
        for i in np.unique(ids):
            w, k = divmod(int(i), ID_STRIDE)
            assert w in self.written, f"id {i} of no collector"
            assert k < self.written[w] + CHUNK, f"id {i} not written yet"


SAMPLES = 300
BATCH = 128


@pytest.mark.parametrize(
    "sampler",
    [None, replaybuf.WithoutReplacement(), replaybuf.Prioritized(alpha=0.7, beta=0.5)],
    ids=["uniform", "without_replacement", "prioritized"],
)
def test_collectors_and_learners_at_once(sampler):
    rb = replaybuf.ReplayBuffer(4096, spec=SPEC, shards=4, seed=11, sampler=sampler)
    # Collector 0's rows, so learners start at once: a whole batch of them, or a
    # learner sampling without replacement before the other collectors' first
    # chunks would ask for more rows than are stored.
    rb.extend(rows(np.arange(BATCH)))
    col = Collectors(rb, workers=3, chunks=100)
    col.written[0] = BATCH
    stale_seen = []

    def learner():
        for _ in range(SAMPLES):
            try:
                batch = rb.sample(BATCH)
            except replaybuf.EpochEnd:
                continue  # without replacement: the call after an epoch's last batch
            col.check(assert_whole(batch))
            if rb.prioritized:
                # Updates of rows overwritten since the draw are dropped and counted.
                applied, stale = rb.update_priority(
                    batch["index"], batch["id"] % 7 + 1.0, batch["generation"]
                )
                assert applied + stale == len(batch["index"])
                stale_seen.append(stale)

    run_threads([col.collector(w) for w in (1, 2, 3)] + col.learners(learner, 2))
    assert rb.write_count == sum(col.written.values())
    assert all(col.written[w] >= 100 * CHUNK for w in (1, 2, 3))
    assert_whole(rb.read_all_in_order())
    if rb.prioritized:
        assert len(stale_seen) == 2 * SAMPLES


def test_sample_into_from_threads_each_with_its_own_arrays():
    rb = replaybuf.ReplayBuffer(2048, spec=SPEC, seed=5)
    rb.extend(rows(np.arange(CHUNK)))
    col = Collectors(rb, workers=2, chunks=100)
    col.written[0] = CHUNK

    def learner():
        out = {key: np.empty((64,) + shape, dtype) for key, dtype, shape in rb.spec}
        out["index"] = np.empty(64, np.uint64)
        out["generation"] = np.empty(64, np.uint64)
        for _ in range(SAMPLES):
            assert rb.sample_into(out) == 64
            col.check(assert_whole(out))

    run_threads([col.collector(1), col.collector(2)] + col.learners(learner, 2))


def test_ndim2_collectors_and_a_learner():
    """ndim 2: each extend is a step of every environment; every sampled row whole."""
    envs = 4
    rb = replaybuf.ReplayBuffer(1024 * envs, spec=SPEC, ndim=2, envs=envs, seed=3)
    steps = 8
    stop = threading.Event()
    written = [0]

    def collector():
        c = 0
        while c < 200 or not stop.is_set():
            ids = (c * steps * envs + np.arange(steps * envs)).reshape(steps, envs)
            flat = rows(ids.reshape(-1))
            rb.extend({k: v.reshape((steps, envs) + v.shape[1:]) for k, v in flat.items()})
            c += 1
            written[0] = c * steps * envs

    def learner():
        try:
            while len(rb) == 0:
                time.sleep(0.001)
            for _ in range(SAMPLES):
                ids = assert_whole(rb.sample(64))
                assert ids.max() < written[0] + steps * envs
        finally:
            stop.set()

    run_threads([collector, learner])
    assert len(rb) == 1024 * envs


def test_a_prefetching_tmrl_memory_beside_a_collector_thread():
    """The tmrl face's lock is taken with the GIL released: an appending thread and a
    sampling thread never deadlock."""
    from replaybuf.tmrl import Memory

    memory = Memory(
        batch_size=32,
        memory_size=2048,
        prefetch=2,
        seed=1,
        obs=("float32", (4,)),
        act=("float32", (2,)),
    )
    n = 64

    def batch_of(k):
        ids = np.arange(k, k + n, dtype=np.float32)
        return {
            "act": np.stack([ids, -ids], 1),
            "obs": np.repeat(ids[:, None], 4, 1),
            "rew": ids,
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
        }

    memory.append_buffer(batch_of(0))
    stop = threading.Event()

    def collector():
        c = 1
        while c < 200 or not stop.is_set():
            memory.append_buffer(batch_of(c * n))
            c += 1

    def learner():
        try:
            for _ in range(SAMPLES):
                prev_obs, act, rew, new_obs, terminated, truncated = (
                    np.asarray(t) for t in memory.sample()
                )
                np.testing.assert_array_equal(new_obs, prev_obs + 1)
                np.testing.assert_array_equal(act[:, 0], new_obs[:, 0])
        finally:
            stop.set()

    run_threads([collector, learner])
    assert len(memory) == 2048


# Run in a child: a deadlocked interpreter holds the GIL in a parked thread, so no
# thread of this process could even notice a timeout.
LOADS_BESIDE_SAMPLERS = textwrap.dedent(
    """
    import tempfile, threading
    import numpy as np, replaybuf

    rb = replaybuf.ReplayBuffer(4096, spec={"obs": ("float32", (64,))}, seed=1)
    rb.extend({"obs": np.ones((4096, 64), np.float32)})
    path = tempfile.mkdtemp()
    rb.dumps(path)
    samples = [0, 0, 0]
    stop = threading.Event()

    def sampler(k):
        while not stop.is_set():
            rb.sample(1024)
            samples[k] += 1

    threads = [threading.Thread(target=sampler, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for _ in range(50):
        rb.loads(path)
    stop.set()
    for t in threads:
        t.join()
    assert len(rb) == 4096
    print("loads", 50, "samples", sum(samples), flush=True)
    """
)


def test_loads_beside_sampling_threads_does_not_deadlock():
    """``loads`` waits for the lock's write side without the GIL, and so must every
    sampler that finds a waiting writer ahead of it: a sampler that waited with the GIL
    held would stall the readers it waits for, which need the GIL to finish."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", LOADS_BESIDE_SAMPLERS],
            capture_output=True,
            text=True,
            timeout=JOIN_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("loads beside three sampling threads hung")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("loads 50 samples"), done.stdout


EXIT_WHILE_SAMPLING = textwrap.dedent(
    """
    import threading, time
    import numpy as np, replaybuf
    rb = replaybuf.ReplayBuffer(20000, spec={"obs": ("float32", (64,))}, seed=1)
    rb.extend({"obs": np.ones((20000, 64), np.float32)})
    def sample():
        while True:
            rb.sample(4096)
    for _ in range(2):
        threading.Thread(target=sample, daemon=True).start()
    time.sleep(0.3)
    print("exiting")
    """
)


def test_exiting_while_daemon_threads_sample_ends_the_process_cleanly():
    """A daemon thread inside a sample when the interpreter exits parks rather than
    take the GIL back: CPython before 3.14 ends it with ``pthread_exit``, whose unwind
    through the extension's frames aborted the process (exit status 134) every time."""
    for _ in range(3):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_SAMPLING],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (done.returncode, done.stderr)
        assert done.stdout == "exiting\n"
