"""Collector processes extend one shared-memory replay buffer while the parent samples it.

The parent makes the buffer in a named shared-memory region (``shared=name``) with a
shard per collector, and hands it to ``multiprocessing`` workers: a shared buffer
pickles as its name, and each worker attaches to the same memory on unpickling. Each
worker steps its own pendulums (``pendulum.py``) and extends its shard a chunk at a
time. The parent's learner threads sample batches meanwhile and recompute every
sampled transition from the simulator, counting any row that is not one whole
transition (torn). At the end the workers stop and detach, and the parent's buffer,
the region's creator, removes the region's name when it is dropped.

    python examples/python/processes.py --seconds 10 --collectors 2 --learners 1

Prints the transitions written and rows sampled per second, and the torn rows (0).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import threading
import time

import replaybuf
from pendulum import SPEC, Pendulums, torn_rows


def collect(rb, k: int, envs: int, steps: int, stop, written) -> None:
    """A collector process: `rb` arrived pickled and is attached to the parent's region."""
    sim = Pendulums(k, envs, seed=k)
    try:
        while not stop.is_set():
            rows = sim.rollout(steps)
            rb.extend(rows)
            written.value += len(rows["tag"])
    except KeyboardInterrupt:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="how long the collectors and learners run")
    p.add_argument("--collectors", type=int, default=2, help="collector processes")
    p.add_argument("--learners", type=int, default=1, help="learner threads in the parent")
    p.add_argument("--capacity", type=int, default=100_000, help="rows the buffer holds")
    p.add_argument("--envs", type=int, default=50, help="pendulums per collector")
    p.add_argument("--steps", type=int, default=20, help="steps per chunk (a chunk is envs * steps rows)")
    p.add_argument("--batch", type=int, default=256, help="rows per sample")
    args = p.parse_args()

    name = f"example-processes-{os.getpid()}"
    # Spawned workers start clean (no forked copy of the parent's threads or mappings)
    # and receive the buffer by pickle, which is by name.
    ctx = mp.get_context("spawn")
    rb = replaybuf.ReplayBuffer(args.capacity, spec=SPEC, shards=args.collectors, shared=name, seed=0)
    stop = ctx.Event()
    written = [ctx.Value("q", 0, lock=False) for _ in range(args.collectors)]
    workers = [ctx.Process(target=collect, args=(rb, k, args.envs, args.steps, stop, written[k]),
                           name=f"collector-{k}")
               for k in range(args.collectors)]
    sampled = [0] * args.learners
    torn = [0] * args.learners
    done = threading.Event()
    errors: list[BaseException] = []

    def learner(k: int) -> None:
        try:
            out = None
            while not done.is_set():
                if len(rb) < args.batch:
                    time.sleep(0.001)
                    continue
                if out is None:
                    out = rb.sample(args.batch)
                else:
                    rb.sample_into(out)
                sampled[k] += len(out["tag"])
                torn[k] += torn_rows(out, args.collectors)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            done.set()

    learners = [threading.Thread(target=learner, args=(k,), name=f"learner-{k}")
                for k in range(args.learners)]
    try:
        for w in workers:
            w.start()
        # Time from the first written row: spawning a worker takes a while.
        while len(rb) == 0 and all(w.is_alive() for w in workers):
            time.sleep(0.01)
        start = time.perf_counter()
        for t in learners:
            t.start()
        last, last_written, last_sampled = start, 0, 0
        while not done.is_set() and time.perf_counter() - start < args.seconds:
            time.sleep(min(1.0, max(0.0, args.seconds - (time.perf_counter() - start))))
            if not all(w.is_alive() for w in workers):
                raise RuntimeError("a collector process died")
            now, wr, s = time.perf_counter(), sum(v.value for v in written), sum(sampled)
            print(f"{now - start:5.1f}s  written {(wr - last_written) / (now - last):12,.0f}/s  "
                  f"sampled {(s - last_sampled) / (now - last):12,.0f}/s  stored {len(rb):,}", flush=True)
            last, last_written, last_sampled = now, wr, s
        elapsed = time.perf_counter() - start
    finally:
        stop.set()
        done.set()
        for t in learners:
            if t.is_alive():
                t.join()
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join()
        region = f"/dev/shm/replaybuf.{name}"
        del rb  # the creator's handle: dropping it removes the region's name
    if errors:
        raise errors[0]

    wr, s, bad = sum(v.value for v in written), sum(sampled), sum(torn)
    print(f"{args.collectors} collector process(es), {args.learners} learner thread(s), {elapsed:.1f}s: "
          f"{wr:,} transitions written ({wr / elapsed:,.0f}/s), "
          f"{s:,} rows sampled and checked ({s / elapsed:,.0f}/s)")
    if os.path.isdir("/dev/shm"):
        print(f"shared region {'left behind' if os.path.exists(region) else 'removed'}")
    print(f"torn rows: {bad} of {s:,} checked")
    if s == 0:
        print("no row was sampled: nothing was checked")
        return 1
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
