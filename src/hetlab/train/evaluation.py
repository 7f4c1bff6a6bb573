"""Deterministic evaluation during training (`--eval-every N`).

The learner's current actor — its mean action, no exploration noise — plays one episode in each of
`--eval-envs` envs of its own (a seed apart from the collectors', exact observations), from the
same starting states every time, between two updates, timed as the learner's `evaluate` span. Training returns mix exploration noise and
episodes cut at any point of a rollout; this is the number to compare policies by.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hetlab.tasks import make_task

EVAL_SEED = 1_000_003  # the evaluation envs' seed, past the run's own


class PolicyEvaluation:
    def __init__(self, task: str, sim: str, envs: int, seed: int, device: torch.device, options: dict | None = None):
        self.task = make_task(task, num_envs=envs, sim=sim, threads=1, seed=seed + EVAL_SEED, obs_noise=0.0,
                              **(options or {}))
        self.task.reset()
        self.start = self.task.state_dict()  # every evaluation starts here: policies meet the same episodes
        self.device = device

    def run(self, actor: nn.Module) -> dict[str, float]:
        """One episode per env from the same starting states: the mean return, episode length and
        the task's own episode metrics (e.g. eval/goals)."""
        task = self.task
        obs = task.load_state_dict(self.start)
        returns = np.full(task.num_envs, np.nan)
        lengths = np.full(task.num_envs, np.nan)
        metrics: dict[str, np.ndarray] = {}
        was_training = actor.training
        actor.eval()  # batch norm (FlashSAC) must not learn from these observations
        try:
            with torch.no_grad():
                for _ in range(task.max_episode_steps):
                    actions = actor(torch.from_numpy(obs["policy"]).to(self.device)).float().cpu().numpy()
                    obs, _, _, _, info = task.step(actions)
                    if "done_ids" in info:
                        first = np.isnan(returns[info["done_ids"]])  # the first episode of each env counts
                        ids = info["done_ids"][first]
                        returns[ids], lengths[ids] = info["episode_return"][first], info["episode_length"][first]
                        for name, values in info["episode_metrics"].items():
                            metrics.setdefault(name, np.full(task.num_envs, np.nan))[ids] = values[first]
                    if not np.isnan(returns).any():
                        break
        finally:
            actor.train(was_training)
        return {"eval/return": float(np.mean(returns)), "eval/episode_length": float(np.mean(lengths)),
                **{f"eval/{name}": float(np.mean(values)) for name, values in metrics.items()}}
