"""replaybuf served by Ray actors: collectors on any node extend it, learners sample it.

:class:`RayReplayBuffer` takes the arguments of :class:`replaybuf.ReplayBuffer` and
keeps the buffer in one or more Ray actors (TorchRL's ``RayReplayBuffer`` shape). Each
actor is threaded (``max_concurrency``), and since the engine is lock-free and
releases the GIL while rows move, extends and samples from many callers run in
parallel inside it. Batches travel as numpy arrays through Ray's object store.

With ``num_actors > 1`` the client shards, as Reverb's clients shard over several
servers: each ``extend`` goes to the next actor in turn, a ``sample`` is drawn from the
actors in proportion to the rows they hold (to their priority mass, for a prioritized
sampler, with the weights brought to one scale: as one buffer of all the rows would
draw and weigh them), and ``update_priority`` routes each index back to the actor that
holds it (indices are ``local_index * num_actors + actor``).

Fault tolerance: with ``checkpoint_dir``, each actor dumps its buffer there on
``checkpoint()`` and, with ``checkpoint_every_s``, on a period (crash-safe dumps: a
dump killed midway leaves the previous one). Ray restarts an actor that dies
(``max_restarts``), and the new actor loads its last checkpoint. A call made while an
actor is down raises :class:`ReplayBufferUnavailable` (retryable); it never hangs.

>>> import ray, numpy as np  # doctest: +SKIP
>>> from replaybuf.ray import RayReplayBuffer  # doctest: +SKIP
>>> rb = RayReplayBuffer(100_000, spec={"obs": ("float32", (4,))}, num_actors=2)  # doctest: +SKIP
>>> rb.extend({"obs": np.zeros((64, 4), np.float32)})  # doctest: +SKIP
>>> batch = rb.sample(32)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional

import numpy as np
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

import replaybuf

__all__ = ["RayReplayBuffer", "ReplayBufferUnavailable"]

# A sample's entries that are per row but not fields.
_INDEX = "index"


class ReplayBufferUnavailable(replaybuf.ReplayBufferError, ConnectionError):
    """A buffer actor is down (dead, or restarting with its last checkpoint): retry."""


class _BufferActor:
    """One shard: a replaybuf.ReplayBuffer in a threaded actor."""

    def __init__(
        self, capacity: int, kwargs: dict, checkpoint: Optional[str], every_s: Optional[float]
    ):
        self._checkpoint = checkpoint
        self._lock = threading.Lock()  # one dump at a time
        restored = checkpoint is not None and os.path.isdir(checkpoint) and os.listdir(checkpoint)
        if restored:
            self.rb = replaybuf.ReplayBuffer.from_checkpoint(checkpoint)
        else:
            self.rb = replaybuf.ReplayBuffer(capacity, **kwargs)
        self.restored = bool(restored)
        self._stop = threading.Event()
        if checkpoint is not None and every_s:
            threading.Thread(target=self._every, args=(every_s,), daemon=True).start()

    def _every(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.checkpoint()

    def ready(self) -> bool:
        return self.restored

    def extend(self, data: Dict[Any, np.ndarray]) -> np.ndarray:
        return self.rb.extend(data)

    def sample(self, n: int) -> Dict[Any, np.ndarray]:
        return self.rb.sample(n)

    def update_priority(self, index, priority, generation) -> tuple:
        return self.rb.update_priority(index, priority, generation)

    def size(self) -> int:
        return len(self.rb)

    def shares(self) -> tuple:
        """Rows held, and for a prioritized sampler ``(total, min)`` of the masses
        and beta (else None, None): what a client splits a sample by."""
        return len(self.rb), self.rb.priority_mass(), self.rb.beta

    def stats(self) -> dict:
        return {
            "len": len(self.rb),
            "write_count": self.rb.write_count,
            "rate_limit": self.rb.rate_limit_stats(),
        }

    def checkpoint(self) -> Optional[str]:
        if self._checkpoint is None:
            return None
        with self._lock:
            self.rb.dumps(self._checkpoint)
        return self._checkpoint

    def call(self, method: str, *args):
        return getattr(self.rb, method)(*args)


class RayReplayBuffer:
    """A replaybuf buffer held by ``num_actors`` Ray actors (see the module's docs).

    ``capacity`` is the whole buffer's, split evenly over the actors; every other
    keyword argument of :class:`replaybuf.ReplayBuffer` (``spec``, ``sampler``,
    ``rate_limit``, ...) goes to each actor's buffer. ``ray_options`` are the actors'
    options (``num_cpus``, ``resources``, ``scheduling_strategy``...); by default
    ``max_concurrency=16`` and, with ``checkpoint_dir``, ``max_restarts=-1``.
    ``checkpoint_dir``: actor ``k`` dumps to ``checkpoint_dir/shard-k`` and reloads
    from there after a restart; ``checkpoint_every_s`` dumps on that period too.
    """

    def __init__(
        self,
        capacity: int,
        *,
        num_actors: int = 1,
        ray_options: Optional[dict] = None,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every_s: Optional[float] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        if num_actors < 1:
            raise replaybuf.ReplayBufferValueError("num_actors must be at least 1")
        if capacity < num_actors:
            raise replaybuf.ReplayBufferValueError("capacity must be at least num_actors")
        if "shared" in kwargs or "memmap" in kwargs:
            raise replaybuf.ReplayBufferValueError(
                "a Ray buffer keeps its rows in its actors: use checkpoint_dir for "
                "persistence, not shared= or memmap="
            )
        options = {"max_concurrency": 16}
        if checkpoint_dir is not None:
            options["max_restarts"] = -1
        options.update(ray_options or {})
        actor_class = ray.remote(_BufferActor)
        self.num_actors = num_actors
        self._actors = []
        for k in range(num_actors):
            shard_kwargs = dict(kwargs)
            if seed is not None:
                shard_kwargs["seed"] = seed + k
            path = None if checkpoint_dir is None else os.path.join(checkpoint_dir, f"shard-{k}")
            cap = capacity // num_actors + (1 if k < capacity % num_actors else 0)
            self._actors.append(
                actor_class.options(**options).remote(cap, shard_kwargs, path, checkpoint_every_s)
            )
        self._get([a.ready.remote() for a in self._actors])
        self._turn = 0  # the actor the next extend goes to (each pickled copy has its own)
        self._rng = np.random.default_rng(seed)

    # ---------------------------------------------------------------- plumbing

    @staticmethod
    def _get(refs, timeout: Optional[float] = None):
        """``ray.get``, with a dead or restarting actor as ReplayBufferUnavailable and
        the buffer's own errors raised as they are (Ray wraps them in a subclass of
        their type, so ``except replaybuf.ReplayBufferTimeoutError`` catches them)."""
        try:
            return ray.get(refs, timeout=timeout)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
            raise ReplayBufferUnavailable(f"a buffer actor is unavailable: {e}") from e

    def _split(self, index: np.ndarray):
        """Global indices as (actor, local index) arrays."""
        index = np.asarray(index, dtype=np.uint64).reshape(-1)
        return index % self.num_actors, index // self.num_actors

    def _global(self, local: np.ndarray, k: int) -> np.ndarray:
        """Actor ``k``'s local indices as global ones (what ``_split`` undoes)."""
        return local * np.uint64(self.num_actors) + np.uint64(k)

    def _merge(self, parts) -> Dict[Any, np.ndarray]:
        """One dict of rows from ``(actor, rows)`` pairs, their indices made global."""
        parts = list(parts)
        for k, part in parts:
            part[_INDEX] = self._global(part[_INDEX], k)
        return {key: np.concatenate([p[key] for _, p in parts]) for key in parts[0][1]}

    # ---------------------------------------------------------------- the buffer

    def extend(self, data: Dict[Any, Any]) -> np.ndarray:
        """Writes a dict of arrays into the next actor in turn; returns the rows'
        indices (global: ``local * num_actors + actor``)."""
        k, self._turn = self._turn, (self._turn + 1) % self.num_actors
        local = self._get(self._actors[k].extend.remote(data))
        return self._global(local, k)

    def add(self, data: Dict[Any, Any]) -> int:
        """Writes one transition (a dict of arrays of the field shapes)."""
        one = {key: np.expand_dims(np.asarray(v), 0) for key, v in data.items()}
        return int(self.extend(one)[0])

    def sample(self, batch_size: int) -> Dict[Any, np.ndarray]:
        """Draws ``batch_size`` rows from the actors, in parallel: in proportion to the
        rows they hold, or for a prioritized sampler to their priority mass, so that
        a row's chance is its priority's share of all the actors' (``index`` is
        global). Each actor weighs its rows against its own smallest mass; the weights
        are then brought to the smallest of all, ``(min / mass) ** beta`` as a single
        buffer gives them. The split reads the actors' figures just before the draws:
        priorities set meanwhile move it a little, as they would move one buffer's."""
        if self.num_actors == 1:
            return self._get(self._actors[0].sample.remote(batch_size))
        shares = self._get([a.shares.remote() for a in self._actors])
        prioritized = shares[0][1] is not None
        weights = np.array([m[0] if prioritized else n for n, m, _ in shares], np.float64)
        if weights.sum() == 0:
            raise replaybuf.ReplayBufferValueError("the buffer is empty")
        counts = self._rng.multinomial(batch_size, weights / weights.sum())
        parts = [(k, self._actors[k].sample.remote(int(c))) for k, c in enumerate(counts) if c]
        got = self._get([ref for _, ref in parts])
        if prioritized:
            lowest = min(m[1] for _, m, _ in shares if m[1] > 0)
            for (k, _), part in zip(parts, got):
                _, (_, smallest), beta = shares[k]
                # Arrays out of Ray's object store are read-only: a new one.
                part["weight"] = part["weight"] * np.float32((lowest / smallest) ** beta)
        return self._merge(zip((k for k, _ in parts), got))

    def update_priority(self, index, priority, generation=None) -> tuple:
        """Sets priorities, each index routed to the actor that holds it; returns
        (applied, stale) summed over the actors."""
        shard, local = self._split(index)
        priority = np.asarray(priority, dtype=np.float64).reshape(len(local), -1)
        gen = None if generation is None else np.asarray(generation, np.uint64).reshape(-1)
        refs = []
        for k in range(self.num_actors):
            mine = shard == k
            if mine.any():
                g = None if gen is None else gen[mine]
                refs.append(self._actors[k].update_priority.remote(local[mine], priority[mine], g))
        done = self._get(refs)
        return tuple(int(sum(d[i] for d in done)) for i in range(2))

    def priority(self, index: int) -> Optional[float]:
        """The priority of the row at global ``index``, as last set."""
        shard, local = self._split([index])
        return self._get(self._actors[int(shard[0])].call.remote("priority", int(local[0])))

    def read_all(self) -> Dict[Any, np.ndarray]:
        """Every stored row, actor by actor, each actor's oldest first; ``index``
        global."""
        parts = self._get([a.call.remote("read_all_in_order") for a in self._actors])
        return self._merge(enumerate(parts))

    def __len__(self) -> int:
        return int(sum(self._get([a.size.remote() for a in self._actors])))

    @property
    def write_count(self) -> int:
        return int(sum(s["write_count"] for s in self.stats()))

    def stats(self) -> List[dict]:
        """Per actor: rows held, rows written, and its rate limit's counts."""
        return self._get([a.stats.remote() for a in self._actors])

    def checkpoint(self) -> List[Optional[str]]:
        """Every actor dumps its buffer to its checkpoint directory now (crash-safe);
        returns the directories."""
        return self._get([a.checkpoint.remote() for a in self._actors])

    def set_rate_limit(self, limit: Any) -> None:
        """Puts a new rate limit in force in every actor."""
        self._get([a.call.remote("set_rate_limit", limit) for a in self._actors])

    def close_rate_limit(self) -> None:
        """Frees every call waiting on an actor's rate limit (shutdown)."""
        self._get([a.call.remote("close_rate_limit") for a in self._actors])

    @property
    def actors(self) -> list:
        """The actor handles (to kill one in a test, or to place collectors near it)."""
        return list(self._actors)
