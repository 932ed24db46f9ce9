"""replaybuf.ray across nodes: a local cluster of two Ray nodes on this machine
(``ray.cluster_utils.Cluster``), the buffer's actors on the head node and collector
tasks on the other, writing through ``extend`` and through writers."""

import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from replaybuf.ray import RayReplayBuffer  # noqa: E402

SPEC = {"id": ("int64", ()), "obs": ("float32", (3,))}


def rows(ids):
    ids = np.asarray(ids, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


@pytest.fixture(scope="module")
def nodes():
    """Two nodes: the head (where the driver runs) offers the resource "buffer", the
    other "collector"; returns the head's node id."""
    here = os.path.dirname(os.path.abspath(__file__))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"buffer": 4}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"collector": 4})
    ray.init(
        address=cluster.address,
        logging_level="error",
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": here}},
    )
    cluster.wait_for_nodes()
    try:
        yield ray.get_runtime_context().get_node_id()
    finally:
        ray.shutdown()
        cluster.shutdown()


@ray.remote(num_cpus=0, resources={"collector": 1})
def collect(rb, worker, through_writer):
    """Writes 400 rows of ids worker * 1000 + 0..400 in 40-row chunks; returns the
    node it ran on and the indices the buffer gave the rows."""
    sink = rb.writer(max_rows=64, indices=True) if through_writer else rb
    stored = []
    for k in range(10):
        first = worker * 1_000 + k * 40
        index = sink.extend(rows(np.arange(first, first + 40)))
        if not through_writer:
            stored.append(index)
    if through_writer:
        stored.append(sink.flush())
    return ray.get_runtime_context().get_node_id(), np.concatenate(stored)


def test_collectors_on_another_node_write_every_row_to_actors_on_the_head(nodes):
    head = nodes
    rb = RayReplayBuffer(
        10_000,
        spec=SPEC,
        num_actors=2,
        seed=4,
        ray_options={"num_cpus": 0, "resources": {"buffer": 1}},
    )
    done = ray.get([collect.remote(rb, w, through_writer=w % 2 == 1) for w in range(4)])
    assert all(node != head for node, _ in done), "the collectors ran on the head node"
    assert len(rb) == 1_600 and rb.write_count == 1_600
    got = rb.read_all()
    ids = got["id"]
    np.testing.assert_array_equal(got["obs"], np.repeat(ids[:, None], 3, axis=1))
    assert sorted(ids.tolist()) == [w * 1_000 + i for w in range(4) for i in range(400)]
    # Each collector was told the indices of exactly its own rows.
    by_index = dict(zip(got["index"].tolist(), ids.tolist()))
    for worker, (_, index) in enumerate(done):
        assert sorted(by_index[i] // 1_000 for i in index.tolist()) == [worker] * 400
    batch = rb.sample(128)
    assert all(by_index[i] == v for i, v in zip(batch["index"].tolist(), batch["id"].tolist()))
