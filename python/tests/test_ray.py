"""replaybuf.ray on a local Ray cluster: remote collectors' rows all accounted for,
priorities routed across shards, an actor killed and back with its checkpoint,
rate-limit timeouts raised through the actor, FIFO queues across actors, and
same-node writers writing the actors' shared buffers in place."""

import gc
import glob
import os
import pickle
import subprocess
import time
import weakref

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


def test_a_checkpoint_dir_without_a_finished_dump_starts_empty_and_one_of_another_layout_is_refused(
    tmp_path,
):
    # What a first dump cut short leaves: no meta.json, which a finished one renames in.
    shard = tmp_path / "shard-0"
    shard.mkdir()
    for name in (".lock", "control.1.bin", "slots.1.bin"):
        (shard / name).write_bytes(b"\0" * 8)
    rb = RayReplayBuffer(100, spec=SPEC, checkpoint_dir=str(tmp_path), shards=None)
    assert len(rb) == 0
    rb.extend(rows(range(5)))
    rb.checkpoint()
    # The finished dump, into a buffer of other fields: refused, not taken silently.
    with pytest.raises(replaybuf.ReplayBufferError, match="layout|spec|field"):
        other = RayReplayBuffer(100, spec={"other": ("int64", ())}, checkpoint_dir=str(tmp_path))
        len(other)


def test_bad_indices_priorities_and_sizes_are_refused_as_one_buffer_refuses_them():
    rb = RayReplayBuffer(100, spec=SPEC, num_actors=2, sampler=replaybuf.Prioritized(0.6, 0.4))
    rb.extend(rows(range(10)))
    assert rb.update_priority([], []) == (0, 0)
    with pytest.raises(replaybuf.ReplayBufferValueError, match="line up"):
        rb.update_priority([0, 1], [1.0, 2.0, 3.0])
    with pytest.raises(replaybuf.ReplayBufferIndexError):
        rb.update_priority([-1], [1.0])
    with pytest.raises(replaybuf.ReplayBufferIndexError):
        rb.priority(-1)
    with pytest.raises(replaybuf.ReplayBufferValueError):
        rb.sample(-1)


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


@pytest.mark.parametrize(
    "sampler",
    [None, replaybuf.Prioritized(alpha=0.7, beta=0.5)],
    ids=["uniform", "prioritized"],
)
def test_a_sample_of_no_rows_over_two_actors_is_empty_like_one_buffers(sampler):
    rb = RayReplayBuffer(20, spec=SPEC, num_actors=2, sampler=sampler, local_writes=False)
    rb.extend(rows(range(5)))
    rb.extend(rows(range(5, 10)))
    one = replaybuf.ReplayBuffer(20, spec=SPEC, sampler=sampler)
    one.extend(rows(range(10)))
    got, expected = rb.sample(0), one.sample(0)
    assert got.keys() == expected.keys()
    for key, array in expected.items():
        assert got[key].dtype == array.dtype and got[key].shape == array.shape, key


def test_a_without_replacement_sampler_is_refused_over_several_actors():
    """Each actor would keep an epoch of its own, and a batch split by rows held can
    ask one for more than its epoch has left: refused when built, not at random."""
    epochs = [
        replaybuf.WithoutReplacement(),
        replaybuf.Slice(
            slice_len=2, traj_key="id", without_replacement=replaybuf.WithoutReplacement()
        ),
    ]
    for sampler in epochs:
        with pytest.raises(replaybuf.ReplayBufferValueError, match="num_actors=1"):
            RayReplayBuffer(20, spec=SPEC, num_actors=2, sampler=sampler, local_writes=False)
    # One actor keeps one epoch: every row once, then the epoch's end.
    rb = RayReplayBuffer(20, spec=SPEC, num_actors=1, sampler=epochs[0], local_writes=False, seed=4)
    rb.extend(rows(range(10)))
    ids = np.concatenate([whole(rb.sample(4)) for _ in range(3)])
    assert sorted(ids.tolist()) == list(range(10))
    with pytest.raises(replaybuf.EpochEnd):
        rb.sample(4)


