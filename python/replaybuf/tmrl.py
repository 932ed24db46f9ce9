"""tmrl's ``Memory`` over replaybuf's engine.

A drop-in for the memory class a tmrl trainer takes (``tmrl.memory.Memory``, as
``GenericTorchMemory`` implements it): the same constructor arguments, ``append`` /
``append_buffer`` of a rollout worker's buffer, ``get_transition``, ``__getitem__``,
``sample``, ``collate``, ``nb_steps`` batches per pass of ``for batch in memory``.

>>> import numpy as np
>>> from replaybuf.tmrl import Memory
>>> memory = Memory(device="cpu", nb_steps=1, memory_size=1000, batch_size=2)
>>> # A rollout worker's samples: (act, new_obs, rew, terminated, truncated, info).
>>> samples = [(np.zeros(2, np.float32), np.full(3, t, np.float32), 1.0, t == 3, False, {})
...            for t in range(4)]
>>> memory.append(samples)
>>> len(memory)                       # t=0 is the reset observation: 3 transitions
3
>>> prev_obs, act, rew, new_obs, terminated, truncated = memory.sample()
>>> tuple(prev_obs.shape)
(2, 3)

How it differs from tmrl's own memories:

- Samples are paired into transitions as they arrive (each sample with the one before
  it, never across an episode's end, linking a buffer to the next), so every stored
  item is a valid transition: ``len(memory)`` counts transitions, and no item is
  redrawn. ``memory_size`` bounds the transitions kept; the oldest are evicted.
- An observation and an action are each one array (of a fixed dtype and shape, taken
  from the first sample appended unless ``obs=``/``act=`` give them); tmrl's tuple
  observations are refused. The reward is stored as ``float32``, the flags as bool;
  ``info`` is not stored (``get_transition`` returns ``{}`` for it), so ``crc_debug``
  is not supported.
- ``sample`` and ``collate`` give all six tensors as ``float32`` (tmrl keeps the
  observation's dtype). They are torch tensors on ``device`` when torch is importable,
  numpy arrays otherwise.
- ``dataset_path`` names a replaybuf dataset (a directory ``save`` or a
  ``ReplayBuffer``'s ``dumps`` wrote, or a file-backed memory's ``memmap`` directory,
  reopened in place); a missing or empty directory starts an empty memory, as tmrl
  does without ``data.pkl``. Its draws start from ``seed`` (random without one), and
  the next buffer appended starts a new episode (a dataset keeps no link).
- The flags may come as bools or as 0/1 numbers. A memory pickles (tmrl's trainer
  pickles it with each checkpoint) with every transition, and unpickles into memory
  (a ``memmap`` memory too), linking the next buffer as the original would.
"""

from __future__ import annotations

import logging
import operator
import os
import pathlib
import random
import secrets
import tempfile
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ._native import ReplayBufferValueError, TmrlMemory

try:  # torch is optional: without it, batches are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised only where torch is absent
    torch = None

__all__ = ["Memory"]

_log = logging.getLogger(__name__)

Transition = Tuple[Any, Any, Any, Any, Any, Any]

# What a subclass overrides to change the items ``sample`` draws (tmrl's ``sample``
# draws ``self[i]`` for ``i`` in ``sample_indices()``).
_ITEM_METHODS = ("get_transition", "__getitem__", "sample_indices")

# The columns a collector's buffer holds, in tmrl's sample order (info aside).
_SAMPLE_COLUMNS = ("act", "obs", "rew", "terminated", "truncated")


def _exactly(key: str, array: np.ndarray, target: np.dtype) -> np.ndarray:
    """``array`` as ``target``, refused where a value would not survive: an integer
    outside the field's range (300 into int8 was stored as 44, uint8 200 into int8 as
    -56), or a float beyond it (1e6 into float16 was stored as inf), as the numpy face
    refuses them."""
    out = np.ascontiguousarray(array, dtype=target)
    if array.dtype == target or array.size == 0:
        return out
    integers = np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_
    if np.issubdtype(target, np.integer) and integers:
        # Against the range, in Python's integers: a cast between one width's signed
        # and unsigned types casts back whole (uint8 200 into int8 was stored as -56).
        info = np.iinfo(target)
        kept = info.min <= int(array.min()) and int(array.max()) <= info.max
    elif np.issubdtype(target, np.integer) or target == np.bool_:
        kept = np.array_equal(out.astype(array.dtype), array)
    else:
        with np.errstate(invalid="ignore"):
            kept = bool(np.all(np.isfinite(out) | ~np.isfinite(array)))
    if not kept:
        raise ReplayBufferValueError(
            f"append_buffer: `{key}` holds values {target} cannot hold ({array.dtype})"
        )
    return out


