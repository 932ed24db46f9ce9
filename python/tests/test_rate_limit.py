"""Rate limits from Python: a collector and a learner thread kept at a replay ratio
(each waiting with the GIL released), timeouts as TimeoutError, closing, a new limit
at run time, bad limits refused, and a FIFO queue (Reverb's ``Table.queue``)."""

import threading
import time

import numpy as np
import pytest
import replaybuf
from replaybuf import RateLimit

SPEC = {"id": ("int64", ())}


def rows(first, n):
    return {"id": np.arange(first, first + n)}


def test_a_collector_and_a_learner_thread_keep_the_ratio():
    limit = RateLimit.sample_to_insert_ratio(
        4.0, 200, 128.0, insert_timeout=20.0, sample_timeout=20.0
    )
    rb = replaybuf.ReplayBuffer(4096, spec=SPEC, rate_limit=limit, seed=1)
    errors = []

    def collect():
        try:
            for k in range(100):
                rb.extend(rows(k * 50, 50))
            time.sleep(0.05)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            rb.close_rate_limit()

    collector = threading.Thread(target=collect)
    collector.start()
    drawn = 0
    while True:
        try:
            drawn += len(rb.sample(32)["id"])
        except replaybuf.RateLimitClosed:
            break
    collector.join(30)
    assert not errors, errors
    s = rb.rate_limit_stats()
    assert s["inserts"] == 5000 and s["samples"] == drawn
    # The learner drew all it was owed: the diff ended at the band's floor (the band
    # is centred on min_size * 4 = 800, give or take 128), less at most one batch.
    assert s["min_diff"] == 800 - 128
    assert s["min_diff"] - 32 < s["diff"] <= s["min_diff"], s
    assert s["closed"] and s["sample_waits"] > 0


def test_a_sample_before_the_min_size_times_out_and_draws_nothing():
    rb = replaybuf.ReplayBuffer(
        64, spec=SPEC, rate_limit=RateLimit.min_size(10, sample_timeout=0.03)
    )
    rb.extend(rows(0, 9))
    t = time.monotonic()
    with pytest.raises(replaybuf.ReplayBufferTimeoutError, match="rate limited") as e:
        rb.sample(4)
    assert time.monotonic() - t >= 0.03
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, replaybuf.ReplayBufferError)
    assert rb.rate_limit_stats()["samples"] == 0
    rb.extend(rows(9, 1))
    assert len(rb.sample(4)["id"]) == 4


def test_a_waiting_extend_is_freed_by_a_wider_limit_or_closing():
    rb = replaybuf.ReplayBuffer(64, spec=SPEC, rate_limit=RateLimit.queue(4))
    rb.extend(rows(0, 4))
    results = []
    waiting = threading.Thread(target=lambda: results.append(rb.extend(rows(4, 1))))
    waiting.start()
    time.sleep(0.05)
    assert waiting.is_alive(), "the extend went past a full queue"
    rb.set_rate_limit(RateLimit.queue(8))
    waiting.join(10)
    assert len(results) == 1 and rb.rate_limit_stats()["max_diff"] == 8
    rb.extend(rows(5, 3))  # 8 unsampled now

    def blocked():
        try:
            rb.extend(rows(8, 1))
        except replaybuf.RateLimitClosed as e:
            results.append(e)

    waiting = threading.Thread(target=blocked)
    waiting.start()
    time.sleep(0.05)
    rb.close_rate_limit()
    waiting.join(10)
    assert isinstance(results[-1], RuntimeError)
    assert rb.write_count == 8
    rb.reopen_rate_limit()
    assert len(rb.sample(8)["id"]) == 8


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="error_buffer"):
        replaybuf.ReplayBuffer(
            8, spec=SPEC, rate_limit=RateLimit.sample_to_insert_ratio(4.0, 1, 1.0)
        )
    with pytest.raises(ValueError, match="samples_per_insert"):
        replaybuf.ReplayBuffer(8, spec=SPEC, rate_limit=RateLimit(1, 0.0))
    with pytest.raises(ValueError, match="timeout"):
        replaybuf.ReplayBuffer(8, spec=SPEC, rate_limit=RateLimit.min_size(1, insert_timeout=-1.0))
    rb = replaybuf.ReplayBuffer(8, spec=SPEC)
    assert rb.rate_limit_stats() is None
    with pytest.raises(ValueError, match="no rate limit"):
        rb.close_rate_limit()


def test_a_fifo_queue_hands_every_row_out_once_oldest_first():
    rb = replaybuf.ReplayBuffer(
        16,
        spec=SPEC,
        sampler=replaybuf.Fifo(),
        rate_limit=RateLimit.queue(16, sample_timeout=0.05),
    )
    rb.extend(rows(0, 5))
    assert rb.sample(3)["id"].tolist() == [0, 1, 2]
    assert rb.sample(3)["id"].tolist() == [3, 4]  # a short batch: two were waiting
    with pytest.raises(replaybuf.ReplayBufferTimeoutError):
        rb.sample(1)  # the queue is empty: the learner waits, then times out
    s = rb.rate_limit_stats()
    assert (s["inserts"], s["samples"]) == (5, 5)


