"""Left-right symmetry: a task's declared mirrors match what MuJoCo computes for the mirrored state."""

from __future__ import annotations

import numpy as np
import pytest

from hetlab.tasks import make_task, task_class
from hetlab.tasks.symmetry import VECTOR, VELOCITY_COMMAND, Mirror

SYMMETRIC = ("cartpole-balance", "go1-joystick-flat", "g1-walk-flat")


def test_which_tasks_are_symmetric():
    # A motion clip and the LEAP hand are not the same in a mirror.
    assert {name for name in ("cartpole-balance", "go1-joystick-flat", "g1-walk-flat", "g1-track-motion",
                              "leap-cube-reorient") if task_class(name).mirror() is not None} == set(SYMMETRIC)


@pytest.mark.parametrize("name", SYMMETRIC)
def test_mirrors_are_involutions_of_the_right_size(name):
    cls = task_class(name)
    mirror = cls.mirror()
    assert {group: m.size for group, m in mirror.obs.items()} == cls.obs_sizes
    assert mirror.action.size == cls.action_size
    x = np.random.default_rng(0).normal(size=(4, cls.obs_sizes["critic"]))
    assert np.array_equal(mirror.obs["critic"](mirror.obs["critic"](x)), x)
    assert not np.array_equal(mirror.obs["critic"](x), x)
    # The policy's columns come first in the critic's observation, and mirror the same way there.
    policy = cls.obs_sizes["policy"]
    assert np.array_equal(mirror.obs["critic"](x)[:, :policy], mirror.obs["policy"](x[:, :policy]))


def test_a_mirror_that_is_not_an_involution_is_refused():
    with pytest.raises(ValueError, match="applied twice"):
        Mirror((1, 2, 0), (1.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="applied twice"):
        Mirror((1, 0), (1.0, -1.0))
    with pytest.raises(ValueError, match="permute"):
        Mirror((0, 0), (1.0, 1.0))


def _mirror_free_body(qpos: np.ndarray, qvel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A free joint's state reflected about the world's x–z plane: position and linear velocity
    (world frame) lose y; the orientation's quaternion loses x and z; the angular velocity (body
    frame, itself mirrored) loses x and z."""
    return (np.concatenate([VECTOR(qpos[:3]), qpos[3:7] * [1, -1, 1, -1]]),
            np.concatenate([VECTOR(qvel[:3]), -VECTOR(qvel[3:6])]))


def _mirror_env_0_into_env_1(task) -> None:
    """Write into env 1 the mirror image of env 0: physics, controls and the task's own state."""
    mirror = task.mirror()
    sim = task.sim
    if task.name == "cartpole-balance":
        sim.qpos[1], sim.qvel[1], sim.ctrl[1] = -sim.qpos[0], -sim.qvel[0], -sim.ctrl[0]
    else:
        joints = mirror.action  # the joints in actuator order, which is also their order in qpos after the free joint
        root_qpos, root_qvel = _mirror_free_body(sim.qpos[0, :7], sim.qvel[0, :6])
        sim.qpos[1] = np.concatenate([root_qpos, joints(sim.qpos[0, 7:])])
        sim.qvel[1] = np.concatenate([root_qvel, joints(sim.qvel[0, 6:])])
        sim.ctrl[1] = joints(sim.ctrl[0])
        task.commands.values[1] = VELOCITY_COMMAND(task.commands.values[0])
        feet = Mirror.of_items([1, 0] if task.name == "g1-walk-flat" else [1, 0, 3, 2], Mirror.same(1))
        for array in (task.feet.air_time, task.feet.swing_peak, task.feet.last_contact):
            array[1] = feet(array[0])
        if task.name == "g1-walk-flat":
            task.phase[1] = feet(task.phase[0])
            task.yaw_rate_mean[1] = -task.yaw_rate_mean[0]
    task.last_actions[1] = mirror.action(task.last_actions[0])


@pytest.mark.parametrize("name", SYMMETRIC)
def test_the_mirrored_state_observes_as_the_mirror_says(name):
    """Env 1 is set to env 0's mirror image mid-episode; MuJoCo's sensors then read, in env 1, env 0's
    observations mirrored by the task's declared mirrors: every sign and every swapped column checked."""
    task = make_task(name, num_envs=2, obs_noise=0.0, randomise=False)
    task.reset()
    rng = np.random.default_rng(1)
    for _ in range(25):  # far enough into an episode that every velocity, contact and timer has moved
        task.step(rng.uniform(-0.5, 0.5, (2, task.action_size)).astype(np.float32))
    _mirror_env_0_into_env_1(task)
    task.sim.forward(np.arange(2))
    if hasattr(task, "_update_state"):  # the quantities a step derives from the physics, for both envs alike
        task._update_state(task.last_actions)
    critic = task._observe(np.arange(2))["critic"]
    expected = task.mirror().obs["critic"](critic[0])
    tolerance = 2e-3 * np.maximum(np.abs(critic[0]), 1.0)
    # The G1's contact solver runs 3 iterations from each env's own last solution (its warm start), which
    # env 1 did not inherit: accelerations differ by up to 0.26 m/s² (MuJoCo from scratch: 0.006).
    # A wrong sign would differ by twice the value.
    tolerance[_columns(task, "accelerometer")] = 0.5
    columns = np.flatnonzero(np.abs(critic[1] - expected) > tolerance)
    assert columns.size == 0, f"columns {columns}: {critic[1][columns]} against the mirror's {expected[columns]}"
    assert not np.allclose(critic[0], critic[1])  # env 0 is not its own mirror image


def _columns(task, term_name: str) -> slice:
    start = 0
    for term in task.observations.policy + task.observations.privileged:
        if term.name == term_name:
            return slice(start, start + term.size)
        start += term.size
    return slice(0, 0)


@pytest.mark.parametrize("name", SYMMETRIC)
def test_the_mirrored_state_earns_the_same_reward(name):
    """One step from a state and from its mirror image, with mirrored actions: the same reward."""
    task = make_task(name, num_envs=2, obs_noise=0.0, randomise=False)
    task.reset()
    rng = np.random.default_rng(2)
    for _ in range(25):
        task.step(rng.uniform(-0.5, 0.5, (2, task.action_size)).astype(np.float32))
    _mirror_env_0_into_env_1(task)
    task.sim.forward(np.arange(2))
    action = rng.uniform(-0.5, 0.5, task.action_size).astype(np.float32)
    _, reward, terminated, _, _ = task.step(np.stack([action, task.mirror().action(action)]))
    assert terminated[0] == terminated[1]
    assert reward[1] == pytest.approx(reward[0], rel=1e-3, abs=1e-5)
