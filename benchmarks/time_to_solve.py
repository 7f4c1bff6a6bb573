"""How long a task's recipe takes to reach "solved" here: one `hetlab train --until-solved` run, its
criteria against wall-clock time, and the final policy judged by `hetlab eval`.

    .venv/bin/python benchmarks/time_to_solve.py --task go1-joystick-flat [--budget-minutes 14]
        [--seeds 0 1] [--eval-sim-dt 0] [-- extra hetlab train options, e.g. --sim-dt 0.01 --envs 1024]

Each seed trains the task's recipe (with the extra options on top) until an evaluation passes every
criterion or the budget runs out, then `hetlab eval` judges the last checkpoint over 128 episodes
(at the task's own physics step with --eval-sim-dt 0, which a recipe training at a coarser step must
pass). Run it alone: on a 2-core machine any other process slows every number. Writes
OUT/time_to_solve-<task>.{json,png} (--out, default runs/benchmarks), and prints a markdown table with the hardware.

    .venv/bin/python benchmarks/time_to_solve.py --task go1-joystick-flat --from-runs RUN [RUN ...]

draws the same figure and table from runs already trained (a resumed one included), each judged by
its newest `hetlab eval` report, without training.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from hetlab.train.config import cli_option

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", required=True)
parser.add_argument("--budget-minutes", type=float, default=14.0)
parser.add_argument("--seeds", type=int, nargs="+", default=[0])
parser.add_argument("--eval-sim-dt", type=float, default=None,
                    help="physics step of the final evaluation; default: the run's own; 0: the task's own")
parser.add_argument("--runs-dir", default="runs/benchmarks/time_to_solve")
parser.add_argument("--out", type=Path, default=Path("runs/benchmarks"), help="where the json and the figure go")
parser.add_argument("--from-runs", nargs="+", type=Path, default=None, metavar="RUN",
                    help="report these run directories instead of training")
parser.add_argument("extra", nargs="*", help="options for hetlab train after --, over the recipe")
args = parser.parse_args()

HETLAB = [sys.executable, "-m", "hetlab.cli"]
OUT = args.out


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def run_seed(seed: int) -> dict:
    command = [*HETLAB, "train", "--task", args.task, "--until-solved", "--seed", str(seed), "--max-iterations",
               "100000000", "--max-seconds", str(args.budget_minutes * 60), "--runs-dir", args.runs_dir, *args.extra]
    train = subprocess.run(command, capture_output=True, text=True)
    # A run a stop signal ended (128 + INT, TERM or HUP) has stopped with a checkpoint: judge that one too.
    if train.returncode not in (0, 128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):
        raise subprocess.CalledProcessError(train.returncode, command, train.stdout, train.stderr)
    run_dir = Path(train.stdout.splitlines()[0])
    evaluate = [*HETLAB, "eval", str(run_dir), "--json"]
    if args.eval_sim_dt is not None:
        evaluate += ["--sim-dt", str(args.eval_sim_dt)]
    return result(run_dir, json.loads(subprocess.run(evaluate, check=True, capture_output=True, text=True).stdout))


def newest_report(run_dir: Path) -> dict:
    reports = sorted(run_dir.glob("eval/*.json"), key=lambda path: path.stat().st_mtime)
    if not reports:
        sys.exit(f"{run_dir} has no evaluation report: run `hetlab eval {run_dir}` first")
    return json.loads(reports[-1].read_text())


BOOKKEEPING = {"task", "seed", "runs_dir", "max_seconds", "max_iterations", "until_solved", "resume", "checkpoint"}


def options_over_recipe(config: dict) -> str:
    """The options a run's command line set over its recipe, as `--name value`."""
    given = []
    for name, source in sorted(config["option_sources"].items()):
        if source.startswith("command line") and name not in BOOKKEEPING:
            group, _, field = name.rpartition(".")
            value = config["algos"][group][field] if group in config["algos"] else config[name]
            given.append(cli_option(name, value))
    return " ".join(given)


