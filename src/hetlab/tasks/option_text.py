"""Task options written as NAME=VALUE (`hetlab eval --task-option pushes=false`): each value is read
by the type its task's config declares, so a probe of a trained policy under other conditions (no
pushes, harder pushes, no randomisation) needs no code."""

from __future__ import annotations

import dataclasses
import typing

from hetlab.errors import UserError
from hetlab.tasks.base import Task

# Set by the evaluation itself (--episodes, --seed, --sim-dt; exact observations, its own threads and engine).
NOT_OVERRIDABLE = ("num_envs", "seed", "sim_dt", "obs_noise", "threads", "sim")
_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def parse_task_options(cls: type[Task], items: typing.Sequence[str]) -> dict:
    """{name: value} from NAME=VALUE items: bools (true/false), numbers, text and tuples of numbers
    (comma-separated); nested options and those in NOT_OVERRIDABLE are refused, naming what is allowed."""
    types = typing.get_type_hints(cls.Config)
    readers = {f.name: _reader(types[f.name]) for f in dataclasses.fields(cls.Config) if f.name not in NOT_OVERRIDABLE}
    allowed = {name: reader for name, reader in readers.items() if reader is not None}
    options = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in allowed:
            raise UserError(f"--task-option takes NAME=VALUE with NAME one of {', '.join(sorted(allowed))} "
                            f"(options of {cls.name}), got {item!r}")
        if name in options:
            raise UserError(f"--task-option {name} is given twice; give it once")
        try:
            options[name] = allowed[name](text)
        except ValueError:
            raise UserError(f"--task-option {item!r}: {name} takes {_describe(types[name])}") from None
    return options


def _reader(kind):
    if kind is bool:
        return _bool
    if kind in (int, float, str):
        return kind
    if typing.get_origin(kind) is tuple and all(arg in (int, float) for arg in typing.get_args(kind)):
        args = typing.get_args(kind)
        return lambda text: _tuple(text, args)
    return None


def _tuple(text: str, args: tuple) -> tuple:
    parts = text.split(",")
    if len(parts) != len(args):
        raise ValueError
    return tuple(arg(part) for arg, part in zip(args, parts))


def _bool(text: str) -> bool:
    if text.lower() not in _BOOLS:
        raise ValueError
    return _BOOLS[text.lower()]


def _describe(kind) -> str:
    if kind is bool:
        return "true or false"
    if typing.get_origin(kind) is tuple:
        return f"{len(typing.get_args(kind))} comma-separated numbers"
    return f"a value of type {kind.__name__}"
