"""The `hetlab` console script, run as a user would: a subprocess per command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetlab.tasks import TASKS

HETLAB = str(Path(sys.executable).with_name("hetlab"))


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([HETLAB, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_info_reports_device_threads_versions_and_extras():
    report = json.loads(run("info", "--json").stdout)
    assert report["device"] == "cpu"  # no accelerator on the test machines
    assert report["cpu_count"] == len(os.sched_getaffinity(0))
    assert 1 <= report["physics_threads"] <= report["cpu_count"]
    assert report["versions"]["mujoco"].startswith("4.")
    assert report["extras"]["assets"] is True and report["extras"]["video"] is True
    table = run("info").stdout
    assert "learner device" in table and "thread budget" in table


def test_tasks_lists_every_registered_task_with_sizes():
    rows = json.loads(run("tasks", "--json").stdout)
    assert [row["name"] for row in rows] == sorted(TASKS)
    for row in rows:
        cls = TASKS[row["name"]]
        assert row["obs"] == cls.obs_sizes and row["actions"] == cls.action_size
    assert {row["name"] for row in rows if row["symmetric"]} == {"cartpole-balance", "go1-joystick-flat", "g1-walk-flat"}
    assert "go1-joystick-flat" in run("tasks").stdout


@pytest.mark.serial
def test_bench_sim_json_has_the_promised_keys_and_consistent_efficiency():
    result = json.loads(run("bench", "sim", "--seconds", "2", "--json").stdout)
    for key in ("physics_steps_per_s", "env_steps_per_s", "task_efficiency", "physics_share", "envs", "threads"):
        assert key in result
    assert result["envs"] == 1024 and result["task"] == "go1-joystick-flat"
    assert result["physics_steps_per_s"] > 0 and result["env_steps_per_s"] > 0
    # Each round's efficiency is its env rate × substeps over its physics rate.
    rounds = result["per_round"]
    for env, phys, eff in zip(rounds["env_steps_per_s"], rounds["physics_steps_per_s"], rounds["task_efficiency"]):
        assert eff == pytest.approx(env * result["substeps"] / phys)
    # The task cannot be much faster than its own physics; the bound leaves room for another job
    # sharing the cores between a round's two measurements (a wrong substep count gives ≥ 2 or ≤ 0.3).
    assert 0.0 < result["task_efficiency"] <= 1.5
    # Go1's task layer is about a tenth of its loop (measured: 0.87–0.93 of it in physics).
    assert all(0.5 < share < 1.0 for share in rounds["physics_share"]), rounds["physics_share"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "sim", "--task", "no-such-task", "--seconds", "1"], "unknown task 'no-such-task'"),
        (["bench", "sim", "--envs", "0", "--seconds", "1"], "--envs must be at least 1"),
        (["bench", "sim", "--threads", str(len(os.sched_getaffinity(0)) + 1), "--seconds", "1"], "use at most"),
        (["info", "--device", "mps"], "not available on this machine"),
        (["play", "/no/such/run", "--width", "0"], "--width and --height must be positive and even"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(args, message):
    result = run(*args, check=False)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_aloha_params_prints_the_study_split():
    split = json.loads(run("aloha", "params", "--json", "--preset", "tiny").stdout)
    assert list(split) == ["backbone", "projection", "encoder", "action_expert", "total"]
    assert split["total"] == sum(v for k, v in split.items() if k != "total")
    table = run("aloha", "params").stdout
    assert "15×20 image tokens" in table and "51.50 M" in table


def test_version_is_the_packages():
    import hetlab

    assert run("--version").stdout == f"hetlab {hetlab.__version__}\n"
