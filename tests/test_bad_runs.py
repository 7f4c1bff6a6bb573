"""A run directory a command cannot use — the other kind of run, the other phase, a corrupt
config.json — is refused in one line with exit status 2, never a traceback.

The runs are real and tiny: a cartpole PPO run of `hetlab train`, a Phase-A run on the tiny
ALOHA recording and a Phase-B run from it. The commands run through `hetlab.cli.main`, as the
console script does (the `refusal` fixture).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import hetlab.imitation.phase_a as phase_a
from hetlab.dir_lock import exclusive_writer
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PhaseAConfig
from hetlab.imitation.phase_b import PhaseBConfig, train_phase_b



@pytest.fixture(scope="module")
def phase_a_run(tiny_aloha_dataset, tmp_path_factory) -> Path:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a busy 2-core machine crawls with more
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(phase_a, "cpu_count", lambda: 1)
            return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1",
                                              steps=2, loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def phase_b_run(phase_a_run, tmp_path_factory) -> Path:
    return train_phase_b(PhaseBConfig(from_run=phase_a_run, condition="learner", seed=2000, steps=2,
                                      train_episodes="0-1", calibration_episodes="0-1",
                                      out=tmp_path_factory.mktemp("b") / "learner"))


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory, hetlab_here) -> Path:
    runs = tmp_path_factory.mktemp("rl")
    result = hetlab_here(
        "train", "--task", "cartpole-balance", "--envs", "16", "--horizon", "8", "--max-iterations", "2",
        "--checkpoint-every", "1", "--runs-dir", runs, "--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return Path(result.stdout.splitlines()[0])


def corrupt_copy(run: Path, to: Path) -> Path:
    """A copy of `run` whose config.json was cut short mid-write (by an editor or a full disk)."""
    shutil.copytree(run, to)
    config = to / "config.json"
    config.write_text(config.read_text()[:40])
    return to


# --- a Phase-B run where a Phase-A run is needed ----------------------------------------------------

@pytest.mark.parametrize("command", [["aloha", "train", "--phase", "A", "--resume"], ["offload", "fidelity"]])
def test_a_phase_b_run_is_refused_naming_the_phase_a_run_it_came_from(phase_a_run, phase_b_run, refusal, command):
    line = refusal(*command, phase_b_run)
    assert f"{phase_b_run} is a Phase-B run" in line and f"pass {phase_a_run}, the one it came from" in line


# --- an AR-Actor run where a run of `hetlab train` is needed ----------------------------------------

@pytest.mark.parametrize("command", [["train", "--resume"], ["export"], ["play"]])
@pytest.mark.parametrize("phase", ["A", "B"])
def test_an_ar_actor_run_is_refused_by_the_rl_commands(phase_a_run, phase_b_run, refusal, command, phase):
    run = phase_a_run if phase == "A" else phase_b_run
    line = refusal(*command, run)
    assert f"{run} is an AR-Actor run (Phase {phase} of `hetlab aloha train`)" in line
    assert "runs/<task>-<algo>/<timestamp>" in line


def test_an_rl_run_is_refused_by_the_aloha_commands(rl_run, refusal):
    line = refusal("aloha", "train", "--phase", "A", "--resume", rl_run)
    assert f"{rl_run}: not an AR-Actor run (a run of `hetlab train`)" in line


# --- a corrupt config.json ----------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["aloha", "train", "--phase", "A", "--resume"], ["offload", "fidelity"],
                                     ["aloha", "eval"], ["aloha", "train", "--phase", "B", "--from"]])
def test_a_corrupt_ar_actor_config_is_one_line(phase_a_run, tmp_path, refusal, command):
    run = corrupt_copy(phase_a_run, tmp_path / "run")
    assert refusal(*command, run).startswith(f"error: {run / 'config.json'} is corrupt (")


@pytest.mark.parametrize("command", [["train", "--resume"], ["export"], ["play"]])
def test_a_corrupt_rl_config_is_one_line(rl_run, tmp_path, refusal, command):
    run = corrupt_copy(rl_run, tmp_path / "run")
    assert refusal(*command, run).startswith(f"error: {run / 'config.json'} is corrupt (")


def test_an_rl_config_with_an_unknown_option_is_one_line(rl_run, tmp_path, refusal):
    run = tmp_path / "run"
    shutil.copytree(rl_run, run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "no_such_option": 1}))
    line = refusal("export", run)
    assert line.startswith(f"error: {run / 'config.json'} does not hold the options of `hetlab train` (")


def test_a_config_that_is_not_an_object_is_one_line(phase_a_run, tmp_path, refusal):
    run = tmp_path / "run"
    shutil.copytree(phase_a_run, run)
    (run / "config.json").write_text("[]")
    assert "is corrupt (a JSON list, not an object)" in refusal("aloha", "eval", run)


# --- a run in use ---------------------------------------------------------------------------------------

def test_a_run_in_use_is_refused_in_one_line(rl_run, refusal):
    with exclusive_writer(rl_run, "run"):  # as another process training it holds it
        line = refusal("train", "--resume", rl_run, "--max-iterations", "9")
    assert line.startswith(f"error: {rl_run} is in use: another hetlab process (pid {os.getpid()}) is writing this run")


# --- a damaged checkpoint or history ------------------------------------------------------------------

def truncated_copy(run: Path, to: Path, relative: str) -> Path:
    """A copy of `run` with the file at `relative` cut to half its size (a disk that failed under it)."""
    shutil.copytree(run, to)
    target = to / relative
    target.write_bytes(target.read_bytes()[:target.stat().st_size // 2])
    return target


def newest_checkpoint(run: Path) -> str:
    return "checkpoints/" + json.loads((run / "checkpoint.json").read_text())["latest"]


@pytest.mark.parametrize("command", [["train", "--resume"], ["export"]])
def test_damaged_checkpoint_tensors_are_one_line_naming_them_and_the_older_checkpoint(rl_run, tmp_path, refusal,
                                                                                       command):
    damaged = truncated_copy(rl_run, tmp_path / "run", f"{newest_checkpoint(rl_run)}/tensors.safetensors")
    line = refusal(*command, tmp_path / "run", *(["--max-iterations", "9"] if command[0] == "train" else []))
    assert line.startswith(f"error: checkpoint {damaged.parent} is damaged (SafetensorError")
    assert "it keeps step(s) 1: `hetlab train --resume` continues from one with --checkpoint N" in line


def test_a_damaged_checkpoint_pointer_is_one_line_that_says_how_to_fix_it(rl_run, tmp_path, refusal):
    pointer = truncated_copy(rl_run, tmp_path / "run", "checkpoint.json")
    line = refusal("train", "--resume", tmp_path / "run", "--max-iterations", "9")
    assert line.startswith(f"error: {pointer} is corrupt (") and '"latest"' in line


def test_a_damaged_history_is_one_line(rl_run, tmp_path, refusal):
    history = truncated_copy(rl_run, tmp_path / "run", "history.json")
    line = refusal("train", "--resume", tmp_path / "run", "--max-iterations", "9")
    assert line.startswith(f"error: {history} is corrupt (") and "move it away to resume" in line
