"""The learner's shared regions as a collector on a Ray worker sees them, and the learner's ends.

A local collector process inherits the rollout ring's and replay buffer's queues; a Ray actor
cannot, so each region reaches it as a *port* that meets the same collector-side Protocol as the
region (`hetlab.runtime.collector_side`), and the learner runs a *relay* for it that moves the
messages the queues would:

- `RingPort` / `RingRelay`: the relay keeps the collector supplied with one free slot of the
  learner's ring and commits what comes back. On the learner's node the slot is the learner's
  shared memory, written in place; on another node it is the worker's own arrays, and they
  come back with the commit through Ray's object store, to be written into the slot first.
- `ReplayPort` / `ReplayRelay`: commits come back in batches; on another node each carries
  the rows (and episode cuts) written since the previous one, which the relay writes before
  committing. A relay holds up to `RELAY_DEPTH` messages more than the replay's queue, which
  the replay layout's guard rows allow for.
- `WeightsPort` / `LearnerStatePusher`: on another node the newest weights arrive as a
  versioned Ray object, with the learner's update count (for the update-to-data ratio). On the
  learner's node the collector reads the learner's weight broadcast and replay header directly.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import ray
import torch

from hetlab.runtime import POLL_S, get_or_none, put_unless_stopped
from hetlab.runtime.ray import RELAY_BATCH
from hetlab.runtime.replay import ReplayBuffer
from hetlab.runtime.rollout_ring import RolloutRing
from hetlab.runtime.weights import UNPUBLISHED, WeightBroadcast, unflatten

PUSH_EVERY_S = 0.01  # the least time between two pushes of the learner's state to a collector elsewhere


def region_kind(obj) -> str | None:
    """"ring", "replay" or "weights" for a shared region a collector job carries, else None."""
    for kind, cls in (("ring", RolloutRing), ("replay", ReplayBuffer), ("weights", WeightBroadcast)):
        if isinstance(obj, cls):
            return kind
    return None


def make_port(kind: str, region, local: bool):
    """The actor's stand-in for `region` (a by-name handle): on the learner's node the weight
    broadcast is the region itself; everything else is a port."""
    if kind == "ring":
        return RingPort(region, local)
    if kind == "replay":
        return ReplayPort(region, local)
    return region if local else WeightsPort(region)


class _Port:
    """A port over a region: on the learner's node it maps the learner's segment (`_region`),
    elsewhere `_region` is None and the port keeps what it needs itself."""

    def __init__(self, region, local: bool):
        self._region = region if local else None

    def attach(self) -> None:
        if self._region is not None:
            self._region.attach()

    def close(self) -> None:
        if self._region is not None:
            self._region.close()


# ------------------------------------------------------------------------------------ ring --
class RingPort(_Port):
    """A RolloutRing for a collector on a Ray worker (see the module docstring)."""

    def __init__(self, ring: RolloutRing, local: bool):
        super().__init__(ring, local)
        self.layout, self.num_slots = ring.layout, ring.num_slots
        self._arrays: dict[int, dict[str, np.ndarray]] = {}  # elsewhere: each slot's arrays, made on first use
        self._free: queue.Queue[int] = queue.Queue()
        self._full: queue.Queue[tuple[int, dict]] = queue.Queue()

    def acquire(self, timeout: float | None = None) -> int | None:
        return get_or_none(self._free, timeout)

    def commit(self, slot: int, meta: dict) -> None:
        self._full.put((slot, meta))

    def views(self, slot: int) -> dict[str, np.ndarray]:
        if self._region is not None:
            return self._region.views(slot)
        if slot not in self._arrays:
            self._arrays[slot] = {name: np.zeros(f.shape, f.dtype) for name, f in self.layout.fields.items()}
        return self._arrays[slot]

    # The relay's side, called through the actor.
    def give(self, slot: int) -> None:
        self._free.put(slot)

    def take(self, timeout: float) -> list[tuple[int, dict, dict[str, np.ndarray] | None]]:
        """The slots committed since the last call (waiting up to `timeout` for one), each with
        its arrays when they are not the learner's memory."""
        taken = []
        try:
            taken.append(self._full.get(timeout=timeout))
            while True:
                taken.append(self._full.get_nowait())
        except queue.Empty:
            pass
        return [(slot, meta, None if self._region is not None else self._arrays[slot]) for slot, meta in taken]


