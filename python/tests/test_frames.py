"""Frames stored once from Python: frame stacks and next_of rebuilt exactly as a plain
buffer fed the same stream returns them, stacks that do not follow refused, bad
configurations refused."""

import numpy as np
import pytest
import replaybuf
from replaybuf import Frames

DEPTH = 4
SPEC = {
    "obs": ("uint8", (DEPTH, 3, 3)),
    "next_obs": ("uint8", (DEPTH, 3, 3)),
    "action": ("int64", ()),
    "done": ("bool", ()),
}


def stream(n, seed=0):
    """`n` steps of one environment: frames of 9 random bytes, stacks of the last 4
    (the first frame repeated at an episode's start), episodes ending at random."""
    rng = np.random.default_rng(seed)
    frame = lambda: rng.integers(0, 256, (3, 3), dtype=np.uint8)  # noqa: E731
    first = frame()
    stack = [first] * DEPTH
    steps = {k: [] for k in SPEC}
    for i in range(n):
        new = frame()
        nxt = stack[1:] + [new]
        done = rng.random() < 0.1
        steps["obs"].append(np.stack(stack))
        steps["next_obs"].append(np.stack(nxt))
        steps["action"].append(i)
        steps["done"].append(done)
        if done:
            first = frame()
            stack = [first] * DEPTH
        else:
            stack = nxt
    return {k: np.asarray(v) for k, v in steps.items()}


def frames_buffer(capacity, **kw):
    frames = Frames(stack={"obs": DEPTH}, next_of={"next_obs": "obs"}, **kw)
    return replaybuf.ReplayBuffer(capacity, spec=SPEC, frames=frames, seed=3)


def test_sampled_rows_are_the_streams_rows_across_wraparound():
    data = stream(700)
    rb = frames_buffer(256, terminal_slots=256)
    plain = replaybuf.ReplayBuffer(256, spec=SPEC, seed=3)
    for a in range(0, 700, 50):
        chunk = {k: v[a : a + 50] for k, v in data.items()}
        rb.extend(chunk)
        plain.extend(chunk)
    assert len(rb) == len(plain) == 256
    for _ in range(20):
        batch = rb.sample(32)
        ids = np.asarray(batch["action"])
        for key in SPEC:
            np.testing.assert_array_equal(np.asarray(batch[key]), data[key][ids])


def test_stacks_that_do_not_follow_are_refused_and_change_nothing():
    data = stream(40, seed=1)
    rb = frames_buffer(64)
    rb.extend({k: v[:20] for k, v in data.items()})
    with pytest.raises(replaybuf.ReplayBufferValueError, match="shifted by one frame"):
        rb.extend({k: v[21:30] for k, v in data.items()})
    assert len(rb) == 20
    unchecked = frames_buffer(64, checked=False)
    unchecked.extend({k: v[21:30] for k, v in data.items()})


def test_bad_frames_are_refused():
    with pytest.raises(replaybuf.ReplayBufferValueError, match=r"shape \[3, \.\.\]"):
        replaybuf.ReplayBuffer(16, spec=SPEC, frames=Frames(stack={"obs": 3}))
    with pytest.raises(replaybuf.ReplayBufferValueError, match="fill"):
        frames_buffer(16, fill="ones")
    with pytest.raises(replaybuf.ReplayBufferTypeError):
        replaybuf.ReplayBuffer(16, spec=SPEC, frames=replaybuf.Uniform())


def test_row_bytes_tell_the_stored_row_from_the_sampled_one():
    rb = frames_buffer(256)
    plain = replaybuf.ReplayBuffer(256, spec=SPEC, seed=3)
    assert rb.row_bytes["logical"] == plain.row_bytes["logical"]
    # Two stacks of 4 frames of 9 bytes sampled; one frame stored.
    assert rb.row_bytes["logical"] - rb.row_bytes["slot"] >= 2 * DEPTH * 9 - 9 - 16
    assert rb.row_bytes["side"] > 0
    assert plain.row_bytes["side"] == 0
    assert plain.row_bytes["slot"] > plain.row_bytes["logical"]


def rollout(n, seed=0):
    """`stream` shaped as a TorchRL rollout: `pixels` and `("next", "pixels")`, the
    step's end in `("next", "done")` / `("next", "truncated")`, and a root `done`
    that is false (the flag of the step's own observation after auto-reset)."""
    torch = pytest.importorskip("torch")
    tensordict = pytest.importorskip("tensordict")
    data = stream(n, seed)
    return tensordict.TensorDict(
        {
            "pixels": torch.from_numpy(data["obs"]),
            "action": torch.from_numpy(data["action"]),
            "done": torch.zeros(n, dtype=torch.bool),
            "next": {
                "pixels": torch.from_numpy(data["next_obs"]),
                "done": torch.from_numpy(data["done"]),
                "truncated": torch.zeros(n, dtype=torch.bool),
            },
        },
        [n],
    )


