"""cartpole-balance: keep a pole upright on a cart driven along a rail. Built in code, no assets.

The fast task for tests: 5 observations, 1 action, 50 Hz control. An episode ends when the
pole tips past 0.8 rad or the cart leaves the rail, or after 10 s.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from hetlab.tasks.base import Index, Task, TaskConfig
from hetlab.tasks.criteria import Criterion
from hetlab.tasks.observations import ObsTerm, Observations
from hetlab.tasks.symmetry import Mirror
from hetlab.tasks.terms import RewardTerm, alive

RAIL_HALF_LENGTH = 2.0  # m
MAX_POLE_ANGLE = 0.8  # rad


@dataclass(frozen=True)
class CartpoleConfig(TaskConfig):
    reset_noise: float = 0.1  # ± on cart position, pole angle and both velocities


class CartpoleBalance(Task):
    name = "cartpole-balance"
    Config = CartpoleConfig
    control_dt = 0.02
    episode_seconds = 10.0
    keyframe = "upright"
    # Slightly noisy readings for the policy; the critic sees the same state exactly.
    # In a mirror the cart runs the other way and the pole leans the other way.
    observations = Observations(policy=tuple(
        ObsTerm(name, 1, noise=0.01, mirror=Mirror.same(1) if name == "cos_angle" else Mirror.negated(1))
        for name in ("x", "cos_angle", "sin_angle", "x_dot", "angle_dot")))
    action_size = 1
    action_mirror = Mirror.negated(1)
    solved = (Criterion("return", 475.0),)  # of the 500 a pole held upright at the centre for 10 s scores
    rewards = {
        "alive": RewardTerm(alive, 1.0),
        "pole_angle": RewardTerm(lambda task: np.square(task.angle), -1.0),
        "cart_position": RewardTerm(lambda task: np.square(task.x), -0.05),
        "cart_velocity": RewardTerm(lambda task: np.square(task.x_dot), -0.01),
        "pole_velocity": RewardTerm(lambda task: np.square(task.angle_dot), -0.005),
        "action": RewardTerm(lambda task: np.square(task.actions[:, 0]), -0.001),
    }

    @classmethod
    def build_spec(cls, cfg: TaskConfig) -> mujoco.MjSpec:
        spec = mujoco.MjSpec()
        spec.modelname = "cartpole"
        spec.option.timestep = 0.01
        world = spec.worldbody
        no_contact = {"contype": 0, "conaffinity": 0}
        world.add_geom(
            name="rail", type=mujoco.mjtGeom.mjGEOM_CAPSULE, size=[0.02, 0, 0],
            fromto=[-RAIL_HALF_LENGTH - 0.4, 0, 1, RAIL_HALF_LENGTH + 0.4, 0, 1], **no_contact,
        )
        cart = world.add_body(name="cart", pos=[0, 0, 1])
        cart.add_joint(
            name="slider", type=mujoco.mjtJoint.mjJNT_SLIDE, axis=[1, 0, 0],
            range=[-RAIL_HALF_LENGTH - 0.4, RAIL_HALF_LENGTH + 0.4], damping=0.05,
        )
        cart.add_geom(name="cart", type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.2, 0.15, 0.1], mass=1.0, **no_contact)
        pole = cart.add_body(name="pole")
        pole.add_joint(name="hinge", type=mujoco.mjtJoint.mjJNT_HINGE, axis=[0, 1, 0], damping=0.005)
        pole.add_geom(
            name="pole", type=mujoco.mjtGeom.mjGEOM_CAPSULE, size=[0.045, 0, 0],
            fromto=[0, 0, 0, 0, 0, 1], mass=0.1, **no_contact,
        )
        spec.add_actuator(
            name="push", target="slider", trntype=mujoco.mjtTrn.mjTRN_JOINT,
            gear=[10, 0, 0, 0, 0, 0], ctrlrange=[-1, 1], ctrllimited=True,
        )
        spec.add_key(name="upright", qpos=[0.0, 0.0])
        return spec

    def __init__(self, sim, cfg: CartpoleConfig):
        super().__init__(sim, cfg)
        self._cart = sim.joint_index("slider")
        self._hinge = sim.joint_index("hinge")

    def _state(self, ids: Index) -> tuple[np.ndarray, ...]:
        qpos, qvel = self.sim.qpos[ids], self.sim.qvel[ids]
        return qpos[:, self._cart[0]], qpos[:, self._hinge[0]], qvel[:, self._cart[1]], qvel[:, self._hinge[1]]

    def _control(self, actions: np.ndarray) -> np.ndarray:
        return actions  # already in [-1, 1]: the motor's control range

    def _update_state(self, actions: np.ndarray) -> None:
        self.x, self.angle, self.x_dot, self.angle_dot = self._state(slice(None))

    def _terminated(self) -> np.ndarray:
        return (np.abs(self.angle) > MAX_POLE_ANGLE) | (np.abs(self.x) > RAIL_HALF_LENGTH)

    def _observation_terms(self, ids: Index) -> dict[str, np.ndarray]:
        x, angle, x_dot, angle_dot = self._state(ids)
        return {"x": x[:, None], "cos_angle": np.cos(angle)[:, None], "sin_angle": np.sin(angle)[:, None],
                "x_dot": x_dot[:, None], "angle_dot": angle_dot[:, None]}
