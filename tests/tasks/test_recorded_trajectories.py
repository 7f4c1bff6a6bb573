"""Every task's observations (both groups, the policy's noise included), rewards and terminations
reproduce a recorded trajectory, so a change to how tasks are declared cannot change what they compute.

`data/task_trajectories.npz` holds, per task, 2 envs of seed 3 stepped 40 times with uniform random
actions from numpy's default_rng(0) (recorded when observations became declared terms; cartpole and
both G1 tasks fall within it, so resets take part). `python tests/tasks/test_recorded_trajectories.py`
records it again after a deliberate change. The physics is deterministic for a seed and the actions
are fixed, so the tolerance only allows for other SIMD paths of numpy's exp, sin and sqrt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from hetlab.tasks import TASKS, make_task

RECORDED = Path(__file__).parent / "data" / "task_trajectories.npz"
ENVS, STEPS = 2, 40


def trajectory(name: str) -> dict[str, np.ndarray]:
    task = make_task(name, num_envs=ENVS, threads=1, seed=3)
    obs = task.reset()
    rng = np.random.default_rng(0)
    rows = {"policy": [obs["policy"]], "critic": [obs["critic"]], "reward": [], "terminated": []}
    for _ in range(STEPS):
        obs, reward, terminated, _, _ = task.step(rng.uniform(-1, 1, (ENVS, task.action_size)).astype(np.float32))
        for key, value in (("policy", obs["policy"]), ("critic", obs["critic"]), ("reward", reward),
                           ("terminated", terminated)):
            rows[key].append(value)
    return {key: np.stack(values) for key, values in rows.items()}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_task_reproduces_its_recorded_trajectory(name):
    recorded = np.load(RECORDED)
    replayed = trajectory(name)
    np.testing.assert_array_equal(replayed["terminated"], recorded[f"{name}/terminated"])
    for key in ("policy", "critic", "reward"):
        np.testing.assert_allclose(replayed[key], recorded[f"{name}/{key}"], rtol=1e-6, atol=1e-6, err_msg=key)


if __name__ == "__main__":
    np.savez_compressed(sys.argv[1] if len(sys.argv) > 1 else RECORDED,
                        **{f"{name}/{key}": value for name in sorted(TASKS) for key, value in trajectory(name).items()})
