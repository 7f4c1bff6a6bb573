"""Off-policy replay in shared memory, and the stager that samples it ahead of the learner.

Layout. Each field is one array (rows, envs, ...) in one segment. `envs` counts the envs of
every collector; collector c owns the env columns [c·E, (c+1)·E) and writes its env step s
into row s mod rows, so every env's column holds its last `rows` transitions in order, which
is what n-step returns need. A transition (float32):

    policy_obs, critic_obs            (rows, envs, P | C)  the observation acted on
    actions                           (rows, envs, A)      as the actor gave them, before clipping
    rewards, terminated, truncated    (rows, envs)
    next_policy_obs, next_critic_obs  (rows, envs, P | C)  after the step; the episode's final
                                                           observation where the step ended it

Handshake. A collector writes a row, then commits its total step count with a small message
through one bounded queue. The stager samples only committed rows, so it never returns a
row that no collector wrote. Because the queue is bounded, a collector is never more than
`guard_rows` steps ahead of what the stager has read; those are the oldest rows of its ring
(they may be being overwritten), and sampling leaves them out.

Sample-before-transfer. `ReplayStager` is a thread that, while the learner updates on batch
N, waits until the update-to-data ratio allows batch N+1, samples it (n-step returns and
bootstrap factors included), gathers it straight into a pinned host buffer and starts its copy
to the device (`hetlab.runtime.staging.HostToDevice`). The learner's `next()` then only waits
when the collectors are behind the ratio.

The batch an off-policy algorithm's `update` receives (B transitions, float32):

    policy_obs, critic_obs, actions            at step t
    rewards                                    Σ_{i<k} γ^i r_{t+i} over k ≤ n steps (stopping where the episode ended)
    next_policy_obs, next_critic_obs           the observation after step t+k-1
    bootstrap                                  γ^k, or 0 where the window ended in a termination
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from hetlab.devices import LearnerDevice
from hetlab.errors import UserError
from hetlab.runtime import POLL_S, put_unless_stopped
from hetlab.runtime.shm import ALIGN, Field, SharedRegion, ShmRequirement, array_view, lay_out
from hetlab.runtime.staging import BackgroundStager, HostToDevice

HEADER_BYTES = ALIGN  # int64 learner update count, read by collectors to keep the update-to-data ratio


@dataclass(frozen=True)
class ReplayLayout:
    """`rows` steps of `collectors` × `envs_per_collector` envs (see the module docstring)."""

    rows: int
    collectors: int
    envs_per_collector: int
    obs_sizes: Mapping[str, int]  # {"policy": P, "critic": C}
    action_size: int
    queue_size: int = 8  # commit messages in flight; bounds how far collectors run ahead of the stager
    relay_depth: int = 0  # commit messages a relay between collectors and that queue may also hold (a cluster's)

    def __post_init__(self):
        object.__setattr__(self, "obs_sizes", dict(self.obs_sizes))
        if self.rows < 2 * self.guard_rows:
            raise UserError(
                f"the replay buffer keeps only {self.rows} steps per env, fewer than the {2 * self.guard_rows} the "
                f"collectors need as a margin; raise --off-policy.replay-capacity or use fewer envs"
            )

    @property
    def envs(self) -> int:
        return self.collectors * self.envs_per_collector

    @property
    def guard_rows(self) -> int:
        # Rows a collector may have written beyond its last commit the stager has read: every
        # queued message could be its own, plus one blocked in put(), plus the one being written,
        # plus those a relay holds.
        return self.queue_size + 2 + self.relay_depth

    @property
    def capacity(self) -> int:
        """Transitions kept."""
        return self.rows * self.envs

    @cached_property
    def _fields_and_size(self) -> tuple[dict[str, Field], int]:
        r, n, a = self.rows, self.envs, self.action_size
        p, c = self.obs_sizes["policy"], self.obs_sizes["critic"]
        f32 = np.dtype(np.float32)
        shapes = {
            "policy_obs": (r, n, p), "critic_obs": (r, n, c), "actions": (r, n, a),
            "rewards": (r, n), "terminated": (r, n), "truncated": (r, n),
            "next_policy_obs": (r, n, p), "next_critic_obs": (r, n, c),
        }
        return lay_out({name: (shape, f32) for name, shape in shapes.items()}, start=HEADER_BYTES)

    @property
    def fields(self) -> dict[str, Field]:
        return self._fields_and_size[0]

    @property
    def nbytes(self) -> int:
        return self._fields_and_size[1]

    @property
    def transition_bytes(self) -> int:
        return sum(f.nbytes for f in self.fields.values()) // self.capacity

    @property
    def requirement(self) -> ShmRequirement:
        """The shared memory the buffer needs: for checks before any work."""
        return ShmRequirement(
            self.nbytes, f"the replay buffer ({self.capacity:,} transitions of {self.transition_bytes} bytes)",
            "lower --off-policy.replay-capacity",
        )


class ReplayBuffer(SharedRegion):
    """Created by the learner (which unlinks it in `close()`); pass it to spawned collectors,
    which `attach()`, `write()` rows and `commit()` them. The stager `receive()`s commits."""

    _shared = ("layout", "_commits")

    def __init__(self, layout: ReplayLayout):
        self.layout = layout
        self._create("hetlab_replay", layout.requirement)
        self._commits = multiprocessing.get_context("spawn").Queue(maxsize=layout.queue_size)

    def _map(self) -> None:
        segment = self._require_attached()
        self.arrays = {name: array_view(segment, f.shape, f.dtype, f.offset) for name, f in self.layout.fields.items()}
        self._updates = array_view(segment, (), np.int64, 0)

    def _unmap(self) -> None:
        self.arrays = {}
        self._updates = None

    # Collector side ------------------------------------------------------------------------
    def write(self, collector: int, step: int, transition: Mapping[str, np.ndarray]) -> None:
        """Write a collector's env step `step` (every field, shape (E, ...)) into its row."""
        envs = self.columns(collector)
        row = step % self.layout.rows
        for name, values in transition.items():
            self.arrays[name][row, envs] = values

    def end_episodes(self, collector: int, step: int) -> None:
        """A collector that starts over at `step` with fresh episodes (a resumed run, a replaced
        collector) marks the episodes of its step `step - 1` truncated where they did not
        terminate, so that no n-step return runs on into the new ones. Safe while the stager
        samples: it reaches step `step` only after that step's commit, which comes later."""
        if step < 1:
            return
        row, envs = (step - 1) % self.layout.rows, self.columns(collector)
        alive = self.arrays["terminated"][row, envs] == 0
        self.arrays["truncated"][row, envs] = np.where(alive, 1.0, self.arrays["truncated"][row, envs])

    def commit(self, meta: dict, stop=None) -> bool:
        """Tell the stager that `meta["collector"]` has written `meta["steps"]` steps in total.
        Blocks while the queue is full; returns False if `stop` was set meanwhile."""
        return put_unless_stopped(self._commits, meta, stop)

    @property
    def learner_updates(self) -> int:
        """Gradient updates the learner has done (published by the learner)."""
        return int(self._updates[()])

    # Learner side --------------------------------------------------------------------------
    def publish_updates(self, updates: int) -> None:
        self._updates[()] = updates

    def receive(self, timeout: float | None) -> dict | None:
        """The next commit message, or None after `timeout` seconds (0: do not wait)."""
        try:
            return self._commits.get(timeout=timeout) if timeout else self._commits.get_nowait()
        except queue.Empty:
            return None

    def columns(self, collector: int) -> slice:
        e = self.layout.envs_per_collector
        return slice(collector * e, (collector + 1) * e)

    def window(self, steps: int) -> tuple[int, int]:
        """The steps [first, end) of a collector that has committed `steps` that may be sampled."""
        return max(0, steps - self.layout.rows + self.layout.guard_rows), steps

    # Snapshots for resuming ----------------------------------------------------------------
    def save(self, directory: Path, steps: np.ndarray) -> None:
        """Each collector's sampleable window as `c<i>/<field>.npy`, oldest step first."""
        for collector, committed in enumerate(steps.tolist()):
            first, end = self.window(committed)
            rows = np.arange(first, end) % self.layout.rows
            out = directory / f"c{collector}"
            out.mkdir(parents=True)
            for name, array in self.arrays.items():
                np.save(out / f"{name}.npy", array[rows, self.columns(collector)])

    def load(self, directory: Path, steps: np.ndarray) -> None:
        """Refill from `save`'s files (memory-mapped, so nothing is read twice). The collectors
        then start new episodes and mark the last step's episodes ended (`end_episodes`)."""
        for collector, committed in enumerate(steps.tolist()):
            first, end = self.window(committed)
            rows = np.arange(first, end) % self.layout.rows
            for name, array in self.arrays.items():
                path = directory / f"c{collector}" / f"{name}.npy"
                try:
                    saved = np.load(path, mmap_mode="r")
                except (OSError, ValueError) as e:
                    raise UserError(f"replay snapshot {path} is unreadable ({e}); resume without --off-policy.save-replay") from e
                if saved.shape != (end - first, self.layout.envs_per_collector, *array.shape[2:]):
                    raise UserError(f"replay snapshot {path} has shape {saved.shape}, which does not fit this run's buffer")
                array[rows, self.columns(collector)] = saved


