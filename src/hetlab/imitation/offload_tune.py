"""`hetlab offload tune`: which of Phase B's conditions trains a run fastest on this machine (or, where
a power meter reads, on the least energy), measured rather than guessed.

Every condition — the whole encoder on the learner, its prefix up to layer k offloaded (L1..L4) to
each usable offload device, the feature cache — trains a short Phase-B run from the Phase-A run, in
a fresh process of its own and one after another, as the study's runs do, so that each has the
cores to itself. Its rate is the steady one between its first and last logged rows: the first
steps' warm-up (threads started, kernels picked) does not count.

The cache is built once for the training frames before its run can start, so its build is charged
to it: the choice is the condition with the least time (or energy) for the `steps` the Phase-B run
will train. Where that cache is not built yet, a cache of `cache_episodes` alone is built, trained
on and removed, and the full build's time is scaled from it by frame count.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hetlab.errors import UserError
from hetlab.files import write_text_atomic
from hetlab.imitation.config import MIN_TUNE_SECONDS, OffloadTuneConfig

# ONNX Runtime providers that are not a device here: Azure's sends each batch to a remote endpoint.
NOT_OFFLOAD_DEVICES = ("ort:AzureExecutionProvider",)


@dataclass(frozen=True)
class Measured:
    condition: str
    offload_device: str | None  # None: the condition runs no prefix elsewhere
    samples_per_s: float
    joules_per_sample: float | None  # None: no power meter read
    peak_memory_bytes: int
    build_s: float = 0.0  # the feature cache's build still to pay for (0 when it exists)
    notes: list[str] = field(default_factory=list)
    symmetric_activations: bool = False  # the offloaded prefix was quantised so (OpenVINO needs it)

    def seconds_for(self, samples: int) -> float:
        return self.build_s + samples / self.samples_per_s

    def joules_for(self, samples: int) -> float | None:
        if self.joules_per_sample is None:
            return None
        # The build draws about the power its training drew (the same encoder, on the same cores).
        watts = self.joules_per_sample * self.samples_per_s
        return self.build_s * watts + samples * self.joules_per_sample


def offload_targets(asked: str) -> list[str]:
    """The offload devices to measure: those asked for (each refused if unusable here), or every usable one."""
    from hetlab.offload.backends import ORT_SHORT_NAMES, available_offload_devices

    devices = available_offload_devices()
    if asked != "auto":
        chosen = [name.strip() for name in asked.split(",") if name.strip()]
        for name in chosen:
            if devices.get(name, "unknown") != "available":
                raise UserError(f"--offload-devices {name!r}: {devices.get(name, 'not an offload device here')}; "
                                f"`hetlab offload devices` lists them")
        return chosen
    usable = [name for name, status in devices.items() if status == "available"]
    # torch runs the prefix on the learner itself; ort:<the short names' providers> and openvino:CPU are
    # cpu, cuda and openvino again.
    again = {f"ort:{provider}" for provider in ORT_SHORT_NAMES.values()} | {"openvino:CPU"}
    return [name for name in usable if name != "torch" and name not in NOT_OFFLOAD_DEVICES and name not in again]


def tune_offload(cfg: OffloadTuneConfig, progress=None) -> dict:
    """Measure every condition, choose, write the result (JSON) and return it."""
    from hetlab.imitation.config import CACHE_DTYPES
    from hetlab.imitation.phase_b import PhaseBConfig, with_phase_a_schedule
    from hetlab.imitation.run_files import read_run
    from hetlab.imitation.study import conditions_of

    if cfg.seconds < MIN_TUNE_SECONDS:
        raise UserError(f"--seconds {cfg.seconds:g}: each condition needs at least {MIN_TUNE_SECONDS:g} s of training "
                        "to measure a steady rate")
    if cfg.steps < 1 or cfg.batch < 1:
        raise UserError(f"--steps and --batch must be ≥ 1, got {cfg.steps} and {cfg.batch}")
    if cfg.cache_dtype not in CACHE_DTYPES:
        raise UserError(f"--cache-dtype {cfg.cache_dtype!r}: the feature cache stores {' or '.join(CACHE_DTYPES)}")
    conditions = conditions_of(cfg.conditions)
    phase_a = read_run(cfg.from_run)
    if phase_a.phase != "A":
        raise UserError(f"{cfg.from_run} is a Phase-{phase_a.phase} run; pass the Phase-A run its encoder comes from")
    devices = offload_targets(cfg.offload_devices) if any(c.startswith("L") for c in conditions) else []
    base = with_phase_a_schedule(PhaseBConfig(
        from_run=Path(cfg.from_run).resolve(), steps=cfg.steps, batch=cfg.batch, train_episodes=cfg.train_episodes,
        calibration_episodes=cfg.calibration_episodes, cache_dtype=cfg.cache_dtype, max_seconds=cfg.seconds,
        checkpoint_every=cfg.steps), phase_a)
    jobs = [(condition, device) for condition in conditions
            for device in (devices if condition.startswith("L") else [None])]
    task = progress.add_task("offload tune", total=len(jobs)) if progress is not None else None
    measured = []
    with tempfile.TemporaryDirectory(prefix="hetlab-offload-tune-") as scratch:
        for condition, device in jobs:
            job = dataclasses.replace(base, condition=condition, offload_device=device or "cpu",
                                      quantise=_quantise_for(device, base.quantise),
                                      out=Path(scratch) / f"{condition}-{device}", runs_dir=Path(scratch))
            measured.append(_measure(job, cfg) if condition != "cache" else _measure_cache(job, cfg, phase_a))
            if task is not None:
                progress.update(task, advance=1)
    result = _choose(measured, cfg.steps * cfg.batch)
    result |= {"from_run": str(Path(cfg.from_run).resolve()), "seconds_per_condition": cfg.seconds,
               "steps": cfg.steps, "batch": cfg.batch}
    out = cfg.out or Path(cfg.from_run) / "offload" / "tune.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(result, indent=2))
    result["written_to"] = str(out)
    return result


def _quantise_for(device: str | None, quantise):
    """OpenVINO's CPU plugin compiles this model's int8 MatMuls only with activation zero points at 0."""
    if device is not None and device.startswith("openvino"):
        return dataclasses.replace(quantise, symmetric_activations=True)
    return quantise


def _measure(job, cfg: OffloadTuneConfig, build_s: float = 0.0, notes: list[str] | None = None) -> Measured:
    from hetlab.run_history import read_history
    from hetlab.runtime.workers import call_in_own_process

    call_in_own_process(_train_to_stderr, job, name="phase-b")
    summary = json.loads((job.out / "summary.json").read_text())
    rows = [row for row in read_history(job.out) if row["step"] > summary["first_step"]]
    if len(rows) >= 2 and rows[-1]["wall_s"] > rows[0]["wall_s"]:
        rate = (rows[-1]["step"] - rows[0]["step"]) * job.batch / (rows[-1]["wall_s"] - rows[0]["wall_s"])
    else:  # too few rows for a steady rate: the whole launch's, warm-up included
        rate = summary["samples_per_s"]
        notes = [*(notes or []), f"{summary['steps']} steps in {cfg.seconds:g} s: rate includes the warm-up"]
    return Measured(job.condition, job.offload_device if job.condition.startswith("L") else None, rate,
                    summary["energy_per_sample"]["combined"], summary["peak_memory"]["bytes"], build_s, notes or [],
                    symmetric_activations=job.condition.startswith("L") and job.quantise.symmetric_activations)


def _train_to_stderr(job) -> None:
    """A condition's run, what it prints sent to stderr: stdout is the table's, or the JSON's."""
    import contextlib
    import sys

    from hetlab.imitation.study import train_with_every_core

    with contextlib.redirect_stdout(sys.stderr):
        train_with_every_core(job)


