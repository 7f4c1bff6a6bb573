"""`hetlab play`: an mp4 of a run's policy acting in one env of its task.

The actor of the latest checkpoint (or the one asked for) takes its mean action on exact
observations (obs_noise=0); `hetlab.train.video.record_policy_video` films it, the recorder that
training's --video-every uses too.
"""

from __future__ import annotations

from pathlib import Path

from hetlab.deploy.policy import load_policy
from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.tasks import make_task
from hetlab.train.video import record_policy_video


def play(run_dir: Path | str, video: Path | str, seconds: float = 10.0, width: int = 640, height: int = 480,
         seed: int | None = None, checkpoint: int | str | None = None) -> dict:
    """Record the run's policy to `video`; returns the frame count, fps and every episode seen
    (return, length, and how it ended: "terminated", "truncated", or "video" if still running).
    `seed` defaults to the run's own."""
    require("video", "av", "writing a video")
    if seconds <= 0:
        raise UserError(f"--seconds must be > 0, got {seconds}")
    if width < 2 or height < 2 or width % 2 or height % 2:
        raise UserError(f"--width and --height must be positive and even (H.264 and MPEG-4 store colour at half "
                        f"resolution), got {width}×{height}")
    policy = load_policy(run_dir, checkpoint)
    task = make_task(policy.task, num_envs=1, sim=policy.sim, threads=1, seed=policy.seed if seed is None else seed,
                     obs_noise=0.0, **policy.task_options)
    return record_policy_video(task, policy.act, video, seconds, width, height, progress=True)
