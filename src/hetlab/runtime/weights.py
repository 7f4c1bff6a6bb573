"""Versioned weight broadcast, learner → collectors, through one shared-memory segment.

The segment holds a header (sequence counter, version, checksum) and the state_dict
flattened in the template's order: floating tensors as one float32 region, integer and
bool tensors (e.g. a normaliser's sample count) as one int64 region, so counts stay exact.

Consistency is a seqlock checked by a checksum. The learner makes the counter odd, writes
the data, version and checksum, and makes the counter even again. A reader copies while
the counter is even and unchanged across its copy, then recomputes the checksum of its
copy. The counter alone would suffice on x86-64, whose stores and loads are not reordered
with other stores and loads respectively (each numpy call is an opaque C call, so the
compiler cannot reorder them either). On weakly ordered CPUs (arm64: Grace, Apple
silicon) the stores could become visible out of order, and pure Python has no memory
fence to stop that; the checksum (crc32 over version and data) catches any such torn copy
(but for a 2**-32 chance), and the reader simply retries. The reader hands out its private
copy, never the live data, and only after the check.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from hetlab.runtime.shm import SharedRegion, ShmRequirement, array_view

HEADER_BYTES = 64  # int64 sequence counter, int64 version, int64 crc32; the data starts a cache line later
UNPUBLISHED = -1  # the version before the first publish


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    exact: bool  # stored in the int64 region (integer or bool tensors), else in the float32 region
    start: int  # element index in its region
    numel: int


class WeightBroadcast(SharedRegion):
    """Learner (the one writer): `publish(state, version)`. Collectors: `attach()`, then
    `read(into) -> version`. Picklable into spawned processes; the learner unlinks in `close()`."""

    _shared = ("entries", "float_count", "int_count")

    def __init__(self, template: Mapping[str, torch.Tensor]):
        self.entries: list[Entry] = []
        counts = {False: 0, True: 0}
        for name, tensor in template.items():
            if tensor.is_complex():
                raise ValueError(f"cannot broadcast complex tensor {name!r}")
            exact = not tensor.is_floating_point()
            self.entries.append(Entry(name, tuple(tensor.shape), exact, counts[exact], tensor.numel()))
            counts[exact] += tensor.numel()
        self.float_count, self.int_count = counts[False], counts[True]
        self._create("hetlab_weights", ShmRequirement(self._int_offset + 8 * self.int_count,
                                                      "the weight broadcast", "use a smaller network"))
        self._version[()] = UNPUBLISHED

    @property
    def version(self) -> int:
        """The last published version (UNPUBLISHED = -1 before the first publish)."""
        self._require_attached()
        return int(self._version[()])

    def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Write `state` (tensors on any device, laid out like the template) as `version` ≥ 0."""
        self._require_attached()
        if version < 0:
            raise ValueError(f"versions start at 0, got {version}")
        self._check_names(state)
        floats = self._flatten(state, exact=False)
        ints = self._flatten(state, exact=True)
        crc = _checksum(version, floats, ints)  # before the write, to keep the odd window short
        sequence = int(self._sequence[()])
        self._sequence[()] = sequence + 1  # odd: a write is in progress
        self._floats[...] = floats
        self._ints[...] = ints
        self._version[()] = version
        self._crc[()] = crc
        self._sequence[()] = sequence + 2

    def read(self, into: Mapping[str, torch.Tensor], timeout: float | None = None) -> int:
        """Copy the newest published weights into `into` (e.g. a module's state_dict()); returns
        their version. Before the first publish it returns UNPUBLISHED and leaves `into` alone.
        Retries while the learner is mid-write; TimeoutError if no consistent copy within `timeout`.
        """
        self._check_names(into)
        version = self._copy_consistent(timeout)
        if version != UNPUBLISHED:
            unflatten(self.entries, self._float_copy, self._int_copy, into)
        return version

    def snapshot(self, timeout: float | None = None) -> tuple[int, np.ndarray, np.ndarray]:
        """(version, float region, int region): a consistent copy of the flat weights, as a relay
        to collectors elsewhere ships them (`unflatten` turns them back into a state_dict)."""
        version = self._copy_consistent(timeout)
        return version, self._float_copy.copy(), self._int_copy.copy()

    def _copy_consistent(self, timeout: float | None) -> int:
        """Fill the private copies with one consistent version of the data; return that version."""
        self._require_attached()
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt = 0
        while True:
            sequence = int(self._sequence[()])
            if sequence % 2 == 0:
                version = int(self._version[()])
                if version == UNPUBLISHED:
                    return UNPUBLISHED
                crc = int(self._crc[()])
                self._float_copy[...] = self._floats
                self._int_copy[...] = self._ints
                if (int(self._sequence[()]) == sequence
                        and _checksum(version, self._float_copy, self._int_copy) == crc):
                    return version
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no consistent copy of the weights within {timeout} s")
            attempt += 1
            time.sleep(0 if attempt < 100 else 1e-4)  # a publish takes about a millisecond

    @property
    def _int_offset(self) -> int:
        return HEADER_BYTES + -(-4 * self.float_count // 8) * 8  # int64s need 8-byte alignment

    def _map(self) -> None:
        segment = self._require_attached()
        self._sequence, self._version, self._crc = (array_view(segment, (), np.int64, 8 * i) for i in range(3))
        self._floats = array_view(segment, (self.float_count,), np.float32, HEADER_BYTES)
        self._ints = array_view(segment, (self.int_count,), np.int64, self._int_offset)
        # A reader's private copies: it checks a copy, never the live data, and only then hands it out.
        self._float_copy = np.empty_like(self._floats)
        self._int_copy = np.empty_like(self._ints)

    def _unmap(self) -> None:
        self._sequence = self._version = self._crc = self._floats = self._ints = None

    def _check_names(self, state: Mapping[str, torch.Tensor]) -> None:
        expected = {entry.name for entry in self.entries}
        if state.keys() != expected:
            raise ValueError(f"state_dict keys differ from the template's: {sorted(state.keys() ^ expected)}")

    def _flatten(self, state: Mapping[str, torch.Tensor], exact: bool) -> np.ndarray:
        """One host array of the region's tensors, made with a single device → host copy."""
        parts = []
        for entry in self.entries:
            if entry.exact == exact:
                tensor = state[entry.name].detach()
                if tuple(tensor.shape) != entry.shape:
                    raise ValueError(f"{entry.name!r} has shape {tuple(tensor.shape)}, the template {entry.shape}")
                parts.append(tensor.reshape(-1).to(torch.int64 if exact else torch.float32))
        if not parts:
            return np.empty(0, np.int64 if exact else np.float32)
        return torch.cat(parts).cpu().numpy()


def unflatten(entries: list[Entry], floats: np.ndarray, ints: np.ndarray, into: Mapping[str, torch.Tensor]) -> None:
    """Copy flat weight regions (a broadcast's layout, `entries`) into the tensors of `into`."""
    for entry in entries:
        region = ints if entry.exact else floats
        into[entry.name].copy_(torch.from_numpy(region[entry.start:entry.start + entry.numel]).view(entry.shape))


def _checksum(version: int, floats: np.ndarray, ints: np.ndarray) -> int:
    crc = zlib.crc32(version.to_bytes(8, "little", signed=True))
    return zlib.crc32(ints, zlib.crc32(floats, crc))
