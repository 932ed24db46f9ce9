"""Collectors on Ray feeding one buffer actor: replaybuf.ray beside TorchRL's
RayReplayBuffer, and beside the same collectors writing a shared-memory buffer.

    python python/bench/ray_bench.py [--seconds S] [--collectors N]

Two collector actors (or processes, for the shared-memory line) extend the mujoco
workload's chunk (1,000 rows, WORKLOADS.md) over and over for S seconds; the figure is
rows written per second, all collectors together. Then the driver samples 256 rows
through the actor 200 times: the mean and median latency of one call. Prints JSON
lines (system, workload "ray", op, us_per_op, items_per_s).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import numpy as np
import ray

MUJOCO = {
    "obs": ((17,), np.float32),
    "action": ((6,), np.float32),
    "reward": ((1,), np.float32),
    "next_obs": ((17,), np.float32),
    "done": ((1,), np.bool_),
}
CHUNK, BATCH, CAPACITY = 1000, 256, 1_000_000


def chunk() -> dict:
    rng = np.random.default_rng(0)
    return {k: rng.random((CHUNK,) + s).astype(d) for k, (s, d) in MUJOCO.items()}


def emit(system: str, op: str, us: float, items: int) -> None:
    line = {"system": system, "workload": "ray", "op": op, "us_per_op": round(us, 2)}
    line["items_per_s"] = round(items / us * 1e6)
    print(json.dumps(line), flush=True)


@ray.remote
class Collector:
    """Extends `rb` with one chunk over and over for `seconds`; returns rows written."""

    def __init__(self, make_data):
        self.data = make_data()

    def run(self, rb, seconds: float) -> int:
        rows, until = 0, time.monotonic() + seconds
        while time.monotonic() < until:
            rb.extend(self.data)
            rows += CHUNK
        return rows


def write_rate(rb, make_data, collectors: int, seconds: float) -> float:
    """Rows per second from `collectors` Collector actors into `rb`."""
    actors = [Collector.remote(make_data) for _ in range(collectors)]
    ray.get([a.run.remote(rb, 0.2) for a in actors])  # warm: imports, first writes
    t = time.monotonic()
    rows = sum(ray.get([a.run.remote(rb, seconds) for a in actors]))
    return rows / (time.monotonic() - t)


def sample_latency(sample, calls: int = 200) -> tuple:
    for _ in range(5):
        sample()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        sample()
        times.append(time.perf_counter() - t)
    return statistics.mean(times) * 1e6, statistics.median(times) * 1e6


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
    spec = {k: (np.dtype(d).name, s) for k, (s, d) in MUJOCO.items()}
    rb = replaybuf.ReplayBuffer(CAPACITY, spec=spec, shards=collectors, shared=name)
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
    args = parser.parse_args()
    ray.init(include_dashboard=False, logging_level="error", log_to_driver=False)

    from replaybuf.ray import RayReplayBuffer

    spec = {k: (np.dtype(d).name, s) for k, (s, d) in MUJOCO.items()}
    rb = RayReplayBuffer(CAPACITY, spec=spec, seed=1)
    rate = write_rate(rb, chunk, args.collectors, args.seconds)
    emit("replaybuf-ray", "extend", CHUNK / rate * 1e6, CHUNK)
    mean, p50 = sample_latency(lambda: rb.sample(BATCH))
    emit("replaybuf-ray", "sample", mean, BATCH)
    emit("replaybuf-ray", "sample_p50", p50, BATCH)

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
        emit("torchrl-ray", "extend", CHUNK / rate * 1e6, CHUNK)
        mean, p50 = sample_latency(lambda: trb.sample(BATCH))
        emit("torchrl-ray", "sample", mean, BATCH)
        emit("torchrl-ray", "sample_p50", p50, BATCH)

    ray.shutdown()
    rate = shared_rate(args.collectors, args.seconds)
    emit("replaybuf-shared", "extend", CHUNK / rate * 1e6, CHUNK)


if __name__ == "__main__":
    main()
