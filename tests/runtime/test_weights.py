"""WeightBroadcast with real spawned processes and real shared memory."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from hetlab.runtime.shm import attach_segment, close_segment
from hetlab.runtime.weights import HEADER_BYTES, UNPUBLISHED, WeightBroadcast

pytestmark = pytest.mark.serial  # reads interleaved with a child's writes

SPAWN = multiprocessing.get_context("spawn")
BIG = 1 << 15  # rows of 8 floats (1 MiB): a copy takes long enough that reads and writes overlap


def template(size: int = 64) -> dict[str, torch.Tensor]:
    """Like an actor's state_dict: float params, a float64 buffer and an integer count."""
    return {
        "weight": torch.zeros(size, 8),
        "bias": torch.zeros(8, dtype=torch.float16),
        "mean": torch.zeros(3, dtype=torch.float64),
        "count": torch.zeros((), dtype=torch.int64),
    }


def filled(state: dict[str, torch.Tensor], value: int) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, value) for name, t in state.items()}


@pytest.fixture(autouse=True)
def importable_by_children(monkeypatch):
    # A spawned child imports its target by module name (tests.runtime.test_...), and pytest's
    # importlib mode does not put the repository root on sys.path; children inherit sys.path.
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))


@pytest.fixture
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def publish_continuously(weights: WeightBroadcast, versions: int, started) -> None:
    """Child: publishes versions 1..`versions`, every element of version v equal to v."""
    torch.set_num_threads(1)  # two processes of spinning intra-op threads on two cores crawl
    weights.attach()
    state = template(BIG)
    for version in range(1, versions + 1):
        for tensor in state.values():
            tensor.fill_(version)
        weights.publish(state, version)
        started.set()


def read_once(weights: WeightBroadcast, results) -> None:
    """Child: reads what the parent published and sends it back."""
    weights.attach()
    into = template()
    version = weights.read(into)
    results.put((version, {name: t.tolist() for name, t in into.items()}))


def test_reads_stay_consistent_and_monotone_while_a_child_publishes(one_torch_thread):
    with WeightBroadcast(template(BIG)) as weights:
        started = SPAWN.Event()
        writer = SPAWN.Process(target=publish_continuously, args=(weights, 300, started))
        writer.start()
        assert started.wait(timeout=60)
        into = template(BIG)
        versions = []
        while writer.is_alive() or not versions or versions[-1] < 300:
            version = weights.read(into, timeout=30)
            for name, tensor in into.items():
                assert torch.all(tensor == version), (name, version)
            versions.append(version)
        writer.join(timeout=30)
        assert writer.exitcode == 0
    assert versions == sorted(versions)
    assert versions[-1] == 300
    assert len(set(versions)) > 5  # the reads really did interleave with the writes


def test_a_child_reads_what_the_learner_published():
    with WeightBroadcast(template()) as weights:
        state = filled(template(), 3)
        state["count"] = torch.tensor(2**53 + 1)  # no float can hold this; it must come back exact
        weights.publish(state, version=7)
        results = SPAWN.Queue()
        reader = SPAWN.Process(target=read_once, args=(weights, results))
        reader.start()
        version, values = results.get(timeout=60)
        reader.join(timeout=30)
    assert version == 7
    assert values["count"] == 2**53 + 1
    assert np.all(np.array(values["weight"]) == 3) and np.all(np.array(values["mean"]) == 3)


def test_read_before_any_publish_leaves_the_tensors_alone():
    with WeightBroadcast(template()) as weights:
        into = filled(template(), 5)
        assert weights.version == UNPUBLISHED
        assert weights.read(into) == UNPUBLISHED
        assert all(torch.all(t == 5) for t in into.values())


def test_a_torn_copy_is_never_handed_out():
    """Bytes of a newer publish visible before its header (as a weakly ordered CPU may show
    them) fail the checksum: the reader keeps retrying instead of returning a mixed copy."""
    with WeightBroadcast(template()) as weights:
        weights.publish(filled(template(), 1), version=1)
        raw = attach_segment(weights.name)
        raw.buf[HEADER_BYTES] ^= 0xFF  # one byte of the first float changes, nothing else does
        into = template()
        with pytest.raises(TimeoutError):
            weights.read(into, timeout=0.05)
        close_segment(raw, unlink=False)


def test_publish_checks_the_state_against_the_template():
    with WeightBroadcast(template()) as weights:
        with pytest.raises(ValueError, match="keys differ"):
            weights.publish({"weight": torch.zeros(64, 8)}, version=0)
        wrong = template()
        wrong["weight"] = torch.zeros(8, 64)
        with pytest.raises(ValueError, match="shape"):
            weights.publish(wrong, version=0)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="inspects /dev/shm (Linux)")
def test_close_unlinks_and_is_idempotent():
    weights = WeightBroadcast(template())
    assert weights.name in os.listdir("/dev/shm")
    weights.close()
    weights.close()
    assert weights.name not in os.listdir("/dev/shm")
