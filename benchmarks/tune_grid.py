"""Does `hetlab tune` pick well? Every way to spread a run over this machine's cores, end to end,
against the setting `hetlab tune` picks and the hand defaults.

    .venv/bin/python benchmarks/tune_grid.py [--task go1-joystick-flat] [--algo ppo] [--envs 0]
        [--seconds 20] [--runs 2] [--tune-seconds 90]

The grid: every collector count that splits the envs, every physics-thread count per collector and
every torch-thread count that fit the cores (wider than the powers of two tune predicts). Each
setting trains `--seconds` end to end (`hetlab train` in a subprocess, as tune checks its own), in
`--runs` rounds taken in turn; a setting's rate is its median. Then `hetlab tune` runs from scratch
(`--tune-seconds` of probing) and its choice is looked up in the grid. Prints a Markdown table and
the ratios (tuned ÷ grid best, tuned ÷ hand defaults), and writes runs/benchmarks/tune_grid-<task>.json.
Run it alone: other processes change every rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from hetlab.devices import cpu_count
from hetlab.train.tune import Setting, hand_defaults, machine_description, measure_end_to_end, run_to_tune, tune

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--task", default="go1-joystick-flat")
parser.add_argument("--algo", default="")
parser.add_argument("--envs", type=int, default=0)
parser.add_argument("--seconds", type=float, default=20.0)
parser.add_argument("--runs", type=int, default=2)
parser.add_argument("--tune-seconds", type=float, default=90.0)
args = parser.parse_args()

cfg, device = run_to_tune(args.task, args.algo, args.envs, "auto")
cores, mode = cpu_count(), cfg.resolved_mode
grid = [Setting(collectors, physics, torch_threads)
        for collectors in range(1, cores + 1) if cfg.envs % collectors == 0
        for physics in range(1, cores // collectors + 1)
        for torch_threads in range(1, cores + 1)
        if mode == "sync" or collectors * physics + torch_threads <= cores]
rates: dict[Setting, list[float]] = {setting: [] for setting in grid}
with tempfile.TemporaryDirectory() as workdir:
    for round_ in range(args.runs):
        for setting in grid:
            folder = Path(workdir) / str(round_)
            folder.mkdir(exist_ok=True)
            rates[setting].append(measure_end_to_end(cfg, device, setting, args.seconds, folder))
            print(f"round {round_ + 1}: {setting}: {rates[setting][-1]:,.0f} env-steps/s", flush=True)
medians = {setting: statistics.median(values) for setting, values in rates.items()}
result = tune(cfg, device, args.tune_seconds, lambda line: print(f"tune: {line}", flush=True))
defaults = hand_defaults(device, mode)
best = max(medians, key=medians.get)
tuned = medians.get(result.chosen)

print(f"\n{cfg.task}, {cfg.algo}, {cfg.envs} envs, {mode}; {device.name}, {cores} cores; "
      f"{args.runs} rounds of {args.seconds:g} s each, medians\n")
print("| collectors | physics threads each | torch threads | env-steps/s | |")
print("|---:|---:|---:|---:|---|")
for setting, rate in sorted(medians.items(), key=lambda item: -item[1]):
    notes = ["tuned"] * (setting == result.chosen) + ["hand defaults"] * (setting == defaults) + \
        ["grid best"] * (setting == best)
    print(f"| {setting.collectors} | {setting.physics_threads} | {setting.torch_threads} | {rate:,.0f} | "
          f"{', '.join(notes)} |")
summary = {"task": cfg.task, "algo": cfg.algo, "envs": cfg.envs, "mode": mode, "machine": machine_description(device),
           "seconds": args.seconds, "runs": args.runs,
           "grid": [{**s.options, "physics_threads": s.physics_threads, "env_steps_per_s": v}
                    for s, v in medians.items()],
           "tuned": result.chosen.options, "tuned_predicted": result.predicted[result.chosen],
           "tuned_measured_by_tune": result.measured[result.chosen], "tune_seconds": result.seconds,
           "defaults": defaults.options, "best": best.options,
           "tuned_over_best": None if tuned is None else tuned / medians[best],
           "tuned_over_defaults": None if tuned is None or defaults not in medians else tuned / medians[defaults]}
over_defaults = summary["tuned_over_defaults"]
print(f"\ntuned: {result.chosen} ({result.seconds:.0f} s of probing): "
      + ("not in the grid" if tuned is None else f"{summary['tuned_over_best']:.3f} of the grid's best, "
         + ("the hand defaults not in the grid" if over_defaults is None else f"{over_defaults:.3f}× the hand defaults")))
out = Path("runs/benchmarks") / f"tune_grid-{cfg.task}.json"
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(summary, indent=2))
print(f"written: {out}")
