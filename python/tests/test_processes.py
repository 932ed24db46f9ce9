"""A shared buffer across processes: collector processes (spawned and forked) extend it
while the parent samples, every sampled row self-checks, and a collector killed with
SIGKILL mid-run leaves the buffer working. Every wait is bounded."""

import gc
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time

import numpy as np
import pytest
import replaybuf
from _helpers import (
    ID_STRIDE,
    SPEC,
    assert_whole,
    remove_region,
    rows,
    shm_name,
    shm_path,
    wait_for,
)

CHUNK = 32
# Bounds on waits (seconds): a spawned child imports numpy and replaybuf first.
START_S = 60
JOIN_S = 30

METHODS = ["spawn", "fork"]


def collect(rb, worker, progress, batches, stop=None, together=None):
    """A collector: extends ``batches`` chunks of its own ids (forever when 0, or until
    the shared flag ``stop`` is nonzero), publishing how many rows it wrote in
    ``progress``; then waits at the barrier ``together``, if given, so that no
    collector's shard is given up (and taken by another) before all are done.

    ``stop`` is a lock-free ``Value``, not an ``Event``: a collector killed inside
    ``Event.is_set`` dies holding the event's lock, and every other collector would
    then wait on it forever."""
    if isinstance(rb, str):
        rb = replaybuf.ReplayBuffer.attach(rb)
    k = 0
    while batches == 0 or k < batches * CHUNK:
        if stop is not None and stop.value:
            break
        rb.extend(rows(worker * ID_STRIDE + np.arange(k, k + CHUNK)))
        k += CHUNK
        progress.value = k
    if together is not None:
        together.wait(START_S)


@pytest.fixture
def name():
    n = shm_name("procs")
    yield n
    gc.collect()
    remove_region(n)


@pytest.fixture
def children():
    """Processes to kill at teardown, whatever happened."""
    procs = []
    yield procs
    for p in procs:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
        p.join(JOIN_S)


def check_ids(ids, progress, workers):
    """Every id is one a collector wrote."""
    for i in np.unique(ids):
        worker, k = divmod(int(i), ID_STRIDE)
        if worker == 0:
            continue  # the parent's own rows
        assert worker in workers, f"id {i} of no collector"
        # A chunk is readable a moment before its collector counts it.
        assert k < progress[worker].value + CHUNK, f"id {i} not written yet"


@pytest.mark.parametrize("method", METHODS)
def test_collectors_extend_while_the_parent_samples(method, name, children):
    ctx = mp.get_context(method)
    rb = replaybuf.ReplayBuffer(2048, spec=SPEC, shards=4, seed=7, shared=name)
    batches = 150
    progress = {w: ctx.Value("q", 0, lock=False) for w in (1, 2, 3)}
    together = ctx.Barrier(len(progress))
    for w in progress:
        args = (rb, w, progress[w], batches, None, together)
        children.append(ctx.Process(target=collect, args=args))
    for p in children:
        p.start()
    sampled = 0
    deadline = time.monotonic() + START_S
    while any(p.is_alive() for p in children):
        assert time.monotonic() < deadline, "collectors did not finish"
        if len(rb) == 0:
            time.sleep(0.01)
            continue
        batch = rb.sample(128)
        check_ids(assert_whole(batch), progress, progress)
        sampled += len(batch["id"])
    for p in children:
        p.join(JOIN_S)
        assert p.exitcode == 0
    assert sampled > 0
    assert rb.write_count == 3 * batches * CHUNK
    # Each collector wrote a shard of its own (all held their leases at once): the last
    # 512 rows of each are there.
    ids = set(rb.read_all_in_order()["id"].tolist())
    for w in progress:
        last = w * ID_STRIDE + batches * CHUNK - 1
        assert last in ids and last - 511 in ids and last - 512 not in ids
    assert_whole(rb.sample(512))


