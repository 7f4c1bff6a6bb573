"""`hetlab train --ray`: collectors as actors of a real two-node Ray cluster, learning, faults, bad input.

The cluster (ray.cluster_utils.Cluster, started once for the module) has two nodes of one CPU
each: the learner's (the head, where the driver connects) and another. With two collectors Ray
places one on each, so every run takes both data paths at once: shared memory written in place
on the learner's node, and the object store from the other node (both nodes of a local cluster
share /dev/shm, so only the node ids tell the paths apart, and the pool decides by those).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetlab.errors import UserError
from hetlab.train.config import TrainConfig
from hetlab.train.launch import train as train_in_process

ray = pytest.importorskip("ray", reason="the ray extra is not installed")
from ray.cluster_utils import Cluster  # noqa: E402

# One xdist worker runs them all, one after another: killing "a collector" finds the actors by
# process name, which would also find another Ray test's.
pytestmark = pytest.mark.serial  # local clusters sized to the machine's cores
HETLAB = str(Path(sys.executable).with_name("hetlab"))
SMALL_PPO = ["--algo", "ppo", "--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32"]
# The off-policy learning test's SAC case (tests/test_train_off_policy_learning.py), as options.
SAC = ["--algo", "sac", "--sac.actor-hidden", "64", "64", "--sac.critic-hidden", "64", "64",
       "--sac.actor-learning-rate", "1e-3", "--sac.critic-learning-rate", "1e-3", "--sac.alpha-learning-rate", "1e-3",
       "--sac.init-alpha", "0.1", "--sac.updates-per-step", "2", "--sac.learning-starts", "100",
       "--off-policy.replay-capacity", "100000"]


@pytest.fixture(scope="module")
def local_cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def cluster(local_cluster) -> str:
    return local_cluster.address


def hetlab_train(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([HETLAB, "train", "--runs-dir", str(tmp_path / "runs"), "--task", "cartpole-balance", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(learner: subprocess.Popen, timeout: float = 300) -> tuple[Path, str, str]:
    """(run directory, stdout, stderr) of a run that succeeds; stdout from where it was left."""
    stdout, stderr = learner.communicate(timeout=timeout)
    assert learner.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return Path(stdout.splitlines()[0]) if stdout else None, stdout, stderr


def segments_of(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith("hetlab_") and f"_{pid}_" in name]


def both_paths_taken(stderr: str, run_dir: Path) -> None:
    assert "Ray collectors: [" in stderr and "on the learner's node (shared memory)" in stderr, stderr
    assert "elsewhere (object store)" in stderr and "none elsewhere" not in stderr, stderr
    history = json.loads((run_dir / "history.json").read_text())
    assert history[-1]["ray/relayed_mb"] > 0  # the other node's rollouts came through the object store


def test_sync_resume_is_exact_with_collectors_on_two_nodes(tmp_path, cluster, assert_same_weights, hetlab_here):
    """A run stopped at iteration 3 and resumed to 6 on the cluster ends with the weights of a run
    straight to 6 on this machine alone: the remote collector's task state comes back with its
    commits, and a collector on the cluster collects exactly what a local process does."""
    common = [*SMALL_PPO, "--envs", "16", "--collectors", "2", "--horizon", "8", "--checkpoint-every", "3"]
    local = hetlab_here("train", "--runs-dir", tmp_path / "a", "--task", "cartpole-balance", *common,
                        "--max-iterations", "6")
    assert local.returncode == 0, local.stderr[-3000:]
    interrupted, _, _ = finished(hetlab_train(tmp_path / "b", "--ray", cluster, *common, "--max-iterations", "3"))
    resumed, _, _ = finished(hetlab_train(tmp_path / "b", "--resume", str(interrupted), "--ray", cluster,
                                          "--max-iterations", "6"))
    assert_same_weights(Path(local.stdout.splitlines()[0]), resumed, 6)


def logged(learner: subprocess.Popen, iterations: int) -> Path:
    """The run's directory, once `iterations` iterations are logged."""
    run_dir = Path(learner.stdout.readline().strip())
    seen = 0
    while seen < iterations:
        line = learner.stdout.readline()
        assert line or learner.poll() is None, learner.stderr.read()
        seen += line.startswith("it ")
    return run_dir


def kill_a_collector(local_cluster: Cluster) -> None:
    """SIGKILL one collector actor's process."""
    # An earlier run's actors may still be on their way out: Ray ends them after their driver leaves.
    deadline = time.monotonic() + 30
    while len(actors := subprocess.run(["pgrep", "-f", "ray::CollectorActor"], capture_output=True,
                                       text=True).stdout.split()) != 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(actors) == 2, actors
    os.kill(int(actors[0]), signal.SIGKILL)


def remove_a_collectors_node(local_cluster: Cluster) -> None:
    """Take away the node that is not the learner's, with the collector on it, as a cloud takes
    a preempted machine; a new node of one CPU joins first, for the replacement to go to. The
    cluster is left with two nodes of one CPU, as the other tests expect."""
    (gone,) = local_cluster.worker_nodes
    local_cluster.add_node(num_cpus=1)
    local_cluster.wait_for_nodes()
    local_cluster.remove_node(gone, allow_graceful=False)


FAULTS = {"process-killed": kill_a_collector, "node-removed": remove_a_collectors_node}


