"""replaybuf.tmrl.Memory against tmrl's semantics.

tmrl's memory (``GenericTorchMemory``) keeps a rollout worker's samples ``(act,
new_obs, rew, terminated, truncated, info)`` in order; its item ``i`` is the
transition from sample ``i``'s observation to sample ``i + 1`` (whose action, reward
and flags it takes), and an item whose sample ended an episode is redrawn, never
returned. Ours pairs the samples as they arrive and stores only those transitions.
"""

import random
import threading

import numpy as np
import pytest
import replaybuf
import replaybuf.tmrl as tmrl_face
from replaybuf.tmrl import Memory

torch = pytest.importorskip("torch")


def sample(i, ends=".", act=True):
    """A collector sample with observation id ``i``: obs ``[i, i, i]``, act ``[i, -i]``,
    rew ``i / 2``; ``ends`` is ``t`` (terminated), ``c`` (truncated) or ``.``."""
    a = np.array([i, -i], np.float32) if act else None
    obs = np.full(3, i, np.float32)
    return (a, obs, i / 2, ends == "t", ends == "c", {"step": i})


def samples(ids, ends):
    return [sample(i, e) for i, e in zip(ids, ends)]


class TmrlBuffer:
    """tmrl.networking.Buffer's shape: samples in ``memory`` and the worker's stats."""

    def __init__(self, memory, train_return=0.0):
        self.memory = memory
        self.stat_train_return = train_return
        self.stat_test_return = 2 * train_return
        self.stat_train_steps = len(memory)
        self.stat_test_steps = 1

    def __len__(self):
        return len(self.memory)


class TmrlReference:
    """tmrl's GenericTorchMemory, its append_buffer and get_transition, in lists."""

    def __init__(self):
        self.data = [[] for _ in range(7)]

    def append_buffer(self, buffer):
        for s in buffer:
            for k in range(6):
                self.data[k].append(s[k])
            self.data[6].append(s[3] or s[4])

    def __len__(self):
        return max(len(self.data[0]) - 1, 0)

    def get_transition(self, item):
        last, now = item, item + 1
        d = self.data
        return d[1][last], d[0][now], d[2][now], d[1][now], d[3][now], d[4][now]

    def transitions(self):
        """Every item get_transition can return: those whose sample did not end an
        episode (tmrl redraws the others)."""
        return [self.get_transition(i) for i in range(len(self)) if not self.data[6][i]]


def ids_of(t):
    """A transition as (prev id, act id, rew, new id, terminated, truncated)."""
    prev_obs, act, rew, new_obs, terminated, truncated = t[:6]
    return (
        int(prev_obs[0]),
        int(act[0]),
        float(rew),
        int(new_obs[0]),
        bool(terminated),
        bool(truncated),
    )


def stored(memory):
    return [ids_of(memory.get_transition(i)) for i in range(len(memory))]


