"""A small pendulum simulator in numpy, and the check that a sampled transition is whole.

Shared by ``threads.py`` and ``processes.py``, with the loops of their collectors
(:func:`collect`) and learners (:func:`learn`). The dynamics are Gymnasium's
``Pendulum-v1``; many pendulums step at once (one numpy array each for the angle and
the angular velocity).

Every row carries a ``tag`` (collector, environment and step number), and everything
else in the row follows from it and from ``obs``: the action is a hash of the tag, and
``next_obs``, ``reward`` and ``done`` are one simulator step from ``obs`` under that
action. A learner recomputes them for every sampled row; a row torn between two
writes (half of one transition and half of another) disagrees with itself and is
counted.
"""

from __future__ import annotations

import time

import numpy as np
import replaybuf

G, MASS, LENGTH, DT = 10.0, 1.0, 1.0, 0.05
MAX_SPEED, MAX_TORQUE = 8.0, 2.0
EPISODE_STEPS = 200

# Fields of one transition: key -> (dtype, shape). float64 keeps the recomputation to
# within rounding of the collector's.
SPEC = {
    "obs": ("float64", (2,)),  # angle, angular velocity
    "action": ("float64", (1,)),  # torque
    "reward": ("float64", (1,)),
    "next_obs": ("float64", (2,)),
    "done": ("bool", (1,)),
    "tag": ("uint64", (1,)),  # collector << 48 | env << 32 | step
}

ENV_BITS, STEP_BITS = 16, 32


def tag_of(collector: int, env: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The tags of environments `env` of `collector` at their steps `step`."""
    return (
        (np.uint64(collector) << np.uint64(ENV_BITS + STEP_BITS))
        | (env.astype(np.uint64) << np.uint64(STEP_BITS))
        | step.astype(np.uint64)
    )


def collector_of(tag: np.ndarray) -> np.ndarray:
    return tag >> np.uint64(ENV_BITS + STEP_BITS)


def step_of(tag: np.ndarray) -> np.ndarray:
    return tag & np.uint64((1 << STEP_BITS) - 1)


def action_of(tag: np.ndarray) -> np.ndarray:
    """A torque in [-2, 2) drawn from the tag by a hash (splitmix64): the policy."""
    z = tag.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    unit = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (unit * 2.0 - 1.0) * MAX_TORQUE


def angle_normalize(x: np.ndarray) -> np.ndarray:
    return ((x + np.pi) % (2 * np.pi)) - np.pi


def step(theta: np.ndarray, thetadot: np.ndarray, torque: np.ndarray):
    """One step of every pendulum: (next angle, next angular velocity, reward)."""
    u = np.clip(torque, -MAX_TORQUE, MAX_TORQUE)
    cost = angle_normalize(theta) ** 2 + 0.1 * thetadot**2 + 0.001 * u**2
    newthdot = thetadot + (3 * G / (2 * LENGTH) * np.sin(theta) + 3.0 / (MASS * LENGTH**2) * u) * DT
    newthdot = np.clip(newthdot, -MAX_SPEED, MAX_SPEED)
    newth = theta + newthdot * DT
    return newth, newthdot, -cost


class Pendulums:
    """`envs` pendulums of one collector, stepped together, reset every 200 steps."""

    def __init__(self, collector: int, envs: int, seed: int):
        self.collector = collector
        self.env = np.arange(envs)
        self.rng = np.random.default_rng(seed)
        self.steps = np.zeros(envs, np.uint64)  # steps taken since the collector began
        self.theta = self.rng.uniform(-np.pi, np.pi, envs)
        self.thetadot = self.rng.uniform(-1.0, 1.0, envs)

    def rollout(self, steps: int) -> dict:
        """`steps` steps of every pendulum: a chunk of `steps * envs` transitions."""
        n = len(self.env)
        out = {k: np.empty((steps, n) + shape, dtype) for k, (dtype, shape) in SPEC.items()}
        for t in range(steps):
            tag = tag_of(self.collector, self.env, self.steps)
            action = action_of(tag)
            th, thdot, reward = step(self.theta, self.thetadot, action)
            done = step_of(tag) % EPISODE_STEPS == EPISODE_STEPS - 1
            out["obs"][t, :, 0], out["obs"][t, :, 1] = self.theta, self.thetadot
            out["action"][t, :, 0] = action
            out["reward"][t, :, 0] = reward
            out["next_obs"][t, :, 0], out["next_obs"][t, :, 1] = th, thdot
            out["done"][t, :, 0] = done
            out["tag"][t, :, 0] = tag
            # Episodes end after 200 steps: a fresh start for those pendulums.
            fresh = done.sum()
            th[done] = self.rng.uniform(-np.pi, np.pi, fresh)
            thdot[done] = self.rng.uniform(-1.0, 1.0, fresh)
            self.theta, self.thetadot = th, thdot
            self.steps += np.uint64(1)
        return {k: v.reshape((steps * n,) + v.shape[2:]) for k, v in out.items()}


def torn_rows(batch: dict, collectors: int) -> int:
    """Rows of a sampled batch that are not one whole transition of the simulator."""
    tag = batch["tag"][:, 0]
    action = action_of(tag)
    theta, thetadot = batch["obs"][:, 0], batch["obs"][:, 1]
    th, thdot, reward = step(theta, thetadot, action)
    # Bitwise the same arithmetic as the collector's; the tolerance only forgives a
    # last-bit difference between numpy's vector and scalar paths.
    close = lambda a, b: np.abs(a - b) <= 1e-12 * (1.0 + np.abs(b))  # noqa: E731
    ok = (
        (collector_of(tag) < np.uint64(collectors))
        & (batch["action"][:, 0] == action)
        & close(batch["next_obs"][:, 0], th)
        & close(batch["next_obs"][:, 1], thdot)
        & close(batch["reward"][:, 0], reward)
        & (batch["done"][:, 0] == (step_of(tag) % EPISODE_STEPS == EPISODE_STEPS - 1))
    )
    return int(len(tag) - ok.sum())


def collect(rb, collector: int, envs: int, steps: int, stop, tally) -> None:
    """A collector: steps its `envs` pendulums and extends `rb` with `steps` steps of
    each at a time until `stop` is set, adding the rows written to ``tally[0]``."""
    sim = Pendulums(collector, envs, seed=collector)
    while not stop.is_set():
        rows = sim.rollout(steps)
        try:
            rb.extend(rows)
        except replaybuf.RateLimitClosed:  # the run is over (`--ratio`)
            return
        tally[0] += len(rows["tag"])


def learn(rb, batch: int, collectors: int, stop, tally) -> None:
    """A learner: samples `batch` rows of `rb` until `stop` is set and checks each row,
    adding the rows sampled to ``tally[0]`` and the torn ones to ``tally[1]``. Its
    arrays are allocated by the first sample and refilled in place by the others."""
    out = None
    while not stop.is_set():
        if len(rb) < batch:
            time.sleep(0.001)
            continue
        try:
            if out is None:
                out = rb.sample(batch)
            else:
                rb.sample_into(out)
        except replaybuf.RateLimitClosed:  # the run is over (`--ratio`)
            return
        tally[0] += len(out["tag"])
        tally[1] += torn_rows(out, collectors)