class Relay(ABC):
    """The learner's end of a port: threads that move one collector's messages until `stop()`.
    `on_message(meta)` sees each commit as it is passed on; `on_error(text)` a relay that broke
    (not one whose actor died: the pool learns that from the actor itself)."""

    def __init__(self, actor, on_message: Callable[[dict], None], on_error: Callable[[str], None]):
        self._actor, self._on_message, self._on_error = actor, on_message, on_error
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.bytes = 0  # data that crossed from the collector's node

    def _start(self, *loops: Callable[[], None]) -> None:
        for loop in loops:
            thread = threading.Thread(target=self._guarded, args=(loop,), name=f"hetlab-relay-{loop.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _guarded(self, loop: Callable[[], None]) -> None:
        try:
            loop()
        except ray.exceptions.RayActorError:
            pass
        except Exception as e:  # a bug here would otherwise only show as a stalled run
            if not self._stopping.is_set():
                self._on_error(f"{type(self).__name__} failed: {type(e).__name__}: {e}")

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=10 * POLL_S)

    @abstractmethod
    def settle_loss(self) -> int:
        """Once the collector is gone (and the relay stopped): give back what it held of the
        learner's region, and return at most how many env steps it had collected and not delivered."""


class RingRelay(Relay):
    def __init__(self, ring: RolloutRing, actor, on_message, on_error):
        super().__init__(actor, on_message, on_error)
        self._ring = ring
        self._room = threading.Semaphore(1)  # one free slot at a time at the collector, as a local one would take
        self._lock = threading.Lock()
        self.held: set[int] = set()  # slots given to the collector and not yet committed
        self._start(self._supply, self._receive)

    def _supply(self) -> None:
        while not self._stopping.is_set():
            if not self._room.acquire(timeout=POLL_S):
                continue
            slot = None
            while slot is None and not self._stopping.is_set():
                slot = self._ring.acquire(timeout=POLL_S)
            if slot is None:
                return
            with self._lock:
                self.held.add(slot)
            self._actor.give_slot.remote(slot)

    def _receive(self) -> None:
        while not self._stopping.is_set():
            for slot, meta, arrays in ray.get(self._actor.take_rollouts.remote(POLL_S)):
                if arrays is not None:
                    for name, view in self._ring.views(slot).items():
                        view[...] = arrays[name]
                        self.bytes += arrays[name].nbytes
                with self._lock:
                    self.held.discard(slot)
                self._ring.commit(slot, meta)
                self._on_message(meta)
                self._room.release()

    def settle_loss(self) -> int:
        # Its slots go back to the ring; each held a rollout in the making.
        with self._lock:
            held, self.held = self.held, set()
        for slot in held:
            self._ring.release(slot)
        return len(held) * self._ring.layout.horizon * self._ring.layout.num_envs


# ---------------------------------------------------------------------------------- replay --
class ReplayPort(_Port):
    """A ReplayBuffer for a collector on a Ray worker (see the module docstring)."""

    def __init__(self, replay: ReplayBuffer, local: bool):
        super().__init__(replay, local)
        self.layout = replay.layout
        self._messages: queue.Queue[tuple[list, dict]] = queue.Queue(maxsize=RELAY_BATCH)
        self._writes: list[tuple] = []  # elsewhere: what the learner must write before the next commit
        self._updates = 0  # elsewhere: the learner's update count, as last pushed

    def write(self, collector: int, step: int, transition: dict[str, np.ndarray]) -> None:
        if self._region is not None:
            self._region.write(collector, step, transition)
        else:
            self._writes.append(("write", collector, step, {name: np.array(v, np.float32) for name, v in transition.items()}))

    def end_episodes(self, collector: int, step: int) -> None:
        if self._region is not None:
            self._region.end_episodes(collector, step)
        else:
            self._writes.append(("end_episodes", collector, step))

    def commit(self, meta: dict, stop=None) -> bool:
        if not put_unless_stopped(self._messages, (self._writes, meta), stop):
            return False
        self._writes = []
        return True

    @property
    def learner_updates(self) -> int:
        return self._region.learner_updates if self._region is not None else self._updates

    # The relay's and pusher's side, called through the actor.
    def set_learner_updates(self, updates: int) -> None:
        self._updates = updates

    def take(self, timeout: float) -> list[tuple[list, dict]]:
        taken = []
        try:
            taken.append(self._messages.get(timeout=timeout))
            while len(taken) < RELAY_BATCH:
                taken.append(self._messages.get_nowait())
        except queue.Empty:
            pass
        return taken


