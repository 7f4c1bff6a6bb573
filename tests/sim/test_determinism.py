"""A seed fixes a trajectory bit for bit, whatever the number of physics threads."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import mujoco
import numpy as np
import pytest

from hetlab.devices import cpu_count
from hetlab.sim import SIMS
from hetlab.tasks import make_task

needs_two_cores = pytest.mark.skipif(cpu_count() < 2, reason="make_task allows at most cpu_count() threads")


def _task_trajectory(name: str, threads: int, seed: int, steps: int, num_envs: int, **overrides):
    task = make_task(name, num_envs=num_envs, threads=threads, seed=seed, **overrides)
    assert task.sim.threads == threads  # really ran on that many threads
    actions = np.random.default_rng(1234).uniform(-1, 1, (steps, num_envs, task.action_size)).astype(np.float32)
    obs = task.reset()
    qpos, qvel, policy, critic, rewards, dones = [], [], [obs["policy"].copy()], [obs["critic"].copy()], [], []
    for a in actions:
        obs, reward, terminated, truncated, _ = task.step(a)
        qpos.append(task.sim.qpos.copy())
        qvel.append(task.sim.qvel.copy())
        policy.append(obs["policy"].copy())
        critic.append(obs["critic"].copy())
        rewards.append(reward.copy())
        dones.append(terminated | truncated)
    return {
        "qpos": np.stack(qpos), "qvel": np.stack(qvel), "policy": np.stack(policy),
        "critic": np.stack(critic), "reward": np.stack(rewards), "done": np.stack(dones),
    }


def _assert_identical(a: dict, b: dict) -> None:
    for key in a:
        assert np.array_equal(a[key], b[key]), f"{key} differs"


CASES = [
    # go1: random joystick actions on 16 robots; cartpole: long enough that poles fall and
    # envs auto-reset with seeded reset noise, so the reset path is covered too.
    pytest.param("go1-joystick-flat", 50, 16, id="go1"),
    pytest.param("cartpole-balance", 150, 16, id="cartpole"),
]


@needs_two_cores
@pytest.mark.parametrize(("name", "steps", "num_envs"), CASES)
def test_same_seed_same_trajectory_at_any_thread_count(name, steps, num_envs):
    one = _task_trajectory(name, threads=1, seed=7, steps=steps, num_envs=num_envs)
    two = _task_trajectory(name, threads=2, seed=7, steps=steps, num_envs=num_envs)
    _assert_identical(one, two)
    assert np.isfinite(one["qpos"]).all()
    assert not np.array_equal(one["qpos"][0], one["qpos"][-1])  # it did move
    if name == "cartpole-balance":
        assert one["done"].any(), "no env finished: the auto-reset path was not exercised"


@pytest.mark.parametrize(("name", "steps", "num_envs"), CASES)
def test_different_seed_different_trajectory(name, steps, num_envs):
    a = _task_trajectory(name, threads=1, seed=7, steps=10, num_envs=num_envs)
    b = _task_trajectory(name, threads=1, seed=8, steps=10, num_envs=num_envs)
    assert not np.array_equal(a["qpos"], b["qpos"])
    assert not np.array_equal(a["qvel"], b["qvel"])


@pytest.mark.parametrize(("name", "steps", "num_envs"), CASES)
def test_repeat_run_is_identical(name, steps, num_envs):
    a = _task_trajectory(name, threads=1, seed=3, steps=20, num_envs=num_envs)
    b = _task_trajectory(name, threads=1, seed=3, steps=20, num_envs=num_envs)
    _assert_identical(a, b)


def _noisy_reset_trajectory(backend_name: str, threads: int, xml: str) -> tuple[np.ndarray, np.ndarray]:
    """The toy scene stepped with noisy subset resets, in a process of its own (MotrixSim has one
    thread pool per process)."""
    sim = SIMS[backend_name].make(mujoco.MjSpec.from_string(xml), 12, threads=threads, seed=5, keyframe="start")
    rng = np.random.default_rng(0)
    qpos, qvel = [], []
    for step in range(40):
        if step % 10 == 5:
            ids = np.sort(rng.choice(12, 4, replace=False))
            sim.reset(ids, noise=0.2)
            sim.forward(ids)
        sim.step(rng.uniform(-1, 1, (12, sim.ctrl.shape[1])), 3)
        qpos.append(sim.qpos.copy())
        qvel.append(sim.qvel.copy())
    return np.stack(qpos), np.stack(qvel)


@pytest.mark.parametrize("name", [name for name, sim in SIMS.items() if sim.missing() is None and sim.steps_on_cpu])
def test_raw_sim_threads_and_noisy_resets(name, toy_scene):
    """The bare sim: 1 vs 2 threads (oversubscribing is fine here), with noisy subset resets."""
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        (q1, v1), (q2, v2) = pool.map(_noisy_reset_trajectory, [name, name], [1, 2], [toy_scene.spec.to_xml()] * 2)
    assert np.isfinite(q1).all() and not np.array_equal(q1[0], q1[-1])
    assert np.array_equal(q1, q2)
    assert np.array_equal(v1, v2)
