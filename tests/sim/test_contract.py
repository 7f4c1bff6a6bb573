"""Every BatchSim backend meets the contract in hetlab.sim.contract."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest

from hetlab.errors import UserError
from hetlab.sim.contract import BatchSim, DomainRandomisable

TOY_CART_X0 = 2.0  # x of the toy scene's cart body when its slide joint is at 0


def _spread(sim, steps: int = 5, seed: int = 0) -> None:
    """Step with random controls so that the envs' states differ from each other."""
    rng = np.random.default_rng(seed)
    nu = sim.ctrl.shape[1]
    for _ in range(steps):
        sim.step(rng.uniform(-1, 1, (sim.num_envs, nu)), 2)


def _state(sim) -> tuple[np.ndarray, ...]:
    return sim.qpos.copy(), sim.qvel.copy(), sim.ctrl.copy()


# -- protocol and shapes ---------------------------------------------------------------------


def test_backend_satisfies_protocols(make_sim, scene):
    sim = make_sim(scene, num_envs=3)
    assert isinstance(sim, BatchSim)
    assert isinstance(sim, DomainRandomisable)
    model = scene.model
    assert sim.num_envs == 3
    assert sim.timestep == pytest.approx(model.opt.timestep)
    assert sim.qpos.shape == (3, model.nq)
    assert sim.qvel.shape == (3, model.nv)
    assert sim.ctrl.shape == (3, model.nu)
    assert sim.divergences == 0
    names = sim.actuator_names()
    assert names == [model.actuator(i).name for i in range(model.nu)]


def test_starts_at_keyframe(make_sim, scene, assert_stored):
    sim = make_sim(scene, num_envs=3)
    assert_stored(sim.qpos, np.tile(scene.key_qpos, (3, 1)))
    assert_stored(sim.qvel, np.tile(scene.key_qvel, (3, 1)))
    assert_stored(sim.ctrl, np.tile(scene.key_ctrl, (3, 1)))


@pytest.mark.parametrize("num_envs", [0, -2])
def test_no_envs_is_a_user_error(backend, toy_scene, num_envs):
    with pytest.raises(UserError, match=str(num_envs)):
        backend(toy_scene.spec, num_envs, threads=1, seed=0, keyframe=toy_scene.keyframe)


def test_step_returns_bool_mask(make_sim, scene):
    sim = make_sim(scene, num_envs=5)
    for ctrl in (None, np.zeros((5, scene.model.nu))):
        mask = sim.step(ctrl, 3)
        assert isinstance(mask, np.ndarray)
        assert mask.shape == (5,)
        assert mask.dtype == bool
        assert not mask.any()


def test_joint_index_matches_model(make_sim, toy_scene):
    sim = make_sim(toy_scene)
    model = toy_scene.model
    for name in ("free", "slide", "hinge", "ball"):
        joint = model.joint(name)
        assert sim.joint_index(name) == (int(joint.qposadr[0]), int(joint.dofadr[0]))
    assert all(isinstance(i, int) for i in sim.joint_index("hinge"))


# -- live views ------------------------------------------------------------------------------


def test_qpos_write_is_the_next_steps_state(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=3)
    ref = make_sim(toy_scene, num_envs=3)
    slide, _ = sim.joint_index("slide")
    qpos = sim.qpos  # keep the view: it must stay live
    qpos[1, slide] = 0.75
    sim.step(None, 1)
    ref.step(None, 1)
    # env 1 continued from the written position, not from the keyframe's
    assert sim.qpos[1, slide] == pytest.approx(0.75 + (ref.qpos[1, slide] - toy_scene.key_qpos[slide]))
    assert qpos[1, slide] == sim.qpos[1, slide]  # the old reference sees the new state
    assert not np.array_equal(qpos[1], toy_scene.key_qpos)
    # the other envs did not notice
    np.testing.assert_array_equal(sim.qpos[[0, 2]], ref.qpos[[0, 2]])
    np.testing.assert_array_equal(sim.qvel[[0, 2]], ref.qvel[[0, 2]])


def test_qvel_and_ctrl_writes_are_used(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=3)
    ref = make_sim(toy_scene, num_envs=3)
    slide_q, slide_dof = sim.joint_index("slide")
    push = sim.actuator_names().index("push")
    sim.qvel[0, slide_dof] = 3.0
    sim.ctrl[2, push] = -1.0  # step(None) keeps controls written into the view
    sim.step(None, 2)
    ref.step(None, 2)
    assert sim.qpos[0, slide_q] > ref.qpos[0, slide_q] + 0.02  # moved ~3 m/s · 10 ms further
    assert sim.qvel[2, slide_dof] < ref.qvel[2, slide_dof]  # pushed the other way
    np.testing.assert_array_equal(sim.ctrl[2], [-1.0, toy_scene.key_ctrl[1]])
    np.testing.assert_array_equal(sim.qpos[1], ref.qpos[1])


