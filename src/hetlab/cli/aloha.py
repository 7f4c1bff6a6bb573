"""`hetlab aloha …`: the ALOHA cube-transfer world and its AR-Actor policy."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from hetlab.aloha_config import RecordConfig
from hetlab.cli.output import console, err_console, print_json
from hetlab.cli.parsing import Group
from hetlab.errors import UserError
from hetlab.imitation.config import EvalConfig
from hetlab.offload.config import QuantiseConfig
from hetlab.seeds import parse_seeds
from hetlab.train.loggers import TrackerOptions


@dataclass(frozen=True)
class AlohaExpertConfig:
    seeds: str = "0-99"  # episode seeds: A-B (inclusive), N, or a list such as 0-3,7
    workers: int = 1  # episodes run at once, one process each
    json: bool = False  # print the result as JSON


def aloha_expert(cfg: Annotated[AlohaExpertConfig, tyro.conf.arg(name="")] = AlohaExpertConfig()) -> None:
    """Run the scripted IK expert on the ALOHA cube transfer and report how often the left arm ends up holding the cube."""
    from rich.progress import Progress

    from hetlab.aloha.expert import run_expert

    seeds = parse_seeds(cfg.seeds)
    with Progress(console=err_console(), transient=True) as progress:
        result = run_expert(seeds, cfg.workers, progress)
    if cfg.json:
        print_json(result)
        return
    console().print(f"expert: {result['successes']}/{result['episodes']} episodes succeeded "
                    f"({100 * result['success_rate']:.1f} %)", highlight=False)
    if result["failed_seeds"]:
        console().print(f"failed seeds: {' '.join(map(str, result['failed_seeds']))}", highlight=False, soft_wrap=True)


def aloha_record(cfg: Annotated[RecordConfig, tyro.conf.arg(name="")]) -> None:
    """Record the scripted expert's episodes as a LeRobot v3.0 dataset (continues an existing one at --out)."""
    from hetlab.aloha.record import record

    result = record(cfg)
    per_episode = f", {result['seconds_per_episode']:.1f} s each" if result["written"] else ""
    console().print(f"{result['out']}: {result['episodes']} episodes ({result['written']} new in "
                    f"{result['seconds']:.0f} s{per_episode})", highlight=False, soft_wrap=True)
    if result["failed_seeds"]:
        console().print(f"skipped seeds the expert failed on: {' '.join(map(str, result['failed_seeds']))}",
                        highlight=False, soft_wrap=True)
    if result["worker_restarts"]:
        console().print(f"the recording workers stalled and were restarted {result['worker_restarts']} time(s)",
                        highlight=False)


@dataclass(frozen=True)
class AlohaParamsConfig:
    preset: Literal["paper", "cpu", "tiny"] = "paper"  # whose model: paper = the study's 51.5 M, cpu = narrowed
    json: bool = False  # print the result as JSON


def aloha_params(cfg: Annotated[AlohaParamsConfig, tyro.conf.arg(name="")] = AlohaParamsConfig()) -> None:
    """Parameter counts of the AR-Actor split as the study's Table I: backbone, projection, encoder, action expert."""
    from rich.table import Table

    from hetlab.imitation.presets import PRESETS
    from hetlab.policies.ar_actor import ARActor, encoder_grid, parameter_split

    preset = PRESETS[cfg.preset]
    split = parameter_split(ARActor(preset.model))
    if cfg.json:
        print_json(split)
        return
    rows, cols = encoder_grid(preset.height, preset.width)
    table = Table("part", "parameters", "share", title=f"AR-Actor ({cfg.preset} preset: {preset.height}×{preset.width} "
                  f"images → 1 state + {rows}×{cols} image tokens)")
    labels = {"backbone": "ResNet18 backbone", "projection": "image + state projection",
              "encoder": "Transformer encoder layers", "action_expert": "action expert", "total": "total"}
    for key, label in labels.items():
        table.add_row(label, f"{split[key] / 1e6:.2f} M", f"{100 * split[key] / split['total']:.1f} %")
    console().print(table)


# `hetlab aloha train` shows each phase's options in a group of its own; the flags keep their short
# names (--dataset, --from), and a phase refuses the other phase's (PhaseAConfig and PhaseBConfig
# take them from here).


