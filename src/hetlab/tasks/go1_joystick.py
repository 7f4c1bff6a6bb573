"""go1-joystick-flat: a Unitree Go1 tracking commanded planar and yaw velocity on flat ground.

In the spirit of MuJoCo Playground's Go1JoystickFlatTerrain: Menagerie's Go1 with
Playground's physics settings (4 ms Euler steps, one Newton iteration, feet-only
collisions, kp = 35 PD position actuators), 50 Hz control with actions scaled by 0.5
around the standing pose, Playground's reward terms and weights (summed and scaled by
the control period, floored at zero), and an episode that ends when the trunk turns over or
drops.
The policy sees noisy proprioception; the critic also gets exact values, foot contact,
air time and height, and the domain-randomisation parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from hetlab.assets import robot_xml
from hetlab.tasks.base import Index, Task, TaskConfig
from hetlab.tasks.commands import VelocityCommandConfig, VelocityCommands
from hetlab.tasks.criteria import WALKS_ON_COMMAND
from hetlab.tasks.observations import ObsTerm, Observations
from hetlab.tasks.randomisation import DomainRandomiser, RandomisationConfig
from hetlab.tasks.symmetry import AXIAL, VECTOR, VELOCITY_COMMAND, Mirror
from hetlab.tasks.rotations import projected_gravity, rotate_inverse, yaw_quat
from hetlab.tasks.terms import (FeetState, RewardTerm, feet_clearance, joint_limit_violation, mechanical_power,
                                pose_similarity, squared_norm, stand_still, torque_magnitude, velocity_tracking)

LEGS = ("FR", "FL", "RR", "RL")
JOINTS = [f"{leg}_{part}_joint" for leg in LEGS for part in ("hip", "thigh", "calf")]
DEFAULT_POSE = np.array([0.1, 0.9, -1.8, -0.1, 0.9, -1.8, 0.1, 0.9, -1.8, -0.1, 0.9, -1.8])
STANDING_HEIGHT = 0.278  # m, trunk height in the standing pose
KP, KD = 35.0, 0.5  # PD gains: kp on the actuators, kd as joint damping
FORCE_LIMIT = np.tile([23.7, 23.7, 35.55], 4)  # N·m, hip / thigh / knee
# Joint limits (Menagerie) shrunk to 95 % as soft limits for the limit penalty.
_LOW = np.tile([-0.863, -0.686, -2.818], 4)
_HIGH = np.tile([0.863, 4.501, -0.888], 4)
SOFT_LOW = 0.5 * (_LOW + _HIGH) - 0.475 * (_HIGH - _LOW)
SOFT_HIGH = 0.5 * (_LOW + _HIGH) + 0.475 * (_HIGH - _LOW)
FOOT_RADIUS = 0.023
CONTACT_HEIGHT = FOOT_RADIUS + 0.003  # foot centre below this → in contact with the floor
POSE_WEIGHTS = np.tile([1.0, 1.0, 0.1], 4)
# In a mirror the right legs trade places with the left and the hips' abduction changes sign.
JOINT_MIRROR = Mirror.of_names(JOINTS, partner=lambda joint: joint[0] + {"R": "L", "L": "R"}[joint[1]] + joint[2:],
                               negated=lambda joint: joint.endswith("_hip_joint"))
FOOT_MIRROR = Mirror.of_items([1, 0, 3, 2], Mirror.same(1))  # FR ↔ FL, RR ↔ RL
MIN_TRUNK_HEIGHT = 0.15  # m; lower counts as a fall
FLOOR_FRICTION = 0.6  # nominal; the floor's priority makes its friction the contact's


@dataclass(frozen=True)
class Go1JoystickConfig(TaskConfig):
    action_scale: float = 0.5
    commands: VelocityCommandConfig = field(default_factory=VelocityCommandConfig)
    randomisation: RandomisationConfig = field(default_factory=RandomisationConfig)
    assets_dir: str | None = None  # a MuJoCo Menagerie checkout; default: installed packages


class Go1JoystickFlat(Task):
    name = "go1-joystick-flat"
    Config = Go1JoystickConfig
    control_dt = 0.02
    episode_seconds = 20.0
    keyframe = "home"
    # Playground's, with its noise (uniform ±) on the policy's copy.
    observations = Observations(
        policy=(ObsTerm("linvel", 3, noise=0.1, mirror=VECTOR), ObsTerm("gyro", 3, noise=0.2, mirror=AXIAL),
                ObsTerm("gravity", 3, noise=0.05, mirror=VECTOR), ObsTerm("joint_pos", 12, noise=0.03, mirror=JOINT_MIRROR),
                ObsTerm("joint_vel", 12, noise=1.5, mirror=JOINT_MIRROR), ObsTerm("last_action", 12, mirror=JOINT_MIRROR),
                ObsTerm("command", 3, mirror=VELOCITY_COMMAND)),
        privileged=(ObsTerm("trunk_height", 1, mirror=Mirror.same(1)),
                    ObsTerm("feet_last_contact", 4, mirror=FOOT_MIRROR), ObsTerm("feet_air_time", 4, mirror=FOOT_MIRROR),
                    ObsTerm("feet_height", 4, mirror=FOOT_MIRROR),
                    ObsTerm("physics_params", 3, mirror=Mirror.same(3))),  # friction, mass and gain scales
    )
    action_size = 12
    action_mirror = JOINT_MIRROR
    reward_scale = control_dt
    reward_floor = 0.0  # as Playground: a step never scores below zero, so falling early never pays
    # Walks on command: stays up for the whole episode and tracks the commanded velocities.
    tracked_terms = ("tracking_lin_vel", "tracking_ang_vel")
    solved = WALKS_ON_COMMAND
    state_arrays = Task.state_arrays + ("feet.air_time", "feet.swing_peak", "feet.last_contact", "commands.values")
    rewards = {
        "tracking_lin_vel": RewardTerm(
            lambda task, sigma: velocity_tracking(task.commands.values[:, :2], task._linvel[:, :2], sigma),
            1.0, {"sigma": 0.25}),
        "tracking_ang_vel": RewardTerm(
            lambda task, sigma: velocity_tracking(task.commands.values[:, 2:], task._gyro[:, 2:], sigma),
            0.5, {"sigma": 0.25}),
        "lin_vel_z": RewardTerm(lambda task: np.square(task.sim.qvel[:, 2]), -0.5),
        "ang_vel_xy": RewardTerm(lambda task: squared_norm(task._gyro[:, :2]), -0.05),
        "orientation": RewardTerm(lambda task: squared_norm(task._gravity[:, :2]), -5.0),
        "dof_pos_limits": RewardTerm(lambda task: joint_limit_violation(task._joint_pos, SOFT_LOW, SOFT_HIGH), -1.0),
        "pose": RewardTerm(lambda task: pose_similarity(task._deviation, POSE_WEIGHTS), 0.5),
        "termination": RewardTerm(lambda task: task._fell.astype(np.float64), -1.0),
        "stand_still": RewardTerm(lambda task: stand_still(task._deviation, task._command_norm), -1.0),
        "torques": RewardTerm(lambda task: torque_magnitude(task._torques), -0.0002),
        "action_rate": RewardTerm(lambda task: squared_norm(task.actions - task.last_actions), -0.01),
        "energy": RewardTerm(lambda task: mechanical_power(task._joint_vel, task._torques), -0.001),
        "feet_clearance": RewardTerm(  # a moving foot should be at the swing height (m)
            lambda task, height: feet_clearance(task._feet_z, task._feet_speed_xy2, height), -2.0, {"height": 0.1}),
        "feet_height": RewardTerm(lambda task, height: task.feet.landing_height_error(height), -0.2, {"height": 0.1}),
        "feet_slip": RewardTerm(lambda task: task.feet.slip(task._feet_speed_xy2), -0.1),
        "feet_air_time": RewardTerm(  # swings of `target` seconds, while commanded to move
            lambda task, target: task.feet.air_time_reward(target, task._command_norm > 0.05), 0.1, {"target": 0.1}),
    }

    @classmethod
    def check_assets(cls, cfg: Go1JoystickConfig) -> None:
        robot_xml("go1", cfg.assets_dir)

    @classmethod
    def build_spec(cls, cfg: Go1JoystickConfig) -> mujoco.MjSpec:
        spec = mujoco.MjSpec.from_file(str(robot_xml("go1", cfg.assets_dir)))
        opt = spec.option
        opt.timestep = 0.004
        opt.iterations, opt.ls_iterations = 1, 5
        opt.integrator = mujoco.mjtIntegrator.mjINT_EULER
        opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_EULERDAMP
        opt.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
        opt.impratio = 1.0
        # Only the feet collide, and only with the floor.
        for geom in spec.geoms:
            geom.contype, geom.conaffinity = 0, 0
        for leg in LEGS:
            foot = spec.geom(leg)
            foot.conaffinity, foot.condim, foot.priority = 1, 3, 0
            foot.solimp[:3] = [0.9, 0.95, 0.023]
        spec.worldbody.add_geom(
            name="floor", type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.01],
            contype=1, conaffinity=0, condim=3, priority=1, friction=[FLOOR_FRICTION, 0.005, 0.0001],
        )
        frictionloss = {"hip": 0.3, "thigh": 0.3, "calf": 1.0}
        for name in JOINTS:
            joint = spec.joint(name)
            joint.damping[0], joint.armature = KD, 0.005
            joint.frictionloss = frictionloss[name.split("_")[1]]
        for actuator in spec.actuators:
            actuator.gainprm[0], actuator.biasprm[1] = KP, -KP
        for leg in LEGS:
            site = {"objtype": mujoco.mjtObj.mjOBJ_SITE, "objname": leg}
            spec.add_sensor(name=f"{leg}_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS, **site)
            spec.add_sensor(name=f"{leg}_linvel", type=mujoco.mjtSensor.mjSENS_FRAMELINVEL, **site)
        home = spec.key("home")
        home.qpos = [0, 0, STANDING_HEIGHT, 1, 0, 0, 0, *DEFAULT_POSE]
        home.ctrl = DEFAULT_POSE
        return spec

    def __init__(self, sim, cfg: Go1JoystickConfig):
        super().__init__(sim, cfg)
        self._joint_qpos = self._contiguous([sim.joint_index(j)[0] for j in JOINTS])
        self._joint_qvel = self._contiguous([sim.joint_index(j)[1] for j in JOINTS])
        self._feet_pos = [sim.sensor(f"{leg}_pos") for leg in LEGS]
        self._feet_vel = [sim.sensor(f"{leg}_linvel") for leg in LEGS]
        self.commands = VelocityCommands(cfg.commands, self.num_envs, self.dt, self.rng)
        self.randomiser = None
        if cfg.randomise:
            # Drawn once per env at start-up, as MuJoCo Playground does: a reset then costs
            # no recomputation of the model's mass-dependent constants.
            self.randomiser = DomainRandomiser(sim, cfg.randomisation, ["floor"], self.rng)
            self.randomiser.apply(np.arange(self.num_envs))
        n = self.num_envs
        self._targets = np.tile(DEFAULT_POSE, (n, 1))
        self.feet = FeetState(n, len(LEGS), self.dt)
        self._step_proprio: tuple[np.ndarray, ...] | None = None
        # What the critic sees of the physics parameters when nothing is randomised.
        self._nominal_params = np.tile(np.float32([FLOOR_FRICTION, 1.0, 1.0]), (n, 1))

    @staticmethod
    def _contiguous(indices: list[int]) -> slice:
        # The 12 leg joints follow the free joint in order; a slice keeps every read a view.
        if indices != list(range(indices[0], indices[0] + len(indices))):
            raise ValueError(f"the Go1 model's leg joints are not stored in order: {indices}")
        return slice(indices[0], indices[0] + len(indices))

    # -- dynamics ---------------------------------------------------------------------------

    def _control(self, actions: np.ndarray) -> np.ndarray:
        np.multiply(actions, self.cfg.action_scale, out=self._targets)
        self._targets += DEFAULT_POSE
        return self._targets

    def _proprio(self, ids: Index) -> tuple[np.ndarray, ...]:
        """Body-frame linear velocity, gyro, projected gravity, joint positions and velocities."""
        qpos, qvel = self.sim.qpos[ids], self.sim.qvel[ids]
        quat = qpos[:, 3:7]
        return (
            rotate_inverse(quat, qvel[:, 0:3]),
            qvel[:, 3:6],
            projected_gravity(quat),
            qpos[:, self._joint_qpos],
            qvel[:, self._joint_qvel],
        )

    def _update_state(self, actions: np.ndarray) -> None:
        # Computed once per step for all envs; the rewards and the next observation share it.
        self._step_proprio = self._proprio(slice(None))
        self._linvel, self._gyro, self._gravity, self._joint_pos, self._joint_vel = self._step_proprio
        kp = KP if self.randomiser is None else KP * self.randomiser.params[:, 2:3]
        self._torques = np.clip(kp * (self._targets - self._joint_pos), -FORCE_LIMIT, FORCE_LIMIT)
        self._fell = (self._gravity[:, 2] > 0.0) | (self.sim.qpos[:, 2] < MIN_TRUNK_HEIGHT)
        self._deviation = self._joint_pos - DEFAULT_POSE
        self._command_norm = np.sqrt(np.square(self.commands.values).sum(axis=1))

        self._feet_z = np.stack([p[:, 2] for p in self._feet_pos], axis=1)
        self._feet_speed_xy2 = np.square(np.stack([v[:, :2] for v in self._feet_vel], axis=1)).sum(axis=2)
        self.feet.update(self._feet_z, self._feet_z < CONTACT_HEIGHT)

    def _advance(self) -> None:
        self.feet.advance()
        self.commands.update(self.episode_step)

    def _terminated(self) -> np.ndarray:
        return self._fell

    def _observation_terms(self, ids: Index) -> dict[str, np.ndarray]:
        if isinstance(ids, slice) and self._step_proprio is not None:
            proprio, self._step_proprio = self._step_proprio, None  # this step's, used once
        else:
            proprio = self._proprio(ids)
        linvel, gyro, gravity, joint_pos, joint_vel = proprio
        return {
            "linvel": linvel, "gyro": gyro, "gravity": gravity, "joint_pos": joint_pos - DEFAULT_POSE,
            "joint_vel": joint_vel, "last_action": self.last_actions[ids], "command": self.commands.values[ids],
            "trunk_height": self.sim.qpos[ids, 2:3], "feet_last_contact": self.feet.last_contact[ids],
            "feet_air_time": self.feet.air_time[ids], "feet_height": np.stack([p[ids, 2] for p in self._feet_pos], axis=1),
            "physics_params": self._nominal_params[ids] if self.randomiser is None else self.randomiser.params[ids],
        }

    # -- resets -----------------------------------------------------------------------------

    def _reset_envs(self, ids: np.ndarray) -> None:
        k = len(ids)
        qpos, qvel = self.sim.qpos, self.sim.qvel
        # Start anywhere within ±0.5 m, facing any direction, with a small random twist.
        qpos[ids, 0:2] += self.rng.uniform(-0.5, 0.5, (k, 2))
        qpos[ids, 3:7] = yaw_quat(self.rng.uniform(-np.pi, np.pi, k))
        qvel[ids, 0:6] = self.rng.uniform(-0.5, 0.5, (k, 6))
        self.feet.reset(ids)
        self.commands.resample(ids)