def sample(replay: ReplayBuffer, steps: np.ndarray, rng: np.random.Generator, gamma: float, n_step: int,
           out: dict[str, np.ndarray]) -> None:
    """Fill `out` (the batch fields, first axis B) with B transitions drawn uniformly from the
    committed windows, with n-step rewards and bootstrap factors (see the module docstring)."""
    layout, arrays = replay.layout, replay.arrays
    batch_size, e = len(out["rewards"]), layout.envs_per_collector
    windows = np.array([replay.window(s) for s in steps.tolist()]).reshape(-1, 2)
    counts = (windows[:, 1] - windows[:, 0]) * e  # transitions each collector may give
    draws = rng.integers(0, counts.sum(), batch_size)
    collector = np.searchsorted(np.cumsum(counts), draws, side="right")
    within = draws - (np.cumsum(counts) - counts)[collector]
    step = windows[collector, 0] + within // e
    env = collector * e + within % e
    end = windows[collector, 1]

    # Walk up to n steps forward from each drawn step, stopping at the episode's end or at the
    # newest committed step; `last` is the step whose next observation bootstraps.
    rows = layout.rows
    rewards, discount = np.zeros(batch_size, np.float32), np.ones(batch_size, np.float32)
    running = np.ones(batch_size, bool)
    terminated = np.zeros(batch_size, bool)
    last = step.copy()
    for k in range(n_step):
        active = running & (step + k < end)
        row = (step + k) % rows
        rewards += np.where(active, discount * arrays["rewards"][row, env], 0.0)
        discount = np.where(active, discount * gamma, discount)
        last = np.where(active, step + k, last)
        ended_term = arrays["terminated"][row, env] > 0
        terminated |= active & ended_term
        running = active & ~ended_term & ~(arrays["truncated"][row, env] > 0)
    out["rewards"][:] = rewards
    out["bootstrap"][:] = np.where(terminated, 0.0, discount)

    flat = step % rows * layout.envs + env
    flat_last = last % rows * layout.envs + env
    for name in ("policy_obs", "critic_obs", "actions"):
        array = arrays[name]
        np.take(array.reshape(rows * layout.envs, *array.shape[2:]), flat, axis=0, out=out[name])
    for name in ("next_policy_obs", "next_critic_obs"):
        array = arrays[name]
        np.take(array.reshape(rows * layout.envs, *array.shape[2:]), flat_last, axis=0, out=out[name])


