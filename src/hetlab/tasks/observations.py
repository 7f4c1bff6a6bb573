"""A task's observation groups, declared as named terms: the sizes, the policy's noise and where the
policy's columns end are derived from the declaration, never typed by hand.

The critic sees the policy's terms exactly, then privileged terms of its own (what the robot's
sensors do not give it: contact, heights, randomised parameters). The policy sees a noisy copy of
the first part: uniform ± each term's `noise`, times the task config's `obs_noise`. A term of a
left-right symmetric task declares how it looks in a mirror (symmetry.py); the groups' mirrors follow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetlab.tasks.symmetry import Mirror


@dataclass(frozen=True)
class ObsTerm:
    name: str
    size: int  # columns
    noise: float = 0.0  # uniform ± this on the policy's copy
    mirror: Mirror | None = None  # its columns in a mirror; None: the task has no left-right symmetry

    def __post_init__(self):
        if self.mirror is not None and self.mirror.size != self.size:
            raise ValueError(f"observation term {self.name}: a mirror of {self.mirror.size} columns for {self.size}")


@dataclass(frozen=True)
class Observations:
    policy: tuple[ObsTerm, ...]
    privileged: tuple[ObsTerm, ...] = ()  # the critic's own, after the policy's

    def __post_init__(self):
        names = [term.name for term in self.policy + self.privileged]
        if len(set(names)) != len(names):
            raise ValueError(f"observation terms named twice: {sorted({n for n in names if names.count(n) > 1})}")

    @property
    def policy_size(self) -> int:
        return sum(term.size for term in self.policy)

    @property
    def sizes(self) -> dict[str, int]:
        return {"policy": self.policy_size, "critic": self.policy_size + sum(term.size for term in self.privileged)}

    @property
    def policy_noise(self) -> np.ndarray:
        """Each policy column's noise scale."""
        return np.concatenate([np.full(term.size, term.noise, np.float32) for term in self.policy])

    @property
    def mirrors(self) -> dict[str, Mirror] | None:
        """Each group's mirror, or None unless every term declares one."""
        if any(term.mirror is None for term in self.policy + self.privileged):
            return None
        policy = Mirror.concat([term.mirror for term in self.policy])
        return {"policy": policy, "critic": Mirror.concat([policy] + [term.mirror for term in self.privileged])}

    def critic(self, values: dict[str, np.ndarray], envs: int) -> np.ndarray:
        """The critic's observation (float32, envs × critic size) from each term's (envs, size) values."""
        terms = self.policy + self.privileged
        if values.keys() != {term.name for term in terms}:
            raise ValueError(f"observation terms {sorted(values)} differ from those declared: "
                             f"{[term.name for term in terms]}")
        out = np.empty((envs, self.sizes["critic"]), np.float32)
        start = 0
        for term in terms:
            value = values[term.name]
            if value.shape != (envs, term.size):
                raise ValueError(f"observation term {term.name}: shape {value.shape}, declared ({envs}, {term.size})")
            out[:, start:start + term.size] = value
            start += term.size
        return out
