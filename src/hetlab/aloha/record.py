"""`hetlab aloha record`: the scripted expert's episodes as a LeRobot v3.0 dataset.

The result matches lerobot/aloha_sim_transfer_cube_scripted: 50 episodes of 400 frames at
50 fps, the overhead camera "top" at 480×640 as AV1 video, 14-number state and action.

Worker processes (spawned) each roll out one seed at a time, render it, and encode its video
into the dataset's staging directory; the main process commits the episodes in seed order, so
the dataset is the same whatever the number of workers. A seed on which the expert fails is
skipped and the next one tried. Every episode is committed atomically (see
hetlab.datasets.lerobot_writer), so stopping the recorder any way at all (Ctrl-C, kill -9)
keeps every episode committed before; running the same command again carries on after them,
with the seed after the last recorded one. The video encoder can deadlock (SVT-AV1 inside PyAV
was seen to wait forever for a packet): when no episode comes back for ten times the longest one
took (at least 2 min; 15 min while the workers start), the workers are restarted and record the
outstanding seeds again (three times in a row at most).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from hetlab.aloha.env import ARM_JOINTS, ARMS
from hetlab.aloha_config import EPISODE_STEPS, RecordConfig, RenderQuality
from hetlab.datasets.lerobot_writer import DatasetSpec, LeRobotWriter, StagedEpisode, stage_episode
from hetlab.errors import UserError
from hetlab.runtime.workers import WorkerPool

FPS = 50
TASK = "Pick up the cube with the right arm and transfer it to the left arm."
CAMERA_KEY = "observation.images.top"
RENDER_QUALITY_KEY = "render.quality"
MOTORS = tuple(f"{arm}_{joint}" for arm in ARMS for joint in (*ARM_JOINTS, "gripper"))
FIRST_EPISODE_STALL_S = 900.0  # no episode back yet: the workers may still be starting (imports, GL)
MIN_STALL_S = 120.0
STALL_FACTOR = 10.0  # times the longest an episode has taken
RESTARTS_IN_A_ROW = 3  # restarts with no episode back in between before the recorder gives up


def aloha_spec(height: int, width: int, render_quality: RenderQuality) -> DatasetSpec:
    return DatasetSpec(fps=FPS, task=TASK, robot_type="aloha", state_names=MOTORS, action_names=MOTORS,
                       cameras=(CAMERA_KEY,), height=height, width=width,
                       camera_info=((RENDER_QUALITY_KEY, render_quality),))


def recorded_render_quality(info: dict) -> str:
    """The render quality of a dataset's camera (info.json); "high" for datasets from before the setting."""
    return info["features"][CAMERA_KEY]["info"].get(RENDER_QUALITY_KEY, "high")


def record(cfg: RecordConfig) -> dict:
    """Record until the dataset at `cfg.out` holds `cfg.episodes` episodes; returns a summary."""
    _check(cfg)
    workers = cfg.workers or os.cpu_count() or 1
    started = time.perf_counter()
    attempts, failed_seeds, failed_in_a_row, restarts = 0, [], 0, 0
    with LeRobotWriter(cfg.out, aloha_spec(cfg.height, cfg.width, cfg.render_quality)) as writer:
        before = writer.num_episodes
        seeds = [seed for seed in writer.episode_column("seed") if seed is not None]
        next_seed = max(seeds) + 1 if seeds else cfg.first_seed
        if before < cfg.episodes:
            progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
            stager = (writer.staging_dir, writer.spec, cfg.steps, cfg.successful_only)
            with progress, WorkerPool(min(workers, cfg.episodes - before), _EpisodeStager.stage, setup=_EpisodeStager,
                                      setup_args=stager, name="recording") as pool:
                in_order = _InSeedOrder(pool, lambda message: progress.console.print(message, highlight=False))
                job = progress.add_task("episodes", total=cfg.episodes, completed=before)
                while writer.num_episodes < cfg.episodes:
                    while in_order.outstanding < min(pool.size, cfg.episodes - writer.num_episodes):
                        in_order.submit(next_seed)
                        next_seed += 1
                    seed, staged = in_order.next()
                    attempts += 1
                    if staged is None:
                        failed_seeds.append(seed)
                        failed_in_a_row += 1
                        if failed_in_a_row == cfg.give_up_after:
                            raise UserError(
                                f"the expert failed on {failed_in_a_row} seeds in a row (up to {seed}); check the "
                                f"scene with `hetlab aloha expert`; episodes shorter than {EPISODE_STEPS} steps "
                                "end before the handover and always fail")
                        progress.update(job, description=f"episodes ({len(failed_seeds)} failed seeds skipped)")
                    else:
                        writer.commit(staged)
                        failed_in_a_row = 0
                        progress.update(job, completed=writer.num_episodes)
                restarts = in_order.restarts
        written = writer.num_episodes - before
        episodes = writer.num_episodes
    seconds = time.perf_counter() - started
    return {"out": str(cfg.out), "episodes": episodes, "written": written, "attempts": attempts,
            "failed_seeds": failed_seeds, "worker_restarts": restarts,
            "seconds": seconds,
            "seconds_per_episode": seconds / written if written else None}


