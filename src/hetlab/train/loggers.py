"""Where a run's curves go: TensorBoard always, and the tracker `--logger` names beside it.

Every training loop (RL's `RunRecord`, Phase A, Phase B) writes to the loggers `make_loggers`
returns for its `TrackedRun`: each row's scalars against its step (env steps, optimizer steps),
the policy videos of --video-every, and at the end whether the run failed. Each logger writes
the run's options when its own record of the run starts, not when a resume continues it. wandb and mlflow are imported only when chosen; `require_logger` imports the chosen
one before a run directory exists. A tracker's run is continued by `--resume`: its id is kept in
RUN_DIR/logger_run.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from abc import ABC, abstractmethod
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.files import out_of_space, space_checked, write_text_atomic

LOGGER_RUN_FILE = "logger_run.json"  # the tracker run's id, for --resume
WANDB_PROJECT = "hetlab"  # unless WANDB_PROJECT says otherwise
MLFLOW_PARAMS_PER_BATCH = 100  # mlflow's limit per log_batch call
VIDEO_KEY = "video/policy"


@dataclass(frozen=True, kw_only=True)
class TrackerOptions:
    """Where the curves, options and videos go besides TensorBoard (always written): wandb (the `wandb`
    extra; WANDB_MODE=offline keeps it in RUN_DIR/wandb) or mlflow (the `mlflow` extra;
    MLFLOW_TRACKING_URI, else RUNS_DIR/mlflow.db); a resumed run continues its wandb or mlflow run."""

    logger: Literal["tensorboard", "wandb", "mlflow"] = "tensorboard"  # the tracker beside TensorBoard, if any
    run_name: str = ""  # the run's name in wandb or mlflow; "" = the run directory's <parent>/<name>
    tags: tuple[str, ...] = ()  # tags of the run in wandb or mlflow
    group: str = ""  # wandb: the run's group; mlflow: its experiment ("" = the run directory's parent's name)


@dataclass(frozen=True)
class TrackedRun:
    """What the loggers are told of a run."""

    tracker: TrackerOptions
    run_dir: Path
    runs_dir: Path  # where mlflow's default store goes
    options: dict[str, int | float | str | bool]  # written once, when a logger's record of the run starts
    metrics: tuple[str, ...]  # the curves TensorBoard's HPARAMS tab shows beside the options

    @property
    def name(self) -> str:
        return self.tracker.run_name or f"{self.run_dir.parent.name}/{self.run_dir.name}"

    @property
    def experiment(self) -> str:
        return self.tracker.group or self.run_dir.parent.name


@dataclass(frozen=True)
class PolicyVideo:
    """A rendered video of the policy (--video-every): the mp4, and a small animated GIF of it for
    TensorBoard, whose own video summaries need moviepy."""

    path: Path
    iteration: int
    env_steps: int
    gif: bytes
    gif_size: tuple[int, int]  # width, height


class Logger(ABC):
    """What a training loop's record writes to (RunRecord, Phase A, Phase B)."""

    @abstractmethod
    def scalars(self, values: dict[str, float], step: int) -> None:
        """One row's scalars, by name (`train/...`, `loss/...`, `eval/...`), at `step` (env steps in RL)."""

    @abstractmethod
    def video(self, video: PolicyVideo) -> None:
        """A policy video, once rendered (after the rows of later iterations may have been logged)."""

    @abstractmethod
    def close(self, failed: bool) -> None:
        """The end of this launch; `failed`: it ended on an exception."""


def require_logger(logger: str) -> None:
    """Import the package `--logger` needs; UserError naming its extra if it is not installed."""
    if logger != "tensorboard":
        require(logger, logger, f"--logger {logger}")


def make_loggers(run: TrackedRun) -> list[Logger]:
    """TensorBoard's logger, and the chosen tracker's, each started or (on resume) continued."""
    loggers: list[Logger] = [TensorBoardLogger(run)]
    try:
        if run.tracker.logger == "wandb":
            loggers.append(WandbLogger(run))
        elif run.tracker.logger == "mlflow":
            loggers.append(MlflowLogger(run))
    except BaseException:
        loggers[0].close(failed=True)
        raise
    return loggers


