"""Physics backends behind the `BatchSim` contract (contract.py), chosen by name (`--sim`).

A backend is one module with a `BatchSim` class and its bare stepping, and one entry in `SIMS`.
Tasks, `hetlab play` and `hetlab bench sim` ask this registry for a sim, never a backend
directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mujoco

from hetlab.errors import UserError
from hetlab.sim import mujoco_batch
from hetlab.sim.contract import BatchSim


@dataclass(frozen=True)
class SimBackend:
    name: str
    # (model, num_envs, *, threads, seed, keyframe) -> BatchSim
    make: Callable[..., BatchSim]
    # (model, num_envs, threads, keyframe) -> step(substeps): the backend's own stepping and nothing
    # else, the baseline `hetlab bench sim` measures a task against
    bare_physics: Callable[[mujoco.MjModel, int, int, str | None], Callable[[int], None]]


SIMS = {backend.name: backend for backend in (
    SimBackend("mujoco", mujoco_batch.MujocoBatchSim, mujoco_batch.bare_physics),
)}


def sim_backend(name: str) -> SimBackend:
    if name not in SIMS:
        raise UserError(f"unknown physics backend {name!r}; available: {', '.join(sorted(SIMS))}")
    return SIMS[name]
