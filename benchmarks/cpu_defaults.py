"""Each algorithm with its defaults on a CPU learner: does cartpole-balance's mean return rise
within 150 s?

    .venv/bin/python benchmarks/cpu_defaults.py [--seconds 150] [--algos ppo appo sac td3 fastsac flashsac]

Runs `hetlab train --algo X --task cartpole-balance --device cpu --max-seconds S` and no other
option (so the defaults scaled for a CPU learner are what is measured), each algorithm alone,
one after the other. Prints a Markdown table of the summary's first → last mean return (the
mean of the last 100 episodes, at the first and the last iteration), iterations and updates,
with the load average over each run (other jobs on the machine slow a run down), and writes it
with the summaries to runs/benchmarks/cpu_defaults.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hetlab.algos import ALGOS

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seconds", type=float, default=150.0)
parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
args = parser.parse_args()


def run(algo: str) -> dict:
    hetlab = Path(sys.executable).with_name("hetlab")
    with tempfile.TemporaryDirectory() as runs:
        load_before = os.getloadavg()[0]
        start = time.monotonic()
        out = subprocess.run(
            [str(hetlab), "train", "--algo", algo, "--task", "cartpole-balance", "--device", "cpu",
             "--max-seconds", str(args.seconds), "--runs-dir", runs],
            capture_output=True, text=True,
        )
        if out.returncode:
            sys.exit(f"{algo} failed with exit status {out.returncode}:\n{out.stderr[-3000:]}")
        elapsed = time.monotonic() - start
        # The 1-minute load average at the end covers the run's last minute; the 5-minute one most of it.
        load_1, load_5, _ = os.getloadavg()
        run_dir = Path(out.stdout.splitlines()[0])
        scaled = next((line for line in out.stdout.splitlines() if line.startswith("CPU learner")), "")
        return {"summary": json.loads((run_dir / "summary.json").read_text()), "process_seconds": elapsed,
                "load_before": load_before, "load_1_after": load_1, "load_5_after": load_5, "scaled_line": scaled}


def ratio(summary: dict) -> str:
    first, last = summary["mean_return_first"], summary["mean_return_last"]
    return f"{last / first:.1f}×" if first and last is not None else "–"


def reward(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f}"


results = {}
for algo in args.algos:
    results[algo] = run(algo)
    s = results[algo]["summary"]
    print(f"{algo}: {reward(s['mean_return_first'])} → {reward(s['mean_return_last'])} "
          f"({s['iterations']} iterations)", file=sys.stderr, flush=True)

lines = [
    f"cartpole-balance, defaults, `--device cpu --max-seconds {args.seconds:g}`, {os.cpu_count()} cores",
    "",
    "| algorithm | mean return first → last | ratio | iterations | updates | env steps | load avg (1 / 5 min at end) |",
    "|---|---:|---:|---:|---:|---:|---:|",
]
for algo, result in results.items():
    s = result["summary"]
    lines.append(
        f"| {algo} | {reward(s['mean_return_first'])} → {reward(s['mean_return_last'])} | {ratio(s)} | "
        f"{s['iterations']} | {s.get('updates', '–')} | {s['env_steps']:,} | "
        f"{result['load_1_after']:.1f} / {result['load_5_after']:.1f} |"
    )
table = "\n".join(lines)
print(table)
out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / "cpu_defaults.md").write_text(table + "\n")
(out_dir / "cpu_defaults.json").write_text(json.dumps({"seconds": args.seconds, **results}, indent=2))
