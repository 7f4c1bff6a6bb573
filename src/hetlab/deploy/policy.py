"""The policy a run directory holds: its task, its seed, and the actor of its latest checkpoint.

The actor is rebuilt the way `hetlab train` builds it — the run's algorithm constructed from the
saved config, then the checkpoint's algorithm state loaded — so whatever actor an algorithm
uses comes back with its weights and observation normaliser, on the CPU, in eval mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from hetlab.checkpoint import checkpoint_dir, read_checkpoint
from hetlab.errors import UserError
from hetlab.tasks import task_class
from hetlab.train.config import load_run_config


@dataclass(frozen=True)
class RunPolicy:
    task: str
    sim: str  # the physics backend it was trained on
    seed: int
    actor: nn.Module  # forward(obs [batch, policy obs]) -> deterministic actions [batch, actions]
    obs_size: int
    action_size: int
    checkpoint: Path  # the checkpoint directory it was read from
    task_options: dict  # the task's own options the run set (e.g. a tracking task's clip)

    def act(self, observations) -> np.ndarray:
        """Deterministic actions (batch, action_size) for policy observations (batch, obs_size)."""
        obs = torch.as_tensor(np.asarray(observations, dtype=np.float32))
        if obs.ndim != 2 or obs.shape[1] != self.obs_size:
            raise UserError(f"{self.task}'s policy takes observations of shape (batch, {self.obs_size}), "
                            f"got {tuple(obs.shape)}")
        with torch.no_grad():
            return self.actor(obs).numpy()


def load_policy(run_dir: Path | str, checkpoint: int | str | None = None) -> RunPolicy:
    """The run's policy at its newest checkpoint, or at `checkpoint`: an iteration, "best" or "latest"."""
    run_dir = Path(run_dir)
    config = load_run_config(run_dir)
    path = checkpoint_dir(run_dir, checkpoint)
    state = read_checkpoint(run_dir, path)
    algo = config.build_algorithm(torch.device("cpu"))
    try:
        algo.load_state_dict(state["algo"])
    except (KeyError, RuntimeError, ValueError) as e:
        raise UserError(f"the checkpoint in {run_dir} does not fit its config.json ({e}); was either edited?") from e
    task = task_class(config.task)
    return RunPolicy(config.task, config.sim, config.seed, algo.actor.eval(), task.obs_sizes["policy"], task.action_size,
                     path, config.task_options)
