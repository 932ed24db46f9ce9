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
holds it (indices are ``local_index * num_actors + actor``). A FIFO sampler takes each
actor as a queue of its own (see :meth:`RayReplayBuffer.sample`). A without-replacement
sampler (:class:`replaybuf.WithoutReplacement`, or a :class:`replaybuf.Slice` with
``without_replacement``) is refused over several actors: each actor keeps an epoch of
its own, and a batch split by rows held may ask one actor for more rows than its epoch
has left, after the others have already used theirs up; one actor keeps one epoch.

A collector that writes many small chunks takes a :meth:`RayReplayBuffer.writer`
(Reverb's writers work this way): it gathers the chunks into shipments (8 MiB by
default) and keeps up to ``max_in_flight`` shipments on their way without waiting
for each round trip. Rows count as stored (acknowledged) once their
shipment's extend has returned; :meth:`RayWriter.flush` ships what is gathered and
waits for everything on its way.

Collectors on the buffer's own node skip the object store: with ``local_writes``
(the default, on Linux) each actor keeps its buffer in shared memory (``shared=``, a
region named for the actor), and a process on the same node (its ``extend`` and its
writers) attaches to it and extends it directly, at the speed of a shared-memory
buffer, while collectors on other nodes ship their rows as before. Each process
writing a shared buffer holds a shard's writer lease, and the actor keeps one for the
rows shipped to it: give the buffer at least ``shards`` = same-node collectors + 1 (a
power of two; a buffer of one shard is not shared, and a process that finds no shard
free ships its rows instead). Before an extend, and at most every 50 ms, the process
checks that the actors' processes are alive; once one is gone it raises
:class:`ReplayBufferUnavailable` and attaches to the restarted actor's region on its
next extend.

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

import glob
import logging
import os
import re
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import numpy as np
import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayActorError

import replaybuf

__all__ = ["RayReplayBuffer", "RayWriter", "ReplayBufferUnavailable"]

# A sample's entries that are per row but not fields.
_INDEX = "index"
# The index of no row: a short slice's padding, a row a max-value writer passed over.
_PADDING = np.uint64(replaybuf.PADDING_INDEX)


class ReplayBufferUnavailable(replaybuf.ReplayBufferError, ConnectionError):
    """A buffer actor is down (dead, or restarting with its last checkpoint): retry."""


class _NoAnswer(replaybuf.ReplayBufferTimeoutError):
    """No answer within the caller's timeout: the call is still on its way (unlike a
    timeout the actor's buffer raised, which ended the call)."""


