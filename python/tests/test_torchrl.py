"""replaybuf.torchrl against torchrl.data: the same test bodies run on both modules.

Each test that takes ``rl`` runs twice, once with ``torchrl.data`` and once with
``replaybuf.torchrl``, and asserts behaviour both must have (keys, shapes, dtypes,
eviction order, epochs, slice windows, importance weights, ...), so a difference
between the two fails one of the runs. Tests named ``test_replaybuf_*`` check what
replaybuf does on purpose differently (see the module docstring of
``replaybuf.torchrl``).
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest
import replaybuf.torchrl
import torch
import torchrl.collectors.utils
import torchrl.data
import torchrl.trainers
from tensordict import TensorDict, tensorclass

MODULES = {"torchrl": torchrl.data, "replaybuf": replaybuf.torchrl}


@tensorclass
class Transition:
    obs: torch.Tensor
    reward: torch.Tensor


# What TorchRL keeps outside torchrl.data, replaybuf.torchrl has beside the buffers.
ELSEWHERE = {
    "ReplayBufferTrainer": torchrl.trainers.ReplayBufferTrainer,
    "split_trajectories": torchrl.collectors.utils.split_trajectories,
}


def face(rl, name):
    """``rl``'s ``name``: from the module, or where TorchRL keeps it."""
    return getattr(rl, name) if rl is replaybuf.torchrl else ELSEWHERE[name]


@pytest.fixture(params=list(MODULES))
def rl(request):
    """The module under test: torchrl.data or replaybuf.torchrl."""
    torch.manual_seed(0)
    return MODULES[request.param]


def transitions(n, start=0):
    """``n`` transitions whose every field derives from the step number."""
    step = torch.arange(start, start + n)
    return TensorDict(
        {
            "obs": step.float()[:, None].expand(n, 3).clone(),
            "action": (step % 4).long()[:, None],
            "step": step,
            "pixels": (step % 256).to(torch.uint8)[:, None, None].expand(n, 2, 2).clone(),
            ("next", "obs"): (step + 1).float()[:, None].expand(n, 3).clone(),
            ("next", "reward"): step.float()[:, None] / 10,
            ("next", "done"): (step % 5 == 4)[:, None],
        },
        [n],
    )


def trajectories(lengths, start_id=0):
    """Trajectories of the given lengths, back to back: ``episode`` ids, ``t`` the step
    within the trajectory, ``obs`` a global counter, ``("next", "done")`` at each end."""
    episode = torch.cat([torch.full((n,), start_id + i) for i, n in enumerate(lengths)])
    t = torch.cat([torch.arange(n) for n in lengths])
    done = torch.cat([torch.arange(n) == n - 1 for n in lengths])[:, None]
    total = sum(lengths)
    return TensorDict(
        {
            "episode": episode,
            "t": t,
            "obs": torch.arange(total).float(),
            ("next", "done"): done,
            ("next", "terminated"): done.clone(),
        },
        [total],
    )


# ----------------------------------------------------------------- keys, shapes, dtypes


def test_sample_keys_shapes_and_dtypes(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(100), batch_size=8)
    rb.extend(transitions(20))
    s = rb.sample()
    assert set(s.keys(True, True)) == {
        "obs",
        "action",
        "step",
        "pixels",
        "index",
        ("next", "obs"),
        ("next", "reward"),
        ("next", "done"),
    }
    assert s.batch_size == torch.Size([8])
    assert s["next"].batch_size == torch.Size([8])
    assert s["obs"].shape == (8, 3) and s["obs"].dtype == torch.float32
    assert s["action"].shape == (8, 1) and s["action"].dtype == torch.int64
    assert s["pixels"].shape == (8, 2, 2) and s["pixels"].dtype == torch.uint8
    assert s["next", "done"].shape == (8, 1) and s["next", "done"].dtype == torch.bool
    assert s["index"].shape == (8,) and s["index"].dtype == torch.int64
    # every sampled row is the row stored at its index
    assert torch.equal(s["step"], s["index"])
    assert torch.equal(s["obs"][:, 0], s["step"].float())
    assert torch.equal(s["next", "obs"][:, 0], s["step"].float() + 1)
    assert s.device == torch.device("cpu")
    assert rb.sample(3).batch_size == torch.Size([3])


def test_bfloat16_and_sub_batch_dims_round_trip(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    td = TensorDict(
        {
            "h": torch.arange(6, dtype=torch.bfloat16)[:, None] / 4,
            "agents": TensorDict({"obs": torch.arange(18.0).reshape(6, 3, 1)}, [6, 3]),
        },
        [6],
    )
    rb.extend(td)
    s = rb.sample(5)
    assert s["h"].dtype == torch.bfloat16
    assert s["agents"].batch_size == torch.Size([5, 3])
    assert torch.equal(s["h"], td["h"][s["index"]])
    assert torch.equal(s["agents", "obs"], td["agents", "obs"][s["index"]])


def test_rows_of_several_steps_get_index_and_weights_over_every_step(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=3
    )
    rb.extend(TensorDict({"obs": torch.arange(20.0).reshape(4, 5)}, [4, 5]))  # 4 rows of 5
    s = rb.sample()
    assert s.batch_size == torch.Size([3, 5])
    # the sample's metadata is expanded over each row's steps, as its fields are
    assert s["index"].shape == (3, 5) and s["priority_weight"].shape == (3, 5)
    assert torch.equal(s["index"], s["index"][:, :1].expand(3, 5))
    assert torch.equal(s["obs"], s["index"] * 5 + torch.arange(5.0))
    assert s[:, 0]["index"].shape == (3,) and s.reshape(-1)["index"].shape == (15,)
    assert s[..., :2]["priority_weight"].shape == (3, 2)
    # one priority per row: its steps' td_errors reduced (max)
    rb.update_priority(torch.arange(4), torch.zeros(4))
    first = s["index"][:, 0]
    td_error = torch.zeros(3, 5)
    td_error[:, -1] = (first == first[0]).float()  # the last step of each draw of a row
    s.set("td_error", td_error)
    rb.update_tensordict_priority(s)
    assert set(rb.sample(50)["index"][:, 0].tolist()) == {s["index"][0, 0].item()}


def test_plain_buffer_of_tensors_and_dicts(rl):
    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(10))
    index = rb.extend(torch.arange(6.0) * 10)
    assert index.tolist() == [0, 1, 2, 3, 4, 5]
    data, info = rb.sample(4, return_info=True)
    assert isinstance(data, torch.Tensor) and data.shape == (4,)
    assert torch.equal(data, info["index"].float() * 10)
    assert rb[2].item() == 20.0
    assert rb[:].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]

    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend({"x": torch.arange(3.0)[:, None].expand(3, 2).clone(), "y": {"z": torch.arange(3)}})
    data, info = rb.sample(5, return_info=True)
    assert set(data) == {"x", "y"} and set(data["y"]) == {"z"}
    assert torch.equal(data["y"]["z"], info["index"])
    assert data["x"].shape == (5, 2)

    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(4))
    data, info = rb.sample(3, return_info=True)
    assert "index" not in data.keys()  # only TensorDict buffers put it in the sample
    assert torch.equal(data["step"], info["index"])


