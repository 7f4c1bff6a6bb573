"""Phase A and Phase B log to the tracker `--logger` names, as `hetlab train` does: an mlflow run in
the local store holds every logged row and the options, a resume continues the same run, and a
resume that asks for another tracker is refused."""

from __future__ import annotations

import json

import pytest

from hetlab.errors import UserError
from hetlab.imitation.phase_a import train_phase_a
from hetlab.imitation.phase_b import PhaseBConfig, train_phase_b
from hetlab.imitation.presets import PhaseAConfig
from hetlab.run_history import read_history
from hetlab.train.loggers import TrackerOptions

MLFLOW = TrackerOptions(logger="mlflow", tags=("imitation",))


def mlflow_run(run_dir):
    from mlflow.tracking import MlflowClient

    saved = json.loads((run_dir / "logger_run.json").read_text())["mlflow"]
    client = MlflowClient(saved["tracking_uri"])
    return client, client.get_run(saved["run_id"])


def logged(client, run, key: str) -> dict[int, float]:
    return {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, key)}


def test_both_phases_log_their_rows_and_options_to_mlflow_and_a_resume_continues_the_run(
        tiny_aloha_dataset, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default: a store beside the run directories
    runs = tmp_path / "runs"
    phase_a = dict(dataset=tiny_aloha_dataset, preset="tiny", train_episodes="0-1", loader_workers=0, runs_dir=runs)
    run_dir = train_phase_a(PhaseAConfig(**phase_a, steps=20, tracker=MLFLOW))
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED" and run.info.run_name == f"aloha-ar-actor/{run_dir.name}"
    assert client.get_experiment(run.info.experiment_id).name == "aloha-ar-actor"
    assert run.data.params["preset"] == "tiny" and run.data.params["tracker.logger"] == "mlflow"
    assert run.data.tags["imitation"] == ""
    assert logged(client, run, "train/loss") == {row["step"]: pytest.approx(row["loss"]) for row in read_history(run_dir)}

    train_phase_a(PhaseAConfig(resume=run_dir, steps=30))
    assert sorted(logged(client, run, "train/loss")) == [10, 20, 30]
    assert len(client.search_runs([run.info.experiment_id])) == 1  # the same run, continued
    with pytest.raises(UserError, match="--logger wandb: .* was trained with mlflow"):
        train_phase_a(PhaseAConfig(resume=run_dir, steps=40, tracker=TrackerOptions(logger="wandb")))

    phase_b = train_phase_b(PhaseBConfig(from_run=run_dir, train_episodes="0-1", calibration_episodes="0-1", steps=20,
                                         out=runs / "aloha-ar-actor" / "phase-b", runs_dir=runs, tracker=MLFLOW))
    client, run_b = mlflow_run(phase_b)
    assert run_b.info.run_name == "aloha-ar-actor/phase-b" and run_b.data.params["condition"] == "learner"
    assert sorted(logged(client, run_b, "train/loss")) == [10, 20]
    with pytest.raises(UserError, match="--logger asks for wandb where the run has mlflow"):
        train_phase_b(PhaseBConfig(resume=phase_b, steps=30, tracker=TrackerOptions(logger="wandb")))
