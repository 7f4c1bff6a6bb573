"""The PPO learner alone, fp32 against bf16 autocast (`--ppo.bf16`), side by side in one run.

    .venv/bin/python benchmarks/learner_speed.py [--task go1-joystick-flat] [--envs 512] [--horizon 24]
        [--hidden 256 128 64] [--seconds 8] [--rounds 3]

Each round times `PPO.update` on one fixed batch of the task's shapes (envs × horizon samples) for
`--seconds` in each precision, alternating, in this process on the learner's device (the default
`hetlab train` picks). Prints the median milliseconds per update of each and their ratio, with the
hardware; bf16 is left out where the learner has no native bfloat16. Run it alone.
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
precisions = ("fp32", "bf16") if device.bf16 else ("fp32",)


def milliseconds_per_update(bf16: bool) -> float:
    algo = PPO(task.obs_sizes, A, dataclasses.replace(cfg, bf16=bf16), torch.device(device.torch_device))
    algo.update(batch)  # first-call allocations out of the timing
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        algo.update(batch)  # its metrics are floats: the device has finished when it returns
        updates += 1
    return (time.perf_counter() - start) / updates * 1000


times: dict[str, list[float]] = {precision: [] for precision in precisions}
for _ in range(args.rounds):
    for precision in precisions:
        times[precision].append(milliseconds_per_update(precision == "bf16"))
medians = {precision: statistics.median(values) for precision, values in times.items()}
print(f"PPO update, {args.task}, {E} envs × {T} steps, {'-'.join(map(str, args.hidden))} networks, "
      f"on {device.name} ({torch.get_num_threads()} threads); medians of {args.rounds} rounds")
for precision, values in times.items():
    print(f"  {precision}: {medians[precision]:.1f} ms per update (rounds: {', '.join(f'{v:.1f}' for v in values)})")
if "bf16" in medians:
    print(f"  bf16 ÷ fp32 speed: {medians['fp32'] / medians['bf16']:.2f}×")
else:
    print("  bf16: not measured, the learner has no native bfloat16")
