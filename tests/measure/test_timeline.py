"""The per-stage time breakdown: totals per role, the wall time per iteration, and its plot."""

from __future__ import annotations

import time

import pytest

from hetlab.measure.timeline import Timeline


def test_each_role_reads_as_a_number_however_short_and_against_the_wall_time(tmp_path):
    timeline = Timeline()
    now = time.perf_counter()
    for iteration in range(4):
        timeline.add(iteration, "learner", [("update", now, now + 0.05), ("wait_data", now, now + 0.01)])
        timeline.add(iteration, "stager", [("transfer", now, now + 0.0002)])
        timeline.add(iteration, "collector 0", [("env_step", now, now + 0.03)])
    per_iteration = timeline.seconds_per_iteration()
    assert per_iteration["learner"] == pytest.approx(0.06)
    assert per_iteration["stager"] == pytest.approx(0.0002)  # the bar is invisible; its label is not
    time.sleep(0.1)
    assert timeline.wall_seconds_per_iteration() >= 0.1 / 4
    timeline.plot(tmp_path / "time_breakdown.png", "test")
    assert (tmp_path / "time_breakdown.png").stat().st_size > 10_000
