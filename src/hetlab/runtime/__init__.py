"""Moving data between devices and processes: shared memory, staging, weight broadcast, collectors."""

from __future__ import annotations

import queue
import signal
from collections.abc import Iterable
from contextlib import contextmanager
from multiprocessing import resource_tracker

POLL_S = 0.1  # how often a waiting thread or process checks whether it should stop


def get_or_none(source, timeout: float | None):
    """The next item of a queue (the threading or the multiprocessing kind), or None after `timeout` seconds."""
    try:
        return source.get(timeout=timeout)
    except queue.Empty:
        return None


def put_unless_stopped(target, item, stop=None) -> bool:
    """Put `item` into a bounded queue, waiting while it is full; False, without putting it, if
    `stop` (anything with `is_set()`) was set meanwhile."""
    while True:
        try:
            target.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            if stop is not None and stop.is_set():
                return False


def start_resource_tracker() -> None:
    """Python's resource tracker (it unlinks the shared memory and semaphores a process leaves
    behind), started unless it runs already with SIGHUP blocked, which it inherits. It ignores
    SIGINT and SIGTERM itself, but the hang-up of a terminal reaches the whole process group and
    would end it before this process has stopped and unlinked what it tracks."""
    with signals_blocked({signal.SIGHUP}):
        resource_tracker.ensure_running()


@contextmanager
def signals_blocked(signals: Iterable[int]):
    """Block `signals` in this thread for the block: a helper process started here keeps them
    blocked for good (its signal mask is inherited across fork and exec)."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
