"""Collectors on Ray feeding one buffer actor: replaybuf.ray beside TorchRL's
RayReplayBuffer, and beside the same collectors writing a shared-memory buffer.

    python python/bench/ray_bench.py [--seconds S] [--collectors N]

Two collector actors (or processes, for the shared-memory line) extend the mujoco
workload's chunk (1,000 rows, WORKLOADS.md) over and over for S seconds; the figure is
rows written per second, all collectors together, until the last row is stored.

- ``writer-extend``, ``extend``: the collectors' ``rb.writer()``, and ``rb.extend``
  per chunk, on the actor's node: they write its shared buffer in place
  (``local_writes``, the default; the buffer gets a shard per collector and one for
  the actor, rounded up to a power of two).
- ``writer-extend-shipped``, ``extend-shipped``: the same with every row through
  Ray's object store, as from collectors on other nodes (``local_writes=False``; the
  writer's defaults: shipments of 8 MiB, two on their way at once; ``extend`` one
  round trip a chunk, as TorchRL's collectors call theirs).
- ``replaybuf-shared-actors``: the same collector actors extending a plain
  shared-memory buffer (no buffer actor); ``replaybuf-shared``: the same loop in
  processes of their own, Ray shut down.

Then the driver samples 256 rows through the actor 200 times: the mean and median
latency of one call. Prints JSON lines (system, workload "ray", op, us_per_op,
items_per_s).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import ray
from bench import WL, emit
from bench import chunk as workload_chunk

# The mujoco workload as bench.py (and WORKLOADS.md) give it.
CAPACITY, MUJOCO, CHUNK, BATCH = WL["mujoco"]
SPEC = {k: (np.dtype(d).name, s) for k, (s, d) in MUJOCO.items()}


def chunk() -> dict:
    return workload_chunk(MUJOCO, CHUNK)


@ray.remote
class Collector:
    """Extends `rb` with one chunk over and over for `seconds` (through a writer of
    `rb`'s when `writer` holds its arguments, flushed at the end); returns rows
    written (and acknowledged)."""

    def __init__(self, make_data):
        self.data = make_data()

    def run(self, rb, seconds: float, writer=None) -> int:
        sink = rb if writer is None else rb.writer(**writer)
        rows, until = 0, time.monotonic() + seconds
        while time.monotonic() < until:
            sink.extend(self.data)
            rows += CHUNK
        if writer is not None:
            sink.flush()
        return rows


def write_rate(rb, make_data, collectors: int, seconds: float, writer=None) -> float:
    """Rows per second from `collectors` Collector actors into `rb`: the time until
    every row is stored."""
    actors = [Collector.remote(make_data) for _ in range(collectors)]
    ray.get([a.run.remote(rb, 0.2, writer) for a in actors])  # warm: imports, first writes
    t = time.monotonic()
    rows = sum(ray.get([a.run.remote(rb, seconds, writer) for a in actors]))
    return rows / (time.monotonic() - t)


def sample_latency(sample, calls: int = 200) -> tuple:
    for _ in range(5):
        sample()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        sample()
        times.append(time.perf_counter() - t)
    return statistics.mean(times), statistics.median(times)


def torchrl_chunk():
    import torch
    from tensordict import TensorDict

    return TensorDict({k: torch.from_numpy(v) for k, v in chunk().items()}, [CHUNK])


def shared_collector(name: str, seconds: float, out) -> None:
    import replaybuf

    rb, data = replaybuf.ReplayBuffer.attach(name), chunk()
    rows, until = 0, time.monotonic() + seconds
    while time.monotonic() < until:
        rb.extend(data)
        rows += CHUNK
    out.put(rows)


def shared_rate(collectors: int, seconds: float) -> float:
    """Rows per second from `collectors` processes into a shared-memory buffer."""
    import replaybuf

    name = f"rb-raybench-{os.getpid()}"
    rb = replaybuf.ReplayBuffer(CAPACITY, spec=SPEC, shards=collectors, shared=name)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=shared_collector, args=(name, seconds, out)) for _ in range(collectors)
    ]
    for p in procs:
        p.start()
    rows = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(60)
    del rb
    return rows / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--collectors", type=int, default=2)
    # The collectors' writers (`writer-extend`): RayReplayBuffer.writer's defaults.
    parser.add_argument("--writer-rows", type=int, default=None)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument(
        "--only-writer", action="store_true", help="only the writer-extend line (to tune it)"
    )
    args = parser.parse_args()
    # Ray's workers import bench.py (the workload) from this folder.
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(
        include_dashboard=False,
        logging_level="error",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": here}},
    )

    from replaybuf.ray import RayReplayBuffer

    writer = {"max_rows": args.writer_rows, "max_in_flight": args.in_flight}
    shards = 1 << args.collectors.bit_length()  # a power of two above the collectors
    here_rb = RayReplayBuffer(CAPACITY, spec=SPEC, seed=1, shards=shards)
    rate = write_rate(here_rb, chunk, args.collectors, args.seconds, writer)
    emit("replaybuf-ray", "ray", "writer-extend", CHUNK / rate, CHUNK)
    if not args.only_writer:
        rate = write_rate(here_rb, chunk, args.collectors, args.seconds)
        emit("replaybuf-ray", "ray", "extend", CHUNK / rate, CHUNK)
    del here_rb
    # The same collector actors, Ray up around them, into a plain shared buffer.
    import replaybuf

    shm = replaybuf.ReplayBuffer(
        CAPACITY, spec=SPEC, shards=args.collectors, shared=f"rb-raybench-{os.getpid()}"
    )
    rate = write_rate(shm, chunk, args.collectors, args.seconds)
    emit("replaybuf-shared-actors", "ray", "extend", CHUNK / rate, CHUNK)
    del shm
    rb = RayReplayBuffer(CAPACITY, spec=SPEC, seed=1, local_writes=False)
    rate = write_rate(rb, chunk, args.collectors, args.seconds, writer)
    emit("replaybuf-ray", "ray", "writer-extend-shipped", CHUNK / rate, CHUNK)
    if args.only_writer:
        ray.shutdown()
        return
    rate = write_rate(rb, chunk, args.collectors, args.seconds)
    emit("replaybuf-ray", "ray", "extend-shipped", CHUNK / rate, CHUNK)
    mean, p50 = sample_latency(lambda: rb.sample(BATCH))
    emit("replaybuf-ray", "ray", "sample", mean, BATCH)
    emit("replaybuf-ray", "ray", "sample_p50", p50, BATCH)

    try:
        from functools import partial

        from torchrl.data import LazyTensorStorage
        from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer as TorchRLRay
    except ImportError as e:
        print(f"ray_bench: torchrl's RayReplayBuffer is not importable ({e})", flush=True)
    else:
        trb = TorchRLRay(storage=partial(LazyTensorStorage, CAPACITY), batch_size=BATCH)
        # Collectors get TorchRL's picklable client, as its docs say.
        rate = write_rate(trb.client(), torchrl_chunk, args.collectors, args.seconds)
        emit("torchrl-ray", "ray", "extend", CHUNK / rate, CHUNK)
        mean, p50 = sample_latency(lambda: trb.sample(BATCH))
        emit("torchrl-ray", "ray", "sample", mean, BATCH)
        emit("torchrl-ray", "ray", "sample_p50", p50, BATCH)

    ray.shutdown()
    rate = shared_rate(args.collectors, args.seconds)
    emit("replaybuf-shared", "ray", "extend", CHUNK / rate, CHUNK)


if __name__ == "__main__":
    main()
