"""Every registered task meets the Task contract; the Go1 task's commands and randomisation."""

from __future__ import annotations

import numpy as np
import pytest

from hetlab.devices import cpu_count
from hetlab.errors import UserError
from hetlab.tasks import TASKS, make_config, make_task
from hetlab.tasks.commands import VelocityCommandConfig, VelocityCommands
from hetlab.tasks.go1_joystick import KP, Go1JoystickFlat
from hetlab.tasks.randomisation import RandomisationConfig
from hetlab.tasks.rotations import quat_multiply

TASK_NAMES = sorted(TASKS)
N = 8


@pytest.fixture(params=TASK_NAMES)
def task_name(request) -> str:
    return request.param


def _check_obs(task, obs, n=None) -> None:
    n = task.num_envs if n is None else n
    assert set(obs) == set(task.obs_sizes)
    for group, size in task.obs_sizes.items():
        assert obs[group].shape == (n, size), group
        assert obs[group].dtype == np.float32, group
        assert np.isfinite(obs[group]).all(), group


# -- terminal states, per task: used where a test needs an episode to really end ----------


def _topple_cartpole(task, ids):
    hinge, _ = task.sim.joint_index("hinge")
    task.sim.qpos[ids, hinge] = 1.3  # past the 0.8 rad limit, and falling


def _flip_base(task, ids):
    task.sim.qpos[ids, 3:7] = [0.0, 1.0, 0.0, 0.0]  # upside down


def _drop_cube(task, ids):
    qpos, _ = task.sim.joint_index("cube_freejoint")
    task.sim.qpos[ids, qpos + 2] = -0.2  # below the palm, on its way to the floor


def _flip_about_own_x(task, ids):
    task.sim.qpos[ids, 3:7] = quat_multiply(task.sim.qpos[ids, 3:7], np.array([[0.0, 1.0, 0.0, 0.0]]).repeat(len(ids), 0))


def _reference_upside_down(final_critic):
    # Row 1, column 1 of the reference torso's rotation in the robot torso's frame: near 1 while
    # the robot follows it, near −1 once the robot is turned half over about its own x axis.
    return final_critic[:, 58 + 4] < 0.0


def _cartpole_ended(final_critic):
    return final_critic[:, 1] < np.cos(0.8)  # cos(pole angle)


def _base_upside_down(final_critic):
    return final_critic[:, 8] > 0.0  # projected gravity z: the trunk is upside down


def _cube_dropped(final_critic):
    return final_critic[:, 34] > 0.03 + 0.05  # palm z − cube z: the palm is at 0.03, the cube below −0.05


TERMINATE = {
    "cartpole-balance": (_topple_cartpole, _cartpole_ended),
    "go1-joystick-flat": (_flip_base, _base_upside_down),
    "g1-walk-flat": (_flip_base, _base_upside_down),  # projected gravity z is column 8 for both robots
    "g1-track-motion": (_flip_about_own_x, _reference_upside_down),
    "leap-cube-reorient": (_drop_cube, _cube_dropped),
}


def _terminate(task_name):
    if task_name not in TERMINATE:
        pytest.fail(f"add a way to end an episode of {task_name!r} to TERMINATE in {__file__}")
    return TERMINATE[task_name]


# -- the step contract ----------------------------------------------------------------------


def test_step_contract(make_task_on, random_actions, task_name):
    task = make_task_on(task_name, num_envs=N, seed=1)
    assert set(task.reward_weights)
    assert task.max_episode_steps == round(task.episode_seconds / task.dt)
    assert task.dt == pytest.approx(task.substeps * task.sim.timestep)
    assert task.dt == pytest.approx(task.control_dt, rel=0.1)
    _check_obs(task, task.reset())
    for actions in random_actions(task, 25, scale=0.5):
        obs, reward, terminated, truncated, info = task.step(actions)
        _check_obs(task, obs)
        assert reward.shape == (N,) and reward.dtype == np.float32
        assert np.isfinite(reward).all()
        for flags in (terminated, truncated):
            assert flags.shape == (N,) and flags.dtype == bool
        assert not (terminated & truncated).any()
        assert info["diverged"] == 0
        # named terms: exactly the weighted ones, summing to the mean reward (before any floor)
        terms = info["reward_terms"]
        assert set(terms) == set(task.reward_weights)
        assert all(isinstance(v, float) and np.isfinite(v) for v in terms.values())
        if task.reward_floor is None:
            assert sum(terms.values()) == pytest.approx(float(reward.mean()), rel=1e-5, abs=1e-6)
        else:
            assert (reward >= task.reward_floor).all()
            assert float(reward.mean()) >= sum(terms.values()) - 1e-6
        done = terminated | truncated
        if done.any():
            np.testing.assert_array_equal(info["done_ids"], np.flatnonzero(done))
        else:
            assert not {"done_ids", "final_obs", "episode_return", "episode_length"} & set(info)


