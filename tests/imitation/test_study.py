"""The study runner end to end on a tiny Phase-A run: every condition trained in its own process,
evaluated, reported; a second call reuses what is finished."""

from __future__ import annotations

import pytest

from hetlab.imitation.phase_a import PhaseAConfig, train_phase_a
from hetlab.errors import UserError
from hetlab.imitation.study import StudyConfig, run_study


@pytest.fixture(scope="module")
def phase_a_run(tiny_aloha_dataset, tmp_path_factory):
    return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=10,
                                      loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))


def test_study_trains_evaluates_reports_and_resumes(phase_a_run, tmp_path):
    # The tiny dataset has episodes 0 and 1 only: train and calibrate on 0, hold out 1 for fidelity.
    cfg = StudyConfig(from_run=phase_a_run, conditions="learner,L1,cache", seeds="2000", steps=3,
                      eval_seeds="2000", eval_workers=1, eval_max_steps=12, train_episodes="0-1",
                      calibration_episodes="0", heldout_episodes="1", out=tmp_path / "study")
    report = run_study(cfg)
    text = report.read_text()
    for condition in ("learner", "L1", "cache"):
        assert (tmp_path / "study" / f"{condition}-s2000" / "summary.json").is_file()
        assert f"| {condition} " in text or f"| `{condition}` " in text
    assert "## " in text and "fidelity" in text.lower()
    for figure in ("time_breakdown.png", "success_rate.png", "peak_memory.png", "energy_per_sample.png"):
        assert (tmp_path / "study" / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summaries = {p: p.stat().st_mtime_ns for p in (tmp_path / "study").glob("*/summary.json")}
    run_study(cfg)
    assert {p: p.stat().st_mtime_ns for p in summaries} == summaries  # finished conditions are not rerun


def test_unknown_condition_is_refused_before_anything_runs(phase_a_run, tmp_path):
    with pytest.raises(UserError, match="choose from learner, L1, L2, L3, L4, cache"):
        run_study(StudyConfig(from_run=phase_a_run, conditions="learner,L9", out=tmp_path / "study"))
    assert not (tmp_path / "study").exists()
