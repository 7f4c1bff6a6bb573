"""The learning rate over a run's steps, shared by Phase A and Phase B: constant, then falling linearly
to 0 over the last share of the steps. A function of the step, so a resumed run follows it exactly."""

from __future__ import annotations

from hetlab.errors import UserError


def check_schedule(lr: float | None, lr_decay: float | None) -> None:
    """UserError for a learning rate or decay share that cannot train (None: unset)."""
    if lr is not None and not lr > 0:
        raise UserError(f"--lr must be > 0, got {lr}")
    if lr_decay is not None and not 0 <= lr_decay <= 1:
        raise UserError(f"--lr-decay is a share of the steps, from 0 to 1; got {lr_decay}")


def learning_rate(step: int, lr: float, lr_decay: float, steps: int) -> float:
    """The rate of optimizer step `step` of `steps`: `lr`, then falling linearly to 0 over the last
    `lr_decay` share of the steps (a function of the step, so a resumed run follows it exactly)."""
    decay_steps = lr_decay * steps
    return lr if decay_steps <= 0 else lr * min(1.0, (steps - step) / decay_steps)
