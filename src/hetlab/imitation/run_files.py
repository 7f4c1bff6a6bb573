"""An AR-Actor run's files (Phase A or B), read with one-line errors: its config.json as an `ARActorRun`
(the model, the images, the phase's options), a Phase-B run's summary.json as a `PhaseBSummary`, an
evaluation's results.json as `EvaluationResults`, its checkpoints and the weights they hold."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hetlab.checkpoint import load_checkpoint
from hetlab.errors import UserError
from hetlab.imitation.presets import PhaseAConfig
from hetlab.policies.ar_actor import ARActor, ARActorConfig
from hetlab.run_config import AR_ACTOR_KIND as RUN_KIND, read_config_json
from hetlab.train.loggers import TrackerOptions


def read_run_config(run_dir: Path) -> dict:
    """config.json of a Phase-A or Phase-B run, without loading its weights."""
    config = read_config_json(run_dir, f"runs/{RUN_KIND}/<timestamp>")
    if config.get("kind") != RUN_KIND:
        kind = f"kind {config['kind']!r}" if "kind" in config else "a run of `hetlab train`"
        raise UserError(f"{run_dir}: not an AR-Actor run ({kind}); pass runs/{RUN_KIND}/<timestamp>")
    return config


@dataclass(frozen=True)
class ARActorRun:
    """What a Phase-A or Phase-B run's config.json records, read once (`read_run`)."""

    run_dir: Path
    phase: str  # "A" or "B"
    model: ARActorConfig
    image_size: tuple[int, int]  # height, width of its images
    render_quality: str  # of its images ("high" for runs from before the setting)
    options: dict  # the phase's own, as recorded: `phase_a_options()`; phase_b.py reads Phase B's

    @classmethod
    def from_json(cls, config: dict, run_dir: Path) -> ARActorRun:
        try:
            phase = config["phase"]
            return cls(Path(run_dir), phase, ARActorConfig(**config["model"]), tuple(config["image_size"]),
                       run_render_quality(config), config[f"phase_{phase.lower()}"])
        except (KeyError, TypeError, AttributeError) as e:  # an edited file, or one another hetlab version wrote
            raise UserError(f"{Path(run_dir) / 'config.json'} does not hold what an AR-Actor run records ({e!r}); "
                            "restore it from a copy of the run, or start a new run") from e

    @property
    def from_run(self) -> Path | None:
        """The Phase-A run whose encoder a Phase-B run froze (None for a Phase-A run)."""
        return Path(self.options["from_run"]) if self.phase == "B" else None

    @property
    def train_episodes(self) -> str:
        return self.options["train_episodes"]

    def phase_a_run(self) -> ARActorRun:
        """The Phase-A run: this one, or the one a Phase-B run came from."""
        return self if self.phase == "A" else read_run(self.from_run)

    def dataset(self) -> Path | None:
        """The demonstrations the Phase-A run trained on (None: the run does not name them)."""
        dataset = self.phase_a_run().options.get("dataset")
        return Path(dataset) if dataset is not None else None

    def phase_a_options(self) -> PhaseAConfig:
        """The options of the Phase-A run (this one, or the one a Phase-B run came from)."""
        phase_a = self.phase_a_run()
        return config_from_json(phase_a.options, phase_a.run_dir)


def read_run(run_dir: Path) -> ARActorRun:
    """A Phase-A or Phase-B run's config.json, typed, without loading its weights."""
    return ARActorRun.from_json(read_run_config(run_dir), run_dir)


@dataclass(frozen=True)
class PhaseBSummary:
    """What a Phase-B run's summary.json records (phase_b.py writes it), as the study reads it."""

    condition: str
    seed: int
    steps: int
    samples: int  # this launch's: its time, power and memory are measured over them
    stopped_by: str
    wall_s: float
    samples_per_s: float
    breakdown_s: dict[str, dict[str, float]]  # role (producer, learner) → stage → seconds
    encoder: dict  # how the frozen encoder ran: backend, precision, device, boundary
    power: list[dict]  # per device: what `DeviceEnergy` records
    energy_per_sample: dict  # per_device, combined, missing
    peak_memory: dict  # bytes, what
    cache: dict | None  # the feature cache's description (the cache conditions)


@dataclass(frozen=True)
class EvaluationResults:
    """What an evaluation's results.json records (evaluate.py writes it), as the study reads it."""

    seeds: str
    replan_every: int
    max_steps: int
    episodes: int
    successes: int
    success_rate: float
    wilson95: list[float]  # the success rate's 95 % interval
    per_seed: list[dict]  # seed, success


