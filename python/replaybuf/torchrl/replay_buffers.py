"""The buffers: TorchRL's ``ReplayBuffer`` family over one of replaybuf's engine
buffers.

A buffer is configuration (storage, sampler, writer, transforms) until the first data
is written; that data fixes the fields (see :mod:`._layout`) and the engine buffer is
made from them. From then on every row moves in one engine call: ``extend`` hands the
tensors' memory to the engine, which copies it into the storage with the GIL released,
and ``sample`` gets fresh arrays that become the returned tensors without a copy.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np
import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from tensordict.utils import expand_as_right
from torch.utils import _pytree
from torchrl.envs.transforms.transforms import (
    Compose,
    Transform,
    _CallableTransform,
    _InvertTransform,
)

from .._native import MARK_END, MARK_TRUNCATED, MARK_VALID, EpochEnd
from .._native import ReplayBuffer as NativeReplayBuffer
from ._layout import Layout, TensorDictLayout, TreeLayout, layout_from_json, to_array
from .samplers import PrioritizedSampler, RandomSampler, Sampler
from .storages import LazyTensorStorage, Storage, TensorStorage
from .writers import (
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictRoundRobinWriter,
    Writer,
)

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
]

# Files a checkpoint directory holds beside the engine's own.
FACE_FILE = "torchrl.json"
TRANSFORM_FILE = "transform.t"
SAVE_HOOK_DIR = "storage"

_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
_SLICE_END_MARKS = MARK_END | MARK_TRUNCATED
_CPU = torch.device("cpu")


def _component(value: Any, default: Callable[[], Any], base: type, what: str) -> Any:
    """A storage, sampler or writer given as an instance, a constructor or None."""
    if value is None:
        return default()
    if not isinstance(value, base) and callable(value):
        value = value()
    if not isinstance(value, base):
        raise TypeError(
            f"{what} must be one of replaybuf.torchrl's {base.__name__} classes (import "
            f"it from replaybuf.torchrl, not torchrl.data); got {type(value).__name__}"
        )
    return value


def _as_compose(transform: Any) -> Compose:
    if transform is None:
        transform = Compose()
    elif not isinstance(transform, Compose):
        if not isinstance(transform, Transform) and callable(transform):
            transform = _CallableTransform(transform)
        elif not isinstance(transform, Transform):
            raise RuntimeError("transform must be either a Transform instance or a callable.")
        transform = Compose(transform)
    transform.eval()
    return transform


def _stack(items: list) -> Any:
    """A list of values to add one at a time, as one batch."""
    if items and is_tensor_collection(items[0]):
        return torch.stack(items)
    return _pytree.tree_map(lambda *xs: torch.stack([torch.as_tensor(x) for x in xs]), *items)


class _SamplePlan:
    """What decoding a sample of this buffer involves, worked out once."""

    def __init__(self, rb: ReplayBuffer) -> None:
        sampler, layout = rb._sampler, rb._layout
        self.prioritized = sampler.prioritized
        self.slices = sampler.slices
        self.may_pad = self.slices and sampler._may_pad
        self.envs = rb._envs if rb._storage.ndim == 2 else 0
        self.info_keys = sampler._info_keys() if self.slices else None
        self.done_field = self.terminated_field = self.init_field = None
        if self.info_keys is not None:
            _, done, terminated = self.info_keys
            self.done_field = layout.field_of(done)
            self.terminated_field = layout.field_of(terminated)
            if sampler.init_key is not None:
                self.init_field = layout.field_of(sampler.init_key)


class ReplayBuffer:
    """A replay buffer with TorchRL's interface (``torchrl.data.ReplayBuffer``).

    Keyword Args:
        storage: a :mod:`~replaybuf.torchrl.storages` storage (or its constructor);
            default ``LazyTensorStorage(1_000)``.
        sampler: a :mod:`~replaybuf.torchrl.samplers` sampler; default
            :class:`RandomSampler`.
        writer: a :mod:`~replaybuf.torchrl.writers` writer; default
            :class:`RoundRobinWriter`.
        collate_fn: applied to every sampled batch before the transforms.
        pin_memory: pin sampled batches (for a fast copy to a GPU).
        prefetch: accepted and ignored: a sample is one GIL-free engine call.
        transform, transform_factory: applied to sampled batches (and, inverted, to
            written data); see :meth:`append_transform`.
        batch_size: rows :meth:`sample` draws when given none.
        dim_extend: the data dimension :meth:`extend` appends along (default
            ``storage.ndim - 1``: time of ``[envs, time]`` batches on ``ndim=2``).
        generator: a ``torch.Generator`` whose seed seeds the buffer's draws (without
            one, the seed is drawn from torch's global generator when the buffer is
            made, so ``torch.manual_seed`` makes runs repeatable).

    Data is a tensor, a pytree of tensors (dicts, tuples) or a TensorDict; a list
    passed to :meth:`extend` is a list of elements to add one at a time.
    """

    _is_tensordict = False
    # Keys of written TensorDicts that are metadata, not fields.
    _skip_keys: Tuple[Any, ...] = ()

    def __init__(
        self,
        *,
        storage: Any = None,
        sampler: Any = None,
        writer: Any = None,
        collate_fn: Optional[Callable] = None,
        pin_memory: bool = False,
        prefetch: Optional[int] = None,
        transform: Any = None,
        transform_factory: Optional[Callable] = None,
        batch_size: Optional[int] = None,
        dim_extend: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        shared: bool = False,
        compilable: Optional[bool] = None,
        delayed_init: Optional[bool] = None,
        checkpointer: Any = None,
    ) -> None:
        if shared:
            raise NotImplementedError(
                "replaybuf.torchrl buffers are not shared across processes; use "
                "replaybuf.ReplayBuffer(shared=name) for a buffer in shared memory"
            )
        if checkpointer is not None:
            raise NotImplementedError(
                "replaybuf.torchrl buffers save with their own checkpoint format; "
                "checkpointer is not supported"
            )
        if transform is not None and transform_factory is not None:
            raise TypeError("transform and transform_factory are mutually exclusive.")
        if batch_size is None and prefetch:
            raise ValueError(
                "Dynamic batch-size specification is incompatible with multithreaded "
                "sampling. When using prefetch, the batch-size must be specified in advance."
            )
        if dim_extend is not None and dim_extend < 0:
            raise ValueError("dim_extend must be a positive value.")
        self._storage: Storage = _component(
            storage, lambda: LazyTensorStorage(1_000), Storage, "storage"
        )
        self._sampler: Sampler = _component(sampler, RandomSampler, Sampler, "sampler")
        self._writer: Writer = _component(writer, self._default_writer, Writer, "writer")
        self._transform = _as_compose(
            transform_factory() if transform_factory is not None else transform
        )
        self._batch_size = batch_size
        if batch_size is None and getattr(self._sampler, "drop_last", False):
            raise ValueError(
                "Samplers with drop_last=True must work with a predictable batch-size. "
                "Please pass the batch-size to the ReplayBuffer constructor."
            )
        self._dim_extend = self._storage.ndim - 1 if dim_extend is None else dim_extend
        self._collate_fn = collate_fn
        self._pin_memory = pin_memory
        self._generator = generator
        self._save_hooks: list = []
        self._load_hooks: list = []
        # Set once, on the first write (or load), under `_build_lock`.
        self._native: Optional[NativeReplayBuffer] = None
        self._layout: Optional[Layout] = None
        self._plan: Optional[_SamplePlan] = None
        self._envs = 1
        self._device: Optional[torch.device] = None
        self._build_lock = threading.Lock()
        # (index as handed out, its rows' generations) of the latest sample, one
        # attribute so that a thread never pairs one sample's index with another's.
        self._last: Optional[Tuple[Any, np.ndarray]] = None
        # write_count kept across `empty(empty_write_count=False)`.
        self._write_count_base = 0
        self._storage._rb = self
        if isinstance(self._storage, TensorStorage):
            self._fill(self._storage._initial)

    _default_writer = RoundRobinWriter

    # ----------------------------------------------------------------- building

    def _seed(self) -> int:
        if self._generator is not None:
            return self._generator.initial_seed() % 2**64
        return int(torch.randint(0, 2**62, (), dtype=torch.int64))

    def _batch_shape(self, data: Any) -> Tuple[int, ...]:
        if is_tensor_collection(data):
            return tuple(data.batch_size)
        leaves = _pytree.tree_leaves(data)
        return tuple(torch.as_tensor(leaves[0]).shape) if leaves else ()

    def _ensure_built(self, data: Any, batch_dims: int) -> None:
        """Makes the engine buffer from the first data written (once)."""
        with self._build_lock:
            if self._layout is not None:
                return
            if is_tensor_collection(data):
                layout: Layout = TensorDictLayout.of(data, batch_dims, skip=self._skip_keys)
            else:
                layout = TreeLayout.of(data, batch_dims)
            envs = 1
            if self._storage.ndim == 2:
                shape = self._batch_shape(data)
                envs = shape[0] if self._dim_extend == 1 else shape[1]
            self._make_native(layout, envs, self._storage._output_device(data))

    def _make_native(
        self,
        layout: Layout,
        envs: int,
        device: Optional[torch.device],
        write_policy: Any = None,
        memmap: bool = True,
    ) -> NativeReplayBuffer:
        storage = self._storage
        kwargs: Dict[str, Any] = {
            "spec": layout.spec(),
            "sampler": self._sampler._describe_for([f.key for f in layout.fields]),
            "write_policy": write_policy or self._writer._describe(),
            "seed": self._seed(),
        }
        capacity = storage.max_size
        if storage.ndim == 2:
            capacity = -(capacity // -envs) * envs
            kwargs.update(ndim=2, envs=envs, dim_extend=self._dim_extend)
        if memmap:
            kwargs.update(storage._native_kwargs())
        native = NativeReplayBuffer(capacity, **kwargs)
        self._install(native, layout, envs, device)
        return native

    def _install(
        self, native: NativeReplayBuffer, layout: Layout, envs: int, device: Optional[torch.device]
    ) -> None:
        self._layout, self._envs, self._device = layout, envs, device
        self._native = native
        self._sampler._native = native
        self._plan = _SamplePlan(self)

    def _fill(self, data: Any) -> None:
        """Writes a :class:`TensorStorage`'s initial rows (its dataset)."""
        if not isinstance(self._writer, ImmutableDatasetWriter):
            self._extend(data)
            return
        # An engine dataset is opened from a checkpoint: write the rows into a
        # round-robin buffer, save it, and open that read-only (the files stay mapped
        # while the buffer lives).
        with self._build_lock:
            layout = (
                TensorDictLayout.of(data, self._storage.ndim)
                if is_tensor_collection(data)
                else TreeLayout.of(data, self._storage.ndim)
            )
            shape = self._batch_shape(data)
            envs = (
                1 if self._storage.ndim == 1 else (shape[0] if self._dim_extend == 1 else shape[1])
            )
            staging = self._make_native(
                layout, envs, None, write_policy=self._describe_round_robin(), memmap=False
            )
            staging.extend(layout.arrays(data))
            directory = tempfile.mkdtemp(prefix="replaybuf-dataset-")
            staging.dumps(directory)
            native = NativeReplayBuffer.open_dataset(directory)
            weakref.finalize(self, shutil.rmtree, directory, True)
            self._install(native, layout, envs, self._storage._output_device(data))

    @staticmethod
    def _describe_round_robin() -> Any:
        return RoundRobinWriter()._describe()

    # ----------------------------------------------------------------- writing

    def _has_transform(self) -> bool:
        return len(self._transform) > 0

    def _transpose(self, data: Any) -> Any:
        if is_tensor_collection(data):
            return data.transpose(self._dim_extend, 0)
        return _pytree.tree_map(lambda x: x.transpose(self._dim_extend, 0), data)

    def _write(self, data: Any) -> np.ndarray:
        """Appends a batch; the engine's index of every row (flat positions)."""
        ndim = self._storage.ndim
        if ndim == 1 and self._dim_extend > 0:
            data = self._transpose(data)
        if self._layout is None:
            self._ensure_built(data, ndim)
        if isinstance(self._writer, ImmutableDatasetWriter):
            raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
        return self._native.extend(self._layout.arrays(data))

    def _index_of_written(self, written: np.ndarray) -> torch.Tensor:
        """TorchRL's index of written rows: flat, or ``[steps * envs, 2]`` for ndim 2."""
        if self._storage.ndim == 1:
            return torch.from_numpy(written.reshape(-1).view(np.int64))
        flat = (written.T if self._dim_extend == 1 else written).reshape(-1).astype(np.int64)
        steps, envs = np.divmod(flat, self._envs)
        return torch.from_numpy(np.stack([steps, envs], -1))

    def _extend(self, data: Any) -> torch.Tensor:
        return self._index_of_written(self._write(data))

    def extend(self, data: Any, *, update_priority: Optional[bool] = None) -> torch.Tensor:
        """Appends a batch (the leading dimension indexes its elements; a list holds
        elements) and returns where each element was written."""
        if update_priority is not None:
            raise NotImplementedError(
                "update_priority is not supported in this class. See TensorDictReplayBuffer.extend."
            )
        if self._has_transform():
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform.inv(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        if isinstance(data, list):
            data = _stack(data)
        return self._extend(data)

    def _add(self, data: Any) -> int:
        if self._storage.ndim != 1:
            raise NotImplementedError("add() needs a storage of ndim 1; use extend()")
        if self._layout is None:
            self._ensure_built(data, 0)
        if isinstance(self._writer, ImmutableDatasetWriter):
            raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
        index = self._native.add(self._layout.arrays(data))
        return -1 if index == 2**64 - 1 else index

    def add(self, data: Any) -> int:
        """Adds one element and returns its index."""
        if self._has_transform():
            is_tc = is_tensor_collection(data)
            with _set_dispatch_td_nn_modules(is_tc):
                if is_tc:
                    data = self._transform.inv(data.unsqueeze(-1))
                    data = None if data is None else data.squeeze(-1)
                else:
                    data = self._transform.inv(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        return self._add(data)

    # ----------------------------------------------------------------- sampling

    def _resolve_batch_size(self, batch_size: Optional[int]) -> int:
        if batch_size is not None:
            return batch_size
        if self._batch_size is None:
            raise RuntimeError(
                "batch_size not specified. You can specify the batch_size when "
                "constructing the replay buffer, or pass it to the sample method."
            )
        return self._batch_size

    def _draw(self, n: int, retry: bool = True) -> Dict[Any, np.ndarray]:
        """The engine's sample of ``n`` rows; a new epoch starts when one ran out
        (``retry``), as TorchRL's samplers start one on the call after."""
        native = self._native
        if native is None or len(native) == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        try:
            return native.sample(n)
        except EpochEnd:
            if not retry:
                raise
            return native.sample(n)

    def _info(self, out: Dict[Any, np.ndarray], stacked: bool) -> Dict[Any, Any]:
        """The sample's metadata, TorchRL's way: ``index`` (stacked for a TensorDict
        buffer, a tuple of per-dimension indices for a plain one when several),
        ``priority_weight``, slice flags."""
        plan = self._plan
        index = torch.from_numpy(out["index"].view(np.int64))
        if plan.envs:
            steps, envs = np.divmod(out["index"].astype(np.int64), plan.envs)
            steps, envs = torch.from_numpy(steps), torch.from_numpy(envs)
            index = torch.stack([steps, envs], -1) if stacked else (steps, envs)
        elif plan.slices:
            index = index.unsqueeze(-1) if stacked else (index,)
        self._last = (index, out["generation"])
        info: Dict[Any, Any] = {"index": index}
        if plan.prioritized:
            info["priority_weight"] = torch.from_numpy(out["weight"])
        if plan.info_keys is not None:
            self._slice_info(out, info)
        return info

    def _slice_info(self, out: Dict[Any, np.ndarray], info: Dict[Any, Any]) -> None:
        """TorchRL's slice flags: ``truncated`` at every slice's last step, ``done``
        the stored flag or'ed with it, ``terminated`` as stored, and the stored
        ``is_init`` set at every slice's first step."""
        plan = self._plan
        truncated_key, done_key, terminated_key = plan.info_keys
        ends = (out["marks"] & _SLICE_END_MARKS) != 0
        n = len(ends)
        truncated = torch.from_numpy(ends).unsqueeze(-1)

        def stored(field: Any) -> torch.Tensor:
            value = field.tensor(out[field.native])
            return value, truncated.reshape((n,) + (1,) * (value.dim() - 1))

        if plan.done_field is not None:
            done, flag = stored(plan.done_field)
            done = done | flag
        else:
            done = truncated.clone()
        if plan.terminated_field is not None:
            terminated = plan.terminated_field.tensor(out[plan.terminated_field.native])
        else:
            terminated = torch.zeros_like(truncated)
        info[truncated_key] = truncated
        info[done_key] = done
        info[terminated_key] = terminated
        if plan.init_field is not None:
            starts = np.empty(n, dtype=bool)
            if n:
                starts[0] = True
                starts[1:] = ends[:-1]
            is_init = plan.init_field.tensor(out[plan.init_field.native])
            info[self._sampler.init_key] = is_init | torch.from_numpy(starts).reshape(
                (n,) + (1,) * (is_init.dim() - 1)
            )

    def _drop_padding(self, out: Dict[Any, np.ndarray]) -> Dict[Any, np.ndarray]:
        valid = (out["marks"] & MARK_VALID) != 0
        if valid.all():
            return out
        return {k: v[valid] for k, v in out.items()}

    def _finish(self, data: Any) -> Any:
        if self._collate_fn is not None:
            data = self._collate_fn(data)
        if self._has_transform():
            is_td = is_tensor_collection(data)
            with _set_dispatch_td_nn_modules(is_td):
                data = self._transform(data)
        return data

    def _deliver(self, data: Any) -> Any:
        if self._pin_memory and torch.cuda.is_available():
            data = (
                data.pin_memory()
                if hasattr(data, "pin_memory")
                else _pytree.tree_map(lambda x: x.pin_memory(), data)
            )
        if self._device is not None:
            data = (
                data.to(self._device)
                if hasattr(data, "to")
                else _pytree.tree_map(lambda x: x.to(self._device), data)
            )
        return data

    def _sample(self, n: int, retry: bool = True) -> Tuple[Any, Dict[Any, Any]]:
        out = self._draw(n, retry)
        plan = self._plan
        if plan.may_pad:
            out = self._drop_padding(out)
        info = self._info(out, stacked=False)
        data = self._layout.rows(out, (len(out["index"]),), _CPU)
        data = self._deliver(self._finish(data))
        if self._device is not None:
            info = _pytree.tree_map(
                lambda x: x.to(self._device) if isinstance(x, torch.Tensor) else x, info
            )
        return data, info

    def sample(self, batch_size: Optional[int] = None, return_info: bool = False) -> Any:
        """Draws a batch (``batch_size`` rows, else the buffer's). With
        ``return_info``, returns ``(batch, info)``: ``info["index"]`` locates the rows
        (for :meth:`update_priority`), ``info["priority_weight"]`` holds a prioritized
        sampler's importance weights."""
        data, info = self._sample(self._resolve_batch_size(batch_size))
        return (data, info) if return_info else data

    def __iter__(self) -> Iterator[Any]:
        """Batches of ``batch_size``, until a sampler without replacement runs out
        of its epoch (forever with replacement)."""
        if self._batch_size is None:
            raise RuntimeError(
                "Cannot iterate over the replay buffer. Batch_size was not specified "
                "during construction of the replay buffer."
            )
        self._sampler.ran_out = False
        retry = True
        while True:
            try:
                batch = self._sample(self._batch_size, retry)[0]
            except EpochEnd:
                self._sampler.ran_out = True
                return
            retry = False
            yield batch

    # ----------------------------------------------------------------- priorities

    def _positions(self, index: Any) -> np.ndarray:
        """Flat engine positions (int64, -1 for none) from a TorchRL index."""
        if isinstance(index, torch.Tensor):
            a = index.detach().cpu().numpy()
        else:
            a = np.asarray(index)
        a = a.astype(np.int64, copy=False)
        if self._storage.ndim == 2 and a.ndim >= 2 and a.shape[-1] == 2:
            a = a[..., 0] * self._envs + a[..., 1]
        elif a.ndim >= 2 and a.shape[-1] == 1:
            a = a[..., 0]
        return a.reshape(-1)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Sets the priorities of the rows at ``index`` (a sample's ``index``, or
        indices from :meth:`extend`). Given the index of this buffer's latest sample,
        rows overwritten since that sample keep their priority."""
        native = self._native
        if native is None or not self._sampler.prioritized:
            return
        generation = None
        last = self._last
        if last is not None:
            last_index = last[0]
            if index is last_index or (
                isinstance(index, torch.Tensor)
                and isinstance(last_index, torch.Tensor)
                and index.shape == last_index.shape
                and index.data_ptr() == last_index.data_ptr()
            ):
                generation = last[1]
        if isinstance(index, tuple):
            index = torch.stack([torch.as_tensor(i) for i in index], -1)
        positions = self._positions(index)
        n = positions.size
        if isinstance(priority, torch.Tensor):
            priority = priority.detach().cpu().numpy()
        priority = np.asarray(priority, dtype=np.float64)
        if priority.size == 1 and n != 1:
            priority = np.full(n, float(priority.reshape(-1)[0]))
        else:
            priority = priority.reshape(n, -1)
        valid = positions >= 0
        if not valid.all():
            positions, priority = positions[valid], priority[valid]
            if generation is not None:
                generation = generation[valid]
        native.update_priority(positions.view(np.uint64), priority, generation)

    # ----------------------------------------------------------------- reading

    def __len__(self) -> int:
        native = self._native
        return 0 if native is None else len(native)

    @property
    def write_count(self) -> int:
        """Rows written so far through :meth:`add` and :meth:`extend`."""
        native = self._native
        return self._write_count_base + (0 if native is None else native.write_count)

    def _rows(self, out: Dict[Any, np.ndarray], batch: Tuple[int, ...]) -> Any:
        return self._layout.rows(out, batch, _CPU)

    def _read(self, index: Any) -> Any:
        """The stored rows at ``index``, untransformed."""
        native = self._native
        if native is None:
            raise IndexError("the buffer holds no rows yet")
        if self._storage.ndim == 2:
            if index != slice(None):
                raise NotImplementedError("an ndim-2 buffer is read whole: rb[:]")
            out = native.read_all_in_order()
            steps = len(out["index"]) // self._envs
            fields = {}
            for f in self._layout.fields:
                a = out[f.native].reshape((steps, self._envs) + f.shape)
                fields[f.native] = (
                    np.ascontiguousarray(np.swapaxes(a, 0, 1)) if self._dim_extend == 1 else a
                )
            batch = (self._envs, steps) if self._dim_extend == 1 else (steps, self._envs)
            return self._rows(fields, batch)
        if isinstance(index, slice):
            if (
                index.step in (None, 1)
                and index.start in (None, 0)
                and (index.stop is None or index.stop >= 0)
            ):
                out = native.read_all_in_order(index.stop)
            else:
                out = native.get(np.arange(len(native))[index])
            return self._rows(out, (len(out["index"]),))
        if isinstance(index, (int, np.integer)) or (
            isinstance(index, torch.Tensor) and index.ndim == 0
        ):
            i = int(index)
            if i < 0:
                i += len(native)
            out = native.get(i)
            return self._rows({k: v[0, ...] for k, v in out.items()}, ())
        a = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if a.dtype == bool:
            a = np.nonzero(a)[0]
        a = np.where(a < 0, a + len(native), a).reshape(-1)
        out = native.get(a)
        return self._rows(out, (len(a),))

    def __getitem__(self, index: Any) -> Any:
        """Stored rows by position: ``rb[i]``, ``rb[:]`` (every row, in storage
        order), ``rb[:end]``, ``rb[indices]``; ``rb[key]`` is ``rb[:][key]``."""
        if isinstance(index, str) or (
            isinstance(index, tuple) and index and all(isinstance(k, str) for k in index)
        ):
            return self[:][index]
        if isinstance(index, tuple) and len(index) == 1:
            return self[index[0]]
        data = self._read(index)
        if not isinstance(index, (int, np.integer)) and self._collate_fn is not None:
            data = self._collate_fn(data)
        if self._has_transform():
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform(data)
        return data

    def read_all_in_order(self, end: Optional[int] = None) -> Any:
        """Every stored row among the first ``end`` positions, in storage order
        (``rb[:end]``; ``rb[:]`` when None)."""
        return self[:] if end is None else self[:end]

    def write_all(self, data: Any, end: Optional[int] = None) -> None:
        """Overwrites positions ``0..end`` with the first ``end`` rows of ``data``, in
        storage order (``rb[:end] = data``; ``end`` defaults to every row of
        ``data``)."""
        if self._storage.ndim != 1:
            raise NotImplementedError("write_all needs a storage of ndim 1")
        if self._has_transform():
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform.inv(data)
        if isinstance(self._writer, ImmutableDatasetWriter):
            raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
        if self._layout is None:
            self._ensure_built(data, 1)
        self._native.write_all(self._layout.arrays(data), end)

    def empty(self, empty_write_count: bool = True) -> None:
        """Drops every row; ``write_count`` too unless ``empty_write_count=False``."""
        if isinstance(self._writer, ImmutableDatasetWriter):
            raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
        kept = 0 if empty_write_count else self.write_count
        if self._native is not None:
            self._native.clear()
        self._write_count_base = kept
        self._last = None
        self._sampler.ran_out = False

    # ----------------------------------------------------------------- transforms

    def append_transform(self, transform: Any, *, invert: bool = False) -> ReplayBuffer:
        """Appends a transform (or a callable) applied to sampled batches; with
        ``invert``, its forward call runs on written data and its inverse on samples."""
        if not isinstance(transform, Transform) and callable(transform):
            transform = _CallableTransform(transform)
        if invert:
            transform = _InvertTransform(transform)
        transform.eval()
        self._transform.append(transform)
        return self

    def insert_transform(
        self, index: int, transform: Any, *, invert: bool = False
    ) -> ReplayBuffer:
        """Inserts a transform at ``index`` of the chain (see :meth:`append_transform`)."""
        transform.eval()
        if invert:
            transform = _InvertTransform(transform)
        self._transform.insert(index, transform)
        return self

    # ----------------------------------------------------------------- persistence

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Registers ``hook(data, path=...)``, called by :meth:`dumps` with the
        stored rows (a batch in storage order); hooks chain, and a TensorDict the
        last returns is memory-mapped under ``path`` (``<dir>/storage``) beside the
        checkpoint."""
        self._save_hooks.append(hook)

    def register_load_hook(self, hook: Callable[..., Any]) -> None:
        """Registers ``hook(data, out=None)``, called by :meth:`loads` with the loaded
        rows; a batch the last hook returns is written back in their place."""
        self._load_hooks.append(hook)

    def _run_save_hooks(self, path: Path) -> None:
        data = self._read(slice(None))
        capacity = self._native.capacity
        for hook in self._save_hooks:
            if hasattr(hook, "is_full"):
                hook.is_full = len(self) == capacity
            if hasattr(hook, "shift"):
                hook.shift = self._native.write_count % capacity
            data = hook(data, path=path)
        if is_tensor_collection(data):
            data.memmap(path, copy_existing=True)

    def dumps(self, path: Any) -> None:
        """Saves the whole buffer (rows, priorities, sampler and random state,
        transforms' state) under the directory ``path``."""
        path = Path(path).absolute()
        path.mkdir(exist_ok=True)
        native = self._native
        if native is None:
            raise RuntimeError("Cannot save a non-initialized storage.")
        if self._save_hooks:
            self._run_save_hooks(path / SAVE_HOOK_DIR)
        native.dumps(path)
        face = {
            "layout": self._layout.to_json(),
            "envs": self._envs,
            "batch_size": self._batch_size,
            "write_count_base": self._write_count_base,
        }
        (path / FACE_FILE).write_text(json.dumps(face))
        transform_state = self._transform.state_dict()
        if transform_state:
            torch.save(transform_state, path / TRANSFORM_FILE)

    def loads(self, path: Any) -> None:
        """Loads a buffer :meth:`dumps` saved (into a fresh buffer of the same
        configuration, or this one)."""
        path = Path(path).absolute()
        face = json.loads((path / FACE_FILE).read_text())
        if self._native is None:
            with self._build_lock:
                if self._native is None:
                    self._make_native(
                        layout_from_json(json.dumps(face["layout"])),
                        face["envs"],
                        self._storage._output_device(None),
                    )
        self._native.loads(path)
        if (path / TRANSFORM_FILE).exists():
            self._transform.load_state_dict(torch.load(path / TRANSFORM_FILE))
        self._batch_size = face["batch_size"]
        self._write_count_base = face.get("write_count_base", 0)
        self._last = None
        if self._load_hooks:
            data = self._read(slice(None))
            for hook in self._load_hooks:
                data = hook(data, out=None)
            if data is not None:
                self._native.write_all(self._layout.arrays(data))

    save = dumps
    dump = dumps
    load = loads

    def state_dict(self) -> Dict[str, Any]:
        """The buffer's whole state as bytes (a :meth:`dumps` directory's files)."""
        with tempfile.TemporaryDirectory(prefix="replaybuf-state-") as d:
            self.dumps(d)
            files = {}
            for root, _, names in os.walk(d):
                for name in names:
                    full = os.path.join(root, name)
                    files[os.path.relpath(full, d)] = Path(full).read_bytes()
        return {"replaybuf_checkpoint": files}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory(prefix="replaybuf-state-") as d:
            for name, data in state_dict["replaybuf_checkpoint"].items():
                full = Path(d, name)
                full.parent.mkdir(parents=True, exist_ok=True)
                full.write_bytes(data)
            self.loads(d)

    # ----------------------------------------------------------------- attributes

    def set_rng(self, generator: torch.Generator) -> None:
        """Seeds the buffer's draws from ``generator`` (takes effect when the buffer
        makes its engine buffer, on the first write)."""
        self._generator = generator

    @property
    def batch_size(self) -> Optional[int]:
        return self._batch_size

    @property
    def dim_extend(self) -> int:
        return self._dim_extend

    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def writer(self) -> Writer:
        return self._writer

    @property
    def transform(self) -> Compose:
        return self._transform

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(storage={self._storage!r}, sampler={self._sampler!r}, "
            f"writer={self._writer!r}, batch_size={self._batch_size})"
        )


class PrioritizedReplayBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` with a :class:`PrioritizedSampler` of ``alpha``,
    ``beta`` and ``eps`` (TorchRL's ``PrioritizedReplayBuffer``)."""

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float,
        storage: Any = None,
        sampler: Any = None,
        collate_fn: Optional[Callable] = None,
        pin_memory: bool = False,
        prefetch: Optional[int] = None,
        transform: Any = None,
        batch_size: Optional[int] = None,
        dim_extend: Optional[int] = None,
        delayed_init: bool = False,
        sync: bool = True,
    ) -> None:
        storage = _component(storage, lambda: LazyTensorStorage(1_000), Storage, "storage")
        if sampler is None:
            sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, dtype)
        super().__init__(
            storage=storage,
            sampler=sampler,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            prefetch=prefetch,
            transform=transform,
            batch_size=batch_size,
            dim_extend=dim_extend,
        )


class TensorDictReplayBuffer(ReplayBuffer):
    """A replay buffer of TensorDicts (TorchRL's ``TensorDictReplayBuffer``): samples
    carry ``"index"`` (and ``"priority_weight"`` with a prioritized sampler, the slice
    flags with a slice sampler), and :meth:`update_tensordict_priority` reads new
    priorities from ``priority_key`` (default ``"td_error"``). ``extend`` also sets
    the priorities of written rows from that key when the data has it."""

    _is_tensordict = True
    _skip_keys = ("index",)
    _default_writer = TensorDictRoundRobinWriter

    def __init__(self, *, priority_key: Any = "td_error", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.priority_key = priority_key

    def extend(
        self, tensordicts: TensorDictBase, *, update_priority: Optional[bool] = None
    ) -> torch.Tensor:
        """Appends a TensorDict batch and returns where each row was written."""
        if not isinstance(tensordicts, TensorDictBase):
            raise ValueError(
                f"{type(self).__name__} only accepts TensorDictBase subclasses. "
                "Please use a regular `ReplayBuffer` instead."
            )
        if self._has_transform():
            tensordicts = self._transform.inv(tensordicts)
            if tensordicts is None:
                return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        written = self._write(tensordicts)
        if self._sampler.prioritized and update_priority is not False:
            priority = tensordicts.get(self.priority_key, None)
            if priority is not None:
                self._native.update_priority(
                    written.reshape(-1), to_array(priority).reshape(written.size, -1)
                )
        return self._index_of_written(written)

    def add(self, data: TensorDictBase) -> int:
        """Adds one TensorDict (batch size ``[]``) and returns its index."""
        if self._has_transform():
            data = self._transform.inv(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        index = self._add(data)
        if self._sampler.prioritized and index >= 0:
            priority = data.get(self.priority_key, None)
            if priority is not None:
                self._native.update_priority(
                    np.array([index], np.uint64), to_array(priority).reshape(1, -1)
                )
        return index

    def sample(
        self,
        batch_size: Optional[int] = None,
        return_info: bool = False,
        include_info: Optional[bool] = None,
    ) -> Any:
        """Draws a TensorDict of ``batch_size`` rows (else the buffer's), with its
        ``"index"`` and sampler entries set; with ``return_info``, also the info."""
        data, info = self._sample(self._resolve_batch_size(batch_size))
        return (data, info) if return_info else data

    def _sample(self, n: int, retry: bool = True) -> Tuple[Any, Dict[Any, Any]]:
        out = self._draw(n, retry)
        plan = self._plan
        if plan.may_pad:
            out = self._drop_padding(out)
        info = self._info(out, stacked=True)
        rows = (len(out["index"]),)
        if self._collate_fn is None and not self._has_transform():
            data = self._layout.rows(out, rows, _CPU, extra=info)
        else:
            data = self._finish(self._layout.rows(out, rows, _CPU))
            for key, value in info.items():
                data.set(key, expand_as_right(value, data) if value.ndim < data.ndim else value)
        if self._pin_memory or self._device is not None:
            data = self._deliver(data)
            info = {k: data.get(k) for k in info}
        return data, info

    def update_tensordict_priority(self, data: TensorDictBase) -> None:
        """Sets the priorities of a sample's rows from its ``priority_key`` entry
        (several values per row are reduced by the sampler's ``reduction``)."""
        if not self._sampler.prioritized:
            return
        priority = data.get(self.priority_key, None)
        if priority is None:
            return
        self.update_priority(data.get("index"), priority)


class TensorDictPrioritizedReplayBuffer(TensorDictReplayBuffer):
    """A :class:`TensorDictReplayBuffer` with a :class:`PrioritizedSampler` of
    ``alpha``, ``beta``, ``eps`` and ``reduction`` (TorchRL's
    ``TensorDictPrioritizedReplayBuffer``)."""

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
        storage = _component(storage, lambda: LazyTensorStorage(1_000), Storage, "storage")
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
