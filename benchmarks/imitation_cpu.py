"""The imitation half end to end on a CPU box, as the README reports it:

    .venv/bin/python benchmarks/imitation_cpu.py [--dataset datasets/aloha-120x160] [--study-steps 100]
                                                 [--eval-seeds 2000-2019] [--study-eval-seeds 2000-2009]

1. records the 50-episode cube-transfer dataset at 120×160 (skipped when it is complete),
2. trains Phase A with the `cpu` preset (skipped with --phase-a RUN),
3. evaluates that checkpoint closed loop,
4. measures INT8 fidelity at boundaries 1–4,
5. runs a reduced Phase-B study: all six conditions, one training seed.
Each step is a `hetlab` command run alone, one after another; the printed lines are its results.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dataset", type=Path, default=Path("datasets/aloha-120x160"))
parser.add_argument("--phase-a", type=Path, help="an existing Phase-A run to start from")
parser.add_argument("--eval-seeds", default="2000-2019")
parser.add_argument("--study-steps", type=int, default=100)
parser.add_argument("--study-seeds", default="2000")
parser.add_argument("--study-eval-seeds", default="2000-2009")
args = parser.parse_args()
hetlab = str(Path(sys.executable).with_name("hetlab"))


def run(*command: str) -> str:
    print("$ hetlab", " ".join(command), flush=True)
    done = subprocess.run([hetlab, *command], check=True, stdout=subprocess.PIPE, text=True)
    print(done.stdout, flush=True)
    return done.stdout


run("aloha", "record", "--episodes", "50", "--out", str(args.dataset), "--height", "120", "--width", "160",
    "--workers", "2")
phase_a = args.phase_a or Path(run("aloha", "train", "--dataset", str(args.dataset), "--preset", "cpu",
                                   "--loader-workers", "0").splitlines()[0])
run("aloha", "eval", str(phase_a), "--seeds", args.eval_seeds, "--videos", "2")
run("offload", "fidelity", str(phase_a), "--boundaries", "1,2,3,4")
run("offload", "study", "--from", str(phase_a), "--seeds", args.study_seeds, "--steps", str(args.study_steps),
    "--eval-seeds", args.study_eval_seeds)