def test_add_one_element(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    for i in range(3):
        assert rb.add(transitions(1, start=i)[0]) == i
    assert len(rb) == 3 and rb.write_count == 3
    assert rb[:]["step"].tolist() == [0, 1, 2]


def test_fields_named_like_sample_metadata(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    n = torch.arange(6)
    rb.extend(TensorDict({"weight": n * 2.0, "marks": n * 3, "generation": n * 4}, [6]))
    s = rb.sample(20)
    assert torch.equal(s["weight"], s["index"] * 2.0)
    assert torch.equal(s["marks"], s["index"] * 3)
    assert torch.equal(s["generation"], s["index"] * 4)


def test_sample_with_info_and_key_lookup(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=5)
    rb.extend(transitions(7))
    data, info = rb.sample(return_info=True)
    assert torch.equal(info["index"], data["index"])
    assert rb["step"].tolist() == list(range(7))
    assert rb["next", "obs"][:, 0].tolist() == [float(i + 1) for i in range(7)]


def test_info_index_of_two_dims_or_slices_is_a_tuple(rl):
    # A TensorDict buffer stacks a sample's index of an ndim-2 storage, or of a slice
    # sampler, in the TensorDict, and gives TorchRL's tuple of per-dimension indices
    # in `info` (replaybuf gave the stacked tensor there too); the tuple goes back
    # into `update_priority`.
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(20, ndim=2), batch_size=6
    )
    rb.extend(TensorDict({"obs": torch.arange(12.0).reshape(3, 4)}, [3, 4]))
    data, info = rb.sample(return_info=True)
    # The storage's dimensions: time, then the batch's first (environments).
    steps, envs = info["index"]
    assert torch.equal(data["index"], torch.stack([steps, envs], -1))
    assert torch.equal(data["obs"], envs * 4.0 + steps)
    rb.update_priority(info["index"], torch.full((6,), 1e-8))
    assert rb.sample(return_info=True)[1]["index"][0].shape == (6,)

    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(20),
        sampler=rl.SliceSampler(num_slices=2, traj_key="traj"),
        batch_size=6,
    )
    rb.extend(TensorDict({"obs": torch.arange(12.0), "traj": torch.arange(12) // 6}, [12]))
    data, info = rb.sample(return_info=True)
    (index,) = info["index"]
    assert torch.equal(data["index"], index[:, None])
    assert torch.equal(data["obs"], index.float())


def test_same_seed_same_draws(rl):
    def draws(**kwargs):
        rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(100), batch_size=16, **kwargs)
        rb.extend(transitions(100))
        return [rb.sample()["step"].tolist() for _ in range(3)]

    first = draws(generator=torch.Generator().manual_seed(7))
    assert draws(generator=torch.Generator().manual_seed(7)) == first
    assert draws(generator=torch.Generator().manual_seed(8)) != first
    torch.manual_seed(3)
    global_first = draws()
    torch.manual_seed(3)
    assert draws() == global_first


# ----------------------------------------------------------------- storage order, eviction


def test_fifo_eviction_and_storage_order(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    indices = [rb.extend(transitions(5, start=5 * i)).tolist() for i in range(5)]
    assert indices == [
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
        [0, 1, 2, 3, 4],
    ]
    assert len(rb) == 10 and rb.write_count == 25
    assert rb[:]["step"].tolist() == [20, 21, 22, 23, 24, 15, 16, 17, 18, 19]
    assert rb.read_all_in_order()["step"].tolist() == rb[:]["step"].tolist()
    assert rb.read_all_in_order(end=3)["step"].tolist() == [20, 21, 22]
    assert rb[7]["step"].item() == 17
    assert rb[torch.tensor([1, 8])]["step"].tolist() == [21, 18]
    seen = set(rb.sample(200)["step"].tolist())
    assert seen <= set(range(15, 25)) and len(seen) == 10


def test_reads_keep_the_index_shape(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(6))
    for index in (torch.tensor([[5, 0], [1, 2]]), [[5, 0], [1, 2]], np.array([[5, 0], [1, 2]])):
        rows = rb[index]
        assert rows.batch_size == torch.Size([2, 2])
        assert rows["step"].tolist() == [[5, 0], [1, 2]]
        assert rows["obs"].shape == (2, 2, 3)
    assert rb[torch.zeros(0, 2, dtype=torch.long)].batch_size == torch.Size([0, 2])
    mask = torch.zeros(6, dtype=torch.bool)
    mask[[1, 3]] = True
    assert rb[mask]["step"].tolist() == [1, 3]
    for bad_mask in (torch.ones(2, 3, dtype=torch.bool), torch.ones(10, dtype=torch.bool)):
        with pytest.raises(IndexError):
            rb[bad_mask]
    plain = rl.ReplayBuffer(storage=rl.LazyTensorStorage(10))
    plain.extend(torch.arange(12).reshape(6, 2))
    assert plain[torch.tensor([[5, 0], [1, 2]])].tolist() == [[[10, 11], [0, 1]], [[2, 3], [4, 5]]]


def test_a_negative_batch_size_or_an_empty_read_is_a_runtime_error(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    for read in (lambda: rb[0], lambda: rb[:], lambda: rb.sample(2)):
        with pytest.raises(RuntimeError):
            read()
    rb.extend(transitions(6))
    with pytest.raises(RuntimeError):
        rb.sample(-1)
    assert rb.sample(0).batch_size == torch.Size([0])


def test_write_all_and_empty(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(6))
    new = transitions(3, start=100)
    rb.write_all(new, end=3)
    assert rb[:]["step"].tolist() == [100, 101, 102, 3, 4, 5]
    rb.empty()
    assert len(rb) == 0 and rb.write_count == 0
    rb.extend(transitions(2, start=50))
    assert rb[:]["step"].tolist() == [50, 51]


def test_update_priority_takes_any_index_not_only_a_samples(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(8),
        sampler=rl.PrioritizedSampler(8, alpha=1.0, beta=0.5),
    )
    index = rb.extend(transitions(4))
    rb.update_priority(index, torch.full((4,), 1e-6))
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([1e-6, 1e-6]))
    rb.update_priority(3, 1.0)
    td = TensorDict({"index": torch.tensor([2]), "td_error": torch.tensor([1e-6])}, [1])
    rb.update_tensordict_priority(td)
    drawn = rb.sample(64)["index"]
    assert (drawn == 3).sum() >= 60, drawn


def test_a_prioritized_sample_written_back_in_place(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=0.7, beta=0.5, storage=rl.LazyTensorStorage(8), batch_size=4
    )
    rb.extend(transitions(8))
    s = rb.sample()
    s["obs"] = s["obs"] + 100
    rb[s["index"]] = s
    stored = rb[s["index"]]
    assert torch.equal(stored["obs"], s["obs"])


def test_item_assignment_rewrites_stored_rows(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(6))
    rb.extend(transitions(6))
    rb[1] = transitions(1, start=101)[0]
    rb[-1] = transitions(1, start=105)[0]
    rb[torch.tensor([2, 3])] = transitions(2, start=102)
    rb[np.array([[0], [4]])] = transitions(2, start=100).reshape(2, 1)
    mask = torch.zeros(6, dtype=torch.bool)
    mask[3] = True
    rb[mask] = transitions(1, start=203)
    assert rb[:]["step"].tolist() == [100, 101, 102, 203, 101, 105]
    assert rb[:]["next", "obs"][:, 0].tolist() == [101, 102, 103, 204, 102, 106]
    rb[4:6] = transitions(2, start=304)
    rb[1:5:2] = transitions(2, start=401)
    assert rb[:]["step"].tolist() == [100, 401, 102, 402, 304, 305]
    # A key sets that field of every stored row; nothing else moves.
    rb["step"] = torch.arange(6) * 10
    assert rb[:]["step"].tolist() == [0, 10, 20, 30, 40, 50]
    assert rb[:]["obs"][:, 0].tolist() == [100, 401, 102, 402, 304, 305]
    assert len(rb) == 6 and rb.write_count == 6
    assert rb.sample(4)["step"].remainder(10).eq(0).all()


def test_item_assignment_of_the_buffers_plain_tensors(rl):
    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(5))
    rb.extend(torch.arange(4.0)[:, None].expand(4, 2).clone())
    rb[2] = torch.tensor([7.0, 8.0])
    rb[[0, 3]] = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    assert rb[:].tolist() == [[1, 1], [1, 1], [7, 8], [3, 3]]


def test_item_assignment_broadcasts_numbers_and_rows(rl):
    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(5))
    rb.extend(torch.arange(10.0).reshape(5, 2))
    rb[3] = 5.0
    rb[0:2] = torch.tensor([7.0, 8.0])
    rb[[2, 4]] = torch.tensor(0.0)
    assert rb[:].tolist() == [[7, 8], [7, 8], [0, 0], [5, 5], [0, 0]]


def test_slice_samples_mark_their_starts_without_the_other_flags(rl):
    data = TensorDict(
        {
            "obs": torch.arange(10.0),
            "episode": torch.tensor([0] * 4 + [1] * 6),
            "is_init": torch.zeros(10, 1, dtype=torch.bool),
        },
        [10],
    )
    sampler = rl.SliceSampler(slice_len=3, traj_key="episode", truncated_key=None)
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(20), sampler=sampler, batch_size=9)
    rb.extend(data)
    sample, info = rb.sample(return_info=True)
    assert sample["is_init"].reshape(-1).tolist() == [True, False, False] * 3
    assert "is_init" in info and "truncated" not in info