@dataclass(frozen=True, kw_only=True)
class BothPhasesOptions:
    """Options of either phase; unset ones take the chosen phase's default."""

    steps: int | None = None  # optimizer steps; unset: the preset's (A) or 30,000 (B)
    batch: int = 8  # samples per optimizer step
    lr: float | None = None  # learning rate; unset: the preset's (A) or the Phase-A run's (B)
    # last share of the steps with a linearly falling learning rate; unset: the preset's (A) or the Phase-A run's (B)
    lr_decay: float | None = None
    weight_decay: float = 1e-4  # AdamW weight decay
    grad_clip: float = 10.0  # gradient-norm clipping
    train_episodes: str = "0-39"  # episodes trained on; 40–49 stay held out for fidelity
    seed: int | None = None  # training seed; unset: 0 (A) or 2000 (B)
    device: str = "auto"  # learner device
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # learner autocast; auto = bf16 on capable GPUs
    max_seconds: float = 0.0  # stop with a checkpoint after this long; 0 = no limit
    # every N steps, the checkpoint's closed-loop success on --eval-seeds in the run's rows (and in Phase B's
    # time and energy); 0 = never
    eval_every: int = 0
    eval_seeds: str = "2000-2009"  # environment seeds of those evaluations, held out from training
    runs_dir: Path = Path("runs")  # run directories are made under RUNS_DIR/aloha-ar-actor/
    resume: Path | None = None  # a run of the chosen phase to continue


@dataclass(frozen=True, kw_only=True)
class PhaseAOptions:
    """--phase A (the default): the whole policy, trained on a recorded dataset."""

    dataset: Path | None = None  # LeRobot v3 cube-transfer dataset (`hetlab aloha record`)
    # paper: 480×640, 200k steps (GPU); cpu: 120×160, ≤ 2 h on 2 cores; unset: cpu, or a resumed run's own
    preset: Literal["paper", "cpu", "tiny"] | None = None
    imagenet_weights: Path | None = None  # torchvision resnet18 weights for the backbone; unset: initialised at random
    image_shift: int | None = None  # augmentation: images moved by up to ± this many pixels; unset: the preset's
    loader_workers: int = 0  # processes decoding video; 0 = in the training process (~1 ms a frame)
    # newest checkpoints kept; 0 = every one (to evaluate along the way); unset: 2, or a resumed run's own
    keep_checkpoints: int | None = None
    compile: Literal["auto", "on", "off"] = "auto"  # torch.compile; auto = on CUDA


@dataclass(frozen=True, kw_only=True)
class PhaseBOptions:
    """--phase B: a new action expert on the frozen encoder of a Phase-A run (the --quantise.* options too)."""

    from_run: Annotated[Path | None, tyro.conf.arg(name="from")] = None  # the Phase-A run to freeze
    condition: str = "learner"  # learner | L1..L4 (encoder offloaded up to layer k) | cache
    offload_device: str = "cpu"  # cpu, cuda, openvino, ort:<ExecutionProvider> (see `hetlab offload devices`)
    # precision of the offloaded prefix: int8 (A8W8) or fp32 (a reference)
    offload_precision: Literal["int8", "fp32"] = "int8"
    calibration_episodes: str = "0-7"  # episodes whose frames calibrate the INT8 prefix
    prefetch: int = 2  # batches prepared ahead by the background thread
    # how the cache condition stores features: fp16 or int8 (per-token scales)
    cache_dtype: Literal["fp16", "int8"] = "fp16"
    power_interval: float = 1.0  # seconds between power samples
    power_command: str | None = None  # prints an extra device's power (e.g. an NPU vendor tool)
    power_pattern: str = r"([0-9.]+)\s*W"  # regex; its first group is the watts
    power_device: str = "offload device"  # the name --power-command's readings appear under
    out: Path | None = None  # run directory; unset: RUNS_DIR/aloha-ar-actor/<timestamp>-B-<condition>-s<seed>