# The local learning tests' runs and thresholds (PPO: tests/test_readme.py's quick start; SAC:
# tests/test_train_off_policy_learning.py's case, its 32 envs over two collectors), with one of the
# two collectors lost three iterations in (its process killed, or its whole node removed): learning
# goes on through its replacement, and the run stops once the mean return reaches the threshold
# (--target-return). PPO's is below the quick start's 350: where the replacement lands depends on
# timing, and one run so disturbed peaked at 317 (iteration 32), fell back to 117 and ended at 238;
# it passed 200 on its way up at iteration 30. A random policy scores ~25.
TARGETS = {"ppo": 200, "sac": 150}
LEARNING_RUNS = {
    "ppo": ["--algo", "ppo", "--envs", "128", "--collectors", "2", "--horizon", "32", "--max-iterations", "70",
            "--ppo.actor-hidden", "64", "64", "--ppo.critic-hidden", "64", "64", "--target-return", "200"],
    "sac": [*SAC, "--ray.collectors", "2", "--ray.envs-per-collector", "16", "--horizon", "50", "--max-iterations", "50",
            "--target-return", "150"],
}


@pytest.mark.parametrize(("algo", "fault"), [("ppo", "node-removed"), ("sac", "process-killed")])
def test_learns_cartpole_on_two_nodes_while_a_lost_collector_is_replaced(tmp_path, local_cluster, algo, fault):
    learner = hetlab_train(tmp_path, "--ray", local_cluster.address, *LEARNING_RUNS[algo], "--checkpoint-every", "1000")
    try:
        run_dir = logged(learner, 3)
        FAULTS[fault](local_cluster)
        _, _, stderr = finished(learner)
    finally:
        learner.kill()
    reason = {"process-killed": "was lost: exit type", "node-removed": "was lost: Ray lost contact with it"}[fault]
    assert reason in stderr and "replacing it (1 of at most 3)" in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    history = json.loads((run_dir / "history.json").read_text())
    returns = [row["mean_return"] for row in history]
    assert summary["stopped_by"] == "target_return", [round(r) for r in returns]
    assert returns[0] < 60 and returns[-1] >= TARGETS[algo]
    last = history[-1]
    assert last["ray/collectors_lost"] == 1 and last["ray/collectors_replaced"] == 1
    assert last["ray/lost_env_steps_at_most"] > 0 and last["ray/last_recovery_s"] > 0
    both_paths_taken(stderr, run_dir)
    assert segments_of(learner.pid) == []
    if algo == "ppo":
        assert summary["iterations"] <= 70 and summary["policy_lag_mean"] == 0.0
    else:
        config = json.loads((run_dir / "config.json").read_text())
        assert config["collectors"] == 2 and config["envs"] == 32
        assert summary["iterations"] <= 50 and last["updates"] == summary["iterations"] * 100


def test_with_no_restarts_a_lost_collector_stops_the_run_with_a_checkpoint(tmp_path, local_cluster):
    learner = hetlab_train(tmp_path, "--ray", local_cluster.address, "--ray.max-restarts", "0", *SMALL_PPO, "--envs", "32",
                           "--collectors", "2", "--horizon", "16", "--max-iterations", "100000", "--checkpoint-every", "1000")
    try:
        run_dir = logged(learner, 3)
        kill_a_collector(local_cluster)
        killed = time.monotonic()
        _, _, stderr = finished(learner, timeout=60)
        stopped = time.monotonic()
    finally:
        learner.kill()
    assert stopped - killed < 15
    assert "no replacements left (--ray.max-restarts 0): stopping the run" in stderr, stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "collectors_lost" and summary["iterations"] >= 3
    assert json.loads((run_dir / "checkpoint.json").read_text())["iteration"] == summary["iterations"]
    assert segments_of(learner.pid) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
        (["--ray", "no-port"], "is not local, auto or host:port"),
        (["--ray.collectors", "2"], "--ray.* options need --ray"),
        (["--ray", "local", "--algo", "sac", "--off-policy.inference", "learner"], "use collector or auto"),
        (["--ray", "local", "--collectors", "3", "--ray.collectors", "2"], "disagree"),
    ],
)
def test_bad_ray_options_fail_before_anything_starts(tmp_path, refusal, args, message):
    assert message in refusal("train", "--runs-dir", tmp_path / "runs", "--task", "cartpole-balance", *args)
    assert not (tmp_path / "runs").exists()


def test_more_collectors_than_the_cluster_has_cpus_is_refused(tmp_path, cluster):
    learner = hetlab_train(tmp_path, "--ray", cluster, "--ray.collectors", "3", "--envs", "24")
    _, stderr = learner.communicate(timeout=60)
    assert learner.returncode == 2 and "3 collectors need 3 CPUs, but the Ray cluster" in stderr and "has 2" in stderr
    assert not (tmp_path / "runs").exists()


def test_ray_missing_is_named_with_its_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is not installed
    with pytest.raises(UserError, match=r"pip install 'hetlab\[ray\]'"):
        train_in_process(TrainConfig(task="cartpole-balance", envs=16, ray="local", runs_dir=str(tmp_path / "runs")))
    assert not (tmp_path / "runs").exists()


def test_without_ray_nothing_imports_it():
    code = ("import sys, hetlab.cli, hetlab.train.launch, hetlab.runtime.pool; "
            "assert 'ray' not in sys.modules, 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_info_shows_the_clusters_nodes(cluster):
    result = subprocess.run([HETLAB, "info", "--ray", cluster, "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["ray_nodes"]
    assert len(nodes) == 2 and sum(node["cpus"] for node in nodes) == 2
    assert [node["learner"] for node in nodes].count(True) == 1