def close_loggers(loggers: list[Logger], failed: bool) -> None:
    """Close every logger, whichever fails (the first failure is raised)."""
    with ExitStack() as closing:
        for logger in loggers:
            closing.callback(logger.close, failed=failed)


def flat_options(options, prefix: str = "") -> dict[str, int | float | str | bool]:
    """A config's options as the loggers take them: nested dataclasses as `group.name`, sequences,
    paths and None as text."""
    flat = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if dataclasses.is_dataclass(value):
            flat |= flat_options(value, f"{prefix}{f.name}.")
        else:
            flat[prefix + f.name] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return flat


def mlflow_store(runs_dir: str | Path) -> tuple[str, str | None]:
    """(tracking URI, artifact location of a new experiment): MLFLOW_TRACKING_URI if set, with that
    store's own artifact location; else a SQLite store that every run under RUNS_DIR shares,
    RUNS_DIR/mlflow.db, its artifacts in RUNS_DIR/mlartifacts (mlflow's own default and `mlflow
    server`'s layout, but beside the runs rather than in whatever directory training started in)."""
    if uri := os.environ.get("MLFLOW_TRACKING_URI"):
        return uri, None
    runs_dir = Path(runs_dir).resolve()
    return f"sqlite:///{runs_dir / 'mlflow.db'}", (runs_dir / "mlartifacts").as_uri()


class TensorBoardLogger(Logger):
    """RUN_DIR/tensorboard: scalars, the options in the HPARAMS tab, videos as animated GIFs in IMAGES."""

    def __init__(self, run: TrackedRun):
        from torch.utils.tensorboard import SummaryWriter  # slow to import; only training needs it

        directory = run.run_dir / "tensorboard"
        new = not any(directory.glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(str(directory))
        self.events = f"{directory}/events.out.tfevents.*"
        _quiet_tensorboard_full_disk()
        if new:  # the options beside the curves they led to
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(run.options, dict.fromkeys(run.metrics, 0.0)):
                self.writer.file_writer.add_summary(summary)

    def scalars(self, values: dict[str, float], step: int) -> None:
        with space_checked(self.events):
            for name, value in values.items():
                self.writer.add_scalar(name, value, step)

    def video(self, video: PolicyVideo) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        width, height = video.gif_size
        image = Summary.Image(height=height, width=width, colorspace=3, encoded_image_string=video.gif)
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(tag=VIDEO_KEY, image=image)]), video.env_steps)
        self.writer.flush()

    def close(self, failed: bool) -> None:
        try:
            with space_checked(self.events):
                self.writer.close()
        except UserError:
            if not failed:  # else the run's own error says it, and this one would hide which write failed first
                raise


def _quiet_tensorboard_full_disk() -> None:
    """TensorBoard's writer thread, finding the disk full, prints its traceback and leaves the error for
    the training thread's next write to raise again (as one line): print it only there."""
    if getattr(threading.excepthook, "quiets_tensorboard", False):
        return
    previous = threading.excepthook

    def excepthook(args) -> None:
        if not (type(args.thread).__module__.startswith("tensorboard.") and out_of_space(args.exc_value)):
            previous(args)

    excepthook.quiets_tensorboard = True
    threading.excepthook = excepthook


