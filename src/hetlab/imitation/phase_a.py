"""Phase A: train the whole AR-Actor on the ALOHA cube-transfer demonstrations.

One step: a batch of 8 frames (image, state, the next `chunk` actions), the chunk predicted
with teacher forcing and a random history mask, L1 on the steps inside the episode, AdamW,
gradient clipping. Its options and presets are in presets.py, its batches in data.py, its
learning rate in schedule.py and the files a run leaves in run_files.py; what a resumed run may
change is here.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import numpy as np
import torch

from hetlab.aloha.record import recorded_render_quality
from hetlab.checkpoint import KEEP, load_checkpoint
from hetlab.datasets.lerobot import ACTION, STATE, LeRobotDataset
from hetlab.devices import OPTIMIZER_OPTIONS, autocast_for, cpu_count, pick_device
from hetlab.dir_lock import exclusive_writer
from hetlab.figures import figures_wanted
from hetlab.files import atomic_path, write_text_atomic
from hetlab.imitation.data import StepBatches, device_batch, dropout_seed, open_dataset, random_shift, step_generator
from hetlab.imitation.evaluate import check_eval_seeds, recorded_seeds, success_columns
from hetlab.imitation.presets import PhaseAConfig
from hetlab.imitation.run_files import (RUN_KIND, changed_option, config_from_json, load_weights,
                                        read_phase_a_config, run_render_quality)
from hetlab.imitation.schedule import learning_rate
from hetlab.errors import UserError
from hetlab.policies.ar_actor import ARActor, ARActorConfig, chunk_l1, random_history_mask
from hetlab.policies.resnet import load_imagenet
from hetlab.run_meta import record_launch
from hetlab.seeds import parse_seeds
from hetlab.train.loggers import TrackedRun, flat_options, require_logger
from hetlab.train.run_layer import TrainingRun, row_scalars


def build_model(model_cfg: ARActorConfig, dataset: LeRobotDataset, imagenet_weights: Path | None) -> ARActor:
    model = ARActor(model_cfg)
    stats = dataset.stats
    model.set_normalisation(stats[STATE]["mean"], stats[STATE]["std"], stats[ACTION]["mean"], stats[ACTION]["std"])
    if imagenet_weights is not None:
        load_imagenet(model.visual.backbone, imagenet_weights)
    return model


def train_phase_a(cfg: PhaseAConfig) -> Path:
    """Run (or resume) Phase A; returns the run directory."""
    with ExitStack() as held:
        return _train_phase_a(cfg, held)


def _train_phase_a(cfg: PhaseAConfig, held: ExitStack) -> Path:
    """`train_phase_a` holding, in `held`, the lock of the run directory it writes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    state, figures = None, figures_wanted()
    if cfg.resume is not None:
        run_dir = Path(cfg.resume)
        saved = read_phase_a_config(run_dir, "--resume continues a Phase-A run")
        held.enter_context(exclusive_writer(run_dir, "run"))
        state = load_checkpoint(run_dir)
        restored = config_from_json(saved["phase_a"], run_dir)
        refuse_changed_options(cfg, restored, run_dir)
        # Options left unset keep the run's values (a run that keeps every checkpoint goes on doing
        # so); the time budget and the evaluations along the way are each launch's own.
        defaults = PhaseAConfig()
        own = ("max_seconds", "eval_every", "eval_seeds", "resume")
        given = {name: getattr(cfg, name) for name in RESUME_MAY_CHANGE
                 if name not in own and getattr(cfg, name) != getattr(defaults, name)}
        cfg = dataclasses.replace(restored, **given, **{name: getattr(cfg, name) for name in own})
    else:  # the dataset's absolute path, so evaluation finds it from any directory
        cfg = dataclasses.replace(cfg, preset=cfg.preset or "cpu",
                                  dataset=Path(cfg.dataset).resolve() if cfg.dataset is not None else None)
    if cfg.keep_checkpoints is None:  # a new run, or one from before the option
        cfg = dataclasses.replace(cfg, keep_checkpoints=KEEP)
    preset = cfg.resolved
    require_logger(cfg.tracker.logger)
    if state is None:  # config.json records the schedule and augmentation, not just the preset's name
        cfg = dataclasses.replace(cfg, lr=preset.lr, lr_decay=preset.lr_decay, image_shift=preset.image_shift)
    device = pick_device(cfg.device)
    threads_before = torch.get_num_threads()
    if not device.is_accelerator:  # the loader's decoding processes need cores too; oversubscribed torch crawls
        torch.set_num_threads(max(1, cpu_count() - cfg.loader_workers))
    dataset = open_dataset(cfg.dataset, cfg.train_episodes, (preset.height, preset.width), preset.model.chunk,
                           f"the {cfg.preset} preset" if state is None else f"run {run_dir}",
                           None if state is None else run_render_quality(saved))
    if cfg.eval_every:  # refused now, not at the first evaluation
        check_eval_seeds(cfg.eval_seeds, recorded_seeds(Path(cfg.dataset), set(parse_seeds(cfg.train_episodes, "--train-episodes"))))
    torch.manual_seed(cfg.seed)
    if state is not None:
        model_cfg = ARActorConfig(**saved["model"])  # the run's own model, its batch norm included
    else:  # frozen batch norm keeps ImageNet's statistics; from scratch it must learn its own (policies/resnet.py)
        model_cfg = dataclasses.replace(preset.model, backbone_norm="frozen" if cfg.imagenet_weights else "batch")
    model = build_model(model_cfg, dataset, cfg.imagenet_weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=cfg.weight_decay, **OPTIMIZER_OPTIONS)
    step = 0
    if state is not None:
        load_weights(model, state["model"], cfg.resume)
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        saved["phase_a"]["steps"] = preset.steps  # a longer resumed run is now this long
        saved["phase_a"]["keep_checkpoints"] = cfg.keep_checkpoints
        write_text_atomic(run_dir / "config.json", json.dumps(saved, indent=2))
    else:
        run_dir = Path(cfg.runs_dir) / RUN_KIND / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        run_dir.mkdir(parents=True)
        held.enter_context(exclusive_writer(run_dir, "run"))
        config = {"kind": RUN_KIND, "phase": "A", "model": dataclasses.asdict(model_cfg),
                  "image_size": [preset.height, preset.width], "render_quality": recorded_render_quality(dataset.info),
                  "phase_a": {**json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), "steps": preset.steps}}
        write_text_atomic(run_dir / "config.json", json.dumps(config, indent=2))
    record_launch(run_dir, device.torch_device, device.name)
    print(run_dir, flush=True)  # first line: where everything goes
    model.to(device.torch_device).train()
    forward = torch.compile(model) if cfg.compile == "on" or (cfg.compile == "auto" and device.kind == "cuda") else model
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=StepBatches(step, preset.steps, cfg.batch, len(dataset), cfg.seed),
        num_workers=cfg.loader_workers, pin_memory=device.pinned_memory, prefetch_factor=4 if cfg.loader_workers else None,
        persistent_workers=False)
    run = TrainingRun(TrackedRun(cfg.tracker, run_dir, cfg.runs_dir, flat_options(cfg), metrics=("train/loss",)),
                      f"hetlab aloha train --resume {shlex.quote(str(run_dir))}", first_step=step,
                      last_step=preset.steps, checkpoint_every=preset.checkpoint_every, max_seconds=cfg.max_seconds,
                      row_steps=lambda row: row["step"], clock="wall_s")
    first_step = step
    window_start, window_losses = time.perf_counter(), []
    latest: dict[str, float] = {}  # the last step's gradient norm, for the row

    def checkpoint(step: int) -> None:
        run.checkpoint(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                       keep=cfg.keep_checkpoints)

    def update(step: int, batch) -> bool:
        images, state_, actions, is_pad = device_batch(batch, torch.device(device.torch_device))
        torch.manual_seed(dropout_seed(cfg.seed, step))  # a function of the step, so resume is exact
        generator = step_generator(cfg.seed, step)
        mask = random_history_mask(cfg.batch, preset.model.chunk, preset.model.max_history_mask,
                                   generator).to(images.device)
        images = random_shift(images, preset.image_shift, generator)  # after the mask: Phase B draws it alike
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, preset.lr, preset.lr_decay, preset.steps)
        with autocast_for(device, cfg.precision):
            predicted = forward(images, state_, actions, mask)
        loss = chunk_l1(predicted.float(), model.action_expert.normalise(actions), is_pad)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        latest["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
        optimizer.step()
        window_losses.append(loss.item())
        return True

    def after(step: int) -> None:
        nonlocal window_start, window_losses
        evaluates = cfg.eval_every and step % cfg.eval_every == 0
        if not (evaluates or step % preset.log_every == 0 or step == preset.steps):
            return
        row = {"step": step, "loss": float(np.mean(window_losses)), "grad_norm": latest["grad_norm"],
               "lr": optimizer.param_groups[0]["lr"],
               "samples_per_s": len(window_losses) * cfg.batch / (time.perf_counter() - window_start)}
        if evaluates:
            checkpoint(step)  # what the evaluation plays
            row |= success_columns(run_dir, step, cfg.eval_seeds)
        row["wall_s"] = run.run_clock()
        run.log(row, row_scalars(row, leave_out=("step", "wall_s")), step)
        progress.update(job, completed=step, loss=f"loss {row['loss']:.4f}"
                        + (f", success {row['eval/success_rate']:.0%}" if evaluates else ""))
        window_start, window_losses = time.perf_counter(), []  # the next window's rate leaves the evaluation out

    progress = Progress(TextColumn("phase A"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
                        TimeElapsedColumn(), TimeRemainingColumn())
    try:
        with run, progress:
            job = progress.add_task("steps", total=preset.steps, completed=step, loss="")
            step, stopped_by = run.loop(step, loader, update, after, checkpoint, completed="steps",
                                        ended=lambda: "steps")
    finally:
        torch.set_num_threads(threads_before)
    _finish(run, step, first_step, stopped_by, figures)
    return run_dir


# What a resume may set: how long to train, what to keep, where and how fast to run.
RESUME_MAY_CHANGE = ("steps", "max_seconds", "keep_checkpoints", "device", "loader_workers", "compile", "eval_every",
                     "eval_seeds", "resume")


def refuse_changed_options(given: PhaseAConfig, restored: PhaseAConfig, run_dir: Path) -> None:
    """A resumed run continues with its own options; one given that differs from them is refused,
    not ignored (e.g. another preset, whose model the checkpoint does not fit)."""
    changed = changed_option(given, restored, RESUME_MAY_CHANGE)
    if changed is not None:
        flag, asked, own = changed
        raise UserError(f"{flag} {asked}: {run_dir} was trained with {own} and a resumed run keeps its options "
                        "(only --steps, --max-seconds, --keep-checkpoints, --device, --loader-workers, --compile, "
                        "--eval-every and --eval-seeds may change); drop it, or start a new run")


def _finish(run: TrainingRun, step: int, first_step: int, stopped_by: str, figures: bool) -> None:
    """summary.json, history.json and the loss curve, with --eval-every's success (unless HETLAB_FIGURES=0)."""
    history = run.history
    run.finish({"steps": step, "session_steps": step - first_step, "session_wall_s": run.elapsed(),
                "stopped_by": stopped_by, "first_loss": history[0]["loss"] if history else None,
                "last_loss": history[-1]["loss"] if history else None})
    if history and figures:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 3.5))
        axis.plot([r["step"] for r in history], [r["loss"] for r in history])
        axis.set(xlabel="step", ylabel="L1 loss (normalised actions)", yscale="log", title="Phase A")
        axis.grid(alpha=0.3)
        evaluated = [r for r in history if "eval/success_rate" in r]
        if evaluated:  # --eval-every
            success = axis.twinx()
            success.plot([r["step"] for r in evaluated], [r["eval/success_rate"] for r in evaluated], "o-", color="C1")
            success.set(ylabel="closed-loop success (held-out seeds)", ylim=(0, 1))
        figure.tight_layout()
        with atomic_path(run.run_dir / "loss.png") as tmp:
            figure.savefig(tmp, dpi=120, format="png")
        plt.close(figure)
