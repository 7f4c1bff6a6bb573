"""Phase B: a new action expert trained on the frozen Phase-A visual encoder, under one condition.

Conditions:
  learner   the whole frozen encoder runs FP32 on the learner device, inside the learner's step;
  L1..L4    the encoder's prefix up to boundary k runs on the offload device (A8W8 INT8 through
            ONNX Runtime by default) in a background thread, one batch ahead; the learner
            receives x0..xk, runs the remaining encoder layers and rebuilds every layer's K/V;
  cache     the encoder's outputs for every training frame are computed once (FP32 on the
            learner, stored FP16/INT8, see feature_cache.py); the learner reads tokens.
Within a training seed every condition starts from the same action-expert weights and sees the
same batches, history masks and dropout (all functions of (seed, step), as in Phase A), so the
conditions differ only in where and at which precision the encoder ran.

Measured: the per-stage time breakdown (producer: load, inference; learner: wait_data,
transfer, encode, update), power per device with energy per sample, the learner's peak memory.

A run resumes exactly (`resume`): the checkpoint holds the expert and its optimizer, and the
batches, masks and dropout of a step depend only on (seed, step). Its time, power and memory
figures then describe the resumed launch. Ctrl-C, SIGTERM or SIGHUP stop `aloha train --phase B`
after the step under way, with a checkpoint (hetlab.stop_signals).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from hetlab.imitation.config import CACHE_DTYPES
from hetlab.imitation.data import batch_indices, dropout_seed, open_dataset, step_generator
from hetlab.imitation.run_files import (RUN_KIND, ARActorRun, changed_option, load_run, load_weights, read_run,
                                        tracker_from_json)
from hetlab.imitation.schedule import check_schedule, learning_rate
from hetlab.aloha.record import CAMERA_KEY
from hetlab.checkpoint import load_checkpoint
from hetlab.datasets.lerobot import ACTION, STATE
from hetlab.devices import OPTIMIZER_OPTIONS, autocast_for, cpu_count, pick_device
from hetlab.errors import UserError
from hetlab.figures import figures_wanted
from hetlab.files import write_text_atomic
from hetlab.measure.memory import peak_memory, reset_peak_memory
from hetlab.measure.power import CommandMeter, PowerSampler, available_meters, energy_per_sample
from hetlab.offload.backends import make_backend
from hetlab.offload.feature_cache import FeatureCache, build_feature_cache
from hetlab.offload.fidelity import (CALIBRATION_EPISODES, CALIBRATION_FRAMES, HELDOUT_EPISODES, check_held_out,
                                     evenly_spaced_frames)
from hetlab.offload.prefetch import Prefetcher
from hetlab.offload.quantise import QuantiseConfig
from hetlab.run_meta import record_launch
from hetlab.policies.ar_actor import ActionExpert, ARActor, ARActorConfig, chunk_l1, random_history_mask
from hetlab.measure.timeline import SpanRecorder, Timeline
from hetlab.seeds import parse_seeds
from hetlab.train.loggers import TrackedRun, TrackerOptions, flat_options, require_logger
from hetlab.train.run_layer import TrainingRun, row_scalars

DEFAULT_STEPS = 30_000
# What a resumed run takes from the command line: its length and how it is run and measured.
# Everything else is the run's own; a command line that asks for another value is refused.
RESUMABLE_OPTIONS = ("steps", "max_seconds", "device", "checkpoint_every", "prefetch", "power_interval",
                     "power_command", "power_pattern", "power_device", "eval_every", "eval_seeds", "resume")


@dataclass(frozen=True, kw_only=True)
class PhaseBConfig:
    from_run: Path | None = None  # the Phase-A run whose visual encoder is frozen (a resumed run names its own)
    condition: str = "learner"  # learner | L1..L4 | cache
    seed: int = 2000  # training seed: action-expert init, data order, masks, dropout
    steps: int | None = None  # default DEFAULT_STEPS; a resumed run keeps its own unless given
    batch: int = 8
    lr: float | None = None  # default: the Phase-A run's (the new expert trains as the first did)
    lr_decay: float | None = None  # last share of the steps with a linearly falling rate; default: the Phase-A run's
    weight_decay: float = 1e-4
    grad_clip: float = 10.0
    train_episodes: str = "0-39"
    device: str = "auto"  # learner device
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # learner autocast; auto = bf16 on capable GPUs
    offload_device: str = "cpu"  # where L1..L4 run: cpu, cuda, openvino, ort:<ExecutionProvider>, torch
    offload_precision: str = "int8"  # of the offloaded prefix: int8 (A8W8 QDQ) or fp32
    quantise: QuantiseConfig = field(default_factory=QuantiseConfig)
    calibration_episodes: str = f"{CALIBRATION_EPISODES.start}-{CALIBRATION_EPISODES.stop - 1}"
    prefetch: int = 2  # batches the producer thread may prepare ahead
    cache_dtype: str = "fp16"  # feature cache storage: fp16 or int8
    power_interval: float = 1.0  # seconds between power samples
    power_command: str | None = None  # a command printing a device's power (e.g. an NPU's status tool)
    power_pattern: str = r"([0-9.]+)\s*W"  # regex whose first group is the watts in its output
    power_device: str = "offload device"  # the name that device gets in the report
    checkpoint_every: int = 1000
    max_seconds: float = 0.0
    # every N steps, the checkpoint's closed-loop success on --eval-seeds in the run's rows; 0 = never
    eval_every: int = 0
    eval_seeds: str = "2000-2009"  # environment seeds of those evaluations, held out from training
    out: Path | None = None  # run directory; default runs/aloha-ar-actor/<timestamp>-B-<condition>-s<seed>
    tracker: TrackerOptions = TrackerOptions()  # wandb or mlflow beside TensorBoard (--logger, --run-name, ...)
    runs_dir: Path = Path("runs")
    resume: Path | None = None  # a Phase-B run to continue

    @property
    def cache_dir(self) -> Path:
        """Where the cache condition's features of the training frames live, beside the Phase-A run."""
        return Path(self.from_run) / "offload" / f"cache-{self.cache_dtype}-{self.train_episodes}"

    @property
    def boundary(self) -> int:
        """Encoder layers run before the learner: k for Lk, 0 for learner (and cache, which skips them)."""
        return int(self.condition[1:]) if self.condition.startswith("L") else 0


