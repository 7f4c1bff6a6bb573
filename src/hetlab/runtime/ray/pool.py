"""The collector pool on a Ray cluster: each collector an actor with one CPU, placed by Ray.

A collector actor runs the very collector code a local process runs. Its job is pickled with
every shared region in it swapped for a port (`hetlab.runtime.ray.ports`, through pickle's
persistent ids): on the learner's node the port writes the learner's shared memory in place
and only commit messages travel through Ray; on another node the data travel through Ray's
object store and the learner's relay threads write them into the shared regions. The stagers,
the algorithms and the training loops are the same as with local processes.

Faults. A watcher thread waits on every collector's `run` call. A collector that raises stops
the run with its traceback, as a local one does. An actor that dies (its process killed, its
node gone) is reported with its node and Ray's reason, its unfinished slots are returned to
the ring, and it is replaced — from its last committed message, with fresh episodes — while
the others go on, up to `max_restarts` replacements in all; after that the pool ends the run
(`ended_by`) and the loop stops with a final checkpoint.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import sys
import threading
import time
from dataclasses import dataclass, field

import ray

from hetlab.runtime import POLL_S
from hetlab.runtime.pool import CollectorJob, CollectorPool, StopSignal
from hetlab.runtime.ray.cluster import RayCluster
from hetlab.runtime.ray.ports import LearnerStatePusher, ReplayRelay, RingRelay, make_port, region_kind

START_TIMEOUT_S = 120.0  # for an actor to be placed and to import the collector's code


@ray.remote(num_cpus=1, max_concurrency=8)
class CollectorActor:
    """One collector on a Ray worker: `prepare(job)`, then `run()` until `stop()`. Its other
    methods serve the learner's relays, concurrently with `run`."""

    def __init__(self):
        self._stop = threading.Event()
        self._ports: dict[str, object] = {}
        self._job: tuple | None = None

    def where(self) -> tuple[str, str, int]:
        """(node id, node address, process id)."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address(), os.getpid()

    def prepare(self, job: bytes) -> None:
        """`job`: (target, args) as `_JobPickler` pickled them."""
        self._job = _JobUnpickler(io.BytesIO(job), self._ports).load()

    def run(self) -> None:
        target, args = self._job
        target(*args, stop=StopSignal(self._stop))

    def stop(self) -> None:
        self._stop.set()

    def give_slot(self, slot: int) -> None:
        self._ports["ring"].give(slot)

    def take_rollouts(self, timeout: float) -> list:
        return self._ports["ring"].take(timeout)

    def take_commits(self, timeout: float) -> list:
        return self._ports["replay"].take(timeout)

    def sync(self, weights: tuple | None, updates: int | None) -> None:
        if weights is not None:
            self._ports["weights"].set(*weights)
        if updates is not None:
            self._ports["replay"].set_learner_updates(updates)


class _JobPickler(pickle.Pickler):
    """Pickles a job with each shared region as a persistent id: (kind, by-name handle, local)."""

    def __init__(self, file, local: bool):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.local = local
        self.regions: dict[str, object] = {}  # kind → the learner's region

    def persistent_id(self, obj):
        kind = region_kind(obj)
        if kind is None or not obj.is_creator:  # the by-name handle inside the id pickles as it is
            return None
        self.regions[kind] = obj
        return kind, obj.by_name(), self.local


class _JobUnpickler(pickle.Unpickler):
    """Unpickles a job on the worker with a port for each shared region, kept in `ports`."""

    def __init__(self, file, ports: dict):
        super().__init__(file)
        self.ports = ports

    def persistent_load(self, pid):
        kind, region, local = pid
        self.ports[kind] = make_port(kind, region, local)
        return self.ports[kind]


@dataclass
class _Collector:
    index: int
    job: CollectorJob
    actor: object
    node: str
    address: str
    pid: int
    local: bool  # on the learner's node
    run: object = None  # the ObjectRef of its run() call
    relays: list = field(default_factory=list)
    last_message: dict | None = None
    lost_at: float | None = None  # for a replacement: when its predecessor was found lost


class RayPool(CollectorPool):
    """Collectors as actors of `cluster` (see the module docstring)."""

    def __init__(self, cluster: RayCluster, max_restarts: int):
        self._cluster, self._max_restarts = cluster, max_restarts
        self._collectors: dict[int, _Collector] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._stopped = False
        self._failure: str | None = None
        self._pusher: LearnerStatePusher | None = None
        self._watcher: threading.Thread | None = None
        self._lost = self._replaced = self._lost_steps = 0
        self._relayed_bytes = 0  # from relays already retired
        self._last_recovery_s = 0.0  # from finding a collector lost to its replacement's first delivery

    # The CollectorPool interface --------------------------------------------------------
    def start(self, jobs: list[CollectorJob]) -> None:
        for index, job in enumerate(jobs):
            self._collectors[index] = self._launch(index, job)
        here = [c.index for c in self._collectors.values() if c.local]
        elsewhere = [f"{c.index} on {c.address}" for c in self._collectors.values() if not c.local]
        print(f"Ray collectors: {here or 'none'} on the learner's node (shared memory), "
              f"{', '.join(elsewhere) or 'none'} elsewhere (object store)", file=sys.stderr, flush=True)
        self._watcher = threading.Thread(target=self._watch, name="hetlab-ray-watcher", daemon=True)
        self._watcher.start()

    def check(self) -> None:
        if self._failure is not None:
            raise RuntimeError(self._failure)

    def stop(self, drain_one=None, timeout: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10 * POLL_S)
        with self._lock:
            collectors = list(self._collectors.values())
        for collector in collectors:
            collector.actor.stop.remote()
        for collector in collectors:
            for relay in collector.relays:
                relay.stop()
        if self._pusher is not None:
            self._pusher.stop()
        runs = [collector.run for collector in collectors if collector.run is not None]
        if runs:
            ray.wait(runs, num_returns=len(runs), timeout=timeout)
        for collector in collectors:
            ray.kill(collector.actor)

    def close(self) -> None:
        self.stop()
        self._cluster.close()

    def metrics(self) -> dict[str, float]:
        with self._lock:
            relayed = self._relayed_bytes + sum(relay.bytes for c in self._collectors.values() for relay in c.relays)
        return {
            "ray/collectors_lost": self._lost,
            "ray/collectors_replaced": self._replaced,
            "ray/lost_env_steps_at_most": self._lost_steps,
            "ray/relayed_mb": (relayed + (self._pusher.bytes if self._pusher is not None else 0)) / 1e6,
            "ray/last_recovery_s": self._last_recovery_s,
        }

    # Starting and replacing collectors --------------------------------------------------------
    def _launch(self, index: int, job: CollectorJob) -> _Collector:
        actor = CollectorActor.options(name=f"hetlab-collector-{index}-{os.getpid()}-{time.monotonic_ns()}").remote()
        try:
            node, address, pid = ray.get(actor.where.remote(), timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise RuntimeError(f"collector {index} was not placed on the Ray cluster within {START_TIMEOUT_S:.0f} s: "
                               "it needs a free CPU") from None
        collector = _Collector(index, job, actor, node, address, pid, local=node == self._cluster.driver_node)
        buffer = io.BytesIO()
        pickler = _JobPickler(buffer, collector.local)
        pickler.dump((job.target, job.args))
        ray.get(actor.prepare.remote(buffer.getvalue()), timeout=START_TIMEOUT_S)

        def on_message(meta: dict) -> None:
            collector.last_message = meta
            if collector.lost_at is not None:  # a replacement's first delivery: the collector is back
                self._last_recovery_s = time.monotonic() - collector.lost_at
                collector.lost_at = None

        relays = {"ring": RingRelay, "replay": ReplayRelay}
        collector.relays = [relays[kind](region, actor, on_message, self._fail)
                            for kind, region in pickler.regions.items() if kind in relays]
        if not collector.local:
            if self._pusher is None:
                self._pusher = LearnerStatePusher(pickler.regions.get("weights"), pickler.regions.get("replay"))
            self._pusher.add(index, actor)
        collector.run = actor.run.remote()
        return collector

    def _watch(self) -> None:
        while not self._stopping.is_set() and self._failure is None and self.ended_by is None:
            with self._lock:
                runs = {collector.run: collector for collector in self._collectors.values()}
            ready, _ = ray.wait(list(runs), num_returns=1, timeout=POLL_S)
            for ref in ready:
                try:
                    self._settle(runs[ref])
                except Exception as e:  # a replacement that could not start, among others
                    self._fail(f"collector {runs[ref].index}: {type(e).__name__}: {e}")

    def _settle(self, collector: _Collector) -> None:
        """Deal with a collector whose run() call has ended."""
        try:
            ray.get(collector.run)
            if not self._stopping.is_set():
                self._fail(f"collector {collector.index} returned before it was told to stop")
        except ray.exceptions.RayActorError as e:
            lost = e
        except ray.exceptions.RayTaskError as e:
            self._fail(f"collector {collector.index} failed:\n{e}")
            return
        else:
            return
        if not self._stopping.is_set():
            self._replace(collector, lost)

    def _replace(self, collector: _Collector, error: Exception) -> None:
        found = time.monotonic()
        for relay in collector.relays:
            relay.stop()
            self._relayed_bytes += relay.bytes
            self._lost_steps += relay.settle_loss()
        if self._pusher is not None:
            self._pusher.remove(collector.index)
        self._lost += 1
        # An actor Ray calls only "unavailable" may come back: it must not go on beside its replacement.
        ray.kill(collector.actor, no_restart=True)
        where = f"collector {collector.index} (node {collector.node[:12]} at {collector.address}, pid {collector.pid})"
        reason = _reason(error).rstrip(".")
        if self._replaced >= self._max_restarts:
            print(f"{where} was lost: {reason}; no replacements left (--ray.max-restarts {self._max_restarts}): "
                  "stopping the run", file=sys.stderr, flush=True)
            self.ended_by = "collectors_lost"
            return
        self._replaced += 1
        print(f"{where} was lost: {reason}; replacing it ({self._replaced} of at most {self._max_restarts})",
              file=sys.stderr, flush=True)
        job = collector.job
        if job.replace is not None:
            job = dataclasses.replace(job, args=job.replace(collector.last_message, self._replaced))
        replacement = self._launch(collector.index, job)
        replacement.lost_at = found
        with self._lock:
            self._collectors[collector.index] = replacement

    def _fail(self, text: str) -> None:
        if self._failure is None:
            self._failure = text


def _reason(error: Exception) -> str:
    """Ray's account of why an actor died, in one line: its exit type and detail where Ray gives them."""
    if isinstance(error, ray.exceptions.ActorUnavailableError):
        # What Ray reports at once when a node vanishes (its death is declared only after health
        # checks, many seconds later) or stops answering.
        return "Ray lost contact with it (its node gone or unreachable)"
    text = " ".join(str(error).split())
    exit_type = re.search(r"Worker exit type: (\S+)", text)
    detail = re.search(r"Worker exit detail: (.*?\.)( Some common causes|$)", text)
    if exit_type or detail:
        return ", ".join(part for part in (exit_type and f"exit type {exit_type.group(1)}",
                                           detail and detail.group(1)) if part)
    died = re.search(r"[^.]*\b(died|dead|killed)\b[^.]*\.", text)
    return (died.group(0).strip() if died else text[:300]) or type(error).__name__
