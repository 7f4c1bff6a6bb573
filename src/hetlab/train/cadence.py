"""What both RL loops do between iterations, in one place: evaluate every --eval-every iterations,
checkpoint whenever an evaluation beats the best so far (which `best` then names; the run layer
checkpoints at --checkpoint-every), film every --video-every, and stop at --target-return or once
an evaluation passes the task's criteria (--until-solved).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from hetlab.checkpoint import mark_best, read_best
from hetlab.train.evaluation import TrainingEvaluation
from hetlab.train.run import RunRecord, reached
from hetlab.train.video import PolicyVideos


class Cadence:
    def __init__(self, cfg, record: RunRecord, device: torch.device, physics_threads: int, videos: PolicyVideos):
        self.cfg, self.run_dir, self.videos = cfg, record.run_dir, videos
        # Stepped with a collector's physics threads: a sync run's collectors wait while it plays.
        self.evaluation = TrainingEvaluation(cfg.task, cfg.sim, cfg.eval_envs, cfg.seed, device, cfg.task_options,
                                             physics_threads) if cfg.eval_every else None
        best = read_best(self.run_dir)
        self.best_return = best["eval/return"] if best else -math.inf

    def evaluates(self, iteration: int) -> bool:
        """Whether iteration `iteration` (counted from 0) ends with an evaluation."""
        return self.evaluation is not None and (iteration + 1) % self.cfg.eval_every == 0

    def after(self, iterations: int, evaluated: dict, episode_columns: dict, actor,
              checkpoint: Callable[[int], None]) -> str | None:
        """After `iterations` iterations (logged; `evaluated`: this one's evaluation columns, if any):
        checkpoint and mark a new best, film; the reason to stop now, or None."""
        cfg = self.cfg
        if evaluated and evaluated["eval/return"] > self.best_return:
            checkpoint(iterations)  # the policy just evaluated, which `best` then names
            self.best_return = evaluated["eval/return"]
            mark_best(self.run_dir, iterations, evaluated)
        self.videos.after_iteration(iterations, actor)
        if reached(cfg.target_return, episode_columns):
            return "target_return"
        if cfg.until_solved and evaluated.get("eval/solved"):
            return "solved"
        return None
