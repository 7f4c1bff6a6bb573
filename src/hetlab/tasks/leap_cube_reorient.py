"""leap-cube-reorient: a LEAP hand turning a cube in its palm to a goal orientation.

After MuJoCo Playground's LeapCubeReorient: Playground's LEAP scene (16 position actuators
with kp = 3, a 7 cm cube, a mocap goal cube), 20 Hz control over 10 ms Euler steps, actions
that move the previous joint targets by 0.5·a, and Playground's reward terms and weights
(scaled by the control period). Whenever the cube comes within 0.1 rad of the goal the policy
earns a bonus of 100 and a new goal is drawn; the episode ends when the cube falls below the
palm (z < −0.05) or after 1000 steps. The number of goals reached is each episode's
`goals` metric.

The policy sees noisy joint angles, their error to the targets, the cube's offset from the palm
and its orientation error to the goal, and its last action (57 values, as Playground). The
critic sees them exactly, with joint velocities, fingertip positions, the cube's velocities and
the domain-randomisation parameters (94). Playground's critic (128) repeats the exact values it
already holds and has 12 perturbation columns that are zeros unless its perturbations are on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from hetlab.assets import scene_xml
from hetlab.tasks.base import Index, Task, TaskConfig
from hetlab.tasks.criteria import Criterion
from hetlab.tasks.observations import ObsTerm, Observations
from hetlab.tasks.randomisation import DomainRandomiser, RandomisationConfig
from hetlab.tasks.rotations import quat_angle, quat_conjugate, quat_matrix_rows, quat_multiply, random_quat
from hetlab.tasks.terms import RewardTerm, linear_tolerance, mechanical_power, squared_norm

FINGERS = ("if", "mf", "rf")
JOINTS = [f"{finger}_{part}" for finger in FINGERS for part in ("mcp", "rot", "pip", "dip")] + \
    ["th_cmc", "th_axl", "th_mcp", "th_ipl"]
DEFAULT_POSE = np.array([0.8, 0.0, 0.8, 0.8] * 3 + [0.8, 0.8, 0.8, 0.0])  # the scene's "home" keyframe
# Joint (and so target) ranges of Playground's LEAP hand, in JOINTS order.
_FINGER_LOW, _FINGER_HIGH = [-0.314, -1.047, -0.506, -0.366], [2.23, 1.047, 1.885, 2.042]
JOINT_LOW = np.array(_FINGER_LOW * 3 + [-0.349, -0.349, -0.47, -1.34])
JOINT_HIGH = np.array(_FINGER_HIGH * 3 + [2.094, 2.094, 2.443, 1.88])
KP = 3.0  # position-actuator stiffness, N·m/rad
FORCE_LIMIT = 0.2196  # N·m, each joint's actuator force range
CUBE_START = np.array([0.1, 0.0, 0.05])  # m, above the palm
CUBE_START_SPREAD = 0.01  # m, uniform ± on each axis
HAND_START_NOISE = 0.1  # rad, Gaussian σ on the start joint angles
CUBE_FRICTION = 0.3  # the cube's sliding friction in the scene
DROP_HEIGHT = -0.05  # m; the cube below this has fallen
SUCCESS_ANGLE = 0.1  # rad between cube and goal that counts as reached
SUCCESS_BONUS = 100.0  # per goal reached
FINGERTIPS = ("th", "if", "mf", "rf")


@dataclass(frozen=True)
class LeapCubeConfig(TaskConfig):
    action_scale: float = 0.5  # radians of target change per unit action and step
    # Cube friction, every link's mass (cube included) and the actuators' kp, per env.
    randomisation: RandomisationConfig = field(
        default_factory=lambda: RandomisationConfig(friction=(0.2, 0.4), mass_scale=(0.8, 1.2), gain_scale=(0.9, 1.1)))


class LeapCubeReorient(Task):
    name = "leap-cube-reorient"
    Config = LeapCubeConfig
    control_dt = 0.05
    episode_seconds = 50.0
    keyframe = "home"
    # With Playground's noise scales (uniform ±) on the policy's copy. Playground perturbs the cube's
    # orientation-error quaternion; here its six matrix entries carry the noise, so it stays
    # proportional to `obs_noise`.
    observations = Observations(
        policy=(ObsTerm("joint_pos", 16, noise=0.05), ObsTerm("joint_target_error", 16, noise=0.05),
                ObsTerm("cube_offset", 3, noise=0.02), ObsTerm("cube_ori_error", 6, noise=0.1),
                ObsTerm("last_action", 16)),
        privileged=(ObsTerm("joint_vel", 16), ObsTerm("fingertip_pos", 3 * len(FINGERTIPS)), ObsTerm("cube_linvel", 3),
                    ObsTerm("cube_angvel", 3), ObsTerm("physics_params", 3)),  # friction, mass and gain scales
    )
    action_size = 16
    reward_scale = control_dt
    solved = (Criterion("goals", 1.0),)  # at least one goal orientation reached per episode, on average
    state_arrays = Task.state_arrays + ("previous_actions", "goals")
    rewards = {
        "orientation": RewardTerm(  # 1 within `bound` rad of the goal, falling to 0.1 at `margin` past it
            lambda task, bound, margin: linear_tolerance(task._orientation_error, bound, margin), 5.0,
            {"bound": 0.2, "margin": np.pi}),
        "position": RewardTerm(  # the cube within `bound` m of the palm
            lambda task, bound, margin: linear_tolerance(np.linalg.norm(task._palm - task._cube_pos, axis=1), bound,
                                                         margin), 0.5, {"bound": 0.02, "margin": 0.05}),
        "termination": RewardTerm(lambda task: task._dropped.astype(np.float64), -100.0),
        "hand_pose": RewardTerm(lambda task: squared_norm(task._joint_pos - DEFAULT_POSE), -0.5),
        "action_rate": RewardTerm(lambda task: task._action_rate, -0.001),
        "energy": RewardTerm(lambda task: task.energy(), -1e-3),
        # A bonus per goal, not per second: every term is scaled by the control period.
        "success": RewardTerm(lambda task: task._reached.astype(np.float64), SUCCESS_BONUS / control_dt),
    }

    @classmethod
    def check_assets(cls, cfg: LeapCubeConfig) -> None:
        scene_xml("leap_cube")

    @classmethod
    def build_spec(cls, cfg: LeapCubeConfig) -> mujoco.MjSpec:
        spec = mujoco.MjSpec.from_file(str(scene_xml("leap_cube")))
        # Sensors the task does not read cost a pass each step; the angular acceleration one
        # would also make every reset compute accelerations.
        for name in ("cube_angacc", "cube_upvector", "cube_goal_orientation", "cube_goal_upvector"):
            spec.delete(spec.sensor(name))
        for geom in spec.body("goal").geoms:  # the goal is only shown: nothing may bump into it
            geom.contype, geom.conaffinity = 0, 0
        return spec

    def __init__(self, sim, cfg: LeapCubeConfig):
        super().__init__(sim, cfg)
        first = sim.joint_index(JOINTS[0])[0]
        if [sim.joint_index(j)[0] for j in JOINTS] != list(range(first, first + len(JOINTS))):
            raise ValueError("the LEAP model's hand joints are not stored in order")
        self._hand = slice(first, first + len(JOINTS))
        cube_qpos, cube_qvel = sim.joint_index("cube_freejoint")
        self._cube_qpos = slice(cube_qpos, cube_qpos + 7)
        self._cube_qvel = slice(cube_qvel, cube_qvel + 6)
        self._palm = sim.sensor("palm_position")
        self._cube_pos = sim.sensor("cube_position")
        self._cube_quat = sim.sensor("cube_orientation")
        self._cube_linvel = sim.sensor("cube_linvel")
        self._cube_angvel = sim.sensor("cube_angvel")
        self._tips = [sim.sensor(f"{tip}_tip_position") for tip in FINGERTIPS]
        self._goal_quat = sim.mocap_pose("goal")[1]
        n = self.num_envs
        self.previous_actions = np.zeros((n, self.action_size), np.float32)  # the action before the last
        self.goals = np.zeros(n, np.int64)  # goals reached this episode
        self.randomiser = None
        if cfg.randomise:  # drawn once per env at start-up, like the Go1 task's
            self.randomiser = DomainRandomiser(sim, cfg.randomisation, ["cube"], self.rng)
            self.randomiser.apply(np.arange(n))
        self._nominal_params = np.tile(np.float32([CUBE_FRICTION, 1.0, 1.0]), (n, 1))

    # -- dynamics ---------------------------------------------------------------------------

    def _control(self, actions: np.ndarray) -> np.ndarray:
        # Relative targets: the policy nudges where the fingers are headed.
        return np.clip(self.sim.ctrl + self.cfg.action_scale * actions, JOINT_LOW, JOINT_HIGH)

    def _update_state(self, actions: np.ndarray) -> None:
        # Smoothness of first and second order, before the base class makes `actions` the last ones.
        change = actions - self.last_actions
        self._action_rate = squared_norm(change) + squared_norm(change - (self.last_actions - self.previous_actions))
        self.previous_actions[:] = self.last_actions
        self._joint_pos = self.sim.qpos[:, self._hand]
        self._orientation_error = quat_angle(quat_multiply(self._cube_quat, quat_conjugate(self._goal_quat)))
        self._reached = self._orientation_error < SUCCESS_ANGLE
        self._dropped = self._cube_pos[:, 2] < DROP_HEIGHT

    def _advance(self) -> None:
        reached = np.flatnonzero(self._reached)
        if reached.size:  # the next observation already shows the new goal
            self.goals[reached] += 1
            self._goal_quat[reached] = random_quat(self.rng, len(reached))

    def _terminated(self) -> np.ndarray:
        return self._dropped

    def energy(self) -> np.ndarray:
        """Σ|q̇|·|τ| of the hand's joints, their torques from the PD law."""
        gain = KP if self.randomiser is None else KP * self.randomiser.params[:, 2:3]
        torques = np.clip(gain * (self.sim.ctrl - self._joint_pos), -FORCE_LIMIT, FORCE_LIMIT)
        return mechanical_power(self.sim.qvel[:, self._hand], torques)

    def _observation_terms(self, ids: Index) -> dict[str, np.ndarray]:
        joints, cube_pos = self.sim.qpos[ids, self._hand], self._cube_pos[ids]
        orientation_error = quat_multiply(self._cube_quat[ids], quat_conjugate(self._goal_quat[ids]))
        return {
            "joint_pos": joints, "joint_target_error": joints - self.sim.ctrl[ids], "cube_offset": self._palm[ids] - cube_pos,
            "cube_ori_error": quat_matrix_rows(orientation_error, slice(1, None)), "last_action": self.last_actions[ids],
            "joint_vel": self.sim.qvel[ids, self._hand],
            "fingertip_pos": np.concatenate([tip[ids] for tip in self._tips], axis=1),
            "cube_linvel": self._cube_linvel[ids], "cube_angvel": self._cube_angvel[ids],
            "physics_params": self._nominal_params[ids] if self.randomiser is None else self.randomiser.params[ids],
        }

    def _episode_metrics(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        return {"goals": self.goals[ids].astype(np.float64)}

    # -- resets -----------------------------------------------------------------------------

    def _reset_envs(self, ids: np.ndarray) -> None:
        k = len(ids)
        hand = np.clip(DEFAULT_POSE + HAND_START_NOISE * self.rng.standard_normal((k, len(JOINTS))),
                       JOINT_LOW, JOINT_HIGH)
        self.sim.qpos[ids, self._hand] = hand
        self.sim.ctrl[ids] = hand  # targets start where the fingers are
        cube = np.concatenate([CUBE_START + self.rng.uniform(-CUBE_START_SPREAD, CUBE_START_SPREAD, (k, 3)),
                               random_quat(self.rng, k)], axis=1)
        self.sim.qpos[ids, self._cube_qpos] = cube
        self.sim.qvel[ids, self._cube_qvel] = 0.0
        self._goal_quat[ids] = random_quat(self.rng, k)
        self.previous_actions[ids] = 0.0
        self.goals[ids] = 0
