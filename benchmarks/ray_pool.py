"""The Ray collector pool measured: against local processes, across two nodes, and under a fault.

    .venv/bin/python benchmarks/ray_pool.py [--iterations 12] [--repeats 3] [--envs 1024]

1. One machine: PPO on go1-joystick-flat (`--envs` envs, two collectors, the `make run`
   networks, `--no-scale-defaults` so the env count is the one asked for), local collector
   processes and `--ray local` one after the other, `--repeats` pairs; env-steps/s of each run
   (the summary's, which counts from the first iteration), the medians, and each pair's ratio.
2. Two nodes: a local `ray.cluster_utils.Cluster` whose head (the learner's node) has no CPU
   for collectors and whose second node has two, so both collectors run on the other node and
   every rollout crosses Ray's object store; env-steps/s and the megabytes per second relayed
   (rollouts in, weights out).
3. A fault: `--ray local`, one collector process SIGKILLed after the third iteration; the time
   until the learner reports it lost, the time until its replacement delivers again, the env
   steps lost (at most), and whether the run finished.

Writes runs/benchmarks/ray_pool.{json,md}. Run it alone: other jobs on the machine change every number.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--iterations", type=int, default=12)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--envs", type=int, default=1024)
args = parser.parse_args()

HETLAB = str(Path(sys.executable).with_name("hetlab"))
RUN = ["--algo", "ppo", "--task", "go1-joystick-flat", "--envs", str(args.envs), "--collectors", "2",
       "--no-scale-defaults", "--ppo.actor-hidden", "256", "128", "64", "--ppo.critic-hidden", "256", "128", "64",
       "--checkpoint-every", "100000"]


def train(*extra: str, kill_after: int | None = None) -> dict:
    """One `hetlab train` run: its summary, last history row, and (with `kill_after`) the fault's timings."""
    with tempfile.TemporaryDirectory() as runs:
        learner = subprocess.Popen([HETLAB, "train", "--runs-dir", runs, *RUN, *extra],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lost_seen: list[float] = []
        stderr_lines: list[str] = []

        def read_stderr() -> None:
            for line in learner.stderr:
                stderr_lines.append(line)
                if "was lost" in line:
                    lost_seen.append(time.monotonic())

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        run_dir = Path(learner.stdout.readline().strip())
        killed = None
        iterations = 0
        for line in learner.stdout:
            iterations += line.startswith("it ")
            if kill_after is not None and killed is None and iterations >= kill_after:
                pids = subprocess.run(["pgrep", "-f", "ray::CollectorActor"], capture_output=True, text=True).stdout.split()
                os.kill(int(pids[0]), signal.SIGKILL)
                killed = time.monotonic()
        learner.wait()
        reader.join(timeout=5)
        if learner.returncode:
            sys.exit(f"hetlab train {' '.join(extra)} failed:\n{''.join(stderr_lines)[-3000:]}")
        result = {"summary": json.loads((run_dir / "summary.json").read_text()),
                  "last": json.loads((run_dir / "history.json").read_text())[-1]}
        if killed is not None:
            result["detect_s"] = lost_seen[0] - killed if lost_seen else None
        return result


def two_node_run() -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    try:
        return train("--max-iterations", str(args.iterations), "--ray", cluster.address)
    finally:
        cluster.shutdown()


def steps_per_s(result: dict) -> float:
    return result["summary"]["env_steps_per_s"]


budget = ["--max-iterations", str(args.iterations)]
pairs = []
for repeat in range(args.repeats):
    local, on_ray = train(*budget), train(*budget, "--ray", "local")
    pairs.append((steps_per_s(local), steps_per_s(on_ray)))
    print(f"pair {repeat + 1}: local {pairs[-1][0]:,.0f}, ray {pairs[-1][1]:,.0f} env-steps/s", file=sys.stderr, flush=True)
two_nodes = two_node_run()
local_after = train(*budget)  # the local pool beside the two-node run, as its reference
fault = train("--max-iterations", str(args.iterations + 8), "--ray", "local", kill_after=3)

median_local = statistics.median(p[0] for p in pairs)
median_ray = statistics.median(p[1] for p in pairs)
ratios = [p[1] / p[0] for p in pairs]
two_wall = two_nodes["summary"]["wall_seconds"]
results = {
    "cpus": os.cpu_count(), "load_at_end": os.getloadavg(), "run": RUN, "iterations": args.iterations,
    "pairs": pairs, "median_local": median_local, "median_ray": median_ray, "ratios": ratios,
    "two_nodes": {"env_steps_per_s": steps_per_s(two_nodes), "relayed_mb_per_s": two_nodes["last"]["ray/relayed_mb"] / two_wall,
                  "local_env_steps_per_s": steps_per_s(local_after)},
    "fault": {"detect_s": fault["detect_s"], "recovery_s": fault["last"]["ray/last_recovery_s"],
              "lost_env_steps_at_most": fault["last"]["ray/lost_env_steps_at_most"],
              "stopped_by": fault["summary"]["stopped_by"], "iterations": fault["summary"]["iterations"]},
}
lines = [
    f"PPO, go1-joystick-flat, {args.envs} envs, 2 collectors, {args.iterations} iterations, {os.cpu_count()} cores",
    "",
    "| collectors | env-steps/s (median of " + str(args.repeats) + ") | Ray ÷ local per pair |",
    "|---|---:|---|",
    f"| local processes | {median_local:,.0f} | |",
    f"| Ray actors, one node (`--ray local`) | {median_ray:,.0f} | {', '.join(f'{r:.2f}' for r in ratios)} |",
    "",
    "| two-node cluster (collectors on the other node) | env-steps/s | MB/s through the object store |",
    "|---|---:|---:|",
    f"| Ray | {results['two_nodes']['env_steps_per_s']:,.0f} | {results['two_nodes']['relayed_mb_per_s']:.1f} |",
    f"| local processes, same box, next run | {results['two_nodes']['local_env_steps_per_s']:,.0f} | – |",
    "",
    "| fault: one collector SIGKILLed after iteration 3 | |",
    "|---|---:|",
    f"| reported lost after | {fault['detect_s']:.2f} s |" if fault["detect_s"] is not None else "| reported lost after | never |",
    f"| replacement delivering after | {results['fault']['recovery_s']:.2f} s |",
    f"| env steps lost (at most) | {results['fault']['lost_env_steps_at_most']:,} |",
    f"| run | {results['fault']['stopped_by']} after {results['fault']['iterations']} iterations |",
]
out = Path("runs/benchmarks")
out.mkdir(parents=True, exist_ok=True)
(out / "ray_pool.json").write_text(json.dumps(results, indent=2))
(out / "ray_pool.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
