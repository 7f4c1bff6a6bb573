"""Atomic, durable file writes: a reader sees the old file or the new one, never half of one, and
after a power cut the disk holds one of the two as well.

Each writer gets its own temporary name beside the target, so two processes writing one file
(evaluation workers preparing the same encoder file, say) never write into each other's
temporary file; the last rename wins, and either way the file is whole.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path

from hetlab.errors import UserError

# ".<target>.<token>.tmp<target's suffix>": the suffix stays last for writers that choose the format by
# it. Earlier versions used ".<target>.tmp<suffix>", which a crash may have left behind too.
_TEMPORARY = re.compile(r"\.(?P<target>.+?)(?:\.[0-9a-f]{16})?\.tmp(?P<suffix>(?:\.[^.]+)?)")


# How a full disk, a quota or a file-size limit (RLIMIT_FSIZE) shows: an OSError's errno; in the text
# of libraries that wrap it (safetensors' Rust "os error N"; numpy's short write "N requested and M written").
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NO_SPACE_TEXT = re.compile(r"os error (28|122|27)\b|No space left|Disk quota exceeded|File too large|"
                            r"\d+ requested and \d+ written")


def out_of_space(error: BaseException) -> bool:
    """Whether `error` is a write that found no room."""
    if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
        return True
    return isinstance(error, Exception) and _NO_SPACE_TEXT.search(str(error)) is not None


def no_space(error: BaseException, path: Path | str | None = None) -> UserError:
    """The one line for `error`, a write (of `path`, where known) that found no room."""
    return UserError(f"no space left to write {f'{path} ' if path is not None else ''}({error}); what was written "
                     "before it is intact: free space on its disk, then run again")


@contextmanager
def space_checked(path: Path | str):
    """A block that writes `path`: a write that found no room becomes one line naming the file."""
    try:
        yield
    except Exception as e:
        if out_of_space(e):
            raise no_space(e, path) from e
        raise


def temporary_sibling(path: Path | str, directory: bool = False) -> Path:
    """A new, empty file (or directory) beside `path` under a name no other writer has (permissions
    as for any new file: the umask's, not mkstemp's owner-only)."""
    path = Path(path)
    while True:
        candidate = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp{path.suffix}")
        try:
            if directory:
                candidate.mkdir()
            else:
                os.close(os.open(candidate, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return candidate


def temporary_target(path: Path | str) -> str | None:
    """The name of the file whose temporary `path` is (one a killed writer left behind), or None when
    `path` is not named as this module names temporary files."""
    match = _TEMPORARY.fullmatch(Path(path).name)
    return match["target"] if match is not None and match["target"].endswith(match["suffix"]) else None


def remove_temporaries(directory: Path | str) -> None:
    """Delete the temporary files writers killed mid-write left directly in `directory`."""
    for path in Path(directory).iterdir():
        if path.is_file() and temporary_target(path) is not None:
            path.unlink(missing_ok=True)


def fsync_file(path: Path | str) -> None:
    """Flush a written file's data to the disk (its writer closed it; the page cache still holds it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: Path | str) -> None:
    """Make the entries of a directory (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path | str) -> None:
    """fsync every file and directory under `root`, and `root` itself: before a directory is renamed into place."""
    for directory, _, files in os.walk(root):
        for name in files:
            fsync_file(Path(directory) / name)
        fsync_directory(directory)


@contextmanager
def atomic_path(path: Path | str):
    """Yields a temporary path beside `path`, this writer's own; if the block succeeds, the file is
    flushed to disk, renamed over `path`, and the rename made durable."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        with space_checked(path):
            yield tmp
            fsync_file(tmp)
        os.replace(tmp, path)
        fsync_directory(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
