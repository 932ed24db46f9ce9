"""The engine buffer behind a face buffer, made lazily.

A face buffer is configuration until data arrives: the first write (or a checkpoint's
layout, on ``loads``) fixes the fields, and the engine buffer is made from them and
from the storage (capacity, ``ndim``, files), the sampler and the writer. This module
holds that step, shared by every buffer class; the buffer's constructor sets the
attributes it reads (``_storage``, ``_sampler``, ``_writer``, ``_dim_extend``,
``_generator``, ``_skip_keys``, ``_build_lock``) and the ones it sets (``_native``,
``_layout``, ``_plan``, ``_envs``, ``_device``).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import weakref
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
from tensordict import is_tensor_collection
from torch.utils import _pytree

from .._config import Frames
from .._native import ReplayBuffer as NativeReplayBuffer
from ._layout import Layout, TensorDictLayout, TreeLayout, native_key
from ._sample_info import SamplePlan
from .writers import ImmutableDatasetWriter, RoundRobinWriter


def _layout_of(data: Any, batch_dims: int, skip: Tuple[Any, ...]) -> Layout:
    if is_tensor_collection(data):
        return TensorDictLayout.of(data, batch_dims, skip=skip)
    return TreeLayout.of(data, batch_dims)


def _frames_for(frames: Frames, layout: Layout) -> Frames:
    """A storage's frames in the engine's field names. A TorchRL rollout says that a
    step ends its episode in ``("next", "done")`` (its root ``"done"`` is the flag of
    the step's own observation, false after every reset), so those are the ends unless
    the frames name others."""
    names = {f.native for f in layout.fields}

    def native(key: Any) -> Any:
        return None if key is None else native_key(key)

    done, truncated = frames.done, frames.truncated
    if done is None and ("next", "done") in names:
        done = ("next", "done")
        if truncated is None and ("next", "truncated") in names:
            truncated = ("next", "truncated")
    return dataclasses.replace(
        frames,
        stack={native(k): depth for k, depth in (frames.stack or {}).items()},
        next_of={native(n): native(of) for n, of in (frames.next_of or {}).items()},
        done=native(done),
        truncated=native(truncated),
    )


class LazyEngine:
    """Makes, fills and renews a buffer's engine buffer."""

    def _seed(self) -> int:
        if self._generator is not None:
            return self._generator.initial_seed() % 2**64
        return int(torch.randint(0, 2**62, (), dtype=torch.int64))

    def _envs_of(self, data: Any) -> int:
        """Environments of an ndim-2 batch (``[envs, time]`` when extending along
        dimension 1, else ``[time, envs]``)."""
        if self._storage.ndim == 1:
            return 1
        if is_tensor_collection(data):
            shape = tuple(data.batch_size)
        else:
            shape = tuple(torch.as_tensor(_pytree.tree_leaves(data)[0]).shape)
        return shape[0] if self._dim_extend == 1 else shape[1]

    def _ensure_built(self, data: Any, batch_dims: int) -> None:
        """Makes the engine buffer from the first data written (once)."""
        with self._build_lock:
            if self._native is None:
                layout = _layout_of(data, batch_dims, self._skip_keys)
                envs = self._envs_of(data)
                native = self._make_native(layout, envs)
                self._install(native, layout, envs, self._storage._output_device(data))

    def _native_to_write(self, data: Any, batch_dims: int) -> NativeReplayBuffer:
        """The engine buffer that takes ``data`` (made from it if there is none yet;
        refused for a read-only dataset)."""
        if isinstance(self._writer, ImmutableDatasetWriter):
            raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
        native = self._native
        if native is None:
            self._ensure_built(data, batch_dims)
            native = self._native
        return native

    def _ensure_native_for(self, layout: Layout, envs: int) -> bool:
        """Makes the engine buffer for a known layout (a checkpoint's), if none yet;
        returns whether it made one, for :meth:`_unmake_native` to undo should the
        checkpoint be refused."""
        with self._build_lock:
            if self._native is not None:
                return False
            native = self._make_native(layout, envs)
            self._install(native, layout, envs, self._storage._output_device(None))
            return True

    def _unmake_native(self) -> None:
        """Back to no engine buffer and no fields, as before the first write: a
        checkpoint that fixed the fields and was then refused must not leave them
        fixed for the data written next."""
        with self._build_lock:
            # Dropping the only references closes the engine buffer (and its files).
            self._native = self._sampler._native = None
            self._storage._release()
            self._layout, self._plan, self._envs, self._device = None, None, 1, None

    def _make_native(
        self, layout: Layout, envs: int, write_policy: Any = None, files: bool = True
    ) -> NativeReplayBuffer:
        storage = self._storage
        kwargs: Dict[str, Any] = {
            "spec": layout.spec(),
            "sampler": self._sampler._describe_for([f.key for f in layout.fields]),
            "write_policy": write_policy or self._writer._describe(),
            "seed": self._seed(),
        }
        if storage.frames is not None:
            kwargs["frames"] = _frames_for(storage.frames, layout)
        capacity = storage.max_size
        if storage.ndim == 2:
            capacity = -(capacity // -envs) * envs
            kwargs.update(ndim=2, envs=envs, dim_extend=self._dim_extend)
        if files:
            kwargs.update(storage._native_kwargs())
        return NativeReplayBuffer(capacity, **kwargs)

    def _install(
        self,
        native: NativeReplayBuffer,
        layout: Layout,
        envs: int,
        device: Optional[torch.device],
    ) -> None:
        """Puts ``native`` in service; ``_native`` is set last, so a thread that
        finds it set finds everything else set too."""
        self._layout, self._envs, self._device = layout, envs, device
        # An ndim-2 storage holds whole steps of every env: its size rounds up, as
        # TorchRL's does (a "full" check against `max_size` read the size asked for).
        self._storage.max_size = native.capacity
        remember = getattr(self._storage, "_remember", None)
        if remember is not None:
            remember(layout.to_json(), envs)
        self._plan = SamplePlan(self._sampler, layout, envs if self._storage.ndim == 2 else 0)
        # Sampled positions as torch indexes with, converted by nobody.
        native.index_dtype = np.int64
        self._native = native
        self._sampler._native = native

    def _fill(self, data: Any) -> None:
        """Writes a :class:`TensorStorage`'s initial rows (its dataset)."""
        if not isinstance(self._writer, ImmutableDatasetWriter):
            self._extend(data)
            return
        # An engine dataset is opened from a checkpoint: the rows go into a
        # round-robin buffer, which is saved and opened read-only (its files stay
        # mapped while this buffer lives).
        with self._build_lock:
            layout = _layout_of(data, self._storage.ndim, self._skip_keys)
            envs = self._envs_of(data)
            round_robin = RoundRobinWriter()._describe()
            staging = self._make_native(layout, envs, write_policy=round_robin, files=False)
            staging.extend(layout.arrays(data))
            directory = tempfile.mkdtemp(prefix="replaybuf-dataset-")
            staging.dumps(directory)
            weakref.finalize(self, shutil.rmtree, directory, True)
            dataset = NativeReplayBuffer.open_dataset(directory)
            self._install(dataset, layout, envs, self._storage._output_device(data))

    def _renew_native(self) -> None:
        """Replaces the engine buffer by an empty one of the same fields: TorchRL's
        ``empty`` also puts the write cursor back at 0, which the engine's ``clear``
        does not."""
        layout, envs, device = self._layout, self._envs, self._device
        # Dropping the only references closes the engine buffer (and its files).
        self._native = self._sampler._native = None
        self._storage._release()
        forget = getattr(self._storage, "_forget_rows", None)
        if forget is not None:
            forget()
        self._install(self._make_native(layout, envs), layout, envs, device)
