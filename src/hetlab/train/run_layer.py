"""The run layer under every training loop (`hetlab train`'s on- and off-policy loops, Phase A and
Phase B of `hetlab aloha train`): what a run does around its steps, written once.

- Stopping: inside the run, Ctrl-C, SIGTERM and SIGHUP set `interrupted` (stop_signals.stop_guard)
  and the loop stops before it takes its next batch; `stop_reason()` names that or the launch's time
  budget (`max_seconds`, counted from the launch's start), which the loop checks after each step.
- The record: history.json's rows and the loggers (TensorBoard, and the tracker --logger names),
  opened on entry and closed on exit, told whether the launch failed. A resumed run keeps the rows
  logged up to its checkpoint (this launch logs the later ones again) and its clock goes on from
  theirs, so a resume never shrinks what a run has written.
- The loop (`loop`): one for every run. It takes the run's data source and its update, and
  around them stops, logs through the run's own `after`, and checkpoints every
  `checkpoint_every` steps, at the last step and wherever a run stops off that cadence, never
  twice at one step. Each checkpoint writes the history first — a process killed between the
  two leaves rows the older checkpoint's resume drops and logs again, where the other order
  would leave a checkpoint whose rows are lost — and then names the command that continues it
  (stop_signals.resume_with), for a stop signal or a full disk to print.

A loop counts in its own unit (RL iterations, optimizer steps); `row_steps(row)` says how many of
them were done when a history row was logged, and `clock` names the rows' wall-clock column.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hetlab.checkpoint import KEEP, save_checkpoint
from hetlab.files import write_text_atomic
from hetlab.run_history import read_history, write_history
from hetlab.stop_signals import resume_with, stop_guard
from hetlab.train.loggers import TrackedRun, close_loggers, make_loggers


def row_scalars(row: dict, leave_out: tuple[str, ...]) -> dict[str, float]:
    """A history row as the loggers' scalars: every column but `leave_out`, under train/ unless it
    names its own group (eval/…, loss/…)."""
    return {key if "/" in key else f"train/{key}": value for key, value in row.items() if key not in leave_out}


class TrainingRun:
    def __init__(self, tracked: TrackedRun, resume_command: str, *, first_step: int, last_step: int,
                 checkpoint_every: int, max_seconds: float, row_steps: Callable[[dict], int], clock: str):
        self.run_dir, self.tracked, self.resume_command = tracked.run_dir, tracked, resume_command
        self.first_step, self.last_step = first_step, last_step
        self.checkpoint_every, self.max_seconds, self.clock = checkpoint_every, max_seconds, clock
        self.history = [row for row in read_history(self.run_dir) if row_steps(row) <= first_step] if first_step else []
        self.earlier_rows = len(self.history)
        self.wall_offset = self.history[-1][clock] if self.history else 0.0
        self.loggers = []
        self.saved_step = first_step  # the newest checkpoint's step
        self.started = time.perf_counter()

    def __enter__(self):
        with ExitStack() as entered:
            self.interrupted = entered.enter_context(stop_guard())
            self.loggers = make_loggers(self.tracked)
            self._guard = entered.pop_all()
        self.started = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        with self._guard:
            close_loggers(self.loggers, failed=exc_type is not None)

    def elapsed(self) -> float:
        """Seconds since this launch of the run started."""
        return time.perf_counter() - self.started

    def run_clock(self) -> float:
        """Seconds of the whole run: its earlier launches' and this one's."""
        return self.wall_offset + self.elapsed()

    def stop_reason(self) -> str | None:
        """"interrupted" after a stop signal, "max_seconds" once the launch's budget is spent, else None."""
        if self.interrupted.is_set():
            return "interrupted"
        if self.max_seconds and self.elapsed() >= self.max_seconds:
            return "max_seconds"
        return None

    def log(self, row: dict, scalars: dict[str, float], step: int) -> None:
        """A history row, and `scalars` to every logger at `step` (env steps in RL, optimizer steps)."""
        self.history.append(row)
        for logger in self.loggers:
            logger.scalars(scalars, step)

    @property
    def session_rows(self) -> list[dict]:
        """The rows this launch logged."""
        return self.history[self.earlier_rows:]

    def checkpoint_due(self, step: int) -> bool:
        return step % self.checkpoint_every == 0 or step == self.last_step

    def checkpoint(self, step: int, state: dict, keep: int = KEEP,
                   write_extra: Callable[[Path], None] | None = None) -> None:
        """The history, then `state` (and what `write_extra` adds) as the checkpoint of `step`, then the
        command that continues from it."""
        write_history(self.run_dir, self.history)
        save_checkpoint(self.run_dir, step, state, write_extra=write_extra, keep=keep)
        self.saved_step = step
        resume_with(self.resume_command)

    def loop(self, step: int, batches: Iterable, update: Callable[[int, Any], bool],
             after: Callable[[int], str | None], checkpoint: Callable[[int], None], *,
             completed: str, ended: Callable[[], str]) -> tuple[int, str]:
        """The training loop of every run, from `step` on: `update(step, batch)` learns from each batch
        of the data source and says whether that completed step `step` (an off-policy iteration takes
        several batches); `after(steps done)` logs it, does what the run's own cadence asks (evaluate,
        film, checkpoint a new best) and returns a reason to stop, if any. It also stops at a stop
        signal, the time budget, the end of `batches` (`ended()` says why) and the last step
        (`completed`). `checkpoint(step)` saves the run; it comes at the cadence and where the run
        stopped. Returns the steps done and why the loop stopped."""
        batches = iter(batches)
        while step < self.last_step:
            if self.interrupted.is_set():
                stopped_by = "interrupted"
                break
            batch = next(batches, None)
            if batch is None:
                stopped_by = self.stop_reason() or ended()
                break
            if not update(step, batch):
                continue
            step += 1
            stopped_by = after(step) or self.stop_reason()  # the budget after a step: every launch makes one
            if self.saved_step == step:  # the training checkpointed during `after`, maybe before its rows
                write_history(self.run_dir, self.history)
            elif self.checkpoint_due(step):
                checkpoint(step)
            if stopped_by is not None:
                break
        else:
            stopped_by = completed
        if self.saved_step != step:
            checkpoint(step)
        if stopped_by != completed:
            saved = ", with a checkpoint there" if step else ""  # a new run stopped before its first step has none
            print(f"{stopped_by}: stopped after step {step}{saved}", file=sys.stderr, flush=True)
        return step, stopped_by

    def finish(self, summary: dict) -> None:
        """summary.json and the history, at the end of a launch."""
        write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
        write_history(self.run_dir, self.history)
