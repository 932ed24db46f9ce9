"""``ReplayBuffer`` and ``PrioritizedReplayBuffer``: TorchRL's buffers over one of
replaybuf's engine buffers.

A buffer is configuration (storage, sampler, writer, transforms) until the first data
is written; that data fixes the fields (see :mod:`._layout`) and the engine buffer is
made from them. From then on every row moves in one engine call: ``extend`` hands the
tensors' memory to the engine, which copies it into the storage with the GIL
released, and ``sample`` gets fresh arrays that become the returned tensors without a
copy.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import numpy as np
import torch
from tensordict import is_tensor_collection
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from torch.utils import _pytree
from torchrl.envs.transforms.transforms import (
    Compose,
    Transform,
    _CallableTransform,
    _InvertTransform,
)

from .._native import EpochEnd, ReplayBufferValueError
from .._native import ReplayBuffer as NativeReplayBuffer
from . import _checkpoint
from ._engine import LazyEngine
from ._layout import Layout, layout_from_json
from ._sample_info import SamplePlan
from .samplers import PrioritizedSampler, RandomSampler, Sampler
from .storages import LazyTensorStorage, Storage, TensorStorage
from .writers import ImmutableDatasetWriter, RoundRobinWriter, TensorDictMaxValueWriter, Writer

__all__ = ["ReplayBuffer", "PrioritizedReplayBuffer"]

_EMPTY_STORAGE_ERROR = "Cannot sample from an empty storage."
_NOT_WRITTEN = 2**64 - 1
CPU = torch.device("cpu")


class SampleRefusedError(ReplayBufferValueError, RuntimeError):
    """The engine cannot draw the batch asked for (no trajectory long enough for a
    slice; fewer rows than a batch without replacement and ``drop_last``): a
    ``ValueError`` as replaybuf raises it, and a ``RuntimeError`` as TorchRL's samplers
    mostly do."""


class EmptyStorageError(IndexError, RuntimeError):
    """A read from a buffer that holds no rows yet: an ``IndexError`` as replaybuf
    raises it, and a ``RuntimeError`` as TorchRL's storages do."""


def _offsets_in(view: Any, mine: torch.Tensor) -> Optional[np.ndarray]:
    """Where each entry of ``view`` lies within ``mine``'s elements (row-major), when
    ``view`` is a view of ``mine``'s memory; else None."""
    if (
        not isinstance(view, torch.Tensor)
        or view.dtype != mine.dtype
        or view.device != mine.device
        or view.untyped_storage().data_ptr() != mine.untyped_storage().data_ptr()
    ):
        return None
    if view.numel() == 0:
        return np.zeros(view.shape, np.int64)
    start = view.storage_offset() - mine.storage_offset()
    end = start + sum((size - 1) * stride for size, stride in zip(view.shape, view.stride()))
    if start < 0 or end >= mine.numel():
        return None
    ordinal = torch.arange(mine.numel())
    return torch.as_strided(ordinal, view.shape, view.stride(), start).numpy()


def _rows_of_view(view: Any, mine: Any) -> Optional[np.ndarray]:
    """The rows (flat) of the latest sample's index ``mine`` that ``view`` names, when
    ``view`` is that index seen through a reshape, an expansion or a slice (as
    TensorDicts give their entries: ``s.reshape(-1, 4)["index"]``, and
    ``update_tensordict_priority`` cuts it with ``index[..., 0]`` or unbinds its
    (step, env) columns); else None."""
    if not isinstance(mine, torch.Tensor) or not mine.is_contiguous():
        return None
    # Entries per row: 1, or a stacked [n, 1] / [n, 2] index's last dim.
    width = mine.shape[-1] if mine.ndim == 2 else 1
    if isinstance(view, tuple):
        parts = [_offsets_in(part, mine) for part in view]
        if len(parts) != width or any(part is None for part in parts):
            return None
        at = np.stack(parts, -1)
    else:
        at = _offsets_in(view, mine)
        if at is None:
            return None
    rows, column = np.divmod(at, width)
    if width > 1:
        # Only whole (step, env) rows name a row: a column alone does not.
        if at.ndim == 0 or at.shape[-1] != width or (column != np.arange(width)).any():
            return None
        rows = rows[..., 0]
    return rows.reshape(-1)


