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

`--sim all` measures every physics backend installed here on the same task, its rounds
interleaved with the others' so that they compare side by side, and names the ones it skipped.
"""

from __future__ import annotations

import statistics
import time

import mujoco
import numpy as np
from rich.progress import Progress

from hetlab.errors import UserError
from hetlab.sim import sim_backend
from hetlab.sim.bench_config import SimBenchConfig
from hetlab.tasks import make_config, make_task


def _rate(step, units_per_call: int, seconds: float) -> float:
    """Calls `step` for `seconds` of wall time; returns units per second."""
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step(calls)
        calls += 1
    return calls * units_per_call / elapsed


class _BackendBench:
    """One backend's task and bare physics, measured a round at a time."""

    def __init__(self, cfg: SimBenchConfig, sim: str):
        self.sim = sim
        self.task = make_task(cfg.task, num_envs=cfg.envs, sim=sim, threads=cfg.threads, seed=0)
        self.task.reset()
        task = self.task
        # Standing still on its keyframe controls.
        self.plain = sim_backend(sim).bare_physics(task.physics_spec(task.cfg), cfg.envs, task.sim.threads, task.keyframe)
        self.actions = np.random.default_rng(0).uniform(-1, 1, (16, cfg.envs, task.action_size)).astype(np.float32)
        self.physics_seconds = 0.0
        backend_step = task.sim.step

        def timed_backend_step(*args, **kwargs):
            start = time.perf_counter()
            diverged = backend_step(*args, **kwargs)
            self.physics_seconds += time.perf_counter() - start
            return diverged

        task.sim.step = timed_backend_step  # this task object only lives for the benchmark
        self.physics, self.env, self.share = [], [], []
        self._physics_step(0), self._task_step(0)  # warm up both before timing

    def _physics_step(self, i: int) -> None:
        self.plain(self.task.substeps)

    def _task_step(self, i: int) -> None:
        self.task.step(self.actions[i % len(self.actions)])

    def round(self, seconds: float) -> None:
        envs = self.task.num_envs
        self.physics.append(_rate(self._physics_step, envs * self.task.substeps, seconds))
        self.physics_seconds, start = 0.0, time.perf_counter()
        self.env.append(_rate(self._task_step, envs, seconds))
        self.share.append(self.physics_seconds / (time.perf_counter() - start))

    def result(self, cfg: SimBenchConfig) -> dict:
        substeps = self.task.substeps
        efficiency = [e * substeps / p for e, p in zip(self.env, self.physics)]
        return {
            "task": cfg.task,
            "sim": self.sim,
            "envs": cfg.envs,
            "threads": self.task.sim.threads,
            "substeps": substeps,
            "seconds": cfg.seconds,
            "rounds": cfg.rounds,
            "physics_steps_per_s": statistics.median(self.physics),
            "env_steps_per_s": statistics.median(self.env),
            "task_efficiency": statistics.median(efficiency),
            "physics_share": statistics.median(self.share),
            "per_round": {"physics_steps_per_s": self.physics, "env_steps_per_s": self.env,
                          "task_efficiency": efficiency, "physics_share": self.share},
            "mujoco": mujoco.__version__,
        }


def run_sim_bench(cfg: SimBenchConfig, progress: Progress | None = None) -> dict:
    """One backend: its result. `--sim all`: {"results": one per usable backend, "unavailable":
    backend → why}, the backends' rounds interleaved."""
    if cfg.seconds <= 0 or cfg.rounds < 1:
        raise UserError(f"--seconds must be > 0 and --rounds ≥ 1, got {cfg.seconds} and {cfg.rounds}")
    unavailable = {}
    for name in cfg.sims():
        try:
            make_config(cfg.task, num_envs=cfg.envs, sim=name, threads=cfg.threads)
        except UserError as e:
            if cfg.sim != "all":
                raise
            unavailable[name] = str(e)
    benches = [_BackendBench(cfg, name) for name in cfg.sims() if name not in unavailable]
    slot = cfg.seconds / (2 * cfg.rounds)
    job = progress.add_task(f"{cfg.task} × {cfg.envs} envs", total=cfg.rounds * len(benches)) if progress else None
    for _ in range(cfg.rounds):
        for bench in benches:
            bench.round(slot)
            if progress:
                progress.advance(job)
    results = [bench.result(cfg) for bench in benches]
    if cfg.sim != "all":
        return results[0]
    return {"task": cfg.task, "envs": cfg.envs, "results": results, "unavailable": unavailable}
