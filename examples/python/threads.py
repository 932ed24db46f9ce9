"""Collector threads extend one replay buffer while learner threads sample it.

Each collector thread steps its own pendulums (``pendulum.py``, Gymnasium's
Pendulum-v1 dynamics in numpy) and extends the buffer with a chunk of transitions at a
time; each learner thread samples batches and recomputes every sampled transition from
the simulator, counting any row that is not one whole transition (torn). The buffer is
small enough to wrap around many times, so learners read rows while collectors
overwrite the rows beside them. replaybuf releases the GIL while rows move, so the
threads' copies run at once.

    python examples/python/threads.py --seconds 10 --collectors 2 --learners 2

Prints the transitions written and rows sampled per second, and the torn rows (0).
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

import replaybuf
from pendulum import SPEC, Pendulums, torn_rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="how long the collectors and learners run")
    p.add_argument("--collectors", type=int, default=2, help="collector threads")
    p.add_argument("--learners", type=int, default=2, help="learner threads")
    p.add_argument("--capacity", type=int, default=100_000, help="rows the buffer holds")
    p.add_argument("--envs", type=int, default=50, help="pendulums per collector")
    p.add_argument("--steps", type=int, default=20, help="steps per chunk (a chunk is envs * steps rows)")
    p.add_argument("--batch", type=int, default=256, help="rows per sample")
    args = p.parse_args()

    # One shard per collector: no two collectors share a write cursor.
    rb = replaybuf.ReplayBuffer(args.capacity, spec=SPEC, shards=args.collectors, seed=0)
    stop = threading.Event()
    written = [0] * args.collectors
    sampled = [0] * args.learners
    torn = [0] * args.learners
    errors: list[BaseException] = []

    def collector(k: int) -> None:
        try:
            sim = Pendulums(k, args.envs, seed=k)
            while not stop.is_set():
                rows = sim.rollout(args.steps)
                rb.extend(rows)
                written[k] += len(rows["tag"])
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            stop.set()

    def learner(k: int) -> None:
        try:
            # A learner's arrays are allocated once and refilled by each sample.
            out = None
            while not stop.is_set():
                if len(rb) < args.batch:
                    time.sleep(0.001)
                    continue
                if out is None:
                    out = rb.sample(args.batch)
                else:
                    rb.sample_into(out)
                sampled[k] += len(out["tag"])
                torn[k] += torn_rows(out, args.collectors)
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=collector, args=(k,), name=f"collector-{k}")
               for k in range(args.collectors)]
    threads += [threading.Thread(target=learner, args=(k,), name=f"learner-{k}")
                for k in range(args.learners)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    last, last_written, last_sampled = start, 0, 0
    while not stop.is_set() and time.perf_counter() - start < args.seconds:
        time.sleep(min(1.0, max(0.0, args.seconds - (time.perf_counter() - start))))
        now, w, s = time.perf_counter(), sum(written), sum(sampled)
        print(f"{now - start:5.1f}s  written {(w - last_written) / (now - last):12,.0f}/s  "
              f"sampled {(s - last_sampled) / (now - last):12,.0f}/s  stored {len(rb):,}", flush=True)
        last, last_written, last_sampled = now, w, s
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - start

    w, s, bad = sum(written), sum(sampled), sum(torn)
    print(f"{args.collectors} collector(s), {args.learners} learner(s), {elapsed:.1f}s: "
          f"{w:,} transitions written ({w / elapsed:,.0f}/s), "
          f"{s:,} rows sampled and checked ({s / elapsed:,.0f}/s)")
    print(f"torn rows: {bad} of {s:,} checked")
    if s == 0:
        print("no row was sampled: nothing was checked")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
