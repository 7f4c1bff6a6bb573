"""Faults a long run meets — its learner killed outright, its disk full — with benchmarks/faults.py's
own trials at their smallest (that script runs the long series: docs/reliability.md; a second
launch on a run and damaged files are tests/test_bad_runs.py's). Each is a real cartpole run in
real processes."""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("faults", Path(__file__).parents[1] / "benchmarks" / "faults.py")
faults = importlib.util.module_from_spec(spec)
spec.loader.exec_module(faults)


def test_a_learner_killed_between_its_history_and_its_checkpoint_resumes_with_nothing_lost(tmp_path):
    """The kill that once lost the rows since the previous checkpoint for good (the other places a
    kill lands are benchmarks/faults.py's: docs/reliability.md)."""
    trial = faults.kill_trial(random.Random(3), "history.json", tmp_path)
    assert trial["killed_status"] == -9, trial
    assert trial["resumed"] and trial["complete"], trial["resume_stderr"]
    assert not trial["record_shrunk"] and trial["rows_after"] >= trial["rows_before"]
    assert trial["iterations_lost"] <= faults.EVERY
    assert trial["leftovers"] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting the small disk (a tmpfs) needs root")
def test_a_disk_that_fills_up_mid_run_is_one_line_naming_the_file_and_the_run_resumes_once_there_is_room(tmp_path):
    trial = faults.disk_trial("run", tmp_path)
    assert trial["status"] == 2 and trial["one_line"] and trial["names_the_file"], trial
    assert trial["previous_checkpoint_intact"] and trial["resumed"] and trial["complete"]
