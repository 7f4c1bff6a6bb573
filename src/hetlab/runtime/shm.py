"""Named shared-memory segments: created (after a memory check) by the learner, attached by children.

The learner creates every segment and is the only process that unlinks it. Children attach
by name and only unmap. If the learner dies without unlinking, Python's resource tracker
(one per process tree: spawn hands the learner's tracker to its children) unlinks the
segment once the last process of the tree has exited.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from hetlab.errors import UserError

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory (a tmpfs, often small in containers)


class Segment(SharedMemory):
    """A SharedMemory that, when garbage-collected while numpy views of it are still alive,
    leaves the mapping to those views instead of printing "Exception ignored ... BufferError"."""

    def __del__(self):
        try:
            self.close()
        except (OSError, BufferError):
            pass


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"


def check_fits(nbytes: int, what: str, fix: str) -> None:
    """UserError unless `nbytes` fit both in /dev/shm's free space and in MemAvailable.

    A tmpfs segment is sparse: creating one that is too big succeeds, and the processes
    then die of SIGBUS when they first touch a page that cannot be backed. So check first.
    """
    shm_free = shutil.disk_usage(SHM_DIR).free if os.path.isdir(SHM_DIR) else None
    mem_available = _mem_available()
    if all(limit is None or nbytes <= limit for limit in (shm_free, mem_available)):
        return
    shm_text = "unknown" if shm_free is None else _gib(shm_free)
    mem_text = "unknown" if mem_available is None else _gib(mem_available)
    raise UserError(
        f"{what} needs {_gib(nbytes)} of shared memory, but {SHM_DIR} has {shm_text} free and "
        f"MemAvailable is {mem_text}; {fix}, or give the machine more shared memory "
        f"(in Docker: --shm-size)"
    )


def create_segment(prefix: str, nbytes: int, what: str, fix: str) -> Segment:
    """A new zero-filled segment named `<prefix>_<pid>_<random>`, after `check_fits`."""
    check_fits(nbytes, what, fix)
    return Segment(name=f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=nbytes)


def attach_segment(name: str) -> Segment:
    """Map an existing segment without registering it with this process's resource tracker.

    Before Python 3.13 attaching registers the segment. A child that does not share the
    learner's tracker would then have the segment unlinked when it exits. Calling
    `resource_tracker.unregister` afterwards is no fix: spawn children do share the
    learner's tracker, which keeps one entry per name, so the child would delete the
    learner's entry (the learner's own unlink then makes the tracker print a KeyError, and a
    crashed learner's segment is never cleaned up). Not registering at all is right in both
    cases. The swap of `register` is not thread-safe; children attach before starting threads.
    """
    if sys.version_info >= (3, 13):
        return Segment(name=name, track=False)
    register = resource_tracker.register
    resource_tracker.register = lambda name, rtype: None
    try:
        return Segment(name=name)
    finally:
        resource_tracker.register = register


def array_view(segment: Segment, shape: tuple[int, ...], dtype, offset: int) -> np.ndarray:
    """A numpy array over `segment`'s memory at byte `offset`.

    Made with np.frombuffer because that array holds a buffer export on the segment: while
    it lives, `close()` raises BufferError instead of unmapping memory it points to.
    (`np.ndarray(buffer=...)` holds none: it would be left dangling, and touching it segfaults.)
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(segment.buf, dtype, count, offset).reshape(shape)


def close_segment(segment: Segment, unlink: bool) -> None:
    """Unmap (and, for the creator, unlink first) without raising while numpy views are alive.

    Unlinking removes the name at once; the memory goes away with the last mapping. An
    `array_view` still held somewhere makes `close()` raise BufferError; the mapping then
    lives on until that array is garbage-collected, which is harmless, so it is not worth
    failing a `finally` block over.
    """
    if unlink:
        try:
            segment.unlink()
        except FileNotFoundError:  # already gone (e.g. removed by hand)
            pass
    try:
        segment.close()
    except BufferError:
        pass