def test_step_ctrl_argument_is_written_to_view(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=2)
    ctrl = np.array([[0.3, -0.2], [-0.7, 0.4]])
    sim.step(ctrl, 1)
    np.testing.assert_array_equal(sim.ctrl, ctrl)
    sim.step(None, 1)
    np.testing.assert_array_equal(sim.ctrl, ctrl)


def test_sensor_and_body_pose_shapes(make_sim, toy_scene, go1_scene):
    sim = make_sim(toy_scene, num_envs=3)
    assert sim.sensor("hinge_pos").shape == (3, 1)
    assert sim.sensor("tip_pos").shape == (3, 3)
    assert sim.sensor("tip_quat").shape == (3, 4)
    pos, quat = sim.body_pose("pole")
    assert pos.shape == (3, 3) and quat.shape == (3, 4)
    go1 = make_sim(go1_scene, num_envs=2)
    assert go1.sensor("FR_pos").shape == (2, 3)
    pos, quat = go1.body_pose("trunk")
    assert pos.shape == (2, 3) and quat.shape == (2, 4)


def test_sensor_and_body_pose_update_after_step(make_sim, toy_scene, derived_atol):
    """Derived values describe the state before the last substep, as mj_step leaves them;
    after `forward` they describe the current state."""
    sim = make_sim(toy_scene, num_envs=3)
    ref = make_sim(toy_scene, num_envs=3)  # steps one substep at a time, to see that state
    hinge_q, _ = sim.joint_index("hinge")
    slide_q, _ = sim.joint_index("slide")
    hinge = sim.sensor("hinge_pos")
    cart_pos, _ = sim.body_pose("cart")
    _, pole_quat = sim.body_pose("pole")
    rng = np.random.default_rng(0)
    for substeps in (1, 3, 2):
        ctrl = rng.uniform(-1, 1, (3, 2))
        for _ in range(substeps - 1):
            ref.step(ctrl, 1)
        before = ref.qpos.copy()
        ref.step(ctrl, 1)
        sim.step(ctrl, substeps)
        np.testing.assert_array_equal(sim.qpos, ref.qpos)
        # the views taken before stepping now hold every env's pre-last-substep state
        np.testing.assert_allclose(hinge[:, 0], before[:, hinge_q], rtol=0, atol=derived_atol)
        np.testing.assert_allclose(cart_pos[:, 0], TOY_CART_X0 + before[:, slide_q], atol=derived_atol)
        half = 0.5 * before[:, hinge_q]
        expected = np.stack([np.cos(half), 0 * half, np.sin(half), 0 * half], axis=1)
        np.testing.assert_allclose(pole_quat, expected, atol=derived_atol)
        assert not np.allclose(before[:, hinge_q], sim.qpos[:, hinge_q])
    sim.forward(np.arange(3))
    np.testing.assert_allclose(hinge[:, 0], sim.qpos[:, hinge_q], atol=derived_atol)
    np.testing.assert_allclose(cart_pos[:, 0], TOY_CART_X0 + sim.qpos[:, slide_q], atol=derived_atol)


def test_views_hold_the_initial_state_right_after_construction(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=2)
    hinge_q, _ = sim.joint_index("hinge")
    np.testing.assert_allclose(sim.sensor("hinge_pos")[:, 0], sim.qpos[:, hinge_q])
    _, quat = sim.body_pose("pole")
    np.testing.assert_allclose(np.linalg.norm(quat, axis=1), 1.0)



# -- reset -----------------------------------------------------------------------------------


def test_joint_range_is_the_model_s_limits(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=1)
    assert sim.joint_range("hinge") == (-1.0, 1.5)
    assert sim.joint_range("slide") == (-np.inf, np.inf)
    with pytest.raises(UserError, match="no joint named 'elbow'"):
        sim.joint_range("elbow")


