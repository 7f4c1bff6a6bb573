"""Policy inference on the learner device for the collectors: a request/response ring.

Each collector has a slot in one shared segment: its observations (E, P), the actions (E, A)
written back, and the weight version that made them. A collector writes its observations,
puts its index on the request queue and waits on its own semaphore. The server thread (in
the learner process) takes every pending request at once, runs the serving actor on the
device over all of them as one batch, writes the actions back and releases each requester.

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

from hetlab.runtime.shm import Segment, array_view, attach_segment, close_segment, create_segment

POLL_S = 0.1  # how often a waiting thread or process checks whether it should stop


class InferenceServer:
    """Learner: `start()`, `sync()` after updates, `stop()`, `close()`. Collectors get
    `client(index)` (picklable into a spawned process)."""

    def __init__(self, actor: nn.Module, collectors: int, envs_per_collector: int, obs_size: int, action_size: int,
                 device: torch.device, seed: int):
        self.collectors, self.envs = collectors, envs_per_collector
        self.obs_size, self.action_size = obs_size, action_size
        self._slot_floats = envs_per_collector * (obs_size + action_size)
        self._segment: Segment | None = create_segment(
            "hetlab_inference", collectors * (8 + 4 * self._slot_floats),
            what="the inference request/response ring", fix="use fewer envs",
        )
        self.name = self._segment.name
        self._creator, self._closed = True, False
        context = multiprocessing.get_context("spawn")
        self._requests = context.Queue()
        self._responses = [context.Semaphore(0) for _ in range(collectors)]
        self._map()
        self._actor = copy.deepcopy(actor).eval()
        self._version = -1
        self._device = device
        self._generator = torch.Generator(device=device).manual_seed(seed)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.spans: list[tuple[str, float, float]] = []  # busy time, taken by the learner's logging
        self.error: BaseException | None = None

    def __getstate__(self) -> dict:
        return {key: getattr(self, key) for key in (
            "collectors", "envs", "obs_size", "action_size", "_slot_floats", "name", "_requests", "_responses")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _segment=None, _creator=False, _closed=False)

    def _map(self) -> None:
        n, e, p, a = self.collectors, self.envs, self.obs_size, self.action_size
        self._versions = array_view(self._segment, (n,), np.int64, 0)
        floats = array_view(self._segment, (n, self._slot_floats), np.float32, 8 * n)
        self._obs = [floats[c, :e * p].reshape(e, p) for c in range(n)]
        self._actions = [floats[c, e * p:].reshape(e, a) for c in range(n)]

    def client(self, collector: int) -> InferenceClient:
        return InferenceClient(self, collector)

    # Learner side --------------------------------------------------------------------------
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

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    waiting = [self._requests.get(timeout=POLL_S)]
                except queue.Empty:
                    continue
                while True:
                    try:
                        waiting.append(self._requests.get_nowait())
                    except queue.Empty:
                        break
                t0 = time.perf_counter()
                obs = torch.from_numpy(np.concatenate([self._obs[c] for c in waiting])).to(self._device)
                with self._lock, torch.no_grad():
                    actions = self._actor.explore(obs, self._generator).cpu().numpy()
                    version = self._version
                for i, c in enumerate(waiting):
                    self._actions[c][...] = actions[i * self.envs:(i + 1) * self.envs]
                    self._versions[c] = version
                    self._responses[c].release()
                self.spans.append(("inference", t0, time.perf_counter()))
        except BaseException as error:
            self.error = error

    def raise_if_failed(self) -> None:
        """The serving thread's failure, raised in the caller (the learner's wait loop)."""
        if self.error is not None:
            raise RuntimeError("the inference server failed") from self.error

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        segment, self._segment = self._segment, None
        self._obs = self._actions = self._versions = None
        if segment is not None:
            close_segment(segment, unlink=self._creator)
        if self._creator:
            self._requests.cancel_join_thread()
            self._requests.close()


class InferenceClient:
    """A collector's end of the server: `attach()`, then `explore(obs)` per step."""

    def __init__(self, server: InferenceServer, collector: int):
        self._server, self._collector = server, collector

    def attach(self) -> None:
        server = self._server
        if server._segment is None and not server._closed:
            server._segment = attach_segment(server.name)
            server._map()

    def explore(self, obs: np.ndarray, stop) -> tuple[np.ndarray, int] | None:
        """Exploration actions for `obs` from the learner's device, and their weight version;
        None if `stop` was set or the learner went away while waiting."""
        server, c = self._server, self._collector
        server._obs[c][...] = obs
        server._requests.put(c)
        learner = multiprocessing.parent_process()
        while not server._responses[c].acquire(timeout=POLL_S):
            if stop.is_set() or not learner.is_alive():
                return None
        return server._actions[c].copy(), int(server._versions[c])

    def close(self) -> None:
        server = self._server
        if not server._creator and server._segment is not None:
            segment, server._segment = server._segment, None
            server._obs = server._actions = server._versions = None
            close_segment(segment, unlink=False)
