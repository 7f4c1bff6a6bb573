"""Physics backends behind the `BatchSim` contract (contract.py), chosen by name (`--sim`).

A backend is one module with a `BatchSim` class and its bare stepping, and one entry in `SIMS`.
Tasks, `hetlab play` and `hetlab bench sim` ask this registry for a sim, never a backend
directly. Backends that need an optional extra are imported only when chosen.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hetlab.errors import UserError

if TYPE_CHECKING:  # the registry itself stays free of MuJoCo and numpy: the command line reads SIMS
    import mujoco

    from hetlab.sim.contract import BatchSim


@dataclass(frozen=True)
class SimBackend:
    name: str
    module: str  # hetlab.sim.<module> holds the two entry points below
    sim_class: str  # (spec, num_envs, *, threads, seed, keyframe) -> BatchSim
    needs: str | None  # the distribution it steps with, from the extra of the same name; None: built in
    rounding: float  # relative rounding of the state it stores: 0 for float64, 2⁻²³ for float32
    about: str
    # A function of the module that raises UserError where the machine cannot run it (no GPU, say).
    requirement: str | None = None
    steps_on_cpu: bool = True  # CPU threads step it (`--threads` applies)

    def _entry(self, name: str):
        return getattr(importlib.import_module(f"hetlab.sim.{self.module}"), name)

    def make(self, spec: mujoco.MjSpec, num_envs: int, **options) -> BatchSim:
        return self._entry(self.sim_class)(spec, num_envs, **options)

    def bare_physics(self, spec: mujoco.MjSpec, num_envs: int, threads: int,
                     keyframe: str | None) -> Callable[[int], None]:
        """(spec, num_envs, threads, keyframe) -> step(substeps): the backend's own stepping and
        nothing else, the baseline `hetlab bench sim` measures a task against."""
        return self._entry("bare_physics")(spec, num_envs, threads, keyframe)

    def missing(self) -> str | None:
        """The install line for what this backend needs, where that is not installed; else None."""
        if self.needs is None:
            return None
        from importlib import metadata  # here, as it costs the command line's help tens of milliseconds

        try:
            metadata.version(self.needs)
        except metadata.PackageNotFoundError:
            return f"{self.needs} is not installed: pip install 'hetlab[{self.name}]'"
        return None

    def unavailable(self) -> str | None:
        """Why this backend cannot run here (one line), or None."""
        if (missing := self.missing()) is not None:
            return missing
        if self.requirement is not None:
            try:
                self._entry(self.requirement)()
            except UserError as e:
                return str(e)
        return None


SIMS = {backend.name: backend for backend in (
    SimBackend("mujoco", "mujoco_batch", "MujocoBatchSim", None, 0.0, "MuJoCo 4's mujoco.batch on CPU threads"),
    SimBackend("motrix", "motrix", "MotrixBatchSim", "motrixsim", 2.0**-23, "MotrixSim on CPU threads (float32)"),
    SimBackend("warp", "mujoco_warp", "WarpBatchSim", "mujoco-warp", 2.0**-23,
               "MuJoCo Warp on an NVIDIA GPU (float32)", requirement="cuda_device", steps_on_cpu=False),
)}


def sim_backend(name: str) -> SimBackend:
    """The backend called `name`, checked usable here; UserError saying why not."""
    if name not in SIMS:
        raise UserError(f"unknown physics backend {name!r}; available: {', '.join(sorted(SIMS))}")
    backend = SIMS[name]
    if (reason := backend.unavailable()) is not None:
        raise UserError(f"--sim {name}: {reason}")
    return backend
