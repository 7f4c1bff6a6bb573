"""The collector pool: the runtime's one door to the processes that collect experience.

A training loop hands the pool its collectors as `CollectorJob`s — an entry point and its
arguments (the task spec, the policy, the shared ring or replay buffer) — and from then on
only asks it: `check()` that all are healthy (it raises with a failed collector's traceback or
exit code), `next_staged()` the stager's next batch while watching them (None once the run
should stop: an interrupt, or `ended_by` saying why the pool ended it), and `stop()` them. A
collector learns that it must stop through the `StopSignal` the pool passes it: set by
`stop()`, and also read as set once the learner's process is gone, so no collector outlives a
crashed learner.

`ProcessPool` runs each collector as a process on this machine, forked from a fork server that
imported the collectors' code once, and a lost one stops the run. `hetlab.runtime.ray.pool.RayPool` runs them as actors on the nodes of a Ray cluster
and replaces a lost one (with `CollectorJob.replace`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import queue
import threading
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from hetlab.runtime import POLL_S, signals_blocked, start_resource_tracker
from hetlab.stop_signals import STOP_SIGNALS, ignore_stop_signals

# What a collector's process needs, imported once by the fork server its collectors are forked
# from: each then starts in milliseconds, where a fresh interpreter spends seconds importing torch
# and MuJoCo (and as long again exiting), once per collector and per launch.
COLLECTOR_MODULES = ["hetlab.runtime.collector", "hetlab.algos.networks", "hetlab.algos.off_policy_networks"]


@dataclass(frozen=True)
class CollectorJob:
    """One collector: `target(*args, stop=StopSignal)` collects until the signal is set. Both
    must be picklable (a module-level function, and what it needs). `replace(last_message,
    attempt)` gives the args of a collector that takes over from this one once it was lost:
    from its last committed message (None if it committed none), fresh episodes, another seed."""

    target: Callable[..., None]
    args: tuple
    replace: Callable[[dict | None, int], tuple] | None = None


class StopSignal:
    """What a collector polls (`is_set()`): the pool's stop, or its learner gone."""

    def __init__(self, event):
        self._event = event

    def is_set(self) -> bool:
        if self._event.is_set():
            return True
        learner = multiprocessing.parent_process()
        return learner is not None and not learner.is_alive()


class CollectorPool(ABC):
    """Starts, watches and stops the collectors of one run; a context manager that stops them.
    `close()` then lets go of what the pool holds beyond its collectors (a cluster connection)."""

    ended_by: str | None = None  # set when the pool ends the run itself (collectors lost for good)

    @abstractmethod
    def start(self, jobs: list[CollectorJob]) -> None:
        """Start collector i of `jobs[i]`."""

    @abstractmethod
    def check(self) -> None:
        """Raise RuntimeError, with the collector's traceback or exit code, once one has failed."""

    @abstractmethod
    def stop(self, drain_one: Callable[[], None] | None = None, timeout: float = 5.0) -> None:
        """Tell every collector to stop and wait up to `timeout` s for them, while a thread calls
        `drain_one()` (which reads, with a short timeout, one message they may still be sending);
        then end the stragglers. Idempotent."""

    def metrics(self) -> dict[str, float]:
        """Numbers about the pool itself for the run's log rows (collectors lost and replaced)."""
        return {}

    def close(self) -> None:
        """Let go of what the pool holds beyond its collectors."""

    def next_staged(self, stager, interrupted: threading.Event, check: Callable[[], None] | None = None):
        """The stager's next batch, or None once `interrupted` is set or the pool has ended the
        run (`ended_by`); polls, so a failed collector (or whatever `check` raises for) ends
        the wait within POLL_S."""
        staged = None
        while staged is None and not interrupted.is_set() and self.ended_by is None:
            self.check()
            if check is not None:
                check()
            staged = stager.next(timeout=POLL_S)
        return staged

    def __enter__(self) -> CollectorPool:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ProcessPool(CollectorPool):
    """Each collector a process of this machine (sharing memory with the learner); a lost one
    stops the run (`check` raises), so `CollectorJob.replace` goes unused here."""

    def __init__(self):
        start_resource_tracker()
        self._context = fork_server()
        self._stop = self._context.Event()
        self._errors = self._context.Queue()  # (collector index, traceback)
        self._processes: list = []
        self._stopped = False

    def start(self, jobs: list[CollectorJob]) -> None:
        for index, job in enumerate(jobs):
            # Target and args only: `replace` is the learner's, and need not pickle.
            process = self._context.Process(target=_run, name=f"hetlab-collector-{index}", daemon=True,
                                            args=(index, job.target, job.args, StopSignal(self._stop), self._errors))
            process.start()
            self._processes.append(process)

    def check(self) -> None:
        try:
            index, trace = self._errors.get_nowait()
            raise RuntimeError(f"collector {index} failed:\n{trace}")
        except queue.Empty:
            pass
        for index, process in enumerate(self._processes):
            if process.exitcode is not None:
                # Its traceback, if it wrote one, may arrive a moment after it exits.
                try:
                    failed, trace = self._errors.get(timeout=0.5)
                    raise RuntimeError(f"collector {failed} failed:\n{trace}")
                except queue.Empty:
                    raise RuntimeError(f"collector {index} died with exit code {process.exitcode}") from None

    def stop(self, drain_one: Callable[[], None] | None = None, timeout: float = 5.0) -> None:
        # A collector exits only once its queues have flushed into their pipes, and a rollout's
        # message can be megabytes: someone must read while they exit.
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        draining = threading.Event()

        def drain() -> None:
            while not draining.is_set():
                drain_one()

        if drain_one is not None:
            threading.Thread(target=drain, name="hetlab-drain", daemon=True).start()
        deadline = time.monotonic() + timeout
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                process.kill()  # it ignores SIGTERM
                process.join()
        draining.set()
        self._errors.cancel_join_thread()
        self._errors.close()


def fork_server():
    """The multiprocessing context whose processes are forks of a server that holds
    `COLLECTOR_MODULES` (one per learner process, started on first use; it imports no more
    than those, starts no threads and holds no GL state, so forking it is safe)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(COLLECTOR_MODULES)
    # With the stop signals blocked for good: one sent to the whole process group would end the
    # server, and with it the learner's view of its collectors, before the learner stopped them.
    with signals_blocked(STOP_SIGNALS):
        multiprocessing.forkserver.ensure_running()
    return context


def _run(index: int, target: Callable[..., None], args: tuple, stop: StopSignal, errors) -> None:
    """A collector process: the job, with any exception reported to the learner with its traceback."""
    ignore_stop_signals()  # the learner decides when to stop, after its last checkpoint
    try:
        target(*args, stop=stop)
    except BaseException:
        errors.put((index, traceback.format_exc()))
        raise SystemExit(1)
