"""The PPO learner alone: fp32, bf16 autocast (`--ppo.bf16`), torch.compile (`--ppo.compile`) and both,
side by side in one run.

    .venv/bin/python benchmarks/learner_speed.py [--task go1-joystick-flat] [--envs 512] [--horizon 24]
        [--hidden 256 128 64] [--seconds 8] [--rounds 3]

Each round times `PPO.update` on one fixed batch of the task's shapes (envs × horizon samples) for
`--seconds` in each variant, alternating, in this process on the learner's device (the default
`hetlab train` picks). Each variant's algorithm is made and compiled once, before the rounds (the
compilation's seconds are printed). Prints the median milliseconds per update of each and its
speed against fp32, with the hardware; bf16 is left out where the learner has no native bfloat16.
Run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from hetlab.algos.ppo import PPO, PPOConfig
from hetlab.devices import pick_device
from hetlab.tasks import task_class

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="go1-joystick-flat")
parser.add_argument("--envs", type=int, default=512)
parser.add_argument("--horizon", type=int, default=24)
parser.add_argument("--hidden", type=int, nargs="+", default=[256, 128, 64])
parser.add_argument("--seconds", type=float, default=8.0)
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()

device = pick_device()
task = task_class(args.task)
T, E, A = args.horizon, args.envs, task.action_size
P, C = task.obs_sizes["policy"], task.obs_sizes["critic"]
generator = torch.Generator().manual_seed(0)
batch = {"policy_obs": torch.randn(T + 1, E, P, generator=generator),
         "critic_obs": torch.randn(T + 1, E, C, generator=generator),
         "actions": torch.randn(T, E, A, generator=generator), "log_probs": torch.randn(T, E, generator=generator),
         "rewards": torch.randn(T, E, generator=generator), "terminated": torch.zeros(T, E),
         "truncated": torch.zeros(T, E), "final_critic_obs": torch.zeros(T, E, C),
         "policy_version": torch.zeros(E, dtype=torch.int64)}
batch = {name: value.to(device.torch_device) for name, value in batch.items()}
cfg = PPOConfig(actor_hidden=tuple(args.hidden), critic_hidden=tuple(args.hidden))
variants = {"fp32": {}, "compile": {"compile": True}}
if device.bf16:
    variants |= {"bf16": {"bf16": True}, "bf16 + compile": {"bf16": True, "compile": True}}


def made(options: dict) -> tuple[PPO, float]:
    """The variant's algorithm after a first update (allocations and compilation), and that update's seconds."""
    algo = PPO(task.obs_sizes, A, dataclasses.replace(cfg, **options), torch.device(device.torch_device))
    start = time.perf_counter()
    algo.update(batch)
    return algo, time.perf_counter() - start


def milliseconds_per_update(algo: PPO) -> float:
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        algo.update(batch)  # its metrics are floats: the device has finished when it returns
        updates += 1
    return (time.perf_counter() - start) / updates * 1000


algos = {name: made(options) for name, options in variants.items()}
times: dict[str, list[float]] = {name: [] for name in variants}
for _ in range(args.rounds):
    for name, (algo, _) in algos.items():
        times[name].append(milliseconds_per_update(algo))
medians = {name: statistics.median(values) for name, values in times.items()}
print(f"PPO update, {args.task}, {E} envs × {T} steps, {'-'.join(map(str, args.hidden))} networks, "
      f"on {device.name} ({torch.get_num_threads()} threads); medians of {args.rounds} rounds")
for name, values in times.items():
    print(f"  {name}: {medians[name]:.1f} ms per update, {medians['fp32'] / medians[name]:.2f}× fp32's speed "
          f"(rounds: {', '.join(f'{v:.1f}' for v in values)}; first update {algos[name][1]:.1f} s)")
if not device.bf16:
    print("  bf16: not measured, the learner has no native bfloat16")
