"""DeviceStager on the CPU learner device, fed by a real spawned collector through shared memory."""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hetlab.devices import pick_device
from hetlab.runtime.rollout_ring import RolloutLayout, RolloutRing
from hetlab.runtime.staging import DeviceStager

pytestmark = pytest.mark.serial  # a bound on the stager's timeout

SPAWN = multiprocessing.get_context("spawn")
LAYOUT = RolloutLayout(horizon=4, num_envs=3, obs_sizes={"policy": 5, "critic": 2}, action_size=2)


@pytest.fixture(autouse=True)
def importable_by_children(monkeypatch):
    # A spawned child imports its target by module name (tests.runtime.test_...), and pytest's
    # importlib mode does not put the repository root on sys.path; children inherit sys.path.
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))


def expected(name: str, rollout: int) -> np.ndarray:
    """What rollout `rollout` writes into a field: distinct per field, rollout and env."""
    field = LAYOUT.fields[name]
    if name == "policy_version":
        return np.array(rollout)
    code = 1000 * rollout + 100 * list(LAYOUT.fields).index(name)
    env = np.arange(LAYOUT.num_envs).reshape(1, -1, *[1] * (len(field.shape) - 2))
    return np.broadcast_to(code + env, field.shape).astype(field.dtype)


def write(ring: RolloutRing, rollout: int) -> None:
    slot = ring.acquire(timeout=30)
    for name, array in ring.views(slot).items():
        array[...] = expected(name, rollout)
    ring.commit(slot, {"rollout": rollout})


def collect(ring: RolloutRing, rollouts: int) -> None:
    """Child: writes rollouts 0..rollouts-1 as slots come free."""
    ring.attach()
    for rollout in range(rollouts):
        write(ring, rollout)


@pytest.fixture
def ring():
    ring = RolloutRing(LAYOUT, num_slots=2)
    yield ring
    ring.close()


@pytest.fixture
def make_stager(ring):
    stagers = []

    def make(slots_per_batch: int) -> DeviceStager:
        stagers.append(DeviceStager(ring, slots_per_batch, pick_device("cpu")))
        stagers[-1].start()
        return stagers[-1]

    yield make
    for stager in stagers:
        stager.stop()


def test_batches_concatenate_slots_along_the_env_axis_in_order(ring, make_stager):
    stager = make_stager(slots_per_batch=2)
    child = SPAWN.Process(target=collect, args=(ring, 6))
    child.start()
    envs = LAYOUT.num_envs
    for first in (0, 2, 4):  # six rollouts through a two-slot ring: slots must be released
        staged = stager.next(timeout=60)
        assert staged is not None
        batch, metas = staged
        assert [meta["rollout"] for meta in metas] == [first, first + 1]
        for name, tensor in batch.items():
            assert tensor.device.type == "cpu"
            parts = [expected(name, rollout) for rollout in (first, first + 1)]
            if name == "policy_version":
                assert tensor.dtype == torch.int64
                assert tensor.tolist() == [first] * envs + [first + 1] * envs
            else:
                assert tensor.shape == (parts[0].shape[0], 2 * envs, *parts[0].shape[2:]), name
                assert np.array_equal(tensor.numpy(), np.concatenate(parts, axis=1)), name
        for meta in metas:
            (stage, t0, t1), *_ = meta["transfer_spans"]
            assert stage == "transfer" and t0 <= t1
    child.join(timeout=30)
    assert child.exitcode == 0


def test_slots_are_released_and_the_batch_owns_its_memory_when_next_returns(ring, make_stager):
    stager = make_stager(slots_per_batch=2)
    write(ring, 0)
    write(ring, 1)
    batch, _ = stager.next(timeout=30)
    before = {name: t.clone() for name, t in batch.items()}
    # Both slots are free again right away, and overwriting them leaves the batch as it was.
    for _ in range(2):
        slot = ring.acquire(timeout=5)
        assert slot is not None
        for array in ring.views(slot).values():
            array[...] = -1
    assert all(torch.equal(batch[name], before[name]) for name in batch)


def test_next_times_out_with_none_and_stop_joins_the_thread(ring, make_stager):
    stager = make_stager(slots_per_batch=1)
    assert stager.next(timeout=0.05) is None
    start = time.monotonic()
    stager.stop()
    stager.stop()
    assert time.monotonic() - start < 5
    assert "hetlab-stager" not in [thread.name for thread in threading.enumerate()]


def test_an_error_in_the_thread_is_raised_by_next(ring, make_stager):
    stager = make_stager(slots_per_batch=1)
    slot = ring.acquire(timeout=5)
    ring.commit(slot, "not a dict")  # the stager cannot attach its transfer spans to this
    with pytest.raises(TypeError):
        stager.next(timeout=30)
    with pytest.raises(TypeError):  # and keeps raising it
        stager.next(timeout=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
def test_batches_reach_the_accelerator_intact(ring):
    stager = DeviceStager(ring, 2, pick_device("cuda"))
    stager.start()
    try:
        for first in (0, 2, 4):  # three batches: both pinned host buffers, one of them reused
            write(ring, first)
            write(ring, first + 1)
            batch, _ = stager.next(timeout=30)
            assert all(t.device.type == "cuda" for t in batch.values())
            for name, tensor in batch.items():
                parts = [expected(name, rollout) for rollout in (first, first + 1)]
                whole = np.repeat(parts, LAYOUT.num_envs) if name == "policy_version" else np.concatenate(parts, 1)
                assert np.array_equal(tensor.cpu().numpy(), whole), name
    finally:
        stager.stop()


def test_by_collector_each_collector_has_its_place_in_the_batch_whatever_the_arrival_order(ring):
    stager = DeviceStager(ring, 2, pick_device("cpu"), by_collector=True)
    stager.start()
    try:
        for collector, rollout in ((1, 7), (0, 3)):  # collector 1 finishes first
            slot = ring.acquire(timeout=5)
            for name, array in ring.views(slot).items():
                array[...] = expected(name, rollout)
            ring.commit(slot, {"collector": collector, "rollout": rollout})
        batch, metas = stager.next(timeout=30)
    finally:
        stager.stop()
    assert [meta["rollout"] for meta in metas] == [7, 3]  # messages in arrival order
    assert batch["policy_version"].tolist() == [3] * LAYOUT.num_envs + [7] * LAYOUT.num_envs
    assert np.array_equal(batch["actions"].numpy(), np.concatenate([expected("actions", 3), expected("actions", 7)], axis=1))
