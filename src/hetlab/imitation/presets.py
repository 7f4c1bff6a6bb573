"""Phase A's presets (image size, steps, learning rate, model, checkpoint cadence) and its options.

A preset is a whole training setting sized for a machine; every option left unset takes the
preset's value, and a run records the values it trained with in its config.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hetlab.errors import UserError
from hetlab.imitation.schedule import check_schedule
from hetlab.policies.ar_actor import ARActorConfig
from hetlab.train.loggers import TrackerOptions


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
                                                    backbone_width=8, chunk=10, dropout=0.0), 20, 10),
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
    # every N steps, the checkpoint's closed-loop success on --eval-seeds in the run's rows; 0 = never
    eval_every: int = 0
    eval_seeds: str = "2000-2009"  # environment seeds of those evaluations, held out from training
    # newest checkpoints kept; 0 = every one (to evaluate along the way); unset: 2, or a resumed run's own
    keep_checkpoints: int | None = None
    tracker: TrackerOptions = TrackerOptions()  # wandb or mlflow beside TensorBoard (--logger, --run-name, ...)
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
        if self.eval_every < 0:
            raise UserError(f"--eval-every must be ≥ 0 (0 = never), got {self.eval_every}")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 0:
            raise UserError(f"--keep-checkpoints must be ≥ 0 (0 keeps every one), got {self.keep_checkpoints}")
        check_schedule(self.lr, self.lr_decay)
        if self.image_shift is not None and self.image_shift < 0:
            raise UserError(f"--image-shift must be ≥ 0 pixels (0 = no augmentation), got {self.image_shift}")
        preset = PRESETS[self.preset or "cpu"]
        given = {name: getattr(self, name) for name in ("steps", "lr", "lr_decay", "image_shift")}
        return dataclasses.replace(preset, **{name: value for name, value in given.items() if value is not None})
