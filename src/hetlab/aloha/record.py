"""`hetlab aloha record`: the scripted expert's episodes as a LeRobot v3.0 dataset.

The result matches lerobot/aloha_sim_transfer_cube_scripted: 50 episodes of 400 frames at
50 fps, the overhead camera "top" at 480×640 as AV1 video, 14-number state and action.

Worker processes (spawned) each roll out one seed at a time, render it, and encode its video
into the dataset's staging directory; the main process commits the episodes in seed order, so
the dataset is the same whatever the number of workers. A seed on which the expert fails is
skipped and the next one tried. Every episode is committed atomically (see
hetlab.datasets.lerobot_writer), so stopping the recorder any way at all (Ctrl-C, kill -9)
keeps every episode committed before; running the same command again carries on after them,
with the seed after the last recorded one.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from hetlab.aloha.env import ARM_JOINTS, ARMS, EPISODE_STEPS
from hetlab.datasets.lerobot_writer import DatasetSpec, LeRobotWriter, StagedEpisode, stage_episode
from hetlab.errors import UserError

FPS = 50
TASK = "Pick up the cube with the right arm and transfer it to the left arm."
CAMERA_KEY = "observation.images.top"
MOTORS = tuple(f"{arm}_{joint}" for arm in ARMS for joint in (*ARM_JOINTS, "gripper"))
POLL_S = 0.5  # how often the main process checks on its workers while waiting for an episode


@dataclass(frozen=True, kw_only=True)
class RecordConfig:
    episodes: int = 50  # episodes the dataset should hold when done
    out: Path  # dataset directory; an existing recording there is continued
    height: int = 480
    width: int = 640
    workers: int = 1  # processes rolling out and encoding episodes; 0 = one per core
    first_seed: int = 0  # the seed of the first episode of a new dataset
    steps: int = EPISODE_STEPS  # frames per episode
    # False records episodes the expert fails too (short test recordings end before the handover).
    successful_only: bool = True
    give_up_after: int = 20  # consecutive failed seeds that stop the recording (something is broken)


def aloha_spec(height: int, width: int) -> DatasetSpec:
    return DatasetSpec(fps=FPS, task=TASK, robot_type="aloha", state_names=MOTORS, action_names=MOTORS,
                       cameras=(CAMERA_KEY,), height=height, width=width)


def record(cfg: RecordConfig) -> dict:
    """Record until the dataset at `cfg.out` holds `cfg.episodes` episodes; returns a summary."""
    _check(cfg)
    workers = cfg.workers or os.cpu_count() or 1
    started = time.perf_counter()
    attempts, failed_seeds, failed_in_a_row = 0, [], 0
    with LeRobotWriter(cfg.out, aloha_spec(cfg.height, cfg.width)) as writer:
        before = writer.num_episodes
        seeds = [seed for seed in writer.episode_column("seed") if seed is not None]
        next_seed = max(seeds) + 1 if seeds else cfg.first_seed
        if before < cfg.episodes:
            progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
            with progress, _Workers(min(workers, cfg.episodes - before), writer, cfg) as pool:
                job = progress.add_task("episodes", total=cfg.episodes, completed=before)
                while writer.num_episodes < cfg.episodes:
                    while pool.outstanding < min(pool.size, cfg.episodes - writer.num_episodes):
                        pool.submit(next_seed)
                        next_seed += 1
                    seed, staged = pool.next_in_order()
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
        written = writer.num_episodes - before
        episodes = writer.num_episodes
    seconds = time.perf_counter() - started
    return {"out": str(cfg.out), "episodes": episodes, "written": written, "attempts": attempts,
            "failed_seeds": failed_seeds, "seconds": seconds,
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


class _Workers:
    """Spawned processes that roll out, render and stage episodes; results come back in seed order.

    A worker that dies (a crash in the renderer, the OOM killer) is reported instead of waited
    for; leaving the `with` block, for whatever reason, terminates them all."""

    def __init__(self, size: int, writer: LeRobotWriter, cfg: RecordConfig):
        self.size, self._cfg = size, cfg
        # spawn, not fork: the parent holds threads (rich's refresher) and maybe GL state that fork copies badly.
        context = multiprocessing.get_context("spawn")
        self._seeds, self._results = context.Queue(), context.Queue()
        self._waiting: list[int] = []  # submitted seeds, in order, whose result is not yet taken
        self._done: dict[int, StagedEpisode | None] = {}
        args = (self._seeds, self._results, writer.staging_dir, writer.spec, cfg.steps, cfg.successful_only)
        self._processes = [context.Process(target=_work, args=args, daemon=True) for _ in range(size)]
        for process in self._processes:
            process.start()

    @property
    def outstanding(self) -> int:
        return len(self._waiting)

    def submit(self, seed: int) -> None:
        self._waiting.append(seed)
        self._seeds.put(seed)

    def next_in_order(self) -> tuple[int, StagedEpisode | None]:
        """The earliest submitted seed and its staged episode (None if the expert failed on it)."""
        seed = self._waiting[0]
        while seed not in self._done:
            try:
                done_seed, staged, error = self._results.get(timeout=POLL_S)
            except queue.Empty:
                dead = [p.exitcode for p in self._processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"a recording worker died (exit code {dead[0]}) while rolling out an episode")
                continue
            if error is not None:
                is_user_error, message = error
                if is_user_error:
                    raise UserError(message)
                raise RuntimeError(f"recording seed {done_seed} failed in a worker:\n{message}")
            self._done[done_seed] = staged
        self._waiting.pop(0)
        return seed, self._done.pop(seed)

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            process.join()
        for q in (self._seeds, self._results):
            q.cancel_join_thread()  # don't block on flushing seeds nobody will read
            q.close()


def _work(seeds, results, staging_dir: Path, spec: DatasetSpec, steps: int, successful_only: bool) -> None:
    """Worker process: roll out each seed from `seeds`, stage it, and report it on `results`."""
    from hetlab.aloha.expert import rollout_expert  # here: the parent never needs MuJoCo rendering

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    # A parent killed outright (kill -9) cannot terminate its workers: they notice and exit.
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: (parent.join(), os._exit(0)), daemon=True).start()
    while True:
        seed = seeds.get()
        try:
            episode = rollout_expert(seed, render=True, height=spec.height, width=spec.width, steps=steps)
            staged = None
            if episode.success or not successful_only:
                extra = {"seed": seed, "success": episode.success, "max_reward": episode.max_reward}
                staged = stage_episode(staging_dir, spec, {CAMERA_KEY: episode.images}, episode.state,
                                       episode.action, extra)
            results.put((seed, staged, None))
        except Exception as e:  # reported as text: an exception object may not pickle
            results.put((seed, None, (isinstance(e, UserError), str(e) if isinstance(e, UserError)
                                      else traceback.format_exc())))