class _BufferActor:
    """One shard: a replaybuf.ReplayBuffer in a threaded actor. Extends run in the
    concurrency group "insert", samples and priority updates in "sample", each with
    threads of its own: inserts that a rate limit holds back (each holds a thread
    while it waits) can never leave the learners without a thread, nor the other way
    round. The rest (sizes, checkpoints) runs in the default group."""

    def __init__(
        self,
        capacity: int,
        kwargs: dict,
        checkpoint: Optional[str],
        every_s: Optional[float],
        region: Optional[str] = None,
    ):
        self._checkpoint = checkpoint
        self._lock = threading.Lock()  # one dump at a time
        # A checkpoint is there once a dump finished: its meta.json is renamed in last,
        # so a first dump cut short (or a directory of other files) is no checkpoint.
        restored = checkpoint is not None and os.path.isfile(os.path.join(checkpoint, "meta.json"))
        self._local = None
        self.rb = self._shared(capacity, kwargs, region) if region else None
        if self.rb is None:
            self.rb = replaybuf.ReplayBuffer(capacity, **kwargs)
        if restored:
            # Into the buffer these settings make, which refuses a checkpoint of
            # another layout (from_checkpoint took the checkpoint's and ignored them).
            self.rb.loads(checkpoint)
        self.restored = bool(restored)
        self._stop = threading.Event()
        if checkpoint is not None and every_s:
            threading.Thread(target=self._every, args=(every_s,), daemon=True).start()

    def _shared(self, capacity: int, kwargs: dict, region: str):
        """The buffer in a shared region named for this actor's incarnation, which
        writers on this node attach to; None if it has a single shard (the actor's)
        or cannot be shared (its options need the heap). The regions of Ray buffers'
        actors that died on this node are removed: this actor's earlier incarnations',
        and those of buffers whose actors were killed with their cluster (their names
        end in their actor's pid; left, each stayed in /dev/shm for good)."""
        for path in glob.glob("/dev/shm/replaybuf.ray-*-*-*"):
            named = _ACTOR_REGION.fullmatch(os.path.basename(path))
            if named and not _alive(int(named.group(1))):
                try:
                    os.unlink(path)
                except (FileNotFoundError, PermissionError):
                    pass  # gone meanwhile, or another user's
        if (kwargs.get("shards") or 1) < 2:
            return None  # the actor's own shard is all there is: nothing to share
        name = f"{region}-{os.getpid()}"
        try:
            rb = replaybuf.ReplayBuffer(capacity, shared=name, **kwargs)
            # The actor keeps a shard for the extends shipped to it: an extend of no
            # rows takes this process's writer lease.
            rb.extend({key: np.empty((0, *shape), dtype) for key, dtype, shape in rb.spec})
        except replaybuf.ReplayBufferError:
            return None
        self._local = (ray.get_runtime_context().get_node_id(), os.getpid(), name)
        return rb

    def local_region(self) -> Optional[tuple]:
        """``(node id, pid, region name)`` of a buffer that writers on this node may
        attach to, or None."""
        return self._local

    def _every(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            # One failed dump (a full disk, a file in the way) stopped every later
            # one: the thread died with it. It is reported, and the next one tried.
            try:
                self.checkpoint()
            except Exception:  # noqa: BLE001 - any failure of one dump
                logging.getLogger(__name__).exception(
                    "periodic checkpoint into %s failed; trying again in %s s",
                    self._checkpoint,
                    every_s,
                )

    def ready(self) -> bool:
        return self.restored

    @ray.method(concurrency_group="insert")
    def extend(self, data: Dict[Any, np.ndarray]) -> np.ndarray:
        return self.rb.extend(data)

    @ray.method(concurrency_group="sample")
    def sample(self, n: int) -> Dict[Any, np.ndarray]:
        return self.rb.sample(n)

    @ray.method(concurrency_group="sample")
    def update_priority(self, index, priority, generation) -> tuple:
        return self.rb.update_priority(index, priority, generation)

    def queued(self) -> int:
        """Rows its FIFO sampler has not taken yet (its size for another sampler)."""
        queued = self.rb.queued()
        return len(self.rb) if queued is None else queued

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
    ``concurrency_groups`` sizes the actors' thread groups for extends ("insert") and
    for samples and priority updates ("sample"): 16 each by default.
    ``checkpoint_dir``: actor ``k`` dumps to ``checkpoint_dir/shard-k`` and reloads
    from there after a restart; ``checkpoint_every_s`` dumps on that period too.
    ``local_writes``: keep each actor's buffer in shared memory, for writers on its
    node to write directly (see the module's docs); False keeps it on the actor's heap
    and every row travels through the object store.
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
        concurrency_groups: Optional[Dict[str, int]] = None,
        local_writes: bool = True,
        **kwargs: Any,
    ) -> None:
        if num_actors < 1:
            raise replaybuf.ReplayBufferValueError("num_actors must be at least 1")
        if capacity < num_actors:
            raise replaybuf.ReplayBufferValueError("capacity must be at least num_actors")
        sampler = _described(kwargs.get("sampler"))
        if num_actors > 1 and _without_replacement(sampler):
            raise replaybuf.ReplayBufferValueError(
                "a without-replacement sampler needs num_actors=1: each actor would keep "
                "an epoch of its own, and a batch split over them may ask one actor for "
                "more rows than its epoch has left, after the others have used theirs"
            )
        if num_actors > 1 and sampler.get("kind") == "slice" and sampler.get("num_slices"):
            raise replaybuf.ReplayBufferValueError(
                "a slice sampler over several actors takes slice_len=: a batch split over "
                "them asks each for whole slices, and num_slices= would cut each actor's "
                "share into that many slices"
            )
        if "shared" in kwargs or "memmap" in kwargs:
            raise replaybuf.ReplayBufferValueError(
                "a Ray buffer keeps its rows in its actors: use checkpoint_dir for "
                "persistence, not shared= or memmap="
            )
        options = {"max_concurrency": 16}
        if checkpoint_dir is not None:
            options["max_restarts"] = -1
        options.update(ray_options or {})
        groups = {"insert": 16, "sample": 16}
        groups.update(concurrency_groups or {})
        actor_class = ray.remote(concurrency_groups=groups)(_BufferActor)
        # Settings the buffer refuses raise here, as one buffer's constructor raises
        # them (an actor's failed start came back as "unavailable"); its storage is
        # reserved, never touched.
        replaybuf.ReplayBuffer(
            capacity // num_actors + (1 if capacity % num_actors else 0), **kwargs
        )
        self.num_actors = num_actors
        self.capacity = capacity
        self._actors = []
        # Shared memory for same-node writers: Linux only (futexes, /dev/shm).
        regions = (
            f"ray-{uuid.uuid4().hex[:12]}" if local_writes and sys.platform == "linux" else None
        )
        for k in range(num_actors):
            shard_kwargs = dict(kwargs)
            if seed is not None:
                shard_kwargs["seed"] = seed + k
            path = None if checkpoint_dir is None else os.path.join(checkpoint_dir, f"shard-{k}")
            cap = capacity // num_actors + (1 if k < capacity % num_actors else 0)
            region = None if regions is None else f"{regions}-{k}"
            self._actors.append(
                actor_class.options(**options).remote(
                    cap, shard_kwargs, path, checkpoint_every_s, region
                )
            )
        self._get([a.ready.remote() for a in self._actors])
        self._turn = 0  # the actor the next extend goes to (each pickled copy has its own)
        self._rng = np.random.default_rng(seed)
        self._fifo = sampler.get("kind") == "fifo"
        # Rows per unit of a batch's split over the actors: a slice's, or one.
        self._unit = int(sampler.get("slice_len") or 1) if sampler.get("kind") == "slice" else 1
        self._batch_size = kwargs.get("batch_size")
        # The same-node actors' buffers: made at the first extend (each copy its own).
        self._here: Optional[_InPlace] = None

    # ---------------------------------------------------------------- plumbing

    @staticmethod
    def _get(refs, timeout: Optional[float] = None):
        """``ray.get``, with a dead or restarting actor as ReplayBufferUnavailable, a
        ``timeout`` passed as ReplayBufferTimeoutError, and the buffer's own errors
        raised as they are (Ray wraps them in a subclass of their type, so ``except
        replaybuf.ReplayBufferTimeoutError`` catches them)."""
        try:
            return ray.get(refs, timeout=timeout)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
            if getattr(e, "actor_init_failed", False):
                # Its buffer could not be built or loaded (a checkpoint its restart
                # cannot load): no retry brings it back. As unavailable, a caller's
                # documented retry loop never ended.
                raise replaybuf.ReplayBufferError(
                    f"a buffer actor could not start, and will not: {e}"
                ) from e
            raise ReplayBufferUnavailable(f"a buffer actor is unavailable: {e}") from e
        except GetTimeoutError as e:
            raise _NoAnswer(f"no answer from the buffer actor within {timeout} s") from e

    def _split(self, index: np.ndarray):
        """Global indices as (actor, local index) arrays; refused as a single buffer
        refuses them (not integers, negative)."""
        index = np.asarray(index)
        if index.size and index.dtype.kind not in "iu":
            raise replaybuf.ReplayBufferTypeError(
                f"expected integers, not an array of {index.dtype}"
            )
        if index.size and index.dtype.kind == "i" and index.min() < 0:
            raise replaybuf.ReplayBufferIndexError(f"index {index.min()} is negative")
        index = index.astype(np.uint64).reshape(-1)
        # A padding row's index (a short slice's) goes to actor 0, which skips it, as
        # a single buffer skips it.
        padding = index == _PADDING
        shard = np.where(padding, np.uint64(0), index % np.uint64(self.num_actors))
        local = np.where(padding, _PADDING, index // np.uint64(self.num_actors))
        return shard, local

    def _global(self, local: np.ndarray, k: int) -> np.ndarray:
        """Actor ``k``'s local indices as global ones (what ``_split`` undoes); the
        padding index (a short slice's padding, a row a writer did not write) stays
        itself: it wrapped around into another actor's index."""
        local = np.asarray(local, dtype=np.uint64)
        global_ = local * np.uint64(self.num_actors) + np.uint64(k)
        # `[()]`: a scalar (an add's index) stays one.
        return np.where(local == _PADDING, _PADDING, global_)[()]

    def _merge(self, parts) -> Dict[Any, np.ndarray]:
        """One dict of rows from ``(actor, rows)`` pairs, their indices made global."""
        parts = list(parts)
        for k, part in parts:
            part[_INDEX] = self._global(part[_INDEX], k)
        return {key: np.concatenate([p[key] for _, p in parts]) for key in parts[0][1]}

    # ---------------------------------------------------------------- the buffer

    def extend(self, data: Dict[Any, Any]) -> np.ndarray:
        """Writes a dict of arrays into the next actor in turn (on this node, in
        place: see the module's docs); returns the rows' indices (global: ``local *
        num_actors + actor``)."""
        if self._here is None:
            self._here = _InPlace(self)
        if self._here.ready(None):
            stored = self._here.extend(data)
            if stored is not None:
                return self._global(stored[1], stored[0])
        k, ref = self._ship(data)
        return self._global(self._get(ref), k)

    def __getstate__(self) -> dict:
        # Attachments are this process's: a copy looks for its own node's actors.
        return {**self.__dict__, "_here": None}

    def _ship(self, data: Dict[Any, Any]):
        """Sends ``data`` to the next actor in turn: (that actor, the call's ref)."""
        k, self._turn = self._turn, (self._turn + 1) % self.num_actors
        return k, self._actors[k].extend.remote(data)

    def writer(
        self,
        max_rows: Optional[int] = None,
        max_in_flight: int = 2,
        timeout: Optional[float] = None,
        max_bytes: int = 8 << 20,
        indices: bool = False,
    ) -> RayWriter:
        """A :class:`RayWriter` for one collector: chunks gathered into shipments of
        ``max_rows`` rows (by default as many as fit in ``max_bytes``, 8 MiB: on a
        2-core machine, mujoco rows from two collectors reach about 7 million a second
        from 4 MiB shipments on, against 1.6 million at 0.7 MiB), up to
        ``max_in_flight`` shipments on their way at once, and waits for an
        acknowledgement of at most ``timeout`` seconds each (None: as long as it takes,
        e.g. while a rate limit holds the collector back). ``indices``: keep the
        global indices of the rows stored, for :meth:`RayWriter.flush` to return (8
        bytes a row until the flush); off, a writer keeps nothing per row, so a
        collector that never flushes does not grow."""
        return RayWriter(self, max_rows, max_in_flight, timeout, max_bytes, indices)

    def add(self, data: Dict[Any, Any]) -> int:
        """Writes one transition (a dict of arrays of the field shapes, or of Python
        values; nested dicts for nested keys), as a local buffer's ``add`` takes it."""
        one = {key: _one_row(v) for key, v in _leaves(data, arrays=False)}
        return int(self.extend(one)[0])

    def sample(self, batch_size: Optional[int] = None) -> Dict[Any, np.ndarray]:
        """Draws ``batch_size`` rows from the actors, in parallel: in proportion to the
        rows they hold, or for a prioritized sampler to their priority mass, so that
        a row's chance is its priority's share of all the actors' (``index`` is
        global). Each actor weighs its rows against its own smallest mass; the weights
        are then brought to the smallest of all, ``(min / mass) ** beta`` as a single
        buffer gives them. The split reads the actors' figures just before the draws:
        priorities set meanwhile move it a little, as they would move one buffer's. A
        slice sampler's batch is split in whole slices. Without ``batch_size``, the
        buffer's ``batch_size``."""
        if batch_size is None:
            batch_size = self._batch_size
        if batch_size is None:
            raise replaybuf.ReplayBufferValueError(
                "give a batch size: sample(n), or batch_size= when building"
            )
        if batch_size < 0:
            raise replaybuf.ReplayBufferValueError(f"a batch of {batch_size} rows")
        if self.num_actors == 1:
            # Arrays out of Ray's object store are read-only; a batch of several
            # actors' rows (concatenated) and one buffer's are not.
            got = self._get(self._actors[0].sample.remote(batch_size))
            return {key: a if a.flags.writeable else a.copy() for key, a in got.items()}
        if self._fifo:
            return self._sample_queues(batch_size)
        shares = self._get([a.shares.remote() for a in self._actors])
        prioritized = shares[0][1] is not None
        weights = np.array([m[0] if prioritized else n for n, m, _ in shares], np.float64)
        if weights.sum() == 0:
            raise replaybuf.ReplayBufferValueError("the buffer is empty")
        unit = self._unit
        if batch_size % unit:
            raise replaybuf.ReplayBufferValueError(
                f"a batch of {batch_size} rows does not split into slices of {unit}"
            )
        counts = self._rng.multinomial(batch_size // unit, weights / weights.sum()) * unit
        # An actor drawn for no row is not asked, but one always is: a batch of no rows
        # carries every key, with its dtype, as one buffer's does.
        asked = [k for k, c in enumerate(counts) if c] or [int(np.argmax(weights))]
        parts = [(k, self._actors[k].sample.remote(int(counts[k]))) for k in asked]
        got = self._get([ref for _, ref in parts])
        if prioritized:
            lowest = min(m[1] for _, m, _ in shares if m[1] > 0)
            for (k, _), part in zip(parts, got):
                _, (_, smallest), beta = shares[k]
                # Arrays out of Ray's object store are read-only: a new one.
                part["weight"] = part["weight"] * np.float32((lowest / smallest) ** beta)
        return self._merge(zip((k for k, _ in parts), got))

    def _sample_queues(self, batch_size: int) -> Dict[Any, np.ndarray]:
        """A FIFO buffer's batch: each actor is a queue, asked in turn (from one picked
        at random) for the rows still missing, as one buffer's batch takes from its
        shards; short when fewer rows wait, and "empty" only when no actor has any."""
        parts, left = [], batch_size
        # The actors with rows not taken yet, from one picked at random: a drained
        # one's sample would wait on its own queue's limit while others hold rows
        # (picked by size, which counts taken rows, a batch waited on drained actors
        # for good). All of them when none has any (the batch then waits as one
        # buffer's would).
        queued = self._get([a.queued.remote() for a in self._actors])
        holding = [k for k in range(self.num_actors) if queued[k] > 0] or list(
            range(self.num_actors)
        )
        start = int(self._rng.integers(len(holding)))
        for i in range(len(holding)):
            k = holding[(start + i) % len(holding)]
            try:
                part = self._get(self._actors[k].sample.remote(left))
            except replaybuf.ReplayBufferError as e:
                if isinstance(e, replaybuf.ReplayBufferValueError) and "empty" in str(e):
                    continue
                if parts:
                    # The rows taken from the actors before are theirs no more: the
                    # batch goes out short rather than losing them.
                    break
                raise
            parts.append((k, part))
            left -= len(part[_INDEX])
            if left == 0:
                break
        if not parts:
            raise replaybuf.ReplayBufferValueError("the buffer is empty")
        return self._merge(parts)

    def update_priority(self, index, priority, generation=None) -> tuple:
        """Sets priorities, each index routed to the actor that holds it; returns
        (applied, stale) summed over the actors."""
        shard, local = self._split(index)
        try:
            priority = np.asarray(priority, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise replaybuf.ReplayBufferTypeError(f"priorities must be numbers: {e}") from e
        n = len(local)
        # One priority a row (or the same number of values each, reduced by the actor),
        # row by row: a [2, 3] for 3 indices was regrouped into pairs.
        lines_up = priority.size == 0 if n == 0 else priority.size and priority.size % n == 0
        if priority.ndim > 1 and priority.shape[0] != n:
            lines_up = False
        if not lines_up:
            raise replaybuf.ReplayBufferValueError(
                f"{n} indices and priorities of shape {priority.shape} do not line up"
            )
        # Checked here, for the whole update: each actor refuses its own part only, and
        # the others applied theirs.
        if not np.all(np.isfinite(priority) & (priority >= 0)):
            raise replaybuf.ReplayBufferValueError(
                "priorities must be finite and non-negative (NaN, infinite or negative "
                "ones change nothing)"
            )
        gen = None if generation is None else np.asarray(generation, np.uint64).reshape(-1)
        if gen is not None and len(gen) != n:
            raise replaybuf.ReplayBufferValueError(
                f"{n} indices and {len(gen)} generations do not line up"
            )
        if n == 0:
            return 0, 0
        # Checked here too: the actor holding an index past the capacity refused its
        # part, after the others applied theirs. Actor k holds the global indices
        # k, k + num_actors, ... below the capacity.
        past = (local != _PADDING) & (local * np.uint64(self.num_actors) + shard >= self.capacity)
        if past.any():
            bad = int(local[past][0] * self.num_actors + shard[past][0])
            raise replaybuf.ReplayBufferIndexError(
                f"index {bad} is out of range for capacity {self.capacity}"
            )
        priority = priority.reshape(len(local), -1)
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


def _described(sampler: Any) -> dict:
    """A sampler as the engine reads it: its description dict (``{}`` for none)."""
    if sampler is None:
        return {}
    if isinstance(sampler, dict):
        return sampler
    return sampler._describe() if hasattr(sampler, "_describe") else {}


def _without_replacement(sampler: dict) -> bool:
    """Whether a described sampler draws in epochs (every row once before any twice)."""
    kind = sampler.get("kind")
    return kind == "without_replacement" or (
        kind == "slice" and sampler.get("without_replacement") is not None
    )


def _leaves(data: Dict[Any, Any], prefix: tuple = (), arrays: bool = True):
    """``(key, array)`` for every array of a dict of arrays (nested dicts give tuple
    keys, as the buffer's fields name them); the values as given unless ``arrays``."""
    for key, value in data.items():
        path = prefix + (key if isinstance(key, tuple) else (key,))
        if isinstance(value, dict):
            yield from _leaves(value, path, arrays)
        else:
            yield (path[0] if len(path) == 1 else path), np.asarray(value) if arrays else value


def _one_row(value: Any) -> Any:
    """One row of a field as a batch of one: an array gains a leading dim; a Python
    value becomes a list of one, which the buffer converts to the field's dtype as
    its values allow (``np.asarray(3.0)`` would be float64, refused by a float32
    field)."""
    return np.expand_dims(value, 0) if isinstance(value, np.ndarray) else [value]


class _InPlace:
    """The shared buffers of the actors on this process's node (``local_writes``),
    which it extends in place: attached at the first extend, and again after one of
    their actors died. Each process has its own (it is never pickled)."""

    def __init__(self, rb: RayReplayBuffer):
        # The actors, not the buffer: the buffer holds this, and a cycle between the
        # two kept a finished task's buffer (and its shard's lease) until a garbage
        # collection, so the next collector found no free shard and shipped its rows.
        self._actors = rb._actors
        # (actor, buffer, actor's pid); None until looked for; empty: ship everything.
        self._attached: Optional[List[tuple]] = None
        self._turn = 0
        self._checked = 0.0  # when the attached actors were last seen alive

    def ready(self, timeout: Optional[float]) -> bool:
        """Whether there are actors on this node to extend in place."""
        if self._attached is None:
            here = ray.get_runtime_context().get_node_id()
            regions = RayReplayBuffer._get([a.local_region.remote() for a in self._actors], timeout)
            self._attached = []
            for k, region in enumerate(regions):
                if region is not None and region[0] == here:
                    try:
                        self._attached.append(
                            (k, replaybuf.ReplayBuffer.attach(region[2]), region[1])
                        )
                    except replaybuf.ReplayBufferError:
                        pass  # gone meanwhile, or not ours to open: ship to it
        return bool(self._attached)

    def extend(self, data: Dict[Any, Any]) -> Optional[tuple]:
        """Extends the next same-node actor's buffer in place: ``(actor, local
        indices)``, stored on return; None if no shard of that buffer is free for
        this process (the caller ships the rows, and will from now on)."""
        k, buffer, pid = self._attached[self._turn % len(self._attached)]
        now = time.monotonic()
        if now - self._checked >= _ALIVE_EVERY_S:
            for k_, _, pid_ in self._attached:
                if not _alive(pid_):
                    # Attach to the restarted actor's buffer on the next extend.
                    self._attached = None
                    raise ReplayBufferUnavailable(f"buffer actor {k_} (pid {pid_}) is gone")
            self._checked = now
        try:
            local = buffer.extend(data)
        except replaybuf.ReplayBufferValueError as e:
            if "shards of the shared buffer are held" not in str(e):
                raise
            self._attached = [a for a in self._attached if a[0] != k]
            return None
        self._turn += 1
        return k, local


class RayWriter:
    """A collector's writer into a :class:`RayReplayBuffer` (``rb.writer()``): chunks
    are copied into a shipment of ``max_rows`` rows (else of ``max_bytes``), and a full
    shipment goes to the next actor in turn without waiting for the answer. Before it
    takes a chunk, a writer with ``max_in_flight`` shipments on their way waits for the
    oldest, so a collector that outruns the actors (or that a rate limit holds back) is
    held back too, for at most ``timeout`` seconds a wait.

    A writer on the node of actors that keep their buffers in shared memory
    (``local_writes``) writes those buffers in place instead, each chunk to the next
    such actor in turn: a chunk is stored (acknowledged) when ``extend`` returns,
    nothing is ever in flight, and a rate limit holds the writer back as it holds any
    process of a shared buffer (for the limit's own insert timeout).

    Rows are stored once their shipment's extend returns: :attr:`acknowledged`
    counts them, and :meth:`flush` sends the rows gathered and waits for every
    shipment, returning the global indices stored since the last flush when the
    writer keeps them (``indices=True``). A collector
    that dies loses only the rows not yet acknowledged. A shipment whose actor died
    on the way raises :class:`ReplayBufferUnavailable` (from ``extend`` or ``flush``)
    and is kept: the next call sends it again, to the next actor in turn (so a row
    that had landed before its actor died may be stored twice: at least once, as
    Reverb's writers retry). An ``extend`` that raises has taken nothing of its chunk;
    one that returns has taken all of it. A writer is one collector's: not for
    several threads.

    The first ``extend`` is sent and waited for at once, so that data the buffer
    refuses raises there (unless the wait outlasts ``timeout``: the chunk is then on
    its way, as later ones are); the chunks after it must have the same fields, dtypes
    and row shapes (else ReplayBufferValueError, and nothing of that chunk is taken).
    A shipment whose actor's own rate limit timed out is kept and sent again, as one
    whose actor died; one the buffer refused (a closed rate limit) is dropped, its
    error raised.
    """

    def __init__(
        self,
        rb: RayReplayBuffer,
        max_rows: Optional[int],
        max_in_flight: int,
        timeout: Optional[float],
        max_bytes: int,
        indices: bool = False,
    ):
        if (max_rows is not None and max_rows < 1) or max_in_flight < 1 or max_bytes < 1:
            raise replaybuf.ReplayBufferValueError(
                "a writer needs max_rows, max_in_flight and max_bytes of at least 1"
            )
        self._rb = rb
        # None until the first chunk tells the bytes of a row.
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._max_in_flight = max_in_flight
        self._timeout = timeout
        # The shipment being gathered: one array per field, rows 0.._filled written;
        # and spare ones (a shipment's arrays are kept until it is acknowledged, to
        # send again if its actor dies).
        self._stage: Optional[Dict[Any, np.ndarray]] = None
        self._filled = 0
        self._spare: List[Dict[Any, np.ndarray]] = []
        # Shipments sent and not yet answered, oldest first: (actor, ref, arrays of the
        # rows, the stage they lie in); and those whose actor died, to send again.
        self._in_flight: List[tuple] = []
        self._resend: List[tuple] = []
        # (actor, local indices) of the rows acknowledged since the last flush: made
        # global only when a flush asks (a collector writes millions of rows).
        self._stored: Optional[List[tuple]] = [] if indices else None
        #: Rows stored so far (their shipments answered).
        self.acknowledged = 0
        # The same-node actors' buffers, written in place while there are any.
        self._here = _InPlace(rb)

    @property
    def pending(self) -> int:
        """Rows gathered or on their way, not yet acknowledged."""
        shipments = [data for _, _, data, _ in self._in_flight]
        shipments += [data for data, _ in self._resend]
        return self._filled + sum(map(_rows_of, shipments))

    def extend(self, data: Dict[Any, Any]) -> None:
        """Takes a chunk (a dict of arrays, as :meth:`RayReplayBuffer.extend` takes),
        copying it: the caller may reuse its arrays at once."""
        if self._stage is None and self._here.ready(self._timeout):
            stored = self._here.extend(data)
            if stored is not None:
                self._keep(*stored)
                self.acknowledged += len(stored[1])
                return
        leaves = dict(_leaves(data))
        if self._stage is None:
            # The first chunk goes straight through: refused data raises here.
            k, ref = self._rb._ship(leaves)
            try:
                self._keep(k, self._rb._get(ref, self._timeout))
                self.acknowledged += _rows_of(leaves)
            except _NoAnswer:
                # Still on its way, and the actor stores it: taken, as a later
                # chunk's shipment is (raised, the caller sent it again, and its rows
                # were stored twice).
                copy = {key: np.array(a) for key, a in leaves.items()}
                self._in_flight.append((k, ref, copy, None))
            if self._max_rows is None:
                # From the fields' shapes: a first chunk of no rows has no row to size.
                row = sum(a.dtype.itemsize * int(np.prod(a.shape[1:])) for a in leaves.values())
                self._max_rows = max(1, self._max_bytes // max(1, row))
            self._stage = self._new_stage(leaves)
            return
        self._check(leaves)
        # Waits only before anything is taken: a chunk is taken whole or not at all.
        while len(self._in_flight) >= self._max_in_flight:
            self._wait_oldest(self._timeout)
        self._send_resends()
        rows, done = _rows_of(leaves), 0
        while done < rows:
            take = min(rows - done, self._max_rows - self._filled)
            for key, a in leaves.items():
                self._stage[key][self._filled : self._filled + take] = a[done : done + take]
            self._filled += take
            done += take
            if self._filled == self._max_rows:
                self._send_stage()

    def add(self, data: Dict[Any, Any]) -> None:
        """Takes one transition (a dict of arrays of the field shapes)."""
        self.extend({key: np.expand_dims(a, 0) for key, a in _leaves(data)})

    def flush(self, timeout: Optional[float] = None) -> Optional[np.ndarray]:
        """Sends the rows gathered and waits for every shipment (each for at most
        ``timeout`` seconds, else the writer's); returns the global indices of the
        rows stored since the last flush, in the order they were acknowledged, if the
        writer keeps them (``indices=True``), else None."""
        if self._filled:
            self._send_stage()
        self._send_resends()
        while self._in_flight:
            self._wait_oldest(timeout if timeout is not None else self._timeout)
        if self._stored is None:
            return None
        stored = [self._rb._global(local, k) for k, local in self._stored]
        self._stored = []
        if not stored:
            return np.empty(0, np.uint64)
        return np.concatenate(stored)

    def __enter__(self) -> RayWriter:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.flush()

    # ------------------------------------------------------------- internals

    def _keep(self, k: int, local: np.ndarray) -> None:
        """Keeps actor ``k``'s local indices of rows stored, if the writer keeps any."""
        if self._stored is not None:
            self._stored.append((k, local))

    def _new_stage(self, like: Dict[Any, np.ndarray]) -> Dict[Any, np.ndarray]:
        if self._spare:
            return self._spare.pop()
        return {key: np.empty((self._max_rows,) + a.shape[1:], a.dtype) for key, a in like.items()}

    def _check(self, leaves: Dict[Any, np.ndarray]) -> None:
        stage = self._stage
        if leaves.keys() != stage.keys():
            raise replaybuf.ReplayBufferValueError(
                f"this writer's chunks hold the fields {sorted(map(str, stage))}; "
                f"got {sorted(map(str, leaves))}"
            )
        rows = {a.shape[0] if a.ndim else -1 for a in leaves.values()}
        for key, a in leaves.items():
            like = stage[key]
            if a.dtype != like.dtype or a.shape[1:] != like.shape[1:]:
                raise replaybuf.ReplayBufferValueError(
                    f"`{key}`: this writer's chunks hold {like.dtype} rows of shape "
                    f"{like.shape[1:]}; got {a.dtype} of shape {a.shape[1:]}"
                )
        if len(rows) != 1 or -1 in rows:
            raise replaybuf.ReplayBufferValueError(
                "a chunk holds one array per field, all of the same number of rows"
            )

    def _send_stage(self) -> None:
        """Sends the rows gathered, and starts gathering in another stage (this one
        is kept until the shipment is answered)."""
        n, self._filled = self._filled, 0
        stage, self._stage = self._stage, self._new_stage(self._stage)
        self._send({key: a[:n] for key, a in stage.items()}, stage)

    def _send_resends(self) -> None:
        while self._resend:
            self._send(*self._resend.pop(0))

    def _send(self, data: Dict[Any, np.ndarray], stage) -> None:
        k, ref = self._rb._ship(data)
        self._in_flight.append((k, ref, data, stage))

    def _wait_oldest(self, timeout: Optional[float]) -> None:
        k, ref, data, stage = self._in_flight[0]
        try:
            local = self._rb._get(ref, timeout)
        except _NoAnswer:
            raise  # still on its way: waited for again next time
        except (ReplayBufferUnavailable, replaybuf.ReplayBufferTimeoutError):
            # The actor died, or its buffer's own wait (a rate limit's insert
            # timeout) ran out: nothing stored, sent again with the next call.
            self._in_flight.pop(0)
            self._resend.append((data, stage))
            raise
        except replaybuf.ReplayBufferError:
            # Refused (a closed rate limit, rows the buffer will not take): its
            # rows are dropped with the error. Left in flight, every later call
            # raised the same error again, and nothing else was ever sent.
            self._in_flight.pop(0)
            self._release(stage)
            raise
        self._in_flight.pop(0)
        self._release(stage)
        self._keep(k, local)
        self.acknowledged += _rows_of(data)

    def _release(self, stage) -> None:
        """Keeps a shipment's stage for a later one (a first chunk's has none)."""
        if stage is not None:
            self._spare.append(stage)


# How often a writer looks whether the actors whose buffers it writes in place are
# alive (reading /proc costs about a tenth of a 1,000-row chunk's extend). Rows written
# in place after an actor died are lost with it, as are rows it acknowledged after
# its last checkpoint: checking more often would not keep them.
_ALIVE_EVERY_S = 0.05


# The name of an actor's shared region (`_BufferActor._shared`): the buffer's
# `ray-<12 hex digits>`, the actor's number, and the actor process's pid.
_ACTOR_REGION = re.compile(r"replaybuf\.ray-[0-9a-f]{12}-[0-9]+-([0-9]+)")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` (on this node, Linux) runs: a process killed but not
    yet reaped by its parent (a zombie) does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the command name, which is in parentheses and may hold any.
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")


def _rows_of(data: Dict[Any, np.ndarray]) -> int:
    return len(next(iter(data.values())))
