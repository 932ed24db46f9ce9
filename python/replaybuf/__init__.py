"""replaybuf: a lock-free replay buffer for reinforcement learning, with a Rust core.

Collector threads (or processes) extend it while learner threads sample it, with no
lock between them; a sampled row is never torn. Rows go in and out as numpy arrays;
``torch.from_numpy`` turns a sampled array into a tensor without a copy.

>>> import numpy as np, replaybuf
>>> rb = replaybuf.ReplayBuffer(1000, spec={"obs": ("float32", (4,)), "action": ("int64", ())})
>>> idx = rb.extend({"obs": np.zeros((10, 4), np.float32), "action": np.arange(10)})
>>> batch = rb.sample(4)
>>> sorted(batch)
['action', 'generation', 'index', 'obs']

Faces: :mod:`replaybuf.torchrl` (TorchRL's classes, one changed import) and
:mod:`replaybuf.tmrl` (tmrl's ``Memory``).
"""

import os as _os

from . import _native
from ._config import (
    Fifo,
    Frames,
    Immutable,
    MaxValue,
    Prioritized,
    RateLimit,
    RoundRobin,
    Slice,
    Uniform,
    WithoutReplacement,
)
from ._native import (
    MARK_END,
    MARK_START,
    MARK_TRUNCATED,
    MARK_VALID,
    PADDING_INDEX,
    EpochEnd,
    RateLimitClosed,
    ReplayBuffer,
    ReplayBufferError,
    ReplayBufferIndexError,
    ReplayBufferKeyError,
    ReplayBufferOSError,
    ReplayBufferTimeoutError,
    ReplayBufferTypeError,
    ReplayBufferValueError,
)

__all__ = [
    "ReplayBuffer",
    "Uniform",
    "WithoutReplacement",
    "Prioritized",
    "Slice",
    "Fifo",
    "RoundRobin",
    "Immutable",
    "MaxValue",
    "RateLimit",
    "Frames",
    "ReplayBufferError",
    "ReplayBufferValueError",
    "ReplayBufferTypeError",
    "ReplayBufferIndexError",
    "ReplayBufferKeyError",
    "ReplayBufferOSError",
    "ReplayBufferTimeoutError",
    "RateLimitClosed",
    "EpochEnd",
    "MARK_VALID",
    "MARK_START",
    "MARK_END",
    "MARK_TRUNCATED",
    "PADDING_INDEX",
]
__version__ = "0.1.0"

# A forked child re-attaches to shared buffers as itself on first use (see the native
# ReplayBuffer's docs): count forks so it can tell.
_os.register_at_fork(after_in_child=_native._forked)
