"""Rows between TorchRL's data and the engine's dicts of numpy arrays.

A buffer's fields are fixed by the first data written to it: a :class:`TensorDictLayout`
for TensorDicts (one field per leaf, nested keys as tuples), a :class:`TreeLayout` for a
tensor or a pytree of tensors (dicts, tuples, lists). A layout turns written data into
the arrays the engine copies (``arrays``) and sampled arrays back into data of the same
structure (``rows``), and writes itself to JSON so a checkpoint can rebuild it.

Tensors cross without a copy where they can: a contiguous CPU tensor is handed to the
engine as ``tensor.numpy()``, and a sampled array becomes a tensor with
``torch.from_numpy``. numpy has no bfloat16, so a bfloat16 field crosses as its raw bits
(``uint16``) and is viewed back.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_non_tensor, is_tensorclass
from torch.utils import _pytree

Key = Union[str, Tuple[str, ...]]

# The engine's sample dict names its own entries "index", "generation", "weight" and
# "marks"; a top-level field of one of those names is stored under this prefix.
NATIVE_META_NAMES = frozenset({"index", "generation", "weight", "marks"})
ESCAPE_PREFIX = "__replaybuf__"

_CPU = torch.device("cpu")

_NUMPY_OF_TORCH = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint16: "uint16",
    torch.uint32: "uint32",
    torch.uint64: "uint64",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bfloat16: "bfloat16",
}
_TORCH_OF_NAME = {str(dtype): dtype for dtype in _NUMPY_OF_TORCH}


def to_array(value: Any) -> np.ndarray:
    """A C-contiguous CPU numpy view of a tensor (a copy only when it must move)."""
    if not isinstance(value, torch.Tensor):
        value = torch.as_tensor(value)
    if value.requires_grad:
        value = value.detach()
    if not value.is_cpu:
        value = value.cpu()
    if value.dtype is torch.bfloat16:
        value = value.view(torch.uint16)
    return value.contiguous().numpy()


def _non_tensor_entry(td: TensorDictBase, prefix: Tuple[str, ...] = ()) -> Optional[Key]:
    """The first entry of ``td`` holding non-tensor data (``NonTensorData``,
    ``NonTensorStack``), if any: a walk over its leaves passes them by, so without
    this look they were dropped without a word. A TensorDict's own entries are read
    directly (a microsecond a write); other kinds through their items."""
    entries = getattr(td, "_tensordict", None)
    if not isinstance(entries, dict):
        for key, value in td.items(include_nested=True, leaves_only=False):
            if is_non_tensor(value):
                return key
        return None
    for name, value in entries.items():
        if type(value) is torch.Tensor:
            continue
        key = prefix + (name,)
        if is_non_tensor(value):
            return key[0] if len(key) == 1 else key
        if isinstance(value, TensorDictBase):
            found = _non_tensor_entry(value, key)
            if found is not None:
                return found
    return None


def _refuse_non_tensor(td: TensorDictBase, skip: Sequence[Key]) -> None:
    key = _non_tensor_entry(td)
    if key is not None and key not in skip:
        raise TypeError(
            f"`{key}` holds non-tensor data ({type(td.get(key)).__name__}): replaybuf "
            "stores tensors only"
        )


def native_key(key: Key) -> Key:
    """The engine's name for a field: the key itself unless it clashes with the
    entries the engine adds to a sample."""
    if isinstance(key, str) and key in NATIVE_META_NAMES:
        return (ESCAPE_PREFIX, key)
    return key


def _key_to_json(key: Key) -> Union[str, List[str]]:
    return key if isinstance(key, str) else list(key)


def _key_from_json(key: Union[str, List[str]]) -> Key:
    return key if isinstance(key, str) else tuple(key)


class Field:
    """One stored leaf: where it lives in the data, its engine name, dtype and shape."""

    __slots__ = ("key", "native", "dtype", "shape")

    def __init__(self, key: Any, native: Key, dtype: torch.dtype, shape: Tuple[int, ...]):
        if dtype not in _NUMPY_OF_TORCH:
            raise TypeError(
                f"`{key}` has dtype {dtype}, which replaybuf cannot store: use bool, an "
                "integer type, float16/32/64 or bfloat16"
            )
        self.key = key
        self.native = native
        self.dtype = dtype
        self.shape = tuple(shape)

    def spec(self) -> Tuple[str, Tuple[int, ...]]:
        return (_NUMPY_OF_TORCH[self.dtype], self.shape)

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(array)
        return t.view(torch.bfloat16) if self.dtype is torch.bfloat16 else t


try:
    from tensordict._td import _StringOnlyDict
except ImportError:  # another tensordict: its own constructor, slower
    _StringOnlyDict = None


def tensordict_of(src: dict, batch_size: torch.Size, device: Optional[torch.device]) -> TensorDict:
    """A TensorDict holding ``src``'s tensors as they are (no checks, no copies):
    what ``TensorDict._new_unsafe`` does, without its compile check and arguments,
    which cost as much as the rest of a sample's decoding."""
    if _StringOnlyDict is None:
        td = TensorDict._new_unsafe(src, batch_size=batch_size, nested=False)
        td._device = device
        return td
    td = _NEW_TENSORDICT(TensorDict)
    td._tensordict = _StringOnlyDict(src)
    td._batch_size = batch_size
    td._device = device
    td._td_dim_names = None
    return td


