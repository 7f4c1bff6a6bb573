"""`hetlab offload study`: every condition × training seed of Phase B, evaluated and reported.

Each condition trains in its own spawned process, so its peak memory is its own, one after
another, so their timings and power readings do not disturb each other. Within a seed all
conditions share the initial action expert, data order, masks and dropout (see phase_b.py).
Results live in `<out>/<condition>-s<seed>/`; a condition whose summary.json exists is not
trained again, and one whose evaluation exists is not evaluated again, so an interrupted study
resumes where it stopped. report.md and its figures are rewritten from the results each time.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from hetlab.devices import cpu_count
from hetlab.errors import UserError
from hetlab.imitation.evaluate import EvalConfig, evaluate
from hetlab.imitation.phase_a import load_policy, read_run_config
from hetlab.imitation.phase_b import CONDITIONS, PhaseBConfig, train_phase_b
from hetlab.imitation.study_report import write_study_report
from hetlab.offload.fidelity import CALIBRATION_EPISODES, HELDOUT_EPISODES, Fidelity, check_held_out, fidelity
from hetlab.offload.quantise import QuantiseConfig
from hetlab.seeds import parse_seeds


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    from_run: Annotated[Path, tyro.conf.arg(name="from")]  # the Phase-A run
    conditions: str = ",".join(CONDITIONS)
    seeds: str = "2000,2001,2002"  # training seeds
    steps: int = 30_000  # Phase-B steps per condition and seed
    eval_seeds: str = "2000-2299"
    eval_workers: int = 0  # 0 = one per core
    eval_max_steps: int = 400  # steps per evaluation episode (the task's 400)
    videos: int = 0  # evaluation videos per condition and seed
    fidelity: bool = True  # INT8-vs-FP32 cosine per offloaded boundary, in the report
    train_episodes: str = "0-39"
    calibration_episodes: str = "0-7"  # the INT8 prefixes' calibration frames come from these
    heldout_episodes: str = "40-49"  # fidelity is measured on these
    offload_device: str = "cpu"
    quantise: QuantiseConfig = field(default_factory=QuantiseConfig)
    power_interval: float = 1.0
    power_command: str | None = None
    power_pattern: str = r"([0-9.]+)\s*W"
    power_device: str = "offload device"
    out: Path | None = None  # default <from_run>/study


def conditions_of(text: str) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CONDITIONS]
    if not chosen or unknown:
        raise UserError(f"--conditions {text!r}: choose from {', '.join(CONDITIONS)} (comma-separated)")
    return chosen


def _train(cfg: PhaseBConfig) -> None:
    import torch

    torch.set_num_threads(cpu_count())
    train_phase_b(cfg)


def run_study(cfg: StudyConfig, progress=None) -> Path:
    """Train, evaluate, report; returns the path of report.md."""
    conditions, seeds = conditions_of(cfg.conditions), parse_seeds(cfg.seeds)
    parse_seeds(cfg.eval_seeds, "--eval-seeds")
    check_held_out(parse_seeds(cfg.calibration_episodes, "--calibration-episodes"),
                   parse_seeds(cfg.heldout_episodes, "--heldout-episodes"))
    read_run_config(cfg.from_run)  # a clear error now rather than in the first subprocess
    out = cfg.out or Path(cfg.from_run) / "study"
    out.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("spawn")
    runs: dict[tuple[str, int], Path] = {}
    for seed in seeds:
        for condition in conditions:
            run_dir = out / f"{condition}-s{seed}"
            runs[condition, seed] = run_dir
            if not (run_dir / "summary.json").is_file():
                phase_b = PhaseBConfig(from_run=Path(cfg.from_run), condition=condition, seed=seed, steps=cfg.steps,
                                       train_episodes=cfg.train_episodes, calibration_episodes=cfg.calibration_episodes,
                                       offload_device=cfg.offload_device, quantise=cfg.quantise,
                                       power_interval=cfg.power_interval, power_command=cfg.power_command,
                                       power_pattern=cfg.power_pattern, power_device=cfg.power_device, out=run_dir)
                process = context.Process(target=_train, args=(phase_b,), name=f"hetlab-phase-b-{condition}-{seed}")
                process.start()
                process.join()
                if process.exitcode != 0:
                    raise RuntimeError(f"Phase B {condition} seed {seed} failed (exit code {process.exitcode}); "
                                       f"see the output above; finished conditions are kept in {out}")
            if not (run_dir / "eval" / cfg.eval_seeds.replace(",", "_") / "results.json").is_file():
                evaluate(EvalConfig(run=run_dir, seeds=cfg.eval_seeds, workers=cfg.eval_workers, videos=cfg.videos,
                                    max_steps=cfg.eval_max_steps), progress)
    measured = None
    offloaded = sorted(int(c[1:]) for c in conditions if c.startswith("L"))
    if cfg.fidelity and offloaded:
        measured = dataclasses.asdict(phase_a_fidelity(
            Path(cfg.from_run), offloaded, quantise=cfg.quantise,
            calibration_episodes=parse_seeds(cfg.calibration_episodes, "--calibration-episodes"),
            heldout_episodes=parse_seeds(cfg.heldout_episodes, "--heldout-episodes")))
    study = {"config": json.loads(json.dumps(dataclasses.asdict(cfg), default=str)),
             "runs": {f"{c}-s{s}": str(path) for (c, s), path in runs.items()}, "fidelity": measured}
    return write_study_report(out, study, conditions, seeds, cfg.eval_seeds)


def phase_a_fidelity(run_dir: Path, boundaries, dataset: Path | None = None, *,
                     calibration_episodes=CALIBRATION_EPISODES, heldout_episodes=HELDOUT_EPISODES,
                     **options) -> Fidelity:
    """`fidelity` of a Phase-A run's encoder on its own dataset (or `dataset`); the INT8 prefixes
    go to RUN/offload, where Phase B finds them."""
    check_held_out(calibration_episodes, heldout_episodes)  # before the model is loaded
    model, config = load_policy(Path(run_dir))
    dataset = dataset or config["phase_a"].get("dataset")
    if dataset is None:
        raise UserError(f"{run_dir}: the run does not name its dataset; pass the cube-transfer dataset (--dataset)")
    return fidelity(model.visual, tuple(config["image_size"]), Path(run_dir) / "offload", dataset, boundaries,
                    calibration_episodes=calibration_episodes, heldout_episodes=heldout_episodes, **options)
