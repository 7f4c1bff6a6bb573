"""The batched quaternion helpers agree with MuJoCo's own single-quaternion functions."""

import mujoco
import numpy as np
import pytest

from hetlab.tasks.rotations import (projected_gravity, quat_angle, quat_conjugate, quat_matrix_rows, quat_multiply,
                                   random_quat, rotate_inverse, yaw_quat)


def _random_quats(n: int, rng: np.random.Generator) -> np.ndarray:
    return random_quat(rng, n)


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


def test_products_inverses_and_matrices_match_mujoco():
    rng = np.random.default_rng(2)
    a, b = _random_quats(32, rng), _random_quats(32, rng)
    product, conjugate, matrix = np.empty((32, 4)), np.empty((32, 4)), np.empty((32, 9))
    for i in range(32):
        mujoco.mju_mulQuat(product[i], a[i], b[i])
        mujoco.mju_negQuat(conjugate[i], a[i])
        mujoco.mju_quat2Mat(matrix[i], a[i])
    np.testing.assert_allclose(quat_multiply(a, b), product, atol=1e-12)
    np.testing.assert_allclose(quat_conjugate(a), conjugate, atol=1e-12)
    np.testing.assert_allclose(quat_matrix_rows(a), matrix, atol=1e-12)
    np.testing.assert_allclose(quat_matrix_rows(a, slice(1, None)), matrix[:, 3:], atol=1e-12)


def test_quat_angle_is_the_rotation_angle_of_either_sign():
    angles = np.array([0.0, 0.1, 1.0, 3.0, np.pi])
    axis = np.array([0.6, 0.0, 0.8])
    quats = np.concatenate([np.cos(angles / 2)[:, None], np.sin(angles / 2)[:, None] * axis], axis=1)
    np.testing.assert_allclose(quat_angle(quats), angles, atol=1e-7)
    np.testing.assert_allclose(quat_angle(-3.0 * quats), angles, atol=1e-7)  # scale and sign do not matter


def test_random_quats_are_unit_and_spread_over_every_orientation():
    quats = random_quat(np.random.default_rng(3), 20_000)
    np.testing.assert_allclose(np.linalg.norm(quats, axis=1), 1.0)
    # The angle of a uniform rotation has density (1 − cos θ)/π: mean π/2 + 2/π.
    assert quat_angle(quats).mean() == pytest.approx(np.pi / 2 + 2 / np.pi, abs=0.02)