class WandbLogger(Logger):
    """A wandb run in project WANDB_PROJECT (default hetlab), its files under RUN_DIR/wandb
    (WANDB_MODE=offline keeps it there until `wandb sync`); a resume continues the same run. The
    rows a resume logs again after a crash (those past its checkpoint) wandb keeps from the first
    time: it drops steps below its newest."""

    def __init__(self, run: TrackedRun):
        wandb = require("wandb", "wandb", "--logger wandb")
        run_dir, tracker = run.run_dir, run.tracker
        saved = _read_logger_run(run_dir).get("wandb")
        try:
            self.run = wandb.init(
                dir=run_dir, project=saved["project"] if saved else os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
                id=saved["id"] if saved else None, resume="allow" if saved else None,
                name=run.name, tags=list(tracker.tags) or None, group=tracker.group or None,
                config=None if saved else run.options,
                # Left on, wandb wraps stdout and stderr, which the console lines and the collectors share.
                settings=wandb.Settings(console="off"),
            )
        except wandb.Error as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"--logger wandb could not start a run ({first_line}); log in with `wandb login`, "
                            "or set WANDB_MODE=offline to keep it in the run directory") from e
        if not saved:
            _write_logger_run(run_dir, {"wandb": {"id": self.run.id, "project": self.run.project}})
        self.wandb = wandb
        self.step = self.video_step = -1  # the newest step of a row, of a video

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)
        self.step = step

    def video(self, video: PolicyVideo) -> None:
        # wandb drops what is logged at a step below its newest and keeps one value per key and
        # step: a video joins the newest row, or goes one step past a video already there (those
        # the end of a run waits for); its caption says which iteration it shows.
        self.video_step = max(self.step, self.video_step + 1)
        media = self.wandb.Video(str(video.path), format="mp4",
                                 caption=f"iteration {video.iteration}, {video.env_steps:,} env steps")
        self.run.log({VIDEO_KEY: media}, step=self.video_step)

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowLogger(Logger):
    """An mlflow run in experiment --group (default the run directory's parent: <task>-<algo>,
    aloha-ar-actor), in the store `mlflow_store`
    picks; videos as artifacts under videos/. A row's metrics are sent while the next iteration
    runs, so the learner does not wait for the store; a resume continues the same run in the same
    store."""

    def __init__(self, run: TrackedRun):
        require("mlflow", "mlflow", "--logger mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        saved = _read_logger_run(run.run_dir).get("mlflow")
        uri, artifacts = (saved["tracking_uri"], None) if saved else mlflow_store(run.runs_dir)
        try:
            self.client = MlflowClient(uri)
            if saved:
                self.run_id = saved["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                self.run_id = self._start(run, artifacts)
                params = [Param(name, str(value)) for name, value in run.options.items()]
                for first in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
                    self.client.log_batch(self.run_id, params=params[first:first + MLFLOW_PARAMS_PER_BATCH])
        except MlflowException as e:
            raise UserError(f"--logger mlflow could not start a run at {uri} ({e.message.splitlines()[0]}); "
                            "set MLFLOW_TRACKING_URI to a store that works") from e
        if not saved:
            _write_logger_run(run.run_dir, {"mlflow": {"tracking_uri": uri, "run_id": self.run_id}})
        self.Metric = Metric
        self.sending = None  # the newest row's metrics, on their way

    def _start(self, run: TrackedRun, artifacts: str | None) -> str:
        experiment = self.client.get_experiment_by_name(run.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = self.client.create_experiment(run.experiment, artifact_location=artifacts)
        started = self.client.create_run(experiment_id, run_name=run.name, tags=dict.fromkeys(run.tracker.tags, ""))
        return started.info.run_id

    def scalars(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(name, float(value), now, step) for name, value in values.items()]
        sending = self.client.log_batch(self.run_id, metrics=metrics, synchronous=False)
        # One row in flight at most: a store that fails is heard of, and nothing piles up.
        if self.sending is not None:
            self.sending.wait()
        self.sending = sending

    def video(self, video: PolicyVideo) -> None:
        self.client.log_artifact(self.run_id, str(video.path), "videos")

    def close(self, failed: bool) -> None:
        if self.sending is not None:
            self.sending.wait()
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _read_logger_run(run_dir: Path) -> dict:
    path = run_dir / LOGGER_RUN_FILE
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except ValueError as e:
        raise UserError(f"{path} is corrupt ({e}); delete it to start a new tracker run for this run") from e


def _write_logger_run(run_dir: Path, ids: dict) -> None:
    write_text_atomic(run_dir / LOGGER_RUN_FILE, json.dumps(ids, indent=2))