def validate(cfg: PhaseBConfig, layers: int) -> None:
    allowed = ("learner", *(f"L{k}" for k in range(1, layers + 1)), "cache")
    if cfg.condition not in allowed:
        raise UserError(f"--condition {cfg.condition!r}: choose one of {', '.join(allowed)} "
                        f"(Lk offloads the encoder up to boundary k; the encoder has {layers} layers)")
    if cfg.offload_precision not in ("int8", "fp32"):
        raise UserError(f"--offload-precision {cfg.offload_precision!r}: the offloaded prefix runs int8 or fp32")
    if cfg.cache_dtype not in CACHE_DTYPES:
        raise UserError(f"--cache-dtype {cfg.cache_dtype!r}: the feature cache stores fp16 or int8")
    for name in ("steps", "batch", "checkpoint_every", "prefetch"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(cfg, name)}")
    if cfg.eval_every < 0:
        raise UserError(f"--eval-every must be ≥ 0 (0 = never), got {cfg.eval_every}")
    check_schedule(cfg.lr, cfg.lr_decay)


def with_phase_a_schedule(cfg: PhaseBConfig, phase_a: ARActorRun) -> PhaseBConfig:
    """`cfg` with the learning rate and its decay the Phase-A run `phase_a` trained with, where the
    command line gave none."""
    own = phase_a.phase_a_options().resolved  # older runs stored only the rates asked for
    return dataclasses.replace(cfg, lr=own.lr if cfg.lr is None else cfg.lr,
                               lr_decay=own.lr_decay if cfg.lr_decay is None else cfg.lr_decay)


