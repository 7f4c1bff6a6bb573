"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: Path | str):
    """Yields a temporary path beside `path`; renames it over `path` if the block succeeds."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
