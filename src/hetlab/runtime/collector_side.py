"""What a collector calls on the learner's shared regions: the contract the regions themselves
(`RolloutRing`, `ReplayBuffer`, `WeightBroadcast`: the learner's shared memory, for a collector
process on its machine) and their Ray ports (`RingPort`, `ReplayPort`, `WeightsPort` in
runtime/ray/ports.py: for a collector actor anywhere on a cluster) both meet, so that
runtime/collector.py runs unchanged in either. Each region also has a learner side (take,
release, publish, receive) that a collector never calls and these Protocols leave out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch


@runtime_checkable
class RolloutSlots(Protocol):
    """An on-policy collector's view of the rollout ring: claim a free slot, fill it, hand it over."""

    def attach(self) -> None:
        """Map the region in this process (a collector's first call)."""
        ...

    def close(self) -> None:
        ...

    def acquire(self, timeout: float | None = None) -> int | None:
        """A free slot, or None after `timeout` seconds."""
        ...

    def views(self, slot: int) -> dict[str, np.ndarray]:
        """The slot's arrays (the rollout layout's fields), written in place."""
        ...

    def commit(self, slot: int, meta: dict) -> None:
        """Hand the filled slot to the learner with the rollout's statistics."""
        ...


@runtime_checkable
class TransitionSink(Protocol):
    """An off-policy collector's view of the replay buffer: its own columns, one row per env step."""

    def attach(self) -> None:
        ...

    def close(self) -> None:
        ...

    def write(self, collector: int, step: int, transition: Mapping[str, np.ndarray]) -> None:
        """Every field of env step `step` of collector `collector`'s envs."""
        ...

    def end_episodes(self, collector: int, step: int) -> None:
        """Episodes of step `step - 1` end there: the collector starts over with fresh ones."""
        ...

    def commit(self, meta: dict, stop=None) -> bool:
        """The steps written so far are complete; False if `stop` was set while waiting for room."""
        ...

    @property
    def learner_updates(self) -> int:
        """The learner's gradient updates so far, which pace the collector (the update-to-data ratio)."""
        ...


@runtime_checkable
class WeightSource(Protocol):
    """A collector's view of the weight broadcast: the newest published actor weights."""

    def attach(self) -> None:
        ...

    def close(self) -> None:
        ...

    @property
    def version(self) -> int:
        """The newest published version (−1 before the first)."""
        ...

    def read(self, into: Mapping[str, torch.Tensor], timeout: float | None = None) -> int:
        """Copy the newest weights into `into` (an actor's state_dict); their version."""
        ...
