"""``TensorDictReplayBuffer`` and ``TensorDictPrioritizedReplayBuffer``: buffers of
TensorDicts whose samples carry their own metadata (``"index"``,
``"priority_weight"``, slice flags) and whose priorities come from a TensorDict
entry."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import expand_as_right

from ._layout import to_array
from .replay_buffers import CPU, ReplayBuffer, component, default_storage
from .samplers import PrioritizedSampler
from .storages import Storage
from .writers import TensorDictRoundRobinWriter

__all__ = ["TensorDictReplayBuffer", "TensorDictPrioritizedReplayBuffer"]


def _no_rows(ndim: int) -> torch.Tensor:
    return torch.zeros((0, ndim), dtype=torch.long)


def _expand_right(value: torch.Tensor, batch: Tuple[int, ...]) -> torch.Tensor:
    """``value`` as TorchRL sets a sample's metadata: expanded on the right to the
    batch when it has fewer dims (rows that hold a sub-batch, ``[T]``)."""
    if value.ndim >= len(batch):
        return value
    return value.reshape(value.shape + (1,) * (len(batch) - value.ndim)).expand(batch)


def _unexpand(entry: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``entry`` (a view of ``like`` expanded by :func:`_expand_right`) at ``like``'s
    shape."""
    if entry.ndim == like.ndim:
        return entry
    return entry[(slice(None),) * like.ndim + (0,) * (entry.ndim - like.ndim)]


def _reduce(priority: torch.Tensor, reduction: str, dim: int) -> torch.Tensor:
    """TorchRL's reduction of several priorities to one."""
    if reduction == "max":
        return priority.max(dim=dim)[0]
    if reduction == "min":
        return priority.min(dim=dim)[0]
    if reduction == "mean":
        return priority.mean(dim=dim)
    if reduction == "median":
        return priority.median(dim=dim)[0]
    if reduction == "sum":
        return priority.sum(dim=dim)
    raise NotImplementedError(f"Unknown reduction method {reduction}")


