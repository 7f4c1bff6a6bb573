"""The LEAP cube task: relative joint targets, goals that count and move on, episodes that end
when the cube falls, and the goals reached per episode in info."""

from __future__ import annotations

import numpy as np
import pytest

from hetlab.tasks import make_task
from hetlab.tasks.leap_cube_reorient import JOINT_HIGH, JOINT_LOW, SUCCESS_BONUS
from hetlab.tasks.rotations import quat_angle, quat_conjugate, quat_multiply

N = 4


@pytest.fixture(scope="module")
def task():
    return make_task("leap-cube-reorient", num_envs=N, threads=1, seed=3)


def test_actions_move_the_previous_targets_within_the_joint_ranges(task):
    task.reset()
    before = task.sim.ctrl.copy()
    actions = np.zeros((N, 16), np.float32)
    actions[0, 0], actions[1, 1] = 0.4, -1.0
    task.step(actions)
    expected = np.clip(before + 0.5 * actions, JOINT_LOW, JOINT_HIGH)
    np.testing.assert_allclose(task.sim.ctrl, expected)
    task.step(np.ones((N, 16), np.float32))  # far past the upper ranges after a few steps
    for _ in range(10):
        task.step(np.ones((N, 16), np.float32))
    np.testing.assert_allclose(task.sim.ctrl, np.tile(JOINT_HIGH, (N, 1)))


def set_goal_to_where_the_cube_ends_the_next_step(task, env: int, actions: np.ndarray) -> None:
    state = task.state_dict()
    task.step(actions)
    cube = task._cube_quat[env].copy()
    task.load_state_dict(state)
    task._goal_quat[env] = cube


def test_a_reached_goal_pays_the_bonus_once_and_a_new_goal_follows(task):
    task.reset()
    zero = np.zeros((N, 16), np.float32)
    task.step(zero)
    set_goal_to_where_the_cube_ends_the_next_step(task, 1, zero)
    goal = task._goal_quat
    _, reward, terminated, _, info = task.step(zero)
    assert info["reward_terms"]["success"] == pytest.approx(SUCCESS_BONUS / N)
    assert reward[1] > SUCCESS_BONUS > np.abs(np.delete(reward, 1)).max()
    np.testing.assert_array_equal(task.goals, [0, 1, 0, 0])
    # A new goal, drawn uniformly: almost surely far from the cube.
    assert quat_angle(quat_multiply(task._cube_quat[1:2], quat_conjugate(goal[1:2])))[0] > 0.1
    _, _, _, _, info = task.step(zero)
    assert info["reward_terms"]["success"] == 0.0


def test_an_ended_episode_reports_its_goals_and_the_count_restarts(task):
    task.reset()
    zero = np.zeros((N, 16), np.float32)
    task.step(zero)
    set_goal_to_where_the_cube_ends_the_next_step(task, 2, zero)
    task.step(zero)
    qpos, _ = task.sim.joint_index("cube_freejoint")
    task.sim.qpos[[0, 2], qpos + 2] = -0.2
    _, _, terminated, _, info = task.step(zero)
    np.testing.assert_array_equal(np.flatnonzero(terminated), [0, 2])
    np.testing.assert_array_equal(info["episode_metrics"]["goals"], [0, 1])
    np.testing.assert_array_equal(task.goals, 0)
    # The new episodes start with the cube above the palm and the targets at the fingers.
    assert (task.sim.qpos[[0, 2], qpos + 2] > 0.03).all()


def test_tasks_without_episode_metrics_report_none():
    cartpole = make_task("cartpole-balance", num_envs=2, threads=1)
    cartpole.reset()
    cartpole.sim.qpos[:, 1] = 1.3
    *_, info = cartpole.step(np.zeros((2, 1), np.float32))
    assert info["episode_metrics"] == {}