def test_collector_and_learner_threads_share_a_bounded_fifo_queue():
    queue, chunks, chunk = 32, 200, 8
    rb = replaybuf.ReplayBuffer(
        2 * queue,
        spec=SPEC,
        sampler=replaybuf.Fifo(),
        rate_limit=RateLimit.queue(queue, insert_timeout=20.0, sample_timeout=20.0),
    )
    errors, got = [], [[] for _ in range(2)]

    def collect():
        try:
            for k in range(chunks):
                rb.extend(rows(k * chunk, chunk))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    def learn(out):
        try:
            while True:
                out.extend(rb.sample(5)["id"].tolist())
        except replaybuf.RateLimitClosed:
            pass
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=collect)] + [
        threading.Thread(target=learn, args=(out,)) for out in got
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while rb.rate_limit_stats()["samples"] < chunks * chunk and time.monotonic() < deadline:
        time.sleep(0.01)
    rb.close_rate_limit()
    for t in threads:
        t.join(30)
    assert not errors, errors
    # Every row came out exactly once, and each learner saw them oldest first.
    assert sorted(got[0] + got[1]) == list(range(chunks * chunk))
    assert all(out == sorted(out) for out in got)
    assert rb.rate_limit_stats()["insert_waits"] > 0  # the queue held the collector


WAIT_FOREVER = """
import signal
import numpy as np, replaybuf
# Ctrl-C raises KeyboardInterrupt, whoever started the tests: a shell's background job
# (`cmd &` without job control) starts with SIGINT ignored, and passes that on.
signal.signal(signal.SIGINT, signal.default_int_handler)
limit = replaybuf.RateLimit.{limit}
rb = replaybuf.ReplayBuffer(64, spec={{"id": ("int64", ())}}, rate_limit=limit)
{before}
print("waiting", flush=True)
try:
    {call}
except KeyboardInterrupt:
    s = rb.rate_limit_stats()
    print("interrupted", s["inserts"], s["samples"], flush=True)
    {after}
    print("went on", flush=True)
"""


@pytest.mark.parametrize(
    "limit,before,call,after,counts",
    [
        # A sample before the min size; then the rows come.
        (
            "min_size(10)",
            "",
            "rb.sample(1)",
            "rb.extend({'id': np.arange(10)}); rb.sample(4)",
            "0 0",
        ),
        # An insert into a full queue; then a sample makes room.
        (
            "queue(5)",
            "rb.extend({'id': np.arange(5)})",
            "rb.extend({'id': [5]})",
            "rb.sample(1); rb.extend({'id': [5]})",
            "5 0",
        ),
    ],
)
def test_ctrl_c_ends_a_wait_with_no_timeout(limit, before, call, after, counts):
    # A real SIGINT to a process whose main thread waits in the engine with no
    # timeout: it was ignored, and the wait went on forever. Now the wait ends (within
    # a check's period) as a KeyboardInterrupt, nothing counted, and the buffer goes on.
    import signal
    import subprocess
    import sys

    script = WAIT_FOREVER.format(limit=limit, before=before, call=call, after=after)
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "waiting\n"
        time.sleep(0.3)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert out.splitlines() == [f"interrupted {counts}", "went on"], (out, err)
    assert child.returncode == 0, err


def test_loads_beside_a_waiting_sample_lets_the_collector_in(tmp_path):
    # A sample waiting for rows holds the buffer; `loads` queued behind it held back
    # the collector whose rows the sample waited for (and close_rate_limit, and
    # Ctrl-C): every thread hung. Now it takes turns, and all three finish.
    spec = {"x": ("float32", ())}
    src = replaybuf.ReplayBuffer(100, spec=spec, rate_limit=RateLimit.min_size(5))
    src.extend({"x": np.arange(10, dtype=np.float32)})
    src.dumps(tmp_path / "c")
    rb = replaybuf.ReplayBuffer(100, spec=spec, rate_limit=RateLimit.min_size(5))
    out = {}

    def run(name, f):
        def body():
            try:
                out[name] = f()
            except Exception as e:  # reported by the main thread
                out[name] = e

        t = threading.Thread(target=body, daemon=True)
        t.start()
        time.sleep(0.3)
        return t

    threads = [
        run("learner", lambda: len(rb.sample(1)["x"])),
        run("loader", lambda: rb.loads(tmp_path / "c")),
        run("collector", lambda: rb.extend({"x": np.arange(10, dtype=np.float32)})),
    ]
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), out
    assert out["learner"] == 1 and out["loader"] is None, out


def test_an_infinite_timeout_waits_as_none_does():
    # inf (or more seconds than a wait can last) was refused as "seconds >= 0".
    for forever in (float("inf"), 1e30):
        rb = replaybuf.ReplayBuffer(
            64, spec=SPEC, rate_limit=RateLimit.min_size(10, sample_timeout=forever)
        )
        assert rb.rate_limit_stats()["sample_timeout"] is None
    with pytest.raises(ValueError, match="seconds >= 0"):
        replaybuf.ReplayBuffer(64, spec=SPEC, rate_limit=RateLimit.min_size(10, sample_timeout=-1))