def test_item_assignment_past_the_stored_rows_is_refused_and_writes_nothing():
    rb = replaybuf.torchrl.TensorDictReplayBuffer(storage=replaybuf.torchrl.LazyTensorStorage(10))
    rb.extend(transitions(4))
    with pytest.raises(IndexError):
        rb[torch.tensor([1, 7])] = transitions(2, start=100)
    with pytest.raises(IndexError):
        rb[-5] = transitions(1, start=100)[0]
    with pytest.raises(ValueError):
        rb[torch.tensor([0, 1])] = transitions(3, start=100)
    assert rb[:]["step"].tolist() == [0, 1, 2, 3]
    empty = replaybuf.torchrl.ReplayBuffer(storage=replaybuf.torchrl.LazyTensorStorage(3))
    with pytest.raises(IndexError):
        empty[0] = torch.zeros(2)


def test_empty_keeping_write_count(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(6))
    rb.empty(empty_write_count=False)
    assert len(rb) == 0 and rb.write_count == 6
    assert rb.extend(transitions(2)).tolist() == [0, 1]  # the cursor starts over
    assert rb.write_count == 8


def test_write_count_counts_along_the_storages_first_dim(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(12, ndim=2))
    rb.extend(TensorDict({"x": torch.zeros(3, 4)}, [3, 4]))  # 3 envs x 4 steps
    assert rb.write_count == 4
    rb.extend(TensorDict({"x": torch.zeros(3, 2)}, [3, 2]))
    assert len(rb) == 12 and rb.write_count == 6
    rb.empty(empty_write_count=False)
    assert rb.write_count == 6


def test_write_count_of_a_max_value_writer_counts_replacements(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(4), writer=rl.TensorDictMaxValueWriter(rank_key="r")
    )
    counts = []
    for r in ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0], [7.0], [0.5]):  # each row but 0.5 replaces one
        rb.extend(TensorDict({"r": torch.tensor(r)}, [len(r)]))
        counts.append(rb.write_count)
    assert counts == [4, 6, 7, 7]
    rb.add(TensorDict({"r": torch.tensor(9.0)}, []))
    assert rb.write_count == 8
    # a row that a later row of its batch displaces counted too, and reported not written
    small = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(2), writer=rl.TensorDictMaxValueWriter(rank_key="r")
    )
    small.extend(TensorDict({"r": torch.tensor([1.0, 2.0])}, [2]))
    index = small.extend(TensorDict({"r": torch.tensor([3.0, 0.5, 4.0, 5.0])}, [4]))
    assert index.tolist() == [-1, -1, 1, 0]
    assert small.write_count == 5
    assert sorted(small[:]["r"].tolist()) == [4.0, 5.0]


def test_a_max_value_writer_passes_over_a_nan_rank_and_takes_infinite_ones(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(3), writer=rl.TensorDictMaxValueWriter(rank_key="r")
    )
    rb.extend(TensorDict({"r": torch.tensor([1.0, 2.0, 3.0]), "x": torch.arange(3)}, [3]))
    nan = float("nan")
    rb.extend(TensorDict({"r": torch.tensor([5.0, nan, 6.0]), "x": torch.arange(10, 13)}, [3]))
    assert sorted(rb[:]["r"].tolist()) == [3.0, 5.0, 6.0]
    assert rb.write_count == 5
    rb.extend(TensorDict({"r": torch.tensor([float("inf")]), "x": torch.tensor([20])}, [1]))
    assert sorted(rb[:]["x"].tolist()) == [10, 12, 20]
    assert rb.write_count == 6


def test_immutable_dataset(rl):
    data = transitions(12)
    rb = rl.TensorDictReplayBuffer(
        storage=rl.TensorStorage(data),
        writer=rl.ImmutableDatasetWriter(),
        sampler=rl.SamplerWithoutReplacement(),
        batch_size=4,
    )
    assert len(rb) == 12
    assert sorted(torch.cat([b["step"] for b in rb]).tolist()) == list(range(12))
    with pytest.raises(RuntimeError):
        rb.extend(transitions(2))


def test_a_prefilled_tensor_storage_holds_rows_no_writer_wrote(rl):
    # its data is there from the start: write_count counts the writes after it
    rb = rl.TensorDictReplayBuffer(storage=rl.TensorStorage(transitions(12)))
    assert (len(rb), rb.write_count) == (12, 0)
    rb.extend(transitions(3, start=100))
    assert (len(rb), rb.write_count) == (12, 3)
    assert sorted(rb[:]["step"].tolist()) == list(range(3, 12)) + [100, 101, 102]


# ----------------------------------------------------------------- without replacement


def test_without_replacement_every_row_once_per_epoch(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(20), sampler=rl.SamplerWithoutReplacement(), batch_size=5
    )
    rb.extend(transitions(20))
    for _ in range(3):  # three epochs of four batches
        epoch = torch.cat([rb.sample()["step"] for _ in range(4)])
        assert sorted(epoch.tolist()) == list(range(20))


def test_without_replacement_iteration_ends_with_the_epoch(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(10), sampler=rl.SamplerWithoutReplacement(), batch_size=4
    )
    rb.extend(transitions(10))
    batches = [b["step"].tolist() for b in rb]
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(sum(batches, [])) == list(range(10))
    # the next iteration is a fresh epoch
    assert sorted(sum((b["step"].tolist() for b in rb), [])) == list(range(10))


def test_without_replacement_drop_last(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(10),
        sampler=rl.SamplerWithoutReplacement(drop_last=True),
        batch_size=4,
    )
    rb.extend(transitions(10))
    batches = [b["step"].tolist() for b in rb]
    assert [len(b) for b in batches] == [4, 4]
    assert len(set(sum(batches, []))) == 8
    # sample() never returns a short batch: a new epoch starts instead
    assert [len(rb.sample()) for _ in range(5)] == [4] * 5


def test_without_replacement_drop_last_needs_a_full_batch(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(10),
        sampler=rl.SamplerWithoutReplacement(drop_last=True),
        batch_size=4,
    )
    rb.extend(transitions(3))
    with pytest.raises(ValueError):
        rb.sample()


def test_a_pytree_of_dicts_is_taken_key_by_key(rl):
    # A later extend's dict with its keys in another order goes by key, as TorchRL's
    # storages take it (replaybuf refused it as another structure); a key more or
    # fewer is a ValueError in both.
    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend({"a": torch.arange(3), "b": {"c": torch.arange(3.0)[:, None].expand(3, 2)}})
    rb.extend({"b": {"c": torch.full((2, 2), 9.0)}, "a": torch.tensor([7, 8])})
    got = rb[:]
    assert got["a"].tolist() == [0, 1, 2, 7, 8]
    assert got["b"]["c"][:, 0].tolist() == [0.0, 1.0, 2.0, 9.0, 9.0]
    for bad in (
        {"a": torch.tensor([1]), "b": {"c": torch.zeros(1, 2)}, "d": torch.zeros(1)},
        {"a": torch.tensor([1])},
        {"b": {"c": torch.zeros(1, 2), "e": torch.zeros(1)}, "a": torch.tensor([1])},
    ):
        with pytest.raises(ValueError):
            rb.extend(bad)
    if rl is replaybuf.torchrl:
        # TorchRL's writer has moved its cursor past each refused row (8 rows).
        assert len(rb) == 5


def test_a_tensorclass_is_stored_and_read_back_as_itself(rl):
    # A plain buffer stores a tensorclass's fields and gives back its class (replaybuf
    # refused it: "this buffer holds TensorDicts"); a TensorDict buffer refuses it.
    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(
        Transition(obs=torch.arange(6.0), reward=torch.arange(6.0)[:, None] * 2, batch_size=[6])
    )
    s, info = rb.sample(4, return_info=True)
    assert type(s) is Transition and s.batch_size == torch.Size([4])
    assert torch.equal(s.obs, info["index"].float())
    assert torch.equal(s.reward[:, 0], s.obs * 2)
    assert type(rb[:3]) is Transition and rb[:3].obs.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError):
        rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10)).extend(
            Transition(obs=torch.zeros(2), reward=torch.zeros(2, 1), batch_size=[2])
        )


