"""FastSAC against PPO on the same task for the same wall-clock budget: mean episode return
over wall-clock minutes, as a plot.

    .venv/bin/python benchmarks/fastsac_vs_ppo.py [--minutes 4] [--envs 512] [-- extra args for FastSAC]

PPO runs with the `make run` settings; FastSAC with the Holosoma recipe's defaults (batch 8192,
8 updates per env step), plus any arguments given after `--`. Each run is alone on the
machine, one after the other. Writes runs/benchmarks/fastsac_vs_ppo.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="go1-joystick-flat")
parser.add_argument("--minutes", type=float, default=4.0)
parser.add_argument("--envs", type=int, default=512)
parser.add_argument("fastsac_args", nargs="*", help="extra `hetlab train` arguments for FastSAC (after --)")
args = parser.parse_args()

PPO_ARGS = ["--algo", "ppo", "--ppo.actor-hidden", "256", "128", "64", "--ppo.critic-hidden", "256", "128", "64",
            "--ppo.init-noise-std", "0.5"]
FASTSAC_ARGS = ["--algo", "fastsac", "--horizon", "1", *args.fastsac_args]


def run(algo_args: list[str]) -> dict:
    hetlab = Path(sys.executable).with_name("hetlab")
    with tempfile.TemporaryDirectory() as runs:
        out = subprocess.run(
            [str(hetlab), "train", "--task", args.task, "--envs", str(args.envs), "--max-seconds",
             str(args.minutes * 60), "--max-iterations", "100000000", "--checkpoint-every", "100000000",
             "--runs-dir", runs, *algo_args],
            check=True, capture_output=True, text=True,
        )
        run_dir = Path(out.stdout.splitlines()[0])
        return {"summary": json.loads((run_dir / "summary.json").read_text()),
                "history": json.loads((run_dir / "history.json").read_text())}


results = {"ppo": run(PPO_ARGS)}
print("ppo done", file=sys.stderr, flush=True)
results["fastsac"] = run(FASTSAC_ARGS)

out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / "fastsac_vs_ppo.json").write_text(json.dumps(
    {"task": args.task, "envs": args.envs, "minutes": args.minutes, "fastsac_args": args.fastsac_args, **results}))
fig, ax = plt.subplots(figsize=(6.5, 4))
for name, result in results.items():
    rows = [row for row in result["history"] if row["mean_return"] == row["mean_return"]]
    ax.plot([row["wall_seconds"] / 60 for row in rows], [row["mean_return"] for row in rows], label=name)
ax.set_xlabel("wall-clock minutes")
ax.set_ylabel("mean episode return (last 100 episodes)")
ax.set_title(f"{args.task}, {args.envs} envs, CPU learner")
ax.legend()
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out_dir / "fastsac_vs_ppo.png", dpi=120)
print("| algorithm | env steps | mean return at the end | learner idle |")
print("|---|---:|---:|---:|")
for name, result in results.items():
    s = result["summary"]
    print(f"| {name} | {s['env_steps']:,} | {s['mean_return_last']:.2f} | {s['learner_idle_fraction']:.0%} |")
