"""Fault injection: `hetlab train` killed, its disk filled, its files damaged, its run resumed twice.

    .venv/bin/python benchmarks/faults.py [--trials 20] [--seed 0] [--faults kill disk corrupt lock]

Every trial is a real cartpole PPO run (tiny networks, a checkpoint every 3 iterations) in a real
process with its collector processes and shared memory:

- kill: SIGKILL the learner at a seeded random moment, or at the moment it renames a checkpoint,
  checkpoint.json, history.json or summary.json into place (the process then runs under this
  script's `--kill-at NAME:N` hook, which kills it at the N-th such rename). Then `hetlab train
  --resume RUN` must finish the run: history.json never shrinks, at most one checkpoint interval
  is trained again, no temporary file, shared-memory segment or collector process is left.
- disk: the run (or recording) on a 16 MB tmpfs that a filler file fills up while it runs, so that
  its next checkpoint, its next write of any kind (TensorBoard's events or history.json), its
  next dataset episode or Phase B's feature cache no longer fits (mounting needs root): one line
  naming the file, what was written before intact, and it goes on once the filler is gone.
- corrupt: a finished run's checkpoint tensors, checkpoint.json, config.json and history.json
  truncated, and the inputs of the other commands: a dataset's parquet, video and info.json,
  Phase B's feature cache and exported INT8 prefix, a motion clip. Each command that reads one
  says so in one line naming the file.
- lock: `hetlab train --resume` of a run that is training: refused in one line.

Writes runs/benchmarks/faults.json and prints the table for docs/reliability.md with the hardware.
Run it alone: the trials time their recovery.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HETLAB = str(Path(sys.executable).with_name("hetlab"))
EVERY = 3  # checkpoint interval of the trial runs, in iterations
ITERATIONS = 60
RUN = ["train", "--algo", "ppo", "--task", "cartpole-balance", "--envs", "64", "--horizon", "16",
       "--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32", "--collectors", "1",
       "--checkpoint-every", str(EVERY), "--max-iterations", str(ITERATIONS)]
# Where a kill lands: at the rename that puts a record in place (shell patterns of its path: a
# checkpoint directory, the files' atomic writes), or at a random moment.
WRITES = {"checkpoint": "*/checkpoints/[0-9]*", "checkpoint.json": "*/checkpoint.json",
          "history.json": "*/history.json", "summary.json": "*/summary.json"}


def kill_at(pattern: str, nth: int) -> None:
    """In this process: SIGKILL it at the `nth` rename into a path matching `pattern`, after the
    temporary is written and before the rename."""
    seen = 0

    def matches(destination) -> bool:
        nonlocal seen
        seen += fnmatch.fnmatch(str(destination), pattern)
        return seen == nth

    replace, rename = os.replace, Path.rename

    def killing_replace(source, destination, *args, **kwargs):
        if matches(destination):
            os.kill(os.getpid(), signal.SIGKILL)
        return replace(source, destination, *args, **kwargs)

    def killing_rename(self, target):
        if matches(target):
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(self, target)

    os.replace, Path.rename = killing_replace, killing_rename


def rows(run_dir: Path) -> list[dict]:
    path = run_dir / "history.json"
    return json.loads(path.read_text()) if path.is_file() else []


def checkpoint_iteration(run_dir: Path) -> int:
    pointer = run_dir / "checkpoint.json"
    return json.loads(pointer.read_text())["iteration"] if pointer.is_file() else 0


def temporaries(run_dir: Path) -> list[str]:
    from hetlab.files import temporary_target

    return [str(p) for p in run_dir.rglob(".*") if temporary_target(p) is not None]


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid → (parent pid, start time). A zombie (it has exited, and holds
    nothing but its exit status until its new parent, init, reaps it) is not live."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent, *fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if state != "Z":
            found[int(stat.parent.name)] = (int(parent), fields[17])
    return found


def descendants(pid: int) -> set[tuple[int, str]]:
    """The processes below `pid` now (its collectors are children of its fork server), as (pid, start time)."""
    table, found, parents = processes(), set(), {pid}
    while parents:
        children = {child for child, (parent, _) in table.items() if parent in parents}
        found |= {(child, table[child][1]) for child in children}
        parents = children
    return found


def orphans(pid: int, below: set[tuple[int, str]]) -> list[str]:
    """Shared-memory segments the learner `pid` left, and which of the processes `below` it (seen
    while it ran) still live."""
    found = [f"/dev/shm/{name}" for name in os.listdir("/dev/shm") if name.startswith("hetlab_") and f"_{pid}_" in name]
    table = processes()
    return found + [f"process {child}" for child, started in sorted(below) if table.get(child, (0, ""))[1] == started]


def hetlab(args: list[str], hook: str | None = None, **popen) -> subprocess.Popen:
    def limits():  # the stop signals as a terminal leaves them
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)

    command = [sys.executable, __file__, "--kill-at", hook, "--", *args] if hook else [HETLAB, *args]
    return subprocess.Popen(command, text=True, preexec_fn=limits,
                            **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen})


def resume(run_dir: Path, *options: str) -> tuple[subprocess.CompletedProcess, float]:
    """`hetlab train --resume RUN` to the end; and the seconds until it logged its first iteration."""
    started = time.perf_counter()
    process = hetlab(["train", "--resume", str(run_dir), *options])
    first_row = None
    out = []
    for line in process.stdout:
        out.append(line)
        if first_row is None and line.startswith("it "):
            first_row = time.perf_counter() - started
    err = process.stderr.read()
    process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, "".join(out), err), first_row or float("nan")


def kill_trial(rng: random.Random, where: str, runs: Path) -> dict:
    """One run killed at `where` (one of WRITES, or "random"), then resumed."""
    if where == "random":
        learner = hetlab([*RUN, "--runs-dir", str(runs)])
    else:
        nth = 1 if where == "summary.json" else rng.randint(1, ITERATIONS // EVERY - 1)
        learner = hetlab([*RUN, "--runs-dir", str(runs)], hook=f"{WRITES[where]}:{nth}")
    run_dir = Path(learner.stdout.readline().strip())
    # A random moment after the first checkpoint (before it there is nothing to resume): within the
    # iteration after a random one.
    at = rng.randint(EVERY, ITERATIONS - 2)
    printed, below = [], set()
    for line in learner.stdout:
        if line.startswith("it "):
            printed.append(int(line.split()[1]))
            below |= descendants(learner.pid)
            if where == "random" and printed[-1] == at:
                time.sleep(rng.uniform(0.0, 0.05))
                learner.kill()
    learner.wait()
    time.sleep(1.0)  # the collectors notice their learner is gone; the resource tracker unlinks its memory
    left_by_kill = orphans(learner.pid, below)
    before, from_iteration = rows(run_dir), checkpoint_iteration(run_dir)
    trained_to = printed[-1] + 1 if printed else 0
    # A run killed writing summary.json had trained all its iterations: it goes on for a few more.
    target = ITERATIONS + EVERY if where == "summary.json" else ITERATIONS
    finished, recovery_s = resume(run_dir, *(["--max-iterations", str(target)] if target != ITERATIONS else []))
    after = rows(run_dir)
    return {
        "where": where, "killed_status": learner.returncode, "run": str(run_dir),
        "resumed": finished.returncode == 0, "resume_stderr": finished.stderr[-2000:] if finished.returncode else "",
        "rows_before": len(before), "rows_after": len(after),
        # The rows up to the checkpoint stay as they were; those after it are trained and logged again.
        "record_shrunk": len(after) < len(before) or [r for r in after if r["iteration"] < from_iteration]
        != [r for r in before if r["iteration"] < from_iteration],
        "complete": [r["iteration"] for r in after] == list(range(target)),
        "iterations_lost": max(0, trained_to - from_iteration),
        "recovery_s": recovery_s,
        "leftovers": left_by_kill + temporaries(run_dir),
    }


RECORD = ["aloha", "record", "--episodes", "4", "--height", "64", "--width", "96", "--steps", "60",
          "--no-successful-only", "--workers", "1"]
PHASE_A = ["aloha", "train", "--preset", "tiny", "--train-episodes", "0-1", "--steps", "300"]
PHASE_A_EVERY = 100  # the tiny preset's checkpoint interval, in steps


def committed_episodes(dataset: Path) -> list[int]:
    """The episodes a reader finds in `dataset`; none where it holds none yet (killed at its first commit)."""
    from hetlab.datasets.lerobot import LeRobotDataset
    from hetlab.errors import UserError

    try:
        return LeRobotDataset(dataset).episodes
    except UserError:
        return []


def record_trial(rng: random.Random, where: str, scratch: Path) -> dict:
    """`hetlab aloha record` killed at a random moment or as it commits an episode, then run again."""
    from hetlab.datasets.lerobot import LeRobotDataset

    out = scratch / f"record-{rng.randrange(10**9)}"
    hook = None if where == "random" else f"*/meta/episodes/*.parquet:{rng.randint(1, 3)}"
    recorder = hetlab([*RECORD, "--out", str(out)], hook=hook, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kill_at, below = time.monotonic() + rng.uniform(3.0, 8.0), set()
    while recorder.poll() is None:  # its workers, seen while it runs
        below |= descendants(recorder.pid)
        if where == "random" and time.monotonic() >= kill_at:
            recorder.kill()
        time.sleep(0.1)
    time.sleep(1.0)
    left = orphans(recorder.pid, below)
    before = len(committed_episodes(out))
    started = time.perf_counter()
    again = subprocess.run([HETLAB, *RECORD, "--out", str(out)], capture_output=True, text=True)
    dataset = LeRobotDataset(out)
    return {"where": where, "killed_status": recorder.returncode, "resumed": again.returncode == 0,
            "resume_stderr": again.stderr[-2000:] if again.returncode else "",
            "rows_before": before, "rows_after": len(dataset.episodes), "record_shrunk": len(dataset.episodes) < before,
            "complete": dataset.episodes == [0, 1, 2, 3] and len(dataset) == 4 * 60,
            "iterations_lost": 1,  # at most the episode being written: it is recorded again
            "recovery_s": time.perf_counter() - started, "leftovers": left + temporaries(out)}


def phase_a_trial(rng: random.Random, where: str, dataset: Path, runs: Path) -> dict:
    """Phase A (tiny preset) killed at a random moment or renaming its checkpoint into place, then resumed."""
    from hetlab.run_history import read_history

    args = [*PHASE_A, "--dataset", str(dataset), "--runs-dir", str(runs)]
    learner = hetlab(args, hook=None if where == "random" else f"{WRITES['checkpoint']}:{rng.randint(1, 2)}")
    run_dir = Path(learner.stdout.readline().strip())
    killed_after = 0.0  # seconds the learner trained past the checkpoint it was killed after
    if where == "random":  # at a random moment of the checkpoint interval after the first checkpoint
        launched = time.perf_counter()
        while learner.poll() is None and not (run_dir / "checkpoint.json").is_file():
            time.sleep(0.01)
        checkpointed = time.perf_counter()
        time.sleep(rng.uniform(0.0, checkpointed - launched))  # the first interval's time, start-up included
        killed_after = time.perf_counter() - checkpointed
        learner.kill()
    learner.communicate()
    before = read_history(run_dir)
    step = json.loads((run_dir / "checkpoint.json").read_text())["iteration"] if (run_dir / "checkpoint.json").is_file() else 0
    started = time.perf_counter()
    again = subprocess.run([HETLAB, "aloha", "train", "--resume", str(run_dir)], capture_output=True, text=True)
    after = read_history(run_dir)
    # Phase A writes its rows with its checkpoints, so the steps trained past the last one (and done
    # again) are estimated from the time it trained past it, at its logged rate.
    steps_per_s = before[-1]["samples_per_s"] / 8 if before else 0.0  # the tiny runs' batch of 8
    trained_to = step + min(round(killed_after * steps_per_s), PHASE_A_EVERY) if where == "random" else step
    return {"where": where, "killed_status": learner.returncode, "resumed": again.returncode == 0,
            "resume_stderr": again.stderr[-2000:] if again.returncode else "",
            "rows_before": len(before), "rows_after": len(after),
            "record_shrunk": [r for r in after if r["step"] <= step] != [r for r in before if r["step"] <= step],
            "complete": [r["step"] for r in after] == list(range(10, 301, 10)),
            "iterations_lost": max(0, trained_to - step), "recovery_s": time.perf_counter() - started,
            "leftovers": temporaries(run_dir)}


def mount_small_disk(path: Path, size: str) -> str | None:
    """Mount a tmpfs of `size` at `path` (a disk that can fill up); the reason it cannot, or None."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    return None if mounted.returncode == 0 else f"cannot mount a tmpfs ({mounted.stderr.strip()}): run as root"


