"""The imitation half end to end on a CPU machine, as the README reports it:

    .venv/bin/python benchmarks/imitation_cpu.py [--dataset datasets/aloha-120x160-fast] [--phase-a RUN]
        [--steps N] [--val-seeds 1000-1019] [--eval-seeds 2000-2049] [--study-steps 2000] [--skip-study]

1. records the 50-episode cube-transfer dataset at 120×160, render quality fast (kept if complete);
2. trains Phase A with the `cpu` preset on episodes 0–39 (--steps of them), keeping every checkpoint
   (or takes --phase-a RUN);
3. the success-vs-steps curve: each kept checkpoint evaluated closed loop (--decode) on the
   validation seeds --val-seeds, which pick the checkpoint (the evaluation seeds never do);
4. the picked checkpoint (and with --last the last one) on the held-out --eval-seeds, in each of
   --held-out-decodes: open-loop chunks, a new chunk every 25 steps, and ACT's temporal ensembling
   (m = 0.01, a new chunk every --ensemble-every steps);
5. the reduced Phase-B study on the same seeds: learner, L1–L4 INT8, the cache stored FP16 and INT8,
   one training seed, --study-steps each at the Phase-A run's learning rate and decay.
Each step is a `hetlab` command (run alone: other jobs change the times); finished steps are reused.
Writes runs/benchmarks/imitation_cpu.{json,md} and success_vs_steps.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from hetlab.run_history import read_history

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dataset", type=Path, default=Path("datasets/aloha-120x160-fast"))
parser.add_argument("--phase-a", type=Path, help="an existing Phase-A run (trained with --keep-checkpoints 0)")
parser.add_argument("--steps", type=int,
                    help="Phase-A steps; default the preset's (6,000: ~35 min on a 2-core AMD EPYC, ~80 min on a "
                         "2-core 2.6 GHz Xeon)")
parser.add_argument("--decode", choices=("autoregressive", "parallel"), default="autoregressive",
                    help="how the validation curve's policies generate chunks")
parser.add_argument("--held-out-decodes", nargs="+", choices=("autoregressive", "parallel"), default=["autoregressive"],
                    help="decodings evaluated on the held-out seeds (parallel: a run trained with max_history_mask 1)")
parser.add_argument("--last", action="store_true", help="also evaluate the last checkpoint on the held-out seeds")
parser.add_argument("--val-seeds", default="1000-1019")
parser.add_argument("--eval-seeds", default="2000-2049")
parser.add_argument("--ensemble-every", type=int, default=1,
                    help="steps between chunks under temporal ensembling (ACT: 1; an autoregressive chunk "
                         "costs ~0.3 s on one core, so 1 takes ~2 min an episode)")
parser.add_argument("--study-steps", type=int, default=2000)
parser.add_argument("--skip-study", action="store_true")
parser.add_argument("--out", type=Path, default=Path("runs/benchmarks"))
args = parser.parse_args()
hetlab = str(Path(sys.executable).with_name("hetlab"))


def run(*command: str) -> str:
    print("$ hetlab", " ".join(command), flush=True)
    started = time.perf_counter()
    done = subprocess.run([hetlab, *command], check=True, stdout=subprocess.PIPE, text=True)
    print(done.stdout.rstrip(), f"\n({time.perf_counter() - started:.0f} s)", flush=True)
    return done.stdout


def evaluation(run_dir: Path, seeds: str, *options: str, step: int | None = None) -> dict:
    """results.json of one evaluation, reused if it was made already with these settings."""
    name = "-".join([seeds.replace(",", "_"), *(o.lstrip("-") for o in options)] + ([f"step{step}"] if step else []))
    out = run_dir / "eval" / name
    if not (out / "results.json").is_file():
        run("aloha", "eval", str(run_dir), "--seeds", seeds, "--videos", "0", "--out", str(out), *options,
            *(["--checkpoint", str(step)] if step else []))
    return json.loads((out / "results.json").read_text())


def rate(results: dict) -> str:
    low, high = results["wilson95"]
    return f"{results['successes']}/{results['episodes']} ({100 * results['success_rate']:.0f} %, " \
           f"Wilson 95 % {100 * low:.0f}–{100 * high:.0f} %)"


args.out.mkdir(parents=True, exist_ok=True)
report: dict = {}
run("aloha", "record", "--episodes", "50", "--out", str(args.dataset), "--height", "120", "--width", "160",
    "--render-quality", "fast", "--workers", "0")
phase_a = args.phase_a
if phase_a is None:
    phase_a = Path(run("aloha", "train", "--dataset", str(args.dataset), "--preset", "cpu", "--keep-checkpoints", "0",
                       "--runs-dir", "runs", *(["--steps", str(args.steps)] if args.steps else [])).splitlines()[0])
history = read_history(phase_a)
report["phase_a"] = {"run": str(phase_a), "steps": history[-1]["step"], "wall_s": history[-1]["wall_s"],
                     "first_loss": history[0]["loss"], "last_loss": history[-1]["loss"]}

steps = sorted(int(p.name.partition("-")[0]) for p in (phase_a / "checkpoints").iterdir() if p.name[0].isdigit())
curve = [(step, evaluation(phase_a, args.val_seeds, "--decode", args.decode, step=step)) for step in steps]
report["curve"] = [{"step": step, "wall_s": next(r["wall_s"] for r in history if r["step"] >= step),
                    "successes": r["successes"], "episodes": r["episodes"], "wilson95": r["wilson95"]}
                   for step, r in curve]

picked = max(curve, key=lambda point: (point[1]["successes"], point[0]))[0]  # the latest of the best
report["picked_step"] = picked
modes = {f"{decode}, {mode}": ("--decode", decode, *options)
         for decode in args.held_out_decodes
         for mode, options in {"open loop (chunk of 100)": (), "new chunk every 25 steps": ("--replan-every", "25"),
                               f"temporal ensembling m=0.01, new chunk every {args.ensemble_every}":
                                   ("--temporal-ensemble", "0.01", "--replan-every", str(args.ensemble_every))}.items()}
report["held_out"] = {f"step {step}, {mode}": evaluation(phase_a, args.eval_seeds, *options, step=step)
                      for step in dict.fromkeys((picked, steps[-1]) if args.last else (picked,))
                      for mode, options in modes.items()}

if not args.skip_study:
    study = run("offload", "study", "--from", str(phase_a), "--seeds", "2000", "--steps", str(args.study_steps),
                "--eval-seeds", args.eval_seeds, "--cache-dtypes", "fp16,int8")
    report["study"] = study.strip().splitlines()[-1].removeprefix("study report: ")

import matplotlib  # noqa: E402  (only the plot needs it)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

figure, axis = plt.subplots(figsize=(6, 3.5))
rows = report["curve"]
axis.errorbar([r["step"] for r in rows], [100 * r["successes"] / r["episodes"] for r in rows],
              yerr=[[100 * (r["successes"] / r["episodes"] - r["wilson95"][0]) for r in rows],
                    [100 * (r["wilson95"][1] - r["successes"] / r["episodes"]) for r in rows]], marker="o", capsize=3)
axis.set(xlabel="Phase-A step (batch 8)", ylabel=f"success on {args.val_seeds} (%), {args.decode}", ylim=(0, 100),
         title="cpu preset: closed-loop success along training")
axis.grid(alpha=0.3)
figure.tight_layout()
figure.savefig(args.out / "success_vs_steps.png", dpi=120)

(args.out / "imitation_cpu.json").write_text(json.dumps(report, indent=2, default=str))
lines = ["| step | wall (min) | success on validation seeds " + args.val_seeds + " |", "|---:|---:|---|"]
lines += [f"| {r['step']} | {r['wall_s'] / 60:.0f} | {rate({**r, 'success_rate': r['successes'] / r['episodes']})} |"
          for r in rows]
lines += ["", f"| evaluation on {args.eval_seeds} | success |", "|---|---|"]
lines += [f"| {mode} | {rate(results)} |" for mode, results in report["held_out"].items()]
if "study" in report:  # its success per condition and the paired differences, as the study's report has them
    success = Path(report["study"]).read_text().split("## Task success\n", 1)[1].split("\n## ", 1)[0]
    lines += ["", f"Reduced Phase-B study ({report['study']}):", "",
              *(line for line in success.strip().splitlines() if not line.startswith("!["))]  # figures stay there
(args.out / "imitation_cpu.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
