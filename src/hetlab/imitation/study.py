"""`hetlab offload study`: every condition × training seed of Phase B, evaluated and reported.

Each condition trains in a fresh spawned process of its own (hetlab.runtime.workers), so its peak
memory is its own, one after another, so their timings and power readings do not disturb each
other. Within a seed all conditions share the initial action expert, data order, masks and dropout
(see phase_b.py).

Results are keyed by the settings that shape them, so a study run again reuses only what it would
make anew. A run lives in `<out>/<condition>-s<seed>-<digest>/` (the cache condition trains once per
`--cache-dtypes`; stored as int8 it is `cache-int8`), the digest a short hash of its `run_settings`:
every Phase-B option but where the run is written, how often it saves and whether it was resumed, less the offload options (device, precision, quantisation, calibration episodes) for a
condition that does not offload and the cache dtype for all but the cache. The quantisation's
overflow fix is decided for the offload device's int8 kernels here, before training, as the run's
backend decides it, so a run quantised for another CPU's kernels is not reused. Its evaluation lives
in `<run>/eval/<seeds>-<digest>/`, keyed by `eval_settings` (seeds, episode length, replanning;
videos are extras, not settings). A run or an evaluation is reused only when it finished and the
settings stored in its own files (config.json's `phase_b` block, results.json) equal the requested
ones. Other settings train or evaluate into new directories beside the old ones — changing the
quantisation retrains only the offloaded conditions, changing the evaluation only evaluates again —
and a directory whose stored settings differ from those its name stands for (edited by hand) is
refused with the differing setting named, never reused. An interrupted study resumes where it
stopped. report.md and its figures are rewritten each time from the files of the runs asked for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from hetlab.aloha_config import EPISODE_STEPS
from hetlab.devices import cpu_count
from hetlab.dir_lock import exclusive_writer
from hetlab.errors import UserError
from hetlab.imitation.config import CACHE_DTYPES, CONDITIONS, EvalConfig, StudyConfig
from hetlab.imitation.evaluate import check_seeds_held_out, evaluate, training_seeds
from hetlab.datasets.lerobot import load_info
from hetlab.imitation.data import check_recording
from hetlab.imitation.phase_b import PhaseBConfig, train_phase_b, with_phase_a_schedule
from hetlab.imitation.run_files import ARActorRun, load_policy, read_run, read_summary
from hetlab.imitation.schedule import check_schedule
from hetlab.imitation.study_report import write_study_report
from hetlab.offload.backends import make_backend
from hetlab.offload.fidelity import CALIBRATION_EPISODES, HELDOUT_EPISODES, Fidelity, check_held_out, fidelity
from hetlab.offload.quantise import QuantiseConfig
from hetlab.runtime.workers import call_in_own_process
from hetlab.seeds import parse_seeds

# PhaseBConfig fields that say where a run is written, how often it saves or evaluates along the way,
# whether it was resumed and how long a launch may take, not what it is.
NOT_SETTINGS = frozenset({"out", "runs_dir", "checkpoint_every", "resume", "max_seconds", "eval_every", "eval_seeds"})
OFFLOAD_SETTINGS = frozenset({"offload_device", "offload_precision", "quantise", "calibration_episodes"})
INT8_SETTINGS = frozenset({"quantise", "calibration_episodes"})
CACHE_SETTINGS = frozenset({"cache_dtype"})
EVAL_SETTINGS = ("seeds", "max_steps", "replan_every")  # as results.json stores them


def conditions_of(text: str) -> list[str]:
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CONDITIONS]
    if not chosen or unknown:
        raise UserError(f"--conditions {text!r}: choose from {', '.join(CONDITIONS)} (comma-separated)")
    return chosen


def cache_dtypes_of(text: str) -> list[str]:
    chosen = [d.strip() for d in text.split(",") if d.strip()]
    if not chosen or any(d not in CACHE_DTYPES for d in chosen) or len(set(chosen)) < len(chosen):
        raise UserError(f"--cache-dtypes {text!r}: choose from {', '.join(CACHE_DTYPES)} (comma-separated, each once)")
    return chosen


def study_conditions(conditions: list[str], cache_dtypes: list[str]) -> list[tuple[str, str, str]]:
    """(name in the study, Phase-B condition, cache dtype) of every run a seed trains: the cache
    condition once per dtype, named `cache` for FP16 and `cache-<dtype>` for another."""
    return [(study_name(condition, dtype), condition, dtype)
            for condition in conditions for dtype in (cache_dtypes if condition == "cache" else ("fp16",))]


def study_name(condition: str, cache_dtype: str) -> str:
    return f"cache-{cache_dtype}" if condition == "cache" and cache_dtype != "fp16" else condition


def run_settings(phase_b: dict) -> dict:
    """The settings that shape a Phase-B run's results, from its config.json `phase_b` block (or a
    PhaseBConfig as JSON): an offloaded condition's offload settings count, the others' do not."""
    condition = phase_b["condition"]
    ignored = set(NOT_SETTINGS)
    if not condition.startswith("L"):
        ignored |= OFFLOAD_SETTINGS
    elif phase_b["offload_precision"] != "int8":
        ignored |= INT8_SETTINGS
    if condition != "cache":
        ignored |= CACHE_SETTINGS
    settings = {key: value for key, value in phase_b.items() if key not in ignored}
    settings["from_run"] = os.path.realpath(settings["from_run"])
    return settings


def eval_settings(results: dict) -> dict:
    """The settings that shape an evaluation's results, from its results.json."""
    return {key: results.get(key) for key in EVAL_SETTINGS}