def test_collector_processes_and_the_parent_keep_one_rate_limit(name, children):
    # Each row sampled twice, give or take 96 samples, once 128 rows are in: the
    # collectors' processes and the parent count into one limit in the region.
    spi, min_size, error = 2.0, 128, 96.0
    limit = replaybuf.RateLimit.sample_to_insert_ratio(
        spi, min_size, error, insert_timeout=JOIN_S, sample_timeout=JOIN_S
    )
    rb = replaybuf.ReplayBuffer(4096, spec=SPEC, shards=4, seed=7, shared=name, rate_limit=limit)
    ctx = mp.get_context("spawn")
    batches, batch = 60, 64
    progress = {w: ctx.Value("q", 0, lock=False) for w in (1, 2)}
    for w in progress:
        children.append(ctx.Process(target=collect, args=(rb, w, progress[w], batches)))
    for p in children:
        p.start()
    low, high = spi * min_size - error, spi * min_size + error
    # Past the band by at most one call per caller racing: two collectors, the parent.
    floor, ceiling = low - batch, high + 2 * CHUNK * spi
    owed = len(progress) * batches * CHUNK * spi
    # The first sample waits for the collectors to reach the band's top, past which each
    # insert waits for the parent's samples: they then wait however fast the parent
    # samples (sampling from the start, it could keep them below the top).
    wait_for(lambda: rb.rate_limit_stats()["inserts"] * spi >= high, JOIN_S, "the band's top")
    time.sleep(0.2)
    drawn = 0
    while owed - drawn > low:
        drawn += len(assert_whole(rb.sample(batch)))
        s = rb.rate_limit_stats()
        if s["inserts"] >= min_size:
            diff = s["inserts"] * spi - s["samples"]
            assert floor <= diff <= ceiling, s
    for p in children:
        p.join(JOIN_S)
        assert p.exitcode == 0
    s = rb.rate_limit_stats()
    assert s["inserts"] == len(progress) * batches * CHUNK and s["samples"] == drawn
    # The collectors ran ahead of the ratio and waited for the parent's samples.
    assert s["insert_waits"] > 0, s


def learn(rb, out, stop):
    """A learner process: takes batches from a FIFO queue until ``stop`` is set and
    the queue is empty, and sends each batch's ids to ``out``."""
    rb = replaybuf.ReplayBuffer.attach(rb) if isinstance(rb, str) else rb
    while True:
        try:
            out.put(assert_whole(rb.sample(16)).tolist())
        except replaybuf.ReplayBufferTimeoutError:
            if stop.is_set():
                return


def test_a_fifo_queue_shared_by_collector_and_learner_processes(name, children):
    # A queue of 64 rows in shared memory: two collector processes, two learner
    # processes, and every row handed out exactly once, each collector's in order.
    queue = 64
    limit = replaybuf.RateLimit.queue(queue, insert_timeout=JOIN_S, sample_timeout=0.2)
    # Four shards (the parent keeps none: it never extends), each with room for the
    # whole queue and the chunk each collector may push past it (the limit judges an
    # extend by the counts before it): 64 + 2 * 32 rows, rounded up.
    rb = replaybuf.ReplayBuffer(
        4 * 256,
        spec=SPEC,
        shards=4,
        seed=9,
        shared=name,
        sampler=replaybuf.Fifo(),
        rate_limit=limit,
    )
    ctx = mp.get_context("spawn")
    batches = 40
    progress = {w: ctx.Value("q", 0, lock=False) for w in (1, 2)}
    out, stop = ctx.Queue(), ctx.Event()
    collectors = [ctx.Process(target=collect, args=(rb, w, progress[w], batches)) for w in progress]
    learners = [ctx.Process(target=learn, args=(rb, out, stop)) for _ in range(2)]
    children.extend(collectors + learners)
    for p in children:
        p.start()
    total = len(progress) * batches * CHUNK
    got = []
    while len(got) < total:
        got.extend(out.get(timeout=START_S))
    stop.set()
    for p in children:
        p.join(JOIN_S)
        assert p.exitcode == 0
    assert sorted(got) == sorted(
        w * ID_STRIDE + i for w in progress for i in range(batches * CHUNK)
    )
    assert rb.rate_limit_stats()["insert_waits"] > 0  # the queue held the collectors