_NEW_TENSORDICT = TensorDict.__new__


def _path_of(key: Key) -> Tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


class TensorDictLayout:
    """The fields of TensorDict data: one per leaf, plus the batch dimensions of the
    root and of every nested TensorDict beyond the storage's own (a stored row may be
    a whole trajectory, ``[T]``)."""

    kind = "tensordict"

    def __init__(
        self,
        fields: Sequence[Field],
        extra_dims: Dict[Tuple[str, ...], Tuple[int, ...]],
        skip: Sequence[Key] = (),
    ):
        self.fields = list(fields)
        # Batch dims beyond the storage's, by nested prefix (() for the root).
        self.extra_dims = dict(extra_dims)
        self.skip = frozenset(skip)
        # The tensorclass the rows were written as, read back as (None: TensorDicts).
        # Kept in memory only: a buffer loaded from disk reads TensorDicts.
        self.tensorclass: Optional[type] = None
        self._native_of = {f.key: f.native for f in self.fields}
        self._field_of_native = {f.native: f for f in self.fields}
        # Nested TensorDicts, parents before children, and the leaves by parent.
        prefixes = sorted((p for p in self.extra_dims if p), key=len)
        self._prefixes = prefixes
        self._leaves = [
            (f.native, _path_of(f.key)[:-1], _path_of(f.key)[-1], f) for f in self.fields
        ]
        self._root_extra = tuple(self.extra_dims.get((), ()))
        # Without nesting, fields go straight into the root: by engine name and
        # name, bfloat16 ones apart (they are viewed back from their raw bits).
        self._flat = not prefixes
        self._plain = [(f.native, f.key) for f in self.fields if f.dtype is not torch.bfloat16]
        self._bfloat16 = [(f.native, f.key) for f in self.fields if f.dtype is torch.bfloat16]

    @classmethod
    def of(cls, td: Any, batch_dims: int, skip: Sequence[Key] = ()) -> TensorDictLayout:
        if is_tensorclass(td):
            layout = cls.of(td._tensordict, batch_dims, skip)
            layout.tensorclass = type(td)
            return layout
        _refuse_non_tensor(td, skip)
        fields = []
        for key, value in td.items(include_nested=True, leaves_only=True):
            if key in skip:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"`{key}` holds a {type(value).__name__}: replaybuf stores tensors only"
                )
            fields.append(Field(key, native_key(key), value.dtype, tuple(value.shape[batch_dims:])))
        if not fields:
            raise ValueError("the data holds no tensor to store")
        extra = {(): tuple(td.batch_size[batch_dims:])}
        for key, value in td.items(include_nested=True, leaves_only=False):
            if isinstance(value, TensorDictBase) and key not in skip:
                extra[_path_of(key)] = tuple(value.batch_size[batch_dims:])
        return cls(fields, extra, skip)

    def spec(self) -> Dict[Key, Tuple[str, Tuple[int, ...]]]:
        return {f.native: f.spec() for f in self.fields}

    def field_of(self, key: Key) -> Optional[Field]:
        """The field stored for a data key, if any."""
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        native = self._native_of.get(key)
        return None if native is None else self._field_of_native[native]

    def arrays(self, td: Any) -> Dict[Key, np.ndarray]:
        if is_tensorclass(td):
            td = td._tensordict
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"this buffer holds TensorDicts; got a {type(td).__name__}")
        _refuse_non_tensor(td, self.skip)
        out = {}
        native_of = self._native_of
        for key, value in td.items(True, True):
            native = native_of.get(key)
            if native is None:
                # A prioritized sample's weights, written back with its rows (as TorchRL
                # takes them), unless the data had a field of that name.
                if key in self.skip or key == "priority_weight":
                    continue
                raise KeyError(
                    f"`{key}` was not in the first data written to this buffer: its "
                    f"fields are fixed then ({sorted(map(str, native_of))})"
                )
            out[native] = to_array(value)
        return out

    def rows(
        self,
        arrays: Dict[Key, np.ndarray],
        batch: Tuple[int, ...],
        device: Optional[torch.device],
        extra: Optional[Dict[Key, torch.Tensor]] = None,
        extra_nested: bool = False,
    ) -> Any:
        """A TensorDict of batch ``batch`` from sampled arrays, with ``extra`` entries
        (index, weights, slice flags; ``extra_nested`` when some key is a tuple) set
        beside the fields; of the tensorclass the rows were written as, if any."""
        td = self._tensordict_rows(arrays, batch, device, extra, extra_nested)
        return td if self.tensorclass is None else self.tensorclass.from_tensordict(td)

    def _tensordict_rows(
        self,
        arrays: Dict[Key, np.ndarray],
        batch: Tuple[int, ...],
        device: Optional[torch.device],
        extra: Optional[Dict[Key, torch.Tensor]],
        extra_nested: bool,
    ) -> TensorDictBase:
        root_batch = torch.Size(batch + self._root_extra)
        if self._flat and not extra_nested:
            from_numpy = torch.from_numpy
            src = {name: from_numpy(arrays[native]) for native, name in self._plain}
            for native, name in self._bfloat16:
                src[name] = from_numpy(arrays[native]).view(torch.bfloat16)
            if extra:
                src.update(extra)
            return tensordict_of(src, root_batch, device)
        dicts: Dict[Tuple[str, ...], dict] = {(): {}}
        for prefix in self._prefixes:
            dicts[prefix] = {}
        for native, parent, name, f in self._leaves:
            dicts[parent][name] = f.tensor(arrays[native])
        if extra:
            for key, value in extra.items():
                path = _path_of(key)
                for i in range(1, len(path)):
                    dicts.setdefault(path[:i], {})
                dicts[path[:-1]][path[-1]] = value
        for prefix in sorted((p for p in dicts if p), key=len, reverse=True):
            sub_batch = torch.Size(batch + self.extra_dims.get(prefix, self._root_extra))
            dicts[prefix[:-1]][prefix[-1]] = tensordict_of(dicts[prefix], sub_batch, device)
        return tensordict_of(dicts[()], root_batch, device)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "fields": [
                {"key": _key_to_json(f.key), "dtype": str(f.dtype), "shape": list(f.shape)}
                for f in self.fields
            ],
            "extra_dims": [[list(p), list(d)] for p, d in self.extra_dims.items()],
            "skip": [_key_to_json(k) for k in self.skip],
        }

    @classmethod
    def from_json(cls, d: dict) -> TensorDictLayout:
        fields = []
        for f in d["fields"]:
            key = _key_from_json(f["key"])
            fields.append(
                Field(key, native_key(key), _TORCH_OF_NAME[f["dtype"]], tuple(f["shape"]))
            )
        extra = {tuple(p): tuple(dims) for p, dims in d["extra_dims"]}
        return cls(fields, extra, [_key_from_json(k) for k in d["skip"]])


