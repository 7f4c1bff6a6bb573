"""The prefetch thread prepares batch N+1 while the learner works on batch N."""

from __future__ import annotations

import time

import pytest

from hetlab.offload.prefetch import Prefetcher

pytestmark = pytest.mark.serial  # overlap measured in wall time

FORWARD_S, UPDATE_S, STEPS = 0.05, 0.08, 12


def test_producer_overlaps_the_learner_so_its_wait_is_shorter_than_the_forward_time():
    """With the update longer than the accelerator's forward pass, the learner only waits for the
    first batch: its total wait is well under the producer's total forward time."""
    def accelerator_forward(batch):
        time.sleep(FORWARD_S)  # stands for an accelerator busy outside the GIL
        return [batch["step"]]

    waited, steps = 0.0, []
    with Prefetcher(range(STEPS), lambda step: {"step": step}, accelerator_forward, depth=2) as prefetcher:
        while True:
            t0 = time.perf_counter()
            prepared = prefetcher.get()
            waited += time.perf_counter() - t0
            if prepared is None:
                break
            steps.append(prepared.step)
            assert prepared.tokens == [prepared.step]
            assert [stage for stage, *_ in prepared.spans] == ["load", "inference"]
            time.sleep(UPDATE_S)  # the learner's update
    forward_total = FORWARD_S * STEPS
    assert steps == list(range(STEPS))
    assert waited < 0.4 * forward_total, (waited, forward_total)


def test_the_producer_runs_at_most_depth_batches_ahead():
    produced = []

    def load(step):
        produced.append(step)
        return {"step": step}

    with Prefetcher(range(10), load, None, depth=2) as prefetcher:
        time.sleep(0.3)
        # Two batches wait in the queue and a third is loaded, blocked on the full queue.
        assert len(produced) == 3
        assert prefetcher.get().step == 0
        time.sleep(0.3)
        assert len(produced) == 4


def test_a_producer_error_reaches_the_learner():
    def load(step):
        if step == 2:
            raise OSError("video file vanished")
        return {"step": step}

    with Prefetcher(range(5), load, None, depth=1) as prefetcher:
        assert prefetcher.get().step == 0
        assert prefetcher.get().step == 1
        with pytest.raises(OSError, match="vanished"):
            prefetcher.get()
