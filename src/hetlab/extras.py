"""hetlab's optional extras: which are installed, and importing what one provides.

A missing extra is a one-line UserError that names the pip command installing it.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata
from types import ModuleType

from hetlab.errors import UserError


def require(extra: str, module: str, needed_for: str) -> ModuleType:
    """`module`, imported; UserError saying `needed_for` needs it if it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{needed_for} needs {module!r}: pip install 'hetlab[{extra}]'") from e


def installed_extras() -> dict[str, bool]:
    """Each optional extra of hetlab, and whether everything it needs is installed."""
    meta = metadata.metadata("hetlab")
    extras = {}
    for extra in meta.get_all("Provides-Extra") or []:
        needs = [
            re.split(r"[\s;<>=!~\[]", req, maxsplit=1)[0]
            for req in meta.get_all("Requires-Dist") or []
            if re.search(rf"extra\s*==\s*['\"]{re.escape(extra)}['\"]", req)
        ]
        extras[extra] = all(_installed(name) for name in needs if name != "hetlab")
    return extras


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False
