"""One process at a time writes a run directory, a dataset or a study.

Two launches of `hetlab train --resume RUN` would both append to RUN's history and race to name
its newest checkpoint; two recordings into one dataset would both commit episode N. A directory's
writer holds an exclusive `flock` on a file in it for as long as it writes, and a second writer
is refused in one line. The kernel drops the lock when the holder exits, however it exits (kill -9
included), so a crash never leaves a directory locked; the next writer removes the temporary files
it left in the directory (those in subdirectories are their writers' to clean up: checkpoints,
dataset staging, evaluations written while the run trains).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from hetlab.errors import UserError
from hetlab.files import remove_temporaries

LOCK_FILE = ".writer.lock"


@contextmanager
def exclusive_writer(directory: Path | str, what: str):
    """Hold `directory`'s lock for the block; UserError at once if another process holds it.
    `what`: the directory in words ("run", "dataset", "study") for the refusal."""
    directory = Path(directory)
    handle = open(directory / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        raise UserError(f"{directory} is in use: another hetlab process{f' (pid {holder})' if holder else ''} is "
                        f"writing this {what}; wait for it to end or stop it, then run the command again") from None
    try:
        handle.truncate(0)
        handle.write(str(os.getpid()))
        handle.flush()
        remove_temporaries(directory)  # no other writer is alive: they are those of one killed mid-write
        yield
    finally:
        handle.close()  # drops the lock
