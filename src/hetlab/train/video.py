"""Videos of a policy acting: the recorder behind `hetlab play`, and --video-every's videos during training.

`record_policy_video` films env 0 of a one-env task while a policy acts on exact observations.
The env resets itself when an episode ends and the recording goes on, so a video always lasts
the seconds asked for, one frame per control step. Frames are rendered headless (see headless_gl)
from the model's "tracking" camera when it has one, else from MuJoCo's default free camera, which
frames the whole scene, and encoded with PyAV: H.264 when the wheel has an encoder for it, else
MPEG-4 part 2, which every FFmpeg build has.

During training (`PolicyVideos`), every --video-every iterations the learner hands the actor's
weights — what a checkpoint saved at that iteration holds; handed over directly, so that no
checkpoint the run later prunes is needed — to a side process started through the runtime's
WorkerPool, and goes on. That process renders RUN_DIR/videos/iteration_<N>.mp4 of the policy
acting deterministically from the run's seed (the same start every time), and a small GIF of it
for TensorBoard; the learner looks for the finished video after each iteration and hands it to
the run's loggers. One video renders at a time; the newest one due meanwhile waits for it (an
older one waiting is skipped). A video that cannot be rendered is reported in one line, and
training goes on. At the end of the run the learner waits for the videos still to come, FINISH_S
at most.
"""

from __future__ import annotations

import io
import math
import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import mujoco
import numpy as np
from rich.console import Console
from rich.progress import track

from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.files import atomic_path
from hetlab.headless_gl import make_renderer, working_backend
from hetlab.runtime.workers import WorkerPool
from hetlab.tasks import make_task
from hetlab.train.loggers import PolicyVideo
from hetlab.train.run import RunRecord, console

TRACKING_CAMERA = "tracking"
# Encoders in order of preference, with their options: MPEG-4's default 200 kbit/s is a
# smear at 640×480; H.264's defaults are fine.
CODECS = {"h264": {}, "mpeg4": {"b": "4M"}}

# --video-every's videos: small, a few seconds, and a GIF of at most GIF_FPS frames a second
# (browsers slow shorter frame delays down) at GIF_WIDTH pixels wide.
VIDEO_WIDTH, VIDEO_HEIGHT = 320, 240
VIDEO_SECONDS = 5.0
GIF_WIDTH = 160
GIF_FPS = 25
FINISH_S = 60.0  # how long the end of a run waits for the videos still to come
NICENESS = 10  # the side process yields the CPU to the collectors and the learner


class EnvFilm:
    """An mp4 of env `env_id` of `task`, one frame of its current state per `add()`; a context
    manager, which writes the file (atomically) when its block succeeds."""

    def __init__(self, task, env_id: int, path: Path | str, width: int, height: int):
        self.av = require("video", "av", "writing a video")
        self.task, self.env_id = task, env_id
        self.model, self.data = task.sim.render_state(env_id)  # the env as an MjModel/MjData to render
        model = self.model
        model.vis.global_.offwidth = max(width, model.vis.global_.offwidth)
        model.vis.global_.offheight = max(height, model.vis.global_.offheight)
        self.camera = TRACKING_CAMERA if _has_camera(model, TRACKING_CAMERA) else _free_camera(model)
        if model.nlight == 0:  # MuJoCo's dim default headlight leaves an unlit scene near-black
            model.vis.headlight.ambient, model.vis.headlight.diffuse = [0.4] * 3, [0.8] * 3
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        self._closing = ExitStack()
        with self._closing as opening:  # whatever was opened closes again if a later part fails
            self.renderer = opening.enter_context(make_renderer(model, width, height))
            tmp = opening.enter_context(atomic_path(path))
            self.container = opening.enter_context(self.av.open(str(tmp), "w", format="mp4"))
            self.stream = _video_stream(self.av, self.container, Fraction(1 / task.dt).limit_denominator(1000),
                                        width, height)
            self._closing = opening.pop_all()

    def add(self) -> np.ndarray:
        """Render the env's state now into the next frame; returns the frame."""
        self.task.sim.render_state(self.env_id, self.model, self.data)
        self.renderer.update_scene(self.data, camera=self.camera)
        frame = self.renderer.render()
        self.container.mux(self.stream.encode(self.av.VideoFrame.from_ndarray(frame, format="rgb24")))
        return frame

    def __enter__(self) -> EnvFilm:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is None:
            self.container.mux(self.stream.encode())  # flush the encoder's delayed frames
        self._closing.__exit__(exc_type, exc, traceback)


def record_policy_video(task, act: Callable[[np.ndarray], np.ndarray], video: Path | str, seconds: float, width: int,
                        height: int, on_frame: Callable[[np.ndarray], None] | None = None,
                        progress: bool = False) -> dict:
    """Record `act` (policy observations → actions, numpy) acting in env 0 of `task` to `video`,
    handing each frame to `on_frame` too; returns the frame count, fps and every episode seen
    (return, length, and how it ended: "terminated", "truncated", or "video" if still running)."""
    steps = max(1, round(seconds / task.dt))
    episodes = []
    obs = task.reset()["policy"]
    # Software GL (llvmpipe) takes ~0.1–0.4 s a frame at 640×480 with shadows: show progress.
    control_steps = track(range(steps), description="rendering", console=Console(stderr=True), transient=True) \
        if progress else range(steps)
    with EnvFilm(task, 0, video, width, height) as film:
        for _ in control_steps:
            groups, _, terminated, _, info = task.step(act(obs))
            obs = groups["policy"]
            if "done_ids" in info:
                episodes.append(_episode(info["episode_return"][0], info["episode_length"][0],
                                         "terminated" if terminated[0] else "truncated"))
            frame = film.add()
            if on_frame is not None:
                on_frame(frame)
    if task.episode_step[0]:
        episodes.append(_episode(task.episode_return[0], task.episode_step[0], "video"))
    fps = Fraction(1 / task.dt).limit_denominator(1000)
    return {"video": str(video), "frames": steps, "fps": float(fps), "width": width, "height": height,
            "episodes": episodes}


