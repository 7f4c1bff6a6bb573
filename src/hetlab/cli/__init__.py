"""`hetlab <command>`: one entry point; each command is a function whose config dataclass tyro turns
into its options.

Only the command named on the command line is imported and has its parser built: `hetlab --help`
lists the commands from their docstrings, `hetlab train --help` builds train's parser alone. The
command modules (rl, train, aloha, offload) import configs and tyro only; each command imports
torch, MuJoCo, numpy and the rest when it runs, so no `--help` waits for them.
"""

from __future__ import annotations

import sys
from importlib import import_module

import hetlab
from hetlab.cli.parsing import Group, run
from hetlab.errors import UserError
from hetlab.files import no_space, out_of_space
from hetlab.stop_signals import handled, named_resume

DESCRIPTION = "Train robot policies with each stage on the device that suits it."
# Every command in the order `hetlab --help` lists them: name → the module of hetlab.cli defining it
# under that name (a command function, or a Group of subcommands).
COMMANDS = {"info": "rl", "tasks": "rl", "train": "train", "tune": "rl", "eval": "rl", "export": "rl", "play": "rl", "bench": "rl",
            "offload": "offload", "aloha": "aloha"}


def command(name: str):
    """The command function or Group called `name`."""
    return getattr(import_module(f"hetlab.cli.{COMMANDS[name]}"), name)


def every_command() -> Group:
    """`hetlab` as a group of every command (what `hetlab --help` lists), every command module imported."""
    return Group(DESCRIPTION, {name: command(name) for name in COMMANDS})


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        print(f"hetlab {hetlab.__version__}")
        return
    try:
        with handled():  # SIGINT, SIGTERM and SIGHUP stop any command cleanly, with status 128 + the signal
            if args[:1] == ["train"]:  # its options follow the rest of the command line: the chosen algorithm's
                from hetlab.cli.train import train_command

                run("hetlab train", train_command(args[1:]), args[1:])
            elif args and args[0] in COMMANDS:
                run(f"hetlab {args[0]}", command(args[0]), args[1:])
            else:  # --help, or no command or a misspelt one: the list of commands or tyro's error
                run("hetlab", every_command(), args)
    except (UserError, OSError) as e:
        # A write that found no room outside the files hetlab writes atomically (which say so themselves):
        # TensorBoard's event file, a log appended to.
        if isinstance(e, OSError) and not out_of_space(e):
            raise
        from rich.markup import escape

        from hetlab.cli.output import err_console

        message = str(e if isinstance(e, UserError) else no_space(e))
        err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        if named_resume() is not None:  # e.g. a disk that filled up: the job continues once there is room
            print(f"resume with: {named_resume()}", file=sys.stderr, flush=True)
        sys.exit(2)

