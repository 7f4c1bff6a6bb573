"""Batches to the learner device, one ahead of the learner: host double buffers and their copies.

`HostToDevice` is the copy itself: two host buffers (page-locked where the device supports
it) and their copies to the device. `BackgroundStager` is the thread that keeps one batch
ahead of the learner with it; `DeviceStager` fills it from the rollout ring (on-policy),
`hetlab.runtime.replay.ReplayStager` from replay samples (off-policy).

DeviceStager: a background thread takes `slots_per_batch` full slots, copies each into one
of the host buffers along the env axis, releases each slot as soon as it is copied out, then
copies the batch to the device and hands it over through a queue of depth 1. The copy of
batch N+1 so overlaps the update on batch N. With `by_collector` (sync mode: one slot from each
collector per batch) collector c's envs go to the c-th place of the batch whatever order the
slots arrive in, so a batch does not depend on which collector finished first.

Three device paths, chosen by what the device can do:
- async_copy (CUDA, ROCm, XPU): the host → device copy runs on a side stream; the learner's
  stream waits for its event, and the host buffer is refilled only after that event.
- another accelerator (MPS): a plain blocking copy.
- CPU: no copy; the learner gets the host buffer itself, valid until its next `next()` call.
The thread starts batch N+1 only once the learner has taken batch N, so at most one batch
is staged ahead and a host buffer is never refilled while the learner may still read it.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod

import numpy as np
import torch

from hetlab.devices import LearnerDevice
from hetlab.runtime import POLL_S
from hetlab.runtime.rollout_ring import RolloutRing

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.int64): torch.int64}


class HostToDevice:
    """Two host buffers of named tensors, and the copy of either to the device (see the module docstring).

    The filling thread calls `host(buffer)` (which first waits until that buffer's previous
    device copy has read it), fills the numpy views, then `to_device(buffer)`. The learner
    thread calls `receive(batch, copied)` with what `to_device` returned before using it.
    """

    def __init__(self, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], device: LearnerDevice):
        self._device = device
        self._torch_device = torch.device(device.torch_device)
        self._host = [
            {name: torch.empty(shape, dtype=dtype, pin_memory=device.pinned_memory) for name, (shape, dtype) in shapes.items()}
            for _ in range(2)
        ]
        self._host_numpy = [{name: t.numpy() for name, t in host.items()} for host in self._host]
        # torch.cuda or torch.xpu: both have Stream, stream(), current_stream() and events.
        self._backend = getattr(torch, self._torch_device.type) if device.async_copy else None
        self._side_stream = self._backend.Stream(self._torch_device) if device.async_copy else None
        self._copied = [None, None]  # per host buffer: event of its last device copy

    def host(self, buffer: int) -> dict[str, np.ndarray]:
        """Numpy views of host buffer `buffer`, once its previous device copy has finished reading it."""
        if self._copied[buffer] is not None:
            self._copied[buffer].synchronize()
        return self._host_numpy[buffer]

    def to_device(self, buffer: int) -> tuple[dict[str, torch.Tensor], object]:
        """Start the copy of host buffer `buffer`; returns the batch and the copy's event (or None)."""
        host = self._host[buffer]
        if not self._device.is_accelerator:
            return dict(host), None
        if not self._device.async_copy:
            return {name: t.to(self._torch_device) for name, t in host.items()}, None
        with self._backend.stream(self._side_stream):
            batch = {name: t.to(self._torch_device, non_blocking=True) for name, t in host.items()}
        self._copied[buffer] = self._side_stream.record_event()
        return batch, self._copied[buffer]

    def receive(self, batch: dict[str, torch.Tensor], copied) -> None:
        """In the learner's thread: make its stream wait for the copy, and keep the caching
        allocator from reusing the batch's memory (allocated on the side stream) while it is in use."""
        if copied is None:
            return
        consumer = self._backend.current_stream(self._torch_device)
        consumer.wait_event(copied)
        for tensor in batch.values():
            tensor.record_stream(consumer)


