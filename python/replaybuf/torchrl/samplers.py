"""Samplers: TorchRL's classes and arguments, each describing one of replaybuf's
samplers (``replaybuf.Uniform``, ``WithoutReplacement``, ``Prioritized``, ``Slice``).

A sampler is configuration until its buffer makes the engine buffer (on the first
write); from then on the draws are the engine's. Settable knobs that TorchRL users
anneal (a prioritized sampler's ``alpha`` and ``beta``) reach the engine at once.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Collection, Optional, Tuple, Union

import torch

from .._config import Prioritized, Slice, Uniform, WithoutReplacement

__all__ = [
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "PrioritizedSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "PrioritizedSliceSampler",
]

NestedKey = Union[str, Tuple[str, ...]]

# TorchRL's `span=True`: a slice may hang off its trajectory by all but one step.
_SPAN_ANY = sys.maxsize


class Sampler:
    """Base of the samplers. ``ran_out`` is set by the sample that takes an epoch's
    last batch (samplers without replacement), as TorchRL's is: ``while not
    rb.sampler.ran_out: rb.sample()`` walks one epoch, and the next sample starts the
    next."""

    prioritized = False
    slices = False
    without_replacement = False

    def __init__(self) -> None:
        self.ran_out = False
        # The engine buffer, once made.
        self._native: Any = None
        # The buffer the sampler is in (a weak reference), once it is.
        self._rb: Any = None

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        """The engine's sampler for a buffer whose data has these keys."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RandomSampler(Sampler):
    """Every stored row equally likely, with replacement."""

    def __new__(cls, *args: Any, replacement: bool = True, **kwargs: Any) -> Any:
        if cls is RandomSampler and not replacement:
            return SamplerWithoutReplacement(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, *, replacement: bool = True) -> None:
        Sampler.__init__(self)

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        return Uniform()


class SamplerWithoutReplacement(Sampler):
    """Epochs: every row stored when an epoch begins is drawn once before any is drawn
    twice. ``drop_last``: a batch is never short (the rows left over start the next
    epoch's count afresh); ``shuffle=False`` walks the rows in storage order."""

    without_replacement = True

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        Sampler.__init__(self)
        self.drop_last = drop_last
        self.shuffle = shuffle

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        return WithoutReplacement(drop_last=self.drop_last, shuffle=self.shuffle)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(drop_last={self.drop_last}, shuffle={self.shuffle})"


class PrioritizedSampler(Sampler):
    """Rows drawn in proportion to ``(priority + eps) ** alpha``, with importance
    weights ``(p_i / p_min) ** -beta`` (TorchRL's formula), returned as
    ``"priority_weight"``. New rows get the largest priority seen so far
    (within the buffer's current rows with ``max_priority_within_buffer``).

    ``max_capacity`` and ``dtype`` are accepted for TorchRL's signature: the priority
    tree always covers the whole storage, in float64.
    """

    prioritized = True

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
        device: Any = None,
    ) -> None:
        Sampler.__init__(self)
        if alpha < 0:
            raise ValueError(f"alpha must be greater or equal than 0, got alpha={alpha}")
        if beta < 0:
            raise ValueError(f"beta must be greater or equal to 0, got beta={beta}")
        self._max_capacity = max_capacity
        self._alpha = alpha
        self._beta = beta
        self._eps = eps
        self.reduction = reduction
        self.dtype = dtype
        self._max_priority_within_buffer = max_priority_within_buffer

    @property
    def max_size(self) -> int:
        return self._max_capacity

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"alpha must be greater or equal than 0, got alpha={value}")
        if self._native is not None:
            self._native.alpha = value
        self._alpha = value

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if self._native is not None:
            self._native.beta = value
        self._beta = value

    def update_priority(self, index: Any, priority: Any, *, storage: Any = None) -> None:
        """Sets the priorities of the rows at ``index`` (TorchRL's
        ``sampler.update_priority``): the same as the buffer's ``update_priority``."""
        rb = self._rb() if self._rb is not None else None
        if rb is None:
            raise RuntimeError("this sampler belongs to no replay buffer")
        rb.update_priority(index, priority)

    def _prioritized(self) -> Prioritized:
        return Prioritized(
            alpha=self._alpha,
            beta=self._beta,
            eps=self._eps,
            reduction=self.reduction,
            max_priority_within_buffer=self._max_priority_within_buffer,
        )

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        return self._prioritized()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(alpha={self._alpha}, beta={self._beta}, "
            f"eps={self._eps}, reduction={self.reduction})"
        )