def test_writers_on_remote_collectors_store_every_row_once_flushed():
    # Shipped through the object store, as from collectors on other nodes.
    rb = RayReplayBuffer(10_000, spec=SPEC, num_actors=2, seed=2, local_writes=False)

    @ray.remote
    def collect(rb, worker):
        writer = rb.writer(max_rows=120, max_in_flight=2, indices=True)
        chunk = rows(np.zeros(50))
        for k in range(10):
            # One chunk's arrays written over for every extend: the writer copies.
            first = worker * 1_000 + k * 50
            chunk["id"][:] = np.arange(first, first + 50)
            chunk["obs"][:] = chunk["id"][:, None]
            writer.extend(chunk)
        assert writer.acknowledged + writer.pending == 500
        index = writer.flush()
        assert writer.acknowledged == 500 and writer.pending == 0
        return index

    indices = ray.get([collect.remote(rb, w) for w in range(3)])
    assert [len(i) for i in indices] == [500, 500, 500]
    assert len(rb) == 1_500 and rb.write_count == 1_500
    got = rb.read_all()
    ids = whole(got)
    assert sorted(ids.tolist()) == [w * 1_000 + i for w in range(3) for i in range(500)]
    # The indices a flush returns are those of its collector's rows.
    by_index = dict(zip(got["index"].tolist(), ids.tolist()))
    for worker, index in enumerate(indices):
        assert sorted(by_index[i] // 1_000 for i in index.tolist()) == [worker] * 500


def test_a_writer_refuses_chunks_unlike_its_first_and_taking_nothing_of_them():
    rb = RayReplayBuffer(1_000, spec=SPEC, local_writes=False)
    writer = rb.writer(max_rows=16, indices=True)
    with pytest.raises(replaybuf.ReplayBufferError):
        writer.extend({"id": np.arange(4)})  # no obs: the buffer refuses the first chunk
    assert len(rb) == 0 and writer.pending == 0
    writer.extend(rows(range(4)))
    writer.extend(rows(range(4, 10)))
    assert writer.pending == 6
    bad = rows(range(10, 12))
    for chunk in (
        {**bad, "obs": bad["obs"].astype(np.float64)},
        {**bad, "obs": bad["obs"][:, :2]},
        {"id": bad["id"]},
        {**bad, "id": bad["id"][:1]},
    ):
        with pytest.raises(replaybuf.ReplayBufferValueError):
            writer.extend(chunk)
        assert writer.pending == 6
    assert len(rb) == 4
    assert len(writer.flush()) == 10  # the first chunk too: stored since no flush
    assert sorted(whole(rb.read_all()).tolist()) == list(range(10))


def test_a_writer_is_held_back_by_the_rate_limit_until_its_timeout():
    rb = RayReplayBuffer(
        1_000, spec=SPEC, rate_limit=replaybuf.RateLimit.queue(20), local_writes=False
    )
    writer = rb.writer(max_rows=10, max_in_flight=1, timeout=2.0, indices=True)
    writer.extend(rows(range(10)))  # straight through
    writer.extend(rows(range(10, 20)))  # on its way: 10 unsampled before it
    writer.extend(rows(range(20, 30)))  # waits for the one before; then on its way, held
    # The actor holds the third shipment (20 unsampled); the next chunk waits for it.
    with pytest.raises(replaybuf.ReplayBufferTimeoutError):
        writer.extend(rows(range(30, 40)))
    assert writer.pending == 10 and len(rb) == 20
    assert len(rb.sample(10)["id"]) == 10  # frees the held shipment
    assert len(writer.flush()) == 30  # every row since the writer began
    assert len(rb) == 30 and writer.acknowledged == 30


def test_a_first_chunk_that_outlasts_the_wait_is_taken_not_sent_twice():
    # Its timeout raised while the actor still held the call, which then stored it;
    # the caller, told nothing was taken, sent it again: its rows stored twice.
    rb = RayReplayBuffer(
        1_000, spec=SPEC, rate_limit=replaybuf.RateLimit.queue(20), local_writes=False
    )
    rb.extend(rows(range(20)))  # the queue is full
    writer = rb.writer(max_rows=10, timeout=0.5, indices=True)
    writer.extend(rows(range(100, 110)))  # held by the actor's limit: on its way
    assert writer.pending == 10 and writer.acknowledged == 0
    assert len(rb.sample(20)["id"]) == 20
    assert len(writer.flush()) == 10
    assert sorted(whole(rb.read_all()).tolist()) == list(range(20)) + list(range(100, 110))


def test_a_shipment_the_actor_timed_out_is_sent_again_and_a_refused_one_dropped():
    # The shipment's error stayed at the head of the writer's queue: every later call
    # raised it again, and nothing else was sent.
    limit = replaybuf.RateLimit.queue(20, insert_timeout=0.3)
    rb = RayReplayBuffer(1_000, spec=SPEC, rate_limit=limit, local_writes=False)
    writer = rb.writer(max_rows=10, max_in_flight=1, indices=True)
    for first in (0, 10, 20):
        writer.extend(rows(range(first, first + 10)))
    with pytest.raises(replaybuf.ReplayBufferTimeoutError):
        writer.flush()  # the third shipment waited out the actor's insert timeout
    assert writer.pending == 10
    assert len(rb.sample(20)["id"]) == 20
    assert len(writer.flush()) == 30  # sent again, and stored
    assert writer.pending == 0 and writer.acknowledged == 30
    writer.extend(rows(range(30, 40)))  # the queue full again
    rb.close_rate_limit()
    writer.extend(rows(range(40, 50)))
    with pytest.raises(replaybuf.ReplayBufferError):
        writer.flush()  # refused by the closed limit: dropped with the error
    assert writer.pending == 0
    # Nothing left to raise; the stored shipment's rows, which the raise held back.
    assert len(writer.flush()) == 10
    writer.extend(rows(range(40, 50)))  # and the writer goes on


def test_a_one_actor_batch_is_writable():
    rb = RayReplayBuffer(100, spec=SPEC, local_writes=False)
    rb.extend(rows(range(10)))
    batch = rb.sample(4)
    batch["obs"] *= 2  # read-only arrays out of the object store refused this


def test_a_bad_priority_update_over_several_actors_changes_nothing():
    rb = RayReplayBuffer(
        100,
        spec=SPEC,
        num_actors=2,
        sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4),
        local_writes=False,
    )
    i0, i1 = rb.extend(rows(range(10))), rb.extend(rows(range(10, 20)))
    before = rb.priority(int(i0[0]))
    with pytest.raises(replaybuf.ReplayBufferValueError):
        rb.update_priority([i0[0], i1[0]], [5.0, np.nan])
    assert rb.priority(int(i0[0])) == before  # the other actor's part went in
    with pytest.raises(replaybuf.ReplayBufferValueError):
        rb.update_priority([i0[0], i0[1], i1[0]], np.ones((2, 3)))  # regrouped before
    with pytest.raises(replaybuf.ReplayBufferValueError):
        rb.update_priority([i0[0], i1[0]], [1.0, 2.0], generation=[0])
    with pytest.raises(replaybuf.ReplayBufferTypeError):
        rb.update_priority([i0[0]], ["high"])
    # An index past the capacity: the other actor applied its part.
    with pytest.raises(replaybuf.ReplayBufferIndexError, match="out of range"):
        rb.update_priority([int(i0[0]), 101], [5.0, 1.0])
    assert rb.priority(int(i0[0])) == before


