"""g1-walk-flat: a Unitree G1 humanoid (29 joints) tracking commanded planar and yaw velocity on flat ground.

After MuJoCo Playground's G1 joystick task: its scene (feet-only collisions, 2 ms Euler steps,
kp 75 position actuators, softer ankles and wrists), 50 Hz control with actions scaled by 0.5
around the knees-bent pose, its reward terms and weights (scaled by the control period),
commands resampled every 10 s, a gait clock the feet are rewarded for following, and random
pushes every 5–10 s (up to 1 m/s, Holosoma's, where Playground's reach 2 m/s). An episode ends
when the torso turns over, the feet collide, or (only the feet touch the ground, so a fallen robot
would sink through it) the pelvis drops below 0.3 m.

Departures, after Holosoma's G1 locomotion recipe, because with Playground's terms alone PPO did
not learn to stand in 8 M env steps (docs/benchmarks.md#time-to-solve): an `alive` term pays each
step the robot stays up, and a penalty curriculum (curriculum.py) weighs the penalties at a tenth,
then less, while episodes stay short, and raises them to their full weight once most episodes
reach the time limit. On two cores the curriculum stays near 1 %, so the hips' and the upper
body's deviation from the default pose weigh in full from the start (without them the policy
walked by swinging its arms, waist and hips, the pelvis yawing at ±2 rad/s), Holosoma's
action-rate penalty joins the curriculum's, and the velocity tracking has Holosoma's weights.
One term of hetlab's own: yaw tracking scored also on the pelvis's yaw rate averaged over 0.5 s
(which the critic sees), since the gait sways the pelvis's heading at every step.
`penalty_curriculum=None`: every penalty at its full weight and no alive bonus (the `alive` term
is then 0 on every step). A training evaluation starts every time from the same task state, so
its returns are at the curriculum's initial scale: comparable with each other, not with the
training episodes' returns.

The policy sees noisy proprioception from the pelvis IMU and joints, the command, its last
action and the gait clock (103 values, as Playground); the critic sees those exactly, with the
accelerometer, world angular velocity, pelvis height, actuator forces, foot contact, velocities
and air time, and the domain-randomisation parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from hetlab.assets import scene_xml
from hetlab.tasks.base import Index, Task, TaskConfig
from hetlab.tasks.commands import VelocityCommandConfig, VelocityCommands
from hetlab.tasks.criteria import WALKS_ON_COMMAND
from hetlab.tasks.curriculum import PenaltyCurriculum, PenaltyCurriculumConfig
from hetlab.tasks.g1 import DEFAULT_POSE, FEET, FLOOR_FRICTION, FOOT_MIRROR, JOINT_MIRROR, JOINTS, G1Joints, g1_flat_spec
from hetlab.tasks.observations import ObsTerm, Observations
from hetlab.tasks.randomisation import DomainRandomiser, RandomisationConfig
from hetlab.tasks.rotations import projected_gravity, yaw_quat
from hetlab.tasks.symmetry import AXIAL, VECTOR, VELOCITY_COMMAND, Mirror
from hetlab.tasks.terms import (FeetState, RewardTerm, joint_limit_violation, squared_norm, stand_still,
                                velocity_tracking)

HIP_ROLL_YAW = np.array([1, 2, 7, 8])  # left roll, left yaw, right roll, right yaw
KNEES = np.array([3, 9])
UPPER_BODY = np.arange(12, 29)  # the waist's 3 joints and both arms'
UPRIGHT_TORSO = np.array([0.073, 0.0, 1.0])  # the torso's z axis standing in the default pose
MIN_PELVIS_HEIGHT = 0.3  # m
YAW_RATE_MEAN_SECONDS = 0.5  # time constant of the pelvis's averaged yaw rate


@dataclass(frozen=True)
class G1WalkConfig(TaskConfig):
    action_scale: float = 0.5
    commands: VelocityCommandConfig = field(default_factory=lambda: VelocityCommandConfig(
        lin_vel_x=(-1.0, 1.0), lin_vel_y=(-0.5, 0.5), yaw_rate=(-1.0, 1.0)))
    randomisation: RandomisationConfig = field(default_factory=RandomisationConfig)
    pushes: bool = True  # kick the pelvis sideways now and then
    push_interval: tuple[float, float] = (5.0, 10.0)  # s between pushes, drawn per episode
    # m/s added to the pelvis's planar velocity: at most Holosoma's 1.0, not Playground's 2.0. A policy that
    # survived 87 % of unpushed episodes survived 1 % of those pushed at 1.5–2 m/s (docs/benchmarks.md).
    push_speed: tuple[float, float] = (0.1, 1.0)
    gait_frequency: tuple[float, float] = (1.25, 1.5)  # Hz of the gait clock, drawn per episode
    # None: every penalty at its full weight and no alive bonus
    penalty_curriculum: PenaltyCurriculumConfig | None = field(default_factory=PenaltyCurriculumConfig)


class G1WalkFlat(Task):
    name = "g1-walk-flat"
    Config = G1WalkConfig
    control_dt = 0.02
    episode_seconds = 20.0
    keyframe = "knees_bent"
    # Playground's, with its noise (uniform ±) on the policy's copy.
    observations = Observations(
        policy=(ObsTerm("linvel", 3, noise=0.1, mirror=VECTOR), ObsTerm("gyro", 3, noise=0.2, mirror=AXIAL),
                ObsTerm("gravity", 3, noise=0.05, mirror=VECTOR), ObsTerm("command", 3, mirror=VELOCITY_COMMAND),
                ObsTerm("joint_pos", 29, noise=0.03, mirror=JOINT_MIRROR),
                ObsTerm("joint_vel", 29, noise=1.5, mirror=JOINT_MIRROR), ObsTerm("last_action", 29, mirror=JOINT_MIRROR),
                ObsTerm("gait_cos", 2, mirror=FOOT_MIRROR), ObsTerm("gait_sin", 2, mirror=FOOT_MIRROR)),
        privileged=(ObsTerm("accelerometer", 3, mirror=VECTOR), ObsTerm("world_angvel", 3, mirror=AXIAL),
                    ObsTerm("pelvis_height", 1, mirror=Mirror.same(1)),
                    ObsTerm("actuator_forces", 29, mirror=JOINT_MIRROR), ObsTerm("feet_contact", 2, mirror=FOOT_MIRROR),
                    ObsTerm("feet_linvel", 6, mirror=Mirror.of_items([1, 0], VECTOR)),
                    ObsTerm("feet_air_time", 2, mirror=FOOT_MIRROR),
                    ObsTerm("physics_params", 3, mirror=Mirror.same(3)),  # friction, mass and gain scales
                    ObsTerm("yaw_rate_mean", 1, mirror=Mirror.negated(1))),  # the pelvis gyro's yaw rate, averaged
    )
    action_size = 29
    action_mirror = JOINT_MIRROR
    reward_scale = control_dt
    # Walks on command: stays up for the whole episode and tracks the commanded velocities.
    tracked_terms = ("tracking_lin_vel", "tracking_ang_vel")
    solved = WALKS_ON_COMMAND
    state_arrays = Task.state_arrays + ("feet.air_time", "feet.swing_peak", "feet.last_contact", "commands.values",
                                        "phase", "phase_step", "push_interval", "steps_to_push", "yaw_rate_mean")
    # Playground's terms and weights, and three of Holosoma's; a penalty curriculum weighs the terms marked penalty.
    rewards = {
        # Holosoma's weights, twice Playground's: at 10.4 M env steps linear tracking reached 0.65 with these,
        # 0.50 with Playground's, yaw 0.29 against 0.23 (docs/benchmarks.md#time-to-solve).
        "tracking_lin_vel": RewardTerm(
            lambda task, sigma: velocity_tracking(task.commands.values[:, :2], task._pelvis["local_linvel"][:, :2],
                                                  sigma), 2.0, {"sigma": 0.25}),
        "tracking_ang_vel": RewardTerm(
            lambda task, sigma: velocity_tracking(task.commands.values[:, 2:], task._pelvis["gyro"][:, 2:], sigma),
            1.5, {"sigma": 0.25}),
        # The same kernel on the yaw rate averaged over about a gait cycle, so that turning pays whatever the
        # gait's sway: without it the policy did not turn (its mean yaw rate uncorrelated with the command) and
        # yaw tracking stayed at 0.3-0.46 (docs/benchmarks.md#time-to-solve).
        "tracking_ang_vel_mean": RewardTerm(
            lambda task, sigma: velocity_tracking(task.commands.values[:, 2:], task.yaw_rate_mean[:, None], sigma),
            1.5, {"sigma": 0.25}),
        "ang_vel_xy": RewardTerm(lambda task: squared_norm(task._torso_angvel[:, :2]), -0.15, penalty=True),
        "orientation": RewardTerm(lambda task: squared_norm(task._torso_up - UPRIGHT_TORSO), -2.0, penalty=True),
        "feet_air_time": RewardTerm(  # swings under `shortest` s earn nothing, over `longest` s no more
            lambda task, shortest, longest: task.feet_air_time(shortest, longest), 2.0,
            {"shortest": 0.2, "longest": 0.5}),
        "feet_slip": RewardTerm(lambda task: task._pelvis_speed * task._contact.sum(axis=1), -0.25, penalty=True),
        "feet_phase": RewardTerm(  # the feet at the gait clock's height, up to `swing_height` (m)
            lambda task, swing_height: task.feet_phase(swing_height), 1.0, {"swing_height": 0.15}),
        "stand_still": RewardTerm(
            lambda task: stand_still(task._deviation, np.linalg.norm(task.commands.values, axis=1)), -1.0,
            penalty=True),
        "termination": RewardTerm(lambda task: task._fell.astype(np.float64), -100.0),
        "collision": RewardTerm(lambda task: np.logical_or(*[found[:, 0] > 0 for found in task._hands_on_thighs])
                                .astype(np.float64), -0.1, penalty=True),
        "contact_force": RewardTerm(  # vertical foot force past `max_force` (N)
            lambda task, max_force: sum(np.maximum(np.abs(force[:, 2]) - max_force, 0.0) for force in task._feet_force),
            -0.01, {"max_force": 500.0}, penalty=True),
        "joint_deviation_knee": RewardTerm(lambda task: np.abs(task._deviation[:, KNEES]).sum(axis=1), -0.1,
                                           penalty=True),
        # In full from the start: weighed by the curriculum (at 1 %), the hips' yaw swung 0.34 rad at each step.
        "joint_deviation_hip": RewardTerm(lambda task: task.hip_deviation(), -0.25),
        "dof_pos_limits": RewardTerm(
            lambda task: joint_limit_violation(task._joint_pos, task.joints.soft_low, task.joints.soft_high), -1.0,
            penalty=True),
        "pose": RewardTerm(lambda task: squared_norm(task._deviation), -0.1, penalty=True),
        # After Holosoma's pose weights (50 on the waist and arms), in full from the start: without it the arms
        # and waist swing at the gait's frequency (joint speeds 3.7 rad/s against 1.1) and twist the pelvis.
        "upper_body_pose": RewardTerm(lambda task: squared_norm(task._deviation[:, UPPER_BODY]), -0.5),
        # Holosoma's: with it the robot stood up sooner (docs/benchmarks.md#time-to-solve).
        "action_rate": RewardTerm(lambda task: squared_norm(task.actions - task.last_actions), -2.0, penalty=True),
        "alive": RewardTerm(  # Holosoma's; with the penalty curriculum only
            lambda task: np.full(task.num_envs, 1.0 if task.curriculum is not None else 0.0), 1.0),
    }

    @classmethod
    def check_assets(cls, cfg: G1WalkConfig) -> None:
        scene_xml("g1_flat")

    @classmethod
    def build_spec(cls, cfg: G1WalkConfig) -> mujoco.MjSpec:
        return g1_flat_spec()

    def __init__(self, sim, cfg: G1WalkConfig):
        super().__init__(sim, cfg)
        self.joints = G1Joints(sim)
        self._pelvis = {name: sim.sensor(f"{name}_pelvis") for name in
                        ("local_linvel", "gyro", "orientation", "accelerometer", "global_angvel", "global_linvel")}
        self._torso_up = sim.sensor("upvector_torso")
        self._torso_angvel = sim.sensor("global_angvel_torso")
        self._feet_pos = [sim.sensor(f"{foot}_pos") for foot in FEET]
        self._feet_vel = [sim.sensor(f"{foot}_global_linvel") for foot in FEET]
        self._feet_force = [sim.sensor(f"{foot}_force") for foot in FEET]
        self._floor_contact = [sim.sensor(f"{foot}_floor_found") for foot in FEET]
        self._feet_touch = sim.sensor("right_foot_left_foot_found")
        self._hands_on_thighs = [sim.sensor(f"{side}_hand_{side}_thigh_found") for side in ("left", "right")]
        self._forces = [sim.sensor(f"{joint}_force") for joint in JOINTS]
        n = self.num_envs
        self.commands = VelocityCommands(cfg.commands, n, self.dt, self.rng)
        self.feet = FeetState(n, len(FEET), self.dt)
        self.phase = np.zeros((n, 2))  # gait clock of each foot, in [−π, π)
        self.phase_step = np.zeros(n)  # its advance per control step
        self.push_interval = np.ones(n, np.int64)
        self.steps_to_push = np.ones(n, np.int64)
        self.yaw_rate_mean = np.zeros(n)  # the pelvis gyro's yaw rate, averaged over YAW_RATE_MEAN_SECONDS
        self.randomiser = None
        if cfg.randomise:  # drawn once per env at start-up, like the Go1 task's
            self.randomiser = DomainRandomiser(sim, cfg.randomisation, ["floor"], self.rng)
            self.randomiser.apply(np.arange(n))
        self._nominal_params = np.tile(np.float32([FLOOR_FRICTION, 1.0, 1.0]), (n, 1))
        self._targets = np.tile(DEFAULT_POSE, (n, 1))
        if cfg.penalty_curriculum is not None:
            self.curriculum = PenaltyCurriculum(cfg.penalty_curriculum, self.max_episode_steps)

    # -- dynamics ---------------------------------------------------------------------------

    def _control(self, actions: np.ndarray) -> np.ndarray:
        np.multiply(actions, self.cfg.action_scale, out=self._targets)
        self._targets += DEFAULT_POSE
        return self._targets

    def _update_state(self, actions: np.ndarray) -> None:
        self._joint_pos = self.sim.qpos[:, self.joints.qpos]
        self._contact = np.stack([found[:, 0] > 0 for found in self._floor_contact], axis=1)
        self._feet_z = np.stack([p[:, 2] for p in self._feet_pos], axis=1)
        self.feet.update(self._feet_z, self._contact)
        self._fell = (self._torso_up[:, 2] < 0.0) | (self.sim.qpos[:, 2] < MIN_PELVIS_HEIGHT) \
            | (self._feet_touch[:, 0] > 0)
        self._deviation = self._joint_pos - DEFAULT_POSE
        self._pelvis_speed = np.linalg.norm(self._pelvis["global_linvel"][:, :2], axis=1)
        self.yaw_rate_mean += (self.dt / YAW_RATE_MEAN_SECONDS) * (self._pelvis["gyro"][:, 2] - self.yaw_rate_mean)

    def _advance(self) -> None:
        self.feet.advance()
        self.commands.update(self.episode_step)
        self.phase = np.fmod(self.phase + self.phase_step[:, None] + np.pi, 2 * np.pi) - np.pi
        if self.cfg.pushes:
            self.steps_to_push -= 1
            due = np.flatnonzero(self.steps_to_push == 0)
            if due.size:
                angle = self.rng.uniform(0.0, 2 * np.pi, len(due))
                speed = self.rng.uniform(*self.cfg.push_speed, len(due))
                self.sim.qvel[due, 0:2] += speed[:, None] * np.stack([np.cos(angle), np.sin(angle)], axis=1)
                self.steps_to_push[due] = self.push_interval[due]

    def _terminated(self) -> np.ndarray:
        return self._fell

    # -- reward terms with more than one line -------------------------------------------------

    def feet_air_time(self, shortest: float, longest: float) -> np.ndarray:
        """Each swing's time in the air past `shortest`, capped at `longest`, scored when it lands."""
        return np.minimum((self.feet.air_time - shortest) * self.feet.first_contact, longest - shortest).sum(axis=1)

    def feet_phase(self, swing_height: float) -> np.ndarray:
        """How closely the feet follow the gait clock's height, while the robot moves or is asked to."""
        moving = (self._pelvis_speed > 0.1) | (np.abs(self._pelvis["global_angvel"][:, 2]) > 0.1) \
            | (np.linalg.norm(self.commands.values, axis=1) > 0.01)
        error = np.square(self._feet_z - swing_height_target(self.phase, swing_height)).sum(axis=1)
        return np.exp(-error / 0.01) * moving

    def hip_deviation(self) -> np.ndarray:
        """Hip roll and yaw away from the default pose; roll may deviate while the command asks for sideways
        speed. Playground frees the roll for leftward commands only; either way here, so that the reward
        is the same in a mirror."""
        weights = np.where(np.abs(self.commands.values[:, 1:2]) > 0.1, [0.0, 1.0, 0.0, 1.0], 1.0)
        return (np.abs(self._deviation[:, HIP_ROLL_YAW]) * weights).sum(axis=1)

    def _observation_terms(self, ids: Index) -> dict[str, np.ndarray]:
        pelvis = {name: values[ids] for name, values in self._pelvis.items()}
        qpos, qvel = self.sim.qpos[ids], self.sim.qvel[ids]
        phase = self.phase[ids]
        return {
            "linvel": pelvis["local_linvel"], "gyro": pelvis["gyro"], "gravity": projected_gravity(pelvis["orientation"]),
            "command": self.commands.values[ids], "joint_pos": qpos[:, self.joints.qpos] - DEFAULT_POSE,
            "joint_vel": qvel[:, self.joints.qvel], "last_action": self.last_actions[ids],
            "gait_cos": np.cos(phase), "gait_sin": np.sin(phase),
            "accelerometer": pelvis["accelerometer"], "world_angvel": pelvis["global_angvel"],
            "pelvis_height": qpos[:, 2:3], "actuator_forces": np.concatenate([force[ids] for force in self._forces], axis=1),
            "feet_contact": np.stack([found[ids, 0] > 0 for found in self._floor_contact], axis=1),
            "feet_linvel": np.concatenate([vel[ids] for vel in self._feet_vel], axis=1),
            "feet_air_time": self.feet.air_time[ids],
            "physics_params": self._nominal_params[ids] if self.randomiser is None else self.randomiser.params[ids],
            "yaw_rate_mean": self.yaw_rate_mean[ids, None],
        }

    # -- resets -----------------------------------------------------------------------------

    def _reset_envs(self, ids: np.ndarray) -> None:
        k = len(ids)
        qpos, qvel = self.sim.qpos, self.sim.qvel
        qpos[ids, 0:2] += self.rng.uniform(-0.5, 0.5, (k, 2))
        qpos[ids, 3:7] = yaw_quat(self.rng.uniform(-np.pi, np.pi, k))  # the keyframe faces +x, unrotated
        joints = DEFAULT_POSE * self.rng.uniform(0.5, 1.5, (k, len(JOINTS)))
        qpos[ids, self.joints.qpos] = joints
        self.sim.ctrl[ids] = joints
        qvel[ids, 0:6] = self.rng.uniform(-0.5, 0.5, (k, 6))
        self.feet.reset(ids)
        self.commands.resample(ids)
        self.phase[ids] = [0.0, np.pi]  # the feet half a cycle apart
        self.phase_step[ids] = 2 * np.pi * self.dt * self.rng.uniform(*self.cfg.gait_frequency, k)
        self.push_interval[ids] = np.round(self.rng.uniform(*self.cfg.push_interval, k) / self.dt).astype(np.int64)
        self.steps_to_push[ids] = self.push_interval[ids]
        self.yaw_rate_mean[ids] = 0.0


def swing_height_target(phase: np.ndarray, height: float) -> np.ndarray:
    """The gait clock's foot-height target: up to `height` over the first half of the cycle, back
    down over the second, each along a cubic Bézier (zero slope at the ends)."""
    x = (phase + np.pi) / (2 * np.pi)

    def bezier(start, end, t):
        return start + (end - start) * (t ** 3 + 3 * t ** 2 * (1 - t))

    return np.where(x <= 0.5, bezier(0.0, height, 2 * x), bezier(height, 0.0, 2 * x - 1))