def resumed_config(cfg: PhaseBConfig) -> PhaseBConfig:
    """The resumed run's own config with the command line's RESUMABLE_OPTIONS; UserError if the
    command line asks for another value of any other option."""
    run = read_run(cfg.resume)
    if run.phase != "B":
        raise UserError(f"{cfg.resume} is a Phase-{run.phase} run; resume it with --phase {run.phase}, or pass a "
                        "Phase-B run to --phase B --resume")
    saved = _config_from_json(run.options)
    changed = changed_option(cfg, saved, RESUMABLE_OPTIONS)
    if changed is not None:
        flag, asked, own = changed
        raise UserError(f"--resume continues {cfg.resume} with its own options, but {flag} asks for {asked} where "
                        f"the run has {own}; start a new run to change it")
    given = {name: getattr(cfg, name) for name in RESUMABLE_OPTIONS}
    if given["steps"] is None:
        given["steps"] = saved.steps
    return dataclasses.replace(saved, **given)


def new_action_expert(model_cfg: ARActorConfig, seed: int, phase_a_expert: ActionExpert) -> ActionExpert:
    """A freshly initialised expert, the same for every condition of a seed; the action
    normalisation is the dataset's, as in Phase A."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        expert = ActionExpert(model_cfg)
    expert.action_mean.copy_(phase_a_expert.action_mean)
    expert.action_std.copy_(phase_a_expert.action_std)
    return expert


def frozen_encoder(run_dir: Path) -> tuple[ARActor, ARActorRun, int]:
    """The Phase-A model with its visual encoder frozen (eval mode: no dropout, fixed norms)."""
    run, state = load_run(run_dir)
    if run.phase != "A":
        raise UserError(f"{run_dir}: Phase B starts from a Phase-A run; this one is phase {run.phase}")
    model = ARActor(run.model)
    load_weights(model, state["model"], run_dir)
    model.visual.eval().requires_grad_(False)
    return model, run, state["step"]


class PhaseBPolicy:
    """Acting with a Phase-B run: the condition's encoder path, then the trained expert."""

    def __init__(self, visual, expert: ActionExpert, backend, boundary: int):
        self.visual, self.action_expert, self.backend, self.boundary = visual, expert, backend, boundary
        self.cfg = expert.cfg

    @torch.no_grad()
    def act(self, images: torch.Tensor, state: torch.Tensor, steps: int | None = None,
            parallel: bool = False) -> torch.Tensor:
        if self.backend is None:
            layer_tokens = self.visual(images, state)
        else:
            layer_tokens = self.visual.encode_rest(self.backend.run(images, state), self.boundary)
        return self.action_expert.unnormalise(self.action_expert.generate(layer_tokens, steps, parallel))


def load_phase_b_policy(run_dir: Path, step: int | None = None) -> PhaseBPolicy:
    """A Phase-B run's policy on the CPU (its newest checkpoint, or `step`'s), with the offload path
    it was trained with (the cache condition acts with the FP32 encoder its cache was built from)."""
    run, state = load_run(run_dir, step)
    cfg = _config_from_json(run.options)
    model, _, _ = frozen_encoder(cfg.from_run)
    expert = ActionExpert(model.cfg)
    load_weights(expert, state["action_expert"], run_dir)
    backend = _backend(cfg, model)
    return PhaseBPolicy(model.visual, expert.eval(), backend, cfg.boundary)


def _config_from_json(saved: dict) -> PhaseBConfig:
    saved = {"lr_decay": 0.0} | saved  # runs from before the option trained at a constant rate
    saved["quantise"] = QuantiseConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved["quantise"].items()})
    if "tracker" in saved:  # runs from before the option logged to TensorBoard alone
        saved["tracker"] = tracker_from_json(saved["tracker"])
    for key in ("from_run", "out", "runs_dir", "resume"):
        saved[key] = Path(saved[key]) if saved.get(key) is not None else None
    return PhaseBConfig(**saved)


