"""`hetlab train`'s command line: one algorithm's options at a time, on top of a config file.

The command line shows and accepts only the chosen algorithm's `--<algo>.*` group (`hetlab train
--algo sac --help` lists SAC's options, not the five others'); an option of another algorithm is
refused in one line rather than ignored. `--config FILE` makes a file's options the starting
point (a run's config.json, or TOML in the same layout) and the options given beside it override
them. The algorithm is the one `--algo` names, else the config file's, else the task's recipe's
(train/recipes.py), else PPO; a resumed run (`--resume` without `--algo`) keeps its own.
`given_options` says which options the command line and the file set, so that what was not given
can take the recipe's, the CPU-sized or the resumed run's value.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import tyro

from hetlab.algos import ALGO_CONFIGS
from hetlab.errors import UserError
from hetlab.train.config import (AlgoConfigs, TrainConfig, every_option, option_names, read_config_data,
                                 read_config_file)
from hetlab.train.recipes import RECIPES


def command_type(args: list[str]) -> tuple[type, object]:
    """The config type `hetlab train ARGS` parses (TrainConfig with only the chosen algorithm's
    options) and its defaults (a --config file's values, else TrainConfig's)."""
    config_file = _value_of("--config", args)
    base = read_config_file(Path(config_file)) if config_file else TrainConfig()
    algo = _value_of("--algo", args)
    if algo is None and not _value_of("--resume", args):
        recipe = RECIPES.get(_value_of("--task", args) or base.task)
        in_file = config_file is not None and "algo" in option_names(read_config_data(Path(config_file)))
        algo = recipe.algo if recipe is not None and not in_file else base.algo
    # A resumed run's algorithm (None here) is its own, checked with its other options when the run
    # is read; an unknown --algo is tyro's to refuse, naming the choices. Both parse every group.
    if algo not in ALGO_CONFIGS:
        return TrainConfig, base
    for arg in args:
        for other in ALGO_CONFIGS:
            if other != algo and arg.startswith(f"--{other}."):
                raise UserError(f"{arg.split('=')[0]} is an option of --algo {other}, and this run trains {algo}: "
                                f"give --algo {other}, or drop it")
    command, command_algos = _config_types_for(algo, base)
    return command, _converted(base, command, command_algos)


def given_options(args: list[str]) -> dict[str, str]:
    """The options `hetlab train ARGS` sets, by name (`envs`, `ppo.gamma`, `ray_pool.collectors`),
    each with where: "command line", or "config file" for those only the --config file sets. An
    option given at its default value is given."""
    config_file = _value_of("--config", args)
    given = dict.fromkeys(option_names(read_config_data(Path(config_file))), "config file") if config_file else {}
    for arg in args:
        if not arg.startswith("--") or arg == "--":
            continue
        name = arg[2:].split("=", 1)[0].replace("-", "_")
        if name.startswith("ray."):
            name = "ray_pool." + name.removeprefix("ray.")
        elif name.startswith("no_") and name not in _OPTION_NAMES:  # a flag's negation: --no-scale-defaults
            name = name.removeprefix("no_")
        given[name] = "command line"
    return given


_OPTION_NAMES = frozenset(every_option())


def as_train_config(parsed) -> TrainConfig:
    """The TrainConfig of what a command type of `command_type` parsed."""
    return _converted(parsed, TrainConfig, AlgoConfigs)


def _value_of(option: str, args: list[str]) -> str | None:
    """The last value given to `option` (as `--x V` or `--x=V`), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
    return value


def _config_types_for(algo: str, base: TrainConfig) -> tuple[type, type]:
    """A TrainConfig whose command line holds only `algo`'s option group, and its AlgoConfigs. The
    other algorithms' options (`base`'s, which the run never reads) are class attributes of that
    AlgoConfigs rather than fields, so that tyro neither shows nor builds them."""
    config = ALGO_CONFIGS[algo]
    algos = dataclasses.make_dataclass(
        "AlgoConfigs", [(algo, config, dataclasses.field(default_factory=config))],
        namespace={name: getattr(base.algos, name) for name in ALGO_CONFIGS if name != algo}, frozen=True,
    )
    command = dataclasses.make_dataclass(
        "TrainConfig", [("algos", Annotated[algos, tyro.conf.arg(name="")], dataclasses.field(default_factory=algos))],
        bases=(TrainConfig,), frozen=True,
    )
    # Named as TrainConfig, whose source holds the comments tyro turns into each option's help.
    command.__doc__, command.__module__, command.__qualname__ = TrainConfig.__doc__, TrainConfig.__module__, "TrainConfig"
    return command, algos


def _converted(cfg, cls: type, algos_cls: type):
    """`cfg`'s options as a `cls` whose algorithm groups are an `algos_cls`."""
    options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(TrainConfig) if f.name != "algos"}
    algos = {f.name: getattr(cfg.algos, f.name) for f in dataclasses.fields(algos_cls)}
    return cls(**options, algos=algos_cls(**algos))