def component(value: Any, default: Callable[[], Any], base: type, what: str) -> Any:
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


def default_storage() -> Storage:
    return LazyTensorStorage(1_000)


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
    """A list of elements to add one at a time, as one batch."""
    if items and is_tensor_collection(items[0]):
        return torch.stack(items)
    return _pytree.tree_map(lambda *xs: torch.stack([torch.as_tensor(x) for x in xs]), *items)


def _each_tensor(data: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn`` applied to a tensor or TensorDict, or to each tensor of a pytree."""
    if isinstance(data, torch.Tensor) or is_tensor_collection(data):
        return fn(data)
    return _pytree.tree_map(fn, data)


class ReplayBuffer(LazyEngine):
    """A replay buffer with TorchRL's interface (``torchrl.data.ReplayBuffer``).

    Keyword Args:
        storage: a :mod:`~replaybuf.torchrl.storages` storage (or its constructor);
            default ``LazyTensorStorage(1_000)``.
        sampler: a :mod:`~replaybuf.torchrl.samplers` sampler; default
            :class:`~replaybuf.torchrl.RandomSampler`.
        writer: a :mod:`~replaybuf.torchrl.writers` writer; default
            :class:`~replaybuf.torchrl.RoundRobinWriter`.
        collate_fn: applied to every sampled batch before the transforms.
        pin_memory: pin sampled batches (for a fast copy to a GPU).
        prefetch: accepted and ignored: a sample is one GIL-free engine call.
        transform, transform_factory: applied to sampled batches (and, inverted, to
            written data); see :meth:`append_transform`.
        batch_size: rows :meth:`sample` draws when given none.
        dim_extend: the data dimension :meth:`extend` appends along (default
            ``storage.ndim - 1``: time, of ``[envs, time]`` batches on ``ndim=2``).
        generator: a ``torch.Generator`` whose seed seeds the buffer's draws (without
            one, the seed is drawn from torch's global generator when the buffer is
            made, so ``torch.manual_seed`` makes runs repeatable).

    Data is a tensor, a pytree of tensors (dicts, tuples) or a TensorDict; a list
    passed to :meth:`extend` is a list of elements to add one at a time.
    """

    # Keys of written TensorDicts that are metadata, not fields.
    _skip_keys: Tuple[Any, ...] = ()
    _default_writer: Callable[[], Writer] = RoundRobinWriter

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
        self._storage: Storage = component(storage, default_storage, Storage, "storage")
        self._sampler: Sampler = component(sampler, RandomSampler, Sampler, "sampler")
        self._writer: Writer = component(writer, self._default_writer, Writer, "writer")
        if transform_factory is not None:
            transform = transform_factory()
        self._transform = _as_compose(transform)
        # The chain's modules, whose emptiness the hot paths test (a dict, so the
        # test costs no nn.Module attribute lookup; appends and inserts edit it).
        self._transform_modules = self._transform.transforms._modules
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
        self._plan: Optional[SamplePlan] = None
        self._envs = 1
        self._device: Optional[torch.device] = None
        self._build_lock = threading.Lock()
        # The latest sample's (index as handed out, engine positions, generations):
        # one attribute, so a thread never pairs one sample's index with another's.
        self._last: Optional[Tuple[Any, np.ndarray, np.ndarray]] = None
        # write_count kept across `empty(empty_write_count=False)`; with a max-value
        # writer, the whole count: the engine counts the rows it appends, not those
        # that replace stored ones, where TorchRL counts both.
        self._write_count_base = 0
        self._counts_writes = isinstance(self._writer, TensorDictMaxValueWriter)
        self._count_lock = threading.Lock()
        self._storage._rb = self
        # TorchRL's `rb.sampler.update_priority(index, priority)` goes through the
        # buffer, which knows its indices.
        self._sampler._rb = weakref.ref(self)
        if isinstance(self._storage, TensorStorage):
            self._fill(self._storage._initial)
            # TorchRL's TensorStorage holds its data from the start, written by no
            # writer: write_count starts at 0.
            self._write_count_base -= self.write_count
        remembered = getattr(self._storage, "_remembered", lambda: None)()
        if remembered is not None:
            # A directory an earlier buffer of this face wrote, opened again: its rows
            # are there from the start.
            layout = layout_from_json(json.dumps(remembered["layout"]))
            self._ensure_native_for(layout, remembered["envs"])

    # ----------------------------------------------------------------- writing

    def _transpose(self, data: Any) -> Any:
        if is_tensor_collection(data):
            return data.transpose(self._dim_extend, 0)
        return _pytree.tree_map(lambda x: x.transpose(self._dim_extend, 0), data)

    def _write(self, data: Any) -> np.ndarray:
        """Appends a batch; the engine's index of every row (flat positions)."""
        ndim = self._storage.ndim
        if ndim == 1 and self._dim_extend > 0:
            data = self._transpose(data)
        native = self._native_to_write(data, ndim)
        if self._counts_writes:
            return self._write_ranked(native, self._layout.arrays(data))
        return native.extend(self._layout.arrays(data))

    def _write_ranked(
        self, native: NativeReplayBuffer, arrays: Dict[Any, np.ndarray]
    ) -> np.ndarray:
        """A max-value writer's batch, one row per engine call: TorchRL counts every
        row the writer takes, one that a later row of the batch then displaces
        included, and the engine's batch write reports such a row as not written."""
        rows = len(next(iter(arrays.values())))
        written = np.full(rows, _NOT_WRITTEN, np.uint64)
        unranked = self._unranked(arrays, rows)
        with self._count_lock:
            try:
                for i in np.flatnonzero(~unranked):
                    row = {k: v[i : i + 1] for k, v in arrays.items()}
                    written[i] = native.extend(row)[0]
            finally:
                # Counted whatever stopped the batch: its rows before are stored.
                taken = np.flatnonzero(written != np.uint64(_NOT_WRITTEN))
                self._write_count_base += len(taken)
        # A row displaced by a later row of the batch reads as not written (-1), as
        # TorchRL's index has it: only the last row written at a position stays.
        last = len(taken) - 1 - np.unique(written[taken][::-1], return_index=True)[1]
        displaced = np.setdiff1d(taken, taken[last])
        written[displaced] = _NOT_WRITTEN
        return written

    def _unranked(self, arrays: Dict[Any, np.ndarray], rows: int) -> np.ndarray:
        """The rows whose rank holds a NaN: TorchRL's max-value writer passes over them
        (no comparison takes them), where the engine refuses them."""
        field = self._layout.field_of(self._writer._rank_key)
        values = None if field is None else arrays.get(field.native)
        if values is None or values.dtype.kind != "f":
            return np.zeros(rows, bool)
        # `(rows, -1)` cannot be inferred from an empty batch.
        return np.isnan(values.reshape(rows, values.size // max(rows, 1))).any(axis=1)

    def _index_of_written(self, written: np.ndarray) -> torch.Tensor:
        """TorchRL's index of written rows: flat (-1 where not written), or
        ``[steps * envs, 2]`` (step, env) rows in time order for ndim 2."""
        if self._storage.ndim == 1:
            return torch.from_numpy(written.reshape(-1).view(np.int64))
        flat = (written.T if self._dim_extend == 1 else written).reshape(-1).astype(np.int64)
        steps, envs = np.divmod(flat, self._envs)
        return torch.from_numpy(np.stack([steps, envs], -1))

    def _extend(self, data: Any) -> torch.Tensor:
        return self._index_of_written(self._write(data))

    def extend(self, data: Any, *, update_priority: Optional[bool] = None) -> torch.Tensor:
        """Appends a batch (its leading dimension indexes the elements; a list holds
        elements) and returns where each element was written."""
        if update_priority is not None:
            raise NotImplementedError(
                "update_priority is not supported in this class. See TensorDictReplayBuffer.extend."
            )
        if self._transform_modules:
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform.inv(data)
        if data is None:
            return torch.zeros((0, self._storage.ndim), dtype=torch.long)
        if isinstance(data, list):
            data = _stack(data)
        return self._extend(data)

    def _add(self, data: Any) -> Optional[int]:
        if self._storage.ndim != 1:
            raise NotImplementedError("add() needs a storage of ndim 1; use extend()")
        native = self._native_to_write(data, 0)
        if self._counts_writes:
            with self._count_lock:
                index = native.add(self._layout.arrays(data))
                self._write_count_base += int(index != _NOT_WRITTEN)
        else:
            index = native.add(self._layout.arrays(data))
        # TorchRL's max-value writer returns None for an element it does not write.
        return None if index == _NOT_WRITTEN else index

    def add(self, data: Any) -> Optional[int]:
        """Adds one element and returns its index (None if the writer passed it over)."""
        if self._transform_modules:
            is_tc = is_tensor_collection(data)
            with _set_dispatch_td_nn_modules(is_tc):
                if is_tc:
                    # Transforms expect a time dimension, as TorchRL gives them.
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
        """The engine's sample of ``n`` rows, padding dropped. When an epoch has run
        out, a new one starts (``retry``), as TorchRL's samplers start one on the
        call after the last batch of an epoch."""
        native = self._native
        if native is None or len(native) == 0:
            raise RuntimeError(_EMPTY_STORAGE_ERROR)
        if n < 0:
            # As TorchRL fails (torch's error), not an OverflowError from the engine.
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
        try:
            try:
                out = native.sample(n)
            except EpochEnd:
                if not retry:
                    raise
                out = native.sample(n)
        except ReplayBufferValueError as e:
            raise SampleRefusedError(str(e)) from e
        if self._sampler.without_replacement:
            self._sampler.ran_out = self._ran_out(n)
        return self._plan.drop_padding(out)

    def _ran_out(self, n: int) -> bool:
        """Whether the epoch has no batch of ``n`` rows left after this sample: as
        TorchRL's samplers without replacement set ``ran_out``, the next sample then
        starting the next epoch."""
        left = self._native.epoch_left()
        if left is None:
            return False
        sampler = self._sampler
        if sampler.slices:
            # The epoch's items are slices.
            n = sampler.num_slices if sampler.num_slices is not None else n // sampler.slice_len
        return left == 0 or (sampler.drop_last and left < n)

    def _collate_and_transform(self, data: Any) -> Any:
        if self._collate_fn is not None:
            data = self._collate_fn(data)
        if self._transform_modules:
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform(data)
        return data

    def _deliver(self, data: Any) -> Any:
        """The batch pinned and on the output device, as configured."""
        if self._pin_memory and torch.cuda.is_available():
            data = _each_tensor(data, lambda x: x.pin_memory())
        if self._device is not None:
            data = _each_tensor(data, lambda x: x.to(self._device))
        return data

    def _sample(self, n: int, retry: bool = True) -> Tuple[Any, Dict[Any, Any]]:
        out = self._draw(n, retry)
        info = self._plan.info(out, stacked=False)
        self._last = (info["index"], out["index"], out["generation"])
        data = self._layout.rows(out, (len(out["index"]),), CPU)
        data = self._deliver(self._collate_and_transform(data))
        if self._device is not None:
            info = _pytree.tree_map(lambda x: x.to(self._device), info)
        return data, info

    def sample(self, batch_size: Optional[int] = None, return_info: bool = False) -> Any:
        """Draws a batch (``batch_size`` rows, else the buffer's). With
        ``return_info``, returns ``(batch, info)``: ``info["index"]`` locates the rows
        (for :meth:`update_priority`), ``info["priority_weight"]`` holds a prioritized
        sampler's importance weights."""
        data, info = self._sample(self._resolve_batch_size(batch_size))
        return (data, info) if return_info else data

    def __iter__(self) -> Iterator[Any]:
        """Batches of ``batch_size``, until a sampler without replacement runs out of
        its epoch (forever with replacement)."""
        if self._batch_size is None:
            raise RuntimeError(
                "Cannot iterate over the replay buffer. Batch_size was not specified "
                "during construction of the replay buffer."
            )
        self._sampler.ran_out = False
        retry = True
        while not self._sampler.ran_out:
            try:
                batch = self._sample(self._batch_size, retry)[0]
            except EpochEnd:
                # Its rows all overwritten since it began.
                self._sampler.ran_out = True
                return
            retry = False
            yield batch

    # ----------------------------------------------------------------- priorities

    def _positions(self, index: Any) -> np.ndarray:
        """Flat engine positions (int64; -1: none) of a TorchRL index."""
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

    def _latest_rows(self, index: Any) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The engine positions and generations of the latest sample's rows that
        ``index`` names, when ``index`` is that sample's index: the same tensor, or a
        view of it (see :func:`_rows_of_view`)."""
        last = self._last
        if last is None:
            return None
        mine, positions, generations = last
        # The engine's positions are uint64; samples give them as int64 (torch's).
        if index is mine:
            return positions.view(np.uint64), generations
        rows = _rows_of_view(index, mine)
        if rows is None:
            return None
        return positions[rows].view(np.uint64), generations[rows]

    def update_priority(self, index: Any, priority: Any) -> None:
        """Sets the priorities of the rows at ``index`` (a sample's ``index``, or what
        :meth:`extend` returned). Given the index of this buffer's latest sample, rows
        overwritten since that sample keep their priority."""
        native = self._native
        if native is None or not self._sampler.prioritized:
            return
        latest = self._latest_rows(index)
        if latest is not None:
            positions, generation = latest
        else:
            if isinstance(index, tuple):
                index = torch.stack([torch.as_tensor(i) for i in index], -1)
            positions, generation = self._positions(index), None
        n = positions.size
        if isinstance(priority, torch.Tensor):
            if not priority.is_floating_point() or priority.dtype is torch.bfloat16:
                priority = priority.double()
            priority = priority.detach().cpu().numpy()
        else:
            priority = np.asarray(priority, dtype=np.float64)
        if priority.size == 1 and n != 1:
            priority = np.full(n, float(priority.reshape(-1)[0]))
        elif priority.ndim != 1:
            priority = priority.reshape(n, -1)
        if generation is None:
            written = positions >= 0  # -1: a row a max-value writer did not write
            if not written.all():
                positions, priority = positions[written], priority[written]
            positions = positions.view(np.uint64)
        native.update_priority(positions, priority, generation)

    # ----------------------------------------------------------------- reading

    def __len__(self) -> int:
        native = self._native
        return 0 if native is None else len(native)

    @property
    def write_count(self) -> int:
        """Rows written so far through :meth:`add` and :meth:`extend`: elements along
        the storage's first dim (steps of an ``ndim=2`` storage), and with a
        :class:`TensorDictMaxValueWriter` every row it took, replacements included."""
        native = self._native
        if native is None or self._counts_writes:
            return self._write_count_base
        # The engine counts every stored cell: steps x envs on ndim 2.
        return self._write_count_base + native.write_count // self._envs

    def _read_ndim2(self) -> Any:
        """Every stored step, ``[envs, steps]`` (``[steps, envs]`` when extending
        along dimension 0)."""
        out = self._native.read_all_in_order()
        envs = self._envs
        steps = len(out["index"]) // envs
        fields = {}
        for f in self._layout.fields:
            a = out[f.native].reshape((steps, envs) + f.shape)
            fields[f.native] = (
                np.ascontiguousarray(np.swapaxes(a, 0, 1)) if self._dim_extend == 1 else a
            )
        batch = (envs, steps) if self._dim_extend == 1 else (steps, envs)
        return self._layout.rows(fields, batch, CPU)

    def _read(self, index: Any) -> Any:
        """The stored rows at ``index``, untransformed."""
        native = self._native
        if native is None:
            raise EmptyStorageError("Cannot get elements out of a non-initialized storage.")
        rows = self._layout.rows
        if self._storage.ndim == 2:
            if index != slice(None):
                raise NotImplementedError("an ndim-2 buffer is read whole: rb[:]")
            return self._read_ndim2()
        if isinstance(index, slice) and index in (slice(None), slice(0, None)):
            out = native.read_all_in_order()
            return rows(out, (len(out["index"]),), CPU)
        positions, shape = self._rows_at(index)
        if shape == ():
            out = native.get(positions)
            return rows({k: v[0, ...] for k, v in out.items()}, (), CPU)
        data = rows(native.get(positions), (len(positions),), CPU)
        if len(shape) != 1:
            # Shaped as the index, as indexing a tensor gives.
            data = _each_tensor(data, lambda x: x.reshape(shape + x.shape[1:]))
        return data

    def _rows_at(self, index: Any) -> Tuple[np.ndarray, Tuple[int, ...]]:
        """The engine positions ``index`` names (an int, a slice, an array or tensor of
        ints, or a boolean mask), flattened, and the shape indexing gives their rows
        (``()`` for one int). A non-negative int is a storage position, as TorchRL's;
        a negative one counts back through the stored rows, those ``rb[:]`` reads in
        storage order, and a slice and a mask pick among them: as indexing ``rb[:]``
        would. (A buffer of one shard holds its k-th stored row at position k until it
        is full; a frames buffer leaves out the steps it cannot yet rebuild, and its
        last position may hold none.)"""
        native = self._native
        if isinstance(index, slice):
            a = native.stored_positions()[index].astype(np.int64)
            return a, a.shape
        if isinstance(index, (int, np.integer)) or (
            isinstance(index, torch.Tensor) and index.ndim == 0
        ):
            return native.positions(int(index)).astype(np.int64), ()
        a = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if a.dtype == bool:
            stored = native.stored_positions()
            if a.shape != stored.shape:
                raise IndexError(
                    f"The shape of the mask {list(a.shape)} at index 0 does not match the "
                    f"shape of the indexed tensor [{len(stored)}] at index 0"
                )
            a = stored[a].astype(np.int64)
            return a, a.shape
        return native.positions(a.reshape(-1)).astype(np.int64), a.shape

    def __getitem__(self, index: Any) -> Any:
        """Stored rows by position: ``rb[i]``, ``rb[:]`` (every row, in storage order),
        ``rb[:end]``, ``rb[indices]``; ``rb[key]`` and any other tuple index are
        ``rb[:][index]``, as ``rb[index] = data`` takes them."""
        if isinstance(index, str) or (
            isinstance(index, tuple) and index and all(isinstance(k, str) for k in index)
        ):
            return self[:][index]
        if index is Ellipsis:
            return self[:]
        if index is None:
            # A new leading dimension over every row, as indexing `rb[:]` with None.
            return self[:][None]
        if isinstance(index, tuple) and len(index) == 1:
            return self[index[0]]
        if isinstance(index, tuple):
            # An index into the stored data's dimensions (`rb[1, 0]`: element (1, 0)),
            # as TorchRL's `storage[index]`: it read rows 1 and 0.
            return self[:][index]
        data = self._read(index)
        if not isinstance(index, (int, np.integer)) and self._collate_fn is not None:
            data = self._collate_fn(data)
        if self._transform_modules:
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform(data)
        return data

    def __setitem__(self, index: Any, value: Any) -> None:
        """Rewrites stored rows in place (TorchRL's ``rb[index] = data``): ``rb[i]``
        takes one element; ``rb[indices]``, ``rb[mask]`` and ``rb[a:b]`` one for each
        position they name, in that order (a position named twice keeps its last),
        after the inverse transforms, as :meth:`extend` takes them. ``rb[key] = values``
        (or any other tuple index) sets that part of every stored row, as TorchRL's
        ``rb[:][key] = values`` does. Every position must hold a row (an
        ``IndexError`` otherwise); on any error nothing is written."""
        native = self._native
        if native is None:
            raise EmptyStorageError("Cannot set elements of a non-initialized storage.")
        if self._storage.ndim != 1:
            raise NotImplementedError("item assignment needs a storage of ndim 1")
        # A rewritten row is a new generation of it: an update of the latest
        # sample's index then took its rows for overwritten and skipped them, where
        # TorchRL applies it (`rb[s["index"]] = s`, then the sample's priorities).
        self._last = None
        if isinstance(index, tuple) and len(index) == 1:
            self[index[0]] = value
            return
        if isinstance(index, (str, tuple)):
            out = native.read_all_in_order()
            stored = self._layout.rows(out, (len(out["index"]),), CPU)
            stored[index] = value
            self._native_to_write(stored, 1).write_at(out["index"], self._layout.arrays(stored))
            return
        positions, shape = self._rows_at(index)
        if self._transform_modules:
            with _set_dispatch_td_nn_modules(is_tensor_collection(value)):
                value = self._transform.inv(value)
        value = self._broadcast(value, shape)
        n, dims = len(positions), len(shape)

        def flat(x: Any) -> Any:
            batch = tuple(x.batch_size if is_tensor_collection(x) else x.shape)[:dims]
            if batch != shape:
                raise ReplayBufferValueError(
                    f"the index names positions of shape {list(shape)}; the data's rows "
                    f"are of shape {list(batch)}"
                )
            return x.reshape(n) if is_tensor_collection(x) else x.reshape((n,) + x.shape[dims:])

        value = _each_tensor(value, flat)
        self._native_to_write(value, 1).write_at(positions, self._layout.arrays(value))

    def _broadcast(self, value: Any, shape: Tuple[int, ...]) -> Any:
        """``value`` broadcast to rows of ``shape``, as assigning into a tensor
        broadcasts: one TensorDict row to many, a number or a smaller tensor to a
        field's rows (where the data has the structure first written)."""
        # Data that does not broadcast is left as it is, for the check of its rows'
        # shape to refuse by name.
        if is_tensor_collection(value):
            if tuple(value.batch_size) == shape:
                return value
            try:
                return value.expand(*shape)
            except RuntimeError:
                return value
        fields = self._layout.fields
        leaves, treespec = _pytree.tree_flatten(value)
        if treespec != getattr(self._layout, "treespec", treespec) or len(leaves) != len(fields):
            return value
        try:
            out = [
                torch.broadcast_to(torch.as_tensor(x, dtype=f.dtype), shape + tuple(f.shape))
                for x, f in zip(leaves, fields)
            ]
        except (RuntimeError, TypeError, ValueError):
            return value
        return _pytree.tree_unflatten(out, treespec)

    def read_all_in_order(self, end: Optional[int] = None) -> Any:
        """The first ``end`` stored rows (every one when None), in storage order:
        ``rb[:end]``."""
        return self[:] if end is None else self[:end]

    def write_all(self, data: Any, end: Optional[int] = None) -> None:
        """Overwrites positions ``0..end`` with the first ``end`` rows of ``data``, in
        storage order (``rb[:end] = data``; ``end`` defaults to every row of
        ``data``)."""
        if self._storage.ndim != 1:
            raise NotImplementedError("write_all needs a storage of ndim 1")
        if self._transform_modules:
            with _set_dispatch_td_nn_modules(is_tensor_collection(data)):
                data = self._transform.inv(data)
        self._last = None  # as for `rb[index] = data`
        self._native_to_write(data, 1).write_all(self._layout.arrays(data), end)

    def empty(self, empty_write_count: bool = True) -> None:
        """Drops every row; ``write_count`` too unless ``empty_write_count=False``."""
        if isinstance(self._writer, ImmutableDatasetWriter):
            raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
        kept = 0 if empty_write_count else self.write_count
        with self._build_lock:
            if self._native is not None:
                self._renew_native()
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

    def insert_transform(self, index: int, transform: Any, *, invert: bool = False) -> ReplayBuffer:
        """Inserts a transform at ``index`` of the chain (see :meth:`append_transform`)."""
        transform.eval()
        if invert:
            transform = _InvertTransform(transform)
        self._transform.insert(index, transform)
        return self

    # ----------------------------------------------------------------- persistence

    def register_save_hook(self, hook: Callable[..., Any]) -> None:
        """Registers ``hook(data, path=...)``, which :meth:`dumps` calls with the stored
        rows in storage order; hooks chain, and a TensorDict the last returns is
        memory-mapped at ``path`` (``<dir>/storage``) beside the checkpoint."""
        self._save_hooks.append(hook)

    def register_load_hook(self, hook: Callable[..., Any]) -> None:
        """Registers ``hook(data, out=None)``, which :meth:`loads` calls with the loaded
        rows; the batch the last hook returns is written back in their place."""
        self._load_hooks.append(hook)

    def dumps(self, path: Any) -> None:
        """Saves the whole buffer (rows, priorities, sampler and random state, the
        transforms' state) under the directory ``path``."""
        _checkpoint.dump(self, path)

    def loads(self, path: Any) -> None:
        """Loads what :meth:`dumps` saved, into a buffer of the same configuration
        (written to or not)."""
        _checkpoint.load(self, path)

    save = dumps
    dump = dumps
    load = loads

    def state_dict(self) -> Dict[str, Any]:
        """The buffer's whole state (the files :meth:`dumps` writes, as bytes)."""
        return _checkpoint.state_dict(self)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        _checkpoint.load_state_dict(self, state_dict)

    # ----------------------------------------------------------------- swaps

    def set_sampler(self, sampler: Sampler) -> Sampler:
        """Puts ``sampler`` in and returns the previous one (TorchRL's). The stored
        rows stay, drawn by the new sampler: a prioritized one keeps the priorities of
        a prioritized one before it, and gives the rows of another the largest
        priority seen (TorchRL's new sampler starts without them)."""
        if not isinstance(sampler, Sampler):
            raise TypeError(f"expected a replaybuf.torchrl sampler, got {type(sampler).__name__}")
        if self._batch_size is None and getattr(sampler, "drop_last", False):
            raise ValueError(
                "Samplers with drop_last=True must work with a predictable batch-size. "
                "Please pass the batch-size to the ReplayBuffer constructor."
            )
        with self._build_lock:
            native = self._native
            if native is not None:
                keys = [f.key for f in self._layout.fields]
                with self._count_kept():
                    native.reconfigure(sampler=sampler._describe_for(keys))
                sampler._native = native
                envs = self._envs if self._storage.ndim == 2 else 0
                self._plan = SamplePlan(sampler, self._layout, envs)
            prev, self._sampler = self._sampler, sampler
            prev._native, prev._rb = None, None
            sampler._rb = weakref.ref(self)
            self._last = None
        return prev

    def set_writer(self, writer: Writer) -> Writer:
        """Puts ``writer`` in and returns the previous one (TorchRL's); the stored rows
        stay."""
        if not isinstance(writer, Writer):
            raise TypeError(f"expected a replaybuf.torchrl writer, got {type(writer).__name__}")
        with self._build_lock:
            native = self._native
            if native is not None:
                with self._count_kept(isinstance(writer, TensorDictMaxValueWriter)):
                    native.reconfigure(write_policy=writer._describe())
            else:
                self._counts_writes = isinstance(writer, TensorDictMaxValueWriter)
            prev, self._writer = self._writer, writer
        return prev

    def set_storage(self, storage: Storage, collate_fn: Optional[Callable] = None) -> Storage:
        """Puts ``storage`` in and returns the previous one (TorchRL's): the buffer
        then holds what the new storage holds (nothing, for a new lazy storage; a
        :class:`TensorStorage`'s rows), with fields fixed by its first write as a new
        buffer's are. ``write_count`` goes on, and ``collate_fn`` is set (``None``:
        the default)."""
        if not isinstance(storage, Storage):
            raise TypeError(f"expected a replaybuf.torchrl storage, got {type(storage).__name__}")
        if getattr(storage, "_rb", None) not in (None, self):
            raise ValueError("this storage belongs to another replay buffer")
        count = self.write_count
        self._unmake_native()
        prev, self._storage = self._storage, storage
        prev._rb = None
        storage._rb = self
        self._collate_fn = collate_fn
        self._dim_extend = storage.ndim - 1
        self._write_count_base = count
        self._last = None
        if isinstance(storage, TensorStorage):
            self._fill(storage._initial)
            # Its rows were there from the start, written by no writer.
            self._write_count_base -= self.write_count - count
        return prev

    @contextlib.contextmanager
    def _count_kept(self, counts_writes: Optional[bool] = None) -> Iterator[None]:
        """Keeps ``write_count`` across a swap of the engine buffer (whose own count
        starts again from the rows a copy carries), with a max-value writer's way of
        counting if ``counts_writes`` says so (None: as now)."""
        count = self.write_count
        yield
        if counts_writes is not None:
            self._counts_writes = counts_writes
        if self._counts_writes:
            self._write_count_base = count
        else:
            self._write_count_base = count - self._native.write_count // self._envs

    # ----------------------------------------------------------------- attributes

    def set_rng(self, generator: torch.Generator) -> None:
        """Seeds the buffer's draws from ``generator`` (takes effect when the engine
        buffer is made, on the first write)."""
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
    """A :class:`ReplayBuffer` with a :class:`~replaybuf.torchrl.PrioritizedSampler` of
    ``alpha``, ``beta`` and ``eps`` (TorchRL's ``PrioritizedReplayBuffer``);
    ``sample(..., return_info=True)`` gives the index to update priorities with."""

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
        storage = component(storage, default_storage, Storage, "storage")
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
