"""DQN on Gymnasium's CartPole-v1 with TorchRL, its replay buffer from replaybuf.

A plain TorchRL training script (collector, Q-value actor, epsilon-greedy exploration,
double-DQN loss, soft target updates) written against ``torchrl.data``'s
``TensorDictReplayBuffer`` and ``LazyTensorStorage``. The one line that differs between
TorchRL's buffer and replaybuf's is the import below: ``--buffer torchrl`` takes
``torchrl.data``, ``--buffer replaybuf`` (the default) takes ``replaybuf.torchrl``, and
nothing else in the script changes.

It trains until the mean return of the last 20 episodes reaches ``--target`` (195,
CartPole-v0's "solved" line; v1 episodes run to 500) or ``--frames`` environment steps
are spent, and prints the score, the frames and the time taken; it exits 1 if the
target was not reached. On the 2-core development machine, seeds 0 to 3 reached 195
after 8,800 to 11,792 frames (16 to 27 s) with replaybuf's buffer and after 9,744 to
39,920 frames (21 to 94 s) with TorchRL's; ``--target 475`` (v1's line) took 66,624
frames (seed 0, 128 s) with replaybuf's and 73,520 (130 s) with TorchRL's. The two
buffers draw different rows, so runs of one seed differ between them.

    python examples/python/torchrl_dqn.py                      # replaybuf's buffer
    python examples/python/torchrl_dqn.py --buffer torchrl     # TorchRL's, for comparison
"""

from __future__ import annotations

import argparse
import time
from collections import deque

import torch
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymEnv, RewardSum, StepCounter, TransformedEnv
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument(
    "--buffer",
    choices=["replaybuf", "torchrl"],
    default="replaybuf",
    help="whose TensorDictReplayBuffer and LazyTensorStorage to import",
)
p.add_argument("--frames", type=int, default=100_000, help="environment steps at most")
p.add_argument(
    "--target", type=float, default=195.0, help="stop once the last 20 episodes average this"
)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()

if args.buffer == "torchrl":
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
else:
    from replaybuf.torchrl import LazyTensorStorage, TensorDictReplayBuffer

FRAMES_PER_BATCH = 16  # environment steps between learning phases
UPDATES_PER_BATCH = 4  # gradient steps per learning phase
WARMUP_FRAMES = 1_024  # random steps before learning starts (a multiple of FRAMES_PER_BATCH)
BUFFER_SIZE = 50_000
BATCH_SIZE = 128
GAMMA = 0.99
LR = 1e-3
EPS_END, EPS_FRAMES = 0.05, 10_000  # epsilon: 1.0 down to 0.05 over the first 10,000 frames
TAU = 0.01  # soft target update per gradient step
WINDOW = 20  # episodes the score averages

torch.manual_seed(args.seed)
torch.set_num_threads(1)


def make_env():
    return TransformedEnv(GymEnv("CartPole-v1"), Compose(StepCounter(), RewardSum()))


env = make_env()
env.set_seed(args.seed)
value_net = MLP(
    in_features=env.observation_spec["observation"].shape[-1],
    out_features=env.action_spec.shape[-1],
    num_cells=[128, 128],
    activation_class=nn.ReLU,
)
actor = QValueActor(value_net, in_keys=["observation"], spec=env.action_spec)
exploration = EGreedyModule(
    env.action_spec, eps_init=1.0, eps_end=EPS_END, annealing_num_steps=EPS_FRAMES
)
policy = TensorDictSequential(actor, exploration)

collector = Collector(
    env,
    policy,
    frames_per_batch=FRAMES_PER_BATCH,
    total_frames=args.frames,
    init_random_frames=WARMUP_FRAMES,
)
buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(BUFFER_SIZE), batch_size=BATCH_SIZE)

loss_module = DQNLoss(actor, loss_function="smooth_l1", delay_value=True, double_dqn=True)
loss_module.make_value_estimator(gamma=GAMMA)
target_update = SoftUpdate(loss_module, tau=TAU)
optimizer = torch.optim.Adam(loss_module.parameters(), lr=LR)

returns: deque[float] = deque(maxlen=WINDOW)
episodes = frames = 0
score = float("nan")
start = time.perf_counter()
for data in collector:
    frames += data.numel()
    buffer.extend(data.reshape(-1))
    exploration.step(data.numel())
    ended = data["next", "done"].reshape(-1)
    for r in data["next", "episode_reward"].reshape(-1)[ended].tolist():
        returns.append(r)
        episodes += 1
    if frames >= WARMUP_FRAMES:
        for _ in range(UPDATES_PER_BATCH):
            batch = buffer.sample()
            loss = loss_module(batch)["loss"]
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(loss_module.parameters(), 10.0)
            optimizer.step()
            target_update.step()
        collector.update_policy_weights_()
    if len(returns) == WINDOW:
        score = sum(returns) / WINDOW
        if score >= args.target:
            break
    if frames % 5_000 < FRAMES_PER_BATCH:
        print(
            f"frames {frames:7,}  episodes {episodes:5,}  last-{WINDOW} mean return {score:6.1f}  "
            f"epsilon {exploration.eps.item():.3f}  {time.perf_counter() - start:6.1f}s",
            flush=True,
        )
collector.shutdown()

elapsed = time.perf_counter() - start
reached = score >= args.target
print(f"buffer: {args.buffer} ({type(buffer).__module__}.{type(buffer).__qualname__})")
print(
    f"{'reached' if reached else 'did not reach'} a mean return of {args.target:g} over the "
    f"last {WINDOW} episodes: {score:.1f} after {frames:,} frames, {episodes:,} episodes, "
    f"{elapsed:.0f}s"
)
raise SystemExit(0 if reached else 1)
