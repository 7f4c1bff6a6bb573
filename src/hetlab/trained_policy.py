"""The policy a run directory holds: its task, its seed, and the actor of its latest checkpoint.

The actor is rebuilt the way `hetlab train` builds it — the run's algorithm constructed from the
saved config, then the checkpoint's algorithm state loaded — so whatever actor an algorithm
uses comes back with its weights and observation normaliser, on the CPU, in eval mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from hetlab.algos import ALGOS
from hetlab.checkpoint import load_checkpoint
from hetlab.errors import UserError
from hetlab.tasks import task_class


@dataclass(frozen=True)
class RunPolicy:
    task: str
    seed: int
    actor: nn.Module  # forward(obs [batch, policy obs]) -> deterministic actions [batch, actions]
    obs_size: int
    action_size: int


def load_policy(run_dir: Path | str) -> RunPolicy:
    run_dir = Path(run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise UserError(f"{run_dir} has no config.json; pass a run directory written by `hetlab train`")
    config = json.loads(config_path.read_text())
    algo_cls = ALGOS[config["algo"]]
    task_cls = task_class(config["task"])
    state = load_checkpoint(run_dir)
    algo = algo_cls(task_cls.obs_sizes, task_cls.action_size, algo_cls.Config(**config[config["algo"]]),
                    torch.device("cpu"), seed=config["seed"])
    try:
        algo.load_state_dict(state["algo"])
    except (KeyError, RuntimeError, ValueError) as e:
        raise UserError(f"the checkpoint in {run_dir} does not fit its config.json ({e}); was either edited?") from e
    return RunPolicy(config["task"], config["seed"], algo.actor.eval(), task_cls.obs_sizes["policy"],
                     task_cls.action_size)