def test_mocap_pose_is_live_state_that_reset_restores(make_sim, toy_scene, assert_stored):
    sim = make_sim(toy_scene, num_envs=3)
    pos, quat = sim.mocap_pose("target")
    assert pos.shape == (3, 3) and quat.shape == (3, 4)
    np.testing.assert_array_equal(pos, np.tile([0, 1, 1.2], (3, 1)))  # the keyframe's, not the MJCF's
    np.testing.assert_array_equal(quat, np.tile([0, 1, 0, 0], (3, 1)))
    pos[1], quat[1] = [0.5, -0.5, 2.0], [0.0, 0.0, 0.0, 1.0]
    sim.forward(np.array([1]))
    body_pos, body_quat = sim.body_pose("target")
    np.testing.assert_array_equal(body_pos[1], [0.5, -0.5, 2.0])
    assert abs(body_quat[1] @ [0, 0, 0, 1]) == pytest.approx(1.0)  # q and −q are the same rotation
    assert_stored(body_pos[0], [0, 1, 1.2])
    state = sim.get_state()
    sim.step(None, 2)
    np.testing.assert_array_equal(pos[1], [0.5, -0.5, 2.0])  # the physics never moves a mocap body
    sim.reset(np.array([1]))
    np.testing.assert_array_equal(sim.mocap_pose("target")[0][1], [0, 1, 1.2])
    sim.set_state(state)
    np.testing.assert_array_equal(sim.mocap_pose("target")[1][1], [0, 0, 0, 1])
    with pytest.raises(UserError, match="body 'box' is not a mocap body"):
        sim.mocap_pose("box")


def test_subset_reset_touches_only_those_envs(make_sim, scene, assert_stored):
    n = 6
    sim = make_sim(scene, num_envs=n)
    _spread(sim)
    qpos, qvel, ctrl = _state(sim)
    assert not np.array_equal(qpos[1], scene.key_qpos)
    ids = np.array([1, 4])
    others = np.setdiff1d(np.arange(n), ids)
    sim.reset(ids)
    sim.forward(ids)
    assert_stored(sim.qpos[ids], np.tile(scene.key_qpos, (2, 1)))
    assert_stored(sim.qvel[ids], np.tile(scene.key_qvel, (2, 1)))
    assert_stored(sim.ctrl[ids], np.tile(scene.key_ctrl, (2, 1)))
    np.testing.assert_array_equal(sim.qpos[others], qpos[others])
    np.testing.assert_array_equal(sim.qvel[others], qvel[others])
    np.testing.assert_array_equal(sim.ctrl[others], ctrl[others])


def test_subset_reset_then_step_matches_fresh_envs(make_sim, toy_scene):
    """A reset env continues exactly like a freshly built one; the others as if nothing happened."""
    n = 4
    sim, untouched, fresh = make_sim(toy_scene, n), make_sim(toy_scene, n), make_sim(toy_scene, n)
    _spread(sim)
    _spread(untouched)
    ids = np.array([0, 2])
    sim.reset(ids)
    sim.forward(ids)
    sim.ctrl[ids] = 0.2
    sim.ctrl[[1, 3]] = untouched.ctrl[[1, 3]]
    fresh.ctrl[:] = 0.2
    for _ in range(3):
        sim.step(None, 2)
        untouched.step(None, 2)
        fresh.step(None, 2)
    np.testing.assert_array_equal(sim.qpos[ids], fresh.qpos[ids])
    np.testing.assert_array_equal(sim.qvel[ids], fresh.qvel[ids])
    np.testing.assert_array_equal(sim.qpos[[1, 3]], untouched.qpos[[1, 3]])
    np.testing.assert_array_equal(sim.qvel[[1, 3]], untouched.qvel[[1, 3]])


def test_forward_refreshes_only_given_envs(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=4)
    tip = sim.sensor("tip_pos")
    _spread(sim)
    before = tip.copy()
    sim.reset(np.array([2]))
    sim.forward(np.array([2]))
    np.testing.assert_array_equal(tip[[0, 1, 3]], before[[0, 1, 3]])
    sim.forward(np.arange(4))
    key_tip = tip[2].copy()
    fresh = make_sim(toy_scene, num_envs=1)
    fresh_tip = fresh.sensor("tip_pos")
    fresh.forward(np.arange(1))
    np.testing.assert_allclose(key_tip, fresh_tip[0], atol=1e-12)


def test_empty_reset_is_a_no_op(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=3)
    _spread(sim)
    qpos, qvel, _ = _state(sim)
    sim.reset(np.array([], dtype=np.int64), noise=0.5)
    np.testing.assert_array_equal(sim.qpos, qpos)
    np.testing.assert_array_equal(sim.qvel, qvel)


