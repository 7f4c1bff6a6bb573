"""Named shared-memory regions: created (after a memory check) by the learner, attached by children.

The learner creates every segment and is the only process that unlinks it. Children attach
by name and only unmap. If the learner dies without unlinking, Python's resource tracker
(one per process tree: spawned and fork-server children get the learner's tracker) unlinks the
segment once the last process of the tree has exited.

`SharedRegion` is the one base of the runtime's shared objects (rollout ring, replay buffer,
weight broadcast, inference ring): create, pickle by name into a child process, attach
there, close (and, in the creator, unlink). `lay_out` places named arrays in a segment, and
`ShmRequirement` checks a size against the machine before anything is created.
"""

from __future__ import annotations

import multiprocessing.queues
import os
import secrets
import shutil
import sys
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from hetlab.errors import UserError
from hetlab.runtime import start_resource_tracker

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory (a tmpfs, often small in containers)
ALIGN = 64  # every field starts on its own cache line: aligned views, no false sharing between fields


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


@dataclass(frozen=True)
class ShmRequirement:
    """A segment's size, what it is for, and how a user makes it smaller."""

    nbytes: int
    what: str
    fix: str

    def check(self) -> None:
        """UserError unless `nbytes` fit both in /dev/shm's free space and in MemAvailable.

        A tmpfs segment is sparse: creating one that is too big succeeds, and the processes
        then die of SIGBUS when they first touch a page that cannot be backed. So check first.
        """
        shm_free = shutil.disk_usage(SHM_DIR).free if os.path.isdir(SHM_DIR) else None
        mem_available = _mem_available()
        if all(limit is None or self.nbytes <= limit for limit in (shm_free, mem_available)):
            return
        shm_text = "unknown" if shm_free is None else _gib(shm_free)
        mem_text = "unknown" if mem_available is None else _gib(mem_available)
        raise UserError(
            f"{self.what} needs {_gib(self.nbytes)} of shared memory, but {SHM_DIR} has {shm_text} free and "
            f"MemAvailable is {mem_text}; {self.fix}, or give the machine more shared memory "
            f"(in Docker: --shm-size)"
        )


def create_segment(prefix: str, requirement: ShmRequirement) -> Segment:
    """A new zero-filled segment named `<prefix>_<pid>_<random>`, after checking it fits."""
    requirement.check()
    start_resource_tracker()
    return Segment(name=f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}", create=True, size=requirement.nbytes)


def attach_segment(name: str) -> Segment:
    """Map an existing segment without registering it with this process's resource tracker.

    Before Python 3.13 attaching registers the segment. A child that does not share the
    learner's tracker would then have the segment unlinked when it exits. Calling
    `resource_tracker.unregister` afterwards is no fix: the runtime's children do share the
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


@dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # bytes from the start of the region (or of a ring slot)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def lay_out(specs: dict[str, tuple[tuple[int, ...], np.dtype]], start: int = 0) -> tuple[dict[str, Field], int]:
    """Name → Field for arrays placed one after another from byte `start`, each on its own
    cache line; and the end, rounded up to ALIGN (so a next region or slot starts aligned too)."""
    fields, offset = {}, start
    for name, (shape, dtype) in specs.items():
        fields[name] = Field(tuple(shape), np.dtype(dtype), offset)
        offset += aligned(fields[name].nbytes)
    return fields, offset


class SharedRegion:
    """One segment shared by the learner (its creator) and the spawned processes it is passed to.

    A subclass calls `_create(prefix, requirement)` at the end of its `__init__`, names in
    `_shared` the attributes a child needs besides the segment's name (layouts, queues), maps
    its numpy views in `_map()` and drops them in `_unmap()`. Pickling (only while spawning a
    process when queues are shared) sends the name and `_shared`; the child calls `attach()`.
    `close()` is idempotent and safe in `finally` blocks; the creator also unlinks.
    """

    _shared: tuple[str, ...] = ()

    def _create(self, prefix: str, requirement: ShmRequirement) -> None:
        self._segment: Segment | None = create_segment(prefix, requirement)
        self.name = self._segment.name
        self._creator, self._closed = True, False
        self._map()

    def __getstate__(self) -> dict:
        return {"name": self.name, **{key: getattr(self, key) for key in self._shared}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _segment=None, _creator=False, _closed=False)

    @property
    def is_creator(self) -> bool:
        return self._creator

    def by_name(self):
        """The same region for a process the learner did not spawn (a worker of a cluster): it
        pickles anywhere, by the segment's name, and its queues are left out (None), since
        they can only be inherited by spawned processes; whoever hands it over carries the
        messages the queues would."""
        handle = object.__new__(type(self))
        handle.__setstate__({"name": self.name, **{
            key: None if isinstance(getattr(self, key), multiprocessing.queues.Queue) else getattr(self, key)
            for key in self._shared}})
        return handle

    def attach(self) -> None:
        """Map the segment in this process (a no-op in the creator, or when already attached)."""
        if self._segment is None and not self._closed:
            self._segment = attach_segment(self.name)
            self._map()

    def _map(self) -> None:
        """Make this process's views of the segment."""

    def _unmap(self) -> None:
        """Drop them: the segment can only be unmapped once no view is left."""

    def _require_attached(self) -> Segment:
        if self._segment is None:
            raise RuntimeError(f"{type(self).__name__} is closed or not attached in this process; call attach() first")
        return self._segment

    def close(self) -> None:
        """Unmap; the creator also unlinks the segment."""
        if self._closed:
            return
        self._closed = True
        segment, self._segment = self._segment, None
        self._unmap()
        if segment is not None:
            close_segment(segment, unlink=self._creator)
        if self._creator:
            # Nothing the creator still buffers for its queues matters now: do not let
            # interpreter exit wait to flush it into pipes that nobody reads any more. A
            # child, though, must flush: a message cut off mid-write would leave its reader
            # blocked on the rest for ever.
            for key in self._shared:
                value = getattr(self, key)
                if isinstance(value, multiprocessing.queues.Queue):
                    value.cancel_join_thread()
                    value.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