@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_torchrl_face_storages_take_frames(storage, tmp_path):
    rl = pytest.importorskip("replaybuf.torchrl")
    frames = Frames(stack={"pixels": DEPTH}, next_of={("next", "pixels"): "pixels"})
    data = rollout(600, seed=5)

    def buffer():
        return rl.TensorDictReplayBuffer(
            storage=getattr(rl, storage)(200, frames=frames), batch_size=32
        )

    rb = buffer()
    for a in range(0, 600, 40):
        rb.extend(data[a : a + 40])
    assert rb._native.row_bytes["slot"] < rb._native.row_bytes["logical"] / 2

    def check(batch):
        ids = batch["action"]
        for key in ("pixels", ("next", "pixels"), ("next", "done")):
            assert (batch[key] == data[key][ids]).all(), key

    for _ in range(10):
        check(rb.sample())
    # A checkpoint comes back into a buffer of the same storage.
    rb.dumps(tmp_path / "ckpt")
    back = buffer()
    back.loads(tmp_path / "ckpt")
    assert len(back) == len(rb)
    check(back.sample())
    # The rollout's continuation with a stack that skips a frame is refused and
    # changes nothing.
    bad = rollout(640, seed=5)[600:]
    bad["pixels"][5] = bad["pixels"][7]
    before = rb.write_count
    with pytest.raises(ValueError, match="pixels` of data row 5"):
        rb.extend(bad)
    assert rb.write_count == before
    rb.extend(rollout(640, seed=5)[600:])
    assert rb.write_count == before + 40


def test_torchrl_face_indexes_a_frames_buffers_stored_rows():
    # A negative index, a slice and a mask pick among the rows `rb[:]` reads: a frames
    # buffer leaves out the steps whose stacks it cannot rebuild (the oldest) and the
    # last one (its next frame not yet stored). Positions counted back from `len`
    # named those, and `rb[-1]` raised.
    rl = pytest.importorskip("replaybuf.torchrl")
    torch = pytest.importorskip("torch")
    frames = Frames(stack={"pixels": DEPTH}, next_of={("next", "pixels"): "pixels"})
    data = rollout(600, seed=5)
    for capacity in (200, 1000):
        rb = rl.TensorDictReplayBuffer(
            storage=rl.LazyTensorStorage(capacity, frames=frames), batch_size=32
        )
        for a in range(0, 600, 40):
            rb.extend(data[a : a + 40])
        stored = rb[:]
        assert len(stored) < len(rb)
        for k in (-1, -2, -len(stored)):
            assert (rb[k]["pixels"] == stored[k]["pixels"]).all(), k
            assert rb[k]["action"] == stored[k]["action"], k
        with pytest.raises(IndexError):
            rb[-len(stored) - 1]
        picks = [
            slice(-10, None),
            slice(2, 5),
            slice(None, 7),
            slice(None, None, 3),
            torch.tensor([[-1, -3], [-len(stored), -2]]),
            torch.arange(len(stored)) % 3 == 0,
        ]
        for index in picks:
            assert (rb[index]["action"] == stored[index]["action"]).all(), index
            assert (rb[index]["pixels"] == stored[index]["pixels"]).all(), index
        with pytest.raises(IndexError, match="mask"):
            rb[torch.ones(len(rb), dtype=torch.bool)]


def test_a_truncation_flag_given_alone_ends_episodes():
    # Frames(truncated=...) without done=: the flag was dropped, and a truncated
    # step's next observation became the next episode's first.
    spec = {
        "obs": ("float32", ()),
        "next_obs": ("float32", ()),
        "done": ("bool", ()),
        "trunc": ("bool", ()),
    }
    steps = [(0, 1, False), (1, 2, False), (2, 3, True), (100, 101, False), (101, 102, False)]
    batch = {
        "obs": np.array([s[0] for s in steps], np.float32),
        "next_obs": np.array([s[1] for s in steps], np.float32),
        "done": np.zeros(5, bool),
        "trunc": np.array([s[2] for s in steps]),
    }
    rb = replaybuf.ReplayBuffer(
        16, spec=spec, frames=Frames(next_of={"next_obs": "obs"}, truncated="trunc")
    )
    rb.extend(batch)
    rows = rb.read_all_in_order()
    # The newest step waits for its next observation.
    assert rows["next_obs"].tolist() == [1.0, 2.0, 3.0, 101.0]