@pytest.mark.parametrize("method", METHODS)
def test_a_collector_killed_mid_run_leaves_the_buffer_working(method, name, children):
    ctx = mp.get_context(method)
    # Four shards: the parent's and three collectors'. A new collector finds no free
    # shard unless the killed one's lease was given back.
    rb = replaybuf.ReplayBuffer(4096, spec=SPEC, shards=4, seed=3, shared=name)
    rb.extend(rows(np.arange(CHUNK)))
    stop = ctx.Value("b", 0, lock=False)
    progress = {w: ctx.Value("q", 0, lock=False) for w in (1, 2, 3, 4)}
    for w in (1, 2, 3):
        args = (rb, w, progress[w], 0, stop)
        children.append(ctx.Process(target=collect, args=args))
    for p in children:
        p.start()
    wait_for(lambda: all(progress[w].value >= 20 * CHUNK for w in (1, 2, 3)), START_S, "collectors")
    # Killed while extending: it does nothing else.
    os.kill(children[0].pid, signal.SIGKILL)
    children[0].join(JOIN_S)
    assert children[0].exitcode == -signal.SIGKILL
    # The others go on, and every row read is whole, the killed one's included.
    marks = {w: progress[w].value for w in (2, 3)}
    deadline = time.monotonic() + JOIN_S
    while not all(progress[w].value > marks[w] + 20 * CHUNK for w in (2, 3)):
        assert time.monotonic() < deadline, "the surviving collectors stopped"
        check_ids(assert_whole(rb.sample(256)), progress, progress)
    # A new collector takes the killed one's shard and finishes.
    late = ctx.Process(target=collect, args=(rb, 4, progress[4], 30))
    children.append(late)
    late.start()
    late.join(START_S)
    assert late.exitcode == 0 and progress[4].value == 30 * CHUNK
    assert rb.extend(rows(np.arange(CHUNK, 2 * CHUNK))).size == CHUNK
    stop.value = 1
    for p in children[1:3]:
        p.join(JOIN_S)
        assert p.exitcode == 0, "a collector did not stop"
    ids = assert_whole(rb.read_all_in_order())
    assert (ids // ID_STRIDE == 4).sum() == 30 * CHUNK
    assert_whole(rb.sample(1024))


def collect_inherited(rb, progress):
    """A forked collector given the parent's handle as it is (fork pickles nothing),
    extending one prebuilt chunk over and over so that a kill most often lands inside
    an extend."""
    chunk = rows(ID_STRIDE + np.arange(8 * CHUNK))
    while True:
        rb.extend(chunk)
        progress.value += 8 * CHUNK


def test_forked_children_writing_through_the_parents_handle_survive_a_kill(name, children):
    """Rounds of two forked children and one kill: the survivor's extends go on. A
    forked child re-attaches as itself on its first call (before that fix, it wrote as
    the parent, and in about half the rounds the survivor spun forever on the dead
    child's write, which looked in progress while the parent lived)."""
    ctx = mp.get_context("fork")
    rb = replaybuf.ReplayBuffer(1 << 14, spec=SPEC, shards=4, seed=5, shared=name)
    for _round in range(8):
        progress = [ctx.Value("q", 0, lock=False) for _ in range(2)]
        pair = [ctx.Process(target=collect_inherited, args=(rb, v)) for v in progress]
        children.extend(pair)
        for p in pair:
            p.start()

        def started(progress=progress):
            return all(v.value >= 100 * CHUNK for v in progress)

        wait_for(started, START_S, "collectors")
        os.kill(pair[0].pid, signal.SIGKILL)
        pair[0].join(JOIN_S)
        time.sleep(0.2)
        mark = progress[1].value
        time.sleep(1)
        assert progress[1].value > mark, "the surviving child's extends stopped"
        os.kill(pair[1].pid, signal.SIGKILL)
        pair[1].join(JOIN_S)


def report_len(rb, out):
    """A forked child's first call: how many rows it sees."""
    out.value = len(rb)


@pytest.mark.parametrize("shared", [False, True])
def test_a_child_forked_while_a_thread_samples_can_use_the_buffer(name, children, shared):
    """Children forked while a parent thread is inside a call (sampling in a loop)
    answer their first call. Each child made its own lock and learners: the ones it
    inherited were held for good by that thread, which the child does not have (its
    first call waited for them forever, in every fork)."""
    ctx = mp.get_context("fork")
    kw = {"shared": name} if shared else {}
    rb = replaybuf.ReplayBuffer(256, spec=SPEC, seed=2, **kw)
    rb.extend(rows(np.arange(200)))
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            rb.sample(64)

    learner = threading.Thread(target=sample, daemon=True)
    learner.start()
    try:
        for _ in range(5):
            seen = ctx.Value("q", -1, lock=False)
            child = ctx.Process(target=report_len, args=(rb, seen))
            children.append(child)
            child.start()
            child.join(JOIN_S)
            assert child.exitcode == 0, "the forked child's first call never returned"
            assert seen.value == 200
    finally:
        stop.set()
        learner.join(JOIN_S)


def test_a_heap_or_file_backed_buffer_refuses_pickling(tmp_path):
    for rb in (
        replaybuf.ReplayBuffer(8, spec=SPEC),
        replaybuf.ReplayBuffer(8, spec=SPEC, memmap=tmp_path / "m"),
    ):
        with pytest.raises(TypeError, match=r"cannot be pickled.*shared=") as e:
            pickle.dumps(rb)
        assert isinstance(e.value, replaybuf.ReplayBufferError)
        # A spawned process is handed its arguments by pickle: it refuses to start.
        p = mp.get_context("spawn").Process(target=collect, args=(rb, 1, None, 1))
        with pytest.raises(TypeError, match="cannot be pickled"):
            p.start()


def test_a_shared_buffer_pickles_as_its_name_and_its_region_goes_with_it(name):
    # Two shards: a handle attached by name is a member of its own, even in this
    # process, and leases a shard of its own.
    rb = replaybuf.ReplayBuffer(64, spec=SPEC, shards=2, seed=1, shared=name)
    rb.extend(rows(np.arange(10)))
    other = replaybuf.ReplayBuffer.attach(name)
    assert other is not rb
    other = pickle.loads(pickle.dumps(other))
    assert other.shared_name == name and len(other) == 10
    other.extend(rows(np.arange(10, 20)))
    assert len(rb) == 20
    assert sorted(assert_whole(rb.read_all_in_order()).tolist()) == list(range(20))
    assert os.path.exists(shm_path(name))
    del rb, other
    gc.collect()
    assert not os.path.exists(shm_path(name)), "the creator removes the region's name"


def test_unpickling_in_the_process_that_holds_the_buffer_gives_back_that_buffer(name):
    # One shard: a second handle in this process would be a second writer, and be
    # refused every write while the first holds the shard.
    rb = replaybuf.ReplayBuffer(64, spec=SPEC, shards=1, seed=1, shared=name)
    rb.extend(rows(np.arange(10)))
    same = pickle.loads(pickle.dumps(rb))
    assert same is rb
    assert replaybuf.ReplayBuffer.attach(name) is rb
    same.extend(rows(np.arange(10, 20)))
    assert sorted(assert_whole(rb.read_all_in_order()).tolist()) == list(range(20))
    del rb, same
    gc.collect()
    assert not os.path.exists(shm_path(name))


def test_attaching_a_missing_name_raises_an_oserror():
    missing = shm_name("missing")
    with pytest.raises(replaybuf.ReplayBufferOSError, match="no buffer there") as e:
        replaybuf.ReplayBuffer.attach(missing)
    assert isinstance(e.value, OSError) and isinstance(e.value, replaybuf.ReplayBufferError)
    with pytest.raises(OSError, match="must not hold '/'"):
        replaybuf.ReplayBuffer.attach("a/b")
    assert not os.path.exists(shm_path(missing))


FORK_AND_EXIT = """
import os, sys
import numpy as np
import replaybuf
sys.path.insert(0, {tests!r})
from _helpers import SPEC, rows
rb = replaybuf.ReplayBuffer(256, spec=SPEC, shards=2, seed=5, shared={name!r})
rb.extend(rows(np.arange(32)))
pid = os.fork()
if pid == 0:
    sys.exit(0)  # the interpreter's finalization drops the inherited handle
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
other = replaybuf.ReplayBuffer.attach({name!r})
other.extend(rows(np.arange(32, 64)))
assert len(rb) == 64, len(rb)
print("parent attached")
"""


def test_a_forked_child_exiting_leaves_the_parent_attached(name):
    """A forked child that exits (finalizing the handle it inherited and never
    called through) detached its parent: the region's name, which the parent made,
    was unlinked, and an attach found no buffer there."""
    import subprocess
    import sys

    script = FORK_AND_EXIT.format(tests=os.path.dirname(__file__), name=name)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=START_S
    )
    assert out.returncode == 0, out.stderr
    assert "parent attached" in out.stdout