def _measure_cache(job, cfg: OffloadTuneConfig, phase_a) -> Measured:
    """The cache condition: on the full cache where it is built (nothing left to pay), else on a cache
    of `cache_episodes`, with the full build's time scaled from that one's by frame count."""
    from hetlab.imitation.data import open_dataset

    if (job.cache_dir / "meta.json").is_file():
        return _measure(job, cfg, notes=["cache already built"])
    sample = dataclasses.replace(job, train_episodes=cfg.cache_episodes)
    sample_dir = sample.cache_dir
    made_here = not (sample_dir / "meta.json").is_file()  # else its build was timed when it was made
    measured = _measure(sample, cfg)
    meta = json.loads((sample_dir / "meta.json").read_text())
    if made_here:  # a by-product of tuning, not a cache anyone asked for
        shutil.rmtree(sample_dir)
    frames = len(open_dataset(phase_a.dataset(), job.train_episodes, phase_a.image_size, phase_a.model.chunk,
                              f"Phase-A run {job.from_run}", phase_a.render_quality))
    build_s = meta["build_s"] * frames / meta["frames"]
    return dataclasses.replace(measured, build_s=build_s, notes=[
        f"build of {frames} frames estimated from {meta['frames']} (episodes {cfg.cache_episodes}"
        f"{'' if made_here else ', a cache built before'}): {build_s:.0f} s"])


def _choose(measured: list[Measured], samples: int) -> dict:
    """The condition with the least energy for `samples` where every condition's energy was read,
    else the least time; each condition's figures and its speed against learner-only."""
    by_energy = all(m.joules_per_sample is not None for m in measured)
    cost = (lambda m: m.joules_for(samples)) if by_energy else (lambda m: m.seconds_for(samples))
    best = min(measured, key=cost)
    learner = next((m for m in measured if m.condition == "learner"), None)
    rows = []
    for m in measured:
        row = dataclasses.asdict(m) | {"seconds_for_run": m.seconds_for(samples), "joules_for_run": m.joules_for(samples)}
        if learner is not None:
            row["speed_vs_learner"] = learner.seconds_for(samples) / m.seconds_for(samples)
        rows.append(row)
    return {"objective": "energy" if by_energy else "time", "conditions": rows,
            "choice": {"condition": best.condition, "offload_device": best.offload_device,
                       "options": f"--condition {best.condition}"
                                  + (f" --offload-device {best.offload_device}" if best.offload_device else "")
                                  + (" --quantise.symmetric-activations" if best.symmetric_activations else "")}}
