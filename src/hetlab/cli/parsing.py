"""How a command line reaches a command: groups of subcommands, and tyro building the parser of the
one chosen from its function's config dataclass. A group lists its commands from their docstrings
alone, so `hetlab --help` and `hetlab aloha --help` build no command's parser."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Union

import tyro
from tyro.constructors import (
    ConstructorRegistry,
    PrimitiveConstructorSpec,
    PrimitiveTypeInfo,
    UnsupportedTypeAnnotationError,
)


@dataclass(frozen=True)
class Group:
    """Subcommands under one name (`hetlab aloha train`)."""

    description: str  # its line in the list of commands above it
    commands: dict[str, Callable | Group]  # name → a command function (its docstring is its help) or a group


def run(prog: str, target: Callable | Group, args: list[str]) -> None:
    """Run `target` on `args`: a command function through tyro; a group's subcommand that args[0]
    names, or the group's list of commands."""
    if not isinstance(target, Group):
        tyro.cli(target, prog=prog, args=args, registry=OPTION_RULES)
    elif args and args[0] in target.commands:
        run(f"{prog} {args[0]}", target.commands[args[0]], args[1:])
    else:
        list_commands(prog, target, args)


@dataclass(frozen=True)
class Listed:
    """A command in its group's list, which shows its name and description but not its options."""


def list_commands(prog: str, group: Group, args: list[str]) -> None:
    """`PROG --help`: the group's commands, each with its description; anything else (no command, a
    misspelt one) is tyro's error naming the choices."""
    choices = [Annotated[Listed, tyro.conf.subcommand(name, description=description(target))]
               for name, target in group.commands.items()]
    if len(choices) == 1:  # a Union of one type is that type; a suppressed second keeps the choice
        choices.append(Annotated[None, tyro.conf.Suppress])

    def choose(command) -> None:
        """Parsed to show the list or refuse the command line; a chosen command parses its own options."""

    # The Union as a function's parameter: given bare, tyro would search typing's source for its help.
    choose.__annotations__ = {"command": Annotated[Union[tuple(choices)], tyro.conf.arg(name="")], "return": None}
    tyro.cli(choose, prog=prog, description=group.description, args=args)


def description(target: Callable | Group) -> str:
    return target.description if isinstance(target, Group) else inspect.getdoc(target) or ""


# How tyro reads hetlab's options, beyond its own rules.
OPTION_RULES = ConstructorRegistry()


@OPTION_RULES.primitive_rule
def optional_rule(type_info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
    """An `X | None` option shows X's metavar alone (`--seed INT`, where tyro writes `{None}|INT`);
    its help says what leaving it unset means. `None` is still taken, for the options whose
    default is a value and None means something (`--ppo.desired-kl None`: a fixed learning rate)."""
    options = typing.get_args(type_info.type)
    if typing.get_origin(type_info.type) not in (Union, types.UnionType) or len(options) != 2 \
            or type(None) not in options:
        return None
    value_type = options[1] if options[0] is type(None) else options[0]
    spec = ConstructorRegistry.get_primitive_spec(PrimitiveTypeInfo.make(value_type, type_info.markers))
    if isinstance(spec, UnsupportedTypeAnnotationError):  # X is not one value (a dataclass, say): tyro's own rules
        return None
    return PrimitiveConstructorSpec(
        # `None` is one word, where a value may take several
        nargs=(1, spec.nargs) if isinstance(spec.nargs, int) and spec.nargs > 1 else spec.nargs,
        metavar=spec.metavar,
        instance_from_str=lambda strings: None if strings == ["None"] else spec.instance_from_str(strings),
        is_instance=lambda value: value is None or spec.is_instance(value),
        str_from_instance=lambda value: ["None"] if value is None else spec.str_from_instance(value),
        choices=None if spec.choices is None else (*spec.choices, "None"),
    )
