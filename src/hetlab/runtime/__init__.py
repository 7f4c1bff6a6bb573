"""Moving data between devices and processes: shared memory, staging, weight broadcast, collectors."""

from __future__ import annotations

import queue

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