@dataclass(frozen=True, kw_only=True)
class AlohaTrainConfig:
    phase: Literal["A", "B"] = "A"  # A: the whole policy; B: a new action expert on the frozen encoder
    both: Annotated[BothPhasesOptions, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="Phase A and B")] = \
        BothPhasesOptions()
    phase_a: Annotated[PhaseAOptions, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="Phase A")] = PhaseAOptions()
    phase_b: Annotated[PhaseBOptions, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="Phase B")] = PhaseBOptions()
    quantise: QuantiseConfig = QuantiseConfig()  # Phase B: how the offloaded prefix is quantised to INT8
    tracker: Annotated[TrackerOptions, tyro.conf.OmitArgPrefixes, tyro.conf.arg(name="tracker")] = TrackerOptions()

    def phase_options(self, phase: str) -> dict:
        """{name: value} of the options only Phase `phase` has."""
        if phase == "A":
            return _fields(self.phase_a)
        return {**_fields(self.phase_b), "quantise": self.quantise}

    def phase_config(self, cls):
        """The options as `cls` (PhaseAConfig or PhaseBConfig, of --phase), its defaults for the unset
        ones; UserError for an option given that only the other phase has."""
        other = "B" if self.phase == "A" else "A"
        defaults = AlohaTrainConfig().phase_options(other)
        for name, value in self.phase_options(other).items():
            if value != defaults[name]:
                flag = {"from_run": "--from", "quantise": "--quantise.*"}.get(name, f"--{name.replace('_', '-')}")
                raise UserError(f"{flag} is an option of Phase {other}; drop it or train --phase {other}")
        options = {**_fields(self.both), "tracker": self.tracker, **self.phase_options(self.phase)}
        return cls(**{name: value for name, value in options.items() if value is not None})


def _fields(options) -> dict:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


def _loss_line(run_dir: Path, steps: int, first_loss: float | None, last_loss: float | None) -> str:
    loss = f"loss {first_loss:.4f} → {last_loss:.4f}" if first_loss is not None else "no loss logged yet"
    return f"{run_dir}: step {steps}, {loss}"


def aloha_train(cfg: Annotated[AlohaTrainConfig, tyro.conf.arg(name="")]) -> None:
    """Train the AR-Actor: --phase A (whole policy on a dataset) or --phase B (new action expert on a frozen Phase-A encoder)."""
    if cfg.phase == "A":
        from hetlab.imitation.phase_a import train_phase_a
        from hetlab.imitation.presets import PhaseAConfig
        from hetlab.run_history import read_history

        run_dir = train_phase_a(cfg.phase_config(PhaseAConfig))
        history = read_history(run_dir)
        first, last = (history[0], history[-1]) if history else ({"loss": None}, {"step": 0, "loss": None})
        console().print(_loss_line(run_dir, last["step"], first["loss"], last["loss"]), highlight=False, soft_wrap=True)
        return
    from rich.progress import Progress

    from hetlab.imitation.phase_b import PhaseBConfig, train_phase_b

    with Progress(console=err_console()) as progress:
        run_dir = train_phase_b(cfg.phase_config(PhaseBConfig), progress)
    summary = json.loads((run_dir / "summary.json").read_text())
    console().print(f"{_loss_line(run_dir, summary['steps'], summary['first_loss'], summary['last_loss'])}, "
                    f"{summary['samples_per_s']:.1f} samples/s", highlight=False, soft_wrap=True)


def aloha_eval(cfg: Annotated[EvalConfig, tyro.conf.arg(name="")]) -> None:
    """Closed-loop success rate of a trained policy over environment seeds (Wilson 95 % interval)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from hetlab.imitation.evaluate import evaluate

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TimeRemainingColumn(), console=err_console())
    with progress:
        report = evaluate(cfg, progress)
    low, high = report["wilson95"]
    seeds = {True: "held-out seeds", False: "seeds of training episodes", None: "seeds (held out: unknown, the "
             "dataset is missing or does not record its seeds)"}[report["held_out"]]
    console().print(f"success {report['successes']}/{report['episodes']} = {100 * report['success_rate']:.1f} % on "
                    f"{seeds}, step {report['step']} "
                    f"(Wilson 95 %: {100 * low:.1f}–{100 * high:.1f} %) in {report['wall_s']:.0f} s with "
                    f"{report['workers']} workers → {report['out']}/results.json", highlight=False, soft_wrap=True)


aloha = Group("The ALOHA cube-transfer world and its AR-Actor policy: expert, record, params, train, eval.",
              {"expert": aloha_expert, "record": aloha_record, "params": aloha_params, "train": aloha_train,
               "eval": aloha_eval})