class ReplayStager(BackgroundStager):
    """Replay minibatches to the device (see the module docstring). `next()` returns the batch,
    the commit messages that arrived since the previous one, and the stager's span for it,
    ("sample_transfer", t0, t1).

    `updates_per_step` updates are allowed per vectorised env step (every env stepping once,
    counted as the mean over collectors) once `learning_starts` steps are in, counting the
    updates from `update_offset` (those done before the buffer's data began). `hold()` stops it
    reading commits (and so the collectors from writing more than the guard rows).
    """

    thread_name = "hetlab-replay-stager"

    def __init__(self, replay: ReplayBuffer, device: LearnerDevice, *, batch_size: int, gamma: float, n_step: int,
                 updates_per_step: float, learning_starts: int, seed: int, steps: np.ndarray | None = None,
                 updates: int = 0, update_offset: int = 0):
        self._replay = replay
        self._gamma, self._n_step = gamma, n_step
        self._updates_per_step, self._learning_starts = updates_per_step, learning_starts
        layout = replay.layout
        p, c, a = layout.obs_sizes["policy"], layout.obs_sizes["critic"], layout.action_size
        b, f32 = batch_size, torch.float32
        super().__init__(HostToDevice({
            "policy_obs": ((b, p), f32), "critic_obs": ((b, c), f32), "actions": ((b, a), f32),
            "rewards": ((b,), f32), "bootstrap": ((b,), f32),
            "next_policy_obs": ((b, p), f32), "next_critic_obs": ((b, c), f32),
        }, device))
        self.steps = np.zeros(layout.collectors, np.int64) if steps is None else steps.astype(np.int64).copy()
        self._staged = updates  # batches handed out so far, resumed runs included
        self._update_offset = update_offset
        self._rng = np.random.default_rng(seed)
        self._metas: list[dict] = []
        self._lock = threading.RLock()  # guards `steps` for readers in the learner's thread; re-entered under hold()
        self._holding = threading.Event()

    @property
    def vector_steps(self) -> float:
        """Env steps per env collected so far (the mean over collectors)."""
        with self._lock:
            return float(self.steps.mean())

    def snapshot_steps(self) -> np.ndarray:
        with self._lock:
            return self.steps.copy()

    @contextmanager
    def hold(self):
        self._holding.set()  # makes the thread stand back: a plain lock could starve the learner
        try:
            with self._lock:
                yield
        finally:
            self._holding.clear()

    def _allowed(self) -> bool:
        collected = float(self.steps.mean()) - self._learning_starts
        return collected >= 0 and self._staged - self._update_offset < self._updates_per_step * (collected + 1)

    def _receive(self, timeout: float) -> None:
        meta = self._replay.receive(timeout)
        while meta is not None:
            self.steps[meta["collector"]] = meta["steps"]
            self._metas.append(meta)
            meta = self._replay.receive(0)

    def _stage(self, buffer: int) -> tuple | None:
        timeout = 0.0  # first take what has arrived, then wait for more as long as needed
        while True:
            if self._stopping.is_set():
                return None
            if self._holding.is_set():
                time.sleep(0.001)
                continue
            with self._lock:
                self._receive(timeout)
                if self._allowed():
                    t0 = time.perf_counter()
                    sample(self._replay, self.steps, self._rng, self._gamma, self._n_step, self._copier.host(buffer))
                    break
            timeout = POLL_S
        batch, copied = self._copier.to_device(buffer)
        metas, self._metas = self._metas, []
        self._staged += 1
        return batch, metas, ("sample_transfer", t0, time.perf_counter()), copied