def test_indices_before_the_first_row_are_index_errors(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(5))
    assert rb[-1]["step"].item() == 4
    assert rb[[-5, -1]]["step"].tolist() == [0, 4]
    for index in (-6, [-6], torch.tensor([0, -6])):
        with pytest.raises(IndexError):
            rb[index]


def test_without_replacement_short_of_a_batch_gives_every_row(rl):
    # Fewer rows than a batch, without drop_last: each sample is the epoch's one
    # batch, every stored row (it was refused as too few).
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(10), sampler=rl.SamplerWithoutReplacement(), batch_size=4
    )
    rb.extend(transitions(3))
    for _ in range(3):
        assert sorted(rb.sample()["step"].tolist()) == [0, 1, 2]


def test_without_replacement_in_storage_order(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(10),
        sampler=rl.SamplerWithoutReplacement(shuffle=False),
        batch_size=5,
    )
    rb.extend(transitions(10, start=40))
    assert rb.sample()["step"].tolist() == [40, 41, 42, 43, 44]
    assert rb.sample()["step"].tolist() == [45, 46, 47, 48, 49]


# ----------------------------------------------------------------- prioritized


def expected_weights(priorities, index, alpha, beta, eps):
    """TorchRL's importance weights: (p_i / p_min) ** -beta with p = (priority + eps) ** alpha."""
    p = (np.asarray(priorities, np.float64) + eps) ** alpha
    return (p[index] / p.min()) ** -beta


def test_prioritized_weights_follow_torchrls_formula(rl):
    alpha, beta, eps = 0.7, 0.5, 1e-8
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=alpha, beta=beta, eps=eps, storage=rl.LazyTensorStorage(8), batch_size=64
    )
    rb.extend(transitions(8))
    priorities = [0.5, 1.0, 2.0, 4.0, 0.25, 3.0, 1.5, 8.0]
    rb.update_priority(torch.arange(8), torch.tensor(priorities))
    s = rb.sample()
    assert s["priority_weight"].dtype == torch.float32 and s["priority_weight"].shape == (64,)
    want = expected_weights(priorities, s["index"].numpy(), alpha, beta, eps)
    np.testing.assert_allclose(s["priority_weight"].numpy(), want, rtol=1e-5)
    # rows are drawn in proportion to (p + eps) ** alpha: row 7 far more than row 4
    counts = np.bincount(rb.sample(4000)["index"].numpy(), minlength=8)
    assert counts[7] > 3 * counts[4]


def test_prioritized_zero_priority_rows_are_not_drawn(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=500
    )
    rb.extend(transitions(10))
    priority = torch.zeros(10)
    priority[[3, 7]] = 1.0
    rb.update_priority(torch.arange(10), priority)
    assert set(rb.sample()["index"].tolist()) == {3, 7}


def test_update_tensordict_priority_from_a_sample(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=500
    )
    rb.extend(transitions(10))
    rb.update_priority(torch.arange(10), torch.zeros(10))
    s = rb.sample(4)
    s.set("td_error", torch.where(s["index"] == s["index"][0], 5.0, 0.0))
    rb.update_tensordict_priority(s)
    assert set(rb.sample()["index"].tolist()) == {s["index"][0].item()}


def test_extend_reads_priorities_from_priority_key(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=300
    )
    td = transitions(10)
    td["td_error"] = (td["step"] == 6).float()
    rb.extend(td)
    assert set(rb.sample()["index"].tolist()) == {6}


def test_prioritized_plain_buffer_returns_weights_in_info(rl):
    rb = rl.PrioritizedReplayBuffer(alpha=1.0, beta=0.5, storage=rl.LazyTensorStorage(10))
    rb.extend(torch.arange(10))
    data, info = rb.sample(6, return_info=True)
    assert set(info) == {"index", "priority_weight"}
    assert torch.equal(data, info["index"])
    rb.update_priority(info["index"], torch.full((6,), 2.0))
    assert info["priority_weight"].shape == (6,)


def test_several_priorities_per_row_are_reduced(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), reduction="mean", batch_size=200
    )
    rb.extend(transitions(10))
    rb.update_priority(torch.arange(10), torch.zeros(10))
    s = rb.sample(10)
    chosen = s["index"][0]
    td_error = torch.zeros(10, 3)
    td_error[s["index"] == chosen] = torch.tensor([0.0, 0.0, 3.0])  # mean 1, max 3
    s.set("td_error", td_error)
    rb.update_tensordict_priority(s)
    assert set(rb.sample()["index"].tolist()) == {chosen.item()}


def test_prioritized_ndim2_storage(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(12, ndim=2), batch_size=100
    )
    rb.extend(TensorDict({"x": torch.arange(20.0).reshape(4, 5)}, [4, 5]))
    every = torch.tensor([[step, env] for step in range(3) for env in range(4)])
    priority = torch.zeros(12)
    priority[6] = 1.0  # slot 1, env 2
    rb.update_priority(every, priority)
    s = rb.sample()
    assert s["index"].shape == (100, 2)
    assert {tuple(i) for i in s["index"].tolist()} == {(1, 2)}
    assert set(s["x"].tolist()) == {14.0}  # slot 1 holds step 4 of env 2 (x = 2 * 5 + 4)


def test_sampler_beta_can_be_annealed(rl):
    sampler = rl.PrioritizedSampler(10, alpha=1.0, beta=0.0)
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), sampler=sampler, batch_size=50)
    rb.extend(transitions(10))
    rb.update_priority(torch.arange(10), torch.arange(1.0, 11.0))
    assert torch.all(rb.sample()["priority_weight"] == 1.0)  # beta 0: no correction
    sampler.beta = 1.0
    s = rb.sample()
    np.testing.assert_allclose(
        s["priority_weight"].numpy(),
        expected_weights(np.arange(1.0, 11.0), s["index"].numpy(), 1.0, 1.0, 1e-8),
        rtol=1e-5,
    )


# ----------------------------------------------------------------- slices


def assert_windows(sample, num_slices, slice_len):
    """Each slice is ``slice_len`` consecutive steps of one trajectory."""
    episode = sample["episode"].view(num_slices, slice_len)
    t = sample["t"].view(num_slices, slice_len)
    assert torch.all(episode == episode[:, :1])
    assert torch.all(t[:, 1:] - t[:, :-1] == 1)


def test_slice_sampler_windows_and_flags(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(200),
        sampler=rl.SliceSampler(slice_len=4, traj_key="episode"),
        batch_size=32,
    )
    rb.extend(trajectories([10, 3, 12, 7, 20]))  # the length-3 one is never drawn
    for _ in range(5):
        s = rb.sample()
        assert s.batch_size == torch.Size([32])
        assert_windows(s, 8, 4)
        assert 1 not in s["episode"].tolist()
        assert s["index"].shape == (32, 1)
        assert torch.equal(s["index"][:, 0], s["obs"].long())
        truncated = s["next", "truncated"].view(8, 4)
        assert truncated.dtype == torch.bool
        assert torch.all(truncated[:, -1]) and not torch.any(truncated[:, :-1])
        done = s["next", "done"].view(8, 4)
        assert torch.all(done[:, -1]) and not torch.any(done[:, :-1])
        assert s["next", "terminated"].shape == (32, 1)


def test_slice_sampler_finds_the_episode_key_itself(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(100),
        sampler=rl.SliceSampler(slice_len=5),
        batch_size=20,
    )
    data = trajectories([9, 9, 9])
    data["next", "done"] = torch.zeros_like(data["next", "done"])  # ids only
    rb.extend(data)
    for _ in range(5):
        assert_windows(rb.sample(), 4, 5)


def test_slice_sampler_by_end_key_and_num_slices(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(200),
        sampler=rl.SliceSampler(num_slices=5, end_key=("next", "done")),
        batch_size=30,
    )
    rb.extend(trajectories([8, 9, 10, 11]))
    for _ in range(5):
        assert_windows(rb.sample(), 5, 6)


def test_slice_sampler_refuses_when_no_trajectory_is_long_enough(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(50),
        sampler=rl.SliceSampler(slice_len=5, traj_key="episode"),
        batch_size=10,
    )
    rb.extend(trajectories([3, 4]))
    with pytest.raises(RuntimeError):
        rb.sample()
    with pytest.raises(RuntimeError, match="empty"):
        rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(5)).sample(2)