def _check(cfg: RecordConfig) -> None:
    problems = []
    if cfg.episodes < 1:
        problems.append(f"--episodes must be at least 1, got {cfg.episodes}")
    if cfg.steps < 1:
        problems.append(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.workers < 0:
        problems.append(f"--workers must be 0 (one per core) or more, got {cfg.workers}")
    if cfg.give_up_after < 1:
        problems.append(f"--give-up-after must be at least 1, got {cfg.give_up_after}")
    # yuv420p stores colour at half resolution; SVT-AV1 takes frames of 64 pixels and more a side.
    if cfg.height < 64 or cfg.width < 64 or cfg.height % 2 or cfg.width % 2:
        problems.append(f"the image size must be even and at least 64×64, got {cfg.height}×{cfg.width}")
    if problems:
        raise UserError("; ".join(problems))


class _EpisodeStager:
    """A recording worker's state: where and how to stage the episodes it rolls out."""

    def __init__(self, staging_dir: Path, spec: DatasetSpec, steps: int, successful_only: bool):
        self.staging_dir, self.spec, self.steps, self.successful_only = staging_dir, spec, steps, successful_only

    def stage(self, seed: int) -> StagedEpisode | None:
        """Roll out `seed`, render and encode it into the staging directory; None if the expert failed."""
        from hetlab.aloha.expert import rollout_expert  # here: the parent never needs MuJoCo rendering

        quality = dict(self.spec.camera_info)[RENDER_QUALITY_KEY]
        episode = rollout_expert(seed, render=True, height=self.spec.height, width=self.spec.width, steps=self.steps,
                                 render_quality=quality)
        if not episode.success and self.successful_only:
            return None
        extra = {"seed": seed, "success": episode.success, "max_reward": episode.max_reward}
        return stage_episode(self.staging_dir, self.spec, {CAMERA_KEY: episode.images}, episode.state, episode.action,
                             extra)


class _InSeedOrder:
    """The workers' staged episodes handed out in the order their seeds were submitted; workers that
    return nothing for STALL_FACTOR times the longest an episode has taken are restarted (`say` tells
    the user)."""

    def __init__(self, pool: WorkerPool, say=print, first_stall_s: float = FIRST_EPISODE_STALL_S,
                 min_stall_s: float = MIN_STALL_S):
        self.pool, self.say, self.first_stall_s, self.min_stall_s = pool, say, first_stall_s, min_stall_s
        self._waiting: list[int] = []  # submitted seeds, in order, whose result is not yet taken
        self._done: dict[int, StagedEpisode | None] = {}
        self._submitted_at: dict[int, float] = {}
        # The longest a seed took from submission to its episode coming back, among seeds submitted to
        # workers already warm (one episode back since they started): a first episode includes start-up.
        self._longest_s = 0.0
        self._warm_since: float | None = None
        self.restarts, self._restarts_in_a_row = 0, 0

    @property
    def outstanding(self) -> int:
        """Seeds submitted whose episodes have not been handed out."""
        return len(self._waiting)

    def submit(self, seed: int) -> None:
        self._waiting.append(seed)
        self._submitted_at[seed] = time.monotonic()
        self.pool.submit(seed)

    @property
    def stall_s(self) -> float:
        if self._warm_since is None or not self._longest_s:
            return self.first_stall_s
        return max(self.min_stall_s, STALL_FACTOR * self._longest_s)

    def next(self) -> tuple[int, StagedEpisode | None]:
        """The earliest submitted seed and its staged episode (None if the expert failed on it)."""
        seed = self._waiting[0]
        while seed not in self._done:
            finished = self.pool.next(timeout=self.stall_s)
            if finished is None:
                outstanding = [s for s in self._waiting if s not in self._done]
                if self._restarts_in_a_row == RESTARTS_IN_A_ROW:
                    raise UserError(f"the recording workers stalled {RESTARTS_IN_A_ROW + 1} times in a row on seeds "
                                    f"{', '.join(map(str, outstanding))}; the episodes committed so far are kept: "
                                    "run the same command again to carry on, or with --workers 1")
                self.say(f"no episode came back in {self.stall_s:.0f} s (a video encoder can deadlock): restarting "
                         f"the {self.pool.size} recording worker(s) for seeds {', '.join(map(str, outstanding))}")
                self.pool.restart()
                self.restarts += 1
                self._restarts_in_a_row += 1
                self._warm_since = None
                continue
            done_seed, staged = finished
            self._restarts_in_a_row = 0
            now, submitted = time.monotonic(), self._submitted_at.pop(done_seed)
            if self._warm_since is None:
                self._warm_since = now
            elif submitted >= self._warm_since:
                self._longest_s = max(self._longest_s, now - submitted)
            self._done[done_seed] = staged
        self._waiting.pop(0)
        return seed, self._done.pop(seed)
