"""`hetlab play`: an mp4 of a run's policy acting in one env of its task.

The actor of the latest checkpoint takes its mean action on exact observations (obs_noise=0).
The env resets itself when an episode ends and the recording goes on, so the video always
lasts `seconds`, one frame per control step. Frames are rendered headless (see headless_gl)
from the model's "tracking" camera when it has one, else from MuJoCo's default free camera,
which frames the whole scene, and encoded with PyAV: H.264 when the wheel has an encoder for
it, else MPEG-4 part 2, which every FFmpeg build has.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import mujoco
import torch
from rich.console import Console
from rich.progress import track

from hetlab.deploy.policy import load_policy
from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.files import atomic_path
from hetlab.headless_gl import make_renderer
from hetlab.tasks import make_task

TRACKING_CAMERA = "tracking"
# Encoders in order of preference, with their options: MPEG-4's default 200 kbit/s is a
# smear at 640×480; H.264's defaults are fine.
CODECS = {"h264": {}, "mpeg4": {"b": "4M"}}


def play(run_dir: Path | str, video: Path | str, seconds: float = 10.0, width: int = 640, height: int = 480,
         seed: int | None = None, checkpoint: int | str | None = None) -> dict:
    """Record the run's policy to `video`; returns the frame count, fps and every episode seen
    (return, length, and how it ended: "terminated", "truncated", or "video" if still running).
    `seed` defaults to the run's own."""
    av = require("video", "av", "writing a video")
    if seconds <= 0:
        raise UserError(f"--seconds must be > 0, got {seconds}")
    if width < 2 or height < 2 or width % 2 or height % 2:
        raise UserError(f"--width and --height must be positive and even (H.264 and MPEG-4 store colour at half "
                        f"resolution), got {width}×{height}")
    policy = load_policy(run_dir, checkpoint)
    task = make_task(policy.task, num_envs=1, sim=policy.sim, threads=1, seed=policy.seed if seed is None else seed,
                     obs_noise=0.0, **policy.task_options)
    steps = max(1, round(seconds / task.dt))
    fps = Fraction(1 / task.dt).limit_denominator(1000)
    model, data = task.sim.render_state(0)  # one env of the batch, as an MjModel/MjData to render
    model.vis.global_.offwidth = max(width, model.vis.global_.offwidth)
    model.vis.global_.offheight = max(height, model.vis.global_.offheight)
    camera = TRACKING_CAMERA if _has_camera(model, TRACKING_CAMERA) else _free_camera(model)
    if model.nlight == 0:  # MuJoCo's dim default headlight leaves an unlit scene near-black
        model.vis.headlight.ambient, model.vis.headlight.diffuse = [0.4] * 3, [0.8] * 3

    episodes = []
    obs = task.reset()["policy"]
    Path(video).parent.mkdir(parents=True, exist_ok=True)
    with make_renderer(model, width, height) as renderer, atomic_path(video) as tmp, \
            av.open(str(tmp), "w", format="mp4") as container:
        stream = _video_stream(av, container, fps, width, height)
        # Software GL (llvmpipe) takes ~0.1–0.4 s a frame at 640×480 with shadows: show progress.
        for _ in track(range(steps), description="rendering", console=Console(stderr=True), transient=True):
            with torch.no_grad():
                actions = policy.actor(torch.from_numpy(obs)).numpy()
            groups, _, terminated, _, info = task.step(actions)
            obs = groups["policy"]
            if "done_ids" in info:
                episodes.append(_episode(info["episode_return"][0], info["episode_length"][0],
                                         "terminated" if terminated[0] else "truncated"))
            task.sim.render_state(0, model, data)
            renderer.update_scene(data, camera=camera)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(renderer.render(), format="rgb24")))
        container.mux(stream.encode())  # flush the encoder's delayed frames
    if task.episode_step[0]:
        episodes.append(_episode(task.episode_return[0], task.episode_step[0], "video"))
    return {"video": str(video), "frames": steps, "fps": float(fps), "width": width, "height": height,
            "episodes": episodes}


def _has_camera(model: mujoco.MjModel, name: str) -> bool:
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name) >= 0


def _free_camera(model: mujoco.MjModel) -> mujoco.MjvCamera:
    camera = mujoco.MjvCamera()
    mujoco.mjv_defaultFreeCamera(model, camera)
    return camera


def _video_stream(av, container, fps: Fraction, width: int, height: int):
    for codec, options in CODECS.items():
        try:
            av.Codec(codec, "w")
        except av.codec.codec.UnknownCodecError:
            continue
        stream = container.add_stream(codec, rate=fps, options=options)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        return stream
    raise UserError(f"this PyAV build has none of the encoders {', '.join(CODECS)}; reinstall it: pip install av")


def _episode(episode_return, length, ended: str) -> dict:
    return {"return": float(episode_return), "length": int(length), "ended": ended}
