"""Reference motion clips for tracking tasks: read, checked against the robot, resampled to the
control rate, with body poses and velocities from forward kinematics on the task's own model.

A clip is an `.npz` file holding `fps` and `joint_pos` (T, 7 + J): the root's free joint (x, y, z
and a w, x, y, z quaternion) then the J joints in the model's order, optionally with `joint_names`
(J,) to check that order. Body poses stored in a clip are not used: they belong to the model it was
made with, and a few millimetres of difference in a link would read as tracking error.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import mujoco
import numpy as np

from hetlab.errors import UserError

LAYOUT = "fps and joint_pos (T, 7 + joints: root x y z, root quaternion w x y z, then the joints)"


@dataclass(frozen=True)
class MotionClip:
    """A clip at the control rate: frame k is time k·dt. Velocities are in the world frame."""

    qpos: np.ndarray  # (T, 7 + J)
    qvel: np.ndarray  # (T, 6 + J), MuJoCo's convention (root angular velocity in the root's frame)
    body_pos: np.ndarray  # (T, B, 3) the tracked bodies' origins
    body_quat: np.ndarray  # (T, B, 4)
    body_linvel: np.ndarray  # (T, B, 3)
    body_angvel: np.ndarray  # (T, B, 3)

    @property
    def frames(self) -> int:
        return len(self.qpos)


def load_motion_clip(path: str | Path, model: mujoco.MjModel, joints: Sequence[str], bodies: Sequence[str],
                     dt: float) -> MotionClip:
    """Read clip `path` for `model` (whose qpos is a free joint then `joints`) and derive the poses
    and velocities of `bodies` at every control step of length `dt`."""
    fps, joint_pos = read_motion_clip(path, joints)
    qpos = _resample(joint_pos, fps, dt, Path(path))
    qvel = np.empty((len(qpos), model.nv))
    for k in range(len(qpos)):  # central differences, one-sided at the ends
        before, after = max(k - 1, 0), min(k + 1, len(qpos) - 1)
        mujoco.mj_differentiatePos(model, qvel[k], (after - before) * dt, qpos[before], qpos[after])
    ids = [model.body(name).id for name in bodies]
    data = mujoco.MjData(model)
    shape = (len(qpos), len(ids))
    pos, quat, linvel, angvel = np.empty((*shape, 3)), np.empty((*shape, 4)), np.empty((*shape, 3)), np.empty((*shape, 3))
    velocity = np.empty(6)
    for k in range(len(qpos)):
        data.qpos[:], data.qvel[:] = qpos[k], qvel[k]
        mujoco.mj_forward(model, data)
        pos[k], quat[k] = data.xpos[ids], data.xquat[ids]
        for j, body in enumerate(ids):
            mujoco.mj_objectVelocity(model, data, mujoco.mjtObj.mjOBJ_XBODY, body, velocity, 0)
            angvel[k, j], linvel[k, j] = velocity[:3], velocity[3:]
    return MotionClip(qpos, qvel, pos, quat, linvel, angvel)


def read_motion_clip(path: str | Path, joints: Sequence[str]) -> tuple[float, np.ndarray]:
    """A clip's frame rate and joint positions (root pose, then `joints`), checked: a UserError
    for a clip that cannot be read or does not fit the robot."""
    path = Path(path)
    try:
        with np.load(path) as clip:
            arrays = {key: clip[key] for key in clip.files if key in ("fps", "joint_pos", "joint_names")}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:  # absent, truncated, damaged
        raise UserError(f"cannot read motion clip {path}: {error}; a clip is an .npz file holding {LAYOUT}") from None
    missing = [key for key in ("fps", "joint_pos") if key not in arrays]
    if missing:
        raise UserError(f"motion clip {path} lacks {', '.join(missing)}; a clip holds {LAYOUT}")
    joint_pos = np.asarray(arrays["joint_pos"], np.float64)
    if joint_pos.ndim != 2 or joint_pos.shape[1] != 7 + len(joints):
        raise UserError(f"motion clip {path} has joint_pos of shape {joint_pos.shape}; this robot needs "
                        f"(T, {7 + len(joints)}): the root's 7 values, then its {len(joints)} joints in its order")
    if "joint_names" in arrays:
        names = [str(name) for name in arrays["joint_names"]]
        if names != list(joints):
            wrong = next((i for i, (a, b) in enumerate(zip(names, joints)) if a != b), min(len(names), len(joints)))
            raise UserError(f"motion clip {path} orders its joints differently from the robot (position {wrong}: "
                            f"{names[wrong] if wrong < len(names) else 'none'} where the robot has "
                            f"{joints[wrong] if wrong < len(joints) else 'none'}); retarget it to the order "
                            f"{', '.join(joints)}")
    fps = float(np.asarray(arrays["fps"]).reshape(-1)[0])
    if not fps > 0 or len(joint_pos) < 2 or not np.isfinite(joint_pos).all():
        raise UserError(f"motion clip {path} needs fps > 0 and at least 2 finite frames (fps {fps}, "
                        f"{len(joint_pos)} frames)")
    return fps, joint_pos


def _resample(joint_pos: np.ndarray, fps: float, dt: float, path: Path) -> np.ndarray:
    """Frames at times 0, dt, 2·dt, … within the clip: linear in positions and joints, normalised
    linear (close frames) in the root quaternion, whose sign is first made continuous."""
    quat = joint_pos[:, 3:7].copy()
    for k in range(1, len(quat)):
        if quat[k] @ quat[k - 1] < 0:
            quat[k] = -quat[k]
    source = np.concatenate([joint_pos[:, :3], quat, joint_pos[:, 7:]], axis=1)
    steps = int(np.floor((len(joint_pos) - 1) / fps / dt + 1e-9)) + 1
    if steps < 2:
        raise UserError(f"motion clip {path} is shorter than two control steps of {dt} s")
    at = np.arange(steps) * dt * fps  # in source frames
    low = np.minimum(np.floor(at).astype(int), len(source) - 2)
    share = (at - low)[:, None]
    frames = (1 - share) * source[low] + share * source[low + 1]
    frames[:, 3:7] /= np.linalg.norm(frames[:, 3:7], axis=1, keepdims=True)
    return frames
