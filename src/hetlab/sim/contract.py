"""The physics contract every backend meets: many environments of one model, numpy in and out.

Tasks are written against these Protocols only. The arrays a backend hands out are live:
they alias the backend's state, so reading them costs nothing and a write to `qpos`,
`qvel` or `ctrl` is the environment's state at the next `step`. Derived quantities
(sensors, body poses) describe the state before the last physics substep, as MuJoCo's
`mj_step` leaves them; they are outputs, so writing to them changes nothing.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import mujoco
import numpy as np


@runtime_checkable
class BatchSim(Protocol):
    """`num_envs` copies of one model, stepped together. Deterministic for a seed."""

    num_envs: int
    threads: int  # CPU threads stepping the batch
    timestep: float  # seconds per physics substep
    qpos: np.ndarray  # (num_envs, nq) live
    qvel: np.ndarray  # (num_envs, nv) live
    ctrl: np.ndarray  # (num_envs, nu) live
    divergences: int  # environments found diverged and reset since construction

    def step(self, ctrl: np.ndarray | None, substeps: int) -> np.ndarray:
        """Set `ctrl` (None keeps it) and advance every env `substeps` substeps.

        Returns a (num_envs,) bool mask of envs that diverged (non-finite state, exploding
        acceleration, or a MuJoCo error) during this call; those were reset to the initial
        state and counted, and the rest of the batch stepped normally.
        """
        ...

    def reset(self, env_ids: np.ndarray, noise: float = 0.0) -> None:
        """Reset `env_ids` to the initial keyframe; add uniform ±`noise` to hinge/slide joint
        positions and velocities, drawn from the sim's seeded generator. Call `forward` once
        the caller's own writes to the reset state are done."""
        ...

    def forward(self, env_ids: np.ndarray) -> None:
        """Recompute sensors and body poses of `env_ids` after their state was written."""
        ...

    def get_state(self) -> dict:
        """A copy of every env's physics state, the divergence count and the generator."""
        ...

    def set_state(self, state: dict) -> None:
        """Restore `get_state()` of a sim of the same model and size (derived fields included)."""
        ...

    def sensor(self, name: str) -> np.ndarray:
        """Live (num_envs, dim) view of one named sensor's output."""
        ...

    def body_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Live world position (num_envs, 3) and orientation quaternion (num_envs, 4) of a body."""
        ...

    def joint_index(self, name: str) -> tuple[int, int]:
        """Where joint `name` starts in `qpos` and in `qvel`."""
        ...

    def joint_range(self, name: str) -> tuple[float, float]:
        """Joint `name`'s position limits, (−inf, inf) when it has none."""
        ...

    def mocap_pose(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Live, writable world position (num_envs, 3) and orientation (num_envs, 4) of mocap body
        `name` (a target the scene shows, such as a goal pose); `reset` restores the keyframe's."""
        ...

    def actuator_names(self) -> list[str]:
        """Actuator names in `ctrl` column order."""
        ...


@runtime_checkable
class DomainRandomisable(Protocol):
    """Optional: per-environment model parameters, for domain randomisation."""

    def model_field(self, name: str) -> np.ndarray:
        """The live, writable (num_envs, ...) per-env values of a model field (e.g.
        'geom_friction', 'body_mass', 'actuator_gainprm'); each env starts from the
        model's value. Call `commit_model_fields` after writing."""
        ...

    def object_id(self, kind: str, name: str) -> int:
        """Index of a named model object ('geom', 'body', 'actuator', ...) in model fields."""
        ...

    def commit_model_fields(self, env_ids: np.ndarray | None = None) -> None:
        """Recompute the model constants derived from written fields (e.g. from masses:
        subtree masses and the constraint solver's inverse weights)."""
        ...


@runtime_checkable
class Renderable(Protocol):
    """Optional: an env as MuJoCo objects, for MuJoCo's renderer (`hetlab play`)."""

    def render_state(self, env_id: int, model: mujoco.MjModel | None = None,
                     data: mujoco.MjData | None = None) -> tuple[mujoco.MjModel, mujoco.MjData]:
        """Env `env_id`'s model and state with its derived quantities computed; written into
        `model` and `data` when given (they must be of this model), else new copies."""
        ...
