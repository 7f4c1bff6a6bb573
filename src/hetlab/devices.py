"""Which device the learner runs on, what it can do, and how the CPU cores are shared.

The learner takes the best accelerator present (CUDA or ROCm → XPU → MPS → CPU) unless the
user names one. Physics always runs on CPU threads, so the thread budget splits the cores
between MuJoCo's batch threads and torch's intra-op threads instead of letting both claim
every core and thrash.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from hetlab.errors import UserError

DEVICE_CHOICES = ("auto", "cuda", "xpu", "mps", "cpu")
# Every optimizer takes the multi-tensor (foreach) step. PyTorch picks it by default on accelerators only;
# on a CPU it does the default loop's arithmetic bit for bit (tests/test_devices.py) in about half the time
# for networks of many small tensors (the AR-Actor's 208).
OPTIMIZER_OPTIONS = {"foreach": True}


@dataclass(frozen=True)
class LearnerDevice:
    """A torch device and the features the runtime's data path depends on."""

    torch_device: str  # e.g. "cuda:0", "cpu"
    kind: str  # "cuda", "rocm", "xpu", "mps" or "cpu"
    name: str  # human-readable model name
    pinned_memory: bool  # page-locked host buffers speed up host→device copies
    async_copy: bool  # copies can overlap compute on a side stream
    bf16: bool  # bfloat16 matmuls run natively

    @property
    def is_accelerator(self) -> bool:
        return self.kind != "cpu"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def _available() -> dict[str, bool]:
    xpu = getattr(torch, "xpu", None)
    return {
        "cuda": torch.cuda.is_available(),
        "xpu": bool(xpu is not None and xpu.is_available()),
        "mps": torch.backends.mps.is_available(),
        "cpu": True,
    }


def pick_device(requested: str = "auto") -> LearnerDevice:
    """The learner device: `requested` if present, else the best one found."""
    if requested not in DEVICE_CHOICES:
        raise UserError(f"unknown device {requested!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    available = _available()
    if requested == "auto":
        requested = next(k for k in ("cuda", "xpu", "mps", "cpu") if available[k])
    elif not available[requested]:
        present = ", ".join(k for k, ok in available.items() if ok)
        raise UserError(f"device {requested!r} is not available on this machine; present: {present}")

    if requested == "cuda":
        # ROCm builds of torch expose AMD GPUs through the same torch.cuda API.
        kind = "rocm" if torch.version.hip else "cuda"
        return LearnerDevice(
            "cuda:0", kind, torch.cuda.get_device_name(0), True, True, torch.cuda.is_bf16_supported()
        )
    if requested == "xpu":
        return LearnerDevice("xpu:0", "xpu", torch.xpu.get_device_name(0), True, True, True)
    if requested == "mps":
        # MPS shares memory with the CPU: there is nothing to pin and no separate copy engine.
        return LearnerDevice("mps", "mps", "Apple GPU (MPS)", False, False, True)
    return LearnerDevice("cpu", "cpu", _cpu_name(), False, False, cpu_has_native_bf16())


def cpu_has_native_bf16() -> bool:
    """AVX512_BF16 or AMX: oneDNN then runs bfloat16 matmuls natively."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def mixed_precision(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast for an update's forward passes when the config asks for it (`--<algo>.bf16`)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled)


def autocast_for(device: LearnerDevice, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast where `precision` asks for it: "bf16", or "auto" on an accelerator with native bf16."""
    bf16 = precision == "bf16" or (precision == "auto" and device.is_accelerator and device.bf16)
    return mixed_precision(torch.device(device.torch_device), bf16)


def cpu_count() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity API
        return os.cpu_count() or 1


@dataclass(frozen=True)
class ThreadBudget:
    """How many CPU threads physics and torch each get."""

    cores: int
    physics: int  # MuJoCo batch threads (the caller's thread included)
    torch: int  # torch intra-op threads on the learner side


def thread_budget(device: LearnerDevice, physics_threads: int = 0, overlap: bool = False,
                  torch_threads: int = 0) -> ThreadBudget:
    """Split the cores so physics and torch threads do not oversubscribe them.

    With an accelerator the learner only launches kernels: one torch thread is enough and
    physics gets every core. A CPU learner that takes turns with physics (`overlap=False`,
    sync collection) gets every core too, since only one of them is busy at a time; one
    that runs at the same time as physics (async) gets half the cores and physics the rest.
    `physics_threads` and `torch_threads` > 0 ask for explicit counts (`hetlab tune` picks them),
    each of which must fit the cores.
    """
    cores = cpu_count()
    for option, count in (("--threads", physics_threads), ("--torch-threads", torch_threads)):
        if count < 0:
            raise UserError(f"{option} must be ≥ 0 (0 = the thread budget's share of the {cores} cores), got {count}")
        if count > cores:
            raise UserError(f"{option} {count} exceeds the {cores} CPU cores available; use at most {cores}")
    if torch_threads:
        learner_threads = torch_threads
    elif device.is_accelerator:
        learner_threads = 1
    elif overlap:
        learner_threads = max(1, cores // 2)
    else:
        learner_threads = cores
    default_physics = max(1, cores - learner_threads) if overlap and not device.is_accelerator else cores
    return ThreadBudget(cores=cores, physics=physics_threads or default_physics, torch=learner_threads)


def apply_thread_budget(budget: ThreadBudget) -> None:
    """Set torch's thread pool to the budget (physics threads are passed to the sim)."""
    torch.set_num_threads(budget.torch)
