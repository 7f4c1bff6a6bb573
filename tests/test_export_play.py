"""`hetlab export` and `hetlab play` on a real (tiny) cartpole run: ONNX Runtime, GL rendering, PyAV."""

from __future__ import annotations

import json

import shutil
from pathlib import Path

import av
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from hetlab.assets import motion_clip_path
from hetlab.errors import UserError
from hetlab.deploy.export import export_onnx
from hetlab.deploy.play import play
from hetlab.deploy.policy import load_policy
from hetlab.tasks import make_task

SMALL_NETS = ["--ppo.actor-hidden", "32", "32", "--ppo.critic-hidden", "32", "32"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, hetlab_here) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    result = hetlab_here("train", "--task", "cartpole-balance", "--envs", "16", "--horizon", "8", "--max-iterations",
                               "3", "--checkpoint-every", "1", "--keep-checkpoints", "0", "--runs-dir", runs, *SMALL_NETS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return Path(result.stdout.splitlines()[0])


def real_observations(steps: int = 10, envs: int = 8) -> np.ndarray:
    task = make_task("cartpole-balance", num_envs=envs, threads=1, seed=3)
    obs = [task.reset()["policy"]]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        obs.append(task.step(rng.uniform(-1, 1, (envs, 1)).astype(np.float32))[0]["policy"])
    return np.concatenate(obs)


def test_export_matches_the_torch_actor_at_any_batch_size(run_dir):
    exported = export_onnx(run_dir)
    path = exported.path
    assert path == run_dir / "policy.onnx" and path.stat().st_size > 0
    assert 0 <= exported.max_error <= 1e-5 and exported.real_observations == 9 * 32
    # The file explains itself: task, sizes, the task's settings, checkpoint and parity.
    properties = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert properties == exported.metadata
    assert properties["hetlab.task"] == "cartpole-balance" and properties["hetlab.obs"] == "policy [5]"
    assert json.loads(properties["hetlab.task_config"])["num_envs"] == 1
    assert properties["hetlab.checkpoint"].startswith(str(run_dir / "checkpoints"))
    assert not list(run_dir.glob(".policy*")) and not list(run_dir.glob("*.data"))  # one file, no leftovers
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,), (out,) = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape[1], out.name) == ("obs", "tensor(float)", 5, "actions")
    actor = load_policy(run_dir).actor
    obs = real_observations()
    for batch in (obs, obs[:1], obs[:17]):
        (onnx_actions,) = session.run(["actions"], {"obs": batch})
        with torch.no_grad():
            torch_actions = actor(torch.from_numpy(batch)).numpy()
        assert onnx_actions.shape == (len(batch), 1)
        np.testing.assert_allclose(onnx_actions, torch_actions, rtol=0, atol=1e-5)


def test_play_records_a_moving_video(run_dir, tmp_path):
    video = tmp_path / "cartpole.mp4"
    result = play(run_dir, video, seconds=0.6, width=96, height=64)
    assert result["frames"] == 30 and result["fps"] == 50.0  # 0.6 s at cartpole's 50 Hz control
    assert sum(episode["length"] for episode in result["episodes"]) == 30
    with av.open(str(video)) as container:
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
    assert frames.shape == (30, 64, 96, 3)
    assert frames.max() > 100  # the lit cart and pole on a black background
    moved = (np.abs(frames.astype(np.int16) - frames[:1]).max(axis=-1) > 40).sum(axis=(1, 2))
    assert (moved >= 5).sum() >= 10, f"the cart and pole should move across the frames: {moved}"


def test_a_directory_without_a_checkpoint_is_a_user_error(run_dir, tmp_path):
    with pytest.raises(UserError, match="config.json"):
        export_onnx(tmp_path)
    shutil.copy(run_dir / "config.json", tmp_path)
    with pytest.raises(UserError, match="checkpoint"):
        export_onnx(tmp_path)
    with pytest.raises(UserError, match="checkpoint"):
        play(tmp_path, tmp_path / "out.mp4")
    with pytest.raises(UserError, match="even"):
        play(run_dir, tmp_path / "out.mp4", width=95)
    assert not list(tmp_path.glob("*.onnx")) and not list(tmp_path.glob("*.mp4"))


def test_any_kept_checkpoint_exports_and_plays(run_dir, tmp_path):
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["0000001", "0000002", "0000003"]
    first = export_onnx(run_dir, tmp_path / "first.onnx", checkpoint=1)
    assert first.metadata["hetlab.checkpoint"] == str(run_dir / "checkpoints" / "0000001")
    observations = real_observations(steps=2)
    assert not np.array_equal(load_policy(run_dir, 1).act(observations), load_policy(run_dir).act(observations))
    with pytest.raises(UserError, match=r"keeps no checkpoint of step 7; it keeps step\(s\) 1, 2, 3"):
        play(run_dir, tmp_path / "out.mp4", seconds=0.1, width=64, height=64, checkpoint=7)
    assert not (tmp_path / "out.mp4").exists()


@pytest.mark.parametrize("task", ["go1-joystick-flat", "g1-walk-flat", "g1-track-motion", "leap-cube-reorient"])
def test_every_robot_task_trains_exports_with_parity_and_plays(task, tmp_path, monkeypatch, hetlab_here):
    options = []
    if task == "g1-track-motion":  # a clip of the user's own, given by a relative path
        with np.load(motion_clip_path()) as clip:
            np.savez(tmp_path / "mine.npz", fps=np.array([25]), joint_pos=clip["joint_pos"][::2])
        monkeypatch.chdir(tmp_path)
        options = ["--motion", "mine.npz"]
    result = hetlab_here("train", "--task", task, "--envs", "8", "--horizon", "8", "--max-iterations", "1",
                         "--runs-dir", tmp_path / "runs", *SMALL_NETS, *options)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = Path(result.stdout.splitlines()[0])
    monkeypatch.chdir(run)  # play and export find the run's clip from anywhere
    exported = export_onnx(run, tmp_path / "policy.onnx")
    assert exported.max_error <= 1e-5 and exported.real_observations > 0
    assert exported.metadata["hetlab.task"] == task
    if options:
        assert json.loads(exported.metadata["hetlab.task_config"])["motion"] == str(tmp_path / "mine.npz")
    played = play(run, tmp_path / "play.mp4", seconds=0.2, width=96, height=64)
    with av.open(str(tmp_path / "play.mp4")) as container:
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
    assert frames.shape == (played["frames"], 64, 96, 3) and played["frames"] >= 4
    assert frames.std() > 10, "the robot should stand out from the background"
    assert np.abs(frames[-1].astype(np.int16) - frames[0]).max() > 40, "the robot should move"
