"""Inverse kinematics for one ViperX arm: damped least squares on a scratch MjData.

The target is a pose of the arm's *grasp point*, a point between the fingertips fixed in the
gripper link's frame, with the gripper link's orientation. Each iteration linearises the
6-joint forward kinematics with mj_jac at that point and takes the damped least-squares step
dq = Jᵀ (J Jᵀ + λ² I)⁻¹ e on the 6-vector e = (position error, rotation-vector error), then
clips dq to the joint ranges. The damping keeps steps bounded near singularities and when a
target is out of reach (the solver then ends at the nearest pose it can find). Starting each
solve from the previous solution makes a sequence of nearby targets cheap and keeps the
joint path continuous.

The wrist reaches every gripper pose two ways: (forearm_roll, wrist_angle, wrist_rotate) and
(forearm_roll ± π, −wrist_angle, wrist_rotate ∓ π). Unchecked, a solve that passes near
wrist_angle = 0 (where the two rolls turn the gripper about one axis) may drift into either,
and demonstrations of one motion would then come in two modes 2π apart. The solver keeps
forearm_roll within ±π/2, so it returns the unflipped solution or, when only the flipped one
would reach the target, misses it visibly.

Only the chosen arm's joints move; the scratch data never touches the simulation's own.
"""

from __future__ import annotations

import mujoco
import numpy as np

from hetlab.aloha.env import ARM_JOINTS

# Between the finger pads, 12 cm along the gripper link's x axis (the fingers reach 6.4–15.4 cm).
GRASP_POINT = np.array([0.12, 0.0, 0.0])
FOREARM_ROLL_LIMIT = np.pi / 2  # the unflipped wrist (see above)


class ArmIK:
    """Joint angles of arm "left" or "right" that put its grasp point at a position and orientation."""

    def __init__(self, model: mujoco.MjModel, arm: str, damping: float = 0.02, tolerance: float = 1e-5,
                 max_iterations: int = 100):
        self.model = model
        self.data = mujoco.MjData(model)
        self.body = model.body(f"vx300s_{arm}/gripper_link").id
        joints = [model.joint(f"vx300s_{arm}/{name}").id for name in ARM_JOINTS]
        self.qpos_index = model.jnt_qposadr[joints]
        self.dof_index = model.jnt_dofadr[joints]
        self.low, self.high = model.jnt_range[joints].T
        roll = ARM_JOINTS.index("forearm_roll")
        self.low[roll] = max(self.low[roll], -FOREARM_ROLL_LIMIT)
        self.high[roll] = min(self.high[roll], FOREARM_ROLL_LIMIT)
        self.damping, self.tolerance, self.max_iterations = damping, tolerance, max_iterations
        self._jacp = np.zeros((3, model.nv))
        self._jacr = np.zeros((3, model.nv))

    def grasp_pose(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forward kinematics: the grasp point's position and the gripper's quaternion at joint angles `q`."""
        self._set(q)
        return self._point(), self.data.xquat[self.body].copy()

    def solve(self, position: np.ndarray, quat: np.ndarray, q_start: np.ndarray) -> np.ndarray:
        """Joint angles near `q_start` whose grasp point is at `position` with gripper orientation `quat`."""
        q = np.clip(np.asarray(q_start, dtype=np.float64), self.low, self.high)
        error = np.zeros(6)
        for _ in range(self.max_iterations):
            self._set(q)
            point = self._point()
            error[:3] = position - point
            error[3:] = _rotation_error(quat, self.data.xquat[self.body])
            if error @ error < self.tolerance**2:
                break
            mujoco.mj_jac(self.model, self.data, self._jacp, self._jacr, point, self.body)
            jac = np.vstack([self._jacp[:, self.dof_index], self._jacr[:, self.dof_index]])
            step = jac.T @ np.linalg.solve(jac @ jac.T + self.damping**2 * np.eye(6), error)
            q = np.clip(q + step, self.low, self.high)
        return q

    def _set(self, q: np.ndarray) -> None:
        self.data.qpos[self.qpos_index] = q
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)  # mj_jac reads the com-based frames it computes

    def _point(self) -> np.ndarray:
        return self.data.xpos[self.body] + self.data.xmat[self.body].reshape(3, 3) @ GRASP_POINT


def _rotation_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """The world-frame rotation vector that turns `current` into `target`."""
    inverse, delta, vector = np.zeros(4), np.zeros(4), np.zeros(3)
    mujoco.mju_negQuat(inverse, current)
    mujoco.mju_mulQuat(delta, target, inverse)
    mujoco.mju_quat2Vel(vector, delta, 1.0)
    return vector