class ReplayRelay(Relay):
    def __init__(self, replay: ReplayBuffer, actor, on_message, on_error):
        super().__init__(actor, on_message, on_error)
        self._replay = replay
        self._start(self._receive)

    def _receive(self) -> None:
        while not self._stopping.is_set():
            for writes, meta in ray.get(self._actor.take_commits.remote(POLL_S)):
                for op, *args in writes:
                    if op == "write":
                        self._replay.write(*args)
                        self.bytes += sum(values.nbytes for values in args[-1].values())
                    else:
                        self._replay.end_episodes(*args)
                if not self._replay.commit(meta, self._stopping):
                    return
                self._on_message(meta)

    def settle_loss(self) -> int:
        # Its rows past the last commit are never sampled; lost: what may have sat in the
        # collector's queue, and the step it was writing.
        return (RELAY_BATCH + 1) * self._replay.layout.envs_per_collector


# --------------------------------------------------------------------------------- weights --
class WeightsPort:
    """A WeightBroadcast for a collector on another node: the newest weights the learner pushed."""

    def __init__(self, broadcast: WeightBroadcast):
        self.entries = broadcast.entries
        self._lock = threading.Lock()
        self._version = UNPUBLISHED
        self._floats = np.empty(broadcast.float_count, np.float32)
        self._ints = np.empty(broadcast.int_count, np.int64)

    def attach(self) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def version(self) -> int:
        return self._version

    def read(self, into: dict[str, torch.Tensor], timeout: float | None = None) -> int:
        with self._lock:
            if self._version != UNPUBLISHED:
                unflatten(self.entries, self._floats, self._ints, into)
            return self._version

    def set(self, version: int, floats: np.ndarray, ints: np.ndarray) -> None:
        with self._lock:
            self._floats[...] = floats
            self._ints[...] = ints
            self._version = version


class LearnerStatePusher:
    """Pushes the learner's newest weights (one Ray object per version, shared by all) and its
    update count to the collectors on other nodes: a new collector at once, the others at most
    every PUSH_EVERY_S, always the newest."""

    def __init__(self, weights: WeightBroadcast | None, replay: ReplayBuffer | None):
        self._weights, self._replay = weights, replay
        self._actors: dict[int, tuple[int, object]] = {}  # collector index → (token, actor)
        self._tokens = 0  # a replacement collector gets a new token, so it is sent everything afresh
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.bytes = 0  # weights sent, counted once per collector that receives them
        self._thread = threading.Thread(target=self._push, name="hetlab-state-pusher", daemon=True)
        self._thread.start()

    def add(self, index: int, actor) -> None:
        with self._lock:
            self._tokens += 1
            self._actors[index] = (self._tokens, actor)

    def remove(self, index: int) -> None:
        with self._lock:
            self._actors.pop(index, None)

    def _push(self) -> None:
        sent: dict[int, tuple] = {}  # token → (weights version, update count) last sent
        payload, payload_version, payload_bytes, last_push = None, None, 0, 0.0
        while not self._stopping.wait(0.001):
            with self._lock:
                actors = list(self._actors.values())
            version = self._weights.version if self._weights is not None else None
            updates = self._replay.learner_updates if self._replay is not None else None
            due = [(token, actor) for token, actor in actors if sent.get(token) != (version, updates)]
            if not due or (time.monotonic() - last_push < PUSH_EVERY_S and all(token in sent for token, _ in due)):
                continue
            if version not in (None, UNPUBLISHED) and version != payload_version:
                payload_version, floats, ints = self._weights.snapshot(timeout=1.0)
                payload, payload_bytes = ray.put((payload_version, floats, ints)), floats.nbytes + ints.nbytes
            for token, actor in due:
                new_weights = payload is not None and sent.get(token, (None,))[0] != version
                actor.sync.remote(payload if new_weights else None, updates)
                self.bytes += payload_bytes if new_weights else 0
                sent[token] = (version, updates)
            last_push = time.monotonic()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=1.0)
