"""README numbers for the RL runtime: end-to-end env-steps/s of sync vs async PPO, against the
two stages alone, with the time breakdown and the learner's idle fraction.

    .venv/bin/python benchmarks/runtime_throughput.py [--task T] [--envs 256 1024] [--runs 3] [--seconds 40]
        [--device auto|cpu|cuda|...]

- collectors alone: one process stepping the task with the actor's inference, nothing else;
- learner alone: PPO updates on batches of the same shape on the learner device (`--device`, as
  `hetlab train` picks it), as env steps absorbed per second;
- sync / async: `hetlab train --algo ppo --mode sync|async --max-seconds S` (fresh processes).
Every figure is a median over `--runs`. Run it alone: on a 2-core box any other process
skews every rate. Writes runs/benchmarks/runtime_throughput.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hetlab.algos.ppo import PPO, PPOConfig
from hetlab.devices import pick_device
from hetlab.tasks import make_task

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="go1-joystick-flat")
parser.add_argument("--envs", type=int, nargs="+", default=[256, 1024])
parser.add_argument("--horizon", type=int, default=24)
parser.add_argument("--runs", type=int, default=3)
parser.add_argument("--seconds", type=float, default=40.0)
parser.add_argument("--device", default="auto", help="the learner's device, as hetlab train --device takes it")
args = parser.parse_args()
device = torch.device(pick_device(args.device).torch_device)


def collectors_alone(envs: int) -> float:
    task = make_task(args.task, num_envs=envs, seed=0)
    actor = PPO(task.obs_sizes, task.action_size, PPOConfig(), torch.device("cpu")).actor
    obs, steps, start = task.reset(), 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds / 2:
        with torch.no_grad():
            actions, _ = actor.act(torch.from_numpy(obs["policy"]))
        obs, *_ = task.step(actions.numpy())
        steps += envs
    return steps / (time.perf_counter() - start)


def learner_alone(envs: int) -> float:
    task = make_task(args.task, num_envs=envs, seed=0)
    algo = PPO(task.obs_sizes, task.action_size, PPOConfig(), device)
    T, P, C, A = args.horizon, task.obs_sizes["policy"], task.obs_sizes["critic"], task.action_size
    batch = {
        "policy_obs": torch.randn(T + 1, envs, P), "critic_obs": torch.randn(T + 1, envs, C),
        "actions": torch.randn(T, envs, A), "log_probs": torch.randn(T, envs), "rewards": torch.randn(T, envs),
        "terminated": torch.zeros(T, envs), "truncated": torch.zeros(T, envs),
        "final_critic_obs": torch.zeros(T, envs, C), "policy_version": torch.zeros(envs, dtype=torch.int64),
    }
    batch = {name: value.to(device) for name, value in batch.items()}
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds / 2:
        algo.update(batch)
        updates += 1
    return updates * T * envs / (time.perf_counter() - start)


def end_to_end(envs: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as runs:
        out = subprocess.run(
            [sys.executable, "-m", "hetlab.cli", "train", "--algo", "ppo", "--mode", mode, "--device", args.device, "--task", args.task, "--envs", str(envs),
             "--horizon", str(args.horizon), "--max-seconds", str(args.seconds), "--max-iterations", "1000000",
             "--checkpoint-every", "1000000", "--runs-dir", runs],
            check=True, capture_output=True, text=True,
        )
        return json.loads((Path(out.stdout.splitlines()[0]) / "summary.json").read_text())


results = {}
for envs in args.envs:
    row: dict = {"collectors_alone": [], "learner_alone": [], "sync": [], "async": []}
    for run in range(args.runs):
        row["collectors_alone"].append(collectors_alone(envs))
        row["learner_alone"].append(learner_alone(envs))
        for mode in ("sync", "async"):
            row[mode].append(end_to_end(envs, mode))
        print(f"envs {envs} run {run + 1}/{args.runs} done", file=sys.stderr)
    medians = {
        "collectors_alone": statistics.median(row["collectors_alone"]),
        "learner_alone": statistics.median(row["learner_alone"]),
        **{f"{mode}_env_steps_per_s": statistics.median(s["env_steps_per_s"] for s in row[mode]) for mode in ("sync", "async")},
        **{f"{mode}_learner_idle": statistics.median(s["learner_idle_fraction"] for s in row[mode]) for mode in ("sync", "async")},
        "async_policy_lag": statistics.median(s["policy_lag_mean"] for s in row["async"]),
    }
    medians["async_vs_slower_stage"] = medians["async_env_steps_per_s"] / min(medians["collectors_alone"], medians["learner_alone"])
    results[envs] = {"medians": medians, "runs": row}

out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / "runtime_throughput.json").write_text(json.dumps({"task": args.task, "horizon": args.horizon, "results": results}, indent=2))
print(f"| {args.task} | collectors alone | learner alone | sync | async | async ÷ slower stage | learner idle sync / async | async lag |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for envs, r in results.items():
    m = r["medians"]
    print(
        f"| {envs} envs | {m['collectors_alone']:,.0f} | {m['learner_alone']:,.0f} | {m['sync_env_steps_per_s']:,.0f} "
        f"| {m['async_env_steps_per_s']:,.0f} | {m['async_vs_slower_stage']:.2f} "
        f"| {m['sync_learner_idle']:.0%} / {m['async_learner_idle']:.0%} | {m['async_policy_lag']:.1f} |"
    )
