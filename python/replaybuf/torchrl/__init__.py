"""replaybuf behind TorchRL's replay-buffer classes: change one import.

>>> # was: from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
>>> from replaybuf.torchrl import LazyTensorStorage, TensorDictReplayBuffer
>>> rb = TensorDictReplayBuffer(storage=LazyTensorStorage(1_000_000), batch_size=256)

The classes take TorchRL's arguments (the common subset; see below) and behave as
TorchRL's do: TensorDicts in and out with nested keys, ``"index"`` and
``"priority_weight"`` in samples, TorchRL's importance-weight formula, slice samplers
that report ``("next", "truncated")``/``done``/``terminated`` at slice ends and set a
stored ``is_init`` at slice starts, FIFO eviction, ``rb[i]``/``rb[:]``, ``dumps``/
``loads``, transforms, and :class:`ReplayBufferTrainer` for TorchRL's ``Trainer``.
``split_trajectories`` is TorchRL's own.

The rows live in replaybuf's engine: a buffer takes its fields (keys, dtypes, shapes)
from the first data written to it, and every ``extend``/``sample`` is one call into
Rust with the GIL released (a :class:`TensorDictMaxValueWriter`'s ``extend``, one per
row, so that ``write_count`` counts as TorchRL's does). Tensors go in without a copy on
the Python side, and sampled arrays become the returned tensors without one.

Differences from TorchRL, on purpose
------------------------------------
- **No global lock.** TorchRL serialises every call on one lock; here collector
  threads ``extend`` while learner threads ``sample`` and ``update_priority``, truly
  in parallel, and a sampled row is never torn.
- **Stale priorities are not applied.** ``update_priority`` given the ``index`` of the
  buffer's latest sample skips rows that were overwritten since that sample (TorchRL
  re-prioritises whatever now occupies the slot). Any other index behaves as TorchRL.
- **Fields are fixed by the first write.** A later batch with a key the first lacked
  raises ``KeyError``, and a missing key raises too (TorchRL adds the key, or keeps
  the old values). The ``"index"`` entry of written TensorDicts is metadata and is not
  stored.
- **Storage is host memory or a file.** ``device=`` says where samples are handed
  out; rows are stored by the engine, not as tensors on that device.
  ``LazyMemmapStorage`` keeps replaybuf's file format under ``scratch_dir``; with
  ``existsok=True`` over a directory a buffer of this module wrote, the new buffer
  opens its rows and goes on from them, from the start (TorchRL starts an empty
  buffer there and writes over it).
- **Epochs.** A sampler without replacement covers the rows stored when its epoch
  began; writes during an epoch do not restart it (TorchRL reshuffles when the length
  changes). ``SliceSamplerWithoutReplacement`` cuts every trajectory into consecutive
  windows of the slice length and draws each window once per epoch, so every row of a
  whole window is seen once per epoch (every row, with ``strict_length=False``, whose
  shorter last windows are drawn too; TorchRL draws one slice per trajectory per
  epoch).
- **Random streams.** Draws come from the engine's generators, seeded from
  ``generator=``'s seed or, without one, from torch's global generator when the
  buffer is made: ``torch.manual_seed`` makes runs repeatable, but the rows drawn are
  not the ones TorchRL would draw. ``set_rng`` takes effect when the engine buffer is
  made, on the first write: called after it, it changes nothing (TorchRL reseeds).
- **Checkpoints.** ``dumps``/``loads`` write replaybuf's checkpoint (crash-safe,
  checksummed; priorities and sampler state included) plus ``torchrl.json``; the
  directory is not TorchRL's layout. Save hooks get the stored rows in storage order
  and what they return is memory-mapped under ``<dir>/storage``; load hooks get the
  loaded rows and what they return is written back. ``state_dict`` holds the same
  files as ``uint8`` tensors (``torch.load``'s default ``weights_only=True`` loads
  them; an older state dict of bytes still loads). Buffers are not pickled or
  deep-copied: ``state_dict`` or ``dumps`` one, and load it into another.
- **Swaps.** ``set_sampler`` and ``set_writer`` keep the stored rows, drawn by the new
  sampler (a prioritized one keeps a prioritized one's priorities; TorchRL's new
  sampler starts without the rows, and a prioritized one cannot sample them).
  ``set_storage`` starts over on the new storage as TorchRL's does, with new fields
  fixed by its first write; ``write_count`` goes on across all three.
- **Errors** are replaybuf's (``ReplayBufferError`` subclasses of ``ValueError``,
  ``TypeError``, ``KeyError``, ``IndexError``) where the engine refuses data, e.g. a
  dtype that differs from the stored field's (TorchRL raises ``RuntimeError``). A
  sample the engine cannot draw raises an error that is both a ``ValueError`` and a
  ``RuntimeError``, so either ``except`` clause catches it; a read of a buffer not
  written yet, one that is both an ``IndexError`` and a ``RuntimeError``.
- ``update_tensordict_priority`` on a TensorDict without the priority key changes
  nothing (TorchRL resets those rows to the default priority).

Not offered: ``ListStorage`` (arbitrary Python objects), ``shared=True`` (use
``replaybuf.ReplayBuffer(shared=...)``), ``checkpointer=``, ``consume_after_n_samples``,
``sample_unit``, ensembles, and the slice samplers' ``end_keys``, ``ends``,
``trajectories``, ``fragmented`` and ``pad_output``. ``prefetch``, ``compilable``,
``delayed_init``, ``cache_values``, ``use_gpu`` and ``compile`` are accepted and have
nothing to do; so have a ``PrioritizedSampler``'s ``max_capacity`` and ``dtype`` (its
tree covers the storage, in float64). ``ImmutableDatasetWriter`` needs a
:class:`TensorStorage` built from the dataset's rows. On an ``ndim=2`` storage,
``rb[:]`` reads every step; ``add``, ``write_all`` and other indexing need ``ndim=1``.
Item assignment (``rb[index] = data``) rewrites stored rows: a position that holds
none is an ``IndexError`` (TorchRL writes it without counting it), a negative index
counts back from the rows stored, as reading ``rb[-1]`` does in both (TorchRL's
assignment counts it back from the capacity). On a frames buffer, whose ``rb[:]``
leaves out the steps it cannot rebuild, a negative index, a slice and a mask pick
among the rows ``rb[:]`` reads, as indexing it would (a mask has one boolean for each
of them); a non-negative index is a storage position, as TorchRL's. On a slice
sampler's buffer a rewrite that would move a row to another trajectory (its id, end or
truncation flag) is refused whole. A ``PrioritizedSliceSampler`` draws a slice's start
by priority among rows that can start one, as TorchRL's does (with
``strict_length=False``, a trajectory shorter than the slice starts one at its first
row): ``span`` is not applied. A tensorclass comes
back as its class from the buffer that stored it; one loaded from disk reads back
TensorDicts.
"""

from torchrl.collectors.utils import split_trajectories

from .replay_buffers import PrioritizedReplayBuffer, ReplayBuffer
from .samplers import (
    PrioritizedSampler,
    PrioritizedSliceSampler,
    RandomSampler,
    Sampler,
    SamplerWithoutReplacement,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from .storages import LazyMemmapStorage, LazyTensorStorage, Storage, TensorStorage
from .tensordict_buffers import TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer
from .trainers import ReplayBufferTrainer
from .writers import (
    ImmutableDatasetWriter,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
    Writer,
)

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "TensorDictReplayBuffer",
    "TensorDictPrioritizedReplayBuffer",
    "Storage",
    "TensorStorage",
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "Sampler",
    "RandomSampler",
    "SamplerWithoutReplacement",
    "PrioritizedSampler",
    "SliceSampler",
    "SliceSamplerWithoutReplacement",
    "PrioritizedSliceSampler",
    "Writer",
    "RoundRobinWriter",
    "TensorDictRoundRobinWriter",
    "TensorDictMaxValueWriter",
    "ImmutableDatasetWriter",
    "ReplayBufferTrainer",
    "split_trajectories",
]
