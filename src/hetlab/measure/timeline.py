"""Where the time goes: busy and waiting spans per stage, per process, per iteration.

Every process records spans `(stage, t0, t1)` with `time.perf_counter()`, which on Linux is
the system-wide monotonic clock, so spans from collectors, the stager thread and the learner
line up. The learner gathers them into a `Timeline` that keeps running totals per
(role, stage) over the whole run, and the raw spans of the most recent iterations for a
Chrome trace (chrome://tracing or ui.perfetto.dev). A resumed run's timeline continues the
earlier launches' totals and trace; each launch's spans follow the previous ones in the trace.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict, deque
from contextlib import contextmanager
from pathlib import Path

from hetlab.files import atomic_path, write_text_atomic

# Stages that do work; the rest is waiting.
BUSY_STAGES = ("env_step", "load", "inference", "write", "transfer", "encode", "update", "publish", "evaluate")
WAIT_STAGES = ("wait_slot", "wait_weights", "wait_data")


class SpanRecorder:
    """Collects (stage, t0, t1) spans in one process; `take()` hands them over and clears."""

    def __init__(self):
        self.spans: list[tuple[str, float, float]] = []

    @contextmanager
    def span(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spans.append((stage, t0, time.perf_counter()))

    def take(self) -> list[tuple[str, float, float]]:
        spans, self.spans = self.spans, []
        return spans


class Timeline:
    def __init__(self, trace_iterations: int = 20):
        self.start = time.perf_counter()
        self.totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.iterations: set[int] = set()
        self._recent: deque[list[tuple[str, str, float, float]]] = deque(maxlen=trace_iterations)
        self._earlier_iterations = 0
        self._earlier_events: list[dict] = []

    def continue_from(self, totals: dict[str, dict[str, float]], iterations: int, trace_events: list[dict]) -> None:
        """Start from an earlier launch's `summary()`, its iteration count and its Chrome trace events."""
        for role, stages in totals.items():
            for stage, seconds in stages.items():
                self.totals[role][stage] += seconds
        self._earlier_iterations = iterations
        self._earlier_events = [event for event in trace_events if event["ph"] == "X"]

    def add(self, iteration: int, role: str, spans: list[tuple[str, float, float]]) -> None:
        if iteration not in self.iterations:
            self.iterations.add(iteration)
            self._recent.append([])
        for stage, t0, t1 in spans:
            self.totals[role][stage] += t1 - t0
            self._recent[-1].append((role, stage, t0, t1))

    def fraction(self, role: str, stages: tuple[str, ...]) -> float:
        """Share of the role's recorded time spent in `stages` (0 when nothing was recorded)."""
        total = sum(self.totals[role].values())
        return sum(self.totals[role][s] for s in stages) / total if total else 0.0

    def summary(self) -> dict[str, dict[str, float]]:
        """Seconds per stage for every role, over the whole run."""
        return {role: dict(stages) for role, stages in self.totals.items()}

    def write_chrome_trace(self, path: Path) -> None:
        earlier = self._earlier_events
        roles = sorted({role for spans in self._recent for role, *_ in spans} | {e["args"]["role"] for e in earlier})
        events = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": role}}
            for tid, role in enumerate(roles)
        ]
        events += [{**event, "tid": roles.index(event["args"]["role"])} for event in earlier]
        # This launch's spans start a second after the earlier ones end.
        offset = max((e["ts"] + e["dur"] for e in earlier), default=-1e6) + 1e6
        for spans in self._recent:
            for role, stage, t0, t1 in spans:
                events.append({
                    "name": stage, "cat": "wait" if stage in WAIT_STAGES else "busy", "ph": "X",
                    "pid": 0, "tid": roles.index(role), "args": {"role": role},
                    "ts": offset + (t0 - self.start) * 1e6, "dur": (t1 - t0) * 1e6,
                })
        write_text_atomic(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))

    def seconds_per_iteration(self) -> dict[str, float]:
        """Each role's recorded seconds per iteration, its stages summed (run mean)."""
        iterations = max(1, self._earlier_iterations + len(self.iterations))
        return {role: sum(stages.values()) / iterations for role, stages in sorted(self.totals.items())}

    def wall_seconds_per_iteration(self) -> float:
        """Wall time per iteration of this launch, from its start to now."""
        return (time.perf_counter() - self.start) / max(1, len(self.iterations))

    def plot(self, path: Path, title: str) -> None:
        """Stacked bars: for each role, the seconds per iteration in each stage (run mean), each
        bar labelled with its total (a stage too short to see still reads as a number), against
        the wall time per iteration: what a bar lacks of it went unrecorded (the learner's logging,
        checkpoints and weight publishing; a collector's start-up)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        roles = sorted(self.totals)
        stages = [s for s in BUSY_STAGES + WAIT_STAGES if any(self.totals[r][s] for r in roles)]
        iterations = max(1, self._earlier_iterations + len(self.iterations))
        fig, ax = plt.subplots(figsize=(7, 0.6 * len(roles) + 1.8))
        left = [0.0] * len(roles)
        for stage in stages:
            widths = [self.totals[r][stage] / iterations for r in roles]
            hatch = "//" if stage in WAIT_STAGES else None
            ax.barh(roles, widths, left=left, label=stage, hatch=hatch)
            left = [a + b for a, b in zip(left, widths)]
        wall = self.wall_seconds_per_iteration()
        ax.axvline(wall, color="black", linestyle="--", linewidth=1, label="wall time per iteration")
        for row, seconds in enumerate(self.seconds_per_iteration().values()):
            ax.annotate(_milliseconds(seconds), (seconds, row), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize="small")
        ax.set_xlim(0, max(max(left, default=0.0), wall) * 1.15)
        ax.set_xlabel("seconds per iteration (mean over the run)")
        ax.set_title(title)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize="small")
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120)
        plt.close(fig)


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.2g} ms" if seconds < 0.01 else f"{seconds * 1e3:.0f} ms"
