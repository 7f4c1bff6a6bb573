"""The algorithm contract the training loops, checkpoints and `hetlab export` are written against.

An algorithm class is constructed as `Cls(obs_sizes, action_size, cfg, device, seed)` from the
task's observation groups ("policy", and "critic" where the task has one), its action size and
the algorithm's own options (`Cls.Config`). The loop calls `update` with whatever its stager
hands over — a rollout batch for the on-policy loop, a replay sample for the off-policy one —
and broadcasts `actor`'s weights to the collectors after each call. Checkpoints hold
`state_dict()`; `hetlab eval`, `play` and `export` rebuild the class from the run's config and
load it, then use `actor` alone: its `forward(obs)` is the deterministic policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:  # the contract itself needs no torch; the command line imports it to build its help
    import torch
    from torch import nn


@runtime_checkable
class Algorithm(Protocol):
    name: ClassVar[str]  # its key in ALGO_CONFIGS and the --<name>.* options
    off_policy: ClassVar[bool]  # False: fed rollouts by train/on_policy.py; True: replay samples by train/off_policy.py
    Config: ClassVar[type]  # its options, a frozen dataclass in configs.py
    # Values for options left at their defaults on a CPU learner, run-wide ("envs") or its own ("<name>.batch_size")
    cpu_defaults: ClassVar[dict[str, object]]
    # forward(obs [batch, policy obs]) -> deterministic actions [batch, actions]; its state_dict is what the
    # weight broadcast carries to the collectors (who add exploration themselves)
    actor: nn.Module

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One learner step on the staged batch; scalar metrics for the log row."""
        ...

    def state_dict(self) -> dict:
        """Everything a bit-exact resume needs: networks, optimizers, normalisers, random generators."""
        ...

    def load_state_dict(self, state: dict) -> None:
        ...


@runtime_checkable
class OnPolicyAlgorithm(Algorithm, Protocol):
    # "sync": collectors wait for each new version; "async": they run ahead into free ring slots
    default_mode: ClassVar[Literal["sync", "async"]]
