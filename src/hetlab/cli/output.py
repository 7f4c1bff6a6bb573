"""What the commands print: JSON on stdout, tables and progress through rich, imported on first use
(the commands' help does not need it)."""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


def print_json(payload: dict | list) -> None:
    print(json.dumps(payload, indent=2))


@cache
def console() -> Console:
    from rich.console import Console

    return Console()


@cache
def err_console() -> Console:
    """Progress and errors: stderr, so that stdout holds a command's result alone (JSON where asked for)."""
    from rich.console import Console

    return Console(stderr=True)