def _backend(cfg: PhaseBConfig, model: ARActor, learner_device: torch.device = torch.device("cpu"),
             threads: int | None = None):
    """The offload backend of an Lk condition (`torch` runs on the learner's device), with `threads`
    for ONNX Runtime (unset: its own default); None when the learner runs the whole encoder."""
    if cfg.boundary == 0:
        return None
    phase_a = read_run(cfg.from_run)
    image_size = phase_a.image_size
    backend = make_backend(cfg.offload_device, cfg.boundary, image_size, Path(cfg.from_run) / "offload",
                           precision=cfg.offload_precision, quantise=cfg.quantise, threads=threads,
                           learner_device=learner_device)
    calibration = None
    if cfg.offload_precision == "int8":
        calibration = evenly_spaced_frames(phase_a.dataset(), _episodes(cfg.calibration_episodes),
                                           CALIBRATION_FRAMES, image_size)
    backend.prepare(model.visual, calibration)
    return backend


def _episodes(text: str) -> list[int]:
    episodes = parse_seeds(text, "--calibration-episodes")
    check_held_out(episodes, HELDOUT_EPISODES)
    return episodes


def _describe_encoder(cfg: PhaseBConfig, backend, learner: str) -> dict:
    if cfg.condition == "cache":
        return {"backend": "feature cache", "precision": cfg.cache_dtype, "built_with": f"torch fp32 on {learner}"}
    if backend is None:
        return {"backend": "torch", "precision": "fp32", "device": learner, "boundary": 0}
    return backend.describe()


def _meters(cfg: PhaseBConfig):
    meters, unavailable = available_meters()
    if cfg.power_command:
        meters.append(CommandMeter(cfg.power_command, cfg.power_pattern, cfg.power_device))  # fails now if broken
    return meters, unavailable


