"""A diverged env is flagged, counted and reset; the rest of the batch never notices."""

from __future__ import annotations

import numpy as np
import pytest

N = 6
BAD = 2  # the env that diverges


def _ctrl_sequence(model, steps: int) -> np.ndarray:
    return np.random.default_rng(11).uniform(-1, 1, (steps, N, model.nu))


def _nan_qvel(sim, ctrl):
    sim.qvel[BAD] = np.nan


def _nan_qpos(sim, ctrl):
    sim.qpos[BAD, -1] = np.nan


def _huge_qvel(sim, ctrl):
    sim.qvel[BAD, -1] = 1e30


def _huge_ctrl(sim, ctrl):
    # The toy's position actuator on the hinge: kp · 1e9 N·m makes qacc blow past MuJoCo's
    # own 1e10 limit, so MuJoCo itself warns and resets.
    ctrl[BAD, 1] = 1e9


def _qacc_over_limit(sim, ctrl):
    # kp · 1e6 gives |qacc| ~ 1e8..1e9 in the first substep: below MuJoCo's 1e10 limit, so only
    # the sim's own acceleration check can catch it (the step below takes one substep).
    ctrl[BAD, 1] = 1e6


INJECTIONS = {
    "nan_qvel": (_nan_qvel, ["toy", "go1"]),
    "nan_qpos": (_nan_qpos, ["toy", "go1"]),
    "huge_qvel": (_huge_qvel, ["toy", "go1"]),
    "huge_ctrl": (_huge_ctrl, ["toy"]),
    "qacc_over_limit": (_qacc_over_limit, ["toy"]),
}
CASES = [pytest.param(kind, scene, id=f"{kind}-{scene}") for kind, (_, scenes) in INJECTIONS.items() for scene in scenes]


@pytest.mark.parametrize(("kind", "scene_name"), CASES)
def test_diverged_env_is_flagged_counted_and_reset(request, make_sim, assert_stored, kind, scene_name):
    scene = request.getfixturevalue(f"{scene_name}_scene")
    inject = INJECTIONS[kind][0]
    substeps = 1 if kind == "qacc_over_limit" else 3
    sim, ref = make_sim(scene, num_envs=N), make_sim(scene, num_envs=N)
    ctrls = _ctrl_sequence(scene.model, 12)
    for ctrl in ctrls[:4]:
        assert not sim.step(ctrl, substeps).any()
        ref.step(ctrl, substeps)

    ctrl = ctrls[4].copy()
    inject(sim, ctrl)
    diverged = sim.step(ctrl, substeps)  # must not raise
    ref.step(ctrls[4], substeps)

    expected = np.zeros(N, bool)
    expected[BAD] = True
    np.testing.assert_array_equal(diverged, expected)
    assert sim.divergences == 1
    # the bad env is back at the keyframe, finite; the others are exactly where they'd be
    assert_stored(sim.qpos[BAD], scene.key_qpos)
    assert_stored(sim.qvel[BAD], scene.key_qvel)
    assert_stored(sim.ctrl[BAD], scene.key_ctrl)
    others = np.arange(N) != BAD
    np.testing.assert_array_equal(sim.qpos[others], ref.qpos[others])
    np.testing.assert_array_equal(sim.qvel[others], ref.qvel[others])

    for ctrl in ctrls[5:]:
        assert not sim.step(ctrl, substeps).any()
        ref.step(ctrl, substeps)
        np.testing.assert_array_equal(sim.qpos[others], ref.qpos[others])
        np.testing.assert_array_equal(sim.qvel[others], ref.qvel[others])
    assert np.isfinite(sim.qpos).all() and np.isfinite(sim.qvel).all()
    assert sim.divergences == 1


def test_several_envs_diverging_together_are_all_counted(make_sim, toy_scene):
    sim = make_sim(toy_scene, num_envs=N)
    sim.step(None, 2)
    sim.qvel[1] = np.nan
    sim.qpos[4, 0] = np.inf
    diverged = sim.step(None, 2)
    np.testing.assert_array_equal(np.flatnonzero(diverged), [1, 4])
    assert sim.divergences == 2
    sim.qvel[1, 0] = 1e30
    assert np.flatnonzero(sim.step(None, 2)).tolist() == [1]
    assert sim.divergences == 3
    assert np.isfinite(sim.qpos).all()


# -- through a Task --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cartpole-balance", "go1-joystick-flat"])
@pytest.mark.parametrize("value", [np.nan, 1e30], ids=["nan", "huge"])
def test_task_reports_divergence_as_termination(make_task_on, random_actions, name, value):
    n = 8
    task = make_task_on(name, num_envs=n, seed=2)
    ref = make_task_on(name, num_envs=n, seed=2)
    actions = random_actions(task, 12, scale=0.3)
    task.reset()
    ref.reset()
    finished = np.zeros(n, bool)  # envs that end in the reference run: their futures may differ
    for t, a in enumerate(actions):
        if t == 3:
            task.sim.qvel[BAD, :] = value
        obs, reward, terminated, truncated, info = task.step(a)  # must not raise
        _, _, ref_term, ref_trunc, _ = ref.step(a)
        finished |= ref_term | ref_trunc
        for group, values in obs.items():
            assert np.isfinite(values).all(), group
        assert np.isfinite(reward).all()
        if t == 3:
            assert terminated[BAD] and not truncated[BAD]
            assert info["diverged"] == 1
            assert BAD in info["done_ids"]
            assert info["episode_length"][list(info["done_ids"]).index(BAD)] == 4
            for group, values in info["final_obs"].items():
                assert np.isfinite(values).all(), group
            assert task.episode_step[BAD] == 0  # reset by the task, too
        else:
            assert info["diverged"] == 0
        assert task.sim.divergences == (1 if t >= 3 else 0)
        same = ~finished
        same[BAD] = False
        np.testing.assert_array_equal(task.sim.qpos[same], ref.sim.qpos[same])
        np.testing.assert_array_equal(task.sim.qvel[same], ref.sim.qvel[same])
    assert (~finished).sum() >= n - 2, "too many envs ended: the comparison checked little"
