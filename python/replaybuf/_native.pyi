"""Type stubs of the extension module ``replaybuf._native`` (re-exported by ``replaybuf``)."""

from os import PathLike
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

Key = Union[str, Tuple[str, ...]]
Batch = Dict[Key, np.ndarray]
StrPath = Union[str, "PathLike[str]"]

MARK_VALID: int
MARK_START: int
MARK_END: int
PADDING_INDEX: int
MARK_TRUNCATED: int

class ReplayBufferError(Exception):
    """The base of every error replaybuf raises."""

class ReplayBufferValueError(ReplayBufferError, ValueError): ...
class ReplayBufferTypeError(ReplayBufferError, TypeError): ...
class ReplayBufferIndexError(ReplayBufferError, IndexError): ...
class ReplayBufferKeyError(ReplayBufferError, KeyError): ...
class ReplayBufferOSError(ReplayBufferError, OSError): ...
class EpochEnd(ReplayBufferError, StopIteration): ...
class ReplayBufferTimeoutError(ReplayBufferError, TimeoutError): ...
class RateLimitClosed(ReplayBufferError, RuntimeError): ...

class ReplayBuffer:
    """A lock-free replay buffer of numpy rows.

    Build it from ``spec`` (``{key: (dtype, shape)}``, or a list of ``(key, dtype,
    shape)``; nested keys are tuples of str) or from ``example`` (one transition: a
    dict, nested dicts allowed, of arrays or scalars). ``sampler`` and
    ``write_policy`` take the classes of :mod:`replaybuf` (``Uniform`` and
    ``RoundRobin`` by default). ``ndim=2, envs=E`` stores ``[steps, E]`` for batched
    environments; ``memmap=dir`` keeps the rows in files under ``dir``; ``shared=name``
    puts the buffer in shared memory that other processes ``attach`` to (and that
    pickles as its name). ``rate_limit`` takes a :class:`replaybuf.RateLimit`: extends
    and samples then wait their turn to keep a replay ratio (with ``shared=``, in every
    process attached to the buffer together). ``frames`` takes a
    :class:`replaybuf.Frames`: frame stacks and ``next_of`` fields stored once a step.
    """

    def __init__(
        self,
        capacity: int,
        *,
        spec: Optional[Union[Mapping[Key, Any], List[Tuple[Key, Any, Tuple[int, ...]]]]] = None,
        example: Optional[Mapping[Key, Any]] = None,
        sampler: Optional[Any] = None,
        write_policy: Optional[Any] = None,
        rate_limit: Optional[Any] = None,
        frames: Optional[Any] = None,
        ndim: int = 1,
        envs: Optional[int] = None,
        dim_extend: int = 0,
        shards: Optional[int] = None,
        seed: Optional[int] = None,
        batch_size: Optional[int] = None,
        priority_key: Optional[Key] = None,
        memmap: Optional[StrPath] = None,
        shared: Optional[str] = None,
        existsok: bool = False,
    ) -> None: ...
    @staticmethod
    def attach(name: str) -> ReplayBuffer:
        """Attaches to a shared buffer another process made with ``shared=name``."""
    @staticmethod
    def from_checkpoint(path: StrPath) -> ReplayBuffer:
        """A buffer rebuilt from a checkpoint ``dumps`` wrote."""
    @staticmethod
    def open_dataset(path: StrPath) -> ReplayBuffer:
        """A checkpoint or file-backed directory opened read-only."""
    def __len__(self) -> int: ...
    def rate_limit_stats(self) -> Optional[Dict[str, Any]]:
        """What the rate limit counted (rows, waits, seconds waited, the limit), or None."""
    def set_rate_limit(self, limit: Any) -> None:
        """Puts a new :class:`replaybuf.RateLimit` in force, counts kept."""
    def close_rate_limit(self) -> None:
        """Waiting calls, and later ones that would wait, raise ``RateLimitClosed``."""
    def reopen_rate_limit(self) -> None:
        """Opens a closed rate limit again."""
    @property
    def capacity(self) -> int: ...
    @property
    def row_bytes(self) -> dict[str, int]:
        """Bytes a row takes: ``logical`` (as extended and sampled), ``slot`` (one
        storage slot, header and stored row; with frames a stack's newest frame only)
        and ``side`` (a frames buffer's side slots, all together)."""
    @property
    def write_count(self) -> int: ...
    def epoch_left(self) -> Optional[int]: ...
    def queued(self) -> Optional[int]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def envs(self) -> int: ...
    @property
    def shards(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def batch_size(self) -> Optional[int]: ...
    @property
    def index_dtype(self) -> np.dtype[Any]:
        """The dtype of a sample's ``index``: uint64 unless set to int64. In int64 a
        short slice's padding index is -1: ``update_priority`` skips it, ``get`` and
        ``write_at`` read it as the last stored row (leave padding rows out)."""
    @index_dtype.setter
    def index_dtype(self, dtype: npt.DTypeLike) -> None: ...
    @property
    def prioritized(self) -> bool: ...
    @property
    def samples_slices(self) -> bool: ...
    @property
    def shared_name(self) -> Optional[str]: ...
    @property
    def alpha(self) -> Optional[float]: ...
    @alpha.setter
    def alpha(self, alpha: float) -> None: ...
    @property
    def beta(self) -> Optional[float]: ...
    @beta.setter
    def beta(self, beta: float) -> None: ...
    def priority_mass(self) -> Optional[Tuple[float, float]]:
        """For a prioritized sampler, ``(total, min)`` of ``(priority + eps) ** alpha``
        over the stored rows (what draws are in proportion to, and what weights are
        taken against); ``(0.0, 0.0)`` when empty; None otherwise."""
    @property
    def spec(self) -> List[Tuple[Key, Any, Tuple[int, ...]]]: ...
    def extend(self, data: Mapping[Key, Any]) -> npt.NDArray[np.uint64]:
        """Appends a batch and returns each row's storage index. Arrays must have
        the fields' dtypes; lists, scalars and tensors are converted where no value
        changes (a float into an integer field, or an integer outside the field's
        range, raises ``ReplayBufferTypeError``)."""
    def add(self, data: Mapping[Key, Any]) -> int:
        """Adds one transition and returns its index."""
    def sample(self, n: Optional[int] = None) -> Batch:
        """Draws ``n`` rows: one array per field plus ``index``, ``generation``,
        ``weight`` (prioritized) and ``marks`` (slices)."""
    def sample_into(self, out: Batch) -> int:
        """Draws into the caller's arrays; returns the rows drawn."""
    def update_priority(
        self,
        index: npt.ArrayLike,
        priority: npt.ArrayLike,
        generation: Optional[npt.ArrayLike] = None,
    ) -> Tuple[int, int]:
        """Sets sampled rows' priorities; returns ``(applied, stale)``."""
    def priority(self, index: int) -> Optional[float]: ...
    def get(self, index: Union[int, npt.ArrayLike]) -> Batch: ...
    def positions(self, index: Union[int, npt.ArrayLike]) -> npt.NDArray[np.uint64]: ...
    def stored_positions(self, end: Optional[int] = None) -> npt.NDArray[np.uint64]: ...
    def read_all_in_order(self, end: Optional[int] = None) -> Batch: ...
    def write_all(self, data: Mapping[Key, Any], end: Optional[int] = None) -> None: ...
    def write_at(self, index: Union[int, npt.ArrayLike], data: Mapping[Key, Any]) -> None: ...
    def reconfigure(
        self,
        *,
        sampler: Any = None,
        write_policy: Any = None,
        capacity: Optional[int] = None,
    ) -> None: ...
    def clear(self) -> None: ...
    def dumps(self, path: StrPath) -> None: ...
    def loads(self, path: StrPath) -> None: ...
    def flush(self) -> None: ...

class TmrlMemory:
    """The engine's tmrl memory (see :class:`replaybuf.tmrl.Memory`, which wraps it)."""

    def __len__(self) -> int: ...
    @property
    def memory_size(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def nb_steps(self) -> int: ...
    @property
    def spec(self) -> List[Tuple[Key, Any, Tuple[int, ...]]]: ...
    def append_buffer(self, samples: Mapping[Key, Any]) -> Any: ...
    def get_transition(self, item: int) -> Batch: ...
    def sample_rows(self) -> Batch: ...
    def sample(self) -> Tuple[np.ndarray, ...]: ...
    def save(self, path: StrPath) -> None: ...
    def flush(self) -> None: ...
