"""The rollout ring: K fixed-horizon rollout slots in one shared-memory segment.

The learner creates the ring; collectors receive it as an argument of their process (spawned, or forked from a fork server) and
`attach()`. A slot goes free → (a collector writes it) → full → (the learner copies it out) →
free. Its index travels through two queues, so whoever holds an index owns the slot's
memory. The queue handoff (a pipe write, then a read in the other process) is also what
makes the writer's stores to the slot visible to the reader.

A slot, and the batch an algorithm's `update` receives (T steps, N envs; the stager joins
slots along the env axis and turns `policy_version` into one entry per env), as float32
unless noted:

    policy_obs        (T+1, N, P)  raw `policy` observations; row T is the one after the last step
    critic_obs        (T+1, N, C)  raw `critic` observations, same timing
    actions           (T, N, A)    the sampled actions, before the task clips them
    log_probs         (T, N)       their log-probability under the collector's (behaviour) policy
    rewards           (T, N)
    terminated        (T, N)       1 where the episode really ended at step t
    truncated         (T, N)       1 where it timed out at step t
    final_critic_obs  (T, N, C)    critic observation of the last state where truncated, else 0
    policy_version    () int64     the weight version the rollout was collected with

After a step that ended an episode, the next observation row already starts the next episode.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetlab.errors import UserError
from hetlab.runtime import get_or_none
from hetlab.runtime.shm import Field, SharedRegion, ShmRequirement, array_view, lay_out


@dataclass(frozen=True)
class RolloutLayout:
    """What one slot holds: a rollout of `horizon` steps of `num_envs` envs (see the module docstring)."""

    horizon: int
    num_envs: int  # envs per slot, i.e. per collector
    obs_sizes: Mapping[str, int]  # {"policy": P, "critic": C}
    action_size: int

    def __post_init__(self):
        if self.horizon < 1 or self.num_envs < 1:
            raise UserError(f"a rollout needs horizon ≥ 1 and ≥ 1 env, got {self.horizon} and {self.num_envs}")
        missing = {"policy", "critic"} - set(self.obs_sizes)
        if missing:
            raise ValueError(f"obs_sizes lacks the {sorted(missing)} group(s): {dict(self.obs_sizes)}")
        object.__setattr__(self, "obs_sizes", dict(self.obs_sizes))  # a copy: the caller's dict may change

    @cached_property
    def _fields_and_size(self) -> tuple[dict[str, Field], int]:
        t, n, a = self.horizon, self.num_envs, self.action_size
        p, c = self.obs_sizes["policy"], self.obs_sizes["critic"]
        f32 = np.dtype(np.float32)
        return lay_out({
            "policy_version": ((), np.dtype(np.int64)),
            "policy_obs": ((t + 1, n, p), f32),
            "critic_obs": ((t + 1, n, c), f32),
            "actions": ((t, n, a), f32),
            "log_probs": ((t, n), f32),
            "rewards": ((t, n), f32),
            "terminated": ((t, n), f32),
            "truncated": ((t, n), f32),
            "final_critic_obs": ((t, n, c), f32),
        })

    @property
    def fields(self) -> dict[str, Field]:
        """Name → shape, dtype and offset in the slot. `policy_version` is one int64 per slot."""
        return self._fields_and_size[0]

    @property
    def nbytes(self) -> int:
        """Bytes of one slot (a multiple of ALIGN, so every slot starts aligned too)."""
        return self._fields_and_size[1]

    def requirement(self, num_slots: int) -> ShmRequirement:
        """The shared memory a ring of `num_slots` such slots needs: for checks before any work."""
        return ShmRequirement(
            num_slots * self.nbytes,
            f"the rollout ring ({num_slots} slots of {self.horizon} steps × {self.num_envs} envs)",
            "use fewer envs, a shorter horizon or fewer ring slots",
        )


class RolloutRing(SharedRegion):
    """K slots of `layout` in one segment, handed between processes through free/full queues.

    Created by the learner, which unlinks the segment in `close()`. Pass the ring to a
    child process (spawned or from a fork server) and call `attach()` there before `views()`.
    """

    _shared = ("layout", "num_slots", "_free", "_full")

    def __init__(self, layout: RolloutLayout, num_slots: int):
        if num_slots < 1:
            raise UserError(f"the rollout ring needs at least one slot, got {num_slots}")
        self.layout, self.num_slots = layout, num_slots
        self._create("hetlab_ring", layout.requirement(num_slots))
        context = multiprocessing.get_context("spawn")
        self._free = context.Queue()  # slot indices
        self._full = context.Queue()  # (slot index, meta)
        for slot in range(num_slots):
            self._free.put(slot)

    def acquire(self, timeout: float | None = None) -> int | None:
        """A free slot to write into, or None if none came free within `timeout` seconds."""
        return get_or_none(self._free, timeout)

    def commit(self, slot: int, meta: dict) -> None:
        """Hand a written slot to the learner with a small picklable message."""
        self._full.put((self._checked(slot), meta))

    def take(self, timeout: float | None = None) -> tuple[int, dict] | None:
        """The next full slot and its message, in commit order, or None after `timeout` seconds."""
        return get_or_none(self._full, timeout)

    def release(self, slot: int) -> None:
        """Give a slot back to the collectors; its contents may be overwritten from now on."""
        self._free.put(self._checked(slot))

    def drain_one(self) -> None:
        """Take and release one full slot if one comes within 0.1 s: lets a collector that is
        committing while the run shuts down finish its message and exit."""
        taken = self.take(timeout=0.1)
        if taken is not None:
            self.release(taken[0])

    def views(self, slot: int) -> dict[str, np.ndarray]:
        """Numpy arrays over the slot's memory; `policy_version` is 0-d: `views["policy_version"][...] = v`."""
        segment = self._require_attached()
        base = self._checked(slot) * self.layout.nbytes
        return {name: array_view(segment, f.shape, f.dtype, base + f.offset) for name, f in self.layout.fields.items()}

    def _checked(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} is not in the ring's 0..{self.num_slots - 1}")
        return slot
