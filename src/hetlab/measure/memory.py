"""Peak memory of the learner: what torch allocated on a CUDA/ROCm device, else the process's peak RSS."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PeakMemory:
    bytes: int
    what: str  # which peak this is, e.g. "peak allocated (CUDA)"


def reset_peak_memory(device: torch.device | str) -> None:
    """Starts a new CUDA peak. The process's peak RSS cannot be reset: on CPU it covers the whole
    process, so compare runs on CPU in separate processes."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device | str) -> PeakMemory:
    device = torch.device(device)
    if device.type == "cuda":
        return PeakMemory(torch.cuda.max_memory_allocated(device), "peak allocated (CUDA)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak *= 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    # On XPU or MPS the device's own memory may be missing from this figure; the label says so.
    return PeakMemory(peak, "peak RSS of the process (CPU)" if device.type == "cpu" else
                      f"peak RSS of the process (CPU; {device.type} memory may not be counted)")
