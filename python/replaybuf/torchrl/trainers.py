"""``ReplayBufferTrainer``: the hooks that put a replay buffer into a TorchRL
``Trainer``'s loop."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from tensordict import TensorDictBase, pad
from torchrl.trainers.trainers import Trainer, TrainerHookBase

from .samplers import PrioritizedSampler

__all__ = ["ReplayBufferTrainer"]


class ReplayBufferTrainer(TrainerHookBase):
    """Replay buffer hooks for a TorchRL ``Trainer``: collected batches go into the
    buffer (``batch_process``), each optimisation step trains on a sample
    (``process_optim_batch``), and the loss's new priorities go back (``post_loss``).

    Args:
        replay_buffer: a :class:`~replaybuf.torchrl.TensorDictReplayBuffer` (or
            another buffer of this package).
        batch_size: rows per sample (default: the buffer's).
        memmap: accepted for TorchRL's signature; it has no effect there either.
        device: where samples are moved before training.
        flatten_tensordicts: write collected ``[envs, time]`` batches as flat rows
            (keeping the collector's ``("collector", "mask")`` rows when present,
            else marking each env's last step truncated).
        max_dims: without flattening, pad each batch dimension up to these sizes
            (-1: no padding) so every written batch has one shape.
        iterate: sample by iterating over the buffer (epochs) instead of
            :meth:`sample` calls; the iteration restarts when it runs out.
    """

    def __init__(
        self,
        replay_buffer: Any,
        batch_size: Optional[int] = None,
        memmap: bool = False,
        device: Any = None,
        flatten_tensordicts: bool = False,
        max_dims: Optional[Sequence[int]] = None,
        iterate: bool = False,
    ) -> None:
        self.replay_buffer = replay_buffer
        if hasattr(replay_buffer, "update_tensordict_priority"):
            self._update_priority = replay_buffer.update_tensordict_priority
        else:
            if isinstance(replay_buffer.sampler, PrioritizedSampler):
                raise ValueError(
                    "Prioritized sampler not supported for replay buffer trainer if not "
                    "within a TensorDictReplayBuffer"
                )
            self._update_priority = None
        self.batch_size = batch_size
        self.memmap = memmap
        self.device = device
        self.flatten_tensordicts = flatten_tensordicts
        self.max_dims = max_dims
        self.iterate = iterate
        if iterate:
            self.replay_buffer_iter = iter(self.replay_buffer)

    def extend(self, batch: TensorDictBase) -> TensorDictBase:
        """Writes a collected batch (flattened or padded as configured)."""
        if self.flatten_tensordicts:
            if ("collector", "mask") in batch.keys(True):
                batch = batch[batch.get(("collector", "mask"))]
            else:
                if "truncated" in batch["next"]:
                    batch = _truncate_last_steps(batch)
                batch = batch.reshape(-1)
        elif self.max_dims is not None:
            pads = []
            for d in range(batch.ndimension()):
                pad_value = 0 if self.max_dims[d] == -1 else self.max_dims[d] - batch.batch_size[d]
                pads += [0, pad_value]
            batch = pad(batch, pads)
        batch = batch.cpu()
        self.replay_buffer.extend(batch)
        return batch

    def sample(self, batch: TensorDictBase) -> TensorDictBase:
        """A batch to train on (the collected ``batch`` is not used)."""
        if self.iterate:
            try:
                sample = next(self.replay_buffer_iter)
            except StopIteration:
                self.replay_buffer_iter = iter(self.replay_buffer)
                raise
        else:
            sample = self.replay_buffer.sample(batch_size=self.batch_size)
        return sample.to(self.device) if self.device is not None else sample

    def update_priority(self, batch: TensorDictBase) -> None:
        """Writes the loss's priorities (the buffer's ``priority_key``) back."""
        if self._update_priority is not None:
            self._update_priority(batch)

    def state_dict(self) -> Dict[str, Any]:
        return {"replay_buffer": self.replay_buffer.state_dict()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.replay_buffer.load_state_dict(state_dict["replay_buffer"])

    def register(self, trainer: Trainer, name: str = "replay_buffer") -> None:
        """Hooks :meth:`extend`, :meth:`sample` and :meth:`update_priority` into
        ``trainer`` at ``batch_process``, ``process_optim_batch`` and ``post_loss``."""
        trainer.register_op("batch_process", self.extend)
        trainer.register_op("process_optim_batch", self.sample)
        trainer.register_op("post_loss", self.update_priority)
        trainer.register_module(name, self)


def _truncate_last_steps(batch: TensorDictBase) -> TensorDictBase:
    """``batch`` with each env's last step (the last batch dimension's) marked
    truncated, the caller's batch left as it was. TorchRL's hook writes
    ``batch["next", "truncated"][..., -1] = True`` into the collector's batch,
    which indexes the flag's own trailing dimension: every step of a ``[E, T, 1]``
    flag came out truncated, each a trajectory of one step to a slice sampler."""
    truncated = batch.get(("next", "truncated")).clone()
    truncated[(slice(None),) * (batch.batch_dims - 1) + (-1,)] = True
    batch = batch.clone(False)
    batch.set(("next", "truncated"), truncated)
    return batch
