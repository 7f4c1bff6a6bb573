"""The scaling model behind `hetlab tune --explain`: a run's env-steps/s on N cores, with the learner on
the CPU or on an accelerator, extrapolated from one machine's stage measurements.

What it fits, from `hetlab tune`'s probes and end-to-end checks:
- a collector's step on one physics thread costs `a + b·envs`: `a` per step whatever the envs (the
  task's numpy calls, the actor's forward pass, the hand-over to the learner), `b` per env (physics);
  fitted through the envs per collector that tune probed;
- the learner's update on n torch threads costs `s + p/n` (Amdahl): `s` does not shrink with threads
  (Python, optimizer steps over small tensors); fitted through the thread counts probed;
- each iteration also pays what the end-to-end checks measured beyond the stages' prediction: the
  rollout through shared memory, the weights back, the processes waking each other. No core count
  shortens it.

On N cores, N collectors of one physics thread each split the envs; sync collects, then updates on
all N; async splits the cores between collectors and learner at the best point. An accelerator
learner's update takes `accelerator_update_s` (measured there, e.g. by benchmarks/gpu_check.sh;
0 gives the bound for any accelerator), with one core left to its host side under async. Async needs
two cores either way.

The ceilings are where many cores stop helping: collectors of ever fewer envs each approach
`envs / a` (the per-step cost no thread shares), and a sync iteration approaches its serial part,
`s + hand-over` on a CPU learner, the accelerator's update + hand-over on one. Collectors are
assumed to scale with cores as independent processes do; memory bandwidth and caches shared by
many cores are not in the model, which is why docs/benchmarks.md sets its predictions against
measurements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CORE_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128)  # what `--explain` predicts for, with the machine's own


@dataclass(frozen=True)
class ScalingModel:
    step_fixed_s: float  # a: a collector step's cost whatever its envs
    step_per_env_s: float  # b: per env, on one physics thread
    update_serial_s: float  # s: the update's part that more torch threads do not shorten
    update_parallel_s: float  # p: the part they share
    handover_s: float  # per iteration, beyond the stages
    envs: int
    horizon: int

    @property
    def samples(self) -> int:
        return self.envs * self.horizon

    def collect_rate(self, collectors: int) -> float:
        """Env-steps/s of `collectors` one-thread collectors stepping the run's envs between them."""
        per_collector = self.envs / collectors
        return collectors * per_collector / (self.step_fixed_s + self.step_per_env_s * per_collector)

    def update_s(self, threads: int) -> float:
        return self.update_serial_s + self.update_parallel_s / threads

    def cpu_learner(self, cores: int, mode: str) -> float | None:
        """Predicted env-steps/s on `cores` with the learner on the same CPU; None: async needs 2 cores."""
        if mode == "sync":
            return self.samples / (self.samples / self.collect_rate(cores) + self.update_s(cores) + self.handover_s)
        if cores < 2:
            return None
        return max(min(self.collect_rate(k), self.samples / (self.update_s(cores - k) + self.handover_s))
                   for k in range(1, cores))

    def accelerator_learner(self, cores: int, mode: str, update_s: float) -> float | None:
        """Predicted env-steps/s with the update on an accelerator taking `update_s`; None: async
        needs a core for the learner's host side besides the collectors'."""
        if mode == "sync":
            return self.samples / (self.samples / self.collect_rate(cores) + update_s + self.handover_s)
        if cores < 2:
            return None
        return min(self.collect_rate(cores - 1), self.samples / (update_s + self.handover_s))

    def ceilings(self, accelerator_update_s: float) -> dict[str, float]:
        """Env-steps/s no number of cores exceeds, and what sets each."""
        return {"collectors (per-step cost)": self.envs / self.step_fixed_s if self.step_fixed_s else float("inf"),
                "sync CPU learner (serial update + hand-over)": self.samples / (self.update_serial_s + self.handover_s)
                if self.update_serial_s + self.handover_s else float("inf"),
                "accelerator learner (update + hand-over)": self.samples / (accelerator_update_s + self.handover_s)
                if accelerator_update_s + self.handover_s else float("inf")}


def fit_scaling(collector: dict[tuple[int, int], float], update_seconds: dict[tuple[int, str], float],
                predicted: dict, measured: dict, envs: int, horizon: int) -> ScalingModel:
    """The model from tune's measurements: collector env-steps/s by (envs per collector, physics
    threads), update seconds by (torch threads, precision), and its settings' predicted and measured
    end-to-end env-steps/s (the hand-over is the median of what the measured ones took beyond)."""
    one_thread = sorted((e, e / rate) for (e, threads), rate in collector.items() if threads == 1)
    if not one_thread:
        raise ValueError("the scaling model needs a collector probed on one physics thread")
    a, b = _line([e for e, _ in one_thread], [t for _, t in one_thread])
    own = sorted((threads, t) for (threads, precision), t in update_seconds.items() if precision == "own")
    s, p = _line([1.0 / n for n, _ in own], [t for _, t in own])  # t = s + p·(1/n)
    samples = envs * horizon
    beyond = [samples / measured[setting] - samples / predicted[setting] for setting in measured]
    return ScalingModel(a, b, s, p, max(float(np.median(beyond)), 0.0) if beyond else 0.0, envs, horizon)


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points, both ≥ 0; through the origin
    where there is one x (nothing then tells a fixed cost apart)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(set(x.tolist())) < 2:
        return 0.0, float(np.mean(y / x))
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:  # a negative fixed cost: the points say "proportional"
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    if slope < 0:  # cost falling with size: the points say "fixed"
        return float(np.mean(y)), 0.0
    return float(intercept), float(slope)


def scaling_table(model: ScalingModel, cores: list[int], accelerator_update_s: float) -> list[dict]:
    """Each core count's predicted env-steps/s: CPU learner sync and async, accelerator learner sync and async."""
    return [{"cores": n, "cpu_sync": model.cpu_learner(n, "sync"), "cpu_async": model.cpu_learner(n, "async"),
             "accelerator_sync": model.accelerator_learner(n, "sync", accelerator_update_s),
             "accelerator_async": model.accelerator_learner(n, "async", accelerator_update_s)} for n in cores]
