"""HetlabVectorEnv against gymnasium's vector conventions, on real MuJoCo."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.passive_env_checker import check_obs, data_shares_objects
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import DictInfoToList, RecordEpisodeStatistics

from hetlab.tasks.gym_vector_env import HetlabVectorEnv

N = 4


def cartpole() -> HetlabVectorEnv:
    return HetlabVectorEnv("cartpole-balance", num_envs=N, threads=1)


def push_right(env: HetlabVectorEnv) -> np.ndarray:
    """Full force to the right: every pole falls within about 20 steps."""
    return np.ones((env.num_envs, 1), np.float32)


def step_until_done(env):
    """Step with `push_right` until some env finishes; returns that step's results."""
    for _ in range(100):
        obs, reward, terminated, truncated, info = env.step(push_right(env))
        if (terminated | truncated).any():
            return obs, reward, terminated, truncated, info
    raise AssertionError("no env finished in 100 steps")


@pytest.mark.filterwarnings("error")  # gymnasium's checkers warn; make every warning a failure
@pytest.mark.parametrize(("task", "obs_size", "critic_size", "action_size"), [
    ("cartpole-balance", 5, 5, 1),
    ("go1-joystick-flat", 48, 64, 12),
])
def test_spaces_shapes_and_dtypes(task, obs_size, critic_size, action_size):
    env = HetlabVectorEnv(task, num_envs=N, threads=1)
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.single_observation_space.shape == (obs_size,)
    assert env.single_observation_space.dtype == np.float32
    assert env.observation_space.shape == (N, obs_size)
    assert env.single_action_space.shape == (action_size,)
    assert (env.single_action_space.low == -1).all() and (env.single_action_space.high == 1).all()
    assert env.action_space.shape == (N, action_size)

    env.action_space.seed(0)
    previous = env.reset(seed=0)
    check_obs(previous[0], env.observation_space, "reset")
    assert previous[1]["critic"].shape == (N, critic_size)
    for _ in range(10):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        check_obs(obs, env.observation_space, "step")
        assert obs in env.observation_space
        assert reward.shape == (N,) and reward.dtype in (np.float32, np.float64)
        assert terminated.shape == truncated.shape == (N,)
        assert terminated.dtype == truncated.dtype == np.bool_
        assert info["critic"].shape == (N, critic_size) and info["_critic"].all()
        # Users keep what a step returns (rollout buffers), so the next step must not overwrite it.
        assert not data_shares_objects(previous, (obs, info))
        previous = (obs, info)
    env.close()
    assert env.closed


def rollout(env: HetlabVectorEnv, seed: int, steps: int = 60) -> tuple[np.ndarray, np.ndarray]:
    actions = np.random.default_rng(123).uniform(-1, 1, (steps, N, 1)).astype(np.float32)
    observations, rewards = [env.reset(seed=seed)[0]], []
    for action in actions:
        obs, reward, *_ = env.step(action)
        observations.append(obs)
        rewards.append(reward)
    return np.stack(observations), np.stack(rewards)


def test_reset_with_a_seed_makes_the_run_reproducible():
    env = cartpole()
    first_obs, first_rewards = rollout(env, seed=3)
    again_obs, again_rewards = rollout(env, seed=3)
    np.testing.assert_array_equal(first_obs, again_obs)
    np.testing.assert_array_equal(first_rewards, again_rewards)
    other_obs, _ = rollout(env, seed=4)
    assert not np.array_equal(first_obs, other_obs)


def test_finished_envs_reset_in_the_same_step_with_the_final_obs_in_info():
    env = cartpole()
    env.reset(seed=0)
    obs, _, terminated, truncated, info = step_until_done(env)
    done = terminated | truncated
    assert not done.all(), "the test needs some envs still running"

    np.testing.assert_array_equal(info["_final_obs"], done)
    np.testing.assert_array_equal(info["_final_info"], done)
    assert info["final_obs"].dtype == object and info["final_obs"].shape == (N,)
    for i in np.flatnonzero(~done):
        assert info["final_obs"][i] is None
    for i in np.flatnonzero(done):
        final = info["final_obs"][i]
        assert final.shape == (5,) and not np.allclose(final, obs[i])
        # Observation columns: cart x, cos(angle), sin(angle), x velocity, angle velocity.
        assert abs(final[2]) > np.sin(0.8) - 0.02, "the final obs is the fallen pole"
        assert abs(obs[i, 2]) < 0.15 and abs(obs[i, 0]) < 0.15, "the returned obs is a fresh start"
        np.testing.assert_allclose(info["final_info"]["critic"][i], final, atol=0.011)  # policy obs noise ±0.01
    assert info["final_info"]["_episode"].tolist() == done.tolist()
    assert (info["final_info"]["episode"]["l"][done] > 0).all()

    # gymnasium's own per-env view of the info reads it without complaint.
    list_info = DictInfoToList(env).step(push_right(env))[-1]
    assert len(list_info) == N and all("critic" in entry for entry in list_info)


def test_record_episode_statistics_matches_a_manual_sum():
    env = RecordEpisodeStatistics(cartpole())
    env.reset(seed=1)
    running_return, running_length = np.zeros(N), np.zeros(N, int)
    episodes = 0
    for _ in range(60):
        _, reward, terminated, truncated, info = env.step(push_right(env))
        running_return += reward
        running_length += 1
        done = terminated | truncated
        if done.any():
            np.testing.assert_array_equal(info["_episode"], done)
            np.testing.assert_allclose(info["episode"]["r"][done], running_return[done], rtol=1e-6)
            np.testing.assert_array_equal(info["episode"]["l"][done], running_length[done])
            # The task's own bookkeeping in final_info agrees with the wrapper's.
            np.testing.assert_allclose(info["final_info"]["episode"]["r"][done], running_return[done], rtol=1e-6)
            running_return[done], running_length[done] = 0.0, 0
            episodes += int(done.sum())
    assert episodes >= N, "every env should have finished at least one episode"


def test_bad_inputs_raise_clear_errors():
    env = cartpole()
    env.reset()
    with pytest.raises(ValueError, match=r"actions must have shape \(4, 1\), got \(4,\)"):
        env.step(np.zeros(N, np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.step(np.zeros((N, 2), np.float32))
    with pytest.raises(TypeError, match="one int"):
        env.reset(seed=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="no reset options"):
        env.reset(options={"reset_mask": np.ones(N, bool)})
