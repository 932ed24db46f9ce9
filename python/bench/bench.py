"""replaybuf's Python faces on the workloads of WORKLOADS.md, as JSON lines.

    python python/bench/bench.py [--quick] [FILTER...]

Prints one JSON object a line (system, workload, op, us_per_op, items_per_s) for

- ``replaybuf-py``: the numpy face, ``replaybuf.ReplayBuffer``. ``sample`` returns
  fresh numpy arrays; ``sample_into`` writes into arrays allocated once.
- ``replaybuf-torchrl``: the TorchRL face, ``replaybuf.torchrl``, built and called
  exactly as the peers' bench builds and calls ``torchrl.data`` (TensorDicts in and
  out), so each line reads beside TorchRL's.

Sizes, data, operation counts and timing are those of the peers' bench (run-peers), so
the figures of one run of both, back to back on one machine, compare line for line:
the same chunk of random rows extended over and over, ``fill`` the mean extend until
the buffer is full (first touch of its memory included), ``extend`` the mean of
``max(fills / 2, 20)`` extends after wrap-around, sample ops the mean of 2,000 calls
(mujoco; TorchRL's face 500 as for TorchRL) or 500 (atari; 200), after 3 warm-up calls.

FILTER keeps the jobs whose label ("replaybuf-py mujoco-slice", ...) contains it.
"""

from __future__ import annotations

import functools
import json
import sys
import time

import numpy as np

QUICK = "--quick" in sys.argv
R = np.random.default_rng(0)
SEED = 7

# field name -> (shape, dtype), as WORKLOADS.md gives them (TorchRL's dtypes: bool is a byte)
MUJOCO = dict(
    obs=((17,), np.float32),
    action=((6,), np.float32),
    reward=((1,), np.float32),
    next_obs=((17,), np.float32),
    done=((1,), np.bool_),
)
ATARI = dict(
    obs=((4, 84, 84), np.uint8),
    action=((1,), np.int64),
    reward=((1,), np.float32),
    next_obs=((4, 84, 84), np.uint8),
    done=((1,), np.bool_),
)
# name -> (capacity, fields, extend chunk, sample batch)
WL = {
    "mujoco": (200_000 if QUICK else 1_000_000, MUJOCO, 1000, 256),
    "atari": (10_000 if QUICK else 50_000, ATARI, 256, 32),
}
ALPHA, BETA, EPS = 0.6, 0.4, 1e-8
TRAJ_STEPS = 200  # mujoco-slice: trajectory length
SLICE_LEN = 32  # mujoco-slice: steps per slice (8 slices in a batch of 256)


def timeit(fn, n, warm=3):
    for _ in range(warm):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def emit(system, workload, op, sec, items):
    print(
        json.dumps(
            dict(
                system=system,
                workload=workload,
                op=op,
                us_per_op=round(sec * 1e6, 2),
                items_per_s=round(items / sec),
            )
        ),
        flush=True,
    )


def chunk(fields, n):
    """n random rows of `fields`, drawn as the peers' bench draws them."""
    out = {}
    for k, (shape, dt) in fields.items():
        if dt == np.uint8:
            out[k] = R.integers(0, 255, size=(n,) + shape, dtype=np.uint8)
        elif dt == np.bool_:
            out[k] = R.random((n,) + shape) < 0.01
        elif dt == np.int64:
            out[k] = R.integers(0, 18, size=(n,) + shape, dtype=np.int64)
        else:
            out[k] = R.standard_normal((n,) + shape).astype(dt)
    return out


def sample_calls(name, torchrl_face=False):
    """How many sample calls are timed: the peers' counts (cpprb's for the numpy face,
    TorchRL's for the TorchRL face)."""
    if torchrl_face:
        return 500 if name == "mujoco" else 200
    return 2000 if name == "mujoco" else 500


# ---------------------------------------------------------------- the numpy face


