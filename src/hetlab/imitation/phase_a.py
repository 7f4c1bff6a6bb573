"""Phase A: train the whole AR-Actor on the ALOHA cube-transfer demonstrations.

One step: a batch of 8 frames (image, state, the next `chunk` actions), the chunk predicted
with teacher forcing and a random history mask, L1 on the steps inside the episode, AdamW,
gradient clipping. Everything random is a function of (seed, step) — the batch order, the
history mask, dropout — so a resumed run continues exactly where the uninterrupted one would
have been, and Phase B can give every condition the same data order and masks.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from hetlab.aloha.record import CAMERA_KEY, recorded_render_quality
from hetlab.checkpoint import KEEP, load_checkpoint, save_checkpoint
from hetlab.datasets.lerobot import ACTION, STATE, LeRobotDataset
from hetlab.devices import LearnerDevice, cpu_count, pick_device
from hetlab.devices import OPTIMIZER_OPTIONS
from hetlab.dir_lock import exclusive_writer
from hetlab.errors import UserError
from hetlab.figures import figures_wanted
from hetlab.files import atomic_path, write_text_atomic
from hetlab.policies.ar_actor import ARActor, ARActorConfig, chunk_l1, random_history_mask
from hetlab.policies.resnet import load_imagenet
from hetlab.run_config import AR_ACTOR_KIND as RUN_KIND, read_config_json
from hetlab.run_history import read_history, write_history
from hetlab.run_meta import record_launch
from hetlab.seeds import parse_seeds
from hetlab.stop_signals import resume_with, stop_guard


@dataclass(frozen=True)
class Preset:
    height: int
    width: int
    steps: int
    lr: float
    model: ARActorConfig
    checkpoint_every: int
    log_every: int
    image_shift: int = 0  # augmentation: each training image moved by up to ± this many pixels
    lr_decay: float = 0.0  # the last share of the steps over which the learning rate falls linearly to 0


PRESETS = {
    # The study's setting: full-size images, 200k steps of batch 8 at lr 1e-5 (a GPU job).
    "paper": Preset(480, 640, 200_000, 1e-5, ARActorConfig(), 5000, 100),
    # ≤ 2 h on a 2-core CPU (6,000 steps: ~35 min on an AMD EPYC, ~80 min on a 2.6 GHz Xeon):
    # 120×160 images (4×5 image tokens) and a transformer narrowed to d_model 256 (the
    # full-width one costs 3× more a step, almost all of it in the action expert); a 10× learning
    # rate. The backbone stays the full ResNet18, trained from scratch on 40 episodes; the
    # decaying learning rate settles the weights that closed-loop success swings with. Up to
    # every history input is masked: with at most half, the expert learnt to copy the true
    # previous action (teacher-forced L1 0.05–0.09), drifted on its own (free-running 0.32–1.25)
    # and reached 36 % held-out success at best; masking up to all of it gave 58 % at step 2,000.
    # No image shift: with ±6 px shifts the preset reached 4–12 %, without them 20–36 %.
    "cpu": Preset(120, 160, 6_000, 1e-4, ARActorConfig(d_model=256, feedforward=1024, expert_feedforward=1024,
                                                       max_history_mask=1.0),
                  2000, 10, lr_decay=0.25),
    # Seconds, for tests and smoke checks: a narrow model on 64×96 images.
    "tiny": Preset(64, 96, 200, 1e-3, ARActorConfig(d_model=32, heads=2, feedforward=64, expert_feedforward=64,
                                                    backbone_width=8, chunk=10, dropout=0.0), 100, 10),
}


@dataclass(frozen=True, kw_only=True)
class PhaseAConfig:
    dataset: Path | None = None  # LeRobot v3 dataset of the cube transfer (`hetlab aloha record`)
    preset: Literal["paper", "cpu", "tiny"] | None = None  # None: cpu for a new run, a resumed run's own
    steps: int | None = None  # optimizer steps; default: the preset's
    batch: int = 8
    lr: float | None = None  # default: the preset's
    lr_decay: float | None = None  # last share of the steps with a linearly falling learning rate; default: the preset's
    image_shift: int | None = None  # training images moved by up to ± this many pixels; default: the preset's
    weight_decay: float = 1e-4
    grad_clip: float = 10.0
    train_episodes: str = "0-39"  # 40–49 stay held out (Phase B measures fidelity on them)
    seed: int = 0
    loader_workers: int = 0  # processes decoding video; 0 = in the training process (~1 ms a frame)
    device: str = "auto"
    imagenet_weights: Path | None = None  # torchvision resnet18 weights (.pth/.safetensors) for the backbone
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on GPUs that have it
    compile: Literal["auto", "on", "off"] = "auto"  # auto: torch.compile on CUDA
    max_seconds: float = 0.0  # stop (with a checkpoint) after this long; 0 = no limit
    # newest checkpoints kept; 0 = every one (to evaluate along the way); unset: 2, or a resumed run's own
    keep_checkpoints: int | None = None
    runs_dir: Path = Path("runs")
    resume: Path | None = None  # a Phase-A run directory to continue

    @property
    def resolved(self) -> Preset:
        """The preset with the steps and learning rate given; UserError for ones it cannot train with."""
        if self.steps is not None and self.steps < 1:
            raise UserError(f"--steps must be ≥ 1, got {self.steps}")
        if self.seed < 0:  # numpy's seed sequences take non-negative integers only
            raise UserError(f"--seed must be ≥ 0, got {self.seed}")
        if self.max_seconds < 0:
            raise UserError(f"--max-seconds must be ≥ 0 (0 = no limit), got {self.max_seconds}")
        if self.batch < 1:
            raise UserError(f"--batch must be ≥ 1, got {self.batch}")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 0:
            raise UserError(f"--keep-checkpoints must be ≥ 0 (0 keeps every one), got {self.keep_checkpoints}")
        check_schedule(self.lr, self.lr_decay)
        if self.image_shift is not None and self.image_shift < 0:
            raise UserError(f"--image-shift must be ≥ 0 pixels (0 = no augmentation), got {self.image_shift}")
        preset = PRESETS[self.preset or "cpu"]
        given = {name: getattr(self, name) for name in ("steps", "lr", "lr_decay", "image_shift")}
        return dataclasses.replace(preset, **{name: value for name, value in given.items() if value is not None})


def check_schedule(lr: float | None, lr_decay: float | None) -> None:
    """UserError for a learning rate or decay share that cannot train (None: unset)."""
    if lr is not None and not lr > 0:
        raise UserError(f"--lr must be > 0, got {lr}")
    if lr_decay is not None and not 0 <= lr_decay <= 1:
        raise UserError(f"--lr-decay is a share of the steps, from 0 to 1; got {lr_decay}")


def learning_rate(step: int, lr: float, lr_decay: float, steps: int) -> float:
    """The rate of optimizer step `step` of `steps`: `lr`, then falling linearly to 0 over the last
    `lr_decay` share of the steps (a function of the step, so a resumed run follows it exactly)."""
    decay_steps = lr_decay * steps
    return lr if decay_steps <= 0 else lr * min(1.0, (steps - step) / decay_steps)


def random_shift(images: torch.Tensor, pixels: int, generator: torch.Generator) -> torch.Tensor:
    """Each image of (N, C, H, W) moved by up to ±`pixels` in each direction, its edge rows and
    columns repeated into the gap; the offsets are drawn on the CPU from `generator`."""
    if pixels == 0:
        return images
    height, width = images.shape[-2:]
    padded = torch.nn.functional.pad(images, (pixels,) * 4, mode="replicate")
    offsets = torch.randint(0, 2 * pixels + 1, (len(images), 2), generator=generator).tolist()
    return torch.stack([image[:, y:y + height, x:x + width] for image, (y, x) in zip(padded, offsets)])


def batch_indices(step: int, batch: int, frames: int, seed: int) -> np.ndarray:
    """Frames of batch `step`: consecutive slices of one seeded permutation per epoch."""
    positions = step * batch + np.arange(batch)
    epochs, offsets = np.divmod(positions, frames)
    return np.array([np.random.default_rng([seed, int(e)]).permutation(frames)[o] for e, o in zip(epochs, offsets)])


class StepBatches(torch.utils.data.Sampler):
    """Batch index lists for steps start..stop−1 (a DataLoader batch_sampler)."""

    def __init__(self, start: int, stop: int, batch: int, frames: int, seed: int):
        self.start, self.stop, self.batch, self.frames, self.seed = start, stop, batch, frames, seed

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[list[int]]:
        for step in range(self.start, self.stop):
            yield batch_indices(step, self.batch, self.frames, self.seed).tolist()


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of one step's history mask."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def dropout_seed(seed: int, step: int) -> int:
    """The global torch seed of one step (dropout), apart from the history mask's stream."""
    return seed * 1_000_003 + step + 500_000