def read_summary(path: Path) -> PhaseBSummary:
    return _read_record(PhaseBSummary, path, "train the run again (`hetlab offload study` finishes it)")


def read_results(path: Path) -> EvaluationResults:
    return _read_record(EvaluationResults, path, "evaluate the run again (`hetlab offload study` finishes it)")


def _read_record(record: type, path: Path, fix: str):
    """The fields of `record` from the JSON file at `path`; UserError naming the file and `fix`."""
    try:
        data = json.loads(Path(path).read_text())
        return record(**{field.name: data[field.name] for field in dataclasses.fields(record)})
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror}); {fix}") from e
    except (ValueError, KeyError, TypeError) as e:  # not JSON, a field missing, not an object
        raise UserError(f"{path} does not hold what a {record.__name__} records ({e!r}); {fix}") from e


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


def run_render_quality(config: dict) -> str:
    """The render quality a Phase-A or Phase-B run's images were made at ("high" before the setting)."""
    return config.get("render_quality", "high")


def config_from_json(recorded: dict, run_dir: Path) -> PhaseAConfig:
    """The options a Phase-A run's config.json records (its "phase_a" entry)."""
    paths = {"dataset", "imagenet_weights", "runs_dir", "resume"}
    before_options = {"lr_decay": 0.0, "image_shift": 0}  # how runs from before these options trained
    try:
        options = before_options | recorded
        if "tracker" in options:  # runs from before the option logged to TensorBoard alone
            options["tracker"] = tracker_from_json(options["tracker"])
        return PhaseAConfig(**{k: Path(v) if k in paths and v is not None else v for k, v in options.items()})
    except (KeyError, TypeError, AttributeError) as e:  # an edited file, or one another hetlab version wrote
        raise UserError(f"{run_dir / 'config.json'} does not hold the Phase-A options this hetlab reads ({e!r}); "
                        "restore it from a copy of the run, or start a new run") from e


FLAGS = {"from_run": "from"}  # options the command line spells otherwise (cli/aloha.py)


def changed_option(given, restored, may_change: tuple[str, ...]) -> tuple[str, object, object] | None:
    """The first option `given` sets (away from its default) to another value than the resumed run's
    own (`restored`), outside `may_change`, as (flag, asked, own); None if there is none. A group's
    options (--quantise.*, the tracker's --logger, ...) count one by one."""
    defaults = type(given)()
    for option in dataclasses.fields(given):
        name = option.name
        value, default, own = getattr(given, name), getattr(defaults, name), getattr(restored, name)
        if name in may_change:
            continue
        if dataclasses.is_dataclass(value):
            prefix = "" if isinstance(value, TrackerOptions) else f"{name}."  # the tracker's flags have none
            pairs = [(prefix + f.name, getattr(value, f.name), getattr(default, f.name), getattr(own, f.name))
                     for f in dataclasses.fields(value)]
        else:
            pairs = [(name, value, default, own)]
        for flag, asked, unset, kept in pairs:
            if asked != unset and asked != kept:
                return f"--{FLAGS.get(flag, flag).replace('_', '-')}", asked, kept
    return None


def tracker_from_json(saved: dict) -> TrackerOptions:
    """The tracker options a config.json records (its tags a JSON list)."""
    return TrackerOptions(**{**saved, "tags": tuple(saved.get("tags", ()))})


def load_run(run_dir: Path, step: int | None = None) -> tuple[ARActorRun, dict]:
    """(config.json, newest checkpoint or the one of `step`) of a Phase-A or Phase-B run."""
    return read_run(run_dir), load_checkpoint(Path(run_dir), step)


def load_policy(run_dir: Path, step: int | None = None) -> tuple[ARActor, ARActorRun]:
    """A Phase-A run's trained AR-Actor (eval mode, CPU) at its newest checkpoint or `step`, and its config."""
    run = ARActorRun.from_json(read_phase_a_config(run_dir, "this reads a Phase-A run's whole model"), run_dir)
    state = load_checkpoint(Path(run_dir), step)
    model = ARActor(run.model)
    load_weights(model, state["model"], run_dir)
    return model.eval(), run


def load_weights(model: torch.nn.Module, weights: dict, source: Path) -> None:
    """load_state_dict with a one-line error naming the first mismatch (e.g. another model size)."""
    own = model.state_dict()
    for key, value in own.items():
        if key not in weights or weights[key].shape != value.shape:
            found = tuple(weights[key].shape) if key in weights else "missing"
            raise UserError(f"{source}: checkpoint does not fit this model: {key} is {found}, "
                            f"the model has {tuple(value.shape)} (trained with another model size?)")
    model.load_state_dict(weights)
