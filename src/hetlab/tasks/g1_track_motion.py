"""g1-track-motion: the Unitree G1 following a reference motion clip with its whole body.

In the style of mjlab's tracking task and BeyondMimic: the anchor body is the torso; 14 bodies
are tracked through Gaussian kernels on the anchor's position and orientation and on the bodies'
positions, orientations and linear and angular velocities, with penalties on the action rate,
joint limits and self-collisions. The reference bodies are compared after moving the clip's
anchor onto the robot's in the plane and in heading (keeping the clip's height), so drift across
the floor costs only the anchor terms. Each episode starts at a random frame of the clip (at least
a second before its end) in the clip's pose with some noise, and follows the clip until it ends,
10 s pass, or the robot loses it: the anchor's height or tilt, or a foot's or hand's height, off
by more than a threshold.

The policy sees the reference joints and joint velocities of the current frame, the reference
anchor's orientation relative to its own, its pelvis gyro, joints, joint velocities and last
action (154 values); the critic sees those exactly, with the reference anchor's position in its
anchor frame, every tracked body's pose in that frame and the pelvis's linear velocity.
Mean body-position and joint errors per episode are reported as episode metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mujoco
import numpy as np

from hetlab.assets import motion_clip_path, scene_xml
from hetlab.tasks.base import Index, Task, TaskConfig
from hetlab.tasks.criteria import Criterion
from hetlab.tasks.g1 import DEFAULT_POSE, JOINTS, G1Joints, g1_flat_spec
from hetlab.tasks.motion_clip import load_motion_clip, read_motion_clip
from hetlab.tasks.observations import ObsTerm, Observations
from hetlab.tasks.randomisation import DomainRandomiser, RandomisationConfig
from hetlab.tasks.rotations import (
    projected_gravity,
    quat_angle,
    quat_conjugate,
    quat_matrix_rows,
    quat_multiply,
    rotate_inverse,
    yaw_quat,
)
from hetlab.tasks.terms import RewardTerm, joint_limit_violation, squared_norm

ANCHOR = "torso_link"
BODIES = ("pelvis", "left_hip_roll_link", "left_knee_link", "left_ankle_roll_link", "right_hip_roll_link",
          "right_knee_link", "right_ankle_roll_link", "torso_link", "left_shoulder_roll_link", "left_elbow_link",
          "left_wrist_yaw_link", "right_shoulder_roll_link", "right_elbow_link", "right_wrist_yaw_link")
END_EFFECTORS = np.array([BODIES.index(b) for b in ("left_ankle_roll_link", "right_ankle_roll_link",
                                                     "left_wrist_yaw_link", "right_wrist_yaw_link")])
MAX_ANCHOR_HEIGHT_ERROR = 0.25  # m
MAX_ANCHOR_TILT_ERROR = 0.8  # difference of the gravity direction's z in the anchor frames
MAX_END_EFFECTOR_HEIGHT_ERROR = 0.25  # m
MIN_FRAMES_LEFT = 50  # an episode starts at least this many control steps before the clip ends
SELF_CONTACTS = ("right_foot_left_foot_found", "left_hand_left_thigh_found", "right_hand_right_thigh_found")


@dataclass(frozen=True)
class G1TrackMotionConfig(TaskConfig):
    motion: str = ""  # the reference clip (.npz); "" = the box lift from the holosoma wheel
    action_scale: float = 0.5  # joint targets = knees-bent pose + scale × action
    randomisation: RandomisationConfig = field(default_factory=RandomisationConfig)
    start_position_noise: float = 0.05  # m, uniform ± on the start's root x, y
    start_angle_noise: float = 0.1  # rad, uniform ± on the start's root roll, pitch and yaw
    start_joint_noise: float = 0.1  # rad, uniform ± on the start's joints (kept within their limits)


class G1TrackMotion(Task):
    name = "g1-track-motion"
    Config = G1TrackMotionConfig
    control_dt = 0.02
    episode_seconds = 10.0
    keyframe = "knees_bent"
    # BeyondMimic's, with its noise (uniform ±) on the policy's copy. The anchor's orientation error and
    # the bodies' orientations are the first two rows of their rotation matrices.
    observations = Observations(
        policy=(ObsTerm("reference_joint_pos", 29), ObsTerm("reference_joint_vel", 29),
                ObsTerm("anchor_ori_error", 6, noise=0.05), ObsTerm("gyro", 3, noise=0.2),
                ObsTerm("joint_pos", 29, noise=0.01), ObsTerm("joint_vel", 29, noise=0.5), ObsTerm("last_action", 29)),
        privileged=(ObsTerm("anchor_pos_error", 3), ObsTerm("body_pos", 3 * len(BODIES)),
                    ObsTerm("body_ori", 6 * len(BODIES)), ObsTerm("pelvis_linvel", 3)),
    )
    action_size = 29
    reward_scale = control_dt
    # Follows the clip: ≥ 90 % of episodes reach its end upright, its bodies within 10 cm on average.
    solved = (Criterion("survival", 0.9), Criterion("body_pos_error", 0.10, at_least=False))
    state_arrays = Task.state_arrays + ("frame", "body_error_sum", "joint_error_sum")
    # BeyondMimic's: Gaussian kernels exp(−error² / std²) of the tracking errors (std in m, rad, m/s, rad/s).
    rewards = {
        "anchor_pos": RewardTerm(lambda task, std: _kernel(squared_norm(task.anchor_pos_error()), std), 0.5,
                                 {"std": 0.3}),
        "anchor_ori": RewardTerm(lambda task, std: _kernel(task.anchor_angle_error() ** 2, std), 0.5, {"std": 0.4}),
        "body_pos": RewardTerm(lambda task, std: _kernel(np.square(task._body_error).mean(axis=1), std), 1.0,
                               {"std": 0.3}),
        "body_ori": RewardTerm(lambda task, std: _kernel(np.square(task.body_angle_error()).mean(axis=1), std), 1.0,
                               {"std": 0.4}),
        "body_linvel": RewardTerm(lambda task, std: _kernel(task.body_velocity_error(task._linvel, "linvel"), std), 1.0,
                                  {"std": 1.0}),
        "body_angvel": RewardTerm(lambda task, std: _kernel(task.body_velocity_error(task._angvel, "angvel"), std), 1.0,
                                  {"std": 3.14}),
        "action_rate": RewardTerm(lambda task: squared_norm(task.actions - task.last_actions), -0.1),
        "joint_limit": RewardTerm(lambda task: joint_limit_violation(
            task.sim.qpos[:, task.joints.qpos], task.joints.soft_low, task.joints.soft_high), -10.0),
        "self_collision": RewardTerm(
            lambda task: sum((found[:, 0] > 0).astype(np.float64) for found in task._self_contacts), -0.1),
    }

    @classmethod
    def check_assets(cls, cfg: G1TrackMotionConfig) -> None:
        scene_xml("g1_flat")
        read_motion_clip(motion_clip_path(cfg.motion), JOINTS)  # before a collector starts to build the task

    @classmethod
    def build_spec(cls, cfg: G1TrackMotionConfig) -> mujoco.MjSpec:
        spec = g1_flat_spec()
        for body in BODIES:  # world-frame velocities of each tracked body's origin
            for kind, sensor in (("linvel", mujoco.mjtSensor.mjSENS_FRAMELINVEL),
                                 ("angvel", mujoco.mjtSensor.mjSENS_FRAMEANGVEL)):
                spec.add_sensor(name=f"{body}_{kind}", type=sensor, objtype=mujoco.mjtObj.mjOBJ_XBODY, objname=body)
        return spec

    def __init__(self, sim, cfg: G1TrackMotionConfig):
        super().__init__(sim, cfg)
        self.joints = G1Joints(sim)
        model = self.build_model(cfg)
        self.clip = load_motion_clip(motion_clip_path(cfg.motion), model, JOINTS, BODIES, self.dt)
        if self.clip.frames <= MIN_FRAMES_LEFT:
            raise ValueError(f"the motion clip lasts {self.clip.frames} control steps; tracking needs more than "
                             f"{MIN_FRAMES_LEFT}")
        self._anchor = BODIES.index(ANCHOR)
        self._poses = [sim.body_pose(body) for body in BODIES]
        self._linvel = [sim.sensor(f"{body}_linvel") for body in BODIES]
        self._angvel = [sim.sensor(f"{body}_angvel") for body in BODIES]
        self._gyro = sim.sensor("gyro_pelvis")
        self._pelvis_linvel = sim.sensor("local_linvel_pelvis")
        self._self_contacts = [sim.sensor(name) for name in SELF_CONTACTS]
        n = self.num_envs
        self.frame = np.zeros(n, np.int64)  # the clip frame the robot should be in now
        self.body_error_sum = np.zeros(n)  # over the episode's steps, for its mean
        self.joint_error_sum = np.zeros(n)
        self.randomiser = None
        if cfg.randomise:
            self.randomiser = DomainRandomiser(sim, cfg.randomisation, ["floor"], self.rng)
            self.randomiser.apply(np.arange(n))
        self._targets = np.tile(DEFAULT_POSE, (n, 1))

    # -- dynamics ---------------------------------------------------------------------------

    def _control(self, actions: np.ndarray) -> np.ndarray:
        np.multiply(actions, self.cfg.action_scale, out=self._targets)
        self._targets += DEFAULT_POSE
        return self._targets

    def _update_state(self, actions: np.ndarray) -> None:
        self.frame = np.minimum(self.frame + 1, self.clip.frames - 1)
        robot_pos = np.stack([pos for pos, _ in self._poses], axis=1)  # (N, B, 3)
        robot_quat = np.stack([quat for _, quat in self._poses], axis=1)
        reference = self._reference(slice(None), robot_pos[:, self._anchor], robot_quat[:, self._anchor])
        self._robot = robot_pos, robot_quat
        self._ref = reference
        self._body_error = np.linalg.norm(robot_pos - reference["body_pos"], axis=2)  # (N, B)
        joint_error = np.abs(self.sim.qpos[:, self.joints.qpos] - self.clip.qpos[self.frame, 7:]).mean(axis=1)
        self.body_error_sum += self._body_error.mean(axis=1)
        self.joint_error_sum += joint_error

    def _reference(self, ids: Index, anchor_pos: np.ndarray, anchor_quat: np.ndarray) -> dict[str, np.ndarray]:
        """The clip's bodies at each env's frame, and their poses moved so that the clip's anchor
        sits on the robot's anchor in x, y and heading (keeping the clip's height)."""
        frame = self.frame[ids]
        pos, quat = self.clip.body_pos[frame], self.clip.body_quat[frame]
        ref_anchor_pos, ref_anchor_quat = pos[:, self._anchor], quat[:, self._anchor]
        heading = yaw_quat(_yaw(anchor_quat) - _yaw(ref_anchor_quat))
        shift = anchor_pos.copy()
        shift[:, 2] = ref_anchor_pos[:, 2]
        n, b = pos.shape[:2]
        offsets = (pos - ref_anchor_pos[:, None]).reshape(-1, 3)
        turn = np.repeat(heading, b, axis=0)
        moved = shift[:, None] + rotate_inverse(quat_conjugate(turn), offsets).reshape(n, b, 3)
        turned = quat_multiply(turn, quat.reshape(-1, 4)).reshape(n, b, 4)
        return {"anchor_pos": ref_anchor_pos, "anchor_quat": ref_anchor_quat, "body_pos": moved,
                "body_quat": turned, "linvel": self.clip.body_linvel[frame], "angvel": self.clip.body_angvel[frame]}

    def _timed_out(self) -> np.ndarray:
        return (self.episode_step >= self.max_episode_steps) | (self.frame >= self.clip.frames - 1)

    def _terminated(self) -> np.ndarray:
        robot_pos, robot_quat = self._robot
        ref = self._ref
        anchor = self._anchor
        height = np.abs(robot_pos[:, anchor, 2] - ref["anchor_pos"][:, 2]) > MAX_ANCHOR_HEIGHT_ERROR
        tilt = np.abs(projected_gravity(robot_quat[:, anchor])[:, 2]
                      - projected_gravity(ref["anchor_quat"])[:, 2]) > MAX_ANCHOR_TILT_ERROR
        ends = np.abs(robot_pos[:, END_EFFECTORS, 2] - ref["body_pos"][:, END_EFFECTORS, 2]) \
            > MAX_END_EFFECTOR_HEIGHT_ERROR
        return height | tilt | ends.any(axis=1)

    # -- the tracking errors the reward terms weigh --------------------------------------------

    def anchor_pos_error(self) -> np.ndarray:
        return self._robot[0][:, self._anchor] - self._ref["anchor_pos"]

    def anchor_angle_error(self) -> np.ndarray:
        return quat_angle(quat_multiply(quat_conjugate(self._ref["anchor_quat"]), self._robot[1][:, self._anchor]))

    def body_angle_error(self) -> np.ndarray:
        """(N, B): each tracked body's angle from the clip's."""
        robot_quat = self._robot[1]
        n, b = robot_quat.shape[:2]
        return quat_angle(quat_multiply(quat_conjugate(self._ref["body_quat"].reshape(-1, 4)),
                                        robot_quat.reshape(-1, 4))).reshape(n, b)

    def body_velocity_error(self, sensors: list[np.ndarray], reference: str) -> np.ndarray:
        """The tracked bodies' mean squared velocity error against the clip's `reference` velocities."""
        return np.square(np.stack(sensors, axis=1) - self._ref[reference]).sum(axis=2).mean(axis=1)

    def _observation_terms(self, ids: Index) -> dict[str, np.ndarray]:
        qpos, qvel = self.sim.qpos[ids], self.sim.qvel[ids]
        frame = self.frame[ids]
        robot_pos = np.stack([pos[ids] for pos, _ in self._poses], axis=1)
        robot_quat = np.stack([quat[ids] for _, quat in self._poses], axis=1)
        anchor_pos, anchor_quat = robot_pos[:, self._anchor], robot_quat[:, self._anchor]
        ref_anchor_pos = self.clip.body_pos[frame, self._anchor]
        ref_anchor_quat = self.clip.body_quat[frame, self._anchor]
        n, b = robot_pos.shape[:2]
        to_anchor = np.repeat(quat_conjugate(anchor_quat), b, axis=0)
        body_pos = rotate_inverse(np.repeat(anchor_quat, b, axis=0),
                                  (robot_pos - anchor_pos[:, None]).reshape(-1, 3)).reshape(n, -1)
        body_ori = quat_matrix_rows(quat_multiply(to_anchor, robot_quat.reshape(-1, 4)), slice(0, 2)).reshape(n, -1)
        return {
            "reference_joint_pos": self.clip.qpos[frame, 7:], "reference_joint_vel": self.clip.qvel[frame, 6:],
            "anchor_ori_error": quat_matrix_rows(quat_multiply(quat_conjugate(anchor_quat), ref_anchor_quat), slice(0, 2)),
            "gyro": self._gyro[ids], "joint_pos": qpos[:, self.joints.qpos] - DEFAULT_POSE,
            "joint_vel": qvel[:, self.joints.qvel], "last_action": self.last_actions[ids],
            "anchor_pos_error": rotate_inverse(anchor_quat, ref_anchor_pos - anchor_pos), "body_pos": body_pos,
            "body_ori": body_ori, "pelvis_linvel": self._pelvis_linvel[ids],
        }

    # -- episodes ---------------------------------------------------------------------------

    def _reset_envs(self, ids: np.ndarray) -> None:
        k = len(ids)
        cfg = self.cfg
        frame = self.rng.integers(0, self.clip.frames - MIN_FRAMES_LEFT, k)
        self.frame[ids] = frame
        self.body_error_sum[ids] = 0.0
        self.joint_error_sum[ids] = 0.0
        start = self.clip.qpos[frame].copy()
        start[:, :2] += self.rng.uniform(-cfg.start_position_noise, cfg.start_position_noise, (k, 2))
        tilt = self.rng.uniform(-cfg.start_angle_noise, cfg.start_angle_noise, (k, 3))
        start[:, 3:7] = quat_multiply(start[:, 3:7], _small_rotation(tilt))
        joints = start[:, 7:] + self.rng.uniform(-cfg.start_joint_noise, cfg.start_joint_noise, (k, len(JOINTS)))
        start[:, 7:] = np.clip(joints, self.joints.low, self.joints.high)
        self.sim.qpos[ids] = start
        self.sim.qvel[ids] = self.clip.qvel[frame]
        self.sim.ctrl[ids] = start[:, 7:]

    def _episode_metrics(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        steps = np.maximum(self.episode_step[ids], 1)
        return {"body_pos_error": self.body_error_sum[ids] / steps, "joint_error": self.joint_error_sum[ids] / steps}


def _kernel(squared_error: np.ndarray, std: float) -> np.ndarray:
    return np.exp(-squared_error / std ** 2)


def _yaw(quat: np.ndarray) -> np.ndarray:
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    return np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def _small_rotation(angles: np.ndarray) -> np.ndarray:
    """Quaternions of rotations by the vectors `angles` (N, 3) (axis × angle)."""
    angle = np.linalg.norm(angles, axis=1, keepdims=True)
    axis = np.divide(angles, angle, out=np.zeros_like(angles), where=angle > 0)
    return np.concatenate([np.cos(0.5 * angle), np.sin(0.5 * angle) * axis], axis=1)