def bench_native(name, prioritized=False, slice_=False):
    import replaybuf

    system = "replaybuf-py"
    cap, fields, ch, batch = WL[name]
    data = chunk(fields, ch)
    wl = name + ("-prioritized" if prioritized else "") + ("-slice" if slice_ else "")
    spec = {k: (np.dtype(d).name, s) for k, (s, d) in fields.items()}
    if prioritized:
        sampler = replaybuf.Prioritized(alpha=ALPHA, beta=BETA, eps=EPS)
    elif slice_:
        spec["traj"] = ("int64", (1,))
        sampler = replaybuf.Slice(num_slices=batch // SLICE_LEN, traj_key="traj")
    else:
        sampler = replaybuf.Uniform()
    rb = replaybuf.ReplayBuffer(cap, spec=spec, sampler=sampler, seed=SEED)
    steps = np.arange(ch).reshape(ch, 1) // TRAJ_STEPS  # 5 trajectories a chunk
    n = cap // ch
    t = time.perf_counter()
    for i in range(n):
        if slice_:
            data["traj"] = steps + 5 * i
        rb.extend(data)
    emit(system, wl, "fill", (time.perf_counter() - t) / n, ch)
    emit(system, wl, "extend", timeit(lambda: rb.extend(data), max(n // 2, 20), warm=0), ch)

    calls = sample_calls(name)
    out = rb.sample(batch)  # arrays of the right dtypes and shapes, for sample_into
    if prioritized:
        pr = R.random(batch) + 0.1

        def step():
            s = rb.sample(batch)
            rb.update_priority(s["index"], pr, s["generation"])

        def step_into():
            rb.sample_into(out)
            rb.update_priority(out["index"], pr, out["generation"])

        emit(system, wl, "sample+update", timeit(step, calls), batch)
        emit(system, wl, "sample_into+update", timeit(step_into, calls), batch)
    else:
        emit(system, wl, "sample", timeit(lambda: rb.sample(batch), calls), batch)
        emit(system, wl, "sample_into", timeit(lambda: rb.sample_into(out), calls), batch)


# ---------------------------------------------------------------- the TorchRL face


@functools.cache
def torchrl_face():
    """replaybuf.torchrl's classes under the names the peers' bench imports, or None
    (said once on stderr)."""
    try:
        import replaybuf.torchrl as face
    except ImportError as e:
        print(
            f"bench: replaybuf.torchrl is not importable ({e}); skipping replaybuf-torchrl",
            file=sys.stderr,
        )
        return None
    slice_sampler = getattr(face, "SliceSampler", None)
    if slice_sampler is None:
        from replaybuf.torchrl.samplers import SliceSampler as slice_sampler
    return dict(
        LazyTensorStorage=face.LazyTensorStorage,
        TensorDictReplayBuffer=face.TensorDictReplayBuffer,
        TensorDictPrioritizedReplayBuffer=face.TensorDictPrioritizedReplayBuffer,
        SliceSampler=slice_sampler,
    )


def bench_torchrl_face(name, prioritized=False, slice_=False):
    face = torchrl_face()
    if face is None:
        return
    import torch
    from tensordict import TensorDict

    LazyTensorStorage = face["LazyTensorStorage"]
    TensorDictReplayBuffer = face["TensorDictReplayBuffer"]
    TensorDictPrioritizedReplayBuffer = face["TensorDictPrioritizedReplayBuffer"]
    SliceSampler = face["SliceSampler"]

    system = "replaybuf-torchrl"
    torch.set_num_threads(1)
    cap, fields, ch, batch = WL[name]
    raw = chunk(fields, ch)
    td = TensorDict({k: torch.from_numpy(v) for k, v in raw.items()}, [ch])
    wl = name + ("-prioritized" if prioritized else "") + ("-slice" if slice_ else "")
    if prioritized:
        rb = TensorDictPrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(cap), batch_size=batch
        )
    elif slice_:
        td["traj"] = torch.arange(ch) // TRAJ_STEPS  # 5 trajectories of length 200 per chunk
        rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(cap),
            sampler=SliceSampler(slice_len=SLICE_LEN, traj_key="traj"),
            batch_size=batch,
        )
    else:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cap), batch_size=batch)
    n = cap // ch
    t = time.perf_counter()
    for i in range(n):
        if slice_:
            td["traj"] = torch.arange(ch) // TRAJ_STEPS + 5 * i
        rb.extend(td)
    emit(system, wl, "fill", (time.perf_counter() - t) / n, ch)
    emit(system, wl, "extend", timeit(lambda: rb.extend(td), max(n // 2, 20), warm=0), ch)
    calls = sample_calls(name, torchrl_face=True)
    if prioritized:
        pr = torch.rand(batch) + 0.1

        def step():
            s = rb.sample()
            rb.update_priority(s["index"], pr)

        emit(system, wl, "sample+update", timeit(step, calls), batch)
    else:
        emit(system, wl, "sample", timeit(lambda: rb.sample(), calls), batch)


if __name__ == "__main__":
    only = [a for a in sys.argv[1:] if not a.startswith("--")]
    jobs = [
        ("replaybuf-py mujoco", lambda: bench_native("mujoco")),
        ("replaybuf-py mujoco-prioritized", lambda: bench_native("mujoco", prioritized=True)),
        ("replaybuf-py mujoco-slice", lambda: bench_native("mujoco", slice_=True)),
        ("replaybuf-torchrl mujoco", lambda: bench_torchrl_face("mujoco")),
        (
            "replaybuf-torchrl mujoco-prioritized",
            lambda: bench_torchrl_face("mujoco", prioritized=True),
        ),
        ("replaybuf-torchrl mujoco-slice", lambda: bench_torchrl_face("mujoco", slice_=True)),
        ("replaybuf-py atari", lambda: bench_native("atari")),
        ("replaybuf-torchrl atari", lambda: bench_torchrl_face("atari")),
    ]
    for label, job in jobs:
        if only and not any(o in label for o in only):
            continue
        job()