def _field(value: Any, what: str) -> Tuple[np.dtype, Tuple[int, ...]]:
    """The dtype and shape of one observation or action, given as ``(dtype, shape)``
    or as an example value."""
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple):
        return np.dtype(value[0]), tuple(value[1])
    refused = TypeError(
        f"replaybuf.tmrl.Memory stores one array per {what}, got {type(value).__name__}: "
        "concatenate a tuple observation into one array"
    )
    if isinstance(value, (tuple, list)) and any(isinstance(v, np.ndarray) for v in value):
        raise refused
    try:
        array = np.asarray(value)
    except ValueError as e:  # parts of different shapes
        raise refused from e
    if array.dtype == object:
        raise refused
    return array.dtype, array.shape


Field = Tuple[np.dtype, Tuple[int, ...]]


def _dtypes_of(obs: Field, act: Field) -> dict:
    """Each sample column's stored dtype in a memory of this observation and action."""
    flag = np.dtype(np.bool_)
    return {
        "act": np.dtype(act[0]),
        "obs": np.dtype(obs[0]),
        "rew": np.dtype(np.float32),
        "terminated": flag,
        "truncated": flag,
    }


class Memory:
    """A tmrl memory: see the module docs.

    Args:
        device: where ``sample`` and ``collate`` put their tensors (torch only).
        nb_steps: batches per pass of ``for batch in memory``.
        sample_preprocessor: called as tmrl does, on each sampled transition
            ``(prev_obs, act, rew, new_obs, terminated, truncated)``, returning the
            transition to collate (e.g. data augmentation).
        memory_size: transitions kept (the oldest are evicted).
        batch_size: transitions per sampled batch.
        dataset_path: a replaybuf dataset directory to start from (see the module docs).
        crc_debug: must be False (``info`` is not stored).
        obs, act: ``(dtype, shape)`` of an observation and an action, or an example
            value; by default taken from the first sample appended.
        seed: the seed of every draw (random when None).
        memmap: a directory to keep the transitions in files (reopened later through
            ``dataset_path``).
        prefetch: batches a worker thread keeps ready for ``sample``.
    """

    def __init__(
        self,
        device: Any = "cpu",
        nb_steps: int = 1,
        sample_preprocessor: Optional[Callable[..., Transition]] = None,
        memory_size: int = 1000000,
        batch_size: int = 256,
        dataset_path: Any = "",
        crc_debug: bool = False,
        *,
        obs: Any = None,
        act: Any = None,
        seed: Optional[int] = None,
        memmap: Any = None,
        prefetch: int = 0,
    ) -> None:
        if crc_debug:
            raise ValueError(
                "replaybuf.tmrl.Memory does not store info: crc_debug is not supported"
            )
        self.nb_steps = int(nb_steps)
        self.device = device
        self.batch_size = int(batch_size)
        self.memory_size = int(memory_size)
        self.sample_preprocessor = sample_preprocessor
        self.crc_debug = False
        self.stat_test_return = 0.0
        self.stat_train_return = 0.0
        self.stat_test_steps = 0
        self.stat_train_steps = 0
        self._seed = seed
        self._memmap = memmap
        self._prefetch = int(prefetch)
        self._native: Optional[TmrlMemory] = None
        # Samples appended before any had an action (the memory's fields unknown).
        self._pending: List[Any] = []
        # The last sample appended: its observation and whether its episode ended.
        self._last: Optional[Tuple[np.ndarray, bool]] = None
        self.path = dataset_path
        if dataset_path and os.path.isdir(dataset_path) and os.listdir(dataset_path):
            if memmap is not None:
                _log.warning(
                    "memmap=%s is not used: a memory from dataset_path keeps its "
                    "transitions where the dataset does (in memory for a saved "
                    "dataset, in place for a memmap directory)",
                    memmap,
                )
                self._memmap = None
            self._native = TmrlMemory.from_dataset(
                os.fspath(dataset_path),
                batch_size=self.batch_size,
                nb_steps=self.nb_steps,
                prefetch=self._prefetch,
                # Random when None, as a fresh memory's: under the seed the dataset
                # records, every run resumed from it drew the same batches.
                seed=secrets.randbits(64) if seed is None else seed,
            )
            if self._native.memory_size != self.memory_size:
                _log.warning(
                    "the dataset holds %d transitions at most, not memory_size=%d",
                    self._native.memory_size,
                    self.memory_size,
                )
            self.memory_size = self._native.memory_size
        else:
            _log.info("no data found, initializing empty replay memory")
            if obs is not None and act is not None:
                self._build(_field(obs, "observation"), _field(act, "action"))

    # Building ------------------------------------------------------------------------

    def _build(
        self, obs: Tuple[np.dtype, Tuple[int, ...]], act: Tuple[np.dtype, Tuple[int, ...]]
    ) -> None:
        spec = [
            ("obs", obs[0], obs[1]),
            ("act", act[0], act[1]),
            ("rew", "float32", ()),
            (("next", "obs"), obs[0], obs[1]),
            ("terminated", "bool", ()),
            ("truncated", "bool", ()),
        ]
        self._native = TmrlMemory(
            self.memory_size,
            spec,
            batch_size=self.batch_size,
            nb_steps=self.nb_steps,
            seed=self._seed,
            memmap=None if self._memmap is None else os.fspath(self._memmap),
            prefetch=self._prefetch,
        )

    def _fields(self) -> Tuple[Field, Field]:
        """The built memory's observation and action."""
        assert self._native is not None
        spec = {key: (np.dtype(dtype), tuple(shape)) for key, dtype, shape in self._native.spec}
        return spec["obs"], spec["act"]

    # tmrl's interface ----------------------------------------------------------------

    def __len__(self) -> int:
        return 0 if self._native is None else len(self._native)

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        for _ in range(self.nb_steps):
            yield self.sample()

    def append(self, buffer: Any) -> None:
        """Appends a rollout worker's buffer and takes its return and step statistics
        (tmrl's ``Memory.append``)."""
        if len(buffer) > 0:
            self.stat_train_return = getattr(buffer, "stat_train_return", self.stat_train_return)
            self.stat_test_return = getattr(buffer, "stat_test_return", self.stat_test_return)
            self.stat_train_steps = getattr(buffer, "stat_train_steps", self.stat_train_steps)
            self.stat_test_steps = getattr(buffer, "stat_test_steps", self.stat_test_steps)
            self.append_buffer(buffer)

    def append_buffer(self, buffer: Any) -> np.ndarray:
        """Appends samples in order: a tmrl ``Buffer`` (its ``memory`` list), a list of
        samples ``(act, new_obs, rew, terminated, truncated, info)``, or a dict of
        columns ``act``, ``obs``, ``rew``, ``terminated``, ``truncated``, each ``(n,
        ...)``. Each sample after the first of its episode makes one transition with
        the sample before it. Returns the storage index of every transition made."""
        found = self._columns(buffer)
        if found is None:
            return np.empty(0, np.uint64)
        columns, fields = found
        dtypes = _dtypes_of(*fields)
        arrays = {}
        for key in _SAMPLE_COLUMNS:
            array = np.asarray(columns[key])
            target = dtypes[key]
            # A flag may come as 0/1 integers or floats (`_exactly` checks the values).
            flag = target == np.bool_ and array.dtype.kind in "iuf"
            if not flag and not np.can_cast(array.dtype, target, "same_kind"):
                raise TypeError(
                    f"append_buffer: `{key}` is {array.dtype}, the memory stores {target}"
                )
            arrays[key] = _exactly(key, array, target)
        if self._native is None:
            # Built once the first samples are known good: a refused first append
            # fixed the memory's fields (and made a memmap's files) all the same.
            self._build(*fields)
        written = self._native.append_buffer(arrays)
        # Taken: the reset sample held back for the next call goes with it.
        self._pending = []
        if len(arrays["obs"]) > 0:
            # The engine's link to the next buffer, for a pickled copy to go on from.
            ended = bool(arrays["terminated"][-1] or arrays["truncated"][-1])
            self._last = (arrays["obs"][-1].copy(), ended)
        return written

    def _columns(self, buffer: Any) -> Optional[Tuple[dict, Tuple[Field, Field]]]:
        """The samples as columns, with the memory's observation and action (from the
        first sample when the memory is not built yet); None when there are no
        samples."""
        if isinstance(buffer, dict):
            missing = [k for k in _SAMPLE_COLUMNS if k not in buffer]
            if missing:
                raise KeyError(f"append_buffer: no column {missing[0]!r}")
            cols = {k: np.asarray(buffer[k]) for k in _SAMPLE_COLUMNS}
            lengths = {k: (c.shape[0] if c.ndim else None) for k, c in cols.items()}
            if len(set(lengths.values())) != 1 or None in lengths.values():
                # One scalar sample was dropped silently, columns of other lengths
                # cut to the shortest.
                raise ReplayBufferValueError(
                    "append_buffer: a dict holds columns of (n, ...) arrays, one row a "
                    f"sample, got lengths {lengths}"
                )
            if self._pending:
                # A reset sample held back goes first: as samples, the path that has it.
                rows = zip(*(cols[k] for k in _SAMPLE_COLUMNS))
                return self._columns([(*row, {}) for row in rows])
            if self._native is not None:
                return buffer, self._fields()
            obs, act = cols["obs"], cols["act"]
            if obs.shape[0] == 0:
                return None
            return buffer, ((obs.dtype, obs.shape[1:]), (act.dtype, act.shape[1:]))
        samples: Sequence[Any] = getattr(buffer, "memory", buffer)
        for sample in samples:
            # tmrl's sample: (act, new_obs, rew, terminated, truncated, info). A
            # shorter one failed deep inside with a plain IndexError.
            if not isinstance(sample, (tuple, list)) or len(sample) < 5:
                raise ReplayBufferValueError(
                    "append_buffer: a sample is (act, obs, rew, terminated, truncated, "
                    f"info), got {sample!r:.80}"
                )
        if self._pending:
            # Kept until the append succeeds (a refused one dropped it).
            samples = self._pending + list(samples)
        if len(samples) == 0:
            return None
        if self._native is not None:
            fields = self._fields()
        else:
            # A reset sample's action is None in tmrl's non-real-time environments: the
            # action's fields come from the first real one.
            act = next((s[0] for s in samples if s[0] is not None), None)
            if act is None:
                self._pending = list(samples)
                return None
            fields = (_field(samples[0][1], "observation"), _field(act, "action"))
        dtypes = _dtypes_of(*fields)
        no_action = None

        def column(i: int, key: str) -> np.ndarray:
            nonlocal no_action
            values = [s[i] for s in samples]
            if key == "act" and any(v is None for v in values):
                # Only an episode's first sample has no action, and a first sample's
                # action is never part of a transition.
                if no_action is None:
                    no_action = np.zeros(fields[1][1], dtypes["act"])
                values = [no_action if v is None else v for v in values]
            if key in ("obs", "act"):
                return np.stack([np.asarray(v) for v in values])
            # As given: `append_buffer` converts, checking the values survive.
            return np.asarray(values)

        return {key: column(i, key) for i, key in enumerate(_SAMPLE_COLUMNS)}, fields

    def get_transition(self, item: int) -> Tuple[Any, ...]:
        """Transition ``item``, oldest first as in tmrl's lists: ``(prev_obs, act, rew,
        new_obs, terminated, truncated, info)``, arrays in their stored dtypes, ``info``
        empty."""
        if self._native is None:
            raise IndexError(f"transition {item}: the memory is empty")
        # An integer (1.7 was read as 1), counted from the end when negative.
        item = operator.index(item)
        if item < 0:
            # From the end, as a list's index (tmrl's memories index lists).
            if item < -len(self):
                raise IndexError(f"transition {item} is out of bounds for {len(self)}")
            item += len(self)
        t = self._native.get_transition(item)
        return (
            t["obs"][0],
            t["act"][0],
            t["rew"][0],
            t[("next", "obs")][0],
            t["terminated"][0],
            t["truncated"][0],
            {},
        )

    def __getitem__(self, item: int) -> Transition:
        """tmrl's item: the transition, through ``sample_preprocessor``, with the flags
        as ``np.float32``."""
        prev_obs, act, rew, new_obs, terminated, truncated, _info = self.get_transition(item)
        return self._preprocessed((prev_obs, act, rew, new_obs, terminated, truncated))

    def _preprocessed(self, t: Transition) -> Transition:
        if self.sample_preprocessor is not None:
            t = self.sample_preprocessor(*t)
        prev_obs, act, rew, new_obs, terminated, truncated = t
        return prev_obs, act, rew, new_obs, np.float32(terminated), np.float32(truncated)

    def sample_indices(self) -> Iterator[int]:
        """``batch_size`` items drawn uniformly (tmrl's ``sample_indices``; ``sample``
        draws in the engine instead, unless a subclass overrides this, ``__getitem__``
        or ``get_transition``)."""
        return (random.randint(0, len(self) - 1) for _ in range(self.batch_size))

    def sample(self) -> Tuple[Any, ...]:
        """``batch_size`` transitions drawn uniformly, collated into tmrl's six
        tensors ``(prev_obs, act, rew, new_obs, terminated, truncated)`` on
        ``device``. Without a ``sample_preprocessor`` the engine draws and collates
        (no Python per transition); with one, it runs on every transition first."""
        if self._native is None:
            raise ValueError("sample: the memory is empty")
        if any(getattr(type(self), m) is not getattr(Memory, m) for m in _ITEM_METHODS):
            # A subclass's own items (tmrl's memories are subclassed for them): drawn
            # and collated as tmrl's `sample` does, item by item.
            return self.collate([self[i] for i in self.sample_indices()], self.device)
        if self.sample_preprocessor is None:
            return tuple(self._to_device(a, self.device) for a in self._native.sample())
        rows = self._native.sample_rows()
        columns = (
            rows["obs"],
            rows["act"],
            rows["rew"],
            rows[("next", "obs")],
            rows["terminated"],
            rows["truncated"],
        )
        batch = [
            self._preprocessed(tuple(c[r] for c in columns)) for r in range(len(rows["index"]))
        ]
        return self.collate(batch, self.device)

    def collate(self, batch: List[Transition], device: Any = None) -> Tuple[Any, ...]:
        """Collates a list of transitions ``(prev_obs, act, rew, new_obs, terminated,
        truncated)`` into six ``float32`` tensors of batch dimension ``len(batch)`` on
        ``device`` (numpy arrays without torch)."""
        if len(batch) == 0:
            raise ValueError("collate: no transitions")
        out = []
        for i in range(6):
            stacked = np.stack([np.asarray(t[i]) for t in batch]).astype(np.float32, copy=False)
            out.append(self._to_device(stacked, device))
        return tuple(out)

    @staticmethod
    def _to_device(array: np.ndarray, device: Any) -> Any:
        if torch is None:
            return array
        tensor = torch.from_numpy(array)
        return tensor if device is None else tensor.to(device)

    # Beyond tmrl ---------------------------------------------------------------------

    def save(self, path: Any) -> None:
        """Saves every transition under the directory ``path``, for a later
        ``Memory(dataset_path=path)``."""
        if self._native is None:
            raise ValueError("save: the memory is empty and has no fields yet")
        self._native.save(os.fspath(path))

    def flush(self) -> None:
        """Writes a ``memmap`` memory through to its files and the disk."""
        if self._native is not None:
            self._native.flush()

    def __getstate__(self) -> dict:
        """Pickles (tmrl's trainer pickles its memory with each checkpoint, and
        ``copy.deepcopy`` does) with every transition: the engine's memory saved to a
        temporary directory, its files' bytes kept in the state."""
        state = self.__dict__.copy()
        native = state.pop("_native")
        state["_native"] = None
        if native is not None:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "memory")
                native.save(path)
                state["_saved"] = {
                    name: pathlib.Path(path, name).read_bytes() for name in sorted(os.listdir(path))
                }
        return state

    def __setstate__(self, state: dict) -> None:
        """Unpickles into memory (a ``memmap`` memory too: its files stay with the
        original), drawing on and linking the next buffer as the pickled memory would
        have."""
        saved = state.pop("_saved", None)
        self.__dict__.update(state)
        if saved is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "memory")
            os.mkdir(path)
            for name, data in saved.items():
                pathlib.Path(path, os.path.basename(name)).write_bytes(data)
            self._native = TmrlMemory.from_dataset(
                path,
                batch_size=self.batch_size,
                nb_steps=self.nb_steps,
                prefetch=self._prefetch,
            )
        self._memmap = None
        if self._last is not None:
            # One sample, the last one appended, links the next buffer to it as the
            # pickled memory would have (alone, it makes no transition).
            obs, ended = self._last
            act_dtype, act_shape = self._fields()[1]
            self._native.append_buffer(
                {
                    "act": np.zeros((1, *act_shape), act_dtype),
                    "obs": obs[None],
                    "rew": np.zeros(1, np.float32),
                    "terminated": np.array([ended]),
                    "truncated": np.zeros(1, np.bool_),
                }
            )

    def __repr__(self) -> str:
        return (
            f"replaybuf.tmrl.Memory(len={len(self)}, memory_size={self.memory_size}, "
            f"batch_size={self.batch_size}, nb_steps={self.nb_steps})"
        )
