"""A pool of spawned worker processes for independent jobs: recording episodes, evaluating a policy,
running the scripted expert, training one study condition in a process of its own.

Each worker runs `setup(*setup_args)` once (load a policy, make an env) and then `work(state, job)`
for every job it takes from the pool's queue; `next()` returns each finished job with its result,
in the order they finish. A job that raises comes back as the parent's exception: a UserError as
the same one-line UserError, anything else as a RuntimeError carrying the worker's traceback. A
worker that dies (a crash in native code, the OOM killer, kill -9) is reported with its exit code
instead of waited for. A job stuck for good (a deadlock in native code) is found by `next`'s
timeout; `restart()` replaces the workers and hands the pending jobs out again.

Workers ignore SIGINT, SIGTERM and SIGHUP (`hetlab.stop_signals`): Ctrl-C, a hang-up, `timeout`
or `kill -TERM -PGID` reach the whole process group, and the parent decides what they mean. They
exit by themselves once the parent is gone, so even a parent killed outright leaves no orphans.
Use the pool as a context manager: leaving the block normally lets the workers finish (a sentinel
each, then join); leaving it on an exception, or with results nobody will read, terminates them.

(`hetlab.runtime.pool` is the training loops' collector pool: long-lived collectors streaming
into shared memory, not jobs with results.)
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hetlab.errors import UserError
from hetlab.runtime import POLL_S, start_resource_tracker
from hetlab.stop_signals import ignore_stop_signals

LAST_WORDS_S = 1.0  # how long a worker seen dead may take to deliver what it sent before exiting
CLOSE_S = 10.0  # how long close() waits for workers to finish their last jobs before terminating them


class WorkerPool:
    """`workers` spawned processes, each running `work(state, job)` on jobs with `state = setup(*setup_args)`
    (None without a setup). `work`, `setup`, their arguments, jobs and results must pickle: module-level
    functions or classes (a class works as `setup`, and its method as `work`)."""

    def __init__(self, workers: int, work: Callable[[Any, Any], Any], setup: Callable[..., Any] | None = None,
                 setup_args: tuple = (), name: str = "worker"):
        if workers < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {workers}")
        self.name, self._workers, self._serve_args = name, workers, (work, setup, setup_args)
        self._pending: dict[int, Any] = {}  # job id → job, for jobs submitted and not yet returned
        self._ids = itertools.count()
        self._start()

    def _start(self) -> None:
        start_resource_tracker()
        context = multiprocessing.get_context("spawn")  # fork would copy the parent's threads and GL state badly
        self._jobs, self._results = context.Queue(), context.Queue()
        self._ended = False
        # Not daemonic, so a job may start processes of its own; the pool, not atexit, ends them.
        self._processes = [context.Process(target=_serve, name=f"hetlab-{self.name}-{i}",
                                           args=(*self._serve_args, self._jobs, self._results))
                           for i in range(self._workers)]
        try:
            for process in self._processes:
                process.start()
        except BaseException:
            self.terminate()
            raise

    def restart(self) -> None:
        """End every worker and start new ones, which take the pending jobs again in the order they
        were submitted: for a job stuck for good (a deadlock in native code), found by `next`'s timeout."""
        self.terminate()
        self._start()
        for job_id, job in sorted(self._pending.items()):
            self._jobs.put((job_id, pickle.dumps(job)))

    @property
    def size(self) -> int:
        return len(self._processes)

    @property
    def pending(self) -> int:
        """Jobs submitted whose results have not been returned yet."""
        return len(self._pending)

    def submit(self, job: Any) -> None:
        # Pickled here, so a job that cannot be sent fails now rather than being lost by the queue's thread.
        message = (next(self._ids), pickle.dumps(job))
        self._pending[message[0]] = job
        self._jobs.put(message)

    def next(self, timeout: float | None = None) -> tuple[Any, Any] | None:
        """(job, result) of the next job to finish, or None if none finishes within `timeout` s (None:
        wait as long as it takes; 0: only look); raises the job's failure, or a worker's death."""
        if not self._pending:
            raise RuntimeError("next() with no job pending")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - time.monotonic()))
            try:
                message = self._results.get(timeout=wait)
            except queue.Empty:
                dead = next((process for process in self._processes if process.exitcode is not None), None)
                if dead is None:
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    continue
                try:  # a worker that failed its setup reports, then exits
                    message = self._results.get(timeout=LAST_WORDS_S)
                except queue.Empty:
                    raise RuntimeError(f"{dead.name} died (exit code {dead.exitcode})") from None
            return self._take(*message)

    def as_completed(self, jobs: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """Submit every job, then yield (job, result) as each pending job finishes."""
        for job in jobs:
            self.submit(job)
        while self._pending:
            yield self.next()

    def close(self, timeout: float = CLOSE_S) -> None:
        """Normal completion: each worker takes a sentinel after the queued jobs and exits; those still
        running after `timeout` s are terminated."""
        if self._ended:
            return
        for _ in self._processes:
            self._jobs.put(None)
        deadline = time.monotonic() + timeout
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
        self.terminate()

    def terminate(self) -> None:
        """End every worker now (SIGKILL: they ignore SIGTERM). Idempotent."""
        if self._ended:
            return
        self._ended = True
        for process in self._processes:
            if process.is_alive():
                process.kill()
        for process in self._processes:
            if process.pid is not None:
                process.join()
        for q in (self._jobs, self._results):
            q.cancel_join_thread()  # don't block on flushing jobs nobody will take
            q.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None and not self._pending:
            self.close()
        else:
            self.terminate()

    def _take(self, job_id: int | None, succeeded: bool, payload) -> tuple[Any, Any]:
        if succeeded:
            return self._pending.pop(job_id), pickle.loads(payload)
        is_user_error, text = payload
        if is_user_error:
            raise UserError(text)
        where = "setting up" if job_id is None else f"on job {self._pending[job_id]!r}"
        raise RuntimeError(f"a {self.name} worker failed {where}:\n{text}")


def call_in_own_process(function: Callable[..., Any], *args, name: str = "process") -> Any:
    """`function(*args)` in a fresh spawned process, its result returned, its failure raised as
    WorkerPool raises it: for a job whose peak memory and timing must be its own."""
    with WorkerPool(1, _call, name=name) as pool:
        pool.submit((function, args))
        return pool.next()[1]


def _call(_, call: tuple[Callable[..., Any], tuple]) -> Any:
    function, args = call
    return function(*args)


def _serve(work, setup, setup_args: tuple, jobs, results) -> None:
    """A worker process: set up, then take jobs until the sentinel (None)."""
    ignore_stop_signals()
    # A parent killed outright cannot end its workers: each notices and exits.
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), name="hetlab-parent-watch", daemon=True).start()
    try:
        state = setup(*setup_args) if setup is not None else None
    except Exception as e:
        results.put((None, False, _failure(e)))
        return  # a normal exit flushes the report before the parent can see the exit code
    while (message := jobs.get()) is not None:
        job_id, job = message
        try:
            # Pickled here, so a result that cannot be sent is this job's failure, not a lost message.
            results.put((job_id, True, pickle.dumps(work(state, pickle.loads(job)))))
        except Exception as e:
            results.put((job_id, False, _failure(e)))


def _failure(error: Exception) -> tuple[bool, str]:
    """(is a UserError, its message or the traceback): text, since an exception object may not pickle."""
    if isinstance(error, UserError):
        return True, str(error)
    return False, traceback.format_exc()
