"""Defaults sized for the learner device: what a CPU learner gets for the options left at their defaults.

`TrainConfig`'s and the algorithms' defaults are sized for an accelerator (FastSAC's batch of
8192 and 8 updates per env step, 1024 envs); on a CPU learner they make an update so slow that a
run of minutes can end without a finished episode. So each algorithm class declares
`cpu_defaults`: the values it uses on a CPU learner, keyed by the option's command-line name
without the dashes — a run-wide option (`envs`, `horizon`, `off_policy.replay_capacity`) or
one of its own group (`fastsac.batch_size`). `scale_defaults` applies them after the device
is picked, only to options whose value is still the class default; an accelerator learner, or
`--no-scale-defaults`, keeps every default as it is. The launch validates the result and
writes it to config.json, so a resumed run keeps its resolved values on any device.

An option given on the command line with exactly its default value cannot be told apart from one
not given (tyro hands over only the values), so on a CPU learner it is scaled too; the start line
names every scaled option, and `--no-scale-defaults` keeps the accelerator-sized defaults.
"""

from __future__ import annotations

import dataclasses

from hetlab.algos import ALGO_CONFIGS
from hetlab.devices import LearnerDevice
from hetlab.train.config import TrainConfig, with_option


def scale_defaults(cfg: TrainConfig, device: LearnerDevice) -> tuple[TrainConfig, dict[str, object]]:
    """(cfg with its algorithm's `cpu_defaults` for the options left at their defaults when the
    learner is the CPU, {option: value} of the options that changed)."""
    if device.is_accelerator or not cfg.scale_defaults:
        return cfg, {}
    default = TrainConfig()
    scaled = {}
    for option, value in cfg.algorithm.cpu_defaults.items():
        path = _path(option, cfg.algo)
        if _get(cfg, path) == _get(default, path) != value:
            cfg = with_option(cfg, path, value)
            scaled[option] = value
    return cfg, scaled


def scaled_line(scaled: dict[str, object]) -> str:
    """The line a run prints at its start when defaults were scaled for the CPU learner."""
    options = " ".join(f"--{option.replace('_', '-')} {_cli_value(value)}" for option, value in scaled.items())
    return (f"CPU learner: defaults scaled for it: {options} (give an option another value to set it, "
            "or --no-scale-defaults for the accelerator-sized defaults)")


def _path(option: str, algo: str) -> tuple[str, ...]:
    """The field path of a `cpu_defaults` key in TrainConfig: `fastsac.batch_size` → algos.fastsac.batch_size."""
    head, *rest = option.split(".")
    if head in ALGO_CONFIGS:
        if head != algo:
            raise ValueError(f"{algo}.cpu_defaults sets {option!r}, an option of another algorithm")
        return ("algos", head, *rest)
    return (head, *rest)


def _get(config, path: tuple[str, ...]):
    for name in path:
        if not dataclasses.is_dataclass(config) or name not in {f.name for f in dataclasses.fields(config)}:
            raise ValueError(f"cpu_defaults names {'.'.join(path)!r}, which is not a `hetlab train` option")
        config = getattr(config, name)
    return config


def _cli_value(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
