"""A buffer's ``dumps``/``loads``: the engine's checkpoint plus what the face adds.

A checkpoint directory holds the engine's files (rows, priorities, sampler and random
state; crash-safe and checksummed), ``torchrl.json`` (the fields as the first write
fixed them, so an unwritten buffer can be rebuilt before loading, and the face's
counters), ``transform.t`` when the transforms have state, and ``storage/`` when save
hooks returned a TensorDict. The state of a buffer never written to holds no engine
files and no fields (``state_dict`` only: ``dumps`` refuses such a buffer, as TorchRL's
does).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch
from tensordict import is_tensor_collection

from ._layout import layout_from_json
from .writers import ImmutableDatasetWriter

FACE_FILE = "torchrl.json"
TRANSFORM_FILE = "transform.t"
SAVE_HOOK_DIR = "storage"


def _run_save_hooks(rb: Any, path: Path) -> None:
    """Each hook gets the stored rows (in storage order) and ``path``, as TorchRL's
    checkpointers call them; a TensorDict the last returns is memory-mapped there."""
    data = rb._read(slice(None))
    native = rb._native
    for hook in rb._save_hooks:
        if hasattr(hook, "is_full"):
            hook.is_full = len(native) == native.capacity
        if hasattr(hook, "shift"):
            hook.shift = native.write_count % native.capacity
        data = hook(data, path=path)
    if is_tensor_collection(data):
        data.memmap(path, copy_existing=True)


def dump(rb: Any, path: Any) -> None:
    path = Path(path).absolute()
    path.mkdir(exist_ok=True)
    if rb._native is None:
        raise RuntimeError("Cannot save a non-initialized storage.")
    if rb._save_hooks:
        _run_save_hooks(rb, path / SAVE_HOOK_DIR)
    rb._native.dumps(path)
    _dump_face(rb, path, rb._layout.to_json(), rb._envs)


def _dump_face(rb: Any, path: Path, layout: Any, envs: int) -> None:
    face = {
        "layout": layout,
        "envs": envs,
        "batch_size": rb._batch_size,
        "write_count_base": rb._write_count_base,
    }
    (path / FACE_FILE).write_text(json.dumps(face))
    transform_state = rb._transform.state_dict()
    if transform_state:
        torch.save(transform_state, path / TRANSFORM_FILE)


def _dump_unwritten(rb: Any, path: Path) -> None:
    """The state of a buffer never written to: no rows and no fields (no layout),
    only what the face keeps (TorchRL saves such a buffer's state too, e.g. for a
    checkpoint taken before the first collection)."""
    _dump_face(rb, path, None, 1)


def _load_unwritten(rb: Any, path: Path, face: Dict[str, Any]) -> None:
    """Leaves ``rb`` as :func:`_dump_unwritten` found its buffer: without rows, and
    with its fields fixed by the next write (TorchRL's loaded storage is not
    initialized either)."""
    if isinstance(rb._writer, ImmutableDatasetWriter):
        raise RuntimeError(ImmutableDatasetWriter.WRITING_ERR)
    if rb._native is not None:
        rb._unmake_native()
    if (path / TRANSFORM_FILE).exists():
        rb._transform.load_state_dict(torch.load(path / TRANSFORM_FILE))
    rb._batch_size = face["batch_size"]
    rb._write_count_base = face["write_count_base"]
    rb._last = None
    rb._sampler.ran_out = False


def load(rb: Any, path: Any) -> None:
    path = Path(path).absolute()
    face = json.loads((path / FACE_FILE).read_text())
    if face["layout"] is None:
        _load_unwritten(rb, path, face)
        return
    made = rb._ensure_native_for(layout_from_json(json.dumps(face["layout"])), face["envs"])
    try:
        rb._native.loads(path)
    except BaseException:
        # The engine leaves its own buffer as it was; the one made here for the
        # checkpoint's fields goes too, so a buffer never written stays unwritten.
        if made:
            rb._unmake_native()
        raise
    if (path / TRANSFORM_FILE).exists():
        rb._transform.load_state_dict(torch.load(path / TRANSFORM_FILE))
    rb._batch_size = face["batch_size"]
    rb._write_count_base = face.get("write_count_base", 0)
    rb._last = None
    if hasattr(rb._sampler, "_alpha") and rb._native.alpha is not None:
        # The engine took the checkpoint's alpha and beta: the sampler says so too (a
        # beta annealed from its own went on from the value it was built with, and
        # wrote that over the loaded one).
        rb._sampler._alpha, rb._sampler._beta = rb._native.alpha, rb._native.beta
    if rb._load_hooks:
        data = rb._read(slice(None))
        for hook in rb._load_hooks:
            data = hook(data, out=None)
        if data is not None:
            rb._native.write_all(rb._layout.arrays(data))


def state_dict(rb: Any) -> Dict[str, Any]:
    """The files of a :func:`dump`, as ``uint8`` tensors by relative path.

    Tensors, not ``bytes``: ``torch.load``'s default (``weights_only=True``, since torch
    2.6, and TorchRL's ``Trainer.load_from_file``) refuses to unpickle ``bytes``, and a
    checkpoint holding the buffer's state could not be loaded back.
    """
    with tempfile.TemporaryDirectory(prefix="replaybuf-state-") as d:
        if rb._native is None:
            _dump_unwritten(rb, Path(d))
        else:
            dump(rb, d)
        files = {}
        for root, _, names in os.walk(d):
            for name in names:
                full = os.path.join(root, name)
                files[os.path.relpath(full, d)] = torch.from_numpy(
                    np.fromfile(full, dtype=np.uint8)
                )
    return {"replaybuf_checkpoint": files}


def load_state_dict(rb: Any, state: Dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="replaybuf-state-") as d:
        for name, data in state["replaybuf_checkpoint"].items():
            full = Path(d, name)
            full.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(data, torch.Tensor):
                data.detach().cpu().contiguous().view(torch.uint8).numpy().tofile(full)
            else:
                # A state dict of an earlier version: the files as bytes.
                full.write_bytes(data)
        load(rb, d)
