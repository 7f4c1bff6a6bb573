"""`hetlab bench sim`'s options; hetlab.tasks.throughput does the measuring.

Here, below the task registry (whose import builds every task, with numpy and MuJoCo), so that the
command line builds its help without them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetlab.sim import SIMS


@dataclass(frozen=True)
class SimBenchConfig:
    """Measure physics substeps/s and task env-steps/s for one task."""

    task: str = "go1-joystick-flat"  # task to measure (`hetlab tasks` lists them)
    sim: str = "mujoco"  # physics backend, or "all": every backend usable here, side by side
    envs: int = 1024  # envs stepped as one batch
    seconds: float = 10.0  # total measuring time per backend, split over the rounds and both loops
    threads: int = 0  # physics threads; 0 = every core
    rounds: int = 3  # alternating physics/task rounds; results are medians over rounds
    json: bool = False  # print one JSON object instead of a table

    def sims(self) -> list[str]:
        return list(SIMS) if self.sim == "all" else [self.sim]
