"""The rollout ring: K fixed-horizon rollout slots in one shared-memory segment.

The learner creates the ring; collectors receive it as an argument of a spawned process and
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
import queue
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetlab.errors import UserError
from hetlab.runtime.shm import Segment, array_view, attach_segment, check_fits, close_segment, create_segment

ALIGN = 64  # every field starts on its own cache line: aligned views, no false sharing between fields


@dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # bytes from the start of the slot

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


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
    def fields(self) -> dict[str, Field]:
        """Name → shape, dtype and offset in the slot. `policy_version` is one int64 per slot."""
        t, n, a = self.horizon, self.num_envs, self.action_size
        p, c = self.obs_sizes["policy"], self.obs_sizes["critic"]
        f32 = np.dtype(np.float32)
        specs = {
            "policy_version": ((), np.dtype(np.int64)),
            "policy_obs": ((t + 1, n, p), f32),
            "critic_obs": ((t + 1, n, c), f32),
            "actions": ((t, n, a), f32),
            "log_probs": ((t, n), f32),
            "rewards": ((t, n), f32),
            "terminated": ((t, n), f32),
            "truncated": ((t, n), f32),
            "final_critic_obs": ((t, n, c), f32),
        }
        fields, offset = {}, 0
        for name, (shape, dtype) in specs.items():
            fields[name] = Field(shape, dtype, offset)
            offset += _aligned(fields[name].nbytes)
        return fields

    @property
    def nbytes(self) -> int:
        """Bytes of one slot (a multiple of ALIGN, so every slot starts aligned too)."""
        last = list(self.fields.values())[-1]
        return last.offset + _aligned(last.nbytes)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class RolloutRing:
    """K slots of `layout` in one segment, handed between processes through free/full queues.

    Created by the learner, which unlinks the segment in `close()`. Pass the ring to a
    `multiprocessing.get_context("spawn").Process` and call `attach()` there before `views()`.
    """

    def __init__(self, layout: RolloutLayout, num_slots: int):
        if num_slots < 1:
            raise UserError(f"the rollout ring needs at least one slot, got {num_slots}")
        self.layout, self.num_slots = layout, num_slots
        self._segment: Segment | None = create_segment("hetlab_ring", **_size_and_advice(layout, num_slots))
        self.name = self._segment.name
        self._creator, self._closed = True, False
        context = multiprocessing.get_context("spawn")
        self._free = context.Queue()  # slot indices
        self._full = context.Queue()  # (slot index, meta)
        for slot in range(num_slots):
            self._free.put(slot)

    # Pickling (only allowed while spawning a process, because of the queues) sends the
    # segment's name; the child maps it in attach().
    def __getstate__(self) -> dict:
        return {"layout": self.layout, "num_slots": self.num_slots, "name": self.name,
                "_free": self._free, "_full": self._full}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _segment=None, _creator=False, _closed=False)

    def attach(self) -> None:
        """Map the segment in this process (a no-op in the learner, or when already attached)."""
        if self._segment is None and not self._closed:
            self._segment = attach_segment(self.name)

    def acquire(self, timeout: float | None = None) -> int | None:
        """A free slot to write into, or None if none came free within `timeout` seconds."""
        try:
            return self._free.get(timeout=timeout)
        except queue.Empty:
            return None

    def commit(self, slot: int, meta: dict) -> None:
        """Hand a written slot to the learner with a small picklable message."""
        self._full.put((self._checked(slot), meta))

    def take(self, timeout: float | None = None) -> tuple[int, dict] | None:
        """The next full slot and its message, in commit order, or None after `timeout` seconds."""
        try:
            return self._full.get(timeout=timeout)
        except queue.Empty:
            return None

    def release(self, slot: int) -> None:
        """Give a slot back to the collectors; its contents may be overwritten from now on."""
        self._free.put(self._checked(slot))

    def views(self, slot: int) -> dict[str, np.ndarray]:
        """Numpy arrays over the slot's memory; `policy_version` is 0-d: `views["policy_version"][...] = v`."""
        if self._segment is None:
            raise RuntimeError("the ring is closed or not attached in this process; call attach() first")
        base = self._checked(slot) * self.layout.nbytes
        return {
            name: array_view(self._segment, f.shape, f.dtype, base + f.offset)
            for name, f in self.layout.fields.items()
        }

    @staticmethod
    def check_fits(layout: RolloutLayout, num_slots: int) -> None:
        """UserError unless a ring of this size fits in shared memory: for checks before any work."""
        check_fits(**_size_and_advice(layout, num_slots))

    def close(self) -> None:
        """Unmap; the learner also unlinks the segment. Idempotent, safe in `finally` blocks."""
        if self._closed:
            return
        self._closed = True
        segment, self._segment = self._segment, None
        if segment is not None:
            close_segment(segment, unlink=self._creator)
        if self._creator:
            # Nothing the learner still buffers for the queues matters now: do not let
            # interpreter exit wait to flush it into pipes that nobody reads any more. A
            # collector, though, must flush: a message cut off mid-write would leave its
            # reader blocked on the rest for ever.
            for q in (self._free, self._full):
                q.cancel_join_thread()
                q.close()

    def __enter__(self) -> RolloutRing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _checked(self, slot: int) -> int:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"slot {slot} is not in the ring's 0..{self.num_slots - 1}")
        return slot


def _size_and_advice(layout: RolloutLayout, num_slots: int) -> dict:
    return {
        "nbytes": num_slots * layout.nbytes,
        "what": f"the rollout ring ({num_slots} slots of {layout.horizon} steps × {layout.num_envs} envs)",
        "fix": "use fewer envs, a shorter horizon or fewer ring slots",
    }
