"""`hetlab train --logger wandb|mlflow` and `--video-every`, on short real cartpole runs: wandb
offline (its run file read back), mlflow's own store (read back with MlflowClient), TensorBoard's
event files, the rendered mp4s, and the refusals before a run directory exists."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import hetlab

SMALL_RUN = dict(task="cartpole-balance", envs=16, horizon=8, ppo={"actor_hidden": (16, 16), "critic_hidden": (16, 16)})


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb without a network or a login: offline, its own settings and caches under tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home" / variable.lower()))
    monkeypatch.delenv("WANDB_PROJECT", raising=False)


def wandb_records(path: Path):
    """The records of an offline run's .wandb file, as wandb's own protobuf parses them. The file is
    LevelDB's log format (32 KiB blocks of chunks, each with a 7-byte header: checksum, length,
    type), after wandb's 7-byte header; wandb 0.31 reads it only in its Go core."""
    from wandb.proto import wandb_internal_pb2

    block, header = 32 * 1024, 7
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, chunks = header, b""
    while position + header <= len(data):
        if block - position % block < header:  # the rest of a block too short for a header is padding
            position += block - position % block
            continue
        length, kind = int.from_bytes(data[position + 4:position + 6], "little"), data[position + 6]
        chunks += data[position + header:position + header + length]
        position += header + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            yield record
            chunks = b""


