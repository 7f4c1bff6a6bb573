"""A task's left-right symmetry: how its observations and actions look in a mirror.

A legged robot's world is the same with left and right exchanged. Reflecting the world about its
x–z plane (y → −y) turns every state into another valid one: the robot's left and right joints
trade places, roll and yaw angles change sign, pitch does not; vectors (velocities, gravity,
positions) lose the sign of y, and axial ones (angular velocities) the signs of x and z. A learner
can train on each sample's mirror image as well (`--ppo.symmetry`), which the references use to
learn symmetric gaits in fewer samples (Mittal et al. 2024, arXiv:2403.04359).

A `Mirror` maps a vector's columns: `mirrored[..., i] = sign[i] * x[..., index[i]]`. Each
observation term declares its own (`ObsTerm.mirror`); a task's mirrors of its observation groups
are assembled from those, and its action mirror is declared beside its joints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Mirror:
    index: tuple[int, ...]  # mirrored column i takes column index[i] ...
    sign: tuple[float, ...]  # ... times sign[i]

    def __post_init__(self):
        if len(self.index) != len(self.sign) or sorted(self.index) != list(range(len(self.index))):
            raise ValueError(f"a mirror must permute its columns: index {self.index}, sign {self.sign}")
        if any(self.index[j] != i or self.sign[i] != self.sign[j] for i, j in enumerate(self.index)):
            raise ValueError(f"a mirror applied twice must give back the vector: index {self.index}, sign {self.sign}")

    @property
    def size(self) -> int:
        return len(self.index)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x[..., list(self.index)] * np.asarray(self.sign, x.dtype)

    @staticmethod
    def same(size: int) -> Mirror:
        """Columns a reflection leaves alone (heights, contact flags, scalars)."""
        return Mirror(tuple(range(size)), (1.0,) * size)

    @staticmethod
    def negated(size: int) -> Mirror:
        """Columns a reflection negates (a cart's position along its rail, a pole's angle)."""
        return Mirror(tuple(range(size)), (-1.0,) * size)

    @staticmethod
    def concat(parts: Sequence[Mirror]) -> Mirror:
        """The mirror of the concatenation of vectors, each with its own mirror."""
        index, sign, start = [], [], 0
        for part in parts:
            index += [start + i for i in part.index]
            sign += part.sign
            start += part.size
        return Mirror(tuple(index), tuple(sign))

    @staticmethod
    def of_items(partner: Sequence[int], item: Mirror) -> Mirror:
        """Items of one kind side by side (the feet's velocities): item k trades places with
        item `partner[k]`, and each is mirrored by `item`."""
        return Mirror(tuple(p * item.size + i for p in partner for i in item.index), item.sign * len(partner))

    @staticmethod
    def of_names(names: Sequence[str], partner: Callable[[str], str], negated: Callable[[str], bool]) -> Mirror:
        """Named columns (joints): each takes its partner's value (`partner(name)`, itself for a
        joint on the middle), negated where `negated(name)`."""
        position = {name: i for i, name in enumerate(names)}
        return Mirror(tuple(position[partner(name)] for name in names),
                      tuple(-1.0 if negated(name) else 1.0 for name in names))


# In the robot's or the world's frame: a vector loses the sign of y ...
VECTOR = Mirror((0, 1, 2), (1.0, -1.0, 1.0))
# ... an angular velocity those of x and z (roll and yaw turn the other way, pitch does not) ...
AXIAL = Mirror((0, 1, 2), (-1.0, 1.0, -1.0))
# ... and a velocity command (forward, sideways, yaw rate) those of its sideways and yaw parts.
VELOCITY_COMMAND = Mirror((0, 1, 2), (1.0, -1.0, -1.0))


@dataclass(frozen=True)
class TaskMirror:
    """The mirrors of a task's observation groups and of its actions."""

    obs: dict[str, Mirror]  # "policy", "critic"
    action: Mirror
