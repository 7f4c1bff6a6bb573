"""Domain randomisation on reset: friction, link masses and actuator gains, per env.

Works on any sim with the DomainRandomisable capability; each reset env draws new
parameters, which the task may expose to its privileged critic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetlab.errors import UserError
from hetlab.sim.contract import BatchSim, DomainRandomisable


@dataclass(frozen=True)
class RandomisationConfig:
    friction: tuple[float, float] = (0.4, 1.0)  # sliding friction of the chosen geoms
    mass_scale: tuple[float, float] = (0.9, 1.1)  # every link's mass and inertia, one factor per env
    gain_scale: tuple[float, float] = (0.9, 1.1)  # position-actuator stiffness kp


class DomainRandomiser:
    """Draws and writes per-env model parameters; `params` holds them for observations."""

    def __init__(self, sim: BatchSim, cfg: RandomisationConfig, friction_geoms: list[str], rng: np.random.Generator):
        if not isinstance(sim, DomainRandomisable):
            raise UserError(f"{type(sim).__name__} cannot vary model fields per env; run with randomise=False")
        self.sim = sim
        self.cfg = cfg
        self.rng = rng
        self._geoms = np.array([sim.object_id("geom", name) for name in friction_geoms])
        self._friction = sim.model_field("geom_friction")
        self._mass = sim.model_field("body_mass")
        self._inertia = sim.model_field("body_inertia")
        self._gain = sim.model_field("actuator_gainprm")
        self._bias = sim.model_field("actuator_biasprm")
        self._nominal_mass = self._mass[0].copy()
        self._nominal_inertia = self._inertia[0].copy()
        self._nominal_kp = self._gain[0, :, 0].copy()
        n = sim.num_envs
        # friction, mass scale, gain scale; nominal values until the first draw
        self.params = np.ones((n, 3), np.float32)
        self.params[:, 0] = self._friction[:, self._geoms[0], 0]

    def apply(self, ids: np.ndarray) -> None:
        k = len(ids)
        friction = self.rng.uniform(*self.cfg.friction, k)
        mass = self.rng.uniform(*self.cfg.mass_scale, k)
        gain = self.rng.uniform(*self.cfg.gain_scale, k)
        self._friction[ids[:, None], self._geoms, 0] = friction[:, None]
        # Same shapes, denser material: mass and rotational inertia scale together.
        self._mass[ids] = mass[:, None] * self._nominal_mass
        self._inertia[ids] = mass[:, None, None] * self._nominal_inertia
        kp = gain[:, None] * self._nominal_kp
        # A position actuator is force = kp·ctrl − kp·qpos: gain and bias change together.
        self._gain[ids, :, 0] = kp
        self._bias[ids, :, 1] = -kp
        self.sim.commit_model_fields(ids)  # masses feed the inertia constants
        self.params[ids] = np.stack([friction, mass, gain], axis=1)