def _unravel(key: Optional[NestedKey]) -> Optional[NestedKey]:
    if isinstance(key, tuple) and len(key) == 1:
        return key[0]
    return key


def _replace_last(key: NestedKey, name: str) -> NestedKey:
    return name if isinstance(key, str) else key[:-1] + (name,)


def _span_steps(side: Union[bool, int]) -> int:
    if side is True:
        return _SPAN_ANY
    return int(side)


class SliceSampler(Sampler):
    """Slices of consecutive steps of one trajectory: ``num_slices`` per batch, or
    slices of ``slice_len`` steps; a batch of ``n`` rows is returned flat, slice after
    slice.

    Trajectories are told apart by ``traj_key`` (integer ids) or ended by ``end_key``
    (default ``("next", "done")``); with neither, ``("collector", "traj_ids")`` or
    ``"episode"`` is used when the data has it, as TorchRL does. The engine keeps the
    boundaries as rows are written, so ``cache_values`` and ``use_gpu`` have nothing to
    speed up. ``truncated_key`` names where the slice ends are reported in samples
    (``done`` and ``terminated`` beside it), ``init_key`` the stored flag that gets
    each slice's first step set. ``strict_length=False`` lets a short trajectory give a
    short slice; ``span`` lets slices hang off a trajectory's ends.
    """

    slices = True

    def __init__(
        self,
        *,
        num_slices: Optional[int] = None,
        slice_len: Optional[int] = None,
        end_key: Optional[NestedKey] = None,
        end_keys: Any = None,
        traj_key: Optional[NestedKey] = None,
        step_key: Optional[NestedKey] = "step_count",
        fragmented: bool = False,
        ends: Optional[torch.Tensor] = None,
        trajectories: Optional[torch.Tensor] = None,
        cache_values: bool = False,
        truncated_key: Optional[NestedKey] = ("next", "truncated"),
        init_key: Optional[NestedKey] = "is_init",
        strict_length: bool = True,
        pad_output: bool = False,
        compile: Union[bool, dict] = False,
        span: Union[bool, int, Tuple[Union[bool, int], Union[bool, int]]] = False,
        use_gpu: Union[torch.device, bool] = False,
    ) -> None:
        Sampler.__init__(self)
        if not ((num_slices is None) ^ (slice_len is None)):
            raise TypeError(
                "Either num_slices or slice_len must be not None, and not both. "
                f"Got num_slices={num_slices} and slice_len={slice_len}."
            )
        if end_key is not None and end_keys is not None:
            raise RuntimeError("`end_key` and `end_keys` are exclusive arguments.")
        for name, value in (
            ("end_keys", end_keys),
            ("ends", ends),
            ("trajectories", trajectories),
        ):
            if value is not None:
                raise NotImplementedError(
                    f"replaybuf's slice samplers do not take `{name}`: give traj_key "
                    "(integer trajectory ids) or end_key (one end flag) instead"
                )
        if fragmented:
            raise NotImplementedError(
                "replaybuf's slice samplers do not take fragmented=True: trajectories "
                "are runs of consecutive rows of one lane"
            )
        if pad_output:
            raise NotImplementedError("replaybuf's slice samplers do not pad their output")
        if isinstance(span, (bool, int)):
            span = (span, span)
        self.num_slices = num_slices
        self.slice_len = slice_len
        self.end_key = end_key
        self.traj_key = traj_key
        self.truncated_key = truncated_key
        self.init_key = init_key
        self.strict_length = strict_length
        self.cache_values = cache_values
        self.span = span
        # Rows of a sample may be padding (short slices) that must be dropped.
        self._may_pad = not strict_length or bool(span[0]) or bool(span[1])

    def _trajectories(self, keys: Collection[NestedKey]) -> dict:
        """How the engine tells this buffer's trajectories apart."""
        keys = {_unravel(k) for k in keys}
        traj_key = _unravel(self.traj_key)
        if traj_key is None and self.end_key is None:
            for candidate in (("collector", "traj_ids"), "episode"):
                if candidate in keys:
                    traj_key = candidate
                    break
        if traj_key is not None and traj_key in keys:
            return {"traj_key": traj_key}
        return {"end_key": _unravel(self.end_key) or ("next", "done")}

    def _slice(self, keys: Collection[NestedKey], **extra: Any) -> Slice:
        span = None
        if any(self.span):
            span = (_span_steps(self.span[0]), _span_steps(self.span[1]))
        return Slice(
            num_slices=self.num_slices,
            slice_len=self.slice_len,
            strict_length=self.strict_length,
            span=span,
            **self._trajectories(keys),
            **extra,
        )

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        return self._slice(keys)

    def _info_keys(self) -> Optional[Tuple[NestedKey, NestedKey, NestedKey]]:
        """The truncated, done and terminated keys of a sample's slice flags."""
        if self.truncated_key is None:
            return None
        key = _unravel(self.truncated_key)
        return key, _replace_last(key, "done"), _replace_last(key, "terminated")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_slices={self.num_slices}, slice_len={self.slice_len}, "
            f"end_key={self.end_key}, traj_key={self.traj_key}, "
            f"truncated_key={self.truncated_key}, strict_length={self.strict_length})"
        )