def test_reward_terms_follow_the_weights(make_task_on, random_actions, task_name):
    """Scaling one weight scales exactly that term's logged mean."""
    task = make_task_on(task_name, num_envs=N)
    other = make_task_on(task_name, num_envs=N)
    term = next(iter(task.reward_weights))
    other.reward_weights = {**task.reward_weights, term: 3.0 * task.reward_weights[term]}
    task.reset()
    other.reset()
    for actions in random_actions(task, 3, scale=0.3):
        _, _, _, _, info = task.step(actions)
        _, _, _, _, info_other = other.step(actions)
        for name, value in info["reward_terms"].items():
            factor = 3.0 if name == term else 1.0
            assert info_other["reward_terms"][name] == pytest.approx(factor * value, rel=1e-9, abs=1e-12)


def test_misuse_raises(make_task_on, task_name):
    task = make_task_on(task_name, num_envs=2)
    with pytest.raises(RuntimeError, match="reset"):
        task.step(np.zeros((2, task.action_size), np.float32))
    task.reset()
    with pytest.raises(ValueError, match="shape"):
        task.step(np.zeros((3, task.action_size), np.float32))


# -- auto-reset -----------------------------------------------------------------------------


def test_time_limit_auto_reset_keeps_final_obs(make_task_on, random_actions, task_name):
    """Truncate every env after 3 steps; a twin run without the limit shows what the final
    observation must have been, bit for bit (same seed, same actions, same draws until then)."""
    limit = 3
    task = make_task_on(task_name, num_envs=N, seed=4)
    twin = make_task_on(task_name, num_envs=N, seed=4)
    task.max_episode_steps = limit
    task.reset()
    twin.reset()
    returns = np.zeros(N)
    for step, actions in enumerate(random_actions(task, limit, scale=0.2), start=1):
        obs, reward, terminated, truncated, info = task.step(actions)
        twin_obs, twin_reward, *_ = twin.step(actions)
        returns += reward
        if step < limit:
            assert not (terminated | truncated).any()
            for group in obs:
                np.testing.assert_array_equal(obs[group], twin_obs[group])
    assert not terminated.any()
    assert truncated.all()
    np.testing.assert_array_equal(info["done_ids"], np.arange(N))
    _check_obs(task, info["final_obs"])
    for group in twin_obs:
        np.testing.assert_array_equal(info["final_obs"][group], twin_obs[group])
        assert not np.array_equal(obs[group], twin_obs[group])  # the returned obs are new episodes'
    np.testing.assert_array_equal(info["episode_length"], np.full(N, limit))
    np.testing.assert_allclose(info["episode_return"], returns, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(task.episode_step, 0)
    # the new episodes run on, and end again after `limit` more steps
    for step, actions in enumerate(random_actions(task, limit, seed=1, scale=0.2), start=1):
        _, _, terminated, truncated, info = task.step(actions)
        assert truncated.all() == (step == limit)


def test_termination_auto_reset(make_task_on, task_name):
    end, ended = _terminate(task_name)
    task = make_task_on(task_name, num_envs=N, seed=5)
    task.reset()
    zero = np.zeros((N, task.action_size), np.float32)
    task.step(zero)
    ids = np.array([1, 6])
    end(task, ids)
    obs, reward, terminated, truncated, info = task.step(zero)
    np.testing.assert_array_equal(np.flatnonzero(terminated), ids)
    assert not truncated.any()
    assert np.isfinite(reward).all()
    np.testing.assert_array_equal(info["done_ids"], ids)
    np.testing.assert_array_equal(info["episode_length"], [2, 2])
    final = info["final_obs"]
    _check_obs(task, final, n=2)
    assert ended(final["critic"]).all()  # the final obs show the terminal state ...
    assert not ended(obs["critic"]).any()  # ... the returned ones the new episodes' start
    np.testing.assert_array_equal(task.episode_step[ids], 0)
    np.testing.assert_array_equal(task.episode_step[[0, 2, 3, 4, 5, 7]], 2)


def test_termination_wins_over_truncation_at_the_limit(make_task_on, task_name):
    end, _ = _terminate(task_name)
    task = make_task_on(task_name, num_envs=N)
    task.max_episode_steps = 2
    task.reset()
    zero = np.zeros((N, task.action_size), np.float32)
    task.step(zero)
    end(task, np.array([0]))
    _, _, terminated, truncated, info = task.step(zero)
    assert terminated[0] and not truncated[0]
    assert truncated[1:].all() and not terminated[1:].any()
    np.testing.assert_array_equal(info["done_ids"], np.arange(N))


def test_cartpole_times_out_exactly_at_the_episode_limit(make_task_on):
    """Upright, at rest and unpushed, the pole never falls: only the time limit ends it."""
    task = make_task_on("cartpole-balance", num_envs=2, reset_noise=0.0)
    task.reset()
    zero = np.zeros((2, 1), np.float32)
    limit = task.max_episode_steps
    assert limit == 500
    for step in range(1, limit + 1):
        _, _, terminated, truncated, info = task.step(zero)
        assert not terminated.any(), f"the pole fell at step {step}"
        if step < limit:
            assert not truncated.any(), f"truncated early, at step {step}"
    assert truncated.all()
    np.testing.assert_array_equal(info["episode_length"], [limit, limit])
    np.testing.assert_array_equal(task.episode_step, 0)


# -- observation noise ---------------------------------------------------------------------


def test_zero_obs_noise_gives_exact_policy_obs(make_task_on, random_actions, task_name):
    """Both tasks put the policy's observation first in the critic's, without noise."""
    task = make_task_on(task_name, num_envs=N, obs_noise=0.0)
    k = task.obs_sizes["policy"]
    obs = task.reset()
    np.testing.assert_array_equal(obs["policy"], obs["critic"][:, :k])
    for actions in random_actions(task, 5, scale=0.3):
        obs, *_ = task.step(actions)
        np.testing.assert_array_equal(obs["policy"], obs["critic"][:, :k])


def test_obs_noise_level_scales_the_noise(make_task_on, random_actions, task_name):
    """The same seed draws the same noise; obs_noise multiplies it."""
    one = make_task_on(task_name, num_envs=N, obs_noise=1.0)
    two = make_task_on(task_name, num_envs=N, obs_noise=2.0)
    k = one.obs_sizes["policy"]
    obs1, obs2 = one.reset(), two.reset()
    for actions in [None, *random_actions(one, 3, scale=0.3)]:
        if actions is not None:
            obs1, *_ = one.step(actions)
            obs2, *_ = two.step(actions)
        np.testing.assert_array_equal(obs1["critic"], obs2["critic"])
        noise1 = obs1["policy"] - obs1["critic"][:, :k]
        noise2 = obs2["policy"] - obs2["critic"][:, :k]
        assert np.abs(noise1).max() > 0
        np.testing.assert_allclose(noise2, 2.0 * noise1, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["cartpole-balance", "go1-joystick-flat", "g1-walk-flat", "g1-track-motion",
                                  "leap-cube-reorient"])
def test_obs_noise_stays_within_its_declared_scales(make_task_on, random_actions, name):
    task = make_task_on(name, num_envs=32)
    scales = task.observations.policy_noise
    k = task.obs_sizes["policy"]
    noise = []
    obs = task.reset()
    for actions in [None, *random_actions(task, 4, scale=0.3)]:
        if actions is not None:
            obs, *_ = task.step(actions)
        noise.append(obs["policy"] - obs["critic"][:, :k])
    noise = np.concatenate(noise)
    assert np.all(np.abs(noise) <= scales * (1 + 1e-5) + 1e-6)
    np.testing.assert_array_equal(noise[:, scales == 0], 0.0)
    # uniform over ± scale: the extremes come near the bounds
    noisy = scales > 0
    assert np.all(np.abs(noise[:, noisy]).max(axis=0) > 0.8 * scales[noisy])


# -- domain randomisation (go1) -----------------------------------------------------------


def _go1_fields(task):
    sim = task.sim
    floor = sim.object_id("geom", "floor")
    friction = sim.model_field("geom_friction")[:, floor, 0].copy()
    mass = sim.model_field("body_mass").copy()
    gain = sim.model_field("actuator_gainprm")[:, :, 0].copy()
    bias = sim.model_field("actuator_biasprm")[:, :, 1].copy()
    return friction, mass, gain, bias


@pytest.fixture(scope="module")
def go1_nominal():
    model = Go1JoystickFlat.build_model(Go1JoystickFlat.Config())
    return model.geom_friction[model.geom("floor").id, 0], model.body_mass.copy()


@pytest.mark.parametrize(
    "ranges",
    [RandomisationConfig(), RandomisationConfig(friction=(0.7, 0.8), mass_scale=(1.2, 1.3), gain_scale=(0.5, 0.6))],
    ids=["default", "custom"],
)
def test_go1_randomisation_draws_per_env_values_in_range(make_task_on, go1_nominal, ranges):
    n = 16
    task = make_task_on("go1-joystick-flat", num_envs=n, randomisation=ranges)
    obs = task.reset()
    friction, mass, gain, bias = _go1_fields(task)
    _, nominal_mass = go1_nominal
    heavy = nominal_mass > 0
    scale = mass[:, heavy] / nominal_mass[heavy]
    kp_scale = gain / KP
    for values, (low, high) in [
        (friction, ranges.friction), (scale[:, 0], ranges.mass_scale), (kp_scale[:, 0], ranges.gain_scale)
    ]:
        assert np.all((values >= low) & (values <= high))
        assert len(np.unique(values)) == n  # a draw per env
    # one factor per env for every link, and for every actuator
    np.testing.assert_allclose(scale, np.broadcast_to(scale[:, :1], scale.shape), rtol=1e-12)
    np.testing.assert_array_equal(mass[:, ~heavy], 0.0)
    np.testing.assert_allclose(kp_scale, np.broadcast_to(kp_scale[:, :1], kp_scale.shape), rtol=1e-12)
    np.testing.assert_array_equal(bias, -gain)  # a position actuator keeps kp·(ctrl − q)
    # the critic sees the drawn parameters
    np.testing.assert_allclose(obs["critic"][:, -3:], np.stack([friction, scale[:, 0], kp_scale[:, 0]], 1), rtol=1e-6)
    # drawn once: later resets keep them
    task.reset()
    for before, after in zip((friction, mass, gain), _go1_fields(task)[:3]):
        np.testing.assert_array_equal(before, after)


def test_go1_without_randomisation_is_nominal(make_task_on, go1_nominal):
    task = make_task_on("go1-joystick-flat", num_envs=4, randomise=False)
    task.reset()
    friction, mass, gain, bias = _go1_fields(task)
    nominal_friction, nominal_mass = go1_nominal
    np.testing.assert_array_equal(friction, nominal_friction)
    np.testing.assert_array_equal(mass, np.tile(nominal_mass, (4, 1)))
    np.testing.assert_array_equal(gain, KP)
    np.testing.assert_array_equal(bias, -KP)


def test_go1_critic_friction_column_is_the_actual_friction(make_task_on, go1_nominal):
    task = make_task_on("go1-joystick-flat", num_envs=2, randomise=False)
    obs = task.reset()
    np.testing.assert_allclose(obs["critic"][:, -3], go1_nominal[0], rtol=1e-6)


def test_go1_randomisation_changes_the_dynamics(make_task_on):
    """Two envs from the same start, same actions: different drawn parameters, different motion."""
    task = make_task_on("go1-joystick-flat", num_envs=2, seed=3)
    nominal = make_task_on("go1-joystick-flat", num_envs=2, seed=3, randomise=False)
    task.reset()
    nominal.reset()
    for t in (task, nominal):  # the same start state in every env
        t.sim.qpos[:] = t.sim.qpos[0]
        t.sim.qvel[:] = 0.0
        t.sim.forward(np.arange(2))
    actions = np.tile(np.random.default_rng(0).uniform(-0.5, 0.5, 12).astype(np.float32), (2, 1))
    for _ in range(10):
        task.step(actions)
        nominal.step(actions)
    assert not np.array_equal(task.sim.qpos[0], task.sim.qpos[1])
    np.testing.assert_array_equal(nominal.sim.qpos[0], nominal.sim.qpos[1])


# -- velocity commands (go1) ---------------------------------------------------------------


def _in_range(values: np.ndarray, cfg: VelocityCommandConfig) -> np.ndarray:
    low = np.array([cfg.lin_vel_x[0], cfg.lin_vel_y[0], cfg.yaw_rate[0]])
    high = np.array([cfg.lin_vel_x[1], cfg.lin_vel_y[1], cfg.yaw_rate[1]])
    return np.all((values >= low) & (values <= high), axis=1)


def test_go1_commands_resample_on_schedule(make_task_on):
    cfg = VelocityCommandConfig(
        lin_vel_x=(0.2, 0.5), lin_vel_y=(-0.3, -0.1), yaw_rate=(0.5, 1.0), resample_seconds=0.1, stand_still_probability=0.0
    )
    task = make_task_on("go1-joystick-flat", num_envs=N, commands=cfg)
    period = task.commands.resample_steps
    assert period == 5  # 0.1 s at 50 Hz
    obs = task.reset()
    values = task.commands.values
    assert _in_range(values, cfg).all()
    assert len(np.unique(values[:, 0])) == N
    zero = np.zeros((N, 12), np.float32)
    changes = 0
    for _ in range(3 * period + 2):
        before = values.copy()
        obs, _, terminated, truncated, info = task.step(zero)
        running = ~(terminated | truncated)
        due = running & (task.episode_step % period == 0)
        changed = np.any(task.commands.values != before, axis=1)
        np.testing.assert_array_equal(changed[running], due[running])
        changes += due.sum()
        assert _in_range(task.commands.values, cfg).all()
        np.testing.assert_array_equal(obs["critic"][:, 45:48], task.commands.values)
        np.testing.assert_array_equal(obs["policy"][:, 45:48], task.commands.values)  # never noised
    assert changes >= 3 * (N - 2)


def test_go1_reset_resamples_the_ended_envs_command(make_task_on):
    task = make_task_on("go1-joystick-flat", num_envs=N)
    task.reset()
    zero = np.zeros((N, 12), np.float32)
    task.step(zero)
    before = task.commands.values.copy()
    _flip_base(task, np.array([3]))
    _, _, terminated, _, _ = task.step(zero)
    assert terminated[3]
    changed = np.any(task.commands.values != before, axis=1)
    assert changed[3] or not before[3].any()  # a stand-still draw may repeat zeros
    np.testing.assert_array_equal(changed[[0, 1, 2, 4, 5, 6, 7]], False)


@pytest.mark.parametrize("probability", [0.0, 0.3, 1.0])
def test_command_stand_still_share(probability):
    cfg = VelocityCommandConfig(stand_still_probability=probability)
    commands = VelocityCommands(cfg, 4000, 0.02, np.random.default_rng(0))
    commands.resample(np.arange(4000))
    still = ~commands.values.any(axis=1)
    assert still.mean() == pytest.approx(probability, abs=0.03)
    assert _in_range(commands.values[~still], cfg).all()
    assert commands.values.dtype == np.float32


# -- make_task / make_config errors -------------------------------------------------------


def _one_line_user_error(fn, *needles):
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert str(needle) in message, f"{needle!r} not in {message!r}"
    return message


def test_unknown_task_lists_the_known_ones():
    _one_line_user_error(lambda: make_task("no-such-task"), "no-such-task", *TASKS)


def test_unknown_option_is_named():
    _one_line_user_error(lambda: make_task("cartpole-balance", num_envz=4), "num_envz", "num_envs")


@pytest.mark.parametrize("num_envs", [0, -1])
def test_no_envs(num_envs):
    _one_line_user_error(lambda: make_task("cartpole-balance", num_envs=num_envs), str(num_envs))


@pytest.mark.parametrize("threads", [cpu_count() + 1, -1])
def test_threads_outside_the_cores(threads):
    _one_line_user_error(lambda: make_task("cartpole-balance", num_envs=2, threads=threads), str(threads), cpu_count())


def test_config_validates_before_building(task_name):
    cfg = make_config(task_name, num_envs=3, threads=cpu_count(), seed=9)
    assert isinstance(cfg, TASKS[task_name].Config)
    assert (cfg.num_envs, cfg.threads, cfg.seed) == (3, cpu_count(), 9)
    with pytest.raises(UserError):
        make_config(task_name, num_envs=0)


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_actions_beyond_the_unit_box_are_clipped(task_name):
    runs = []
    for scale in (1.0, 5.0):
        task = make_task(task_name, num_envs=4, seed=0)
        task.reset()
        actions = np.sign(np.random.default_rng(0).normal(size=(4, task.action_size))).astype(np.float32)
        obs, reward, *_ = task.step(scale * actions)
        runs.append((task.sim.qpos.copy(), reward, obs["policy"], task.last_actions.copy()))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert np.abs(runs[1][3]).max() == 1.0  # the observed last action is the clipped one