def digest(settings: dict) -> str:
    """Eight hex digits naming these settings in a directory name."""
    return hashlib.blake2b(json.dumps(settings, sort_keys=True).encode(), digest_size=4).hexdigest()


def train_with_every_core(cfg: PhaseBConfig) -> None:
    """`train_phase_b` with torch on every core this process may use (in a spawned process)."""
    import torch

    torch.set_num_threads(cpu_count())
    train_phase_b(cfg)


def run_study(cfg: StudyConfig, progress=None) -> Path:
    """Train, evaluate, report; returns the path of report.md."""
    conditions, seeds = conditions_of(cfg.conditions), parse_seeds(cfg.seeds)
    entries = study_conditions(conditions, cache_dtypes_of(cfg.cache_dtypes))
    check_held_out(parse_seeds(cfg.calibration_episodes, "--calibration-episodes"),
                   parse_seeds(cfg.heldout_episodes, "--heldout-episodes"))
    phase_a = read_run(cfg.from_run)  # a clear error now rather than in the first subprocess
    # The report calls the evaluation seeds held out: neither phase may have trained on them.
    check_seeds_held_out(parse_seeds(cfg.eval_seeds, "--eval-seeds"), training_seeds(phase_a, cfg.train_episodes),
                         "--eval-seeds")
    check_schedule(cfg.lr, cfg.lr_decay)
    chunk = phase_a.model.chunk
    if not 0 <= cfg.eval_replan_every <= chunk:
        raise UserError(f"--eval-replan-every must be in 0..{chunk} (the chunk), got {cfg.eval_replan_every}")
    if not 1 <= cfg.eval_max_steps <= EPISODE_STEPS:
        raise UserError(f"--eval-max-steps must be in 1..{EPISODE_STEPS} (the task's episode length), "
                        f"got {cfg.eval_max_steps}")
    from_run = Path(cfg.from_run).resolve()
    quantise = cfg.quantise
    if any(condition.startswith("L") for condition in conditions):
        # As each offloaded run's backend will decide it (a missing offload device fails here, too).
        quantise = make_backend(cfg.offload_device, 1, phase_a.image_size, from_run / "offload",
                                precision="int8", quantise=cfg.quantise).quantise
    wanted_eval = {"seeds": cfg.eval_seeds, "max_steps": cfg.eval_max_steps,
                   "replan_every": cfg.eval_replan_every or chunk}
    out = cfg.out or from_run / "study"
    out.mkdir(parents=True, exist_ok=True)
    with exclusive_writer(out, "study"):  # two studies writing one directory would race on its runs
        runs = []
        for seed in seeds:
            for name, condition, cache_dtype in entries:
                phase_b, wanted, run_dir = condition_run(cfg, phase_a, out, condition, seed, quantise, cache_dtype)
                # A run cut short (Ctrl-C, a crash, --max-seconds) continues from its last checkpoint.
                started = _finished(run_dir / "checkpoint.json", wanted,
                                    lambda: run_settings(read_run(run_dir).options))
                summary = run_dir / "summary.json"
                if not (started and summary.is_file() and read_summary(summary).steps >= cfg.steps):
                    job = dataclasses.replace(phase_b, resume=run_dir) if started else dataclasses.replace(phase_b, out=run_dir)
                    try:
                        call_in_own_process(train_with_every_core, job, name="phase-b")
                    except RuntimeError as e:
                        raise RuntimeError(f"Phase B {condition} seed {seed} failed; finished conditions are kept "
                                           f"in {out}") from e
                eval_dir = run_dir / "eval" / f"{cfg.eval_seeds.replace(',', '_')}-{digest(wanted_eval)}"
                results = eval_dir / "results.json"
                if not _finished(results, wanted_eval, lambda: eval_settings(json.loads(results.read_text()))):
                    evaluate(EvalConfig(run=run_dir, seeds=cfg.eval_seeds, workers=cfg.eval_workers, videos=cfg.videos,
                                        max_steps=cfg.eval_max_steps, replan_every=cfg.eval_replan_every, out=eval_dir),
                             progress)
                runs.append({"condition": name, "seed": seed, "run": str(run_dir), "eval": str(eval_dir)})
        measured = None
        offloaded = sorted(int(c[1:]) for c in conditions if c.startswith("L"))
        if cfg.fidelity and offloaded:
            measured = dataclasses.asdict(phase_a_fidelity(
                from_run, offloaded, quantise=cfg.quantise,
                calibration_episodes=parse_seeds(cfg.calibration_episodes, "--calibration-episodes"),
                heldout_episodes=parse_seeds(cfg.heldout_episodes, "--heldout-episodes")))
        return write_study_report(out, {"runs": runs, "fidelity": measured})