def fill(disk: Path, leave: int) -> Path:
    """A file taking all of `disk`'s free space but `leave` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(1, shutil.disk_usage(disk).free - leave))
    return filler


def error_lines(stderr: str) -> tuple[str, bool]:
    """The error line, and whether it is the one error line, after the progress bar and followed at
    most by the resume line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if len(errors) != 1:
        return (lines[0] if lines else ""), False
    after = lines[errors[0] + 1:]
    before = lines[:errors[0]]
    one = "Traceback" not in stderr and all(line.startswith("resume with: ") for line in after) \
        and all(line.startswith("episodes ") for line in before)  # `aloha record`'s progress
    return lines[errors[0]], one


def disk_trial(what: str, scratch: Path) -> dict:
    """The disk fills while a run trains, at its next history.json or checkpoint write, or while
    `aloha record` writes an episode; the command ends in one line naming the file, what it wrote
    before is intact, and it goes on once there is room again."""
    disk = scratch / f"disk-{what}"
    reason = mount_small_disk(disk, "16m")
    if reason is not None:
        return {"where": what, "not_run": reason}
    try:
        return (disk_record_trial if what == "episode" else disk_train_trial)(what, disk)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def disk_train_trial(what: str, disk: Path) -> dict:
    from hetlab.checkpoint import load_checkpoint

    learner = hetlab([*RUN, "--runs-dir", str(disk), "--max-iterations", "100000"])
    run_dir = Path(learner.stdout.readline().strip())
    while not (run_dir / "checkpoint.json").is_file():
        time.sleep(0.05)
    history = (run_dir / "history.json").stat().st_size
    # history.json fits and the next checkpoint (tens of kB) does not; or 1 kB is left, which the next
    # write to TensorBoard's events or history.json (whichever comes first) overflows.
    filler = fill(disk, history + 8192 if what == "checkpoint" else 1024)
    out, err = learner.communicate(timeout=300)
    first, one_line = error_lines(err)
    named = str(run_dir / "checkpoints" if what == "checkpoint" else run_dir)
    try:
        load_checkpoint(run_dir)
        intact = True
    except Exception:  # noqa: BLE001: any failure to read it is the finding
        intact = False
    filler.unlink()
    saved = checkpoint_iteration(run_dir)
    finished, _ = resume(run_dir, "--max-iterations", str(saved + EVERY))
    return {"where": what, "status": learner.returncode, "first_line": first, "one_line": one_line, "stderr": err[-3000:],
            "names_the_file": first.startswith(f"error: no space left to write {named}"),
            "previous_checkpoint_intact": intact, "resumed": finished.returncode == 0,
            "complete": [r["iteration"] for r in rows(run_dir)] == list(range(saved + EVERY))}