def open_dataset(path: Path | None, episodes: str, image_size: tuple[int, int], chunk: int,
                 expected_by: str, render_quality: str | None = None) -> LeRobotDataset:
    """The training frames, after checking the dataset has what the policy reads, recorded at the
    size (and render quality, when given) that `expected_by` (e.g. "the cpu preset") renders at."""
    if path is None:
        raise UserError("--dataset is required: a LeRobot v3 cube-transfer dataset (make one with `hetlab aloha record`)")
    dataset = LeRobotDataset(path, parse_seeds(episodes, "--train-episodes"), action_horizon=chunk,
                             image_size=image_size)
    check_recording(dataset.info, path, image_size, render_quality, expected_by)
    features = dataset.info["features"]
    for key, shape in ((STATE, [14]), (ACTION, [14])):
        if key not in features or list(features[key]["shape"]) != shape:
            raise UserError(f"{path}: the AR-Actor needs a {key} feature of shape {shape}; "
                            f"this dataset has {features.get(key, {}).get('shape', 'none')}")
    if CAMERA_KEY not in dataset.video_keys:
        raise UserError(f"{path}: the AR-Actor reads the {CAMERA_KEY} camera; this dataset has "
                        f"{', '.join(dataset.video_keys) or 'no cameras'}")
    return dataset