@pytest.mark.parametrize("noise", [0.05, 0.3])
def test_reset_noise_perturbs_only_hinge_and_slide_joints(make_sim, scene, noise):
    n = 32
    sim = make_sim(scene, num_envs=n)
    _spread(sim)
    sim.reset(np.arange(n), noise=noise)
    model = scene.model
    noisy_q = np.zeros(model.nq, bool)
    noisy_v = np.zeros(model.nv, bool)
    for j in range(model.njnt):
        if model.jnt_type[j] in (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE)):
            noisy_q[model.jnt_qposadr[j]] = True
            noisy_v[model.jnt_dofadr[j]] = True
    assert noisy_q.any()
    dq = sim.qpos - scene.key_qpos
    dv = sim.qvel - scene.key_qvel
    # free and ball joints exactly at the keyframe
    np.testing.assert_array_equal(dq[:, ~noisy_q], 0.0)
    np.testing.assert_array_equal(dv[:, ~noisy_v], 0.0)
    # hinge and slide joints within ±noise, and really perturbed, differently per env
    for d in (dq[:, noisy_q], dv[:, noisy_v]):
        assert np.all(np.abs(d) <= noise)
        assert np.all(d != 0.0)
        assert len(np.unique(d[:, 0])) == n
        assert d.max() > 0.5 * noise and d.min() < -0.5 * noise  # spread over the range


def test_reset_noise_is_seeded(make_sim, backend, toy_scene):
    def noisy_start(seed):
        sim = backend(toy_scene.spec, 4, threads=1, seed=seed, keyframe=toy_scene.keyframe)
        sim.reset(np.arange(4), noise=0.1)
        return sim.qpos.copy()

    np.testing.assert_array_equal(noisy_start(3), noisy_start(3))
    assert not np.array_equal(noisy_start(3), noisy_start(4))


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lookup",
    [
        lambda sim: sim.sensor("no_such_sensor"),
        lambda sim: sim.body_pose("no_such_body"),
        lambda sim: sim.joint_index("no_such_joint"),
        lambda sim: sim.object_id("geom", "no_such_geom"),
        lambda sim: sim.object_id("actuator", "no_such_actuator"),
    ],
    ids=["sensor", "body", "joint", "geom", "actuator"],
)
def test_unknown_names_are_user_errors(make_sim, toy_scene, lookup):
    sim = make_sim(toy_scene)
    with pytest.raises(UserError, match=r"no_such_\w+") as info:
        lookup(sim)
    assert "\n" not in str(info.value)


def test_unknown_model_field_or_kind_is_a_user_error(make_sim, toy_scene):
    sim = make_sim(toy_scene)
    with pytest.raises(UserError, match="not_a_field"):
        sim.model_field("not_a_field")
    with pytest.raises(UserError, match="gizmo"):
        sim.object_id("gizmo", "box")


# -- per-env model fields (DomainRandomisable) ----------------------------------------------


def test_model_field_starts_at_model_value_and_is_per_env(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=3)
    model = toy_scene.model
    mass = sim.model_field("body_mass")
    assert mass.shape == (3, model.nbody)
    np.testing.assert_array_equal(mass, np.tile(model.body_mass, (3, 1)))
    friction = sim.model_field("geom_friction")
    assert friction.shape == (3, model.ngeom, 3)
    assert sim.object_id("geom", "floor") == model.geom("floor").id
    assert sim.object_id("body", "cart") == model.body("cart").id


def test_model_field_writes_change_only_that_envs_physics(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=3)
    ref = make_sim(toy_scene, num_envs=3)
    mass = sim.model_field("body_mass")
    for body in ("cart", "pole", "bob"):
        mass[1, sim.object_id("body", body)] *= 3.0
    sim.commit_model_fields(np.array([1]))
    _, slide_dof = sim.joint_index("slide")
    ctrl = np.tile([1.0, 0.0], (3, 1))
    for _ in range(5):
        sim.step(ctrl, 2)
        ref.step(ctrl, 2)
    # the same push moves a three times heavier cart less far
    gained = sim.qvel[1, slide_dof] - toy_scene.key_qvel[slide_dof]
    gained_ref = ref.qvel[1, slide_dof] - toy_scene.key_qvel[slide_dof]
    assert 0 < gained < 0.6 * gained_ref
    np.testing.assert_array_equal(sim.qpos[[0, 2]], ref.qpos[[0, 2]])
    np.testing.assert_array_equal(sim.qvel[[0, 2]], ref.qvel[[0, 2]])
    # a reset restores the state, not the model parameters
    sim.reset(np.array([1]))
    assert mass[1, sim.object_id("body", "cart")] == pytest.approx(3.0 * toy_scene.model.body("cart").mass[0])


def test_reset_accepts_ids_in_any_order(make_sim, toy_scene, assert_stored):
    sim = make_sim(toy_scene, num_envs=4)
    _spread(sim)
    ids = np.array([3, 1])
    sim.reset(ids)
    sim.forward(ids)
    assert_stored(sim.qpos[[1, 3]], np.tile(toy_scene.key_qpos, (2, 1)))
