"""Does PPO learn each task on a CPU? One timed `hetlab train` run per task, one after the other,
with the return (and each task's per-episode metrics: goals reached, tracking errors) at the
start and at the end, and the learning curves as one figure.

    .venv/bin/python benchmarks/task_learning.py [--tasks leap-cube-reorient g1-walk-flat g1-track-motion]
                                                 [--minutes 10] [--envs 512] [--sims mujoco motrix]
                                                 [--name task_learning]

PPO runs with the `make run` settings (actor and critic 256-128-64, initial action noise 0.5).
With several `--sims`, each task trains once on each physics backend and their curves share a
panel. Run it alone: on a 2-core box any other process slows every run. Writes
runs/benchmarks/<name>.{json,png} and prints a markdown table.
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
parser.add_argument("--tasks", nargs="+", default=["leap-cube-reorient", "g1-walk-flat", "g1-track-motion"])
parser.add_argument("--minutes", type=float, default=10.0)
parser.add_argument("--envs", type=int, default=512)
parser.add_argument("--sims", nargs="+", default=["mujoco"], help="physics backends to train each task on")
parser.add_argument("--name", default="task_learning", help="file name of the results under runs/benchmarks")
args = parser.parse_args()

PPO_ARGS = ["--algo", "ppo", "--ppo.actor-hidden", "256", "128", "64",
            "--ppo.critic-hidden", "256", "128", "64", "--ppo.init-noise-std", "0.5"]


def train(task: str, sim: str) -> dict:
    hetlab = Path(sys.executable).with_name("hetlab")
    with tempfile.TemporaryDirectory() as runs:
        out = subprocess.run(
            [str(hetlab), "train", "--task", task, "--envs", str(args.envs), "--max-seconds", str(args.minutes * 60),
             "--max-iterations", "100000000", "--checkpoint-every", "100000000", "--runs-dir", runs, "--sim", sim,
             *PPO_ARGS],
            check=True, capture_output=True, text=True,
        )
        run_dir = Path(out.stdout.splitlines()[0])
        return {"summary": json.loads((run_dir / "summary.json").read_text()),
                "history": json.loads((run_dir / "history.json").read_text())}


results = {}
for task in args.tasks:
    for sim in args.sims:
        results[task, sim] = train(task, sim)
        print(f"{task} on {sim} done", file=sys.stderr, flush=True)

out_dir = Path("runs/benchmarks")
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / f"{args.name}.json").write_text(json.dumps(
    {"envs": args.envs, "minutes": args.minutes, "ppo_args": PPO_ARGS,
     "results": [{"task": task, "sim": sim, **result} for (task, sim), result in results.items()]}))

fig, axes = plt.subplots(1, len(args.tasks), figsize=(4.2 * len(args.tasks), 3.6), squeeze=False)
for ax, task in zip(axes[0], args.tasks):
    for sim in args.sims:
        rows = [row for row in results[task, sim]["history"] if row["mean_return"] == row["mean_return"]]
        ax.plot([row["env_steps"] / 1e6 for row in rows], [row["mean_return"] for row in rows],
                label=sim if len(args.sims) > 1 else None)
    ax.set_title(task)
    ax.set_xlabel("env steps (millions)")
    ax.grid(alpha=0.3)
    if len(args.sims) > 1:
        ax.legend(title="physics")
axes[0][0].set_ylabel("mean episode return (last 100 episodes)")
fig.suptitle(f"PPO, {args.envs} envs, {args.minutes:g} min each on the CPU")
fig.tight_layout()
fig.savefig(out_dir / f"{args.name}.png", dpi=110)

print("| task | physics | env steps | env-steps/s | return first → last | per-episode metrics first → last |")
print("|---|---|---:|---:|---|---|")
for (task, sim), result in results.items():
    s = result["summary"]
    metrics = ", ".join(
        f"{key[len('episode/'):-len('_first')]} {s[key]:.3g} → {s[key[:-len('_first')] + '_last']:.3g}"
        for key in s if key.startswith("episode/") and key.endswith("_first"))
    print(f"| {task} | {sim} | {s['env_steps']:,} | {s['env_steps_per_s']:,.0f} | "
          f"{s['mean_return_first']:.2f} → {s['mean_return_last']:.2f} | {metrics} |")
