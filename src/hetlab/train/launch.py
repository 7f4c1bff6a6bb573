"""`hetlab train`: from a config to a running loop.

Resolve the config (a resumed run's own, with the options a resumed run may change; a new run's
defaults scaled to the learner device it picks), validate it, split the CPU threads, create the
run directory with the resolved config.json, and hand the run to its algorithm's loop.
Everything a user can get wrong fails here, before the run directory exists.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from datetime import datetime
from pathlib import Path

import torch

from hetlab.checkpoint import checkpoint_dir, read_checkpoint
from hetlab.devices import apply_thread_budget, pick_device, thread_budget
from hetlab.errors import UserError
from hetlab.files import write_text_atomic
from hetlab.run_meta import META_FILE, record_launch
from hetlab.runtime.pool import CollectorPool, ProcessPool
from hetlab.train.config import (TrainConfig, load_run_config, validate, with_option, with_ray_pool_sizes,
                                 with_run_defaults)
from hetlab.train.device_defaults import scale_defaults, scaled_line
from hetlab.train.loggers import require_logger
from hetlab.train.off_policy import train_off_policy
from hetlab.train.on_policy import train_on_policy
from hetlab.train.video import check_rendering

# What a resumed run takes from the command line: its budgets, where it runs and where a run
# resumed from an older checkpoint goes. Everything else is the run's own; a command line that
# asks for another value is refused.
RESUMABLE_OPTIONS = ("max_iterations", "max_seconds", "target_return", "device", "threads", "checkpoint_every",
                     "keep_checkpoints", "eval_every", "eval_envs", "video_every", "resume", "runs_dir", "ray",
                     "ray_pool.max_restarts")
# Of those, the ones a resume leaves unset (None) keep the run's values: a run that keeps every
# checkpoint, evaluates, or records videos goes on doing so.
KEPT_UNLESS_GIVEN = ("keep_checkpoints", "eval_every", "eval_envs", "video_every")


def train(cfg: TrainConfig) -> Path:
    """Run training; returns the run directory."""
    resume_state, branch_of, given = None, None, cfg
    if cfg.resume:
        run_dir = Path(cfg.resume)
        chosen = checkpoint_dir(run_dir, cfg.checkpoint)
        resume_state = read_checkpoint(run_dir, chosen)
        if chosen != checkpoint_dir(run_dir):
            branch_of = (run_dir, chosen)
        # Which checkpoint to start from is this launch's choice; the run goes on from its newest.
        given = dataclasses.replace(cfg, checkpoint="latest")
        cfg = resumed_config(load_run_config(run_dir), with_ray_pool_sizes(given, given))
    elif cfg.checkpoint != "latest":
        raise UserError(f"--checkpoint {cfg.checkpoint} picks the checkpoint --resume continues from; "
                        "give --resume RUN_DIR too")
    cfg = with_run_defaults(cfg)
    if cfg.motion:  # absolute, so that play and export find the clip from anywhere
        cfg = dataclasses.replace(cfg, motion=str(Path(cfg.motion).expanduser().resolve()))
    device = pick_device(cfg.device)
    # A resumed run keeps its saved values, resolved for the device it started on.
    cfg, scaled = scale_defaults(cfg, device) if resume_state is None else (cfg, {})
    cfg = with_ray_pool_sizes(cfg, given)  # explicit sizes win over the scaled defaults
    validate(cfg)
    require_logger(cfg.logger)
    if cfg.video_every:
        check_rendering()
    if resume_state is not None and resume_state["iteration"] >= cfg.max_iterations:
        done = resume_state["iteration"]
        raise UserError(f"{run_dir} has already trained {done} iterations; pass --max-iterations above {done} "
                        "to train it further")
    pool = open_pool(cfg)
    try:
        if resume_state is None or branch_of:
            run_dir = Path(cfg.runs_dir) / f"{cfg.task}-{cfg.algo}" / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            run_dir.mkdir(parents=True)
        if branch_of:
            branch_run(*branch_of, run_dir, resume_state["iteration"])
        # A resume writes it again: the budgets and options it may change are the run's from now on.
        write_text_atomic(run_dir / "config.json", json.dumps(saved_config(cfg, device.torch_device), indent=2))
        record_launch(run_dir, device.torch_device, device.name)
        print(run_dir, flush=True)  # first line: where everything goes
        if scaled:
            print(scaled_line(scaled), flush=True)

        budget = thread_budget(device, cfg.threads, overlap=cfg.resolved_mode != "sync")
        apply_thread_budget(budget)
        physics_threads = max(1, budget.physics // cfg.collectors)
        algo = cfg.build_algorithm(torch.device(device.torch_device))
        loop = train_off_policy if cfg.is_off_policy else train_on_policy
        loop(cfg, run_dir, device, algo, resume_state, physics_threads, pool)
    finally:
        pool.close()
    return run_dir


def branch_run(source: Path, checkpoint: Path, run_dir: Path, iteration: int) -> None:
    """Start `run_dir` as `source` was at the checkpoint of `iteration`: that checkpoint, the
    history up to it, and meta.json's launches; `source` itself is left as it is."""
    shutil.copytree(checkpoint, run_dir / "checkpoints" / checkpoint.name)
    write_text_atomic(run_dir / "checkpoint.json", json.dumps({"latest": checkpoint.name}))
    history_file = source / "history.json"
    if history_file.is_file():
        rows = [row for row in json.loads(history_file.read_text()) if row["iteration"] < iteration]
        write_text_atomic(run_dir / "history.json", json.dumps(rows))
    launches = json.loads((source / META_FILE).read_text())["launches"] if (source / META_FILE).is_file() else []
    branched = {"branched_from": {"run": str(source.resolve()), "iteration": iteration}}
    write_text_atomic(run_dir / META_FILE, json.dumps({"launches": launches, **branched}, indent=2))


