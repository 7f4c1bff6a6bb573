"""README numbers for the off-policy runtime: updates/s of each algorithm alone and inside the
runtime, the learner's idle fraction waiting for batches, and where inference runs.

    .venv/bin/python benchmarks/off_policy_throughput.py [--algos sac td3 fastsac flashsac] [--envs 1024]
        [--runs 2] [--seconds 60] [--placement-algos sac fastsac] [--device auto|cpu|cuda|...]

- learner alone: `algo.update` on one fixed batch of the algorithm's default size, nothing else, on
  the learner device (`--device`, as `hetlab train` picks it);
- runtime: `hetlab train --algo A --max-seconds S` with the algorithm's defaults (fresh
  processes); updates/s between the first and the last logged iteration (the random warm-up
  excluded), env steps/s, and the learner's share of time waiting for a staged batch;
- placement: the same run with inference in the collector (its CPU actor copy) and on the
  learner (request/response ring), for `--placement-algos`.
Every figure is a median over `--runs`, configurations alternating within each run. Run it
alone: on a 2-core box any other process skews every rate. Writes
runs/benchmarks/off_policy_throughput.json and prints markdown tables.
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

from hetlab.algos import ALGOS
from hetlab.devices import pick_device
from hetlab.tasks import task_class

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="go1-joystick-flat")
parser.add_argument("--algos", nargs="+", default=["sac", "td3", "fastsac", "flashsac"])
parser.add_argument("--placement-algos", nargs="+", default=["sac", "fastsac"])
parser.add_argument("--envs", type=int, default=1024)
parser.add_argument("--runs", type=int, default=2)
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--device", default="auto", help="the learner's device, as hetlab train --device takes it")
args = parser.parse_args()
device = torch.device(pick_device(args.device).torch_device)
task = task_class(args.task)


def learner_alone(algo_name: str) -> float:
    cfg = ALGOS[algo_name].Config()
    algo = ALGOS[algo_name](task.obs_sizes, task.action_size, cfg, device)
    b, p, c, a = cfg.batch_size, task.obs_sizes["policy"], task.obs_sizes["critic"], task.action_size
    batch = {"policy_obs": torch.randn(b, p), "critic_obs": torch.randn(b, c), "actions": torch.rand(b, a) * 2 - 1,
             "rewards": torch.randn(b), "bootstrap": torch.full((b,), cfg.gamma),
             "next_policy_obs": torch.randn(b, p), "next_critic_obs": torch.randn(b, c)}
    batch = {name: value.to(device) for name, value in batch.items()}
    algo.update(batch)  # first-call allocations out of the timing
    updates, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds / 3 or updates < 3:
        algo.update(batch)
        updates += 1
    return updates / (time.perf_counter() - start)


def in_runtime(algo_name: str, inference: str) -> dict:
    utd = ALGOS[algo_name].Config().updates_per_step
    horizon = max(1, round(8 / utd))  # ~8 updates per logged iteration
    with tempfile.TemporaryDirectory() as runs:
        out = subprocess.run(
            [sys.executable, "-m", "hetlab.cli", "train", "--device", args.device, "--algo", algo_name, "--task", args.task, "--envs", str(args.envs),
             "--horizon", str(horizon), "--max-seconds", str(args.seconds), "--max-iterations", "100000000",
             "--checkpoint-every", "100000000", "--off-policy.inference", inference, "--runs-dir", runs],
            check=True, capture_output=True, text=True,
        )
        run_dir = Path(out.stdout.splitlines()[0])
        summary = json.loads((run_dir / "summary.json").read_text())
        history = json.loads((run_dir / "history.json").read_text())
    first, last = history[0], history[-1]
    span = last["wall_seconds"] - first["wall_seconds"]
    return {
        "updates_per_s": (last["updates"] - first["updates"]) / span if span > 0 else float("nan"),
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / span if span > 0 else float("nan"),
        "learner_idle": summary["learner_idle_fraction"],
        "iterations": summary["iterations"],
        "mean_return_last": summary["mean_return_last"],
    }


configs = [(name, "collector") for name in args.algos] + [
    (name, "learner") for name in args.placement_algos
]
alone: dict[str, list[float]] = {name: [] for name in args.algos}
runtime: dict[str, list[dict]] = {f"{name}/{where}": [] for name, where in configs}
for run in range(args.runs):
    for name in args.algos:
        alone[name].append(learner_alone(name))
    for name, where in configs:
        runtime[f"{name}/{where}"].append(in_runtime(name, where))
        print(f"run {run + 1}/{args.runs}: {name} ({where}) done", file=sys.stderr, flush=True)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


results = {
    "task": args.task, "envs": args.envs, "seconds": args.seconds, "runs": args.runs,
    "learner_alone_updates_per_s": alone, "runtime": runtime,
}
out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / "off_policy_throughput.json").write_text(json.dumps(results, indent=2))

print(f"| {args.task}, {args.envs} envs | batch | updates/step | learner alone updates/s | in the runtime updates/s "
      "| runtime ÷ alone | env steps/s | learner idle |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name in args.algos:
    cfg, rows = ALGOS[name].Config(), runtime[f"{name}/collector"]
    updates = median(rows, "updates_per_s")
    print(f"| {name} | {cfg.batch_size} | {cfg.updates_per_step:g} | {statistics.median(alone[name]):.1f} | {updates:.1f} "
          f"| {updates / statistics.median(alone[name]):.2f} | {median(rows, 'env_steps_per_s'):,.0f} "
          f"| {median(rows, 'learner_idle'):.1%} |")
print()
print("| inference placement | collector: updates/s | learner: updates/s | collector: env steps/s | learner: env steps/s "
      "| collector: idle | learner: idle |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in args.placement_algos:
    here, there = runtime[f"{name}/collector"], runtime[f"{name}/learner"]
    print(f"| {name} | {median(here, 'updates_per_s'):.1f} | {median(there, 'updates_per_s'):.1f} "
          f"| {median(here, 'env_steps_per_s'):,.0f} | {median(there, 'env_steps_per_s'):,.0f} "
          f"| {median(here, 'learner_idle'):.1%} | {median(there, 'learner_idle'):.1%} |")
