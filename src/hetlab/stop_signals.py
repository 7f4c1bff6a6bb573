"""Stopping a command cleanly on SIGINT (Ctrl-C), SIGTERM (a scheduler preempting the job, `kill`,
`timeout`) and SIGHUP (its terminal closed), every command alike.

`hetlab.cli.main` runs each command inside `handled()`: there the first of these signals raises
KeyboardInterrupt, as Ctrl-C does by default, so the command unwinds through its cleanup. A loop
with safe points to stop at (training between iterations or steps, where a checkpoint is
consistent) runs inside `stop_guard()` instead: there the first signal only sets the Event the
guard yields, which the loop checks at those points before it writes its checkpoint and returns.
Either way `handled()` then prints the command that continues the job, if the command named one
(`resume_with`), and exits with 128 + the signal's number (INT 130, TERM 143, HUP 129), the status
a shell reports for a process the signal ended, so a scheduler sees a preempted job. A second
signal exits at once with its own such status; what was written stays whole (checkpoints and
dataset episodes are written atomically).

A signal ignored where a scope begins (under `nohup`, or in a child process whose parent decides
when it stops) stays ignored. The runtime's child processes ignore all three
(`ignore_stop_signals`): a terminal, `timeout` and `kill -TERM -PGID` signal the whole process
group, and each parent stops its children itself, after its own last checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_received: int | None = None  # the first stop signal of this command
_stop: threading.Event | None = None  # the innermost stop_guard's event; None: the signal raises
_resume: str | None = None  # the command that continues the job, once the job has named it
_installed_by: int | None = None  # the process that installed the handler


def _on_signal(signum: int, _frame) -> None:
    global _received
    if os.getpid() != _installed_by:
        return  # a forked child (a DataLoader worker) inherits the handler; its parent stops it
    if _received is not None:
        # os.write, not print: the main thread may be inside a print when the handler runs.
        os.write(2, f"\n{signal.Signals(signum).name} while stopping: exiting at once\n".encode())
        os._exit(128 + signum)
    _received = signum
    if _stop is None:
        raise KeyboardInterrupt
    _stop.set()
    os.write(2, f"\n{signal.Signals(signum).name}: stopping at the next safe point (another signal exits at once)\n"
                .encode())


def _install() -> dict[int, object]:
    """Our handler for every stop signal not ignored; returns the handlers it replaced."""
    global _installed_by
    _installed_by = os.getpid()
    return {signum: signal.signal(signum, _on_signal) for signum in STOP_SIGNALS
            if signal.getsignal(signum) is not signal.SIG_IGN}


def _restore(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@contextmanager
def handled():
    """A whole command's scope: a stop signal ends it as Ctrl-C does, with the exit status of the
    signal and, where the command named it, the command that continues the job."""
    global _received, _resume
    _received, _resume = None, None
    previous = _install()
    try:
        yield
    except KeyboardInterrupt:
        pass  # the status below says which signal it was
    else:
        if _received is None:
            return
    finally:
        _restore(previous)
    if _resume is not None:
        print(f"resume with: {_resume}", file=sys.stderr, flush=True)
    sys.exit(128 + (_received or signal.SIGINT))


@contextmanager
def stop_guard():
    """An Event that the first stop signal sets instead of raising KeyboardInterrupt, for the block's
    duration (only in the main thread, as Python runs signal handlers there). After a stop the
    handlers stay, so a second signal exits at once until the command ends."""
    global _stop
    stop, outer = threading.Event(), _stop
    _stop = stop
    previous = _install()  # again: a library may have put its own in place since (ray.init does)
    try:
        yield stop
    finally:
        _stop = outer
        if not stop.is_set():
            _restore(previous)


def resume_with(command: str) -> None:
    """Name the command that continues the job from what it has written so far (a job names it once it
    has a checkpoint); `handled()` prints it when a stop signal ended the command, and the CLI when a
    refusal did (a full disk)."""
    global _resume
    _resume = command


def named_resume() -> str | None:
    """The command that continues the job, if it named one."""
    return _resume


def ignore_stop_signals() -> None:
    """For a child process: the signals that reach its whole process group leave the stopping to its parent."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
