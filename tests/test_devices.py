"""Learner device choice and the CPU thread budget."""

from __future__ import annotations

import pytest
import torch

from hetlab.devices import DEVICE_CHOICES, OPTIMIZER_OPTIONS, LearnerDevice, cpu_count, pick_device, thread_budget
from hetlab.errors import UserError

HAS_CUDA = torch.cuda.is_available()
HAS_XPU = bool(getattr(torch, "xpu", None) is not None and torch.xpu.is_available())
HAS_MPS = torch.backends.mps.is_available()
HAS_ACCELERATOR = HAS_CUDA or HAS_XPU or HAS_MPS


@pytest.mark.skipif(HAS_ACCELERATOR, reason="an accelerator is present")
def test_auto_is_cpu_without_accelerators():
    device = pick_device("auto")
    assert device.kind == "cpu" and device.torch_device == "cpu"
    assert not device.is_accelerator
    assert not device.pinned_memory and not device.async_copy
    assert device.name
    torch.zeros(2, device=device.torch_device)  # torch accepts it


@pytest.mark.skipif(not HAS_CUDA, reason="no CUDA/ROCm device")
def test_auto_prefers_cuda_when_present():
    device = pick_device("auto")
    assert device.kind in ("cuda", "rocm") and device.torch_device == "cuda:0"
    assert device.is_accelerator and device.pinned_memory
    torch.zeros(2, device=device.torch_device)


def test_cpu_is_always_available():
    device = pick_device("cpu")
    assert device.kind == "cpu" and not device.is_accelerator
    assert isinstance(device.bf16, bool)


def test_default_is_auto():
    assert pick_device() == pick_device("auto")


@pytest.mark.parametrize("name", ["tpu", "CUDA", "", "cuda:0"])
def test_unknown_device_is_a_user_error(name):
    with pytest.raises(UserError) as info:
        pick_device(name)
    message = str(info.value)
    assert repr(name) in message
    for choice in DEVICE_CHOICES:
        assert choice in message


@pytest.mark.parametrize("name", [n for n, present in (("cuda", HAS_CUDA), ("xpu", HAS_XPU), ("mps", HAS_MPS)) if not present])
def test_unavailable_device_is_a_user_error(name):
    with pytest.raises(UserError) as info:
        pick_device(name)
    message = str(info.value)
    assert name in message and "not available" in message
    assert "cpu" in message  # says what is present
    assert "\n" not in message


def _fake_accelerator() -> LearnerDevice:
    # A plain record of what an accelerator would report; thread_budget reads only `kind`.
    return LearnerDevice("cuda:0", "cuda", "some GPU", True, True, True)


def test_thread_budget_defaults_to_every_core():
    cores = cpu_count()
    assert cores >= 1
    cpu = thread_budget(pick_device("cpu"))
    assert (cpu.cores, cpu.physics, cpu.torch) == (cores, cores, cores)
    gpu = thread_budget(_fake_accelerator())
    assert (gpu.cores, gpu.physics, gpu.torch) == (cores, cores, 1)


def test_thread_budget_explicit_physics_threads():
    cores = cpu_count()
    for threads in range(1, cores + 1):
        assert thread_budget(pick_device("cpu"), threads).physics == threads


@pytest.mark.parametrize("extra", [1, 100])
def test_thread_budget_rejects_more_threads_than_cores(extra):
    cores = cpu_count()
    with pytest.raises(UserError) as info:
        thread_budget(pick_device("cpu"), cores + extra)
    message = str(info.value)
    assert str(cores + extra) in message and str(cores) in message


def test_thread_budget_rejects_negative_threads():
    with pytest.raises(UserError, match="-1"):
        thread_budget(pick_device("cpu"), -1)


def test_overlapping_cpu_learner_and_physics_share_the_cores():
    budget = thread_budget(pick_device("cpu"), overlap=True)
    assert budget.physics + budget.torch <= max(2, budget.cores)
    assert budget.physics >= 1 and budget.torch >= 1
    assert thread_budget(pick_device("cpu"), physics_threads=1, overlap=True).physics == 1


@pytest.mark.parametrize("optimizer", [torch.optim.Adam, torch.optim.AdamW])
def test_the_optimizers_step_on_a_cpu_is_the_default_loop_bit_for_bit(optimizer):
    def trained(**options) -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.ELU(), torch.nn.LayerNorm(33), torch.nn.Linear(33, 5))
        opt = optimizer(net.parameters(), lr=3e-3, weight_decay=1e-2, **options)
        for _ in range(25):
            opt.zero_grad()
            net(torch.randn(64, 7)).square().mean().backward()
            opt.step()
        return [p.detach().clone() for p in net.parameters()]

    loop, chosen = trained(foreach=False), trained(**OPTIMIZER_OPTIONS)
    assert all(torch.equal(a, b) for a, b in zip(loop, chosen))
    assert not torch.equal(loop[0], trained(foreach=False, betas=(0.8, 0.99))[0])  # the comparison can fail