class BackgroundStager(ABC):
    """A thread that stages batch N+1 into one of the two host buffers of `copier` and starts its
    device copy while the learner uses batch N: `start()`, then per learner step `next()`, then
    `stop()`. A subclass says how a batch is made, in `_stage(buffer)`, which returns a tuple
    whose last element is the copy's event (`HostToDevice.to_device`), or None when stopping."""

    thread_name = "hetlab-stager"

    def __init__(self, copier: HostToDevice):
        self._copier = copier
        self._ready: queue.Queue = queue.Queue(maxsize=1)
        self._may_stage = threading.Semaphore(1)  # released each time the learner takes a batch
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def next(self, timeout: float | None = None) -> tuple | None:
        """The next staged tuple, its batch (first) on the device, without the event; None after
        `timeout` seconds. A CPU batch is valid until the next call."""
        if self._error is not None:
            raise self._error
        try:
            item = self._ready.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is None:  # the thread failed
            raise self._error
        self._may_stage.release()
        self._copier.receive(item[0], item[-1])
        return item[:-1]

    def stop(self, timeout: float = 5.0) -> None:
        """Stop and join the thread (it finishes what it is copying). Idempotent. The thread is
        a daemon: if a killed collector left a half-written message it can block on, it is left
        behind rather than hanging the learner."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @abstractmethod
    def _stage(self, buffer: int) -> tuple | None: ...

    def _run(self) -> None:
        try:
            buffer = 0
            while not self._stopping.is_set():
                if not self._may_stage.acquire(timeout=POLL_S):
                    continue
                staged = self._stage(buffer)
                if staged is None:
                    return
                self._ready.put(staged)  # never blocks: the learner has taken the previous batch
                buffer = 1 - buffer
        except BaseException as error:
            self._error = error
            try:
                self._ready.put_nowait(None)  # wakes a waiting next()
            except queue.Full:  # next() raises on the call after the batch that fills it
                pass


class DeviceStager(BackgroundStager):
    """Rollout-ring slots to the device (see the module docstring). `next()` returns the batch
    and the slots' messages in batch order; each message gets `transfer_spans`:
    [("transfer", t0, t1), ...], the stager's busy time on that slot."""

    def __init__(self, ring: RolloutRing, slots_per_batch: int, device: LearnerDevice, by_collector: bool = False):
        if slots_per_batch < 1:
            raise ValueError(f"a batch needs at least one slot, got {slots_per_batch}")
        self._ring, self._slots, self._by_collector = ring, slots_per_batch, by_collector
        super().__init__(HostToDevice(self._batch_shapes(slots_per_batch * ring.layout.num_envs), device))

    def _batch_shapes(self, num_envs: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        shapes = {}
        for name, f in self._ring.layout.fields.items():
            shape = (num_envs,) if name == "policy_version" else (f.shape[0], num_envs, *f.shape[2:])
            shapes[name] = (shape, TORCH_DTYPES[f.dtype])
        return shapes

    def _stage(self, buffer: int) -> tuple[dict[str, torch.Tensor], list[dict], object] | None:
        """Fill host buffer `buffer` from the ring and start its device copy; None when stopping."""
        host, envs = self._copier.host(buffer), self._ring.layout.num_envs
        metas = []
        for i in range(self._slots):
            taken = None
            while taken is None:
                if self._stopping.is_set():
                    return None
                taken = self._ring.take(timeout=POLL_S)
            slot, meta = taken
            t0 = time.perf_counter()
            place = meta["collector"] if self._by_collector else i
            envs_of_slot = slice(place * envs, (place + 1) * envs)
            for name, values in self._ring.views(slot).items():
                if name == "policy_version":
                    host[name][envs_of_slot] = values
                else:
                    host[name][:, envs_of_slot] = values
            self._ring.release(slot)
            meta["transfer_spans"] = [("transfer", t0, time.perf_counter())]
            metas.append(meta)
        t0 = time.perf_counter()
        batch, copied = self._copier.to_device(buffer)
        metas[-1]["transfer_spans"].append(("transfer", t0, time.perf_counter()))
        return batch, metas, copied
