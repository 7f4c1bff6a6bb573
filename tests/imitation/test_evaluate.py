"""Closed-loop evaluation: worker processes, deterministic per seed, Wilson intervals, bad input."""

from __future__ import annotations

import json
import math

import pytest

from hetlab.imitation.evaluate import EvalConfig, evaluate
from hetlab.measure.stats import wilson_interval
from hetlab.imitation.phase_a import PhaseAConfig, train_phase_a
from hetlab.cli import main
from hetlab.errors import UserError

MAX_STEPS = 30  # a few policy chunks per episode keeps the test short; the task's episodes are 400 steps


@pytest.fixture(scope="module")
def run(tiny_aloha_dataset, tmp_path_factory):
    return train_phase_a(PhaseAConfig(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", steps=10,
                                      loader_workers=0, runs_dir=tmp_path_factory.mktemp("runs")))


def test_one_and_two_workers_give_the_same_json(run, tmp_path):
    reports = []
    for workers in (1, 2):
        out = tmp_path / f"eval-{workers}-workers"
        result = evaluate(EvalConfig(run=run, seeds="2000-2001", workers=workers, videos=1, max_steps=MAX_STEPS,
                                     out=out))
        assert result["workers"] == workers
        reports.append((out / "results.json").read_text())
        assert (out / "videos" / "seed-2000.mp4").stat().st_size > 0
        assert not (out / "videos" / "seed-2001.mp4").exists()
    assert reports[0] == reports[1]
    report = json.loads(reports[0])
    assert [r["seed"] for r in report["per_seed"]] == [2000, 2001]
    assert all(r["steps"] == MAX_STEPS or r["success"] for r in report["per_seed"])
    assert report["wilson95"] == list(wilson_interval(report["successes"], 2))


def test_wilson_interval_against_the_formula():
    # 7 successes in 20: centre and half-width by hand (z = 1.96).
    z, n, p = 1.96, 20, 7 / 20
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low, high = wilson_interval(7, 20)
    assert low == pytest.approx(centre - half) and high == pytest.approx(centre + half)
    assert wilson_interval(0, 10)[0] == 0.0 and 0.0 < wilson_interval(0, 10)[1] < 0.35
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0) and wilson_interval(10, 10)[0] > 0.65


@pytest.mark.parametrize(("seeds", "message"), [("2001-2000", "ends before it starts"), ("", "takes a range"),
                                                ("2001,2000", "increasing order")])
def test_bad_seeds_fail_before_any_worker_starts(run, tmp_path, seeds, message):
    with pytest.raises(UserError, match=message):
        evaluate(EvalConfig(run=run, seeds=seeds, out=tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_cli_rejects_a_directory_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["aloha", "eval", str(tmp_path), "--seeds", "2000-2001"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "not a run directory" in err and len(err.strip().splitlines()) == 1
