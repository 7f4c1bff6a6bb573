"""Numbers for the physics/task split: medians of several `hetlab bench sim` runs.

    .venv/bin/python benchmarks/sim_throughput.py [--task go1-joystick-flat] [--runs 5] [--seconds 20]
                                                  [--envs 256 1024] [--threads 0] [--sim mujoco|motrix|all]

Each run is a fresh process (`hetlab bench sim --json`), itself a median over alternating
physics/task rounds; with `--sim all` the backends' rounds interleave, so they compare side by
side. A fresh process per setting also gives MotrixSim, which has one thread pool per process, the
thread count asked for. Run it alone: on a 2-core box any other process skews every rate.
Writes runs/benchmarks/sim_throughput-<task>[-<sim>].json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="go1-joystick-flat")
parser.add_argument("--envs", type=int, nargs="+", default=[256, 1024])
parser.add_argument("--threads", type=int, nargs="+", default=[0], help="physics threads; 0 = every core")
parser.add_argument("--sim", default="mujoco", help="a physics backend, or all of them side by side")
parser.add_argument("--runs", type=int, default=5)
parser.add_argument("--seconds", type=float, default=20.0)
args = parser.parse_args()

KEYS = ("physics_steps_per_s", "env_steps_per_s", "task_efficiency", "physics_share")
hetlab = Path(sys.executable).with_name("hetlab")
rows = []
for threads in args.threads:
    for envs in args.envs:
        runs = []
        for run in range(args.runs):
            out = subprocess.run(
                [str(hetlab), "bench", "sim", "--task", args.task, "--envs", str(envs), "--threads", str(threads),
                 "--sim", args.sim, "--seconds", str(args.seconds), "--json"],
                check=True, capture_output=True, text=True,
            )
            result = json.loads(out.stdout)
            runs.append(result["results"] if args.sim == "all" else [result])
            print(f"{envs} envs, {threads} threads: run {run + 1}/{args.runs}", file=sys.stderr)
        for backend in range(len(runs[0])):
            per_run = [r[backend] for r in runs]
            rows.append({"sim": per_run[0]["sim"], "envs": envs, "threads": per_run[0]["threads"],
                         **{key: statistics.median(r[key] for r in per_run) for key in KEYS}, "runs": per_run})

out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
suffix = "" if args.sim == "mujoco" else f"-{args.sim}"
(out_dir / f"sim_throughput-{args.task}{suffix}.json").write_text(json.dumps({"task": args.task, "results": rows}, indent=2))
print(f"| {args.task} | sim | threads | physics substeps/s | env steps/s | task_efficiency | physics share of the task loop |")
print("|---|---|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['envs']} envs | {r['sim']} | {r['threads']} | {r['physics_steps_per_s']:,.0f} | {r['env_steps_per_s']:,.0f} "
          f"| {r['task_efficiency']:.3f} | {r['physics_share']:.3f} |")