def result(run_dir: Path, final: dict) -> dict:
    config = json.loads((run_dir / "config.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    history = json.loads((run_dir / "history.json").read_text())
    solved_at = next((row for row in history if row.get("eval/solved") == 1.0), None)
    return {"seed": config["seed"], "options": options_over_recipe(config), "run": str(run_dir), "stopped_by": summary["stopped_by"],
            "env_steps": summary["env_steps"], "wall_seconds": summary["wall_seconds"],
            "solved_env_steps": solved_at and solved_at["env_steps"],
            "solved_wall_seconds": solved_at and solved_at["wall_seconds"],
            "evaluations": [{key: value for key, value in row.items() if key.startswith("eval/") or key in
                             ("env_steps", "wall_seconds", "mean_return")} for row in history if "eval/return" in row],
            "final_eval": final}


results = ([result(run_dir, newest_report(run_dir)) for run_dir in args.from_runs] if args.from_runs
           else [run_seed(seed) for seed in args.seeds])
hardware = f"{cpu_model()}, {len(os.sched_getaffinity(0))} cores"
OUT.mkdir(parents=True, exist_ok=True)
report = {"task": args.task, "budget_minutes": args.budget_minutes,
          "hardware": hardware, "seeds": results}
(OUT / f"time_to_solve-{args.task}.json").write_text(json.dumps(report, indent=2))

criteria = results[0]["final_eval"]["criteria"]
# Beside the criteria, the evaluation episodes' length: what moves while survival is still 0.
panels = [*criteria, {"metric": "episode_length", "threshold": None}]
# Against wall time (what "time to solve" means) and against env steps (sample efficiency: runs at
# different speeds, or on different machines, compare there).
fig, axes = plt.subplots(2, len(panels), figsize=(max(6.4, 4.2 * len(panels)), 6.4 + 0.25 * len(results)),
                         squeeze=False)
for row_axes, (x_key, x_scale, x_label) in zip(axes, (("wall_seconds", 60, "wall-clock minutes"),
                                                     ("env_steps", 1e6, "million env steps"))):
    for ax, criterion in zip(row_axes, panels):
        for result in results:
            rows = result["evaluations"]
            ax.plot([row[x_key] / x_scale for row in rows], [row[f"eval/{criterion['metric']}"] for row in rows],
                    "o-", label=f"seed {result['seed']} {result['options']}".strip())
        if criterion["threshold"] is not None:
            ax.axhline(criterion["threshold"], color="grey", linestyle="--")
        ax.set_xlabel(x_label)
        ax.set_title(criterion["criterion"] if criterion["threshold"] is not None else criterion["metric"])
        ax.grid(alpha=0.3)
# One legend for every panel, under them: the runs' options can be long.
handles, labels = axes[0][0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", fontsize="small", frameon=False)
fig.suptitle(f"{args.task}: deterministic evaluations while training ({hardware}; dashed: the criterion)",
             fontsize="small")
fig.tight_layout(rect=(0, 0.02 + 0.028 * len(results), 1, 1))
fig.savefig(OUT / f"time_to_solve-{args.task}.png", dpi=120)

print(f"| task | seed | options over the recipe | solved at (min / env steps) | final: "
      f"{' · '.join(c['criterion'] for c in criteria)} | hardware |")
print("|---|---:|---|---|---|---|")
for result in results:
    final = result["final_eval"]
    solved = (f"{result['solved_wall_seconds'] / 60:.1f} min / {result['solved_env_steps']:,}"
              if result["solved_wall_seconds"] is not None else
              f"not in {result['wall_seconds'] / 60:.1f} min ({result['env_steps']:,} steps)")
    values = " · ".join(f"{c['value']:.3f} {'✓' if c['passed'] else '✗'}" for c in final["criteria"])
    print(f"| {args.task} | {result['seed']} | {result['options'] or '—'} | {solved} | {values} "
          f"(at {final['sim_dt']:g} s) | {hardware} |")
