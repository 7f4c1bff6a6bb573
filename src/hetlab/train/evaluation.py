"""Deterministic evaluation of a policy: during training (`--eval-every N`) and by `hetlab eval`.

The actor — its mean action, no exploration noise — plays one episode in each of `envs` envs of
its own (a seed apart from the collectors', exact observations, commands, goals and clip start
frames drawn as in training), from the same starting states every time, so that policies are
compared on the same episodes. Training returns mix exploration noise and episodes cut at any
point of a rollout; this is the number to compare policies by, and the one a task's "solved"
criteria (tasks/criteria.py) judge. A run that trains at a coarser physics step than its task's
own (`--sim-dt`) is solved only where its policy also passes at the task's own step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from hetlab.measure.stats import wilson_interval
from hetlab.tasks import make_task
from hetlab.tasks.criteria import judge

EVAL_SEED = 1_000_003  # the evaluation envs' seed, past the run's own


@dataclass(frozen=True)
class Episodes:
    """The first episode of each evaluation env."""

    returns: np.ndarray
    lengths: np.ndarray
    survived: np.ndarray  # bool: ran to its time limit (or a clip's end) without a termination
    metrics: dict[str, np.ndarray]  # the task's episode metrics, by name

    def means(self) -> dict[str, float]:
        """Per-episode means: return, episode_length, survival (a share) and each task metric."""
        return {"return": float(np.mean(self.returns)), "episode_length": float(np.mean(self.lengths)),
                "survival": float(np.mean(self.survived)),
                **{name: float(np.mean(values)) for name, values in self.metrics.items()}}

    def survival_interval(self) -> tuple[float, float]:
        """The Wilson 95 % interval of the share of episodes that survived."""
        return wilson_interval(int(self.survived.sum()), len(self.survived))


class PolicyEvaluation:
    def __init__(self, task: str, sim: str, envs: int, seed: int, device: torch.device, options: dict | None = None,
                 threads: int = 1):
        self.task = make_task(task, num_envs=envs, sim=sim, threads=threads, seed=seed + EVAL_SEED, obs_noise=0.0,
                              **(options or {}))
        self.task.reset()
        self.start = self.task.state_dict()  # every evaluation starts here: policies meet the same episodes
        self.device = device

    def run(self, actor: nn.Module) -> dict[str, float]:
        """The log row's evaluation columns: eval/<each mean>, and eval/solved (1 or 0) for a task
        with criteria."""
        means = self.episodes(actor).means()
        row = {f"eval/{name}": value for name, value in means.items()}
        if self.task.solved:
            row["eval/solved"] = float(all(c["passed"] for c in judge(self.task.solved, means)))
        return row

    def episodes(self, actor: nn.Module, on_step: Callable[[np.ndarray], None] | None = None) -> Episodes:
        """One episode per env from the same starting states. `on_step` gets, after every step, the
        mask of envs still in their first episode (a video films those)."""
        task = self.task
        obs = task.load_state_dict(self.start)
        returns = np.full(task.num_envs, np.nan)
        lengths = np.full(task.num_envs, np.nan)
        survived = np.zeros(task.num_envs, bool)
        metrics: dict[str, np.ndarray] = {}
        was_training = actor.training
        actor.eval()  # batch norm (FlashSAC) must not learn from these observations
        try:
            with torch.no_grad():
                for _ in range(task.max_episode_steps):
                    actions = actor(torch.from_numpy(obs["policy"]).to(self.device)).float().cpu().numpy()
                    obs, _, _, truncated, info = task.step(actions)
                    if "done_ids" in info:
                        first = np.isnan(returns[info["done_ids"]])  # the first episode of each env counts
                        ids = info["done_ids"][first]
                        returns[ids], lengths[ids] = info["episode_return"][first], info["episode_length"][first]
                        survived[ids] = truncated[ids]
                        for name, values in info["episode_metrics"].items():
                            metrics.setdefault(name, np.full(task.num_envs, np.nan))[ids] = values[first]
                    running = np.isnan(returns)
                    if on_step is not None:
                        on_step(running)
                    if not running.any():
                        break
        finally:
            actor.train(was_training)
        return Episodes(returns, lengths, survived, metrics)


class TrainingEvaluation:
    """`--eval-every`'s evaluation, at the run's physics step. Where the run trains at a coarser step
    than the task's own, a policy that passes "solved" there is judged again at the task's own step
    (its values as eval/task_step/*), and eval/solved is that judgement: a recipe's coarse step counts
    only if its policy transfers."""

    def __init__(self, task: str, sim: str, envs: int, seed: int, device: torch.device, options: dict,
                 threads: int = 1):
        self.at_run_step = PolicyEvaluation(task, sim, envs, seed, device, options, threads)
        self.at_task_step = None
        if options.get("sim_dt") and self.at_run_step.task.solved:
            own = PolicyEvaluation(task, sim, envs, seed, device, {k: v for k, v in options.items() if k != "sim_dt"},
                                   threads)
            if own.task.sim.timestep != self.at_run_step.task.sim.timestep:
                self.at_task_step = own

    def run(self, actor: nn.Module) -> dict[str, float]:
        row = self.at_run_step.run(actor)
        if self.at_task_step is not None and row["eval/solved"]:
            at_task_step = self.at_task_step.run(actor)
            row.update({name.replace("eval/", "eval/task_step/", 1): value for name, value in at_task_step.items()})
            row["eval/solved"] = at_task_step["eval/solved"]
        return row
