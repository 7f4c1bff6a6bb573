from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

from hetlab.measure.memory import peak_memory, reset_peak_memory

MIB = 1 << 20


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the resident size from /proc")
def test_cpu_peak_rss_grows_past_its_old_peak_when_a_big_array_is_allocated():
    before = peak_memory("cpu")
    assert before.what == "peak RSS of the process (CPU)"
    # Earlier tests may have left the peak far above what is resident now; go 256 MiB past it.
    size = max(before.bytes - resident_bytes(), 0) + 256 * MIB
    array = np.ones(size // 8)  # np.ones writes every page, so all of it becomes resident
    assert peak_memory("cpu").bytes >= before.bytes + 200 * MIB
    del array


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm device")
def test_cuda_peak_is_what_torch_allocated_and_resets():
    reset_peak_memory("cuda")
    big = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    del big
    peak = peak_memory("cuda")
    assert peak.what == "peak allocated (CUDA)" and peak.bytes >= 64 * MIB
    reset_peak_memory("cuda")
    assert peak_memory("cuda").bytes < 64 * MIB