def test_slice_sampler_marks_stored_is_init_at_slice_starts(rl):
    data = trajectories([12, 12])
    data["is_init"] = (data["t"] == 0)[:, None]
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(50),
        sampler=rl.SliceSampler(slice_len=3, traj_key="episode"),
        batch_size=12,
    )
    rb.extend(data)
    s = rb.sample()
    is_init = s["is_init"].view(4, 3)
    assert torch.all(is_init[:, 0]) and not torch.any(is_init[:, 1:])


def test_slice_sampler_without_strict_length_gives_short_slices(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(50),
        sampler=rl.SliceSampler(slice_len=5, traj_key="episode", strict_length=False),
        batch_size=40,
    )
    rb.extend(trajectories([2, 2, 2, 2]))  # every trajectory shorter than a slice
    s = rb.sample()
    assert len(s) == 16  # eight slices of the whole two-step trajectory
    assert torch.equal(s["t"], torch.tensor([0, 1] * 8))
    assert torch.equal(s["next", "truncated"][:, 0], torch.tensor([False, True] * 8))


def test_slice_sampler_without_replacement_covers_every_row(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(100),
        sampler=rl.SliceSamplerWithoutReplacement(slice_len=5, traj_key="episode"),
        batch_size=10,
    )
    rb.extend(trajectories([5] * 8))  # one window per trajectory
    epoch = []
    for _ in range(4):
        s = rb.sample()
        assert_windows(s, 2, 5)
        epoch += s["obs"].long().tolist()
    assert sorted(epoch) == list(range(40))


def test_prioritized_slice_sampler_draws_windows_from_high_priority_starts(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(100),
        sampler=rl.PrioritizedSliceSampler(
            100, alpha=1.0, beta=0.5, slice_len=4, traj_key="episode"
        ),
        batch_size=16,
    )
    rb.extend(trajectories([10, 10, 10]))
    priority = torch.zeros(30)
    priority[12] = 1.0  # episode 1, step 2
    rb.update_priority(torch.arange(30), priority)
    for _ in range(3):
        s = rb.sample()
        assert_windows(s, 4, 4)
        assert s["obs"].view(4, 4)[:, 0].tolist() == [12.0] * 4
        assert s["priority_weight"].shape == (16,)


def test_a_tuple_index_reads_and_writes_one_element_of_the_stored_data(rl):
    # it read rows 1 and 0 where TorchRL reads the element (1, 0), which a write of
    # rb[1, 0] sets
    rb = rl.ReplayBuffer(storage=rl.LazyTensorStorage(5))
    rb.extend(torch.arange(10.0).reshape(5, 2))
    assert rb[1, 0].item() == 2.0
    rb[1, 0] = 5.0
    assert rb[1, 0].item() == 5.0
    assert rb[:][1].tolist() == [5.0, 3.0]


def test_a_sample_written_back_in_place_takes_its_priority_update(rl):
    # the rewrite made each row a new generation, and the update of the sample's
    # index took them for overwritten rows and skipped them
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=0.5, storage=rl.LazyTensorStorage(8), batch_size=4
    )
    rb.extend(transitions(8))
    s = rb.sample()
    s["obs"] += 1
    rb[s["index"]] = s
    rb.update_priority(s["index"], torch.full((4,), 1e6))
    assert torch.isin(rb.sample(256)["index"], s["index"]).float().mean() > 0.9


def test_prioritized_slice_sampler_takes_the_right_span_and_not_the_left(rl):
    # a slice starts at its drawn row, so TorchRL turns the left span off (warning);
    # the right one lets a strict slice start nearer its end, cut off there
    with pytest.warns(UserWarning, match="Left spanning is disabled"):
        sampler = rl.PrioritizedSliceSampler(
            100, alpha=1.0, beta=0.5, slice_len=4, traj_key="episode", span=(True, 2)
        )
    assert tuple(sampler.span) == (0, 2)
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(100), sampler=sampler, batch_size=16
    )
    rb.extend(trajectories([10, 10, 10]))
    priority = torch.zeros(30)
    priority[18] = 1.0  # episode 1, step 8: two steps left
    rb.update_priority(torch.arange(30), priority)
    for _ in range(3):
        assert rb.sample()["obs"].tolist() == [18.0, 19.0] * 4


def test_update_tensordict_priority_of_a_sample_reshaped_to_slices(rl):
    # as losses reshape a slice sample to [num_slices, slice_len]: each slice's
    # td_errors are reduced (max) to one priority, set on the slice's first row
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(40),
        sampler=rl.PrioritizedSliceSampler(
            40, alpha=1.0, beta=1.0, slice_len=4, traj_key="episode"
        ),
        batch_size=8,
    )
    rb.extend(trajectories([20, 20]))
    rb.update_priority(torch.arange(40), torch.ones(40))
    s = rb.sample().reshape(-1, 4)
    assert s["index"].shape == (2, 4, 1)
    first = s["index"][:, 0, 0]
    td_error = torch.zeros(2, 4)
    td_error[:, -1] = 1000.0 * (first == first[0])  # the last step of slice 0 (and its twin)
    s.set("td_error", td_error)
    rb.update_tensordict_priority(s)
    starts = rb.sample(400)["obs"].view(-1, 4)[:, 0]
    assert (starts == s["obs"][0, 0]).float().mean() > 0.8
    assert (starts == s["obs"][0, -1]).float().mean() < 0.1


def test_update_tensordict_priority_of_a_reshaped_sample_cuts_the_index(rl):
    # TorchRL's rule for any prioritized sampler: index[..., 0] until it matches the
    # reduced priority, so the first row of each line of the reshaped sample gets it
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(20), batch_size=8
    )
    rb.extend(transitions(20))
    rb.update_priority(torch.arange(20), torch.zeros(20))
    s = rb.sample().reshape(2, 4)
    first = s["index"][:, 0]
    td_error = torch.zeros(2, 4)
    td_error[:, -1] = (first == first[0]).float()
    s.set("td_error", td_error)
    rb.update_tensordict_priority(s)
    assert set(rb.sample(100)["index"].tolist()) == {s["index"][0, 0].item()}


def test_plain_buffer_slices_give_flags_in_info(rl):
    rb = rl.ReplayBuffer(
        storage=rl.LazyTensorStorage(100),
        sampler=rl.SliceSampler(slice_len=4, traj_key="episode"),
        batch_size=8,
    )
    rb.extend(trajectories([10, 10]))
    data, info = rb.sample(return_info=True)
    assert isinstance(info["index"], tuple) and len(info["index"]) == 1
    assert torch.equal(info["index"][0], data["obs"].long())
    assert info["next", "truncated"][:, 0].tolist() == [False, False, False, True] * 2
    assert "truncated" not in data["next"].keys()  # only TensorDict buffers set them


def test_random_sampler_without_replacement_dispatch(rl):
    sampler = rl.RandomSampler(replacement=False, drop_last=True)
    assert isinstance(sampler, rl.SamplerWithoutReplacement) and sampler.drop_last
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(9), sampler=sampler, batch_size=3)
    rb.extend(transitions(9))
    assert sorted(torch.cat([b["step"] for b in rb]).tolist()) == list(range(9))
    assert sampler.ran_out


@pytest.mark.parametrize("drop_last", [False, True])
def test_sample_sets_ran_out_at_an_epochs_last_batch(rl, drop_last):
    # TorchRL's epoch loop, `while not rb.sampler.ran_out: rb.sample()`: the sample
    # that takes an epoch's last batch sets `ran_out` (replaybuf set it only when an
    # iteration ended, and the loop never did); the next sample starts the next epoch.
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(10),
        sampler=rl.SamplerWithoutReplacement(drop_last=drop_last),
        batch_size=4,
    )
    rb.extend(transitions(10))
    want = [4, 4] if drop_last else [4, 4, 2]
    for epoch in range(2):
        sizes, seen = [], []
        # The second epoch's first batch: the sample after the one that ran out.
        while epoch == 1 and not sizes or not rb.sampler.ran_out:
            batch = rb.sample()
            sizes.append(len(batch))
            seen += batch["step"].tolist()
            assert rb.sampler.ran_out == (len(sizes) == len(want))
            assert len(sizes) <= len(want)
        assert sizes == want
        assert len(set(seen)) == len(seen) == sum(sizes)

    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(100),
        sampler=rl.SliceSamplerWithoutReplacement(num_slices=2, traj_key="episode"),
        batch_size=8,
    )
    rb.extend(trajectories([4, 4, 4, 4]))
    sizes = []
    while not rb.sampler.ran_out:
        sizes.append(len(rb.sample()))
        assert len(sizes) <= 2
    assert sizes == [8, 8]