def train_phase_b(cfg: PhaseBConfig, progress=None) -> Path:
    """Train (or resume) one condition; returns the run directory (with summary.json)."""
    state, figures = None, figures_wanted()
    if cfg.resume is not None:
        cfg = resumed_config(cfg)
        state = load_checkpoint(cfg.resume)
    if cfg.from_run is None:
        raise UserError("--phase B needs --from RUN: the Phase-A run whose visual encoder it freezes")
    if cfg.steps is None:
        cfg = dataclasses.replace(cfg, steps=DEFAULT_STEPS)
    model, phase_a, phase_a_step = frozen_encoder(cfg.from_run)
    validate(cfg, len(model.visual.layers))
    require_logger(cfg.tracker.logger)
    cfg = with_phase_a_schedule(cfg, phase_a)
    if cfg.eval_every:  # refused now, not at the first evaluation
        from hetlab.imitation.evaluate import check_eval_seeds, success_columns, training_seeds  # (it loads this phase's policies)

        check_eval_seeds(cfg.eval_seeds, training_seeds(phase_a, more_episodes=cfg.train_episodes))
    first_step = state["step"] if state is not None else 0
    if first_step >= cfg.steps:
        raise UserError(f"{cfg.resume} has already trained {first_step} steps; pass --steps above {first_step} "
                        "to train it further")
    device = pick_device(cfg.device)
    torch_device = torch.device(device.torch_device)
    height, width = phase_a.image_size
    dataset = open_dataset(phase_a.dataset(), cfg.train_episodes, (height, width), model.cfg.chunk,
                           f"Phase-A run {cfg.from_run}", phase_a.render_quality)
    meters, unavailable = _meters(cfg)
    # Made (exported, calibrated) before the run exists, so a missing provider or bad calibration
    # episodes stop here. It runs in the producer thread; learner-only encodes in its own step.
    # ONNX Runtime sizes its thread pool by the machine's cores, not by those this process may use
    # (taskset, cgroups): on fewer, its threads would wait on each other.
    backend = _backend(cfg, model, torch_device, cpu_count()) if cfg.condition != "cache" else None
    if hasattr(backend, "quantise"):  # the INT8 model as made for this offload device, overflow fix decided
        cfg = dataclasses.replace(cfg, quantise=backend.quantise)
    run_dir = cfg.resume or cfg.out or \
        cfg.runs_dir / RUN_KIND / f"{datetime.now():%Y%m%d-%H%M%S-%f}-B-{cfg.condition}-s{cfg.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / "config.json", json.dumps(
        {"kind": RUN_KIND, "phase": "B", "model": dataclasses.asdict(phase_a.model),
         "image_size": list(phase_a.image_size), "render_quality": phase_a.render_quality,
         "phase_b": json.loads(json.dumps(dataclasses.asdict(dataclasses.replace(cfg, resume=None)), default=str))},
        indent=2))
    record_launch(run_dir, device.torch_device, device.name)
    print(run_dir, flush=True)

    visual = model.visual.to(torch_device)
    expert = new_action_expert(model.cfg, cfg.seed, model.action_expert).to(torch_device).train()
    optimizer = torch.optim.AdamW(expert.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, **OPTIMIZER_OPTIONS)
    if state is not None:
        if "optimizer" not in state:
            raise UserError(f"{cfg.resume}: its checkpoint has no optimizer state, so it cannot continue exactly; "
                            "train the condition again")
        load_weights(expert, state["action_expert"], cfg.resume)
        optimizer.load_state_dict(state["optimizer"])
    cache_info = None
    if cfg.condition == "cache":
        cache_dir = cfg.cache_dir
        key = {"phase_a_step": phase_a_step, "train_episodes": cfg.train_episodes, "image_size": [height, width]}
        built = None
        if not (cache_dir / "meta.json").is_file():
            built = build_feature_cache(visual.cpu(), dataset, cache_dir, cfg.cache_dtype, CAMERA_KEY, STATE, key, progress)
            visual.to(torch_device)
        cache = FeatureCache(cache_dir, key)
        cache_info = {**cache.meta, "built_now": built is not None}
        encode = None
    else:
        encode = (lambda batch: backend.run(batch["images"], batch[STATE])) if backend is not None else None

    frames = len(dataset)

    def load(step: int) -> dict:
        indices = batch_indices(step, cfg.batch, frames, cfg.seed)
        if cfg.condition == "cache":
            actions, is_pad = zip(*(dataset.action_chunk(int(i)) for i in indices))
            return {"layer_tokens": cache.tokens(indices), ACTION: torch.from_numpy(np.stack(actions)),
                    "action_is_pad": torch.from_numpy(np.stack(is_pad))}
        items = torch.utils.data.default_collate([dataset[i] for i in indices])
        return {"images": items[CAMERA_KEY].float().div_(255), STATE: items[STATE],
                ACTION: items[ACTION], "action_is_pad": items["action_is_pad"]}

    timeline, learner = Timeline(), SpanRecorder()
    window = []
    reset_peak_memory(torch_device)
    sampler = PowerSampler(meters, interval=cfg.power_interval, unavailable=unavailable)
    run = TrainingRun(TrackedRun(cfg.tracker, run_dir, cfg.runs_dir, flat_options(cfg), metrics=("train/loss",)),
                      f"hetlab aloha train --phase B --resume {shlex.quote(str(run_dir))}", first_step=first_step,
                      last_step=cfg.steps, checkpoint_every=cfg.checkpoint_every, max_seconds=cfg.max_seconds,
                      row_steps=lambda row: row["step"], clock="wall_s")
    job = progress.add_task(f"phase B {cfg.condition} seed {cfg.seed}", total=cfg.steps, completed=first_step) \
        if progress is not None else None

    def checkpoint(step: int) -> None:
        run.checkpoint(step, {"action_expert": expert.state_dict(), "optimizer": optimizer.state_dict(), "step": step})

    def update(step: int, prepared) -> bool:
        batch = prepared.batch
        with learner.span("transfer"):
            actions = batch[ACTION].to(torch_device, non_blocking=True)
            is_pad = batch["action_is_pad"].to(torch_device, non_blocking=True)
            if cfg.condition == "cache":
                inputs = [t.to(torch_device, non_blocking=True) for t in batch["layer_tokens"]]
            elif cfg.boundary:
                inputs = [t.to(torch_device, non_blocking=True) for t in prepared.tokens]
            else:
                inputs = (batch["images"].to(torch_device, non_blocking=True), batch[STATE].to(torch_device))
        with learner.span("encode"), torch.no_grad():
            if cfg.condition == "cache":
                layer_tokens = inputs
            elif cfg.boundary:
                layer_tokens = visual.encode_rest(inputs, cfg.boundary)
            else:
                layer_tokens = visual(*inputs)
        with learner.span("update"):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, cfg.lr, cfg.lr_decay, cfg.steps)
            torch.manual_seed(dropout_seed(cfg.seed, step))
            mask = random_history_mask(cfg.batch, model.cfg.chunk, model.cfg.max_history_mask,
                                       step_generator(cfg.seed, step)).to(torch_device)
            target = expert.normalise(actions)
            with autocast_for(device, cfg.precision):
                predicted = expert(layer_tokens, target, mask)
            loss = chunk_l1(predicted.float(), target, is_pad)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(expert.parameters(), cfg.grad_clip)
            optimizer.step()
            window.append(loss.item())
        timeline.add(step, "producer", prepared.spans)
        timeline.add(step, "learner", learner.take())
        return True

    def after(step: int) -> None:
        evaluates = cfg.eval_every and step % cfg.eval_every == 0
        if evaluates or step % 10 == 0 or step == cfg.steps:
            row = {"step": step, "loss": float(np.mean(window)), "lr": optimizer.param_groups[0]["lr"]}
            if evaluates:
                checkpoint(step)  # what the evaluation plays
                with learner.span("evaluate"):
                    row |= success_columns(run_dir, step, cfg.eval_seeds)
            row["wall_s"] = run.run_clock()
            run.log(row, row_scalars(row, leave_out=("step", "wall_s")), step)
            window.clear()
        if job is not None:
            progress.update(job, completed=step)

    sampler.start()
    try:  # the sampler stops whatever fails; the run closes its loggers
        with run, Prefetcher(range(first_step, cfg.steps), load, encode, cfg.prefetch) as prefetcher:

            def prepared():
                with learner.span("wait_data"):
                    return prefetcher.get()

            step, stopped_by = run.loop(first_step, iter(prepared, None), update, after, checkpoint,
                                        completed="steps", ended=lambda: "steps")
    finally:
        wall = run.elapsed()
        sampler.stop()
    samples = (step - first_step) * cfg.batch  # this launch's: time, power and memory are measured over it
    energy = sampler.report()
    summary = {
        "condition": cfg.condition, "seed": cfg.seed, "steps": step, "first_step": first_step, "samples": samples,
        "stopped_by": stopped_by, "wall_s": wall, "samples_per_s": samples / wall,
        "first_loss": run.history[0]["loss"] if run.history else None,
        "last_loss": run.history[-1]["loss"] if run.history else None,
        "breakdown_s": timeline.summary(),
        "encoder": _describe_encoder(cfg, backend,
                                     f"{device.torch_device} ({device.name})"),
        "power": [dataclasses.asdict(device_energy) for device_energy in energy],
        "energy_per_sample": dataclasses.asdict(energy_per_sample(energy, samples)),
        "peak_memory": dataclasses.asdict(peak_memory(torch_device)),
        "cache": cache_info,
    }
    run.finish(summary)
    if figures:
        timeline.plot(run_dir / "timeline.png", f"Phase B, {cfg.condition}, seed {cfg.seed}")
    return run_dir
