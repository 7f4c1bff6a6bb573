"""Where a run's curves go: TensorBoard always, and the tracker `--logger` names beside it.

`RunRecord` writes to the loggers `make_loggers` returns: each row's scalars against env steps,
the policy videos of --video-every, and at the end whether the run failed. Each logger writes
the run's options (`hyperparameters`) when its own record of the run starts, not when a resume
continues it. wandb and mlflow are imported only when chosen; `require_logger` imports the chosen
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
from dataclasses import dataclass
from pathlib import Path

from hetlab.errors import UserError
from hetlab.extras import require
from hetlab.files import out_of_space, space_checked, write_text_atomic

LOGGER_RUN_FILE = "logger_run.json"  # the tracker run's id, for --resume
# The curves TensorBoard's HPARAMS tab shows beside the options.
HPARAM_METRICS = ("train/mean_return", "eval/return")
WANDB_PROJECT = "hetlab"  # unless WANDB_PROJECT says otherwise
MLFLOW_PARAMS_PER_BATCH = 100  # mlflow's limit per log_batch call
VIDEO_KEY = "video/policy"


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
    """What RunRecord writes to."""

    @abstractmethod
    def scalars(self, values: dict[str, float], env_steps: int) -> None:
        """One row's scalars, by name (`train/...`, `loss/...`, `eval/...`), at `env_steps`."""

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


def make_loggers(cfg, run_dir: Path) -> list[Logger]:
    """TensorBoard's logger, and the chosen tracker's, each started or (on resume) continued."""
    options = hyperparameters(cfg)
    loggers: list[Logger] = [TensorBoardLogger(run_dir, options)]
    try:
        if cfg.logger == "wandb":
            loggers.append(WandbLogger(cfg, run_dir, options))
        elif cfg.logger == "mlflow":
            loggers.append(MlflowLogger(cfg, run_dir, options))
    except BaseException:
        loggers[0].close(failed=True)
        raise
    return loggers


def hyperparameters(cfg) -> dict[str, int | float | str | bool]:
    """The run's options as the loggers take them: the top-level ones and the chosen algorithm's
    (`ppo.gamma`), sequences and None as text."""

    def scalar(value):
        return value if isinstance(value, (int, float, str, bool)) else str(value)

    options = {f.name: scalar(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
               if not dataclasses.is_dataclass(getattr(cfg, f.name))}
    algo = cfg.algo_config
    return options | {f"{cfg.algo}.{f.name}": scalar(getattr(algo, f.name)) for f in dataclasses.fields(algo)}


def run_name(cfg, run_dir: Path) -> str:
    """--run-name, else the run directory as RUNS_DIR names it: <task>-<algo>/<timestamp>."""
    return cfg.run_name or f"{run_dir.parent.name}/{run_dir.name}"


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

    def __init__(self, run_dir: Path, options: dict):
        from torch.utils.tensorboard import SummaryWriter  # slow to import; only training needs it

        directory = run_dir / "tensorboard"
        new = not any(directory.glob("events.out.tfevents.*"))
        self.writer = SummaryWriter(str(directory))
        self.events = f"{directory}/events.out.tfevents.*"
        _quiet_tensorboard_full_disk()
        if new:  # the options beside the curves they led to
            from torch.utils.tensorboard.summary import hparams

            for summary in hparams(options, dict.fromkeys(HPARAM_METRICS, 0.0)):
                self.writer.file_writer.add_summary(summary)

    def scalars(self, values: dict[str, float], env_steps: int) -> None:
        with space_checked(self.events):
            for name, value in values.items():
                self.writer.add_scalar(name, value, env_steps)

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

    def __init__(self, cfg, run_dir: Path, options: dict):
        wandb = require("wandb", "wandb", "--logger wandb")
        saved = _read_logger_run(run_dir).get("wandb")
        try:
            self.run = wandb.init(
                dir=run_dir, project=saved["project"] if saved else os.environ.get("WANDB_PROJECT", WANDB_PROJECT),
                id=saved["id"] if saved else None, resume="allow" if saved else None,
                name=run_name(cfg, run_dir), tags=list(cfg.tags) or None, group=cfg.group or None,
                config=None if saved else options,
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

    def scalars(self, values: dict[str, float], env_steps: int) -> None:
        self.run.log(values, step=env_steps)
        self.step = env_steps

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
    """An mlflow run in experiment --group (default <task>-<algo>), in the store `mlflow_store`
    picks; videos as artifacts under videos/. A row's metrics are sent while the next iteration
    runs, so the learner does not wait for the store; a resume continues the same run in the same
    store."""

    def __init__(self, cfg, run_dir: Path, options: dict):
        require("mlflow", "mlflow", "--logger mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        saved = _read_logger_run(run_dir).get("mlflow")
        uri, artifacts = (saved["tracking_uri"], None) if saved else mlflow_store(cfg.runs_dir)
        try:
            self.client = MlflowClient(uri)
            if saved:
                self.run_id = saved["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                self.run_id = self._start(cfg, run_dir, artifacts)
                params = [Param(name, str(value)) for name, value in options.items()]
                for first in range(0, len(params), MLFLOW_PARAMS_PER_BATCH):
                    self.client.log_batch(self.run_id, params=params[first:first + MLFLOW_PARAMS_PER_BATCH])
        except MlflowException as e:
            raise UserError(f"--logger mlflow could not start a run at {uri} ({e.message.splitlines()[0]}); "
                            "set MLFLOW_TRACKING_URI to a store that works") from e
        if not saved:
            _write_logger_run(run_dir, {"mlflow": {"tracking_uri": uri, "run_id": self.run_id}})
        self.Metric = Metric
        self.sending = None  # the newest row's metrics, on their way

    def _start(self, cfg, run_dir: Path, artifacts: str | None) -> str:
        name = cfg.group or f"{cfg.task}-{cfg.algo}"
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = self.client.create_experiment(name, artifact_location=artifacts)
        run = self.client.create_run(experiment_id, run_name=run_name(cfg, run_dir), tags=dict.fromkeys(cfg.tags, ""))
        return run.info.run_id

    def scalars(self, values: dict[str, float], env_steps: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(name, float(value), now, env_steps) for name, value in values.items()]
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
