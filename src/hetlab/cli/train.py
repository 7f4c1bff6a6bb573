"""`hetlab train`, whose options are those of the algorithm the command line chooses (hetlab.train.command_line)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import tyro


def train(cfg, given: dict[str, str] | None = None) -> None:
    """Train a policy: CPU collectors feed a learner on the best device (prints the run directory first)."""
    from hetlab.train.command_line import as_train_config
    from hetlab.train.launch import train as run_training

    run_training(as_train_config(cfg), given)


def train_command(args: list[str]) -> Callable[..., None]:
    """`train` for the command line `args`: only the chosen algorithm's options, defaults from --config."""
    from hetlab.train.command_line import command_type, given_options

    command, defaults = command_type(args)

    def train_with_options(cfg=defaults) -> None:
        train(cfg, given_options(args))

    train_with_options.__doc__ = train.__doc__
    train_with_options.__annotations__ = {"cfg": Annotated[command, tyro.conf.arg(name="")], "return": None}
    return train_with_options
