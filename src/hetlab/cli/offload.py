"""`hetlab offload …`: Phase B's visual encoder offloaded from the learner."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from hetlab.cli.output import console, err_console, print_json
from hetlab.cli.parsing import Group
from hetlab.imitation.config import OffloadTuneConfig, StudyConfig
from hetlab.offload.config import QuantiseConfig
from hetlab.seeds import parse_seeds


@dataclass(frozen=True, kw_only=True)
class FidelityConfig:
    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]  # a Phase-A run directory
    boundaries: str = "1,2,3,4"  # split boundaries k (encoder layers offloaded)
    quantise: QuantiseConfig = QuantiseConfig()  # how the prefix is quantised to INT8
    provider: str = "CPUExecutionProvider"  # the ONNX Runtime execution provider the INT8 prefix runs on
    dataset: Path | None = None  # default: the run's Phase-A dataset
    calibration_episodes: str = "0-7"  # episodes whose frames calibrate the INT8 prefix
    heldout_episodes: str = "40-49"  # episodes fidelity is measured on (never calibrated on)
    threads: int | None = None  # ONNX Runtime intra-op threads; default: ONNX Runtime's own choice
    json: bool = False  # print the result as JSON


def offload_fidelity(cfg: Annotated[FidelityConfig, tyro.conf.arg(name="")]) -> None:
    """Cosine similarity of the INT8 and FP32 tokens at each split boundary, on held-out frames (goal ≥ 0.9975)."""
    from rich.progress import Progress
    from rich.table import Table

    from hetlab.imitation.study import phase_a_fidelity
    from hetlab.offload.fidelity import GOAL

    boundaries = parse_seeds(cfg.boundaries, "--boundaries")
    with Progress(console=err_console(), transient=True) as progress:
        result = phase_a_fidelity(cfg.run, boundaries, cfg.dataset, quantise=cfg.quantise, provider=cfg.provider,
                                  calibration_episodes=parse_seeds(cfg.calibration_episodes, "--calibration-episodes"),
                                  heldout_episodes=parse_seeds(cfg.heldout_episodes, "--heldout-episodes"),
                                  threads=cfg.threads, progress=progress)
    if cfg.json:
        print_json(dataclasses.asdict(result))
        return
    table = Table("boundary", "cosine (INT8 vs FP32)", f"goal ≥ {GOAL}", title=f"fidelity, {cfg.quantise.method} calibration")
    for k, cosine in result.cosines.items():
        table.add_row(f"L{k}", f"{cosine:.5f}", "met" if cosine >= GOAL else "[red]missed[/]")
    console().print(table)
    console().print(result.choice, highlight=False, soft_wrap=True)
    if result.below_goal:
        console().print(f"[red]{result.below_goal}[/]", highlight=False, soft_wrap=True)


def offload_devices() -> None:
    """Offload devices (ONNX Runtime execution providers, OpenVINO, torch) and whether each is usable here."""
    from rich.table import Table

    from hetlab.offload.backends import available_offload_devices

    table = Table("--offload-device", "status")
    for name, status in available_offload_devices().items():
        table.add_row(name, status)
    console().print(table)


def offload_study(cfg: Annotated[StudyConfig, tyro.conf.arg(name="")]) -> None:
    """Phase B under every condition and training seed, evaluated and measured; writes report.md with tables and figures."""
    from rich.progress import Progress

    from hetlab.imitation.study import run_study

    with Progress(console=err_console()) as progress:
        report = run_study(cfg, progress)
    console().print(f"study report: {report}", highlight=False, soft_wrap=True)


def offload_tune(cfg: Annotated[OffloadTuneConfig, tyro.conf.arg(name="")]) -> None:
    """Phase B's samples/s (and J/sample where power reads) under each condition and offload device; recommends one."""
    from rich.progress import Progress
    from rich.table import Table

    from hetlab.imitation.offload_tune import tune_offload

    with Progress(console=err_console(), transient=True) as progress:
        result = tune_offload(cfg, progress)
    if cfg.json:
        print_json(result)
        return
    samples = result["steps"] * result["batch"]
    table = Table("condition", "offload device", "samples/s", "J/sample", "peak memory", "cache build",
                  f"{result['steps']:,} steps", "vs learner-only",
                  title=f"Phase B, {result['seconds_per_condition']:g} s per condition")
    for row in result["conditions"]:
        joules = row["joules_per_sample"]
        table.add_row(row["condition"], row["offload_device"] or "—", f"{row['samples_per_s']:.1f}",
                      "not read" if joules is None else f"{joules:.2f}", f"{row['peak_memory_bytes'] / 2**20:,.0f} MiB",
                      f"{row['build_s']:.0f} s" if row["build_s"] else "—", f"{row['seconds_for_run'] / 60:,.1f} min",
                      f"{row['speed_vs_learner']:.2f}×" if "speed_vs_learner" in row else "—")
    console().print(table)
    for row in result["conditions"]:
        for note in row["notes"]:
            name = row["condition"] + (f" on {row['offload_device']}" if row["offload_device"] else "")
            console().print(f"{name}: {note}", highlight=False, soft_wrap=True)
    choice = result["choice"]
    console().print(f"recommended for {samples:,} samples, by {result['objective']}: {choice['options']} "
                    f"(written to {result['written_to']})", highlight=False, soft_wrap=True)


offload = Group("Phase B's offloaded encoder: fidelity, devices, study, tune.",
                {"fidelity": offload_fidelity, "devices": offload_devices, "study": offload_study,
                 "tune": offload_tune})