class SliceSamplerWithoutReplacement(SliceSampler, SamplerWithoutReplacement):
    """Slices without replacement: each trajectory is cut into consecutive windows of
    the slice length, and every window is drawn once per epoch (so every row once), in
    a fresh random order unless ``shuffle=False``."""

    def __init__(
        self,
        *,
        num_slices: Optional[int] = None,
        slice_len: Optional[int] = None,
        drop_last: bool = False,
        end_key: Optional[NestedKey] = None,
        end_keys: Any = None,
        traj_key: Optional[NestedKey] = None,
        ends: Optional[torch.Tensor] = None,
        trajectories: Optional[torch.Tensor] = None,
        truncated_key: Optional[NestedKey] = ("next", "truncated"),
        init_key: Optional[NestedKey] = "is_init",
        strict_length: bool = True,
        shuffle: bool = True,
        compile: Union[bool, dict] = False,
        use_gpu: Union[bool, torch.device] = False,
    ) -> None:
        SliceSampler.__init__(
            self,
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            end_keys=end_keys,
            traj_key=traj_key,
            ends=ends,
            trajectories=trajectories,
            cache_values=True,
            truncated_key=truncated_key,
            init_key=init_key,
            strict_length=strict_length,
        )
        self.drop_last = drop_last
        self.shuffle = shuffle

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        epochs = WithoutReplacement(drop_last=self.drop_last, shuffle=self.shuffle)
        return self._slice(keys, without_replacement=epochs)


class PrioritizedSliceSampler(SliceSampler, PrioritizedSampler):
    """Slices whose start is drawn in proportion to its row's priority, with TorchRL's
    importance weights repeated over the slice's rows."""

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        reduction: str = "max",
        *,
        num_slices: Optional[int] = None,
        slice_len: Optional[int] = None,
        end_key: Optional[NestedKey] = None,
        end_keys: Any = None,
        traj_key: Optional[NestedKey] = None,
        ends: Optional[torch.Tensor] = None,
        trajectories: Optional[torch.Tensor] = None,
        cache_values: bool = False,
        truncated_key: Optional[NestedKey] = ("next", "truncated"),
        init_key: Optional[NestedKey] = "is_init",
        strict_length: bool = True,
        compile: Union[bool, dict] = False,
        span: Union[bool, int, Tuple[Union[bool, int], Union[bool, int]]] = False,
        max_priority_within_buffer: bool = False,
    ) -> None:
        SliceSampler.__init__(
            self,
            num_slices=num_slices,
            slice_len=slice_len,
            end_key=end_key,
            end_keys=end_keys,
            traj_key=traj_key,
            ends=ends,
            trajectories=trajectories,
            cache_values=cache_values,
            truncated_key=truncated_key,
            init_key=init_key,
            strict_length=strict_length,
            span=span,
        )
        if self.span[0]:
            # As TorchRL's: a slice starts at the row drawn, so it cannot hang off its
            # trajectory's start.
            warnings.warn(
                f"Left spanning is disabled for {type(self).__name__} and will be "
                "automatically turned off.",
                stacklevel=2,
            )
            self.span = (0, self.span[1])
            self._may_pad = not strict_length or bool(self.span[1])
        PrioritizedSampler.__init__(
            self,
            max_capacity,
            alpha,
            beta,
            eps,
            dtype,
            reduction,
            max_priority_within_buffer,
        )

    def _describe_for(self, keys: Collection[NestedKey]) -> Any:
        return self._slice(keys, prioritized=self._prioritized(), priority_over="start")

    __repr__ = SliceSampler.__repr__