def test_split_trajectories_of_a_slice_sample(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(100),
        sampler=rl.SliceSampler(slice_len=5, traj_key="episode"),
        batch_size=20,
    )
    rb.extend(trajectories([30, 30]))
    s = rb.sample()
    split = face(rl, "split_trajectories")(s, done_key="done")
    assert split.batch_size == torch.Size([4, 5])
    assert torch.all(split["mask"])
    assert torch.all(split["t"][:, 1:] - split["t"][:, :-1] == 1)


# ----------------------------------------------------------------- writers, storages


def test_max_value_writer_keeps_the_top_rows(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(5),
        writer=rl.TensorDictMaxValueWriter(rank_key="key"),
        sampler=rl.SamplerWithoutReplacement(),
        batch_size=5,
    )
    keys = torch.randperm(20).float()
    first = TensorDict({"key": keys[:10], "obs": keys[:10].long()}, [10])
    index = rb.extend(first)
    rb.extend(TensorDict({"key": keys[10:], "obs": keys[10:].long()}, [10]))
    assert sorted(rb[:]["obs"].tolist()) == [15, 16, 17, 18, 19]
    assert sorted(rb.sample()["obs"].tolist()) == [15, 16, 17, 18, 19]
    assert (index == -1).sum().item() == 5  # five of the first ten rows ranked too low


def test_ndim2_storage(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(12, ndim=2))
    env = torch.arange(4)[:, None].expand(4, 5)
    step = torch.arange(5)[None, :].expand(4, 5)
    data = TensorDict({"obs": (env * 100 + step).float(), "env": env.clone()}, [4, 5])
    index = rb.extend(data)  # 4 envs x 5 steps into 3 steps per env
    assert len(rb) == 12
    assert index.shape == (20, 2)
    assert index[:, 1].tolist() == [0, 1, 2, 3] * 5
    assert index[:, 0].tolist() == sum(([t % 3] * 4 for t in range(5)), [])
    whole = rb[:]
    assert whole.batch_size == torch.Size([4, 3])
    assert whole["obs"][:, 0].tolist() == [3.0, 103.0, 203.0, 303.0]  # slot 0 holds step 3
    s = rb.sample(50)
    assert s["index"].shape == (50, 2)
    assert torch.equal(s["env"], s["index"][:, 1])
    assert torch.all((s["obs"].long() % 100) % 3 == s["index"][:, 0])


def test_slices_of_an_ndim2_storage_stay_in_one_env(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(40, ndim=2),
        sampler=rl.SliceSampler(slice_len=4, end_key=("next", "done")),
        batch_size=16,
    )
    env = torch.arange(4)[:, None].expand(4, 10).clone()
    t = torch.arange(10)[None, :].expand(4, 10).clone()
    rb.extend(TensorDict({"env": env, "t": t, ("next", "done"): (t % 5 == 4)[..., None]}, [4, 10]))
    for _ in range(5):
        s = rb.sample()
        assert s["index"].shape == (16, 2)
        assert torch.equal(s["index"][:, 1], s["env"])
        env_of, t_of = s["env"].view(4, 4), s["t"].view(4, 4)
        assert torch.all(env_of == env_of[:, :1])
        assert torch.all(t_of[:, 1:] - t_of[:, :-1] == 1)
        assert torch.all(t_of // 5 == t_of[:, :1] // 5)  # within one trajectory


def test_memmap_storage_keeps_rows_in_its_directory(rl, tmp_path):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyMemmapStorage(50, scratch_dir=tmp_path / "rows"))
    rb.extend(transitions(30))
    assert any((tmp_path / "rows").iterdir())
    s = rb.sample(10)
    assert torch.equal(s["step"], s["index"])
    assert rb[:]["step"].tolist() == list(range(30))
    rb.empty()
    assert rb.extend(transitions(3, start=70)).tolist() == [0, 1, 2]
    assert rb[:]["step"].tolist() == [70, 71, 72]
    del rb, s
    gc.collect()
    again = rl.TensorDictReplayBuffer(
        storage=rl.LazyMemmapStorage(50, scratch_dir=tmp_path / "rows")
    )
    with pytest.raises((RuntimeError, OSError)):
        again.extend(transitions(5))


# ----------------------------------------------------------------- transforms


def test_transforms_on_samples_and_inverted_on_writes(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    rb.append_transform(lambda td: td.set("obs", td["obs"] * 2))
    rb.extend(transitions(5))
    s = rb.sample()
    assert torch.equal(s["obs"][:, 0], s["step"].float() * 2)
    assert torch.equal(rb[:]["obs"][:, 0], torch.arange(5.0) * 2)  # rb[:] is transformed too

    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    rb.append_transform(lambda td: td.set("step", td["step"] + 1000), invert=True)
    rb.extend(transitions(5))
    assert rb[:]["step"].tolist() == [1000, 1001, 1002, 1003, 1004]


def test_insert_transform_runs_first(rl):
    from torchrl.envs.transforms import Transform

    class Scale(Transform):
        def __init__(self, factor, add):
            super().__init__(in_keys=["obs"], out_keys=["obs"])
            self.factor, self.add = factor, add

        def forward(self, td):
            return td.set("obs", td["obs"] * self.factor + self.add)

    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    rb.append_transform(Scale(10, 0))
    rb.insert_transform(0, Scale(1, 1))
    rb.extend(transitions(5))
    s = rb.sample()
    assert torch.equal(s["obs"][:, 0], (s["step"].float() + 1) * 10)


# ----------------------------------------------------------------- persistence


def test_dumps_loads_round_trip(rl, tmp_path):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=200
    )
    rb.extend(transitions(13))
    priority = torch.zeros(10)
    priority[4] = 1.0
    rb.update_priority(torch.arange(10), priority)
    rb.dumps(tmp_path / "ckpt")

    loaded = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=200
    )
    loaded.loads(tmp_path / "ckpt")
    assert len(loaded) == 10 and loaded.write_count == 13
    assert loaded[:]["step"].tolist() == rb[:]["step"].tolist()
    assert set(loaded.sample()["index"].tolist()) == {4}  # priorities came back
    assert loaded.extend(transitions(1, start=99)).tolist() == [3]  # and the write cursor


def test_loads_brings_the_samplers_alpha_and_beta_back(rl, tmp_path):
    # The engine took the checkpoint's beta, the face's sampler kept its own: an
    # annealing `sampler.beta += step` went on from the built value.
    def buffer(beta):
        sampler = rl.PrioritizedSampler(10, alpha=0.7, beta=beta)
        return rl.TensorDictReplayBuffer(
            storage=rl.LazyTensorStorage(10), sampler=sampler, batch_size=4
        )

    rb = buffer(0.4)
    rb.extend(transitions(6))
    rb.sampler.beta = 0.9
    rb.dumps(tmp_path / "ckpt")
    loaded = buffer(0.5)
    loaded.extend(transitions(2))
    loaded.loads(tmp_path / "ckpt")
    assert (loaded.sampler.alpha, loaded.sampler.beta) == (0.7, 0.9)
    loaded.sampler.beta += 0.05
    assert loaded.sampler.beta == pytest.approx(0.95)


def test_an_ndim2_storage_reports_its_rounded_size(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10, ndim=2))
    for _ in range(5):
        rb.extend(TensorDict({"obs": torch.zeros(3, 2)}, [3, 2]))
    assert (rb.storage.max_size, len(rb)) == (12, 12)


def test_the_sampler_updates_priorities_and_ellipsis_reads_every_row(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=64
    )
    rb.extend(transitions(4))
    rb.sampler.update_priority(torch.tensor([0, 1, 2, 3]), torch.tensor([0.0, 0.0, 9.0, 0.0]))
    assert set(rb.sample()["step"].tolist()) == {2}
    assert rb[...]["step"].tolist() == [0, 1, 2, 3]
    assert rb[None].batch_size == torch.Size([1, 4])