class TreeLayout:
    """The fields of a tensor or a pytree of tensors: one per leaf, in
    ``torch.utils._pytree`` order."""

    kind = "tree"

    def __init__(self, fields: Sequence[Field], treespec: Any):
        self.fields = list(fields)
        self.treespec = treespec

    @classmethod
    def of(cls, data: Any, batch_dims: int) -> TreeLayout:
        leaves, treespec = _pytree.tree_flatten(data)
        if not leaves:
            raise ValueError("the data holds no tensor to store")
        fields = []
        for i, leaf in enumerate(leaves):
            leaf = torch.as_tensor(leaf)
            fields.append(Field(i, str(i), leaf.dtype, tuple(leaf.shape[batch_dims:])))
        return cls(fields, treespec)

    def spec(self) -> Dict[Key, Tuple[str, Tuple[int, ...]]]:
        return {f.native: f.spec() for f in self.fields}

    def field_of(self, key: Key) -> Optional[Field]:
        return None

    def arrays(self, data: Any) -> Dict[Key, np.ndarray]:
        if isinstance(data, torch.Tensor) and len(self.fields) == 1:
            return {"0": to_array(data)}
        leaves, treespec = _pytree.tree_flatten(data)
        if treespec != self.treespec:
            # The same structure with a dict's keys in another order, which TorchRL's
            # storages take key by key (pytree's `flatten_up_to`): its leaves in the
            # first structure's order.
            try:
                leaves = self.treespec.flatten_up_to(data)
            except (ValueError, TypeError):
                leaves = None
            if leaves is None or not all(_pytree.tree_flatten(x)[1].is_leaf() for x in leaves):
                raise ValueError(
                    f"the data's structure {treespec} is not the structure first written "
                    f"to this buffer ({self.treespec})"
                )
        return {f.native: to_array(leaf) for f, leaf in zip(self.fields, leaves)}

    def rows(
        self,
        arrays: Dict[Key, np.ndarray],
        batch: Tuple[int, ...],
        device: Optional[torch.device],
        extra: Optional[Dict[Key, torch.Tensor]] = None,
    ) -> Any:
        leaves = [f.tensor(arrays[f.native]) for f in self.fields]
        return _pytree.tree_unflatten(leaves, self.treespec)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "fields": [{"dtype": str(f.dtype), "shape": list(f.shape)} for f in self.fields],
            "treespec": _pytree.treespec_dumps(self.treespec),
        }

    @classmethod
    def from_json(cls, d: dict) -> TreeLayout:
        fields = [
            Field(i, str(i), _TORCH_OF_NAME[f["dtype"]], tuple(f["shape"]))
            for i, f in enumerate(d["fields"])
        ]
        return cls(fields, _pytree.treespec_loads(d["treespec"]))


Layout = Union[TensorDictLayout, TreeLayout]


def layout_from_json(text: str) -> Layout:
    d = json.loads(text)
    return TensorDictLayout.from_json(d) if d["kind"] == "tensordict" else TreeLayout.from_json(d)
