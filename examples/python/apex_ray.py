"""Ape-X on Ray with replaybuf.ray: collector actors feed one prioritized buffer actor
at a fixed replay ratio; one learner samples, learns and writes priorities back.

    python examples/python/apex_ray.py [--collectors 2] [--updates 3000]

Each collector actor runs CartPole-v1 (Gymnasium) with its own exploration rate, as
Ape-X gives each actor its own epsilon, acting on the latest weights the learner
published. It computes its transitions' initial priorities (their absolute TD errors
under those weights) and extends the buffer, priorities included (``priority_key``).
The learner (this process) samples prioritized batches, takes a Q-learning step on a
linear Q-function weighted by the importance weights, and writes the new TD errors
back as priorities; the buffer's rate limit keeps it at a fixed number of sampled rows
per collected row, so neither side runs away from the other.

On a real cluster: start Ray there (``ray start --head`` on one node, ``ray start
--address=HEAD:6379`` on the others) and run this with ``--address auto``; pass
``--buffer-cpus`` to place the buffer actor, and the collectors spread over the nodes.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import ray
import replaybuf
from replaybuf.ray import RayReplayBuffer

GAMMA = 0.99
ACTIONS = 2


def features(obs: np.ndarray) -> np.ndarray:
    """Features of CartPole states for a linear Q-function: the state, its squares,
    and a bias (rows of a batch, or one state)."""
    obs = np.atleast_2d(obs).astype(np.float32)
    return np.concatenate([obs, obs * obs, np.ones((len(obs), 1), np.float32)], axis=1)


FEATURES = features(np.zeros(4)).shape[1]


def q_values(w: np.ndarray, obs: np.ndarray) -> np.ndarray:
    return features(obs) @ w.T  # [rows, actions]


def td_errors(w, target, obs, action, reward, next_obs, done) -> np.ndarray:
    q = q_values(w, obs)[np.arange(len(obs)), action]
    best = q_values(target, next_obs).max(axis=1)
    return reward + GAMMA * (1.0 - done) * best - q


@ray.remote
class Params:
    """The learner's latest weights, for the collectors."""

    def __init__(self):
        self.w = np.zeros((ACTIONS, FEATURES), np.float32)

    def set(self, w):
        self.w = w

    def get(self):
        return self.w


@ray.remote
class Collector:
    def __init__(self, rb, params, epsilon: float, seed: int):
        self.rb, self.params, self.epsilon = rb, params, epsilon
        self.env = gym.make("CartPole-v1")
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.returns, self.episode = [], 0.0

    def run(self, chunk: int = 64) -> list:
        """Collects until the buffer's rate limit is closed; returns episode returns."""
        w = ray.get(self.params.get.remote())
        while True:
            rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "done")}
            for _ in range(chunk):
                if self.rng.random() < self.epsilon:
                    a = int(self.rng.integers(ACTIONS))
                else:
                    a = int(q_values(w, self.obs)[0].argmax())
                nxt, r, term, trunc, _ = self.env.step(a)
                for k, v in zip(rows, (self.obs, a, r, nxt, term)):
                    rows[k].append(v)
                self.episode += r
                self.obs = nxt
                if term or trunc:
                    self.returns.append(self.episode)
                    self.episode = 0.0
                    self.obs, _ = self.env.reset()
            data = {
                "obs": np.asarray(rows["obs"], np.float32),
                "action": np.asarray(rows["action"], np.int64),
                "reward": np.asarray(rows["reward"], np.float32),
                "next_obs": np.asarray(rows["next_obs"], np.float32),
                "done": np.asarray(rows["done"], np.float32),
            }
            # Ape-X: the actor computes its transitions' initial priorities.
            td = td_errors(w, w, **data)
            data["priority"] = (np.abs(td) + 1e-3).astype(np.float32)
            try:
                self.rb.extend(data)
            except replaybuf.RateLimitClosed:
                return self.returns
            w = ray.get(self.params.get.remote())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--updates", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--ratio", type=float, default=8.0, help="sampled rows per collected row")
    p.add_argument("--address", default=None, help="a Ray cluster's address (default: local)")
    p.add_argument("--buffer-cpus", type=float, default=0)
    args = p.parse_args()
    ray.init(address=args.address, include_dashboard=False, logging_level="error")

    spec = {
        "obs": ("float32", (4,)),
        "action": ("int64", ()),
        "reward": ("float32", ()),
        "next_obs": ("float32", (4,)),
        "done": ("float32", ()),
        "priority": ("float32", ()),
    }
    limit = replaybuf.RateLimit.sample_to_insert_ratio(
        args.ratio, 1_000, 4.0 * args.batch, sample_timeout=60.0, insert_timeout=60.0
    )
    rb = RayReplayBuffer(
        100_000,
        spec=spec,
        sampler=replaybuf.Prioritized(alpha=0.6, beta=0.4),
        priority_key="priority",
        rate_limit=limit,
        seed=0,
        ray_options={"num_cpus": args.buffer_cpus},
    )
    params = Params.remote()
    # Ape-X's epsilons: 0.4 ** (1 + 7 i / (N - 1)).
    n = args.collectors
    epsilons = [0.4 ** (1 + 7 * i / max(n - 1, 1)) for i in range(n)]
    collectors = [Collector.remote(rb, params, e, seed=i) for i, e in enumerate(epsilons)]
    runs = [c.run.remote() for c in collectors]

    w = np.zeros((ACTIONS, FEATURES), np.float32)
    target = w.copy()
    t0 = time.monotonic()
    for step in range(1, args.updates + 1):
        b = rb.sample(args.batch)
        td = td_errors(w, target, b["obs"], b["action"], b["reward"], b["next_obs"], b["done"])
        td = np.clip(td, -10.0, 10.0)
        grad = np.zeros_like(w)
        phi = features(b["obs"]) * (b["weight"] * td)[:, None]
        np.add.at(grad, b["action"], phi)
        w += 0.01 / args.batch * grad
        rb.update_priority(b["index"], np.abs(td) + 1e-3, b["generation"])
        if step % 100 == 0:
            target = w.copy()
            params.set.remote(w)
        if step % 500 == 0:
            s = rb.stats()[0]["rate_limit"]
            print(
                f"{time.monotonic() - t0:6.1f}s  update {step:5d}  rows {s['inserts']:7d}  "
                f"sampled/collected {s['samples'] / max(s['inserts'], 1):5.2f}  "
                f"|td| {np.abs(td).mean():.3f}",
                flush=True,
            )
    rb.close_rate_limit()
    returns = ray.get(runs)
    for e, r in zip(epsilons, returns):
        last = np.mean(r[-20:] or [0.0])
        print(f"collector eps {e:.4f}: {len(r)} episodes, last 20 returned {last:.1f} on average")
    s = rb.stats()[0]["rate_limit"]
    ratio = s["samples"] / s["inserts"]
    print(f"{s['inserts']} rows collected, {s['samples']} sampled: {ratio:.2f} per row")
    ray.shutdown()


if __name__ == "__main__":
    main()