def test_set_sampler_writer_and_storage():
    # TorchRL's new sampler starts without the rows (a prioritized one then fails to
    # sample: "non-positive p_sum"); here the rows go on, drawn by the new sampler.
    rl = replaybuf.torchrl
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    rb.extend(transitions(6))
    prev = rb.set_sampler(rl.PrioritizedSampler(10, alpha=1.0, beta=1.0))
    assert isinstance(prev, rl.RandomSampler) and len(rb) == 6 and rb.write_count == 6
    batch = rb.sample()
    assert "priority_weight" in batch.keys()
    rb.update_priority(torch.arange(6), torch.tensor([0.0, 0.0, 0.0, 9.0, 0.0, 0.0]))
    assert set(rb.sample()["step"].tolist()) == {3}
    prev = rb.set_writer(rl.RoundRobinWriter())
    rb.extend(transitions(2, start=100))
    assert len(rb) == 8 and rb.write_count == 8
    prev = rb.set_storage(rl.LazyTensorStorage(20))
    assert isinstance(prev, rl.LazyTensorStorage) and len(rb) == 0 and rb.write_count == 8
    rb.extend(TensorDict({"y": torch.arange(3.0)}, [3]))  # a new storage: new fields
    assert rb[:]["y"].tolist() == [0.0, 1.0, 2.0] and rb.write_count == 11
    unsized = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(4))
    with pytest.raises(ValueError):  # drop_last needs a batch size
        unsized.set_sampler(rl.SamplerWithoutReplacement(drop_last=True))


def test_state_dict_round_trip(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(14))
    state = rb.state_dict()
    loaded = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    loaded.extend(transitions(3, start=500))  # overwritten by the load
    loaded.load_state_dict(state)
    assert loaded[:]["step"].tolist() == [10, 11, 12, 13, 4, 5, 6, 7, 8, 9]
    assert loaded.write_count == 14


def test_state_dict_goes_through_torch_load_with_weights_only(rl, tmp_path):
    # Its files were bytes, which torch.load's default (weights_only=True, torch 2.6
    # on) refuses to unpickle: a checkpoint holding the buffer could not be loaded.
    # (TorchRL's own prioritized buffers fail so, on their trees.)
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    rb.extend(transitions(14))
    torch.save({"rb": rb.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    loaded = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    loaded.load_state_dict(state["rb"])
    assert loaded[:]["step"].tolist() == rb[:]["step"].tolist()
    assert loaded.write_count == 14
    if rl is replaybuf.torchrl:
        rb = rl.TensorDictPrioritizedReplayBuffer(
            alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=4
        )
        rb.extend(transitions(3))
        rb.update_priority(torch.tensor([1]), torch.tensor([5.0]))
        torch.save(rb.state_dict(), tmp_path / "prio.pt")
        loaded = rl.TensorDictPrioritizedReplayBuffer(
            alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(10), batch_size=4
        )
        loaded.load_state_dict(torch.load(tmp_path / "prio.pt", weights_only=True))
        assert loaded._native.priority(1) == 5.0


def test_a_state_dict_of_files_as_bytes_still_loads():
    rl = replaybuf.torchrl
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(4))
    state = rb.state_dict()
    files = state["replaybuf_checkpoint"]
    old = {"replaybuf_checkpoint": {k: v.numpy().tobytes() for k, v in files.items()}}
    loaded = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    loaded.load_state_dict(old)
    assert loaded[:]["step"].tolist() == [0, 1, 2, 3]


def test_state_dict_of_a_buffer_not_written_yet(rl):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    state = rb.state_dict()  # e.g. a checkpoint taken before the first collection
    fresh = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10), batch_size=4)
    fresh.load_state_dict(state)
    assert len(fresh) == 0 and fresh.write_count == 0
    fresh.extend(transitions(3))
    assert fresh.sample()["step"].shape == (4,)
    # loaded into a written buffer, it leaves the buffer as never written
    fresh.load_state_dict(state)
    assert len(fresh) == 0 and fresh.write_count == 0
    fresh.extend(TensorDict({"y": torch.arange(3.0)}, [3]))
    assert fresh[:]["y"].tolist() == [0.0, 1.0, 2.0] and "step" not in fresh[:].keys()
    trainer = face(rl, "ReplayBufferTrainer")(rl.TensorDictReplayBuffer(), batch_size=4)
    trainer.load_state_dict(trainer.state_dict())
    assert len(trainer.replay_buffer) == 0


def test_memmap_buffer_dumps_and_loads(rl, tmp_path):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyMemmapStorage(20, scratch_dir=tmp_path / "a"))
    rb.extend(transitions(25))
    rb.dumps(tmp_path / "ckpt")
    loaded = rl.TensorDictReplayBuffer(storage=rl.LazyMemmapStorage(20, scratch_dir=tmp_path / "b"))
    loaded.loads(tmp_path / "ckpt")
    assert loaded[:]["step"].tolist() == rb[:]["step"].tolist()
    assert len(loaded) == 20


def test_save_hook_sees_the_stored_rows(rl, tmp_path):
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(4))
    calls = []

    def hook(data, path=None):
        calls.append((data["step"][:4].tolist(), path))
        return data

    rb.register_save_hook(hook)
    rb.dumps(tmp_path / "ckpt")
    assert len(calls) == 1
    assert calls[0][0] == [0, 1, 2, 3]
    assert calls[0][1] == (tmp_path / "ckpt" / "storage").absolute()


# ----------------------------------------------------------------- trainer


class Collector:
    """The part of a TorchRL collector a ``Trainer`` uses: batches, in order."""

    init_random_frames = 0

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def update_policy_weights_(self, *args, **kwargs):
        pass

    def shutdown(self):
        pass


def make_trainer(batches, loss_module):
    from torchrl.trainers import Trainer

    return Trainer(
        collector=Collector(batches),
        total_frames=sum(b.numel() for b in batches),
        frame_skip=1,
        # enough steps that every fresh row (drawn at the maximum priority until
        # its first update) is drawn and updated before the test samples; with
        # 2 steps a row of the second batch stayed undrawn in ~1% of runs
        optim_steps_per_batch=8,
        loss_module=loss_module,
        optimizer=torch.optim.SGD(loss_module.parameters(), lr=0.0),
        progress_bar=False,
        log_interval=10**9,
        save_trainer_interval=10**9,
    )


def test_replay_buffer_trainer_hooks(rl):
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(100), batch_size=16
    )
    seen = []

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, td):
            seen.append(td["index"].clone())
            # only the row of step 7 keeps a priority
            td.set("td_error", (td["step"] == 7).float())
            return TensorDict({"loss": (td["obs"].sum() * self.w) * 0}, [])

    batches = [transitions(10).reshape(2, 5), transitions(10, start=10).reshape(2, 5)]
    trainer = make_trainer(batches, Loss())
    face(rl, "ReplayBufferTrainer")(rb, batch_size=16, flatten_tensordicts=True).register(trainer)
    trainer.train()
    assert len(rb) == 20 and rb.write_count == 20
    assert len(seen) == 16 and all(len(i) == 16 for i in seen)
    # once every row has been drawn and updated, every draw is the row of step 7
    assert set(rb.sample(64)["step"].tolist()) == {7}


# ----------------------------------------------------------------- replaybuf on purpose


def test_replaybuf_trainer_marks_each_envs_last_step_truncated():
    # TorchRL's hook sets ``truncated[..., -1]``, the flag's own trailing dimension:
    # every step of a [E, T, 1] flag came out truncated, each a one-step trajectory
    # to a slice sampler; and it wrote into the collector's batch.
    rl = replaybuf.torchrl
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(20), batch_size=4)
    batch = transitions(6).reshape(2, 3)
    batch.set(("next", "truncated"), torch.zeros(2, 3, 1, dtype=torch.bool))
    rl.ReplayBufferTrainer(rb, flatten_tensordicts=True).extend(batch)
    stored = rb[:]
    assert stored["next", "truncated"].squeeze(-1).tolist() == [False, False, True] * 2
    assert not batch["next", "truncated"].any()


