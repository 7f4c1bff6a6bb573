"""Task registry: names → task classes, and `make_task` which builds model, sim and task."""

from __future__ import annotations

import dataclasses

from hetlab.devices import cpu_count
from hetlab.errors import UserError
from hetlab.sim import sim_backend
from hetlab.tasks.base import Task, TaskConfig
from hetlab.tasks.cartpole import CartpoleBalance
from hetlab.tasks.g1_track_motion import G1TrackMotion
from hetlab.tasks.g1_walk import G1WalkFlat
from hetlab.tasks.go1_joystick import Go1JoystickFlat
from hetlab.tasks.leap_cube_reorient import LeapCubeReorient
from hetlab.tasks.physics_step import check_physics_step

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (CartpoleBalance, Go1JoystickFlat, G1WalkFlat, G1TrackMotion,
                                                           LeapCubeReorient)}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; available: {', '.join(sorted(TASKS))} (see `hetlab tasks`)")
    return TASKS[name]


def make_config(name: str, **overrides) -> TaskConfig:
    """The task's config with `overrides`, validated before anything is built."""
    cfg = _validated_config(name, overrides)
    cls, backend = task_class(name), sim_backend(cfg.sim)
    if backend.needs is not None:
        # An engine other than MuJoCo may not read every part of the scene: one env, built now,
        # says which before any work starts.
        cls(backend.make(cls.physics_spec(cfg), 1, threads=cfg.threads, seed=cfg.seed, keyframe=cls.keyframe),
            dataclasses.replace(cfg, num_envs=1))
    return cfg


def _validated_config(name: str, overrides: dict) -> TaskConfig:
    cls = task_class(name)
    known = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UserError(f"task {name!r} has no option(s) {', '.join(unknown)}; options: {', '.join(sorted(known))}")
    cfg = cls.Config(**overrides)
    sim_backend(cfg.sim)
    if cfg.num_envs < 1:
        raise UserError(f"--envs must be at least 1, got {cfg.num_envs}")
    cores = cpu_count()
    if not 0 <= cfg.threads <= cores:
        raise UserError(f"--threads {cfg.threads} is outside 0..{cores} (0 = all {cores} cores); use at most {cores}")
    unknown_terms = sorted(set(cfg.reward_weights) - set(cls.rewards))
    if unknown_terms:
        raise UserError(f"task {name!r} has no reward term(s) {', '.join(unknown_terms)}; its terms: "
                        f"{', '.join(cls.rewards)} (`hetlab tasks --rewards` lists them with their weights)")
    parameters = {f"{term_name}.{parameter}" for term_name, term in cls.rewards.items() for parameter in term.params}
    unknown_parameters = sorted(set(cfg.reward_params) - parameters)
    if unknown_parameters:
        raise UserError(f"task {name!r} has no reward parameter(s) {', '.join(unknown_parameters)}; its parameters "
                        f"(TERM.PARAMETER): {', '.join(sorted(parameters)) or 'none'}")
    cls.check_assets(cfg)
    if cfg.sim_dt:
        check_physics_step(cls, cfg)
    return cfg


def make_task(name: str, **overrides) -> Task:
    """Build task `name` on its physics backend: e.g. make_task("cartpole-balance", num_envs=64)."""
    cls = task_class(name)
    cfg = _validated_config(name, overrides)  # building the sim below is the engine's own check
    sim = sim_backend(cfg.sim).make(cls.physics_spec(cfg), cfg.num_envs, threads=cfg.threads, seed=cfg.seed,
                                    keyframe=cls.keyframe)
    return cls(sim, cfg)


__all__ = ["TASKS", "Task", "TaskConfig", "make_config", "make_task", "task_class"]