def condition_run(cfg: StudyConfig, phase_a: ARActorRun, out: Path, condition: str, seed: int,
                  quantise: QuantiseConfig, cache_dtype: str = "fp16") -> tuple[PhaseBConfig, dict, Path]:
    """The Phase-B run the study trains for a condition and seed from the Phase-A run `phase_a`, the
    settings that shape its results, and its directory (named by them)."""
    phase_b = PhaseBConfig(from_run=Path(cfg.from_run).resolve(), condition=condition, seed=seed, steps=cfg.steps,
                           lr=cfg.lr, lr_decay=cfg.lr_decay, train_episodes=cfg.train_episodes,
                           calibration_episodes=cfg.calibration_episodes, offload_device=cfg.offload_device,
                           cache_dtype=cache_dtype, quantise=quantise, power_interval=cfg.power_interval,
                           power_command=cfg.power_command, power_pattern=cfg.power_pattern,
                           power_device=cfg.power_device)
    phase_b = with_phase_a_schedule(phase_b, phase_a)  # as the run will store it
    wanted = run_settings(json.loads(json.dumps(dataclasses.asdict(phase_b), default=str)))
    return phase_b, wanted, out / f"{study_name(condition, cache_dtype)}-s{seed}-{digest(wanted)}"


def _finished(record: Path, wanted: dict, stored) -> bool:
    """Whether `record` (a finished run's or evaluation's file) exists with the wanted settings;
    `stored()` reads the settings it was made with. Refuses one made with others."""
    if not record.is_file():
        return False
    differing = _differences(stored(), wanted)
    if differing:
        name, had, asked = differing[0]
        raise UserError(f"{record.parent} was made with {name} {had!r}, but its name is that of {name} {asked!r}, "
                        "as asked (was it edited by hand?); move it away and run the study again")
    return True


def _differences(had: dict, asked: dict, prefix: str = "") -> list[tuple[str, object, object]]:
    """(dotted name, had, asked) of every setting that differs, nested settings (quantise) by their parts."""
    differing = []
    for key in sorted(had.keys() | asked.keys()):
        a, b = had.get(key), asked.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            differing += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            differing.append((f"{prefix}{key}", a, b))
    return differing


def phase_a_fidelity(run_dir: Path, boundaries, dataset: Path | None = None, *,
                     calibration_episodes=CALIBRATION_EPISODES, heldout_episodes=HELDOUT_EPISODES,
                     **options) -> Fidelity:
    """`fidelity` of a Phase-A run's encoder on its own dataset (or `dataset`); the INT8 prefixes
    go to RUN/offload, where Phase B finds them."""
    check_held_out(calibration_episodes, heldout_episodes)  # before the model is loaded
    model, run = load_policy(Path(run_dir))
    dataset = dataset or run.dataset()
    if dataset is None:
        raise UserError(f"{run_dir}: the run does not name its dataset; pass the cube-transfer dataset (--dataset)")
    check_recording(load_info(Path(dataset)), Path(dataset), run.image_size, run.render_quality, f"run {run_dir}")
    return fidelity(model.visual, run.image_size, Path(run_dir) / "offload", dataset, boundaries,
                    calibration_episodes=calibration_episodes, heldout_episodes=heldout_episodes, **options)
