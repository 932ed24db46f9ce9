"""replaybuf.ray on a local Ray cluster: remote collectors' rows all accounted for,
priorities routed across shards, an actor killed and back with its checkpoint, and
rate-limit timeouts raised through the actor."""

import os
import time

import numpy as np
import pytest
import replaybuf

ray = pytest.importorskip("ray")
from replaybuf.ray import RayReplayBuffer, ReplayBufferUnavailable  # noqa: E402

SPEC = {"id": ("int64", ()), "obs": ("float32", (3,))}


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    # Workers import this module (the remote functions below live here).
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="error",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": here}},
    )
    yield
    ray.shutdown()


def whole(batch):
    """Every row's obs agrees with its id; returns the ids."""
    ids = batch["id"]
    np.testing.assert_array_equal(batch["obs"], np.repeat(ids[:, None], 3, axis=1))
    return ids


def test_remote_collectors_rows_are_all_accounted_for():
    rb = RayReplayBuffer(10_000, spec=SPEC, num_actors=2, seed=1)

    @ray.remote
    def collect(rb, worker):
        for k in range(10):
            first = worker * 1_000 + k * 50
            rb.extend(rows(np.arange(first, first + 50)))
        return 500

    written = sum(ray.get([collect.remote(rb, w) for w in range(3)]))
    assert written == 1_500 and len(rb) == 1_500 and rb.write_count == 1_500
    ids = whole(rb.read_all())
    expected = [w * 1_000 + i for w in range(3) for i in range(500)]
    assert sorted(ids.tolist()) == expected
    batch = rb.sample(256)
    assert len(whole(batch)) == 256
    # Global indices name the actor that holds the row.
    got = rb.read_all()
    by_index = dict(zip(got["index"].tolist(), got["id"].tolist()))
    assert all(by_index[i] == v for i, v in zip(batch["index"].tolist(), batch["id"].tolist()))


def test_priorities_are_routed_to_the_actor_that_holds_the_row():
    rb = RayReplayBuffer(
        64, spec=SPEC, num_actors=2, sampler=replaybuf.Prioritized(alpha=1.0, beta=0.4)
    )
    index = np.concatenate([rb.extend(rows(range(8))), rb.extend(rows(range(8, 16)))])
    assert set((index % 2).tolist()) == {0, 1}
    priority = np.where(np.arange(16) == 11, 5.0, 0.0)
    assert rb.update_priority(index, priority) == (16, 0)
    assert rb.priority(int(index[11])) == 5.0 and rb.priority(int(index[3])) == 0.0
    # Row 11 carries nearly all the mass (the rest is eps): nearly every draw is row 11.
    sampled = rb.sample(64)
    ids = whole(sampled)
    from_its_actor = ids[(sampled["index"] % 2) == index[11] % 2]
    assert len(from_its_actor) > 0 and (from_its_actor == 11).all()


def test_a_prioritized_sample_is_split_by_mass_and_weighed_as_one_buffer():
    alpha, beta, eps = 0.7, 0.5, 1e-8
    rb = RayReplayBuffer(
        2_000,
        spec=SPEC,
        num_actors=2,
        sampler=replaybuf.Prioritized(alpha=alpha, beta=beta, eps=eps),
        seed=3,
    )
    index = np.concatenate([rb.extend(rows(range(500))), rb.extend(rows(range(500, 1_000)))])
    # Actor 0's rows are light, actor 1's heavy: 1 against 9 in priority.
    priority = np.where(index % 2 == 0, 1.0, 9.0) * (1.0 + np.arange(1_000) / 1_000)
    assert rb.update_priority(index, priority) == (1_000, 0)
    mass = (priority + eps) ** alpha
    by_index = dict(zip(index.tolist(), mass.tolist()))
    share = mass[index % 2 == 1].sum() / mass.sum()
    heavy, draws = 0, 0
    for _ in range(20):
        batch = rb.sample(256)
        whole(batch)
        heavy += int((batch["index"] % 2 == 1).sum())
        draws += 256
        # One buffer's weights: the smallest mass of all over the row's, to the beta.
        got_mass = np.array([by_index[i] for i in batch["index"].tolist()])
        np.testing.assert_allclose(batch["weight"], (mass.min() / got_mass) ** beta, rtol=1e-3)
    # By mass, not by rows held (which would give a half).
    assert abs(heavy / draws - share) < 0.03, (heavy / draws, share)


def test_an_actor_killed_comes_back_with_its_checkpoint(tmp_path):
    rb = RayReplayBuffer(1_000, spec=SPEC, checkpoint_dir=str(tmp_path))
    rb.extend(rows(range(100)))
    assert rb.checkpoint() == [str(tmp_path / "shard-0")]
    rb.extend(rows(range(100, 120)))  # after the checkpoint: lost with the actor
    actor = rb.actors[0]
    ray.kill(actor, no_restart=False)
    # Calls meanwhile fail as unavailable (or find the restarted actor); the restarted
    # actor says it was restored from the checkpoint.
    deadline = time.monotonic() + 60
    while True:
        try:
            if ray.get(actor.ready.remote(), timeout=10):
                break
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            pass
        try:
            len(rb)
        except ReplayBufferUnavailable:
            pass
        assert time.monotonic() < deadline, "the actor never came back"
        time.sleep(0.2)
    assert len(rb) == 100
    assert sorted(whole(rb.read_all()).tolist()) == list(range(100))
    rb.extend(rows(range(200, 210)))
    assert len(rb) == 110


def test_rate_limit_timeouts_come_through_the_actor():
    rb = RayReplayBuffer(
        100,
        spec=SPEC,
        rate_limit=replaybuf.RateLimit.min_size(10, sample_timeout=0.05),
    )
    rb.extend(rows(range(5)))
    with pytest.raises(replaybuf.ReplayBufferTimeoutError):
        rb.sample(4)
    rb.extend(rows(range(5, 10)))
    assert len(rb.sample(4)["id"]) == 4
    assert rb.stats()[0]["rate_limit"]["samples"] == 4


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_actors"):
        RayReplayBuffer(10, spec=SPEC, num_actors=0)
    with pytest.raises(ValueError, match="checkpoint_dir"):
        RayReplayBuffer(10, spec=SPEC, shared="x")
