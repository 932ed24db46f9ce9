"""Collector processes extend one shared-memory replay buffer while the parent samples it.

The parent makes the buffer in a named shared-memory region (``shared=name``) with a
shard per collector, and hands it to ``multiprocessing`` workers: a shared buffer
pickles as its name, and each worker attaches to the same memory on unpickling. Each
worker steps its own pendulums (``pendulum_sim.py``) and extends its shard a chunk at
a time. The parent's learner threads sample batches meanwhile and recompute every
sampled transition from the simulator, counting any row that is not one whole
transition (torn). At the end the workers stop and detach, and the parent's buffer,
the region's creator, removes the region's name when it is dropped.

    python examples/python/processes.py --seconds 10 --collectors 2 --learners 1

Takes the arguments of ``threads.py``; prints the transitions written and rows sampled
per second, and the torn rows (0). With ``--ratio R`` the collector processes and the
learners keep one rate limit of about R sampled rows per written row (a fixed replay
ratio), its counts and sleepers in the region.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import replaybuf
from pendulum_sim import SPEC, collect, learn
from threads import parse_args, progress, rate_limit, report, stop_all


def collector_process(rb, k: int, envs: int, steps: int, stop, written) -> None:
    """A worker's body: `rb` arrived pickled, attached to the parent's region."""
    try:
        collect(rb, k, envs, steps, stop, written)
    except KeyboardInterrupt:
        pass


def main() -> int:
    args = parse_args("processes", learners=1)
    name = f"example-processes-{os.getpid()}"
    region = f"/dev/shm/replaybuf.{name}"
    # Spawned workers start clean (no forked copy of the parent's threads or mappings)
    # and receive the buffer by pickle, which is by name.
    ctx = mp.get_context("spawn")
    # With `--ratio`, the collector processes and the learners keep one rate limit:
    # its counts and sleepers live in the region.
    rb = replaybuf.ReplayBuffer(
        args.capacity,
        spec=SPEC,
        shards=args.collectors,
        shared=name,
        seed=0,
        rate_limit=rate_limit(args),
    )
    stop = ctx.Event()
    written = [ctx.Array("q", 1, lock=False) for _ in range(args.collectors)]
    workers = [
        ctx.Process(
            target=collector_process,
            args=(rb, k, args.envs, args.steps, stop, written[k]),
            name=f"collector-{k}",
        )
        for k in range(args.collectors)
    ]
    tallies = [[0, 0] for _ in range(args.learners)]  # rows sampled, torn
    done = threading.Event()
    errors: list[BaseException] = []

    def learner(tally) -> None:
        try:
            learn(rb, args.batch, args.collectors, done, tally)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            done.set()

    learners = [threading.Thread(target=learner, args=(t,)) for t in tallies]
    try:
        for w in workers:
            w.start()
        # Time from the first written row: starting a worker takes a while.
        while len(rb) == 0 and all(w.is_alive() for w in workers):
            time.sleep(0.01)
        start = time.perf_counter()
        for t in learners:
            t.start()

        def collectors_alive() -> None:
            if not all(w.is_alive() for w in workers):
                raise RuntimeError("a collector process died")

        progress(rb, args.seconds, start, written, tallies, done, collectors_alive)
        elapsed = time.perf_counter() - start
    finally:
        stop_all(rb, stop)
        done.set()
        for t in learners:
            if t.is_alive():
                t.join()
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join()
        # The creator's handle: dropping it removes the region's name. (The workers'
        # copies of the arguments went when they started.)
        rb = None
    if errors:
        raise errors[0]
    if os.path.isdir("/dev/shm"):
        print(f"shared region {'left behind' if os.path.exists(region) else 'removed'}")
    return report(
        args,
        sum(c[0] for c in written),
        sum(t[0] for t in tallies),
        sum(t[1] for t in tallies),
        elapsed,
    )


if __name__ == "__main__":
    raise SystemExit(main())
