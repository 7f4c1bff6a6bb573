"""Batched quaternion helpers (MuJoCo's w, x, y, z order) for task observations."""

from __future__ import annotations

import numpy as np


def rotate_inverse(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """Express world vectors `vec` (N, 3) in the frames whose orientations are `quat` (N, 4)."""
    w = quat[:, :1]
    u = quat[:, 1:]
    t = 2.0 * _cross(u, vec)
    # Rotation by the conjugate: v - w t + u × t, with t = 2 u × v.
    return vec - w * t + _cross(u, t)


_NEXT, _PREV = [1, 2, 0], [2, 0, 1]


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Row-wise a × b; several times faster than np.cross on (N, 3) arrays.
    return a[:, _NEXT] * b[:, _PREV] - a[:, _PREV] * b[:, _NEXT]


def projected_gravity(quat: np.ndarray) -> np.ndarray:
    """World −z in the body frames: (0, 0, −1) when upright. Closed form of rotate_inverse."""
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    out = np.empty((len(quat), 3), dtype=quat.dtype)
    out[:, 0] = 2.0 * (w * y - x * z)
    out[:, 1] = -2.0 * (w * x + y * z)
    out[:, 2] = -(w * w - x * x - y * y + z * z)
    return out


def yaw_quat(yaw: np.ndarray) -> np.ndarray:
    """Quaternions (N, 4) of rotations by `yaw` about world z."""
    half = 0.5 * yaw
    return np.stack([np.cos(half), np.zeros_like(half), np.zeros_like(half), np.sin(half)], axis=1)


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Hamilton products a ⊗ b of (N, 4) quaternions: rotate by b, then by a."""
    aw, ax, ay, az = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    bw, bx, by, bz = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return np.stack([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw], axis=1)


def quat_conjugate(quat: np.ndarray) -> np.ndarray:
    """The inverse rotations of unit quaternions (N, 4)."""
    return quat * np.array([1.0, -1.0, -1.0, -1.0], quat.dtype)


def quat_angle(quat: np.ndarray) -> np.ndarray:
    """Rotation angles in [0, π] of quaternions (N, 4), normalised first; q and −q give the same."""
    unit = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    return 2.0 * np.arcsin(np.minimum(np.linalg.norm(unit[:, 1:], axis=1), 1.0))


def quat_matrix_rows(quat: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
    """Rows `rows` of the rotation matrices of unit quaternions (N, 4), flattened to (N, 3·rows)."""
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    matrix = np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], axis=1),
        np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], axis=1),
        np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], axis=1),
    ], axis=1)
    return matrix[:, rows].reshape(len(quat), -1)


def random_quat(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` orientations drawn uniformly (normalised 4-D Gaussians are uniform on the sphere)."""
    quat = rng.standard_normal((count, 4))
    return quat / np.linalg.norm(quat, axis=1, keepdims=True)
