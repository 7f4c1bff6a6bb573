"""SIGTERM and SIGHUP stop a long command as Ctrl-C does (tests/test_train.py has Ctrl-C's test):
real `hetlab` processes, signalled alone or with their whole process group (as a terminal,
`timeout` or `kill -TERM -PGID` do), stop at the next iteration or step with a checkpoint, unlink
their shared memory, print the command that resumes them and exit with 128 + the signal; a second
signal exits at once."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.serial  # bounds on how soon a signalled run stops

HETLAB = str(Path(sys.executable).with_name("hetlab"))
SMALL_PPO = ["--algo", "ppo", "--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32"]
CARTPOLE = ["--task", "cartpole-balance", "--envs", "64", "--horizon", "16", "--max-iterations", "10000", *SMALL_PPO]


def default_stop_signals() -> None:
    """The stop signals' default handling in a child, as a terminal starts a command: a job started
    in the background or under nohup inherits them ignored, and hetlab keeps an ignored one so."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start(*args: str) -> subprocess.Popen:
    """`hetlab ARGS` as the leader of a process group of its own, so that the group can be signalled."""
    return subprocess.Popen([HETLAB, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=default_stop_signals)


def after_iterations(learner: subprocess.Popen, iterations: int) -> Path:
    """The run directory (stdout's first line), once the learner has logged `iterations` rows."""
    run_dir = Path(learner.stdout.readline().strip())
    logged = 0
    while logged < iterations:
        line = learner.stdout.readline()
        assert line or learner.poll() is None, learner.stderr.read()
        logged += line.startswith("it ")
    return run_dir


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith("hetlab_") and f"_{pid}_" in name]


@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGTERM, False), (signal.SIGTERM, True),
                                                  (signal.SIGHUP, True)],
                         ids=["SIGTERM-learner", "SIGTERM-group", "SIGHUP-group"])
def test_a_stop_signal_ends_training_at_the_next_iteration_with_a_checkpoint(tmp_path, signum, to_group):
    learner = start("train", "--runs-dir", str(tmp_path / "runs"), *CARTPOLE)
    try:
        run_dir = after_iterations(learner, 3)
        assert len(segments_of(learner.pid)) == 2  # the rollout ring and the weight broadcast
        # The group holds the collector and Python's resource tracker too: neither may die of it first.
        os.killpg(learner.pid, signum) if to_group else learner.send_signal(signum)
        signalled = time.monotonic()
        _, stderr = learner.communicate(timeout=60)
        stopped_in = time.monotonic() - signalled
    finally:
        learner.kill()
    assert learner.returncode == 128 + signum, stderr[-3000:]
    assert stopped_in < 10, stopped_in
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "interrupted" and summary["iterations"] >= 3
    assert json.loads((run_dir / "checkpoint.json").read_text())["iteration"] == summary["iterations"]
    assert (run_dir / "checkpoints" / f"{summary['iterations']:07d}").is_dir()
    assert f"resume with: hetlab train --resume {run_dir}\n" in stderr
    assert segments_of(learner.pid) == []
    assert "died" not in stderr and "resource_tracker" not in stderr and "leaked" not in stderr, stderr[-3000:]


def test_a_second_signal_exits_at_once_and_leaves_the_last_checkpoint_whole(tmp_path):
    from hetlab.checkpoint import load_checkpoint

    learner = start("train", "--runs-dir", str(tmp_path / "runs"), *CARTPOLE, "--checkpoint-every", "2")
    try:
        run_dir = after_iterations(learner, 4)
        learner.send_signal(signal.SIGTERM)
        # Two signals close together are one to Python: the second goes once the first is being handled.
        while "stopping at the next safe point" not in learner.stderr.readline():
            assert learner.poll() is None
        learner.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        learner.wait(timeout=30)
        exited_in = time.monotonic() - signalled
        _, stderr = learner.communicate(timeout=60)
    finally:
        learner.kill()
    assert learner.returncode == 143 and exited_in < 2, (learner.returncode, exited_in)
    assert "SIGTERM while stopping: exiting at once" in stderr
    # The exit may cut the checkpoint of iteration 4 short; the one checkpoint.json names reads back whole.
    assert load_checkpoint(run_dir)["iteration"] >= 2
    # Left behind by the immediate exit, the segments are unlinked by Python's resource tracker.
    deadline = time.monotonic() + 10
    while segments_of(learner.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert segments_of(learner.pid) == []


def test_a_sync_run_stopped_by_sigterm_and_resumed_is_bit_identical_to_a_straight_run(tmp_path, assert_same_weights,
                                                                                      hetlab_here):
    common = ["--runs-dir", str(tmp_path / "runs"), "--task", "cartpole-balance", "--envs", "16", "--horizon", "8",
              "--checkpoint-every", "1000", *SMALL_PPO]
    learner = start("train", *common, "--max-iterations", "10000")
    try:
        stopped = after_iterations(learner, 2)
        learner.send_signal(signal.SIGTERM)
        _, stderr = learner.communicate(timeout=60)
    finally:
        learner.kill()
    assert learner.returncode == 143, stderr[-3000:]
    iteration = json.loads((stopped / "checkpoint.json").read_text())["iteration"]
    # The command it printed, two iterations further.
    resume = shlex.split(next(line for line in stderr.splitlines() if line.startswith("resume with: "))
                         .removeprefix("resume with: "))
    assert resume[:2] == ["hetlab", "train"]
    # The stop is the console script's; the runs that check what it left run in this process.
    resumed = hetlab_here(*resume[1:], "--max-iterations", str(iteration + 2))
    straight = hetlab_here("train", *common, "--max-iterations", str(iteration + 2))
    for run in (resumed, straight):
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert Path(resumed.stdout.splitlines()[0]) == stopped
    assert_same_weights(Path(straight.stdout.splitlines()[0]), stopped, iteration + 2)


def test_sigterm_stops_phase_a_after_the_step_with_a_checkpoint(tiny_aloha_dataset, tmp_path):
    trainer = start("aloha", "train", "--dataset", str(tiny_aloha_dataset), "--preset", "tiny", "--train-episodes", "0-1",
                    "--steps", "100000", "--runs-dir", str(tmp_path / "runs"))
    try:
        run_dir = Path(trainer.stdout.readline().strip())
        while not (run_dir / "history.json").is_file():  # written with the first checkpoint
            assert trainer.poll() is None, trainer.stderr.read()
            time.sleep(0.1)
        trainer.send_signal(signal.SIGTERM)
        _, stderr = trainer.communicate(timeout=60)
    finally:
        trainer.kill()
    assert trainer.returncode == 143, stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "interrupted" and summary["steps"] >= 10
    assert json.loads((run_dir / "checkpoint.json").read_text())["iteration"] == summary["steps"]
    assert f"resume with: hetlab aloha train --resume {run_dir}\n" in stderr
