"""The run layer every training loop stands on (train/run_layer.py), driven by a loop of its own."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time

import pytest

from hetlab.checkpoint import load_checkpoint
from hetlab.run_history import read_history
from hetlab import stop_signals
from hetlab.train.loggers import TrackedRun, TrackerOptions
from hetlab.train.run_layer import TrainingRun


def training_run(run_dir, first_step=0, last_step=10, every=4, max_seconds=0.0):
    tracked = TrackedRun(TrackerOptions(), run_dir, run_dir.parent, {"lr": 0.1}, metrics=("train/loss",))
    return TrainingRun(tracked, f"resume {run_dir.name}", first_step=first_step, last_step=last_step,
                       checkpoint_every=every, max_seconds=max_seconds, row_steps=lambda row: row["step"],
                       clock="wall_s")


def run_steps(run: TrainingRun, until: int | None = None, signal_at: int | None = None) -> tuple[int, str]:
    """A run on the layer's loop: a source of numbered batches, an update that learns nothing and a
    row per step."""
    def update(step, batch):
        assert batch == step  # the loop hands the source's batches over in order
        return True

    def after(step):
        run.log({"step": step, "loss": 1.0 / step, "wall_s": run.run_clock()}, {"train/loss": 1.0 / step}, step)
        if step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return "until" if step == until else None

    with run:
        step, stopped_by = run.loop(run.first_step, itertools.count(run.first_step), update, after,
                                    lambda step: run.checkpoint(step, {"step": step}), completed="steps",
                                    ended=lambda: "source ended")
    run.finish({"steps": step, "stopped_by": stopped_by})
    return step, stopped_by


def test_a_signal_stops_the_loop_at_the_next_step_with_a_checkpoint_and_its_resume_command(tmp_path, monkeypatch,
                                                                                        capfd):
    for name in ("_received", "_resume"):  # the command's signal state, put back for the tests after this one
        monkeypatch.setattr(stop_signals, name, None)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(SystemExit) as exited, stop_signals.handled():
        assert run_steps(training_run(run_dir), signal_at=6) == (6, "interrupted")
    assert exited.value.code == 128 + signal.SIGTERM
    assert "resume with: resume run" in capfd.readouterr().err
    assert load_checkpoint(run_dir)["step"] == 6  # the cadence's was at 4; the stop wrote another
    assert [row["step"] for row in read_history(run_dir)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run_dir / "summary.json").read_text())["stopped_by"] == "interrupted"
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))


def test_a_resume_keeps_the_rows_up_to_its_checkpoint_and_the_run_clock_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_steps(training_run(run_dir), until=6)
    rows = read_history(run_dir)
    # As if killed after step 6's rows were written but before its checkpoint: the newest is step 4's.
    (run_dir / "checkpoint.json").write_text(json.dumps({"latest": "iteration_000004", "iteration": 4}))
    resumed = training_run(run_dir, first_step=4)
    assert [row["step"] for row in resumed.history] == [1, 2, 3, 4]
    assert resumed.wall_offset == rows[3]["wall_s"] > 0
    assert run_steps(resumed) == (10, "steps")
    history = read_history(run_dir)
    assert [row["step"] for row in history] == list(range(1, 11))
    assert all(later["wall_s"] >= earlier["wall_s"] for earlier, later in zip(history, history[1:]))
    assert load_checkpoint(run_dir)["step"] == 10  # the last step is always one


def test_the_time_budget_stops_the_launch(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = training_run(run_dir, last_step=10**9, max_seconds=0.2)
    started = time.perf_counter()
    step, stopped_by = run_steps(run)
    assert stopped_by == "max_seconds" and 0.2 <= time.perf_counter() - started < 5
    assert load_checkpoint(run_dir)["step"] == step


def test_a_failed_loop_still_closes_its_loggers_and_lets_the_error_through(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = training_run(run_dir)
    with pytest.raises(RuntimeError, match="collector lost"):
        with run:
            run.log({"step": 1, "loss": 1.0, "wall_s": 0.0}, {"train/loss": 1.0}, 1)
            raise RuntimeError("collector lost")
    assert run.loggers and all(logger.writer.all_writers is None for logger in run.loggers)  # closed


def test_the_loop_completes_steps_as_the_update_says_and_stops_where_its_source_ends(tmp_path, capfd):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = training_run(run_dir, last_step=10, every=2)
    batches, logged = [], []
    with run:
        # Three batches to a step (as an off-policy iteration's updates), and a source of 7.
        step, stopped_by = run.loop(0, range(7), lambda step, batch: batches.append(batch) or len(batches) % 3 == 0,
                                    lambda step: logged.append(step), lambda step: run.checkpoint(step, {"step": step}),
                                    completed="steps", ended=lambda: "source ended")
    assert (step, stopped_by) == (2, "source ended") and logged == [1, 2] and batches == list(range(7))
    assert load_checkpoint(run_dir)["step"] == 2  # written once, at the cadence: no second one where it stopped
    assert capfd.readouterr().err.count("source ended: stopped after step 2") == 1


def test_a_loop_checkpoints_a_step_once_when_its_own_cadence_saved_it(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = training_run(run_dir, last_step=6, every=3)
    saved = []

    def checkpoint(step):
        saved.append(step)
        run.checkpoint(step, {"step": step})

    def after(step):
        if step in (2, 3):  # a new best, as RL's evaluations checkpoint it; 3 is also on the cadence
            checkpoint(step)
        return None

    with run:
        assert run.loop(0, itertools.count(), lambda step, batch: True, after, checkpoint, completed="steps",
                        ended=lambda: "source ended") == (6, "steps")
    assert saved == [2, 3, 6]


def test_a_step_the_training_checkpointed_before_logging_keeps_its_row(tmp_path):
    """An evaluation plays the step's checkpoint and then logs the row with its result (Phase A/B's
    --eval-every): the history is written again after that row."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = training_run(run_dir, last_step=10, every=5)

    def after(step):
        run.checkpoint(step, {"step": step})
        run.log({"step": step, "loss": 1.0, "wall_s": run.run_clock()}, {"train/loss": 1.0}, step)
        return "evaluated" if step == 2 else None

    with run:
        assert run.loop(0, itertools.count(), lambda step, batch: True, after,
                        lambda step: run.checkpoint(step, {"step": step}), completed="steps",
                        ended=lambda: "source ended") == (2, "evaluated")
    assert [row["step"] for row in read_history(run_dir)] == [1, 2]
