"""Samplers and write policies of the native face.

Each class describes itself to the engine as a plain dict (``_describe``); the TorchRL
face's classes of the same roles do the same, so one parser in Rust serves both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional, Tuple, Union

Key = Union[str, Tuple[str, ...]]

__all__ = [
    "Uniform",
    "WithoutReplacement",
    "Prioritized",
    "Slice",
    "RoundRobin",
    "Immutable",
    "MaxValue",
    "RateLimit",
    "Frames",
]


class _Described:
    _kind: str = ""

    def _describe(self) -> dict:
        d = {"kind": self._kind}
        for k, v in asdict(self).items():  # type: ignore[call-overload]
            d[k] = v._describe() if isinstance(v, _Described) else v
        return d


@dataclass
class Uniform(_Described):
    """Every stored row equally likely, with replacement (TorchRL ``RandomSampler``)."""

    _kind = "uniform"


@dataclass
class Fifo(_Described):
    """First in, first out: every row handed out once, oldest first (Reverb's ``Fifo``
    selector; with ``RateLimit.queue(size)``, Reverb's ``Table.queue``).

    A sample takes the oldest rows not taken yet of one shard, up to the batch size:
    fewer when fewer are waiting, ``ReplayBufferValueError`` when none are. Each
    shard is a queue of its own; learners in any thread or process never get the same
    row. Under ``RateLimit.queue(size)`` give each shard room for every row that may
    wait, one extend of every collector included (``capacity / shards >= size +
    collectors * rows per extend``): a row overwritten before it is taken is lost.
    """

    _kind = "fifo"


@dataclass
class WithoutReplacement(_Described):
    """Epochs: every row stored when an epoch begins is drawn once before any twice.

    The sample that finds the epoch used up raises :class:`replaybuf.EpochEnd` (a
    ``StopIteration``) and closes it; the sample after that starts a new epoch. Without
    ``drop_last`` an epoch's last batch may be short, and the sample after it raises;
    with ``drop_last`` the epoch ends (raises) as soon as fewer rows than a batch are
    left. ``shuffle``: a fresh random order each epoch (else storage order).
    """

    drop_last: bool = False
    shuffle: bool = True
    _kind = "without_replacement"


@dataclass
class Prioritized(_Described):
    """Rows drawn in proportion to ``(priority + eps) ** alpha``, with importance
    weights ``(N * P(i)) ** -beta`` normalised by the largest (TorchRL
    ``PrioritizedSampler``). ``reduction`` reduces a row's several priorities to one
    (max, min, mean, median, sum)."""

    alpha: float
    beta: float
    eps: float = 1e-8
    max_capacity: Optional[int] = None
    reduction: str = "max"
    max_priority_within_buffer: bool = False
    _kind = "prioritized"


@dataclass
class Slice(_Described):
    """Slices of consecutive steps of one trajectory (TorchRL ``SliceSampler``).

    Give one of ``num_slices`` (slices per batch) and ``slice_len``. Trajectories are
    told apart by ``traj_key`` (an integer id) or ended by ``end_key`` (default
    ``("next", "done")``); ``truncated_key`` also ends one. ``without_replacement`` (a
    :class:`WithoutReplacement`) gives ``SliceSamplerWithoutReplacement``;
    ``prioritized`` (a :class:`Prioritized`) with ``priority_over`` ``"start"`` gives
    ``PrioritizedSliceSampler``.
    """

    num_slices: Optional[int] = None
    slice_len: Optional[int] = None
    traj_key: Optional[Key] = None
    end_key: Optional[Key] = None
    truncated_key: Optional[Key] = None
    strict_length: bool = True
    span: Optional[Tuple[int, int]] = None
    without_replacement: Optional[WithoutReplacement] = None
    prioritized: Optional[Prioritized] = None
    priority_over: str = "start"
    _kind = "slice"

    def _describe(self) -> dict:
        d = super()._describe()
        if d.get("prioritized") is not None:
            d["prioritized"]["over"] = d.pop("priority_over")
        else:
            d.pop("priority_over")
        return d


@dataclass
class RoundRobin(_Described):
    """Append at the cursor, evicting the oldest row (TorchRL ``RoundRobinWriter``)."""

    _kind = "round_robin"


@dataclass
class Immutable(_Described):
    """A read-only dataset: every write is refused (``ImmutableDatasetWriter``)."""

    _kind = "immutable"


@dataclass
class MaxValue(_Described):
    """Keep the rows ranking highest by ``rank_key`` reduced by ``reduction``
    (TorchRL ``TensorDictMaxValueWriter``)."""

    rank_key: Key = "reward"
    reduction: str = "sum"
    _kind = "max_value"


class RateLimit:
    """How far collectors and learners may run apart (Reverb's rate limiters).

    The buffer counts rows inserted (``I``) and sampled (``S``) and keeps
    ``diff = I * samples_per_insert - S`` between ``min_diff`` and ``max_diff``: a
    ``sample`` waits for ``min_size_to_sample`` rows and while ``diff <= min_diff``
    (learners ahead), an ``extend`` while ``diff >= max_diff`` (collectors ahead). A
    call is judged by the counts before it, so an insert and a sample never wait on
    each other at once; ``diff`` overshoots the band by at most one call. Waits release
    the GIL and use no CPU; past ``insert_timeout`` / ``sample_timeout`` seconds (None:
    no limit) they raise :class:`replaybuf.ReplayBufferTimeoutError` (a
    ``TimeoutError``), and ``close_rate_limit()`` ends them with
    :class:`replaybuf.RateLimitClosed`. A ``shared=`` buffer's processes keep one limit
    together (its counts and sleepers live in the region): collector processes and a
    learner process hold one ratio, and calls racing may each pass on the same counts.

    >>> import replaybuf
    >>> limit = replaybuf.RateLimit.sample_to_insert_ratio(8.0, 1000, 512.0, sample_timeout=5.0)
    >>> rb = replaybuf.ReplayBuffer(10_000, spec={"x": ("float32", ())}, rate_limit=limit)
    """

    def __init__(
        self,
        min_size_to_sample: int = 1,
        samples_per_insert: float = 1.0,
        min_diff: float = float("-inf"),
        max_diff: float = float("inf"),
        *,
        insert_timeout: Optional[float] = None,
        sample_timeout: Optional[float] = None,
    ) -> None:
        self._d = {
            "preset": "custom",
            "min_size_to_sample": min_size_to_sample,
            "samples_per_insert": samples_per_insert,
            "min_diff": min_diff,
            "max_diff": max_diff,
        }
        self._timeouts(insert_timeout, sample_timeout)

    def _timeouts(self, insert_timeout: Optional[float], sample_timeout: Optional[float]) -> None:
        for name, value in (("insert_timeout", insert_timeout), ("sample_timeout", sample_timeout)):
            if value is not None:
                self._d[name] = value

    @classmethod
    def _preset(
        cls, preset: str, timeouts: Tuple[Optional[float], Optional[float]], **kw
    ) -> RateLimit:
        limit = cls.__new__(cls)
        limit._d = {"preset": preset, **kw}
        limit._timeouts(*timeouts)
        return limit

    @classmethod
    def min_size(
        cls,
        min_size_to_sample: int,
        *,
        insert_timeout: Optional[float] = None,
        sample_timeout: Optional[float] = None,
    ) -> RateLimit:
        """Samples wait for ``min_size_to_sample`` rows; nothing else waits."""
        return cls._preset(
            "min_size", (insert_timeout, sample_timeout), min_size_to_sample=min_size_to_sample
        )

    @classmethod
    def sample_to_insert_ratio(
        cls,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float,
        *,
        insert_timeout: Optional[float] = None,
        sample_timeout: Optional[float] = None,
    ) -> RateLimit:
        """Each row sampled about ``samples_per_insert`` times, give or take
        ``error_buffer`` samples (at least ``2 * max(1, samples_per_insert)``), once
        ``min_size_to_sample`` rows are in: a fixed replay ratio."""
        return cls._preset(
            "sample_to_insert_ratio",
            (insert_timeout, sample_timeout),
            samples_per_insert=samples_per_insert,
            min_size_to_sample=min_size_to_sample,
            error_buffer=error_buffer,
        )

    @classmethod
    def queue(
        cls,
        size: int,
        *,
        insert_timeout: Optional[float] = None,
        sample_timeout: Optional[float] = None,
    ) -> RateLimit:
        """Every row sampled once: collectors wait while ``size`` rows are unsampled,
        learners while none is. With ``sampler=Fifo()`` rows come out oldest first,
        each once (Reverb's ``Table.queue``); with another sampler, in its order."""
        return cls._preset("queue", (insert_timeout, sample_timeout), size=size)

    def _describe(self) -> dict:
        return {"kind": "rate_limit", **self._d}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._d.items())
        return f"RateLimit({args})"


@dataclass
class Frames(_Described):
    """Fields stored once a step: frame stacks and ``next_of`` (cpprb's
    ``stack_compress`` and ``next_of``, Dopamine's stacked states).

    ``stack`` maps a field of shape ``[depth, ...]`` (the last ``depth`` frames along
    its first axis) to ``depth``: one frame a step is stored. ``next_of`` maps a field
    that is not stored to the field it is the next step's value of: a row's
    ``next_obs`` is the following step's ``obs`` in its trajectory, and the step that
    ends an episode (``done`` or ``truncated``) keeps its own. Extends and samples keep
    the spec as declared and return exactly what a buffer without frames returns.

    ``fill``: what fills a stack before its episode's first step (``"repeat"`` the
    first frame, or ``"zeros"``). An extend whose stacks do not follow the previous
    step's raises ``ReplayBufferValueError`` and changes nothing, unless ``checked`` is
    False. ``terminal_slots``: episode ends kept per shard (default one per 128 steps);
    rows older than the oldest kept one leave the buffer. ``done`` / ``truncated``: the
    fields that end episodes (default ``done`` / ``truncated`` if the spec has them).

    >>> import replaybuf
    >>> spec = {"obs": ("uint8", (4, 84, 84)), "next_obs": ("uint8", (4, 84, 84)),
    ...         "action": ("int64", ()), "done": ("bool", ())}
    >>> rb = replaybuf.ReplayBuffer(10_000, spec=spec, frames=replaybuf.Frames(
    ...     stack={"obs": 4}, next_of={"next_obs": "obs"}))
    """

    stack: Optional[dict] = None
    next_of: Optional[dict] = None
    fill: str = "repeat"
    checked: bool = True
    terminal_slots: Optional[int] = None
    done: Optional[Key] = None
    truncated: Optional[Key] = None
    _kind = "frames"

    def _describe(self) -> dict:
        d = super()._describe()
        d["stack"] = list((self.stack or {}).items())
        d["next_of"] = list((self.next_of or {}).items())
        return d