class TensorDictReplayBuffer(ReplayBuffer):
    """A replay buffer of TensorDicts (TorchRL's ``TensorDictReplayBuffer``).

    Samples carry ``"index"`` (and ``"priority_weight"`` with a prioritized sampler,
    the slice flags with a slice sampler); :meth:`update_tensordict_priority` reads
    new priorities from ``priority_key`` (default ``"td_error"``), and :meth:`extend`
    and :meth:`add` set the priorities of written rows from it when the data has it.
    Takes :class:`~replaybuf.torchrl.ReplayBuffer`'s other arguments.
    """

    _skip_keys = ("index",)
    _default_writer = TensorDictRoundRobinWriter

    def __init__(self, *, priority_key: Any = "td_error", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.priority_key = priority_key

    def _prioritize_written(self, written: np.ndarray, data: TensorDictBase) -> None:
        priority = data.get(self.priority_key, None)
        if priority is None:
            return
        positions = written.reshape(-1)
        priority = to_array(priority).reshape(positions.size, -1)
        kept = positions != np.uint64(2**64 - 1)
        if not kept.all():
            positions, priority = positions[kept], priority[kept]
        self._native.update_priority(positions, priority)

    def extend(
        self, tensordicts: TensorDictBase, *, update_priority: Optional[bool] = None
    ) -> torch.Tensor:
        """Appends a TensorDict batch and returns where each row was written."""
        if not isinstance(tensordicts, TensorDictBase):
            raise ValueError(
                f"{type(self).__name__} only accepts TensorDictBase subclasses. "
                "Please use a regular `ReplayBuffer` instead."
            )
        if self._transform_modules:
            tensordicts = self._transform.inv(tensordicts)
            if tensordicts is None:
                return _no_rows(self._storage.ndim)
        written = self._write(tensordicts)
        if self._sampler.prioritized and update_priority is not False:
            self._prioritize_written(written, tensordicts)
        return self._index_of_written(written)

    def add(self, data: TensorDictBase) -> Optional[int]:
        """Adds one TensorDict (batch size ``[]``) and returns its index (None if the
        writer passed it over)."""
        if self._transform_modules:
            data = self._transform.inv(data)
        if data is None:
            return _no_rows(self._storage.ndim)
        index = self._add(data)
        if self._sampler.prioritized and index is not None:
            self._prioritize_written(np.array([index], np.uint64), data)
        return index

    def sample(
        self,
        batch_size: Optional[int] = None,
        return_info: bool = False,
        include_info: Optional[bool] = None,
    ) -> Any:
        """Draws a TensorDict of ``batch_size`` rows (else the buffer's) with its
        ``"index"`` and the sampler's entries set; with ``return_info``, returns
        ``(batch, info)``."""
        data, info = self._sample(self._resolve_batch_size(batch_size))
        if not return_info:
            return data
        if self._plan.envs or self._plan.slices:
            # Stacked in the TensorDict, but in `info` the tuple of per-dimension
            # indices TorchRL's samplers give.
            info = {**info, "index": tuple(info["index"].unbind(-1))}
        return data, info

    def _sample(self, n: int, retry: bool = True) -> Tuple[Any, Dict[Any, Any]]:
        out = self._draw(n, retry)
        info = self._plan.info(out, stacked=True)
        self._last = (info["index"], out["index"], out["generation"])
        rows = (len(out["index"]),)
        if self._collate_fn is None and not self._transform_modules:
            extra = info
            root_extra = getattr(self._layout, "_root_extra", ())
            if root_extra:
                # Rows of several steps: the metadata set over them, as TorchRL sets it.
                batch = rows + root_extra
                extra = {key: _expand_right(value, batch) for key, value in info.items()}
            data = self._layout.rows(out, rows, CPU, extra, self._plan.nested_info)
        else:
            # TorchRL transforms the rows, then sets the metadata on what comes out.
            data = self._collate_and_transform(self._layout.rows(out, rows, CPU))
            for key, value in info.items():
                data.set(key, expand_as_right(value, data) if value.ndim < data.ndim else value)
        if self._pin_memory or self._device is not None:
            data = self._deliver(data)
            # The delivered entries, less the dims they were expanded by.
            info = {key: _unexpand(data.get(key), value) for key, value in info.items()}
        return data, info

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Sets the priorities of a sample's rows from its ``priority_key`` entry, as
        TorchRL does: the priority is reduced by the sampler's ``reduction`` to one
        value per entry of the data's first dimension (of its first two on an
        ``ndim=2`` storage; per slice of a sample reshaped to ``[num_slices,
        slice_len]``), and the index is cut to match (``index[..., 0]``: each slice's
        first row)."""
        if not self._sampler.prioritized:
            return
        priority = data.get(self.priority_key, None)
        if priority is None:
            return
        if data.ndim:
            priority = self._priority_vector(data, priority)
        elif priority.numel() > 1:
            priority = _reduce(priority.reshape(-1), self._sampler.reduction, 0)
        else:
            priority = priority.reshape(())
        index = data.get("index")
        if self._storage.ndim > 1 and index.ndim == 2:
            index = index.unbind(-1)
        else:
            while index.shape != priority.shape:
                index = index[..., 0]
        self.update_priority(index, priority)

    def _priority_vector(self, data: TensorDictBase, priority: torch.Tensor) -> torch.Tensor:
        """TorchRL's ``_get_priority_vector``: one priority per entry of the data's
        first ``storage.ndim`` dims, reduced over the rest."""
        ndim = self._storage.ndim
        if ndim > 1 and priority.ndim >= ndim:
            # Not reduced across the storage's dims.
            priority = priority.flatten(0, ndim - 1)
        priority = _reduce(priority.reshape(priority.shape[0], -1), self._sampler.reduction, 1)
        if ndim > 1:
            priority = priority.unflatten(0, data.shape[:ndim])
        return priority


class TensorDictPrioritizedReplayBuffer(TensorDictReplayBuffer):
    """A :class:`TensorDictReplayBuffer` with a
    :class:`~replaybuf.torchrl.PrioritizedSampler` of ``alpha``, ``beta``, ``eps`` and
    ``reduction`` (TorchRL's ``TensorDictPrioritizedReplayBuffer``)."""

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        priority_key: Any = "td_error",
        eps: float = 1e-8,
        storage: Any = None,
        sampler_device: Any = None,
        sync: bool = True,
        collate_fn: Optional[Callable] = None,
        pin_memory: bool = False,
        prefetch: Optional[int] = None,
        transform: Any = None,
        reduction: str = "max",
        batch_size: Optional[int] = None,
        dim_extend: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        shared: bool = False,
        compilable: bool = False,
    ) -> None:
        storage = component(storage, default_storage, Storage, "storage")
        super().__init__(
            priority_key=priority_key,
            storage=storage,
            sampler=PrioritizedSampler(storage.max_size, alpha, beta, eps, reduction=reduction),
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            dim_extend=dim_extend,
            generator=generator,
            shared=shared,
            compilable=compilable,
        )