def test_replaybuf_update_priority_skips_rows_overwritten_since_the_sample():
    rl = replaybuf.torchrl
    rb = rl.TensorDictPrioritizedReplayBuffer(
        alpha=1.0, beta=1.0, storage=rl.LazyTensorStorage(4), batch_size=4
    )
    rb.extend(transitions(4))
    rb.update_priority(torch.arange(4), torch.zeros(4))
    s = rb.sample()
    rb.extend(transitions(4, start=10))  # every sampled row is replaced
    rb.update_priority(s["index"], torch.full((4,), 9.0))
    native = rb._native
    assert all(native.priority(i) != 9.0 for i in range(4))
    # an index that is not the latest sample's updates whatever is there now
    rb.update_priority(s["index"].clone(), torch.full((4,), 9.0))
    assert {native.priority(i) for i in s["index"].tolist()} == {9.0}


def test_replaybuf_update_tensordict_priority_of_a_reshaped_sample_skips_overwritten_rows():
    """The sample's index, reshaped and cut as TorchRL's rule does, is still known as
    the latest sample's: rows overwritten since are left alone."""
    rl = replaybuf.torchrl
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(20),
        sampler=rl.PrioritizedSliceSampler(
            20, alpha=1.0, beta=1.0, slice_len=4, traj_key="episode"
        ),
        batch_size=8,
    )
    rb.extend(trajectories([10, 10]))
    rb.update_priority(torch.arange(20), torch.zeros(20))
    s = rb.sample().reshape(-1, 4)
    s.set("td_error", torch.full((2, 4), 9.0))
    rb.extend(trajectories([10, 10], start_id=2))  # every sampled row is replaced
    rb.update_tensordict_priority(s)
    native = rb._native
    assert all(native.priority(i) != 9.0 for i in range(20))
    s = rb.sample().reshape(-1, 4)
    s.set("td_error", torch.full((2, 4), 9.0))
    rb.update_tensordict_priority(s)
    assert {native.priority(i) == 9.0 for i in s["index"][:, 0, 0].tolist()} == {True}
    assert sum(native.priority(i) == 9.0 for i in range(20)) <= 2  # slice starts only


def test_replaybuf_refuses_new_keys_after_the_first_write():
    rl = replaybuf.torchrl
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(10))
    rb.extend(transitions(3))
    extra = transitions(3)
    extra["surprise"] = torch.zeros(3)
    with pytest.raises(KeyError, match="surprise"):
        rb.extend(extra)
    sampled = rb.sample(3)  # a sample's own "index" is metadata, not a field
    rb.extend(sampled)
    assert len(rb) == 6


@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_replaybuf_a_refused_loads_leaves_an_unwritten_buffer_unwritten(storage, tmp_path):
    """The checkpoint's fields make an engine buffer before the engine can refuse the
    checkpoint (here: its capacity); once refused, that buffer and its files go, and
    the next write fixes the fields as if there had been no load."""
    rl = replaybuf.torchrl

    def storage_of(capacity, name):
        if storage == "LazyTensorStorage":
            return rl.LazyTensorStorage(capacity)
        return rl.LazyMemmapStorage(capacity, scratch_dir=tmp_path / name)

    src = rl.TensorDictReplayBuffer(storage=storage_of(10, "src"))
    src.extend(TensorDict({"obs": torch.zeros(3, 2)}, [3]))
    src.dumps(tmp_path / "ckpt")
    rb = rl.TensorDictReplayBuffer(storage=storage_of(20, "rb"))
    with pytest.raises(replaybuf.ReplayBufferError, match="capacity 20 vs 10"):
        rb.loads(tmp_path / "ckpt")
    if storage == "LazyMemmapStorage":
        assert list((tmp_path / "rb").iterdir()) == []
    rb.extend(TensorDict({"x": torch.arange(3.0)}, [3]))
    assert rb[:]["x"].tolist() == [0.0, 1.0, 2.0] and "obs" not in rb[:].keys()


def test_replaybuf_components_must_come_from_replaybuf():
    with pytest.raises(TypeError, match="replaybuf.torchrl"):
        replaybuf.torchrl.ReplayBuffer(sampler=torchrl.data.RandomSampler())


def test_replaybuf_collectors_extend_while_a_learner_samples():
    rl = replaybuf.torchrl
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyTensorStorage(3000), batch_size=128)
    rb.extend(transitions(1000))
    stop = threading.Event()
    errors = []

    def collect(worker):
        start = 10_000 * (worker + 1)
        try:
            while not stop.is_set():
                rb.extend(transitions(200, start=start))
                start += 200
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=collect, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    checked = 0
    deadline = time.monotonic() + 0.5
    try:
        while time.monotonic() < deadline:
            s = rb.sample()
            step = s["step"]
            assert torch.equal(s["obs"][:, 0], step.float())  # every row whole
            assert torch.equal(s["next", "obs"][:, 2], step.float() + 1)
            assert torch.equal(s["pixels"][:, 1, 1], (step % 256).to(torch.uint8))
            checked += len(s)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    assert checked > 0 and rb.write_count > 1000


def test_a_max_value_writer_takes_an_empty_batch_and_returns_none_for_a_passed_over_add(rl):
    rb = rl.TensorDictReplayBuffer(
        storage=rl.LazyTensorStorage(2), writer=rl.TensorDictMaxValueWriter()
    )
    rows = lambda r: TensorDict(  # noqa: E731
        {
            "obs": torch.arange(len(r), dtype=torch.float32),
            ("next", "reward"): torch.tensor(r)[:, None],
        },
        [len(r)],
    )
    assert rb.extend(rows([])).numel() == 0  # before any row: numpy could not reshape it
    rb.extend(rows([5.0, 6.0]))
    assert rb.extend(rows([])).numel() == 0
    assert len(rb) == 2
    low = TensorDict({"obs": torch.tensor(9.0), ("next", "reward"): torch.tensor([1.0])}, [])
    assert rb.add(low) is None  # replaybuf returned -1


def test_replaybuf_refuses_non_tensor_entries():
    # TorchRL stores them; the engine stores tensors only, and they were dropped
    # without a word (a NonTensorStack came back as an empty TensorDict).
    from tensordict import NonTensorData, NonTensorStack

    for make in (
        lambda: NonTensorData("hello", batch_size=[4]),
        lambda: NonTensorStack(*[NonTensorData(f"s{i}") for i in range(4)]),
    ):
        rb = replaybuf.torchrl.TensorDictReplayBuffer(
            storage=replaybuf.torchrl.LazyTensorStorage(10)
        )
        data = TensorDict({"obs": torch.arange(4.0), "nested": {"x": torch.zeros(4)}}, [4])
        data["nested", "label"] = make()
        with pytest.raises(TypeError, match="non-tensor"):
            rb.extend(data)
        assert len(rb) == 0
        rb.extend(data.exclude(("nested", "label")))  # and a later write is checked too
        with pytest.raises(TypeError, match="non-tensor"):
            rb.extend(data)
        assert len(rb) == 4


def test_replaybuf_existsok_opens_the_rows_a_dropped_buffer_left_from_the_start(tmp_path):
    # They came back only with the first write, beside its rows; before it the
    # buffer read as empty.
    rl = replaybuf.torchrl
    rows = lambda n, first: TensorDict({"obs": torch.arange(first, first + n).float()}, [n])  # noqa: E731
    rb = rl.TensorDictReplayBuffer(storage=rl.LazyMemmapStorage(8, scratch_dir=tmp_path))
    rb.extend(rows(5, 0))
    del rb
    gc.collect()
    again = rl.TensorDictReplayBuffer(
        storage=rl.LazyMemmapStorage(8, scratch_dir=tmp_path, existsok=True), batch_size=2
    )
    assert len(again) == 5
    assert again[:]["obs"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert again.sample()["obs"].shape == (2,)
    assert again.extend(rows(3, 100)).tolist() == [5, 6, 7]
    assert len(again) == again.write_count == 8
    # empty() empties it, as TorchRL's: it renewed the engine buffer, which reopened
    # the directory's rows.
    again.empty()
    assert len(again) == again.write_count == 0
    assert again.extend(rows(2, 200)).tolist() == [0, 1]
    assert again[:]["obs"].tolist() == [200.0, 201.0]
