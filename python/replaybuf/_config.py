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