def saved_config(cfg: TrainConfig, torch_device: str) -> dict:
    """config.json: the resolved options (the device picked, not "auto") and only the chosen
    algorithm's group; a resumed run's other groups take their defaults, which it never reads."""
    saved = dataclasses.asdict(dataclasses.replace(cfg, device=torch_device.split(":")[0]))
    saved["algos"] = {cfg.algo: saved["algos"][cfg.algo]}
    return saved


def open_pool(cfg: TrainConfig) -> CollectorPool:
    """Local collector processes, or (--ray) a connection to the cluster that will run them,
    checked to have a CPU for each."""
    if cfg.ray is None:
        return ProcessPool()
    from hetlab.runtime.ray.cluster import RayCluster  # the `ray` extra: imported only when asked for

    cluster = RayCluster(cfg.ray)
    try:
        cluster.check_capacity(cfg.collectors)
        from hetlab.runtime.ray.pool import RayPool
    except BaseException:
        cluster.close()
        raise
    return RayPool(cluster, cfg.ray_pool.max_restarts)


def resumed_config(saved: TrainConfig, given: TrainConfig) -> TrainConfig:
    """The saved config with the command line's RESUMABLE_OPTIONS; UserError if the command line
    sets any other option to something else than the run has."""
    for option, value, own in _changed(given, saved, TrainConfig(), ""):
        if option not in RESUMABLE_OPTIONS:
            raise UserError(f"--resume continues {given.resume} with its own options, but --{option.replace('_', '-')} "
                            f"asks for {value!r} where the run has {own!r}; start a new run to change it")
    for option in RESUMABLE_OPTIONS:
        value = given
        for name in option.split("."):
            value = getattr(value, name)
        if option in KEPT_UNLESS_GIVEN and value is None:
            continue
        saved = with_option(saved, tuple(option.split(".")), value)
    return saved


def _changed(given, saved, default, prefix: str):
    """(option, given value, saved value) of each option set away from its default and the saved value."""
    for option in dataclasses.fields(given):
        value, own, unset = (getattr(config, option.name) for config in (given, saved, default))
        if dataclasses.is_dataclass(value):
            # The algorithms' groups have no prefix of their own on the command line (--ppo.*).
            yield from _changed(value, own, unset, "" if option.name == "algos" else f"{prefix}{option.name}.")
        elif value != unset and value != own:
            yield f"{prefix}{option.name}", value, own
