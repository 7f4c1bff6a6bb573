"""The G1 walking task: the gait clock and its foot-height target, pushes on schedule, actions
around the knees-bent pose."""

from __future__ import annotations

import numpy as np
import pytest

from hetlab.tasks import make_task
from hetlab.tasks.g1_walk import DEFAULT_POSE, swing_height_target

N = 4


def test_the_swing_target_rises_to_the_height_and_lands_smoothly():
    phase = np.array([-np.pi, -np.pi / 2, 0.0, np.pi / 2, np.pi - 1e-9])
    np.testing.assert_allclose(swing_height_target(phase, 0.15), [0.0, 0.075, 0.15, 0.075, 0.0], atol=1e-6)
    fine = np.linspace(-np.pi, np.pi, 2001)
    heights = swing_height_target(fine, 0.15)
    assert heights.min() >= 0.0 and heights.max() == pytest.approx(0.15)
    assert np.abs(np.diff(heights)).max() < 1e-3  # continuous, flat at lift-off, apex and landing


def test_actions_are_targets_around_the_knees_bent_pose():
    task = make_task("g1-walk-flat", num_envs=N, threads=1)
    task.reset()
    actions = np.zeros((N, 29), np.float32)
    actions[0, 3] = 1.0
    task.step(actions)
    np.testing.assert_allclose(task.sim.ctrl[1], DEFAULT_POSE)
    assert task.sim.ctrl[0, 3] == pytest.approx(DEFAULT_POSE[3] + 0.5)


def test_the_gait_clock_runs_half_a_cycle_apart_and_wraps():
    task = make_task("g1-walk-flat", num_envs=N, threads=1)
    task.reset()
    np.testing.assert_array_equal(task.phase, np.tile([0.0, np.pi], (N, 1)))
    frequency = task.phase_step / (2 * np.pi * task.dt)
    assert ((frequency >= 1.25) & (frequency <= 1.5)).all()
    zero = np.zeros((N, 29), np.float32)
    task.step(zero)
    expected = np.fmod(np.array([0.0, np.pi])[None] + task.phase_step[:, None] + np.pi, 2 * np.pi) - np.pi
    np.testing.assert_allclose(task.phase, expected)
    assert (task.phase >= -np.pi).all() and (task.phase < np.pi).all()


def test_a_push_kicks_the_pelvis_when_it_is_due():
    pushed = make_task("g1-walk-flat", num_envs=N, threads=1, seed=2)
    calm = make_task("g1-walk-flat", num_envs=N, threads=1, seed=2, pushes=False)
    for task in (pushed, calm):
        task.reset()
        assert ((task.push_interval >= 250) & (task.push_interval <= 500)).all()  # 5–10 s at 50 Hz
        task.steps_to_push[:] = 1000
        task.steps_to_push[2] = 1  # env 2's push is due after this step
    zero = np.zeros((N, 29), np.float32)
    pushed.step(zero)
    calm.step(zero)
    kick = pushed.sim.qvel[:, :2] - calm.sim.qvel[:, :2]
    slowest, fastest = pushed.cfg.push_speed
    assert fastest == 1.0 and slowest <= np.linalg.norm(kick[2]) <= fastest  # Holosoma's strongest push
    np.testing.assert_array_equal(np.delete(kick, 2, axis=0), 0.0)
    assert pushed.steps_to_push[2] == pushed.push_interval[2]


def test_the_penalty_curriculum_scales_the_penalties_pays_for_staying_up_and_resumes_exactly():
    curriculum = make_task("g1-walk-flat", num_envs=N, threads=1, seed=3)
    playground = make_task("g1-walk-flat", num_envs=N, threads=1, seed=3, penalty_curriculum=None)
    actions = np.random.default_rng(0).uniform(-0.3, 0.3, (N, 29)).astype(np.float32)
    curriculum.reset()
    playground.reset()
    scale = float(curriculum.curriculum.scale)
    assert scale == 0.1 and playground.curriculum is None
    terms = curriculum.step(actions)[4]["reward_terms"]
    full = playground.step(actions)[4]["reward_terms"]
    penalties = {name for name, term in curriculum.rewards.items() if term.penalty}
    in_full = {"termination", "joint_deviation_hip", "upper_body_pose"}
    assert penalties == {name for name, term in curriculum.rewards.items() if term.weight < 0} - in_full
    for name, value in full.items() - {"alive": 0.0}.items():
        expected = value * scale if name in penalties else value
        assert terms[name] == pytest.approx(expected, rel=1e-6, abs=1e-15), name  # action terms are float32
    assert terms["alive"] == pytest.approx(curriculum.dt) and full["alive"] == 0.0

    # Short episodes shrink the scale; the task's state carries it, so a resume continues exactly.
    state = None
    for step in range(120):
        if step == 60:
            state = curriculum.state_dict()
        curriculum.step(actions)
    assert float(curriculum.curriculum.scale) < scale
    again = make_task("g1-walk-flat", num_envs=N, threads=1, seed=3)
    again.load_state_dict(state)
    for _ in range(60):
        again.step(actions)
    assert float(again.curriculum.scale) == float(curriculum.curriculum.scale)
    assert float(again.curriculum.mean_length) == float(curriculum.curriculum.mean_length)


def test_the_averaged_yaw_rate_follows_the_gyro_and_starts_at_zero_in_each_episode():
    task = make_task("g1-walk-flat", num_envs=N, threads=1, seed=3)
    task.reset()
    rng = np.random.default_rng(0)
    expected = np.zeros(N)
    weight = task.dt / 0.5  # a 0.5-s time constant
    for _ in range(15):
        _, _, terminated, truncated, _ = task.step(rng.uniform(-0.3, 0.3, (N, 29)).astype(np.float32))
        expected += weight * (task._pelvis["gyro"][:, 2] - expected)
        expected[terminated | truncated] = 0.0  # a new episode
    assert np.abs(expected).max() > 0.05  # the pelvis turned
    np.testing.assert_allclose(task.yaw_rate_mean, expected, rtol=1e-12)
    np.testing.assert_allclose(task._obs["critic"][:, -1], expected, rtol=1e-6)  # the critic's last column
    # Its kernel: a command met on average scores 1 however the instantaneous rate sways.
    task.commands.values[:, 2] = task.yaw_rate_mean
    assert np.allclose(task.rewards["tracking_ang_vel_mean"].function(task, sigma=0.25), 1.0)
