"""Policy inference on the learner device for the collectors: a request/response ring.

Each collector has a slot in one shared segment (`InferenceRing`): its observations (E, P),
the actions (E, A) written back, and the weight version that made them. A collector writes
its observations, puts its index on the request queue and waits on its own semaphore. The
server thread (in the learner process) takes every pending request at once, runs the serving
actor on the device over all of them as one batch, writes the actions back and releases each
requester.

The serving actor is a copy of the learner's, refreshed by `sync()` under a lock, so a
forward pass never sees weights halfway through an optimizer step: the versioned weight
sync, inside one process.
"""

from __future__ import annotations

import copy
import multiprocessing
import queue
import threading
import time

import numpy as np
import torch
from torch import nn

from hetlab.runtime import POLL_S
from hetlab.runtime.shm import SharedRegion, ShmRequirement, array_view


class InferenceRing(SharedRegion):
    """The collectors' slots and the request/response handshake (see the module docstring)."""

    _shared = ("collectors", "envs", "obs_size", "action_size", "_requests", "_responses")

    def __init__(self, collectors: int, envs_per_collector: int, obs_size: int, action_size: int):
        self.collectors, self.envs = collectors, envs_per_collector
        self.obs_size, self.action_size = obs_size, action_size
        slot_floats = envs_per_collector * (obs_size + action_size)
        self._create("hetlab_inference", ShmRequirement(collectors * (8 + 4 * slot_floats),
                                                        "the inference request/response ring", "use fewer envs"))
        context = multiprocessing.get_context("spawn")
        self._requests = context.Queue()
        self._responses = [context.Semaphore(0) for _ in range(collectors)]

    def _map(self) -> None:
        n, e, p, a = self.collectors, self.envs, self.obs_size, self.action_size
        segment = self._require_attached()
        self._versions = array_view(segment, (n,), np.int64, 0)
        floats = array_view(segment, (n, e * (p + a)), np.float32, 8 * n)
        self._obs = [floats[c, :e * p].reshape(e, p) for c in range(n)]
        self._actions = [floats[c, e * p:].reshape(e, a) for c in range(n)]

    def _unmap(self) -> None:
        self._obs = self._actions = self._versions = None

    # Collector side ------------------------------------------------------------------------
    def request(self, collector: int, obs: np.ndarray, stop) -> tuple[np.ndarray, int] | None:
        """Actions for `obs` and the weight version that made them; None if `stop` is set while waiting."""
        self._obs[collector][...] = obs
        self._requests.put(collector)
        while not self._responses[collector].acquire(timeout=POLL_S):
            if stop.is_set():
                return None
        return self._actions[collector].copy(), int(self._versions[collector])

    # Server side ---------------------------------------------------------------------------
    def pending(self, timeout: float) -> list[int]:
        """Every collector waiting for actions, after waiting up to `timeout` s for the first."""
        try:
            waiting = [self._requests.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                waiting.append(self._requests.get_nowait())
            except queue.Empty:
                return waiting

    def observations(self, collectors: list[int]) -> np.ndarray:
        return np.concatenate([self._obs[c] for c in collectors])

    def respond(self, collectors: list[int], actions: np.ndarray, version: int) -> None:
        """Write each collector's rows of `actions` back and wake it."""
        for i, c in enumerate(collectors):
            self._actions[c][...] = actions[i * self.envs:(i + 1) * self.envs]
            self._versions[c] = version
            self._responses[c].release()


class InferenceServer:
    """Learner: `start()`, `sync()` after updates, `stop()`, `close()`. Collectors get
    `client(index)` (picklable into a spawned process)."""

    def __init__(self, actor: nn.Module, collectors: int, envs_per_collector: int, obs_size: int, action_size: int,
                 device: torch.device, seed: int):
        self.ring = InferenceRing(collectors, envs_per_collector, obs_size, action_size)
        self._actor = copy.deepcopy(actor).eval()
        self._version = -1
        self._device = device
        self._generator = torch.Generator(device=device).manual_seed(seed)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._spans: list[tuple[str, float, float]] = []  # busy time, handed to the learner's timeline
        self.error: BaseException | None = None

    def client(self, collector: int) -> InferenceClient:
        return InferenceClient(self.ring, collector)

    def sync(self, actor: nn.Module, version: int) -> None:
        """Copy the learner's actor into the serving one."""
        with self._lock, torch.no_grad():
            for target, source in zip(self._actor.state_dict().values(), actor.state_dict().values()):
                target.copy_(source)
            self._version = version

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="hetlab-inference", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def take_spans(self) -> list[tuple[str, float, float]]:
        """The serving thread's busy spans since the last call."""
        spans, self._spans = self._spans, []
        return spans

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                waiting = self.ring.pending(POLL_S)
                if not waiting:
                    continue
                t0 = time.perf_counter()
                obs = torch.from_numpy(self.ring.observations(waiting)).to(self._device)
                with self._lock, torch.no_grad():
                    actions = self._actor.explore(obs, self._generator).cpu().numpy()
                    version = self._version
                self.ring.respond(waiting, actions, version)
                self._spans.append(("inference", t0, time.perf_counter()))
        except BaseException as error:
            self.error = error

    def raise_if_failed(self) -> None:
        """The serving thread's failure, raised in the caller (the learner's wait loop)."""
        if self.error is not None:
            raise RuntimeError("the inference server failed") from self.error

    def close(self) -> None:
        self.ring.close()

    def __enter__(self) -> InferenceServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InferenceClient:
    """A collector's end of the server: `attach()`, then `explore(obs, stop)` per step."""

    def __init__(self, ring: InferenceRing, collector: int):
        self._ring, self._collector = ring, collector

    def attach(self) -> None:
        self._ring.attach()

    def explore(self, obs: np.ndarray, stop) -> tuple[np.ndarray, int] | None:
        """Exploration actions for `obs` from the learner's device, and their weight version;
        None if `stop` was set while waiting."""
        return self._ring.request(self._collector, obs, stop)

    def close(self) -> None:
        if not self._ring.is_creator:  # in the learner the ring is the server's to close
            self._ring.close()
