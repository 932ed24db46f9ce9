"""Storages: where a buffer's rows live and how many it holds.

Each is a description the buffer reads when it makes its engine buffer (on the first
write): the capacity (``max_size``), the number of batch dimensions a row is indexed by
(``ndim``), the device samples are handed out on, and for
:class:`LazyMemmapStorage` the directory the rows are kept in. The rows themselves live
in replaybuf's engine, never in tensors owned by the storage object.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref
from typing import Any, Optional, Union

import torch

from .._config import Frames

__all__ = ["Storage", "TensorStorage", "LazyTensorStorage", "LazyMemmapStorage"]

DeviceLike = Union[torch.device, str, None]


class Storage:
    """Base of the storages: ``max_size`` rows of ``ndim`` batch dimensions.

    ``frames`` (a :class:`replaybuf.Frames`, replaybuf only): frame stacks and
    ``next_of`` fields stored once a step, keys as the data names them (nested keys as
    tuples). Episodes end where ``("next", "done")`` and ``("next", "truncated")`` say,
    as in TorchRL's rollouts, unless the frames name other fields.
    """

    def __init__(
        self,
        max_size: int,
        *,
        device: DeviceLike = "cpu",
        ndim: int = 1,
        frames: Optional[Frames] = None,
    ) -> None:
        if ndim not in (1, 2):
            raise ValueError(f"replaybuf storages have ndim 1 or 2, got {ndim}")
        if frames is not None and not isinstance(frames, Frames):
            raise TypeError(f"frames: expected a replaybuf.Frames, got {type(frames).__name__}")
        self.max_size = int(max_size)
        self.ndim = ndim
        self.frames = frames
        self.device = device if device in (None, "auto") else torch.device(device)
        # The buffer this storage serves, once it has made its engine buffer.
        self._rb: Any = None

    def __len__(self) -> int:
        native = None if self._rb is None else self._rb._native
        return 0 if native is None else len(native)

    def _native_kwargs(self) -> dict:
        """Constructor arguments of the engine buffer that this storage decides."""
        return {}

    def _release(self) -> None:
        """Frees what the (dropped) engine buffer kept, so a fresh one can be made."""

    def _output_device(self, data: Any) -> Optional[torch.device]:
        """The device samples are handed out on (None: CPU, where they are made)."""
        device = self.device
        if device == "auto" or device is None:
            device = getattr(data, "device", None)
            if device is None and isinstance(data, torch.Tensor):
                device = data.device
        if device is None:
            return None
        device = torch.device(device)
        return None if device.type == "cpu" else device

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_size={self.max_size}, ndim={self.ndim}, len={len(self)})"


class TensorStorage(Storage):
    """A storage filled from the start with ``storage`` (a TensorDict or tensor whose
    leading ``ndim`` dimensions index the rows), as TorchRL's datasets build theirs.
    ``max_size`` defaults to the number of rows given."""

    def __init__(
        self,
        storage: Any,
        max_size: Optional[int] = None,
        *,
        device: DeviceLike = "cpu",
        ndim: int = 1,
        compilable: bool = False,
        frames: Optional[Frames] = None,
    ) -> None:
        rows = storage.shape[:ndim].numel() if hasattr(storage.shape, "numel") else None
        max_size = rows if max_size is None else max_size
        super().__init__(max_size, device=device, ndim=ndim, frames=frames)
        self._initial = storage


class LazyTensorStorage(Storage):
    """Rows kept in memory, allocated when the first data arrives; the fields (keys,
    dtypes, shapes) are taken from that data with its ``ndim`` leading batch
    dimensions stripped.

    ``device``: where sampled batches are handed out (``"auto"``: the device of the
    first data). Rows are stored in host memory either way.
    """

    def __init__(
        self,
        max_size: int,
        *,
        device: DeviceLike = "cpu",
        ndim: int = 1,
        compilable: bool = False,
        consolidated: bool = False,
        shared_init: bool = False,
        cleanup_memmap: bool = True,
        frames: Optional[Frames] = None,
    ) -> None:
        super().__init__(max_size, device=device, ndim=ndim, frames=frames)


class LazyMemmapStorage(LazyTensorStorage):
    """Rows kept in a file under ``scratch_dir`` (a fresh temporary directory when
    None, removed with the buffer), allocated when the first data arrives.

    ``existsok``: open a directory that already holds a buffer instead of refusing it.
    """

    def __init__(
        self,
        max_size: int,
        *,
        scratch_dir: Any = None,
        device: DeviceLike = "cpu",
        ndim: int = 1,
        existsok: bool = False,
        compilable: bool = False,
        shared_init: bool = False,
        auto_cleanup: Optional[bool] = None,
        frames: Optional[Frames] = None,
    ) -> None:
        super().__init__(max_size, device=device, ndim=ndim, frames=frames)
        if self.device not in (None, "auto") and self.device.type != "cpu":
            raise ValueError(
                "Memory map device other than CPU isn't supported. To cast your data to "
                "the desired device, use `buffer.append_transform(lambda x: x.to(device))`"
            )
        self.scratch_dir = None if scratch_dir is None else str(scratch_dir)
        self.existsok = existsok
        self._auto_cleanup = scratch_dir is None if auto_cleanup is None else auto_cleanup
        # What the directory held before the engine buffer was made in it.
        self._before: Optional[set] = None

    # The face's record of the rows' fields, beside the engine's files: a buffer made
    # over the directory with ``existsok`` has its rows from the start (it had none
    # until its first write, which then brought the old rows back beside the new).
    _LAYOUT_FILE = "torchrl-layout.json"

    def _remember(self, layout: dict, envs: int) -> None:
        if self.scratch_dir is not None and os.path.isdir(self.scratch_dir):
            path = os.path.join(self.scratch_dir, self._LAYOUT_FILE)
            with open(path, "w") as f:
                json.dump({"layout": layout, "envs": envs}, f)

    def _remembered(self) -> Optional[dict]:
        """The fields of the rows an earlier buffer left in the directory, if this one
        opens them (``existsok``)."""
        if not self.existsok or self.scratch_dir is None:
            return None
        try:
            with open(os.path.join(self.scratch_dir, self._LAYOUT_FILE)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _native_kwargs(self) -> dict:
        directory = self.scratch_dir
        if directory is None:
            directory = self.scratch_dir = tempfile.mkdtemp(prefix="replaybuf-memmap-")
        if self._auto_cleanup and self._before is None:
            weakref.finalize(self, shutil.rmtree, directory, True)
        self._before = set(os.listdir(directory)) if os.path.isdir(directory) else set()
        return {"memmap": directory, "existsok": self.existsok}

    def _forget_rows(self) -> None:
        """Removes the engine buffer's files, where it reopened them (``existsok``
        over a directory an earlier buffer wrote): an ``empty`` that renewed the
        engine buffer reopened them, rows and all."""
        directory = self.scratch_dir
        if directory is None or self._before is None:
            return
        for name in ("meta.json", "storage.bin"):
            if name in self._before:
                try:
                    os.unlink(os.path.join(directory, name))
                except FileNotFoundError:
                    pass

    def _release(self) -> None:
        """Removes the files the engine buffer made in the directory (and only
        those)."""
        directory = self.scratch_dir
        if directory is None or self._before is None or not os.path.isdir(directory):
            return
        for name in set(os.listdir(directory)) - self._before:
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
