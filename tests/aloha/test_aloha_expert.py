"""The scripted IK expert transfers the cube, its episodes replay exactly, and `hetlab aloha expert` reports it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetlab.aloha.env import ARM_JOINTS, EPISODE_STEPS, AlohaTransferCube
from hetlab.aloha.expert import rollout_expert, run_expert
from hetlab.cli import main

# Seeds whose cubes start near the four corners of the sampling area (x 0–0.2, y 0.4–0.6).
CORNER_SEEDS = [25, 34, 79, 82]


@pytest.fixture(scope="module")
def episode():
    return rollout_expert(7)


def test_expert_succeeds_with_the_cube_anywhere():
    result = run_expert(CORNER_SEEDS)
    assert result == {"episodes": 4, "successes": 4, "success_rate": 1.0, "failed_seeds": []}


@pytest.mark.parametrize("seed", CORNER_SEEDS)
def test_one_wrist_solution_wherever_the_cube_is(seed):
    # Each wrist pose has a flipped twin (forearm_roll and wrist_rotate ±π away, wrist_angle
    # negated); demonstrations that mix the two have two modes. Both arms must keep the unflipped
    # forearm and the right wrist_rotate near home throughout, on either side of y = 0.5.
    episode = rollout_expert(seed)
    assert episode.success
    roll, rotate = ARM_JOINTS.index("forearm_roll"), ARM_JOINTS.index("wrist_rotate")
    unflipped = [roll, 7 + roll, 7 + rotate]  # left arm, then right arm: 7 numbers each
    for joints in (episode.state, episode.action):
        assert np.abs(joints[:, unflipped]).max() < np.pi / 2


def test_episode_layout(episode):
    assert episode.seed == 7 and episode.images is None
    assert episode.state.shape == episode.action.shape == (EPISODE_STEPS, 14)
    assert episode.state.dtype == episode.action.dtype == np.float32
    assert episode.success and episode.max_reward == 4
    env = AlohaTransferCube(cameras=())
    first, _ = env.reset(seed=7)
    np.testing.assert_array_equal(episode.state[0], first["agent_pos"].astype(np.float32))
    assert np.all([env.action_space.contains(a) for a in episode.action])


def test_replayed_actions_reproduce_the_states_and_climb_the_reward_levels(episode):
    env = AlohaTransferCube(cameras=())
    obs, _ = env.reset(seed=7)
    rewards = []
    for t, action in enumerate(episode.action):
        np.testing.assert_array_equal(obs["agent_pos"].astype(np.float32), episode.state[t])
        obs, reward, terminated, _, info = env.step(action)
        rewards.append(int(reward))
        assert terminated == info["is_success"] == (reward == 4)
    rewards = np.array(rewards)
    # Lifted in the right hand (2) before the left takes it (4), and still held by the left at the end.
    assert 2 in rewards and 4 in rewards
    assert np.argmax(rewards == 2) < np.argmax(rewards == 4)
    assert rewards[-1] == 4


def test_cut_short_before_the_handover_is_a_failure():
    short = rollout_expert(7, steps=200)  # the cube is still in the right hand
    assert short.state.shape == (200, 14)
    assert not short.success and short.max_reward == 2


def test_rendered_frames():
    short = rollout_expert(7, render=True, height=48, width=64, steps=3)
    assert short.images.shape == (3, 48, 64, 3) and short.images.dtype == np.uint8
    assert short.images.std() > 10


def test_cli_expert_json(capsys):
    main(["aloha", "expert", "--seeds", "0-1", "--workers", "2", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result == {"episodes": 2, "successes": 2, "success_rate": 1.0, "failed_seeds": []}


@pytest.mark.parametrize(("seeds", "message"), [
    ("5-2", "ends before it starts"),
    ("a-b", "takes a range A-B"),
    ("", "takes a range A-B"),
    ("-3", "takes a range A-B"),
])
def test_cli_bad_seed_range_is_one_line_and_exit_status_2(capsys, seeds, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["aloha", "expert", "--seeds", seeds])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
