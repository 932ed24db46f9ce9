"""Writers: how rows enter the storage, each describing one of replaybuf's write
policies (``replaybuf.RoundRobin``, ``MaxValue``, ``Immutable``)."""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from .._config import Immutable, MaxValue, RoundRobin

__all__ = [
    "Writer",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "TensorDictMaxValueWriter",
    "ImmutableDatasetWriter",
]

NestedKey = Union[str, Tuple[str, ...]]


class Writer:
    """Base of the writers."""

    def _describe(self) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RoundRobinWriter(Writer):
    """Append at the cursor, evicting the oldest row once the storage is full."""

    def __init__(self, compilable: bool = False) -> None:
        pass

    def _describe(self) -> Any:
        return RoundRobin()


class TensorDictRoundRobinWriter(RoundRobinWriter):
    """:class:`RoundRobinWriter`, by the name TorchRL's TensorDict buffers use."""


class TensorDictMaxValueWriter(Writer):
    """Keep the rows ranking highest by ``rank_key`` (default ``("next", "reward")``),
    reduced to one number per row by ``reduction``. A row that ranks no higher than
    every stored row, once the storage is full, is not written: its index comes back
    as -1."""

    def __init__(
        self, rank_key: Optional[NestedKey] = None, reduction: str = "sum", **kwargs: Any
    ) -> None:
        self._rank_key = ("next", "reward") if rank_key is None else rank_key
        self._reduction = reduction

    def _describe(self) -> Any:
        key = self._rank_key
        if isinstance(key, tuple) and len(key) == 1:
            key = key[0]
        return MaxValue(rank_key=key, reduction=self._reduction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank_key={self._rank_key}, reduction={self._reduction})"


class ImmutableDatasetWriter(Writer):
    """A read-only dataset: its rows come with the storage (a :class:`TensorStorage`
    built from data) and every write is refused."""

    WRITING_ERR = "This dataset doesn't allow writing."

    def _describe(self) -> Any:
        return Immutable()