def test_periodic_checkpoints_go_on_after_one_fails(tmp_path):
    rb = RayReplayBuffer(
        100,
        spec=SPEC,
        checkpoint_dir=str(tmp_path),
        checkpoint_every_s=0.2,
        local_writes=False,
    )
    rb.extend(rows(range(5)))
    shard = tmp_path / "shard-0"
    deadline = time.monotonic() + 30
    while not (shard / "meta.json").exists():
        assert time.monotonic() < deadline, "no periodic checkpoint"
        time.sleep(0.05)
    # A file where the checkpoint's directory belongs: the next dumps fail.
    moved = tmp_path / "moved"
    shard.rename(moved)
    shard.write_bytes(b"in the way")
    time.sleep(0.6)
    shard.unlink()
    rb.extend(rows(range(5, 9)))
    deadline = time.monotonic() + 30
    while True:
        if (shard / "meta.json").exists():
            loaded = replaybuf.ReplayBuffer.from_checkpoint(str(shard))
            if len(loaded) == 9:
                break
        assert time.monotonic() < deadline, "periodic checkpoints stopped"
        time.sleep(0.05)


def test_a_writer_sends_again_what_a_dead_actor_did_not_acknowledge():
    rb = RayReplayBuffer(1_000, spec=SPEC, num_actors=2, local_writes=False)
    writer = rb.writer(max_rows=10, max_in_flight=4, indices=True)
    writer.extend(rows(range(10)))  # straight through, to actor 0
    dead = rb.actors[0]
    ray.kill(dead, no_restart=True)
    # The kill is asynchronous: a call may still be answered until the actor is gone.
    deadline = time.monotonic() + 30
    while True:
        try:
            ray.get(dead.ready.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            break
        assert time.monotonic() < deadline, "the killed actor kept answering"
        time.sleep(0.05)
    writer.extend(rows(range(10, 20)))  # a full shipment: to actor 1
    writer.extend(rows(range(20, 30)))  # to actor 0, dead
    with pytest.raises(ReplayBufferUnavailable):
        writer.flush(timeout=30)
    assert writer.pending == 10 and writer.acknowledged == 20
    # Sent again, to the next actor in turn (1): stored, the writer's rows all acknowledged.
    index = writer.flush(timeout=30)
    assert writer.pending == 0 and writer.acknowledged == 30
    # Every row since the writer began: the first chunk on actor 0, the rest on 1.
    assert sorted((index % 2).tolist()) == [0] * 10 + [1] * 20
    held = ray.get(rb.actors[1].call.remote("read_all_in_order"))
    assert sorted(whole(held).tolist()) == list(range(10, 30))


def test_inserts_held_by_the_rate_limit_leave_the_learners_threads():
    # Two threads for extends, two for samples: three extends held back by a queue
    # limit fill the insert group (and queue one), and a sample still runs.
    rb = RayReplayBuffer(
        1_000,
        spec=SPEC,
        rate_limit=replaybuf.RateLimit.queue(10),
        concurrency_groups={"insert": 2, "sample": 2},
        ray_options={"max_concurrency": 2},
    )
    rb.extend(rows(range(10)))
    actor = rb.actors[0]
    held = [actor.extend.remote(rows(range(10 + 10 * k, 20 + 10 * k))) for k in range(3)]
    assert ray.wait(held, timeout=0.5)[0] == [], "the queue limit holds every extend"
    # Each sample of 10 lets one held extend in (10 unsampled rows again).
    for _ in range(3):
        assert len(ray.get(actor.sample.remote(10), timeout=30)["id"]) == 10
    ray.get(held, timeout=30)
    assert len(rb) == 40


def test_a_fifo_buffer_over_two_actors_hands_every_row_out_once():
    rb = RayReplayBuffer(64, spec=SPEC, num_actors=2, sampler=replaybuf.Fifo(), seed=3)
    for first in range(0, 40, 5):
        rb.extend(rows(range(first, first + 5)))  # the actors take chunks in turn
    got = []
    while True:
        try:
            batch = rb.sample(7)
        except replaybuf.ReplayBufferValueError as e:
            assert "empty" in str(e)
            break
        got.append(whole(batch))
    ids = np.concatenate(got)
    assert sorted(ids.tolist()) == list(range(40))
    # Each actor's rows (every other chunk) come out oldest first.
    for k in range(2):
        mine = [i for i in ids.tolist() if i // 5 % 2 == k]
        assert mine == sorted(mine)


def test_same_node_writers_write_the_actors_shared_buffers_in_place():
    # Shards an actor: its own, one for each of two collectors on its node, a spare
    # (shards are a power of two).
    rb = RayReplayBuffer(10_000, spec=SPEC, num_actors=2, shards=4, seed=4)

    @ray.remote
    def collect(rb, worker):
        writer = rb.writer(max_rows=10_000, indices=True)
        for k in range(10):
            first = worker * 1_000 + k * 50
            writer.extend(rows(range(first, first + 50)))
            # In place: stored when extend returns, nothing gathered or on its way.
            assert writer.acknowledged == 50 * (k + 1) and writer.pending == 0
        return writer.flush()

    indices = ray.get([collect.remote(rb, w) for w in range(2)])
    # The driver's extends go in place too, each actor's into its fourth shard.
    index = rb.extend(rows(range(5_000, 5_010)))
    assert sorted(whole(rb.read_all())[np.isin(rb.read_all()["index"], index)]) == list(
        range(5_000, 5_010)
    )
    assert len(rb) == 1_010
    got = rb.read_all()
    ids = whole(got)
    expected = [w * 1_000 + i for w in range(2) for i in range(500)] + list(range(5_000, 5_010))
    assert sorted(ids.tolist()) == expected
    by_index = dict(zip(got["index"].tolist(), ids.tolist()))
    for worker, index in enumerate(indices):
        assert sorted(by_index[i] // 1_000 for i in index.tolist()) == [worker] * 500
        assert sorted((index % 2).tolist()) == [0] * 250 + [1] * 250  # both actors


def test_a_same_node_writer_finds_the_restarted_actor_and_its_checkpoint(tmp_path):
    rb = RayReplayBuffer(1_000, spec=SPEC, shards=2, checkpoint_dir=str(tmp_path))
    writer = rb.writer()
    writer.extend(rows(range(10)))
    assert writer.pending == 0 and len(rb) == 10
    assert writer.flush() is None  # it keeps no indices unless asked
    rb.checkpoint()
    writer.extend(rows(range(10, 20)))  # after the checkpoint: lost with the actor
    old_pid = ray.get(rb.actors[0].local_region.remote())[1]
    os.kill(old_pid, 9)
    time.sleep(0.1)  # past the writer's next look at the actor (every 50 ms)
    with pytest.raises(ReplayBufferUnavailable):
        writer.extend(rows(range(20, 30)))  # the actor's process is gone
    deadline = time.monotonic() + 60
    while True:
        try:
            writer.extend(rows(range(20, 30)))  # into the restarted actor's buffer
            break
        except ReplayBufferUnavailable:
            assert time.monotonic() < deadline, "the actor did not come back"
            time.sleep(0.2)
    region = ray.get(rb.actors[0].local_region.remote())
    assert region[1] != old_pid
    assert sorted(whole(rb.read_all()).tolist()) == list(range(10)) + list(range(20, 30))
    # The dead actor's region was removed by its successor.
    assert not glob.glob(f"/dev/shm/replaybuf.*-{old_pid}")


@ray.remote(num_cpus=0)
class Collector:
    """A collector process of its own, with one writer."""

    def __init__(self, rb):
        self.writer = rb.writer(max_rows=10, indices=True)

    def extend(self, ids):
        self.writer.extend(rows(ids))
        return self.writer.pending

    def flush(self):
        return len(self.writer.flush())


def test_a_same_node_writer_ships_when_no_shard_is_free():
    rb = RayReplayBuffer(1_000, spec=SPEC, shards=2)
    first, second = Collector.remote(rb), Collector.remote(rb)
    # The first takes the one shard the actor does not keep: in place.
    assert ray.get(first.extend.remote(list(range(10)))) == 0
    # None is left for the second: its first chunk is shipped (and waited for), and
    # the next one gathered into a shipment.
    assert ray.get(second.extend.remote(list(range(10, 20)))) == 0
    assert ray.get(second.extend.remote(list(range(20, 25)))) == 5
    assert ray.get(second.flush.remote()) == 15
    assert sorted(whole(rb.read_all()).tolist()) == list(range(25))


def test_a_fifo_queue_over_actors_takes_rows_from_the_one_that_holds_them():
    # All rows in one actor: a batch asked the other first, which waited on its own
    # queue's limit (a timeout, or forever without one) while rows waited.
    rb = RayReplayBuffer(
        32,
        spec=SPEC,
        num_actors=2,
        local_writes=False,
        seed=3,
        sampler=replaybuf.Fifo(),
        rate_limit=replaybuf.RateLimit.queue(8, sample_timeout=5.0),
    )
    rb.extend(rows(range(4)))
    got = []
    for _ in range(2):
        start = time.monotonic()
        got += whole(rb.sample(2)).tolist()
        assert time.monotonic() - start < 2.0
    assert got == [0, 1, 2, 3]


def test_slices_over_actors_split_by_whole_slices():
    # The split was by rows: an actor asked for 1 row of a 2-step slice failed, and
    # num_slices= cut each actor's share into that many slices. slice_len= goes; a
    # num_slices= sampler over several actors is refused.
    spec = {**SPEC, ("next", "done"): ("bool", ())}
    rb = RayReplayBuffer(
        64,
        spec=spec,
        num_actors=2,
        local_writes=False,
        seed=0,
        batch_size=4,
        sampler=replaybuf.Slice(slice_len=2),
    )
    for first in range(0, 32, 8):
        chunk = rows(range(first, first + 8))
        chunk[("next", "done")] = np.arange(8) % 4 == 3
        rb.extend(chunk)
    for _ in range(8):
        ids = whole(rb.sample())
        assert len(ids) == 4
        for a, b in ids.reshape(-1, 2):
            assert b == a + 1 and a % 4 != 3, ids
    with pytest.raises(replaybuf.ReplayBufferValueError, match="slice_len"):
        RayReplayBuffer(64, spec=spec, num_actors=2, sampler=replaybuf.Slice(num_slices=2))


def test_padding_rows_keep_the_padding_index_over_actors():
    # Made global, the padding index wrapped around into another actor's index
    # (2**64 - 2 from actor 0 of 2), and an update of the sample's rows was refused
    # as out of range instead of skipping the padding as one buffer does.
    spec = {**SPEC, ("next", "done"): ("bool", ())}
    rb = RayReplayBuffer(
        64,
        spec=spec,
        num_actors=2,
        local_writes=False,
        seed=0,
        batch_size=8,
        sampler=replaybuf.Slice(slice_len=4, strict_length=False),
    )
    chunk = rows(range(16))
    chunk[("next", "done")] = np.arange(16) % 2 == 1  # trajectories of 2
    rb.extend(chunk)
    for _ in range(4):
        s = rb.sample()
        index = s["index"].reshape(-1, 4)
        assert (index[:, 2:] == replaybuf.PADDING_INDEX).all(), index
        assert (index[:, :2] < 64).all(), index
    shard, local = rb._split(s["index"])
    assert (local[index.reshape(-1) == replaybuf.PADDING_INDEX] == replaybuf.PADDING_INDEX).all()
    assert (rb._global(local, 0)[shard == 0] == s["index"][shard == 0]).all()


def test_add_takes_nested_dicts_and_python_values_as_a_local_buffer():
    spec = {"x": ("float32", ()), ("next", "obs"): ("float32", (2,))}
    rb = RayReplayBuffer(8, spec=spec, num_actors=2, local_writes=False, seed=1)
    rb.add({"x": 3.0, "next": {"obs": [1.0, 2.0]}})
    rb.add({"x": np.float32(4.0), ("next", "obs"): np.array([3.0, 4.0], np.float32)})
    assert sorted(rb.read_all()["x"].tolist()) == [3.0, 4.0]


def test_a_writer_whose_first_chunk_is_empty_ships_8_mib():
    # The rows a shipment holds came from the first chunk's first row: an empty chunk
    # made them 8 MiB of rows of one byte, and a stage of gigabytes.
    rb = RayReplayBuffer(100, spec=SPEC, num_actors=1, local_writes=False)
    w = rb.writer()
    w.extend(rows([]))
    w.extend(rows(range(5)))
    assert w._max_rows == (8 << 20) // (8 + 12)
    w.flush()
    assert sorted(rb.read_all()["id"].tolist()) == list(range(5))


def test_settings_the_buffer_refuses_raise_as_a_single_buffer_raises_them():
    # An actor's failed start came back as ReplayBufferUnavailable, "retryable".
    with pytest.raises(replaybuf.ReplayBufferError) as e:
        RayReplayBuffer(100, spec={"x": ("float33", ())})
    assert not isinstance(e.value, ReplayBufferUnavailable)
    with pytest.raises(replaybuf.ReplayBufferError) as e:
        RayReplayBuffer(100, spec=SPEC, shards=3)
    assert not isinstance(e.value, ReplayBufferUnavailable)


def test_a_buffer_handle_dropped_lets_go_of_its_shard_without_a_collection():
    rb = RayReplayBuffer(1_000, spec=SPEC, shards=2)
    copy = pickle.loads(pickle.dumps(rb))  # as a task gets it
    copy.extend(rows(range(5)))  # in place: the copy attaches to the actor's region
    assert copy._here._attached, "written in place"
    gone = weakref.ref(copy)
    gc.disable()
    try:
        del copy
        assert gone() is None, "a cycle kept the handle (and its shard's lease)"
    finally:
        gc.enable()
    assert len(rb) == 5


def test_the_regions_of_dead_actors_are_removed_when_a_buffer_starts():
    child = subprocess.Popen(["true"])
    child.wait()  # a pid no process runs now
    stale = f"/dev/shm/replaybuf.ray-0123456789ab-0-{child.pid}"
    kept = "/dev/shm/replaybuf.ray-run-0"  # not an actor's region: left alone
    for path in (stale, kept):
        with open(path, "wb") as f:
            f.write(b"\0" * 8)
    try:
        rb = RayReplayBuffer(1_000, spec=SPEC, shards=2)
        rb.extend(rows(range(3)))
        assert not os.path.exists(stale)
        assert os.path.exists(kept)
    finally:
        for path in (stale, kept):
            if os.path.exists(path):
                os.unlink(path)


def test_a_fifo_batch_over_actors_asks_those_with_rows_waiting_and_keeps_what_it_took():
    # Actors were picked by size, which counts taken rows: a drained actor was asked,
    # waited on its queue's limit and timed out, and the rows taken from the actor
    # asked before it were dropped with the error.
    rb = RayReplayBuffer(
        64,
        spec=SPEC,
        num_actors=2,
        sampler=replaybuf.Fifo(),
        local_writes=False,
        rate_limit=replaybuf.RateLimit.queue(16, sample_timeout=0.3),
    )
    rb.extend(rows(range(4)))
    rb.extend(rows(range(4, 8)))
    assert len(rb.sample(8)["id"]) == 8
    rb.extend(rows([8, 9]))  # to actor 0
    for _ in range(4):
        got = rb.sample(4)
        assert sorted(got["id"].tolist()) == [8, 9]
        rb.extend(rows([8, 9]))
