"""Python threads on one buffer: is the GIL out of the way?

    python python/bench/threads.py [--quick] [--seconds S] [--trials N]

A collector thread extends the mujoco workload's chunk (1,000 rows) over and over, and
a learner thread samples its batch (256 rows, with ``sample``, then with
``sample_into``) over and over; each is timed alone and then with the other running
beside it. The native face releases the GIL while rows are copied and drawn, so on a
machine with a core for each, each thread's rate beside the other should stay close to
its rate alone (the issue's target: at least 80%). Prints one JSON line per learner
call, rates in rows per second (medians of the trials), and their ratios.

The buffer is filled first, so extends overwrite (the steady state) and samples draw
from every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import numpy as np
import replaybuf
from bench import WL, chunk

# The mujoco workload as bench.py (and WORKLOADS.md) give it.
_, MUJOCO, CHUNK, BATCH = WL["mujoco"]


def rate(op, rows_per_call: int, seconds: float, start: threading.Event, out: list) -> None:
    """Calls ``op`` for ``seconds`` once ``start`` is set; appends its rows per second
    and the share of the time its thread ran on a core."""
    op()  # warm-up
    start.wait()
    calls = 0
    t0, cpu0 = time.perf_counter(), time.thread_time()
    deadline = t0 + seconds
    while True:
        op()
        calls += 1
        if calls % 16 == 0 and time.perf_counter() >= deadline:
            break
    wall = time.perf_counter() - t0
    out.append((calls * rows_per_call / wall, (time.thread_time() - cpu0) / wall))


def run(ops: dict, seconds: float) -> dict:
    """Runs the named ``(op, rows per call)`` pairs at once; their rows per second and
    core shares."""
    start = threading.Event()
    results = {name: [] for name in ops}
    threads = [
        threading.Thread(target=rate, args=(op, rows, seconds, start, results[name]))
        for name, (op, rows) in ops.items()
    ]
    for t in threads:
        t.start()
    time.sleep(0.05)
    start.set()
    for t in threads:
        t.join()
    return {name: r[0] for name, r in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller buffer, shorter runs")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per timed run")
    parser.add_argument("--trials", type=int, default=None, help="runs of each setting")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval(S) first (CPython's default is 0.005): how long a "
        "thread waiting for the GIL sleeps before it asks the holder to hand it over",
    )
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    capacity = 200_000 if args.quick else 1_000_000
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    trials = args.trials or (3 if args.quick else 5)

    spec = {key: (dtype, shape) for key, (shape, dtype) in MUJOCO.items()}
    rb = replaybuf.ReplayBuffer(capacity, spec=spec, seed=7)
    data = chunk(MUJOCO, CHUNK)
    while len(rb) < capacity:
        rb.extend(data)

    out = {key: np.empty((BATCH,) + shape, dtype) for key, (shape, dtype) in MUJOCO.items()}
    out["index"] = np.empty(BATCH, np.uint64)
    out["generation"] = np.empty(BATCH, np.uint64)
    learners = {"sample": lambda: rb.sample(BATCH), "sample_into": lambda: rb.sample_into(out)}
    collector = (lambda: rb.extend(data), CHUNK)

    for name, learn in learners.items():
        learner = (learn, BATCH)
        names = (
            "collector_alone",
            "learner_alone",
            "collector_with_learner",
            "learner_with_collector",
        )
        figures = {k: [] for k in names}
        for _ in range(trials):
            figures["collector_alone"].append(run({"c": collector}, seconds)["c"])
            figures["learner_alone"].append(run({"l": learner}, seconds)["l"])
            both = run({"c": collector, "l": learner}, seconds)
            figures["collector_with_learner"].append(both["c"])
            figures["learner_with_collector"].append(both["l"])
        m = {k: statistics.median(r for r, _ in v) for k, v in figures.items()}
        line = {
            "system": "replaybuf-py",
            "workload": "mujoco",
            "op": "threads" if name == "sample" else "threads-sample_into",
            "unit": "rows/s",
            **{k: round(v) for k, v in m.items()},
            "collector_ratio": round(m["collector_with_learner"] / m["collector_alone"], 3),
            "learner_ratio": round(m["learner_with_collector"] / m["learner_alone"], 3),
            # How much of a core each thread had: below 1 alone means other work on
            # the machine took the rest, which the ratios then say nothing about.
            "core_share": {
                k: round(statistics.median(c for _, c in v), 2) for k, v in figures.items()
            },
            "switch_interval_s": sys.getswitchinterval(),
            "cpus": len(os.sched_getaffinity(0)),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
