"""What "solved" means for a task: conditions on a deterministic evaluation's per-episode means.

A task lists its `solved` criteria in its own file; `hetlab eval`, `--eval-every` and
`--until-solved` judge an evaluation by them. Each names an evaluation metric: `return`,
`survival` (the share of episodes that ran to their time limit, or a clip's end, without a
termination), or one of the task's episode metrics (`Task._episode_metrics`, e.g. `goals`, or a
reward term's per-step mean that `Task.tracked_terms` asks for).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Criterion:
    metric: str  # an evaluation metric (see the module docstring)
    threshold: float
    at_least: bool = True  # passes at value ≥ threshold; False: at value ≤ threshold

    def passes(self, value: float) -> bool:
        # NaN (no episode gave the metric) passes neither way.
        return value >= self.threshold if self.at_least else value <= self.threshold

    def __str__(self) -> str:
        return f"{self.metric} {'≥' if self.at_least else '≤'} {self.threshold:g}"


def judge(criteria: tuple[Criterion, ...], metrics: dict[str, float]) -> list[dict]:
    """Each criterion with the evaluation's value and whether it passes; a metric the evaluation
    lacks is a bug in the task's definition, not a failed criterion."""
    missing = [c.metric for c in criteria if c.metric not in metrics]
    if missing:
        raise KeyError(f"the evaluation has no metric {', '.join(missing)}; it has {', '.join(sorted(metrics))}")
    return [{"criterion": str(c), "metric": c.metric, "threshold": c.threshold, "at_least": c.at_least,
             "value": metrics[c.metric], "passed": c.passes(metrics[c.metric])} for c in criteria]


# A legged robot walks on command: ≥ 95 % of episodes reach the time limit, and the per-step means of
# the unweighted velocity-tracking kernels (exp(−error² / σ²)) are ≥ 0.75 (planar) and ≥ 0.6 (yaw).
# (Holosoma's nightly gates on the same kernels: 0.55 / 0.7 for PPO, 0.95 / 0.8 for FastSAC.)
WALKS_ON_COMMAND = (Criterion("survival", 0.95), Criterion("tracking_lin_vel", 0.75),
                    Criterion("tracking_ang_vel", 0.6))
