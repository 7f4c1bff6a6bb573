"""`hetlab train` end to end: real collector processes, shared memory, learning, resume, faults."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HETLAB = str(Path(sys.executable).with_name("hetlab"))


def default_stop_signals() -> None:
    """Ctrl-C's default handling in the child, as a terminal starts a command (a background job
    inherits SIGINT ignored, and hetlab keeps an ignored signal so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# PPO named, so that no task's recipe applies: these runs train the algorithm's own defaults.
SMALL_NETS = ["--algo", "ppo", "--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32"]
SMALL_SAC = ["--algo", "sac", "--sac.actor-hidden", "32", "32", "--sac.critic-hidden", "32", "32", "--sac.batch-size", "64",
             "--sac.learning-starts", "5", "--off-policy.replay-capacity", "16000"]


@pytest.fixture
def train(hetlab_here):
    """`train(tmp_path, *args)`: `hetlab train --runs-dir tmp_path/runs ARGS` in this process, which
    must succeed; its run directory and CompletedProcess."""

    def trained(tmp_path: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
        result = hetlab_here("train", "--runs-dir", tmp_path / "runs", *args)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return Path(result.stdout.splitlines()[0]), result

    return trained


def train_by_script(tmp_path: Path, *args: str) -> tuple[Path, subprocess.CompletedProcess]:
    """As `train`, by the console script: for what a run records of the command line that started it."""
    result = subprocess.run([HETLAB, "train", "--runs-dir", str(tmp_path / "runs"), *args],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return Path(result.stdout.splitlines()[0]), result


def torch_version() -> str:
    from importlib import metadata

    return metadata.version("torch")


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith("hetlab_") and f"_{pid}_" in name]


@pytest.mark.parametrize(
    ("algo", "mode", "iterations"),
    # PPO (sync, solved within 150 iterations) is the README's quick start: tests/test_readme.py. APPO with 64 envs:
    # seeds 0 and 1 passed 350 at iterations 54 and 38 and held ~497 from iteration 70 on.
    [("appo", "async", 80)],
)
@pytest.mark.serial  # async: the collector's lead on the learner shapes what is learnt
def test_solves_cartpole(tmp_path, algo, mode, iterations, train):
    run_dir, _ = train(
        tmp_path, "--algo", algo, "--mode", mode, "--task", "cartpole-balance", "--envs", "64",
        "--horizon", "32", "--max-iterations", str(iterations), "--checkpoint-every", "1000", "--target-return", "350",
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    # An episode lasts at most 500 steps of reward ≈ 1; a random policy keeps the pole up ~25.
    # The run stops once the mean return reaches 350, within the iterations.
    assert summary["stopped_by"] == "target_return" and summary["iterations"] <= iterations, summary
    assert summary["mode"] == mode
    assert summary["mean_return_first"] < 50
    assert summary["mean_return_last"] >= 350, summary
    assert (run_dir / "checkpoints").is_dir()  # the stop wrote its checkpoint
    if mode == "sync":
        assert summary["policy_lag_mean"] == 0.0
    else:
        assert summary["policy_lag_mean"] > 0.0  # the collector ran ahead of the learner
    assert not (run_dir / "reward.png").exists()  # HETLAB_FIGURES=0 (tests/conftest.py)


def test_a_task_s_episode_metrics_reach_the_history_summary_evaluation_and_console(tmp_path, train):
    # The LEAP cube task counts the goals reached per episode; a random hand drops the cube within
    # a few hundred steps, so episodes end in a short run.
    run_dir, result = train(
        tmp_path, "--task", "leap-cube-reorient", "--envs", "32", "--horizon", "64", "--max-iterations", "6",
        "--eval-every", "6", "--eval-envs", "4", *SMALL_NETS,
    )
    history = json.loads((run_dir / "history.json").read_text())
    goals = [row["episode/goals"] for row in history if "episode/goals" in row]
    assert goals and all(value >= 0 for value in goals)
    assert history[-1]["eval/goals"] >= 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episode/goals_last"] == goals[-1] and summary["episode/goals_first"] == goals[0]
    assert f"| goals {goals[-1]:.2f}" in result.stdout


def test_artefacts_summary_and_chrome_trace(tmp_path, figures):
    run_dir, result = train_by_script(
        tmp_path, "--task", "cartpole-balance", "--envs", "16", "--collectors", "2", "--horizon", "8",
        "--max-iterations", "4", "--eval-every", "2", "--eval-envs", "4", *SMALL_NETS,
    )
    assert run_dir.parent.name == "cartpole-balance-ppo" and run_dir.is_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("iterations", "env_steps", "wall_seconds", "env_steps_per_s", "mean_return_first", "mean_return_last",
                "policy_lag_mean", "learner_idle_fraction"):
        assert key in summary, key
    assert summary["env_steps"] == 4 * 16 * 8
    assert 0.0 <= summary["learner_idle_fraction"] <= 1.0
    # Each iteration's own rate beside the launch's running average, on the console as in the history.
    history = json.loads((run_dir / "history.json").read_text())
    for before, row in zip(history, history[1:]):
        own = (row["env_steps"] - before["env_steps"]) / (row["wall_seconds"] - before["wall_seconds"])
        assert row["iteration_env_steps_per_s"] == pytest.approx(own)
    assert history[0]["iteration_env_steps_per_s"] == history[0]["env_steps_per_s"]
    # Deterministic evaluation every second iteration, in the history and on the console.
    assert ["eval/return" in row for row in history] == [False, True, False, True]
    assert all(1 <= row["eval/episode_length"] <= 500 for row in history if "eval/return" in row)
    assert result.stdout.count("| eval return") == 2
    assert f"curves: tensorboard --logdir {run_dir / 'tensorboard'}" in result.stdout
    assert (run_dir / "reward.png").stat().st_size > 0 and (run_dir / "time_breakdown.png").stat().st_size > 0
    assert "reward.png, time_breakdown.png" in result.stdout
    # The best evaluated policy is kept as a checkpoint of its own, whatever came after it.
    best = json.loads((run_dir / "best.json").read_text())
    evaluated = {row["iteration"] + 1: row["eval/return"] for row in history if "eval/return" in row}
    assert best["iteration"] in evaluated and best["eval/return"] == max(evaluated.values())
    assert (run_dir / "checkpoints" / f"{best['iteration']:07d}").is_dir()
    exported = subprocess.run([HETLAB, "export", str(run_dir), "--checkpoint", "best", "--out", str(tmp_path / "b.onnx")],
                              capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0 and (tmp_path / "b.onnx").is_file(), exported.stderr[-2000:]
    last = history[-1]
    assert f"{last['iteration_env_steps_per_s']:7,.0f} steps/s (avg {last['env_steps_per_s']:7,.0f})" in result.stdout
    config = json.loads((run_dir / "config.json").read_text())
    assert config["task"] == "cartpole-balance" and config["horizon"] == 8
    assert config["device"] == "cpu" and list(config["algos"]) == ["ppo"]  # resolved, and the chosen algorithm's
    [launch] = json.loads((run_dir / "meta.json").read_text())["launches"]  # what made the run
    assert launch["command"][:2] == ["hetlab", "train"] and "--max-iterations" in launch["command"]
    assert launch["hardware"]["cores"] == len(os.sched_getaffinity(0)) and launch["hardware"]["learner_device"] == "cpu"
    assert launch["libraries"]["torch"] == torch_version() and launch["python"] == platform.python_version()
    assert launch["git"] is None or len(launch["git"]["commit"]) == 40
    trace = json.loads((run_dir / "trace.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in events} >= {"env_step", "inference", "update", "wait_data", "transfer"}
    for event in events:
        assert event["dur"] >= 0 and isinstance(event["ts"], float) and isinstance(event["tid"], int)
    roles = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert roles >= {"learner", "collector 0", "collector 1", "stager"}
    assert any((run_dir / "tensorboard").iterdir())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert "eval/return" in events.Tags()["scalars"]
    assert set(events.PluginTagToContent("hparams")) >= {"_hparams_/experiment", "_hparams_/session_start_info"}


def test_sync_resume_is_exact_in_place_and_from_an_older_checkpoint(tmp_path, assert_same_weights, train):
    common = ["--task", "cartpole-balance", "--envs", "16", "--horizon", "8", "--checkpoint-every", "3", *SMALL_NETS]
    straight, _ = train(tmp_path / "a", *common, "--max-iterations", "6", "--keep-checkpoints", "0")
    before = {name: (straight / name).read_bytes() for name in ("summary.json", "history.json", "meta.json")}
    # From iteration 3 of a run that went on to 6: a new run directory, the original left whole.
    # By the console script: meta.json records the command lines of the branch and its resume.
    branch, _ = train_by_script(tmp_path / "b", "--resume", str(straight), "--checkpoint", "3", "--max-iterations", "5")
    assert branch != straight and {name: (straight / name).read_bytes() for name in before} == before
    resumed, _ = train_by_script(tmp_path / "b", "--resume", str(branch), "--max-iterations", "6")
    assert resumed == branch
    assert_same_weights(straight, resumed, 6)
    # The record spans every launch: nothing an earlier one wrote is lost.
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["iterations"] == 6 and summary["env_steps"] == 6 * 16 * 8
    assert [(s["first_iteration"], s["iterations"]) for s in summary["sessions"]] == [(3, 2), (5, 1)]
    meta = json.loads((resumed / "meta.json").read_text())
    assert ["--resume" in launch["command"] for launch in meta["launches"]] == [False, True, True]
    assert meta["branched_from"] == {"run": str(straight.resolve()), "iteration": 3}
    history = json.loads((resumed / "history.json").read_text())
    assert [row["iteration"] for row in history] == list(range(6))
    assert history[:3] == json.loads(before["history.json"])[:3]
    walls = [row["wall_seconds"] for row in history]
    assert walls == sorted(walls)  # each launch's clock goes on from the one before
    events = [e for e in json.loads((resumed / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    updates = sorted(e["ts"] for e in events if e["name"] == "update")
    assert len(updates) == 3  # the branch's two learner updates, then the in-place resume's one


def test_resume_never_shrinks_a_run_or_changes_its_options(tmp_path, refusal, train):
    common = ["--task", "cartpole-balance", "--envs", "16", "--horizon", "8", *SMALL_NETS]
    run_dir, _ = train(tmp_path, *common, "--max-iterations", "2", "--threads", "1", "--torch-threads", "1")
    before = {name: (run_dir / name).read_bytes() for name in ("summary.json", "history.json", "trace.json")}
    for args, message in [
        (["--max-iterations", "2"], "has already trained 2 iterations; pass --max-iterations above 2"),
        (["--max-iterations", "4", "--envs", "32"], "--envs asks for 32 where the run has 16"),
        (["--max-iterations", "4", "--ppo.learning-rate", "0.5"], "--ppo.learning-rate asks for 0.5 where the run has 0.001"),
        (["--max-iterations", "4", "--checkpoint", "1"], "keeps no checkpoint of step 1; it keeps step(s) 2"),
        (["--max-iterations", "4", "--checkpoint", "best"], "has no best checkpoint"),
    ]:
        assert message in refusal("train", "--resume", run_dir, *args)
    assert "give --resume RUN_DIR too" in refusal("train", "--checkpoint", "2")
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    # Where it runs is the launch's, but a resume that is not told says it changed the run's threads.
    _, result = train(tmp_path, "--resume", run_dir, "--max-iterations", "3")
    assert ("resumed with --threads 0 --torch-threads 0 (this launch's default; 0 = every core) where the run had "
            "--threads 1 --torch-threads 1: give --threads 1 --torch-threads 1 to keep the run's\n") in result.stdout
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["threads"], config["torch_threads"]) == (0, 0)
    _, result = train(tmp_path, "--resume", run_dir, "--max-iterations", "4", "--threads", "1")  # given: no line
    assert "resumed with" not in result.stdout


def _child_pids(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children += [int(c) for c in text]
    return children


@pytest.mark.serial
@pytest.mark.parametrize("algo_args", [SMALL_NETS, SMALL_SAC], ids=["ppo", "sac"])
def test_killed_collector_stops_the_learner_quickly_without_leaking_shm(tmp_path, algo_args):
    learner = subprocess.Popen(
        [HETLAB, "train", "--runs-dir", str(tmp_path / "runs"), "--task", "cartpole-balance", "--envs", "16",
         "--horizon", "8", "--max-iterations", "100000", *algo_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        lines = []
        while not any(line.startswith("it ") for line in lines):  # training is under way
            lines.append(learner.stdout.readline())
            assert lines[-1] or learner.poll() is None, learner.stderr.read()
        assert segments_of(learner.pid)
        # The learner's children are Python's resource tracker and the fork server, whose child is the collector.
        (server,) = [pid for pid in _child_pids(learner.pid)
                     if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        collectors = _child_pids(server)
        assert len(collectors) == 1
        os.kill(collectors[0], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = learner.communicate(timeout=30)
        assert time.monotonic() - killed < 5.0
    finally:
        learner.kill()
    assert learner.returncode != 0
    assert "collector 0 died with exit code -9" in stderr
    assert segments_of(learner.pid) == []


@pytest.mark.serial
def test_collector_error_reaches_the_learner_with_its_traceback(tmp_path):
    # The file exists, so the learner's asset check passes; only the collector, which compiles it, fails.
    broken = tmp_path / "broken-assets"
    (broken / "unitree_go1").mkdir(parents=True)
    (broken / "unitree_go1" / "go1.xml").write_text("<mujoco><worldbody><body name='x'>")
    start = time.monotonic()
    learner = subprocess.Popen(
        [HETLAB, "train", "--runs-dir", str(tmp_path / "runs"), "--task", "go1-joystick-flat", "--envs", "8",
         "--horizon", "8", "--max-iterations", "5", *SMALL_NETS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "HETLAB_ASSETS": str(broken)},
    )
    _, stderr = learner.communicate(timeout=60)
    assert time.monotonic() - start < 30
    assert learner.returncode != 0
    # The collector's own traceback, down to MuJoCo's parse error on the broken file.
    assert "collector 0 failed" in stderr and "Traceback" in stderr
    assert "XML parse error" in stderr
    assert segments_of(learner.pid) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--envs", "10", "--collectors", "3"], "must split evenly"),
        (["--envs", "16", "--horizon", "3", "--ppo.num-mini-batches", "5"], "do not split into 5 minibatches"),
        (["--task", "no-such-task"], "unknown task"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
        (["--collectors", "0"], "--collectors must be at least 1"),
        (["--resume", "/nonexistent/run"], "has no checkpoint.json"),
        (["--envs", "100000000", "--horizon", "1000"], "needs"),  # terabytes of rollout ring
        (["--algo", "sac", "--mode", "sync"], "drop --mode sync"),
        (["--algo", "sac", "--off-policy.replay-capacity", "100"], "--off-policy.replay-capacity"),
        (["--algo", "sac", "--sac.updates-per-step", "0.25", "--off-policy.lead", "2"], "use at least 5"),
        (["--algo", "sac", "--off-policy.replay-capacity", "100000000000"], "needs"),  # ~100 TB of replay
        (["--max-seconds", "-3"], "--max-seconds must be ≥ 0 (0 = no limit), got -3.0"),
        (["--seed", "-1"], "--seed must be ≥ 0, got -1"),
        (["--device", "mps"], "device 'mps' is not available on this machine"),  # no Apple GPU on Linux
        (["--eval-every", "-1"], "--eval-every must be ≥ 0"),
        (["--keep-checkpoints", "-2"], "--keep-checkpoints must be ≥ 0"),
    ],
)
def test_impossible_configs_fail_before_anything_starts(tmp_path, refusal, args, message):
    assert message in refusal("train", "--runs-dir", tmp_path / "runs", "--task", "cartpole-balance", *args)
    assert not (tmp_path / "runs").exists()  # no run directory for a run that never started


def test_a_bad_figures_switch_fails_before_anything_starts(tmp_path, refusal, monkeypatch):
    monkeypatch.setenv("HETLAB_FIGURES", "no")
    assert "HETLAB_FIGURES='no': use 1" in refusal("train", "--runs-dir", tmp_path / "runs", "--task", "cartpole-balance")
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_stops_cleanly_with_a_final_checkpoint(tmp_path):
    learner = subprocess.Popen(
        [HETLAB, "train", "--runs-dir", str(tmp_path / "runs"), "--task", "cartpole-balance", "--envs", "16",
         "--horizon", "8", "--max-iterations", "100000", "--checkpoint-every", "100000", *SMALL_NETS],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_stop_signals,
    )
    try:
        run_dir = Path(learner.stdout.readline().strip())
        iterations = 0
        while iterations < 3:  # a few iterations in, well before any periodic checkpoint
            line = learner.stdout.readline()
            assert line or learner.poll() is None, learner.stderr.read()
            iterations += line.startswith("it ")
        learner.send_signal(signal.SIGINT)
        _, stderr = learner.communicate(timeout=20)
    finally:
        learner.kill()
    assert learner.returncode == 130, stderr[-3000:]  # 128 + SIGINT, as for a process Ctrl-C ended
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "interrupted" and summary["iterations"] >= 3
    assert f"resume with: hetlab train --resume {run_dir}\n" in stderr
    pointer = json.loads((run_dir / "checkpoint.json").read_text())
    assert pointer["iteration"] == summary["iterations"]
    assert segments_of(learner.pid) == []


@pytest.mark.parametrize("inference", ["collector", "learner"])
def test_off_policy_inference_runs_in_the_collectors_or_on_the_learner(tmp_path, inference, train):
    run_dir, _ = train(tmp_path, "--task", "cartpole-balance", "--envs", "16", "--horizon", "8", "--max-iterations", "6",
                       *SMALL_SAC, "--sac.updates-per-step", "2", "--off-policy.inference", inference)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 6 and summary["updates"] == 6 * 8 * 2
    roles = summary["time_breakdown_s"]
    assert ("inference server" in roles) == (inference == "learner")
    assert roles["stager"]["sample_transfer"] > 0 and roles["collector 0"]["env_step"] > 0
    history = json.loads((run_dir / "history.json").read_text())
    assert history[-1]["policy_lag"] >= 0  # the collectors acted with published weights
    assert history[-1]["env_steps"] >= 16 * (5 + 6 * 8 // 2)  # warm-up plus what the updates paid for
    if inference == "collector":  # an off-policy actor exports like an on-policy one
        exported = subprocess.run([HETLAB, "export", str(run_dir)], capture_output=True, text=True, timeout=120)
        assert exported.returncode == 0 and Path(exported.stdout.splitlines()[0]).is_file(), exported.stderr[-2000:]
        assert "max |Δ action| = " in exported.stdout and "(tolerance 1e-05)" in exported.stdout


def test_off_policy_resume_refills_the_replay_buffer(tmp_path, train):
    args = ["--task", "cartpole-balance", "--envs", "16", "--horizon", "8", *SMALL_SAC, "--sac.learning-starts", "40",
            "--checkpoint-every", "2"]
    saved, _ = train(tmp_path, *args, "--max-iterations", "4", "--off-policy.save-replay")
    snapshot = saved / "checkpoints" / "0000004" / "replay" / "c0"
    assert (snapshot / "rewards.npy").is_file() and (snapshot / "next_critic_obs.npy").is_file()
    saved_steps = json.loads((saved / "history.json").read_text())[-1]["env_steps"]
    resumed, _ = train(tmp_path, "--resume", str(saved), "--max-iterations", "6")
    history = json.loads((resumed / "history.json").read_text())
    assert [row["iteration"] for row in history] == list(range(6))  # the first launch's rows are kept
    # The buffer came back: collection goes on from where it was, with no new random warm-up.
    assert history[4]["env_steps"] >= saved_steps
    assert json.loads((resumed / "summary.json").read_text())["updates"] == 6 * 8

    unsaved, _ = train(tmp_path, *args, "--max-iterations", "4")
    assert not (unsaved / "checkpoints" / "0000004" / "replay").exists()
    restarted, _ = train(tmp_path, "--resume", str(unsaved), "--max-iterations", "5")
    first = json.loads((restarted / "history.json").read_text())[4]
    assert first["iteration"] == 4 and first["env_steps"] < saved_steps  # an empty buffer, filled afresh
