"""A sample's metadata, TorchRL's way, from what the engine returns beside the rows.

The engine's sample holds ``index`` and ``generation`` (uint64 per row), ``weight``
(float32, prioritized samplers) and ``marks`` (uint8 flags per row, slice samplers:
valid, trajectory start, trajectory end, truncated). TorchRL's samples hold instead:

- ``index``: int64, ``[n]``; ``[n, 1]`` for slice samplers and ``[n, 2]`` (step, env)
  on an ``ndim=2`` storage when stacked into a TensorDict, or the tuple of
  per-dimension indices in a plain buffer's ``info``;
- ``priority_weight``: the importance weights;
- for slice samplers, ``truncated`` set at every slice's last step, ``done`` the
  stored flag or'ed with it, ``terminated`` as stored (``[n, 1]`` bool, under the
  sampler's ``truncated_key``), and a stored ``is_init`` set at every slice's first
  step.

A :class:`SamplePlan` works out once per buffer which of these a sample needs and
then turns each engine sample into them.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
import torch

from .._native import MARK_END, MARK_TRUNCATED, MARK_VALID
from ._layout import Field

# A slice's last row ends its trajectory or is cut off: either flag marks it.
_SLICE_END_MARKS = MARK_END | MARK_TRUNCATED

Arrays = Dict[Any, np.ndarray]


def _column(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` (one value per row) shaped to broadcast against ``like``."""
    return t.reshape((t.shape[0],) + (1,) * (like.dim() - 1))


class SamplePlan:
    """What decoding one buffer's samples involves."""

    def __init__(self, sampler: Any, layout: Any, envs: int) -> None:
        self.prioritized = sampler.prioritized
        self.slices = sampler.slices
        self.init_key = getattr(sampler, "init_key", None)
        # Short slices come back padded with rows marked invalid, to be dropped.
        self.may_pad = self.slices and sampler._may_pad
        # Environments of an ndim-2 storage (0: ndim 1).
        self.envs = envs
        self.flag_keys = sampler._info_keys() if self.slices else None
        # Whether some entry of `info` has a nested key.
        self.nested_info = self.slices and any(
            isinstance(k, tuple) for k in (*(self.flag_keys or ()), self.init_key)
        )
        self.done: Optional[Field] = None
        self.terminated: Optional[Field] = None
        self.init: Optional[Field] = None
        if self.flag_keys is not None:
            self.done = layout.field_of(self.flag_keys[1])
            self.terminated = layout.field_of(self.flag_keys[2])
        if self.slices and self.init_key is not None:
            # Marked at every slice's start whether or not the other flags are kept
            # (TorchRL's samplers with `truncated_key=None` mark it too).
            self.init = layout.field_of(self.init_key)

    def drop_padding(self, out: Arrays) -> Arrays:
        """The sample without the padding rows of short slices."""
        if not self.may_pad:
            return out
        valid = (out["marks"] & MARK_VALID) != 0
        if valid.all():
            return out
        return {k: v[valid] for k, v in out.items()}

    def info(self, out: Arrays, stacked: bool) -> Dict[Any, Any]:
        """The sample's ``index``, ``priority_weight`` and slice flags; ``stacked``:
        the index as one tensor (TensorDict buffers), else as TorchRL's samplers give
        it (a tuple of per-dimension indices when there are several)."""
        raw = out["index"]
        if self.envs:
            steps, envs = np.divmod(raw, self.envs)
            steps, envs = torch.from_numpy(steps), torch.from_numpy(envs)
            index: Any = torch.stack([steps, envs], -1) if stacked else (steps, envs)
        else:
            index = torch.from_numpy(raw)
            if self.slices:
                index = index.unsqueeze(-1) if stacked else (index,)
        info: Dict[Any, Any] = {"index": index}
        if self.prioritized:
            info["priority_weight"] = torch.from_numpy(out["weight"])
        if self.slices:
            ends = (out["marks"] & _SLICE_END_MARKS) != 0
            if self.flag_keys is not None:
                self._slice_flags(out, ends, info)
            if self.init is not None:
                self._init_flags(out, ends, info)
        return info

    def _slice_flags(self, out: Arrays, ends: np.ndarray, info: Dict[Any, Any]) -> None:
        """The truncated, done and terminated keys; ``ends``: each row ends its slice."""
        truncated_key, done_key, terminated_key = self.flag_keys
        truncated = torch.from_numpy(ends).unsqueeze(-1)
        if self.done is not None:
            stored = self.done.tensor(out[self.done.native])
            done = stored | _column(truncated, stored)
        else:
            done = truncated.clone()
        if self.terminated is not None:
            terminated = self.terminated.tensor(out[self.terminated.native])
        else:
            terminated = torch.zeros_like(truncated)
        info[truncated_key] = truncated
        info[done_key] = done
        info[terminated_key] = terminated

    def _init_flags(self, out: Arrays, ends: np.ndarray, info: Dict[Any, Any]) -> None:
        """The init key: its stored value, and set at every slice's first step."""
        starts = np.empty(len(ends), dtype=bool)
        if len(ends):
            starts[0] = True
            starts[1:] = ends[:-1]
        stored = self.init.tensor(out[self.init.native])
        info[self.init_key] = stored | _column(torch.from_numpy(starts), stored)
