"""The batched quaternion helpers agree with MuJoCo's own single-quaternion functions."""

import mujoco
import numpy as np

from hetlab.tasks.rotations import projected_gravity, rotate_inverse, yaw_quat


def _random_quats(n: int, rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def test_rotate_inverse_matches_mujoco():
    rng = np.random.default_rng(0)
    quats, vecs = _random_quats(32, rng), rng.normal(size=(32, 3))
    expected = np.empty_like(vecs)
    for i in range(32):
        conjugate = np.empty(4)
        mujoco.mju_negQuat(conjugate, quats[i])
        mujoco.mju_rotVecQuat(expected[i], vecs[i], conjugate)
    np.testing.assert_allclose(rotate_inverse(quats, vecs), expected, atol=1e-12)


def test_projected_gravity_is_world_down_in_the_body_frame():
    quats = _random_quats(32, np.random.default_rng(1))
    down = np.tile([0.0, 0.0, -1.0], (32, 1))
    np.testing.assert_allclose(projected_gravity(quats), rotate_inverse(quats, down), atol=1e-12)
    np.testing.assert_allclose(projected_gravity(np.array([[1.0, 0, 0, 0]])), [[0, 0, -1]])


def test_yaw_quat_turns_about_world_z():
    yaw = np.array([0.0, np.pi / 2, -np.pi / 3])
    x_axis = np.tile([1.0, 0.0, 0.0], (3, 1))
    # Expressing world x in a frame turned by yaw gives (cos, -sin, 0).
    body = rotate_inverse(yaw_quat(yaw), x_axis)
    np.testing.assert_allclose(body, np.stack([np.cos(yaw), -np.sin(yaw), np.zeros(3)], axis=1), atol=1e-12)