def check_recording(info: dict, path: Path, image_size: tuple[int, int], render_quality: str | None,
                    expected_by: str) -> None:
    """UserError unless the dataset's camera was recorded at `image_size` and `render_quality`:
    evaluation renders the run's size and quality, so frames made otherwise would not transfer."""
    camera = info["features"].get(CAMERA_KEY)
    if camera is None:
        return  # open_dataset names the missing camera
    recorded = (tuple(camera["shape"][:2]), recorded_render_quality(info))
    wanted = (tuple(image_size), render_quality or recorded[1])
    if recorded != wanted:
        (h, w), quality = wanted
        raise UserError(f"{path} was recorded at {recorded[0][0]}×{recorded[0][1]} with render quality {recorded[1]}; "
                        f"{expected_by} expects {h}×{w} at {quality} (record one with `hetlab aloha record "
                        f"--height {h} --width {w} --render-quality {quality}`)")


def run_render_quality(config: dict) -> str:
    """The render quality a Phase-A or Phase-B run's images were made at ("high" before the setting)."""
    return config.get("render_quality", "high")


def device_batch(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(images in [0, 1], state, actions, is_pad) on the learner device."""
    images = batch[CAMERA_KEY].to(device, non_blocking=True).float().div_(255)
    return (images, batch[STATE].to(device, non_blocking=True), batch[ACTION].to(device, non_blocking=True),
            batch["action_is_pad"].to(device, non_blocking=True))


def autocast(device: LearnerDevice, precision: str):
    bf16 = precision == "bf16" or (precision == "auto" and device.is_accelerator and device.bf16)
    return torch.autocast(device.torch_device.split(":")[0], dtype=torch.bfloat16, enabled=bf16)


def build_model(model_cfg: ARActorConfig, dataset: LeRobotDataset, imagenet_weights: Path | None) -> ARActor:
    model = ARActor(model_cfg)
    stats = dataset.stats
    model.set_normalisation(stats[STATE]["mean"], stats[STATE]["std"], stats[ACTION]["mean"], stats[ACTION]["std"])
    if imagenet_weights is not None:
        load_imagenet(model.visual.backbone, imagenet_weights)
    return model


def read_run_config(run_dir: Path) -> dict:
    """config.json of a Phase-A or Phase-B run, without loading its weights."""
    config = read_config_json(run_dir, f"runs/{RUN_KIND}/<timestamp>")
    if config.get("kind") != RUN_KIND:
        kind = f"kind {config['kind']!r}" if "kind" in config else "a run of `hetlab train`"
        raise UserError(f"{run_dir}: not an AR-Actor run ({kind}); pass runs/{RUN_KIND}/<timestamp>")
    return config


def read_phase_a_config(run_dir: Path, needs: str) -> dict:
    """config.json of a Phase-A run; a Phase-B run is refused, naming the Phase-A run it came from.
    `needs` says why, e.g. "--resume continues a Phase-A run"."""
    config = read_run_config(run_dir)
    phase = config.get("phase")
    if phase == "B":
        phase_b = config.get("phase_b")
        source = phase_b.get("from_run") if isinstance(phase_b, dict) else None
        raise UserError(f"{run_dir} is a Phase-B run (a new action expert on a frozen Phase-A encoder); {needs}: "
                        f"pass {source or 'the Phase-A run'}, the one it came from")
    if phase != "A":
        raise UserError(f"{run_dir}: config.json names phase {phase!r}, not A; {needs}")
    return config


def load_run(run_dir: Path, step: int | None = None) -> tuple[dict, dict]:
    """(config.json, newest checkpoint or the one of `step`) of a Phase-A or Phase-B run."""
    return read_run_config(run_dir), load_checkpoint(Path(run_dir), step)


def load_policy(run_dir: Path, step: int | None = None) -> tuple[ARActor, dict]:
    """A Phase-A run's trained AR-Actor (eval mode, CPU) at its newest checkpoint or `step`, and its config."""
    config = read_phase_a_config(run_dir, "this reads a Phase-A run's whole model")
    state = load_checkpoint(Path(run_dir), step)
    model = ARActor(ARActorConfig(**config["model"]))
    load_weights(model, state["model"], run_dir)
    return model.eval(), config


def load_weights(model: torch.nn.Module, weights: dict, source: Path) -> None:
    """load_state_dict with a one-line error naming the first mismatch (e.g. another model size)."""
    own = model.state_dict()
    for key, value in own.items():
        if key not in weights or weights[key].shape != value.shape:
            found = tuple(weights[key].shape) if key in weights else "missing"
            raise UserError(f"{source}: checkpoint does not fit this model: {key} is {found}, "
                            f"the model has {tuple(value.shape)} (trained with another model size?)")
    model.load_state_dict(weights)


def train_phase_a(cfg: PhaseAConfig) -> Path:
    """Run (or resume) Phase A; returns the run directory."""
    with ExitStack() as held:
        return _train_phase_a(cfg, held)


def _train_phase_a(cfg: PhaseAConfig, held: ExitStack) -> Path:
    """`train_phase_a` holding, in `held`, the lock of the run directory it writes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from torch.utils.tensorboard import SummaryWriter  # slow to import; only training needs it

    state, figures = None, figures_wanted()
    if cfg.resume is not None:
        run_dir = Path(cfg.resume)
        saved = read_phase_a_config(run_dir, "--resume continues a Phase-A run")
        held.enter_context(exclusive_writer(run_dir, "run"))
        state = load_checkpoint(run_dir)
        restored = config_from_json(saved, run_dir)
        refuse_changed_options(cfg, restored, run_dir)
        # Options left unset keep the run's values (a run that keeps every checkpoint goes on doing
        # so); the time budget is each launch's own.
        defaults = PhaseAConfig()
        given = {name: getattr(cfg, name) for name in RESUME_MAY_CHANGE
                 if name not in ("max_seconds", "resume") and getattr(cfg, name) != getattr(defaults, name)}
        cfg = dataclasses.replace(restored, **given, max_seconds=cfg.max_seconds, resume=cfg.resume)
    else:  # the dataset's absolute path, so evaluation finds it from any directory
        cfg = dataclasses.replace(cfg, preset=cfg.preset or "cpu",
                                  dataset=Path(cfg.dataset).resolve() if cfg.dataset is not None else None)
    if cfg.keep_checkpoints is None:  # a new run, or one from before the option
        cfg = dataclasses.replace(cfg, keep_checkpoints=KEEP)
    preset = cfg.resolved
    if state is None:  # config.json records the schedule and augmentation, not just the preset's name
        cfg = dataclasses.replace(cfg, lr=preset.lr, lr_decay=preset.lr_decay, image_shift=preset.image_shift)
    device = pick_device(cfg.device)
    threads_before = torch.get_num_threads()
    if not device.is_accelerator:  # the loader's decoding processes need cores too; oversubscribed torch crawls
        torch.set_num_threads(max(1, cpu_count() - cfg.loader_workers))
    dataset = open_dataset(cfg.dataset, cfg.train_episodes, (preset.height, preset.width), preset.model.chunk,
                           f"the {cfg.preset} preset" if state is None else f"run {run_dir}",
                           None if state is None else run_render_quality(saved))
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
    # Rows logged after the checkpoint are logged again.
    history = [row for row in read_history(run_dir) if row["step"] <= step] if state is not None else []
    writer = SummaryWriter(str(run_dir / "tensorboard"))
    start, window_start, window_losses = time.perf_counter(), time.perf_counter(), []
    first_step = step
    stopped_by = "steps"

    def checkpoint() -> None:
        write_history(run_dir, history)  # first: a kill between the two leaves rows a resume drops, none lost
        save_checkpoint(run_dir, step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                        keep=cfg.keep_checkpoints)
        resume_with(f"hetlab aloha train --resume {shlex.quote(str(run_dir))}")

    progress = Progress(TextColumn("phase A"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
                        TimeElapsedColumn(), TimeRemainingColumn())
    try:
        with stop_guard() as interrupted, progress:
            job = progress.add_task("steps", total=preset.steps, completed=step, loss="")
            for batch in loader:
                images, state_, actions, is_pad = device_batch(batch, torch.device(device.torch_device))
                torch.manual_seed(dropout_seed(cfg.seed, step))  # a function of the step, so resume is exact
                generator = step_generator(cfg.seed, step)
                mask = random_history_mask(cfg.batch, preset.model.chunk, preset.model.max_history_mask,
                                           generator).to(images.device)
                images = random_shift(images, preset.image_shift, generator)  # after the mask: Phase B draws it alike
                for group in optimizer.param_groups:
                    group["lr"] = learning_rate(step, preset.lr, preset.lr_decay, preset.steps)
                with autocast(device, cfg.precision):
                    predicted = forward(images, state_, actions, mask)
                loss = chunk_l1(predicted.float(), model.action_expert.normalise(actions), is_pad)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                step += 1
                window_losses.append(loss.item())
                if step % preset.log_every == 0 or step == preset.steps:
                    now = time.perf_counter()
                    row = {"step": step, "loss": float(np.mean(window_losses)), "grad_norm": float(grad_norm),
                           "lr": optimizer.param_groups[0]["lr"],
                           "samples_per_s": len(window_losses) * cfg.batch / (now - window_start),
                           "wall_s": now - start}
                    history.append(row)
                    for key in ("loss", "grad_norm", "lr", "samples_per_s"):
                        writer.add_scalar(f"train/{key}", row[key], step)
                    progress.update(job, completed=step, loss=f"loss {row['loss']:.4f}")
                    window_start, window_losses = now, []
                if step % preset.checkpoint_every == 0 or step == preset.steps:
                    checkpoint()
                if interrupted.is_set() or (cfg.max_seconds and time.perf_counter() - start >= cfg.max_seconds):
                    stopped_by = "interrupted" if interrupted.is_set() else "max_seconds"
                    break
    finally:
        writer.close()
        torch.set_num_threads(threads_before)
    if step % preset.checkpoint_every and step != preset.steps:
        checkpoint()
    _finish(run_dir, history, step, first_step, time.perf_counter() - start, stopped_by, figures)
    return run_dir


# What a resume may set: how long to train, what to keep, where and how fast to run.
RESUME_MAY_CHANGE = ("steps", "max_seconds", "keep_checkpoints", "device", "loader_workers", "compile", "resume")


def refuse_changed_options(given: PhaseAConfig, restored: PhaseAConfig, run_dir: Path) -> None:
    """A resumed run continues with its own options; one given that differs from them is refused,
    not ignored (e.g. another preset, whose model the checkpoint does not fit)."""
    defaults = PhaseAConfig()
    for option in dataclasses.fields(PhaseAConfig):
        name = option.name
        value = getattr(given, name)
        if name not in RESUME_MAY_CHANGE and value != getattr(defaults, name) and value != getattr(restored, name):
            raise UserError(f"--{name.replace('_', '-')} {value}: {run_dir} was trained with "
                            f"{getattr(restored, name)} and a resumed run keeps its options (only --steps, "
                            "--max-seconds, --keep-checkpoints, --device, --loader-workers and --compile may change); "
                            "drop it, or start a new run")


def config_from_json(config: dict, run_dir: Path) -> PhaseAConfig:
    """The options a Phase-A run's config.json records."""
    paths = {"dataset", "imagenet_weights", "runs_dir", "resume"}
    before_options = {"lr_decay": 0.0, "image_shift": 0}  # how runs from before these options trained
    try:
        options = before_options | config["phase_a"]
        return PhaseAConfig(**{k: Path(v) if k in paths and v is not None else v for k, v in options.items()})
    except (KeyError, TypeError, AttributeError) as e:  # an edited file, or one another hetlab version wrote
        raise UserError(f"{run_dir / 'config.json'} does not hold the Phase-A options this hetlab reads ({e!r}); "
                        "restore it from a copy of the run, or start a new run") from e


def _finish(run_dir: Path, history: list[dict], step: int, first_step: int, wall: float, stopped_by: str,
            figures: bool) -> None:
    """history.json, summary.json and the loss curve (unless HETLAB_FIGURES=0)."""
    write_history(run_dir, history)
    summary = {"steps": step, "session_steps": step - first_step, "session_wall_s": wall, "stopped_by": stopped_by,
               "first_loss": history[0]["loss"] if history else None, "last_loss": history[-1]["loss"] if history else None}
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    if history and figures:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 3.5))
        axis.plot([r["step"] for r in history], [r["loss"] for r in history])
        axis.set(xlabel="step", ylabel="L1 loss (normalised actions)", yscale="log", title="Phase A")
        axis.grid(alpha=0.3)
        figure.tight_layout()
        with atomic_path(run_dir / "loss.png") as tmp:
            figure.savefig(tmp, dpi=120, format="png")
        plt.close(figure)
