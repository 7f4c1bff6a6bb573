"""RolloutRing with real spawned processes and real shared memory."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hetlab.errors import UserError
from hetlab.runtime.rollout_ring import RolloutLayout, RolloutRing
from hetlab.runtime.shm import ALIGN

pytestmark = [pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="inspects /dev/shm (Linux)"),
              pytest.mark.serial]  # bounds on how long acquire and take wait

SPAWN = multiprocessing.get_context("spawn")
LAYOUT = RolloutLayout(horizon=4, num_envs=3, obs_sizes={"policy": 5, "critic": 7}, action_size=2)


@pytest.fixture(autouse=True)
def importable_by_children(monkeypatch):
    # A spawned child imports its target by module name (tests.runtime.test_...), and pytest's
    # importlib mode does not put the repository root on sys.path; children inherit sys.path.
    monkeypatch.syspath_prepend(str(Path(__file__).parents[2]))


def in_shm(name: str) -> bool:
    return name in os.listdir("/dev/shm")


def write_rollouts(ring: RolloutRing, count: int) -> None:
    """Child: rollout i sets every element of every field of its slot to i + 1."""
    ring.attach()
    for i in range(count):
        slot = ring.acquire(timeout=30)
        for array in ring.views(slot).values():
            array[...] = i + 1
        ring.commit(slot, {"rollout": i, "pid": os.getpid()})


def write_forever(ring: RolloutRing, writing) -> None:
    """Child: keeps writing into one slot until it is killed."""
    ring.attach()
    views = ring.views(ring.acquire(timeout=30))
    writing.set()
    while True:
        for array in views.values():
            array[...] += 1


def test_layout_matches_the_rollout_batch_spec():
    fields = LAYOUT.fields
    assert {name: f.shape for name, f in fields.items()} == {
        "policy_version": (),
        "policy_obs": (5, 3, 5),
        "critic_obs": (5, 3, 7),
        "actions": (4, 3, 2),
        "log_probs": (4, 3),
        "rewards": (4, 3),
        "terminated": (4, 3),
        "truncated": (4, 3),
        "final_critic_obs": (4, 3, 7),
    }
    assert fields["policy_version"].dtype == np.int64
    assert all(f.dtype == np.float32 for name, f in fields.items() if name != "policy_version")
    assert LAYOUT.nbytes % ALIGN == 0
    assert LAYOUT.nbytes >= sum(f.nbytes for f in fields.values())


def test_views_are_aligned_and_disjoint_across_fields_and_slots():
    with RolloutRing(LAYOUT, num_slots=3) as ring:
        for slot in range(3):
            for k, array in enumerate(ring.views(slot).values()):
                assert array.ctypes.data % ALIGN == 0
                array[...] = 100 * slot + k
        for slot in range(3):
            for k, (name, array) in enumerate(ring.views(slot).items()):
                assert np.all(array == 100 * slot + k), (slot, name)


def test_a_child_writes_slots_the_parent_reads_and_slots_are_reused():
    with RolloutRing(LAYOUT, num_slots=2) as ring:
        child = SPAWN.Process(target=write_rollouts, args=(ring, 5))
        child.start()
        slots = []
        for i in range(5):
            slot, meta = ring.take(timeout=30)
            assert meta == {"rollout": i, "pid": child.pid}
            for name, array in ring.views(slot).items():
                assert np.all(array == i + 1), name
            slots.append(slot)
            ring.release(slot)
        child.join(timeout=30)
        assert child.exitcode == 0
        assert sorted(set(slots)) == [0, 1]  # five rollouts went through two slots
        assert in_shm(ring.name)  # the child's exit did not unlink the segment
    assert not in_shm(ring.name)


def test_acquire_and_take_time_out_with_none():
    with RolloutRing(LAYOUT, num_slots=1) as ring:
        assert ring.take(timeout=0.05) is None
        slot = ring.acquire(timeout=5)
        start = time.monotonic()
        assert ring.acquire(timeout=0.1) is None
        assert 0.09 <= time.monotonic() - start < 5
        ring.commit(slot, {"n": 1})
        assert ring.take(timeout=5) == (slot, {"n": 1})


def test_close_unlinks_even_after_a_child_was_killed_mid_write():
    ring = RolloutRing(LAYOUT, num_slots=2)
    try:
        writing = SPAWN.Event()
        child = SPAWN.Process(target=write_forever, args=(ring, writing), daemon=True)
        child.start()
        assert writing.wait(timeout=30)
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert child.exitcode == -signal.SIGKILL
        assert in_shm(ring.name)
    finally:
        ring.close()
    assert not in_shm(ring.name)
    ring.close()  # idempotent


def test_close_unlinks_while_views_are_still_held():
    ring = RolloutRing(LAYOUT, num_slots=1)
    views = ring.views(0)
    ring.close()
    assert not in_shm(ring.name)
    views["rewards"][...] = 1.0  # the mapping lives on with the views
    with pytest.raises(RuntimeError, match="closed"):
        ring.views(0)


def test_preflight_refuses_a_ring_larger_than_memory():
    huge = RolloutLayout(horizon=10_000, num_envs=1_000_000, obs_sizes={"policy": 48, "critic": 64}, action_size=12)
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(UserError, match=r"needs [\d.]+ GiB of shared memory, but /dev/shm has .* free and "
                                        r"MemAvailable is [\d.]+ GiB; use fewer envs"):
        RolloutRing(huge, num_slots=2)
    # This process's names only: another test's run may make rings meanwhile.
    assert not [name for name in set(os.listdir("/dev/shm")) - before
                if name.startswith(f"hetlab_ring_{os.getpid()}_")]


# A learner in its own interpreter, so that the resource tracker's complaints (it is a
# separate process that writes to the learner's stderr) can be read.
LEARNER = textwrap.dedent("""
    import multiprocessing, os, sys
    from hetlab.runtime.rollout_ring import RolloutLayout, RolloutRing
    if __name__ == "__main__":
        ring = RolloutRing(RolloutLayout(2, 2, {"policy": 1, "critic": 1}, 1), 1)
        print(ring.name, flush=True)
        child = multiprocessing.get_context("spawn").Process(target=ring.attach)
        child.start()
        child.join()
        assert child.exitcode == 0
        if sys.argv[1] == "crash":
            os._exit(1)  # no close(): only the resource tracker can clean up now
        ring.close()
""")


@pytest.mark.parametrize("ending", ["close", "crash"])
def test_attached_children_leave_cleanup_to_the_learner_and_its_resource_tracker(tmp_path, ending):
    script = tmp_path / "learner.py"
    script.write_text(LEARNER)
    result = subprocess.run([sys.executable, str(script), ending], capture_output=True, text=True, timeout=60)
    name = result.stdout.split()[0]
    if ending == "close":
        assert result.returncode == 0, result.stderr
        assert result.stderr == ""  # no KeyError from the tracker, no "leaked" warning
    # After a crash the tracker unlinks the segment once every process of the tree is gone.
    deadline = time.monotonic() + 10
    while in_shm(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not in_shm(name)
