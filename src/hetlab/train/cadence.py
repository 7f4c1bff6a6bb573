"""What both RL loops do between iterations, in one place: evaluate every --eval-every iterations,
checkpoint every --checkpoint-every and whenever an evaluation beats the best so far (which
`best` then names), film every --video-every, and stop at --target-return or once an evaluation
passes the task's criteria (--until-solved). A loop that stops early checkpoints where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch

from hetlab.checkpoint import mark_best, read_best
from hetlab.train.evaluation import TrainingEvaluation
from hetlab.train.run import reached
from hetlab.train.video import PolicyVideos


class Cadence:
    def __init__(self, cfg, run_dir: Path, device: torch.device, physics_threads: int, videos: PolicyVideos):
        self.cfg, self.run_dir, self.videos = cfg, run_dir, videos
        # Stepped with a collector's physics threads: a sync run's collectors wait while it plays.
        self.evaluation = TrainingEvaluation(cfg.task, cfg.sim, cfg.eval_envs, cfg.seed, device, cfg.task_options,
                                             physics_threads) if cfg.eval_every else None
        best = read_best(run_dir)
        self.best_return = best["eval/return"] if best else -math.inf

    def evaluates(self, iteration: int) -> bool:
        """Whether iteration `iteration` (counted from 0) ends with an evaluation."""
        return self.evaluation is not None and (iteration + 1) % self.cfg.eval_every == 0

    def after(self, iterations: int, evaluated: dict, episode_columns: dict, actor,
              checkpoint: Callable[[], None]) -> str | None:
        """After `iterations` iterations (logged; `evaluated`: this one's evaluation columns, if any):
        checkpoint, mark the best, film; the reason to stop now, or None."""
        cfg = self.cfg
        improved = bool(evaluated) and evaluated["eval/return"] > self.best_return
        if improved or iterations % cfg.checkpoint_every == 0 or iterations == cfg.max_iterations:
            checkpoint()
        if improved:  # the policy just evaluated is the one the checkpoint holds
            self.best_return = evaluated["eval/return"]
            mark_best(self.run_dir, iterations, evaluated)
        self.videos.after_iteration(iterations, actor)
        if reached(cfg.target_return, episode_columns):
            return "target_return"
        if cfg.until_solved and evaluated.get("eval/solved"):
            return "solved"
        return None

    def stopped(self, iterations: int, stopped_by: str, checkpoint: Callable[[], None]) -> None:
        """A run that stopped before its last iteration checkpoints there, unless its checkpoint cadence
        just did (a checkpoint for a new best is written again: the same state, harmless)."""
        if stopped_by != "max_iterations" and iterations % self.cfg.checkpoint_every:
            checkpoint()
