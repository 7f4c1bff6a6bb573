"""The study runner end to end on a tiny Phase-A run: every condition trained in its own process,
evaluated, reported; a second call reuses what is finished, and only what was made with the
settings it asks for."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.presets import PhaseAConfig
from hetlab.imitation.run_files import read_run
from hetlab.dir_lock import exclusive_writer
from hetlab.errors import UserError
from hetlab.imitation.phase_b import train_phase_b
from hetlab.imitation.study import StudyConfig, condition_run, run_study
from hetlab.offload.quantise import QuantiseConfig


@pytest.fixture(scope="module")
def phase_a_run(tiny_aloha_dataset, tmp_path_factory):
    return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=2,
                                      loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))


@pytest.fixture(scope="module")
def study(phase_a_run, tmp_path_factory):
    """A finished study: its settings and report. Tests that change it work on a copy."""
    # The tiny dataset has episodes 0 and 1 only: train and calibrate on 0, hold out 1 for fidelity.
    cfg = StudyConfig(from_run=phase_a_run, conditions="learner,L1,cache", cache_dtypes="fp16,int8", seeds="2000", steps=3,
                      eval_seeds="2000", eval_workers=1, eval_max_steps=12, train_episodes="0-1",
                      calibration_episodes="0", heldout_episodes="1", out=tmp_path_factory.mktemp("study") / "study")
    return cfg, run_study(cfg)


def files(out, pattern: str) -> dict:
    """{path: last modification} of the study's files matching `pattern`."""
    return {path: path.stat().st_mtime_ns for path in out.glob(pattern)}


