"""How much of an env step is physics: a task's env-steps/s against its backend's bare stepping.

Both loops run the same compiled model, with the same envs, substeps and threads, in
alternating rounds so that drift of a shared machine hits both alike. The plain loop
only steps the physics (for MuJoCo, `Batch.step`); the task loop runs the whole MDP (actions → PD targets →
physics → rewards → terminations → observations → auto-reset) on fixed random actions.

    task_efficiency = env_steps/s × substeps ÷ physics_substeps/s

is the share of the wall time that goes to physics; 1.0 means the task layer is free. The
plain loop holds the keyframe's controls, so its states are calm; the task's random actions
reach contact-rich states whose physics costs more (a LEAP hand tumbling its cube, a humanoid
falling), and that lowers task_efficiency too. `physics_share` separates the two: the share of
the task loop's own wall time spent inside the backend's step, on the states the task reached.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import mujoco
import numpy as np
from rich.progress import Progress

from hetlab.errors import UserError
from hetlab.sim import sim_backend
from hetlab.tasks import make_task


@dataclass(frozen=True)
class SimBenchConfig:
    """Measure physics substeps/s and task env-steps/s for one task."""

    task: str = "go1-joystick-flat"  # task to measure (`hetlab tasks` lists them)
    sim: str = "mujoco"  # physics backend
    envs: int = 1024  # envs stepped as one batch
    seconds: float = 10.0  # total measuring time, split over the rounds and both loops
    threads: int = 0  # physics threads; 0 = every core
    rounds: int = 3  # alternating physics/task rounds; results are medians over rounds
    json: bool = False  # print one JSON object instead of a table


def _rate(step, units_per_call: int, seconds: float) -> float:
    """Calls `step` for `seconds` of wall time; returns units per second."""
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step(calls)
        calls += 1
    return calls * units_per_call / elapsed


def run_sim_bench(cfg: SimBenchConfig, progress: Progress | None = None) -> dict:
    if cfg.seconds <= 0 or cfg.rounds < 1:
        raise UserError(f"--seconds must be > 0 and --rounds ≥ 1, got {cfg.seconds} and {cfg.rounds}")
    task = make_task(cfg.task, num_envs=cfg.envs, sim=cfg.sim, threads=cfg.threads, seed=0)
    task.reset()
    threads = task.sim.threads
    # Standing still on its keyframe controls.
    plain = sim_backend(cfg.sim).bare_physics(task.build_model(task.cfg), cfg.envs, threads, task.keyframe)
    actions = np.random.default_rng(0).uniform(-1, 1, (16, cfg.envs, task.action_size)).astype(np.float32)
    substeps = task.substeps

    def physics_step(i: int) -> None:
        plain(substeps)

    physics_seconds = 0.0
    backend_step = task.sim.step

    def timed_backend_step(*args, **kwargs):
        nonlocal physics_seconds
        start = time.perf_counter()
        diverged = backend_step(*args, **kwargs)
        physics_seconds += time.perf_counter() - start
        return diverged

    task.sim.step = timed_backend_step  # this task object only lives for the benchmark

    def task_step(i: int) -> None:
        task.step(actions[i % len(actions)])

    physics_step(0), task_step(0)  # warm up both before timing
    slot = cfg.seconds / (2 * cfg.rounds)
    physics, env, share = [], [], []
    job = progress.add_task(f"{cfg.task} × {cfg.envs} envs", total=cfg.rounds) if progress else None
    for _ in range(cfg.rounds):
        physics.append(_rate(physics_step, cfg.envs * substeps, slot))
        physics_seconds, start = 0.0, time.perf_counter()
        env.append(_rate(task_step, cfg.envs, slot))
        share.append(physics_seconds / (time.perf_counter() - start))
        if progress:
            progress.advance(job)
    efficiency = [e * substeps / p for e, p in zip(env, physics)]
    return {
        "task": cfg.task,
        "sim": cfg.sim,
        "envs": cfg.envs,
        "threads": threads,
        "substeps": substeps,
        "seconds": cfg.seconds,
        "rounds": cfg.rounds,
        "physics_steps_per_s": statistics.median(physics),
        "env_steps_per_s": statistics.median(env),
        "task_efficiency": statistics.median(efficiency),
        "physics_share": statistics.median(share),
        "per_round": {"physics_steps_per_s": physics, "env_steps_per_s": env, "task_efficiency": efficiency,
                      "physics_share": share},
        "mujoco": mujoco.__version__,
    }