def wandb_offline_run(wandb_file: Path) -> tuple:
    """(the run record, {step: {key: value}}) of an offline run file; media values as their JSON."""
    run, rows = None, {}
    for record in wandb_records(wandb_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            row = rows.setdefault(record.history.step.num, {})
            for item in record.history.item:
                key = item.key or item.nested_key[0]
                if item.nested_key[1:]:
                    row.setdefault(key, {})[item.nested_key[1]] = json.loads(item.value_json)
                else:
                    row[key] = json.loads(item.value_json)
    return run, rows


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_wandb_offline_run_holds_every_scalar_and_the_options_and_a_resume_continues_it(tmp_path, wandb_offline,
                                                                                        refusal, capsys):
    run_dir = hetlab.train_policy(**SMALL_RUN, runs_dir=str(tmp_path / "runs"), max_iterations=2, logger="wandb",
                                  run_name="cartpole smoke", tags=("loggers", "ppo"), group="tests")
    wandb_id = json.loads((run_dir / "logger_run.json").read_text())["wandb"]["id"]
    [first_file] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    run, rows = wandb_offline_run(first_file)
    assert (run.run_id, run.display_name, list(run.tags), run.run_group, run.project) == \
        (wandb_id, "cartpole smoke", ["loggers", "ppo"], "tests", "hetlab")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["task"] == "cartpole-balance" and config["envs"] == 16 and config["ppo.actor_hidden"] == "(16, 16)"
    assert config["logger"] == "wandb" and config["ppo.learning_rate"] > 0
    # Every scalar TensorBoard has, at the same env steps with the same values.
    scalars = tensorboard_scalars(run_dir)
    assert len(scalars) > 10 and set(rows) == {128, 256}
    for tag, points in scalars.items():
        steps, values = zip(*points)
        assert [rows[step][tag] for step in steps] == pytest.approx(values, nan_ok=True), tag

    # The resume continues the same wandb run (a second offline file of the same id), from the next row on.
    assert hetlab.train_policy(resume=str(run_dir), max_iterations=3) == run_dir
    [second_file] = set((run_dir / "wandb").glob("offline-run-*/run-*.wandb")) - {first_file}
    resumed, resumed_rows = wandb_offline_run(second_file)
    assert resumed.run_id == wandb_id and set(resumed_rows) == {384}
    assert set(resumed_rows[384]) >= set(scalars)
    # The tracker is the run's own, like its other options.
    capsys.readouterr()  # what the runs printed
    assert "--logger asks for 'mlflow' where the run has 'wandb'" in \
        refusal("train", "--resume", run_dir, "--max-iterations", "4", "--logger", "mlflow")


def test_mlflow_run_in_the_local_store_holds_the_metrics_and_options_and_a_resume_continues_it(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default: a store beside the run directories
    runs = tmp_path / "runs"
    run_dir = hetlab.train_policy(**SMALL_RUN, runs_dir=str(runs), max_iterations=2, logger="mlflow",
                                  tags=("loggers",))
    saved = json.loads((run_dir / "logger_run.json").read_text())["mlflow"]
    assert saved["tracking_uri"] == f"sqlite:///{runs.resolve() / 'mlflow.db'}"
    client = MlflowClient(saved["tracking_uri"])
    run = client.get_run(saved["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == f"cartpole-balance-ppo/{run_dir.name}"
    assert client.get_experiment(run.info.experiment_id).name == "cartpole-balance-ppo"
    assert run.data.tags["loggers"] == ""
    assert run.data.params["task"] == "cartpole-balance" and run.data.params["ppo.critic_hidden"] == "(16, 16)"
    # Every scalar TensorBoard has, at the same env steps with the same values.
    scalars = tensorboard_scalars(run_dir)
    assert len(scalars) > 10 and set(run.data.metrics) == set(scalars)
    for tag, points in scalars.items():
        history = dict((metric.step, metric.value) for metric in client.get_metric_history(run.info.run_id, tag))
        steps, values = zip(*points)
        assert sorted(history) == list(steps) and [history[step] for step in steps] == pytest.approx(values, nan_ok=True)

    hetlab.train_policy(resume=str(run_dir), max_iterations=3)
    resumed = client.get_run(saved["run_id"])
    assert resumed.info.status == "FINISHED" and resumed.data.params == run.data.params
    steps = [metric.step for metric in client.get_metric_history(run.info.run_id, "train/env_steps")]
    assert sorted(steps) == [128, 256, 384]
    assert len(client.search_runs([run.info.experiment_id])) == 1  # no second run


def test_video_every_renders_in_a_side_process_while_training_goes_on(tmp_path, wandb_offline, capsys):
    run_dir = hetlab.train_policy(**SMALL_RUN, runs_dir=str(tmp_path / "runs"), max_iterations=3, video_every=1,
                                  logger="wandb")
    out = capsys.readouterr().out
    # Iteration 1's video is handed over, and the loop runs iterations 2 and 3 while it renders;
    # iteration 2's waits, and gives way to iteration 3's.
    assert out.index("it     2 |") < out.index("video of iteration 1: ")
    assert "video of iteration 2 skipped" in out
    videos = sorted((run_dir / "videos").iterdir())
    assert [video.name for video in videos] == ["iteration_1.mp4", "iteration_3.mp4"]
    for video in videos:
        with av.open(str(video)) as container:
            frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
        assert frames.shape == (250, 240, 320, 3)  # 5 s at cartpole's 50 Hz control
        assert frames.max() > 100 and (np.abs(frames.astype(np.int16) - frames[:1]).max(axis=-1) > 40).any()
    # In TensorBoard as animated GIFs at the env steps of their iterations.
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    images = events.Images("video/policy")
    assert [image.step for image in images] == [128, 384]
    gif = Image.open(io.BytesIO(images[0].encoded_image_string))
    assert gif.format == "GIF" and gif.size == (160, 120) and gif.n_frames == 125  # 25 fps
    # In wandb as videos, each captioned with its iteration.
    [wandb_file] = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    _, rows = wandb_offline_run(wandb_file)
    logged = [(step, row["video/policy"]) for step, row in sorted(rows.items()) if "video/policy" in row]
    assert [video["caption"] for _, video in logged] == ["iteration 1, 128 env steps", "iteration 3, 384 env steps"]
    assert all((wandb_file.parent / "files" / video["path"]).is_file() for _, video in logged)


@pytest.mark.parametrize(("args", "message"), [
    (["--video-every", "-1"], "--video-every must be ≥ 0 (0 = no videos), got -1"),
    (["--logger", "wandb"], "--logger wandb needs 'wandb': pip install 'hetlab[wandb]'"),
    (["--logger", "mlflow"], "--logger mlflow needs 'mlflow': pip install 'hetlab[mlflow]'"),
    (["--video-every", "5"], "--video-every renders the policy headless, but MUJOCO_GL=no-such-backend cannot render"),
])
def test_refusals_before_the_run_directory_exists(tmp_path, refusal, monkeypatch, args, message):
    # Absent packages, for real: an import of a module whose sys.modules entry is None fails.
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setenv("MUJOCO_GL", "no-such-backend")
    assert message in refusal("train", "--runs-dir", tmp_path / "runs", "--task", "cartpole-balance", *args)
    assert not (tmp_path / "runs").exists()
