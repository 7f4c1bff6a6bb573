"""The ALOHA transfer-cube env: gym-aloha's cube sampling, seeding, observations, actions and time limit."""

from __future__ import annotations

import importlib
import time

import gymnasium
import numpy as np
import pytest

import hetlab.aloha
from hetlab.aloha.env import EPISODE_STEPS, AlohaTransferCube, normalise_gripper, unnormalise_gripper
from hetlab.errors import UserError

# gym-aloha 0.1.5, utils.sample_box_pose: x, y, z ranges of the cube's starting position.
GYM_ALOHA_LOW = np.array([0.0, 0.4, 0.05])
GYM_ALOHA_HIGH = np.array([0.2, 0.6, 0.05])


@pytest.fixture(scope="module")
def env():
    env = AlohaTransferCube(cameras=())
    yield env
    env.close()


def cube_pose(env: AlohaTransferCube) -> np.ndarray:
    return env.data.qpos[env.cube_qpos : env.cube_qpos + 7].copy()


def test_cube_starts_anywhere_in_gym_alohas_box_and_unrotated(env):
    poses = []
    for seed in range(300):
        env.reset(seed=seed)
        poses.append(cube_pose(env))
    poses = np.array(poses)
    assert np.all(poses[:, :3] >= GYM_ALOHA_LOW) and np.all(poses[:, :3] <= GYM_ALOHA_HIGH)
    np.testing.assert_array_equal(poses[:, 3:], np.tile([1.0, 0.0, 0.0, 0.0], (len(poses), 1)))
    # The samples cover the range, not one corner of it: 300 uniform draws span ≥ 95 % of each side.
    spread = poses[:, :2].max(axis=0) - poses[:, :2].min(axis=0)
    assert np.all(spread >= 0.95 * (GYM_ALOHA_HIGH - GYM_ALOHA_LOW)[:2])
    assert len({tuple(p) for p in poses[:, :2].round(6)}) == len(poses)


def test_reset_is_deterministic_per_seed(env):
    first, _ = env.reset(seed=11)
    cube = cube_pose(env)
    for _ in range(5):
        env.step(first["agent_pos"] + 0.1)
    again, _ = env.reset(seed=11)
    np.testing.assert_array_equal(again["agent_pos"], first["agent_pos"])
    np.testing.assert_array_equal(cube_pose(env), cube)
    other = AlohaTransferCube(cameras=())
    other.reset(seed=11)
    np.testing.assert_array_equal(cube_pose(other), cube)
    other.reset(seed=12)
    assert not np.array_equal(cube_pose(other), cube)


def test_state_only_observation_and_steps(env):
    obs, info = env.reset(seed=0)
    assert set(obs) == {"agent_pos"} and info == {"is_success": False}
    assert obs["agent_pos"].shape == (14,) and obs["agent_pos"].dtype == np.float64
    assert env.observation_space.contains(obs)
    obs, reward, terminated, truncated, info = env.step(obs["agent_pos"])
    assert reward == 0.0 and not terminated and not truncated and info == {"is_success": False}


def test_camera_observation_shapes_and_content():
    env = AlohaTransferCube(height=96, width=128)
    try:
        obs, _ = env.reset(seed=0)
        assert set(obs) == {"pixels", "agent_pos"} and set(obs["pixels"]) == {"top"}
        image = obs["pixels"]["top"]
        assert image.shape == (96, 128, 3) and image.dtype == np.uint8
        assert env.observation_space.contains(obs)
        assert image.std() > 10  # a lit scene, not a blank frame
        obs, *_ = env.step(obs["agent_pos"])
        assert obs["pixels"]["top"].shape == (96, 128, 3)
    finally:
        env.close()


@pytest.mark.serial
def test_fast_render_quality_draws_the_same_scene_without_shadows_several_times_quicker():
    def frames_and_seconds(quality: str) -> tuple[np.ndarray, float]:
        env = AlohaTransferCube(height=120, width=160, render_quality=quality)
        try:
            image = env.reset(seed=0)[0]["pixels"]["top"]
            seconds = []
            for _ in range(15):
                started = time.perf_counter()
                env.render()
                seconds.append(time.perf_counter() - started)
            return image.astype(np.int16), float(np.median(seconds))
        finally:
            env.close()

    (high, high_s), (fast, fast_s) = frames_and_seconds("high"), frames_and_seconds("fast")
    difference = np.abs(high - fast)
    # The same view (most pixels equal) with the arms' shadows and smoothed edges gone.
    assert 0 < difference.mean() < 15 and np.mean(difference.max(axis=2) == 0) > 0.5
    assert fast_s < high_s / 2, (fast_s, high_s)  # ~8× on a 2-core EPYC with llvmpipe


def test_unknown_render_quality_is_a_user_error():
    with pytest.raises(UserError, match="unknown render quality 'ultra'; choose one of high, fast"):
        AlohaTransferCube(render_quality="ultra")


def test_unknown_camera_is_a_user_error():
    with pytest.raises(UserError, match="unknown ALOHA camera"):
        AlohaTransferCube(cameras=("top", "no_such_camera"))


def test_gripper_normalisation_is_gym_alohas():
    assert normalise_gripper(0.01844) == pytest.approx(0.0)
    assert normalise_gripper(0.058) == pytest.approx(1.0)
    assert unnormalise_gripper(normalise_gripper(0.03)) == pytest.approx(0.03)


def test_action_drives_joints_and_mirrored_fingers(env):
    obs, _ = env.reset(seed=0)
    action = obs["agent_pos"].copy()
    action[[0, 7]] = 0.3, -0.2  # both waists
    action[[6, 13]] = 1.0, 1.0  # both grippers open
    for _ in range(50):
        obs, *_ = env.step(action)
    pos = obs["agent_pos"]
    assert pos[0] == pytest.approx(0.3, abs=0.01) and pos[7] == pytest.approx(-0.2, abs=0.01)
    # Fully open stops at the finger actuators' range, 0.021–0.057 m.
    assert pos[6] == pytest.approx(normalise_gripper(0.057), abs=0.01)
    assert pos[13] == pytest.approx(normalise_gripper(0.057), abs=0.01)
    left_fingers = env.data.qpos[6:8]
    assert left_fingers[1] == pytest.approx(-left_fingers[0], abs=1e-3)
    action[13] = 0.0  # close the right gripper on nothing
    for _ in range(50):
        obs, *_ = env.step(action)
    # Finger friction holds it a little short of the range's closed end (0.065).
    assert obs["agent_pos"][13] < 0.12 and obs["agent_pos"][6] > 0.95


def test_truncated_after_400_steps(env):
    obs, _ = env.reset(seed=0)
    for step in range(1, EPISODE_STEPS + 1):
        _, _, _, truncated, _ = env.step(obs["agent_pos"])
        assert truncated == (step == EPISODE_STEPS)


def test_registered_with_gymnasium_and_reimport_is_harmless():
    importlib.reload(hetlab.aloha)
    env = gymnasium.make(hetlab.aloha.ENV_ID, cameras=())
    try:
        obs, _ = env.reset(seed=3)
        assert obs["agent_pos"].shape == (14,)
    finally:
        env.close()
