"""README numbers for the physics/task split: medians of several `hetlab bench sim` runs.

    .venv/bin/python benchmarks/sim_throughput.py [--runs 5] [--seconds 20] [--envs 256 1024]

Each run is a fresh process (`hetlab bench sim --json`), itself a median over alternating
physics/task rounds. Run it alone: on a 2-core box any other process skews both rates.
Writes runs/benchmarks/sim_throughput-<task>.json and prints a markdown table.
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
parser.add_argument("--runs", type=int, default=5)
parser.add_argument("--seconds", type=float, default=20.0)
args = parser.parse_args()

hetlab = Path(sys.executable).with_name("hetlab")
results = {}
for envs in args.envs:
    runs = []
    for run in range(args.runs):
        out = subprocess.run(
            [str(hetlab), "bench", "sim", "--task", args.task, "--envs", str(envs), "--seconds", str(args.seconds), "--json"],
            check=True, capture_output=True, text=True,
        )
        runs.append(json.loads(out.stdout))
        print(f"envs {envs} run {run + 1}/{args.runs}: task_efficiency {runs[-1]['task_efficiency']:.3f}", file=sys.stderr)
    results[envs] = {
        key: statistics.median(r[key] for r in runs)
        for key in ("physics_steps_per_s", "env_steps_per_s", "task_efficiency", "physics_share")
    } | {"runs": runs, "threads": runs[0]["threads"]}

out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / f"sim_throughput-{args.task}.json").write_text(json.dumps({"task": args.task, "results": results}, indent=2))
print(f"| {args.task} | threads | physics substeps/s | env steps/s | task_efficiency | physics share of the task loop |")
print("|---|---:|---:|---:|---:|---:|")
for envs, r in results.items():
    print(
        f"| {envs} envs | {r['threads']} | {r['physics_steps_per_s']:,.0f} | {r['env_steps_per_s']:,.0f} "
        f"| {r['task_efficiency']:.3f} | {r['physics_share']:.3f} |"
    )