def disk_record_trial(what: str, disk: Path) -> dict:
    out = disk / "dataset"
    recorder = hetlab([*RECORD, "--out", str(out)])
    while not list(out.glob("meta/episodes/*/*.parquet")):  # the first episode is committed
        time.sleep(0.05)
    filler = fill(disk, 4096)
    _, err = recorder.communicate(timeout=300)
    first, one_line = error_lines(err)
    kept = len(committed_episodes(out))
    filler.unlink()
    again = subprocess.run([HETLAB, *RECORD, "--out", str(out)], capture_output=True, text=True)
    return {"where": what, "status": recorder.returncode, "first_line": first, "one_line": one_line, "stderr": err[-3000:],
            "names_the_file": first.startswith(f"error: no space left to write {out}"),
            "previous_checkpoint_intact": kept >= 1, "resumed": again.returncode == 0,
            "complete": len(committed_episodes(out)) == 4}


def corrupt_trials(runs: Path) -> list[dict]:
    """A finished run with one file truncated at a time; the commands that read it."""
    done = subprocess.run([HETLAB, *RUN, "--runs-dir", str(runs)], capture_output=True, text=True, check=True)
    source = Path(done.stdout.splitlines()[0])
    newest = source / "checkpoints" / json.loads((source / "checkpoint.json").read_text())["latest"]
    damaged = {"checkpoint tensors": newest.relative_to(source) / "tensors.safetensors",
               "checkpoint state": newest.relative_to(source) / "state.json",
               "checkpoint.json": Path("checkpoint.json"), "config.json": Path("config.json"),
               "history.json": Path("history.json")}
    results = []
    for name, relative in damaged.items():
        for command in ("train", "export", "eval"):
            if name == "history.json" and command != "train":
                continue  # only a resume reads the history
            run_dir = runs / f"damaged-{len(results)}"
            shutil.copytree(source, run_dir)
            target = run_dir / relative
            target.write_bytes(target.read_bytes()[: max(1, target.stat().st_size // 2)])
            args = {"train": ["train", "--resume", str(run_dir), "--max-iterations", str(ITERATIONS + EVERY)],
                    "export": ["export", str(run_dir)], "eval": ["eval", str(run_dir), "--episodes", "4"]}[command]
            result = subprocess.run([HETLAB, *args], capture_output=True, text=True)
            lines = [line for line in result.stderr.splitlines() if line.strip()]
            results.append({"file": name, "command": command, "status": result.returncode,
                            "line": lines[0] if lines else "",
                            "one_line": result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"),
                            "names_the_file": str(target) in result.stderr or str(target.parent) in result.stderr})
    return results


def imitation_inputs(scratch: Path) -> tuple[Path, Path]:
    """A recorded dataset of 2 episodes and a tiny Phase-A run on it whose offload directory holds
    a feature cache and exported prefixes (made by one step of Phase B's cache and L1 conditions)."""
    dataset = scratch / "dataset"
    subprocess.run([HETLAB, *RECORD, "--episodes", "2", "--out", str(dataset)], capture_output=True, check=True)
    done = subprocess.run([HETLAB, *PHASE_A, "--steps", "2", "--dataset", str(dataset), "--runs-dir", str(scratch / "a")],
                          capture_output=True, text=True, check=True)
    phase_a = Path(done.stdout.splitlines()[0])
    for condition in ("cache", "L1"):
        subprocess.run([HETLAB, *phase_b(phase_a, condition, scratch / f"b-{condition}")], capture_output=True, check=True)
    return dataset, phase_a


def phase_b(phase_a: Path, condition: str, out: Path) -> list[str]:
    return ["aloha", "train", "--phase", "B", "--from", str(phase_a), "--condition", condition, "--steps", "1",
            "--train-episodes", "0-1", "--calibration-episodes", "0", "--out", str(out)]


def damaged_input_trials(scratch: Path) -> list[dict]:
    """Each file a command reads that no run of it wrote, cut to half its size in a copy: a
    dataset's data and episodes parquet, its video and info.json (read by Phase A), Phase B's
    feature cache and exported INT8 prefix, a motion clip (`train --task g1-track-motion`)."""
    from hetlab.assets import motion_clip_path

    scratch = scratch / "inputs"
    scratch.mkdir()
    dataset, phase_a = imitation_inputs(scratch)
    (cache,) = (phase_a / "offload").glob("cache-*")
    (int8,) = (phase_a / "offload").glob("prefix-*-int8-*.onnx")
    damaged = {"dataset data parquet": (dataset, "data/chunk-000/file-000.parquet", "Phase A"),
               "dataset episodes parquet": (dataset, "meta/episodes/chunk-000/file-000.parquet", "Phase A"),
               "dataset video": (dataset, next(dataset.glob("videos/*/chunk-000/file-000.mp4")).relative_to(dataset),
                                 "Phase A"),
               "dataset info.json": (dataset, "meta/info.json", "Phase A"),
               "feature cache": (phase_a, (cache / "tokens.npy").relative_to(phase_a), "Phase B cache"),
               "exported INT8 prefix": (phase_a, int8.relative_to(phase_a), "Phase B L1")}
    results = []
    for name, (source, relative, command) in damaged.items():
        copy = scratch / f"damaged-{len(results)}"
        shutil.copytree(source, copy)
        target = copy / relative
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
        args = {"Phase A": [*PHASE_A, "--steps", "2", "--dataset", str(copy), "--runs-dir", str(copy.with_suffix(".runs"))],
                "Phase B cache": phase_b(copy, "cache", copy.with_suffix(".out")),
                "Phase B L1": phase_b(copy, "L1", copy.with_suffix(".out"))}[command]
        results.append(_damaged_read(name, command, target, args))
    clip = scratch / "clip.npz"
    clip.write_bytes(motion_clip_path().read_bytes()[: motion_clip_path().stat().st_size // 2])
    results.append(_damaged_read("motion clip", "train", clip, [
        "train", "--task", "g1-track-motion", "--motion", str(clip), "--max-iterations", "1",
        "--runs-dir", str(scratch / "clip-runs")]))
    return results


def _damaged_read(name: str, command: str, target: Path, args: list[str]) -> dict:
    result = subprocess.run([HETLAB, *args], capture_output=True, text=True)
    first, one_line = error_lines(result.stderr)
    return {"file": name, "command": command, "status": result.returncode, "line": first,
            "one_line": result.returncode == 2 and one_line, "names_the_file": str(target) in first}


def disk_cache_trial(scratch: Path) -> dict:
    """The disk fills while Phase B builds its feature cache in the Phase-A run: one line naming the
    cache, no half-built cache left, and the same command builds it once there is room."""
    disk = scratch / "disk-cache"
    reason = mount_small_disk(disk, "16m")
    if reason is not None:
        return {"where": "feature cache", "not_run": reason}
    try:
        scratch = scratch / "disk-cache-inputs"
        scratch.mkdir()
        _, source = imitation_inputs(scratch)
        phase_a = disk / "phase-a"
        shutil.copytree(source, phase_a, ignore=lambda _, names: [n for n in names if n.startswith("cache-")])
        filler = fill(disk, 64 * 1024)  # less than the cache's tokens
        args = phase_b(phase_a, "cache", scratch / "b-disk")
        failed = subprocess.run([HETLAB, *args], capture_output=True, text=True)
        first, one_line = error_lines(failed.stderr)
        left = [p.name for p in (phase_a / "offload").iterdir() if "cache" in p.name]
        filler.unlink()
        again = subprocess.run([HETLAB, *args[:-1], str(scratch / "b-disk-again")], capture_output=True, text=True)
        return {"where": "feature cache", "status": failed.returncode, "first_line": first, "one_line": one_line,
                "stderr": failed.stderr[-3000:],
                "names_the_file": first.startswith(f"error: no space left to write {phase_a / 'offload'}"),
                "previous_checkpoint_intact": left == [], "resumed": again.returncode == 0,
                "complete": again.returncode == 0 and len(list((phase_a / "offload").glob("cache-*/tokens.npy"))) == 1}
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def lock_trial(runs: Path) -> dict:
    learner = hetlab([*RUN, "--runs-dir", str(runs), "--max-iterations", "100000"])
    run_dir = Path(learner.stdout.readline().strip())
    while not (run_dir / "checkpoint.json").is_file():
        time.sleep(0.1)
    second = subprocess.run([HETLAB, "train", "--resume", str(run_dir), "--max-iterations", "100001"],
                            capture_output=True, text=True)
    learner.send_signal(signal.SIGTERM)
    learner.communicate()
    lines = second.stderr.strip().splitlines()
    return {"status": second.returncode, "line": lines[0] if lines else "",
            "one_line": second.returncode == 2 and len(lines) == 1 and "is in use" in lines[0],
            "first_run_status": learner.returncode}


def table(report: dict) -> str:
    """The markdown rows of docs/reliability.md's fault table."""
    lines = ["| fault | trials | recovered | records shrunk | work lost | recovery | outcome |",
             "|---|---:|---:|---:|---|---|---|"]
    units = {"kill": ("`train` learner", f"iterations (checkpoint interval {EVERY})", "to its first new iteration"),
             "kill_phase_a": ("Phase A", f"steps (checkpoint interval {PHASE_A_EVERY})", "to the end of the run"),
             "kill_record": ("`aloha record`", "episodes (the one being written)", "to the end of the recording")}
    for key, (who, unit, until) in units.items():
        kills = report.get(key, [])
        for where in dict.fromkeys(trial["where"] for trial in kills):
            trials = [trial for trial in kills if trial["where"] == where]
            lost = max(trial["iterations_lost"] for trial in trials)
            recovery = statistics.median(trial["recovery_s"] for trial in trials)
            label = "at a random moment" if where == "random" else f"renaming its {where} into place"
            lines.append(f"| {who} SIGKILL {label} | {len(trials)} | {sum(t['resumed'] and t['complete'] for t in trials)} "
                         f"| {sum(t['record_shrunk'] for t in trials)} | ≤ {lost} {unit} | {recovery:.1f} s {until} "
                         f"(median) | {'nothing left behind' if not any(t['leftovers'] for t in trials) else 'LEFTOVERS'} |")
    for trial in report.get("disk", []):
        label = {"checkpoint": "disk full at a checkpoint", "episode": "disk full at a dataset episode",
                 "run": "disk full between checkpoints (TensorBoard's events or history.json)",
                 "feature cache": "disk full while Phase B builds its feature cache"}[trial["where"]]
        if "not_run" in trial:
            lines.append(f"| {label} | 0 | — | — | — | — | not run: {trial['not_run']} |")
            continue
        lines.append(f"| {label} | 1 | {int(trial['resumed'] and trial['complete'])} | 0 "
                     f"| {'none' if trial['previous_checkpoint_intact'] else 'EARLIER RECORD DAMAGED'} | goes on once "
                     f"there is room | {'one line naming the file' if trial['one_line'] and trial['names_the_file'] else trial['first_line']} |")
    corrupt = report.get("corrupt", [])
    for name in dict.fromkeys(trial["file"] for trial in corrupt):
        trials = [trial for trial in corrupt if trial["file"] == name]
        good = all(t["one_line"] and t["names_the_file"] for t in trials)
        lines.append(f"| {name} truncated | {len(trials)} ({', '.join(t['command'] for t in trials)}) | — | 0 | none "
                     f"| — | {'one line naming the file' if good else '; '.join(t['line'] for t in trials)} |")
    if "lock" in report:
        lock = report["lock"]
        lines.append(f"| a second `train --resume` of a training run | 1 | — | 0 | none | — "
                     f"| {'refused in one line' if lock['one_line'] else lock['line']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="kill trials (cycling over where the kill lands)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", nargs="+", default=["kill", "disk", "corrupt", "lock"],
                        choices=["kill", "disk", "corrupt", "lock"])
    parser.add_argument("--out", default="runs/benchmarks/faults.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    from hetlab.cpu_isa import host_cpu

    report: dict = {"hardware": f"{host_cpu().model}, {len(os.sched_getaffinity(0))} cores"}
    with tempfile.TemporaryDirectory(prefix="hetlab-faults-") as scratch:
        runs = Path(scratch)
        if "kill" in args.faults:
            places = ("random", *WRITES)
            report["kill"] = [kill_trial(rng, places[i % len(places)], runs) for i in range(args.trials)]
            report["kill_record"] = [record_trial(rng, ("random", "episode")[i % 2], runs)
                                     for i in range(args.trials // 4)]
            dataset = runs / "dataset"
            subprocess.run([HETLAB, *RECORD, "--out", str(dataset)], check=True, capture_output=True)
            report["kill_phase_a"] = [phase_a_trial(rng, ("random", "checkpoint")[i % 2], dataset, runs)
                                      for i in range(args.trials // 4)]
        if "disk" in args.faults:
            report["disk"] = [*(disk_trial(what, runs) for what in ("checkpoint", "run", "episode")),
                              disk_cache_trial(runs)]
        if "corrupt" in args.faults:
            report["corrupt"] = corrupt_trials(runs) + damaged_input_trials(runs)
        if "lock" in args.faults:
            report["lock"] = lock_trial(runs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(table(report))
    print(f"\n{report['hardware']}; details in {args.out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--kill-at"]:  # the hook: hetlab itself, killed at a rename
        name, _, nth = sys.argv[2].rpartition(":")
        kill_at(name, int(nth))
        from hetlab.cli import main as hetlab_main

        sys.argv = ["hetlab", *sys.argv[4:]]
        hetlab_main()
    else:
        main()