def test_study_trains_evaluates_reports_and_resumes(study):
    cfg, report = study
    text = report.read_text()
    for condition in ("learner", "L1", "cache", "cache-int8"):
        assert len(files(cfg.out, f"{condition}-s2000-*/summary.json")) == 1
        assert f"| {condition} " in text or f"| `{condition}` " in text
    # The cache condition trained once per storage dtype; each is compared with learner-only, int8 with fp16 too.
    dtypes = {path.parent.name.rpartition("-s2000")[0]: json.loads(path.read_text())["phase_b"]["cache_dtype"]
              for path in cfg.out.glob("cache*/config.json")}
    assert dtypes == {"cache": "fp16", "cache-int8": "int8"}
    differences = text.split("### Differences, paired by episode")[1]
    assert "| cache-int8 | learner | 1 |" in differences and "| cache-int8 | cache | 1 |" in differences
    assert "## " in text and "fidelity" in text.lower()
    for figure in ("time_breakdown.png", "success_rate.png", "peak_memory.png", "energy_per_sample.png"):
        assert (cfg.out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summaries = files(cfg.out, "*/summary.json")
    run_study(cfg)
    assert files(cfg.out, "*/summary.json") == summaries  # finished conditions are not rerun


def test_other_settings_reuse_only_the_runs_they_match(study, tmp_path):
    cfg, _ = study
    out = tmp_path / "study"
    shutil.copytree(cfg.out, out)
    summaries, evaluations = files(out, "*/summary.json"), files(out, "*/eval/*/results.json")
    changed = dataclasses.replace(cfg, out=out, eval_max_steps=8, quantise=QuantiseConfig(method="minmax"))
    text = run_study(changed).read_text()

    # The quantisation shapes only the offloaded condition: the others are reused, L1 trained anew beside the old.
    after = files(out, "*/summary.json")
    assert after.items() > summaries.items() and len(after) == 5  # nothing old overwritten, one run added
    offloaded = sorted(out.glob("L1-s2000-*/config.json"))
    assert len(offloaded) == 2
    methods = {json.loads(path.read_text())["phase_b"]["quantise"]["method"] for path in offloaded}
    assert methods == {"percentile", "minmax"}
    # Every run asked for is evaluated again for the new episode length; the old evaluations stay as they were.
    new_evaluations = {path: stamp for path, stamp in files(out, "*/eval/*/results.json").items()
                       if path not in evaluations}
    assert len(new_evaluations) == 4
    assert {json.loads(path.read_text())["max_steps"] for path in new_evaluations} == {8}
    assert all(json.loads(path.read_text())["max_steps"] == 12 for path in evaluations)
    # The report is of the runs made with the new settings, as their own files have them.
    intro = text.split("## Runs")[0]
    assert "at most 8 steps each" in intro and "12 steps" not in text
    assert "quantised with minmax / Conv+MatMul / per channel / overflow fix" in intro
    assert "differ in their settings" not in text


def test_a_run_whose_files_disagree_with_its_name_is_refused(study, tmp_path):
    cfg, _ = study
    out = tmp_path / "study"
    shutil.copytree(cfg.out, out)
    config_path = next(out.glob("L1-s2000-*/config.json"))
    config = json.loads(config_path.read_text())
    config["phase_b"]["steps"] = 4
    config_path.write_text(json.dumps(config))
    with pytest.raises(UserError) as refusal:
        run_study(dataclasses.replace(cfg, out=out))
    message = str(refusal.value)
    assert message.startswith(f"{config_path.parent} was made with steps 4, but its name is that of steps 3")
    assert "move it away" in message and "\n" not in message


def test_a_second_study_writing_one_directory_is_refused(phase_a_run, tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    with exclusive_writer(out, "study"):  # as a study running in another process holds it
        with pytest.raises(UserError, match=rf"^{out} is in use: another hetlab process \(pid \d+\) is writing this study"):
            run_study(StudyConfig(from_run=phase_a_run, conditions="learner", seeds="2000", steps=1, eval_seeds="2000",
                                  train_episodes="0-1", calibration_episodes="0", heldout_episodes="1", out=out))
    assert [path.name for path in out.iterdir()] == [".writer.lock"]


def test_unknown_condition_is_refused_before_anything_runs(phase_a_run, tmp_path):
    with pytest.raises(UserError, match="choose from learner, L1, L2, L3, L4, cache"):
        run_study(StudyConfig(from_run=phase_a_run, conditions="learner,L9", out=tmp_path / "study"))
    with pytest.raises(UserError, match=r"--cache-dtypes 'fp16,bf16': choose from fp16, int8"):
        run_study(StudyConfig(from_run=phase_a_run, cache_dtypes="fp16,bf16", out=tmp_path / "study"))
    with pytest.raises(UserError, match="--lr-decay is a share of the steps, from 0 to 1; got 2.0"):
        run_study(StudyConfig(from_run=phase_a_run, lr_decay=2.0, eval_seeds="2000", train_episodes="0-1",
                              out=tmp_path / "study"))
    assert not (tmp_path / "study").exists()


def test_evaluation_seeds_the_training_episodes_came_from_are_refused_before_anything_runs(phase_a_run, tmp_path):
    # The report calls its evaluation seeds held out; the tiny recording's episodes are seeds 0 and 1.
    with pytest.raises(UserError, match="--eval-seeds 1: the training episodes were recorded from these seeds"):
        run_study(StudyConfig(from_run=phase_a_run, eval_seeds="1-5", train_episodes="0-1", out=tmp_path / "study"))
    with pytest.raises(UserError, match=r"episode\(s\) \[2, 3\] out of range; the dataset has 2 episodes"):
        run_study(StudyConfig(from_run=phase_a_run, train_episodes="0-3", out=tmp_path / "study"))
    assert not (tmp_path / "study").exists()


def test_a_condition_cut_short_continues_from_its_checkpoint(phase_a_run, tmp_path):
    cfg = StudyConfig(from_run=phase_a_run, conditions="learner", seeds="2000", steps=4, eval_seeds="2000",
                      eval_workers=1, eval_max_steps=2, train_episodes="0-1", calibration_episodes="0",
                      heldout_episodes="1", fidelity=False, out=tmp_path / "study")
    phase_b, _, run_dir = condition_run(cfg, read_run(phase_a_run), cfg.out, "learner", 2000, cfg.quantise)
    # The run the study would start, stopped by its time budget after its first step.
    train_phase_b(dataclasses.replace(phase_b, out=run_dir, max_seconds=1e-9))
    cut = json.loads((run_dir / "summary.json").read_text())
    assert (cut["steps"], cut["stopped_by"]) == (1, "max_seconds")
    run_study(cfg)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["first_step"], summary["steps"], summary["stopped_by"]) == (1, 4, "steps")
    assert [p.name for p in cfg.out.iterdir() if p.is_dir()] == [run_dir.name]  # continued, not started anew
