"""Defaults sized for the learner device: what a CPU learner gets for the options not given.

`TrainConfig`'s and the algorithms' defaults are sized for an accelerator (FastSAC's batch of
8192 and 8 updates per env step, 1024 envs); on a CPU learner they make an update so slow that a
run of minutes can end without a finished episode. So each algorithm class declares
`cpu_defaults`: the values it uses on a CPU learner, keyed by the option's command-line name
without the dashes — a run-wide option (`envs`, `horizon`, `off_policy.replay_capacity`) or
one of its own group (`fastsac.batch_size`). `scale_defaults` applies them after the device
is picked, only to options that were not given (on the command line, in a --config file, to
`train_policy`) nor set by the task's recipe; an option given at its default value is given. An
accelerator learner, or `--no-scale-defaults`, keeps every default as it is. The launch
validates the result and writes it to config.json, so a resumed run keeps its resolved values on
any device.
"""

from __future__ import annotations

from collections.abc import Collection

from hetlab.algos import ALGO_CONFIGS
from hetlab.devices import LearnerDevice
from hetlab.train.config import TrainConfig, cli_option, option_path, option_value, options_set, with_option


def scale_defaults(cfg: TrainConfig, device: LearnerDevice,
                   fixed: Collection[str] | None = None) -> tuple[TrainConfig, dict[str, object]]:
    """(cfg with its algorithm's `cpu_defaults` for the options not in `fixed` when the learner
    is the CPU, {option: value} of the options that changed). `fixed`: the options given or set by
    a recipe, by name; None: those `cfg` sets away from their defaults."""
    if device.is_accelerator or not cfg.scale_defaults:
        return cfg, {}
    fixed = options_set(cfg) if fixed is None else set(fixed)
    scaled = {}
    for option, value in cfg.algorithm.cpu_defaults.items():
        head = option.split(".")[0]
        if head in ALGO_CONFIGS and head != cfg.algo:
            raise ValueError(f"{cfg.algo}.cpu_defaults sets {option!r}, an option of another algorithm")
        if option not in fixed and option_value(cfg, option) != value:
            cfg = with_option(cfg, option_path(option), value)
            scaled[option] = value
    return cfg, scaled


def scaled_line(scaled: dict[str, object]) -> str:
    """The line a run prints at its start when defaults were scaled for the CPU learner."""
    options = " ".join(cli_option(option, value) for option, value in scaled.items())
    return (f"CPU learner: defaults scaled for it: {options} (give an option another value to set it, "
            "or --no-scale-defaults for the accelerator-sized defaults)")