def check_rendering(option: str = "--video-every") -> None:
    """What `option`'s videos need, checked before any work: PyAV, and a headless GL backend that renders."""
    require("video", "av", option)
    try:
        working_backend()
    except UserError as e:
        raise UserError(f"{option} renders the policy headless, but {e}") from e


@dataclass(frozen=True, repr=False)
class VideoJob:
    iteration: int
    env_steps: int
    actor_state: dict  # the actor's state_dict, on the CPU

    def __repr__(self) -> str:  # how a failure names the job: not its weights
        return f"the video of iteration {self.iteration}"


class VideoRenderer:
    """The side process: the run's actor, built once, and one video per job."""

    def __init__(self, cfg, directory: Path):
        import torch

        os.nice(NICENESS)
        torch.set_num_threads(1)
        self.cfg, self.directory = cfg, directory
        self.actor = cfg.build_algorithm(torch.device("cpu")).actor.eval()

    def render(self, job: VideoJob) -> PolicyVideo:
        import torch
        from PIL import Image

        cfg = self.cfg
        self.actor.load_state_dict(job.actor_state)
        task = make_task(cfg.task, **cfg.task_kwargs(1, 1, cfg.seed, obs_noise=0.0))
        stride = math.ceil(1 / task.dt / GIF_FPS)
        gif_size = (GIF_WIDTH, round(GIF_WIDTH * VIDEO_HEIGHT / VIDEO_WIDTH))
        gif_frames: list[Image.Image] = []
        seen = 0

        def act(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return self.actor(torch.from_numpy(obs)).numpy()

        def keep_for_gif(frame: np.ndarray) -> None:
            nonlocal seen
            if seen % stride == 0:
                gif_frames.append(Image.fromarray(frame).resize(gif_size, Image.Resampling.BILINEAR))
            seen += 1

        path = self.directory / f"iteration_{job.iteration}.mp4"
        record_policy_video(task, act, path, VIDEO_SECONDS, VIDEO_WIDTH, VIDEO_HEIGHT, on_frame=keep_for_gif)
        gif = io.BytesIO()
        gif_frames[0].save(gif, format="GIF", save_all=True, append_images=gif_frames[1:], loop=0,
                           duration=round(1000 * stride * task.dt))
        return PolicyVideo(path, job.iteration, job.env_steps, gif.getvalue(), gif_size)


class PolicyVideos:
    """--video-every's learner side, for one launch of a run (see the module's docstring); a
    context manager, whose normal exit waits for the videos still to come."""

    def __init__(self, cfg, run_dir: Path, record: RunRecord):
        self.cfg, self.record, self.directory = cfg, record, run_dir / "videos"
        self.pool: WorkerPool | None = None
        self.rendering: VideoJob | None = None  # the job the side process is on
        self.waiting: VideoJob | None = None  # the newest one due while another renders

    def after_iteration(self, iteration: int, actor) -> None:
        """Log the video that has finished, if any; at every --video-every'th iteration (counted
        as checkpoints are), hand `actor`'s weights to the side process, or keep them until it is
        free. A job still waiting when a newer one is due is skipped: the newer policy is the one
        to see."""
        self._collect(timeout=0)
        if not self.cfg.video_every or iteration % self.cfg.video_every:
            return
        # A copy: on a CPU learner the state_dict's tensors are the weights the next updates change.
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in actor.state_dict().items()}
        job = VideoJob(iteration, self.record.history[-1]["env_steps"], state)
        if self.rendering is None:
            self._start(job)
            return
        if self.waiting is not None:
            console.print(f"[yellow]video of iteration {self.waiting.iteration} skipped: the side process is still "
                          f"rendering iteration {self.rendering.iteration}'s[/]", highlight=False)
        self.waiting = job

    def _start(self, job: VideoJob) -> None:
        if self.pool is None:
            self.pool = WorkerPool(1, VideoRenderer.render, VideoRenderer, (self.cfg, self.directory), name="video")
        self.pool.submit(job)
        self.rendering = job

    def _collect(self, timeout: float) -> None:
        """Log the video being rendered if it finishes within `timeout` s, and start the one waiting."""
        if self.rendering is None:
            return
        try:
            done = self.pool.next(timeout)
        except (UserError, RuntimeError) as e:
            # A worker's traceback ends with the error itself; a fresh process makes the next video.
            console.print(f"[yellow]video of iteration {self.rendering.iteration} failed: "
                          f"{str(e).strip().splitlines()[-1]}[/]", highlight=False, soft_wrap=True)
            self.pool.terminate()
            self.pool, done = None, None
        else:
            if done is None:
                return
            self.record.log_video(done[1])
        self.rendering = None
        if self.waiting is not None:
            self._start(self.waiting)
            self.waiting = None

    def __enter__(self) -> PolicyVideos:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None and self.rendering is not None:
            deadline = time.monotonic() + FINISH_S
            console.print(f"waiting for the side process's videos (at most {FINISH_S:.0f} s)")
            while self.rendering is not None and time.monotonic() < deadline:
                self._collect(timeout=deadline - time.monotonic())
            if self.rendering is not None:
                console.print(f"[yellow]video of iteration {self.rendering.iteration} unfinished after "
                              f"{FINISH_S:.0f} s: stopped[/]", highlight=False)
        if self.pool is not None:
            if self.rendering is None:
                self.pool.close()
            else:
                self.pool.terminate()


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