def test_samples_become_transitions_within_episodes_and_across_buffers():
    memory = Memory(device="cpu", nb_steps=2, memory_size=1000, batch_size=4, seed=1)
    assert (memory.nb_steps, memory.batch_size, memory.memory_size, len(memory)) == (2, 4, 1000, 0)
    # Episode 0: reset at 0 (no action, as tmrl's non-real-time workers send),
    # terminated at 3. Episode 1: reset at 100, continued by the next buffer, truncated
    # at 103. Episode 2: reset at 200.
    first = [sample(0, act=False)] + samples([1, 2, 3, 100, 101, 102], "..t...")
    memory.append(TmrlBuffer(first, train_return=5.0))
    assert len(memory) == 5
    assert (memory.stat_train_return, memory.stat_test_return, memory.stat_train_steps) == (
        5.0,
        10.0,
        7,
    )
    memory.append(TmrlBuffer(samples([103, 200, 201], "c..")))
    expected = [
        (0, 1, 0.5, 1, False, False),
        (1, 2, 1.0, 2, False, False),
        (2, 3, 1.5, 3, True, False),
        (100, 101, 50.5, 101, False, False),
        (101, 102, 51.0, 102, False, False),
        (102, 103, 51.5, 103, False, True),
        (200, 201, 100.5, 201, False, False),
    ]
    assert stored(memory) == expected
    # get_transition: tmrl's 7-tuple, stored dtypes, info not kept.
    prev_obs, act, rew, new_obs, terminated, truncated, info = memory.get_transition(5)
    np.testing.assert_array_equal(prev_obs, np.full(3, 102, np.float32))
    np.testing.assert_array_equal(act, [103, -103])
    assert (prev_obs.dtype, act.dtype, rew.dtype) == (np.float32, np.float32, np.float32)
    assert (bool(terminated), bool(truncated), info) == (False, True, {})
    # memory[i]: the flags as np.float32, as tmrl's __getitem__ gives them.
    item = memory[2]
    assert isinstance(item[4], np.float32) and item[4] == 1.0 and item[5] == 0.0
    # collate: six float32 tensors, hand-computed.
    c = memory.collate([memory[i] for i in (0, 2, 5)], "cpu")
    assert len(c) == 6 and all(t.dtype == torch.float32 for t in c)
    torch.testing.assert_close(c[0], torch.tensor([[0.0] * 3, [2.0] * 3, [102.0] * 3]))
    torch.testing.assert_close(c[1], torch.tensor([[1.0, -1.0], [3.0, -3.0], [103.0, -103.0]]))
    torch.testing.assert_close(c[2], torch.tensor([0.5, 1.5, 51.5]))
    torch.testing.assert_close(c[3], torch.tensor([[1.0] * 3, [3.0] * 3, [103.0] * 3]))
    torch.testing.assert_close(c[4], torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(c[5], torch.tensor([0.0, 0.0, 1.0]))
    with pytest.raises(IndexError):
        memory.get_transition(1000)
    # From the end, as tmrl's lists index (it raised OverflowError).
    assert ids_of(memory.get_transition(-1)) == expected[-1]
    assert ids_of(memory[-7]) == expected[0]
    for item in (-8, -1000):
        with pytest.raises(IndexError):
            memory[item]
    with pytest.raises(TypeError):  # it was read as memory[1]
        memory[1.7]


def check_batch(batch, n, ends):
    """Every row of a collated batch is one stored transition: ``ends`` maps a new id to
    its (terminated, truncated)."""
    prev_obs, act, rew, new_obs, terminated, truncated = batch
    assert tuple(prev_obs.shape) == (n, 3) and tuple(act.shape) == (n, 2)
    assert tuple(rew.shape) == tuple(terminated.shape) == tuple(truncated.shape) == (n,)
    for r in range(n):
        new = int(new_obs[r, 0])
        assert int(prev_obs[r, 0]) == new - 1
        assert act[r].tolist() == [new, -new]
        assert float(rew[r]) == new / 2
        assert (float(terminated[r]), float(truncated[r])) == tuple(map(float, ends[new]))


def episodes(n_episodes, rng):
    """Samples of ``n_episodes`` episodes (ids ``1000 e + k``) and each new id's flags."""
    out, ends = [], {}
    for e in range(n_episodes):
        length = rng.randint(1, 12)
        how = rng.choice("tc")
        for k in range(length):
            i = 1000 * e + k
            end = how if k == length - 1 else "."
            out.append(sample(i, end, act=k > 0))
            ends[i] = (end == "t", end == "c")
    return out, ends


def test_stored_transitions_are_those_tmrl_returns():
    rng = random.Random(3)
    memory = Memory(memory_size=10_000, batch_size=64, seed=3)
    reference = TmrlReference()
    all_samples, ends = episodes(60, rng)
    # Cut into buffers at random points: an episode often spans two buffers.
    cuts = sorted(rng.sample(range(1, len(all_samples)), 15))
    for lo, hi in zip([0] + cuts, cuts + [len(all_samples)]):
        memory.append_buffer(all_samples[lo:hi])
        reference.append_buffer(all_samples[lo:hi])
    assert stored(memory) == [ids_of(t) for t in reference.transitions()]
    for batch in memory:
        check_batch(batch, 64, ends)


def test_memory_size_keeps_the_latest_transitions():
    memory = Memory(memory_size=5, batch_size=2)
    for lo in range(0, 12, 3):
        memory.append_buffer(samples(range(lo, lo + 3), "..."))
    assert len(memory) == 5
    # 11 transitions (0->1 ... 10->11): the last 5, oldest first, as tmrl's lists
    # (trimmed from the front) hold them; the last item is the newest.
    assert [t[0] for t in stored(memory)] == [6, 7, 8, 9, 10]
    assert ids_of(memory[-1])[0] == 10


def test_sample_preprocessor_runs_per_transition_as_tmrl_calls_it():
    calls = []

    def augment(prev_obs, act, rew, new_obs, terminated, truncated):
        calls.append((prev_obs.shape, act.shape, type(terminated)))
        return prev_obs + 1000, act, rew, new_obs + 1000, terminated, truncated

    memory = Memory(nb_steps=3, sample_preprocessor=augment, batch_size=8, seed=5)
    all_samples, ends = episodes(10, random.Random(5))
    memory.append_buffer(all_samples)
    batches = list(memory)
    assert len(batches) == 3 and len(calls) == 24
    assert calls[0][:2] == ((3,), (2,))
    for prev_obs, act, rew, new_obs, terminated, truncated in batches:
        assert prev_obs.dtype == torch.float32 and terminated.dtype == torch.float32
        assert bool((prev_obs >= 1000).all())
        check_batch((prev_obs - 1000, act, rew, new_obs - 1000, terminated, truncated), 8, ends)
    # memory[i] goes through the preprocessor too.
    assert float(memory[0][0][0]) >= 1000


def test_numpy_without_torch(monkeypatch):
    monkeypatch.setattr(tmrl_face, "torch", None)
    memory = Memory(batch_size=4, seed=2)
    all_samples, ends = episodes(4, random.Random(2))
    memory.append_buffer(all_samples)
    batch = memory.sample()
    assert all(isinstance(a, np.ndarray) and a.dtype == np.float32 for a in batch)
    check_batch(batch, 4, ends)
    c = memory.collate([memory[0], memory[1]])
    assert all(isinstance(a, np.ndarray) and a.shape[0] == 2 for a in c)


def test_columns_and_image_observations():
    """A dict of columns appends without a Python loop; uint8 images collate as float32."""
    memory = Memory(batch_size=6, seed=4, obs=(np.uint8, (2, 4, 4)), act=(np.float32, (3,)))
    n = 10
    obs = np.arange(n, dtype=np.uint8)[:, None, None, None] * np.ones((1, 2, 4, 4), np.uint8)
    columns = {
        "act": np.tile(np.arange(n, dtype=np.float32)[:, None], (1, 3)),
        "obs": obs,
        "rew": np.arange(n, dtype=np.float64),  # cast to float32, as tmrl's samples are
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
    }
    index = memory.append_buffer(columns)
    assert index.tolist() == list(range(n - 1))
    prev_obs, act, rew, new_obs, _, _ = memory.sample()
    assert tuple(prev_obs.shape) == (6, 2, 4, 4) and prev_obs.dtype == torch.float32
    torch.testing.assert_close(new_obs - prev_obs, torch.ones_like(prev_obs))
    torch.testing.assert_close(rew, new_obs[:, 0, 0, 0])
    assert memory.get_transition(0)[0].dtype == np.uint8


def test_dataset_path_starts_from_a_saved_or_file_backed_memory(tmp_path):
    memory = Memory(batch_size=4, seed=1)
    memory.append_buffer(samples([0, 1, 2, 3], "...t"))
    memory.save(tmp_path / "ckpt")
    again = Memory(batch_size=4, dataset_path=tmp_path / "ckpt")
    assert stored(again) == stored(memory) and again.memory_size == memory.memory_size
    # An empty or missing directory starts an empty memory, as tmrl does.
    (tmp_path / "empty").mkdir()
    assert len(Memory(dataset_path=tmp_path / "empty")) == 0
    assert len(Memory(dataset_path=tmp_path / "missing")) == 0
    # File-backed: appended transitions stay in the directory.
    disk = Memory(memory_size=100, memmap=tmp_path / "disk", batch_size=2)
    disk.append_buffer(samples([10, 11, 12], "..."))
    disk.flush()
    del disk
    reopened = Memory(dataset_path=tmp_path / "disk", batch_size=2)
    assert stored(reopened) == [(10, 11, 5.5, 11, False, False), (11, 12, 6.0, 12, False, False)]
    reopened.append_buffer(samples([20, 21], ".."))
    assert len(reopened) == 3
    # A directory that is not a dataset is an error, not an empty memory.
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file").write_text("x")
    with pytest.raises(replaybuf.ReplayBufferOSError):
        Memory(dataset_path=tmp_path / "junk")


def test_refusals():
    with pytest.raises(ValueError, match="crc_debug"):
        Memory(crc_debug=True)
    memory = Memory()
    with pytest.raises(TypeError, match="one array per observation"):
        memory.append_buffer([(np.zeros(2), (np.zeros(1), np.zeros(3)), 0.0, False, False, {})])
    with pytest.raises(ValueError, match="empty"):
        memory.sample()
    memory.append_buffer(samples([0, 1], ".."))
    with pytest.raises(TypeError):  # float observations into a float32 memory: fine;
        memory.append_buffer(
            {  # a complex one is not the same kind.
                "act": np.zeros((1, 2), np.float32),
                "obs": np.zeros((1, 3), np.complex64),
                "rew": np.zeros(1),
                "terminated": np.zeros(1, bool),
                "truncated": np.zeros(1, bool),
            }
        )
    with pytest.raises(replaybuf.ReplayBufferValueError):
        memory.append_buffer([(np.zeros(4, np.float32), np.zeros(3), 0.0, False, False, {})])
    with pytest.raises(KeyError):
        memory.append_buffer({"act": np.zeros((1, 2), np.float32)})
    # A sample of the wrong shape: an error of ours (a plain IndexError before).
    with pytest.raises(replaybuf.ReplayBufferValueError, match="a sample is"):
        memory.append_buffer([(np.zeros(2, np.float32), np.zeros(3), 0.0, False)])
    assert stored(memory) == [(0, 1, 0.5, 1, False, False)]


def test_values_a_field_cannot_hold_are_refused_and_keep_the_reset_sample():
    # An int8 memory given 300 stored 44, a float16 one given 1e6 inf (a warning at
    # most); and a refused append dropped the reset sample held back for the next.
    def obs_sample(obs, act=True):
        a = np.array([1, -1], np.float32) if act else None
        return (a, obs, 0.5, False, False, {})

    memory = Memory()
    memory.append_buffer([obs_sample(np.array([1, 2, 3], np.int8))])
    memory.append_buffer([obs_sample(np.array([4, 5, 6], np.int8))])
    assert len(memory) == 1
    with pytest.raises(replaybuf.ReplayBufferValueError, match="cannot hold"):
        memory.append_buffer([obs_sample(np.array([300, -200, 128]))])
    # One width's unsigned values cast back whole from the signed type: uint8 200 was
    # stored as -56.
    with pytest.raises(replaybuf.ReplayBufferValueError, match="cannot hold"):
        memory.append_buffer([obs_sample(np.array([200, 0, 0], np.uint8))])
    assert len(memory) == 1
    memory.append_buffer([obs_sample(np.array([100, 0, 1], np.uint8))])
    assert len(memory) == 2
    memory = Memory()
    memory.append_buffer([obs_sample(np.zeros(3, np.float16))] * 2)
    with pytest.raises(replaybuf.ReplayBufferValueError, match="cannot hold"):
        memory.append_buffer([obs_sample(np.array([1e6, 7e4, 1.0]))])
    memory = Memory()
    memory.append_buffer([sample(0, act=False)])
    with pytest.raises((TypeError, ValueError)):
        memory.append_buffer([(np.zeros(2), (np.zeros(1), np.zeros(3)), 0.0, False, False, {})])
    memory.append_buffer(samples([1, 2], ".."))
    assert stored(memory) == [(0, 1, 0.5, 1, False, False), (1, 2, 1.0, 2, False, False)]


def test_samples_without_any_action_wait_for_one():
    memory = Memory(batch_size=1)
    memory.append_buffer([sample(0, act=False)])
    assert len(memory) == 0
    memory.append_buffer(samples([1], "."))
    assert stored(memory) == [(0, 1, 0.5, 1, False, False)]


def test_a_held_reset_sample_goes_first_before_columns_too():
    memory = Memory(batch_size=1)
    memory.append_buffer([sample(0, act=False)])
    columns = {
        "act": np.array([[1, -1], [2, -2]], np.float32),
        "obs": np.array([[1] * 3, [2] * 3], np.float32),
        "rew": np.array([0.5, 1.0]),
        "terminated": np.zeros(2, bool),
        "truncated": np.zeros(2, bool),
    }
    memory.append_buffer(columns)
    assert [(t[0], t[3]) for t in stored(memory)] == [(0, 1), (1, 2)]


def test_a_collector_thread_appends_while_the_learner_samples():
    memory = Memory(batch_size=16, memory_size=5000, seed=9)
    all_samples, ends = episodes(400, random.Random(9))
    memory.append_buffer(all_samples[:50])
    errors = []

    def collect():
        try:
            for lo in range(50, len(all_samples), 50):
                memory.append_buffer(all_samples[lo : lo + 50])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    thread = threading.Thread(target=collect)
    thread.start()
    while thread.is_alive():
        check_batch(memory.sample(), 16, ends)
    thread.join()
    assert not errors
    assert len(memory) == len(reference_transitions(all_samples))


def reference_transitions(all_samples):
    reference = TmrlReference()
    reference.append_buffer(all_samples)
    return reference.transitions()


def test_a_memory_with_transitions_pickles_and_copies():
    # tmrl's trainer pickles its memory at each checkpoint: once it held data, the
    # engine's memory could not be pickled and the checkpoint failed.
    import copy
    import pickle

    memory = Memory(memory_size=50, batch_size=4, seed=3)
    memory.append_buffer(samples([0, 1, 2, 3, 4], "..t.."))
    memory.append_buffer([sample(9, act=False)])  # held: no transition yet
    for again in (pickle.loads(pickle.dumps(memory)), copy.deepcopy(memory)):
        assert stored(again) == stored(memory) and again.memory_size == 50
        assert again.batch_size == 4 and again.nb_steps == memory.nb_steps
        # the copy draws on as the pickled memory would have
        assert np.array_equal(again.sample()[0], copy.deepcopy(memory).sample()[0])
        again.append_buffer(samples([10, 11], ".."))
        assert len(again) == len(memory) + 2
    assert pickle.loads(pickle.dumps(Memory())).sample_preprocessor is None


def test_a_memory_from_a_dataset_draws_from_its_own_seed(tmp_path):
    # The seed was ignored: every run resumed from one dataset drew the same batches.
    memory = Memory(batch_size=8, seed=1)
    memory.append_buffer(samples(range(200), "." * 200))
    memory.save(tmp_path / "ckpt")

    def first(**kw):
        return Memory(batch_size=8, dataset_path=tmp_path / "ckpt", **kw).sample()[0][:, 0]

    assert np.array_equal(first(seed=5), first(seed=5))
    assert not np.array_equal(first(seed=5), first(seed=6))
    assert not np.array_equal(first(), first())


def test_flags_as_zero_or_one_integers_are_taken():
    # An environment's 0/1 flags were refused as ints (bool is what gymnasium gives).
    memory = Memory(batch_size=2)
    memory.append_buffer(
        [(np.zeros(2, np.float32), np.full(3, i, np.float32), 0.0, 0, i == 2, {}) for i in range(3)]
    )
    assert [t[5] for t in (memory.get_transition(i) for i in range(2))] == [False, True]
    with pytest.raises(replaybuf.ReplayBufferValueError, match="cannot hold"):
        memory.append_buffer([(np.zeros(2, np.float32), np.zeros(3, np.float32), 0.0, 2, 0, {})])
    assert len(memory) == 2


def test_a_dict_of_scalars_or_of_uneven_columns_is_refused():
    # One scalar sample was dropped without a word; uneven columns were cut.
    row = {
        "act": np.float32(1),
        "obs": np.float32(1),
        "rew": 0.0,
        "terminated": False,
        "truncated": False,
    }
    for memory in (Memory(), Memory(obs=("float32", ()), act=("float32", ()))):
        with pytest.raises(replaybuf.ReplayBufferValueError, match="columns"):
            memory.append_buffer(row)
    uneven = {
        "act": np.zeros((3, 2), np.float32),
        "obs": np.zeros((2, 3), np.float32),
        "rew": np.zeros(3),
        "terminated": np.zeros(3, bool),
        "truncated": np.zeros(3, bool),
    }
    with pytest.raises(replaybuf.ReplayBufferValueError, match="lengths"):
        Memory().append_buffer(uneven)


def test_a_refused_first_append_does_not_fix_the_fields(tmp_path):
    # The memory (and a memmap's files) was built from the refused samples: later
    # good ones were refused for good.
    for memmap in (None, tmp_path / "disk"):
        memory = Memory(memmap=memmap)
        with pytest.raises(replaybuf.ReplayBufferValueError):
            memory.append_buffer(
                [(np.zeros(2, np.float32), np.full(3, 1e6), 0.0, False, False, {})] * 2
                + [(np.zeros(2, np.float32), np.zeros(3, np.float16), 0.0, 5, False, {})]
            )
        assert memory._native is None
        memory.append_buffer(samples([0, 1], ".."))
        assert stored(memory) == [(0, 1, 0.5, 1, False, False)]


def test_a_subclass_whose_items_differ_samples_them():
    # tmrl's memories are subclassed for their items (`get_transition`); `sample`
    # drew in the engine and skipped the override.
    class Shifted(Memory):
        def get_transition(self, item):
            prev_obs, *rest = super().get_transition(item)
            return (prev_obs + 1000, *rest)

    memory = Shifted(batch_size=8, seed=1)
    memory.append_buffer(samples([0, 1, 2, 3], "...."))
    prev_obs = np.asarray(memory.sample()[0])
    assert prev_obs.shape == (8, 3) and (prev_obs >= 1000).all()
    # Without an override the engine draws, as before.
    plain = Memory(batch_size=8, seed=1)
    plain.append_buffer(samples([0, 1, 2, 3], "...."))
    assert (np.asarray(plain.sample()[0]) < 1000).all()
