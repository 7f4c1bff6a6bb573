"""Rewards declared as terms: a run's weights override the task's own, term by term, from
`make_task` to `hetlab train`; a term the task does not have is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hetlab
from hetlab.errors import UserError
from hetlab.tasks import TASKS, make_task


def test_every_declared_term_has_a_finite_weight_and_its_parameters_name_the_functions_arguments():
    for cls in TASKS.values():
        for name, term in cls.rewards.items():
            assert np.isfinite(term.weight), name
            code = term.function.__code__
            assert set(code.co_varnames[1:code.co_argcount]) == set(term.params), f"{cls.name}: {name}"


def test_a_weight_given_to_the_task_replaces_that_terms_weight_only():
    own = make_task("cartpole-balance", num_envs=8, threads=1, seed=2)
    changed = make_task("cartpole-balance", num_envs=8, threads=1, seed=2, reward_weights={"pole_angle": -3.0})
    assert changed.reward_weights == {**own.reward_weights, "pole_angle": -3.0}
    own.reset(), changed.reset()
    actions = np.random.default_rng(0).uniform(-1, 1, (20, 8, 1)).astype(np.float32)
    for step_actions in actions:
        _, reward, _, _, info = own.step(step_actions)
        _, changed_reward, _, _, changed_info = changed.step(step_actions)
        for name, value in info["reward_terms"].items():
            assert changed_info["reward_terms"][name] == pytest.approx(value * (3.0 if name == "pole_angle" else 1.0))
        assert float(changed_reward.mean() - reward.mean()) == pytest.approx(2 * info["reward_terms"]["pole_angle"],
                                                                            abs=1e-6)


def test_a_term_the_task_does_not_have_is_refused_with_its_terms():
    with pytest.raises(UserError, match="task 'go1-joystick-flat' has no reward term.s. alive; its terms: "
                                        "tracking_lin_vel, tracking_ang_vel"):
        make_task("go1-joystick-flat", num_envs=2, reward_weights={"alive": 1.0})


def test_a_runs_reward_weights_reach_its_collectors_and_its_record(tmp_path, refusal):
    # Cartpole without its alive bonus: every term left is a penalty, so no episode scores above 0.
    run = hetlab.train_policy(task="cartpole-balance", envs=64, max_iterations=4, reward_weights={"alive": 0.0},
                              runs_dir=str(tmp_path / "runs"))
    config = json.loads((run / "config.json").read_text())
    assert config["reward_weights"] == {"alive": 0.0} and config["option_sources"]["reward_weights"] == "python"
    returns = [row["mean_return"] for row in json.loads((run / "history.json").read_text()) if "mean_return" in row]
    assert returns and max(returns) <= 0.0
    assert "--reward-weights asks for" in refusal("train", "--resume", run, "--reward-weights", "alive", "1")
    assert "has no reward term(s) nope" in refusal("train", "--task", "cartpole-balance", "--reward-weights", "nope",
                                                   "1", "--runs-dir", tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_a_parameter_given_to_the_task_changes_that_terms_value_not_its_criterion_and_an_unknown_one_is_refused():
    own = make_task("go1-joystick-flat", num_envs=8, threads=1, seed=2)
    wider = make_task("go1-joystick-flat", num_envs=8, threads=1, seed=2,
                      reward_params={"tracking_lin_vel.sigma": 1.0})
    assert wider.reward_params["tracking_lin_vel"] == {"sigma": 1.0} and own.reward_params["tracking_lin_vel"] == {
        "sigma": 0.25}
    own.reset(), wider.reset()
    actions = np.random.default_rng(0).uniform(-0.3, 0.3, (8, 12)).astype(np.float32)
    terms, wider_terms = own.step(actions)[4]["reward_terms"], wider.step(actions)[4]["reward_terms"]
    # exp(−e²/σ) with a wider σ scores every error higher; the other terms are untouched
    assert wider_terms["tracking_lin_vel"] > terms["tracking_lin_vel"]
    assert {k: v for k, v in wider_terms.items() if k != "tracking_lin_vel"} == pytest.approx(
        {k: v for k, v in terms.items() if k != "tracking_lin_vel"})
    # ... but "solved" is judged on the task's own kernel
    np.testing.assert_array_equal(wider.tracked_sums, own.tracked_sums)
    assert own.tracked_sums[:, 0].min() > 0
    with pytest.raises(UserError, match=r"has no reward parameter\(s\) tracking_lin_vel.width; its parameters "
                                        r"\(TERM.PARAMETER\): feet_air_time.target"):
        make_task("go1-joystick-flat", num_envs=2, reward_params={"tracking_lin_vel.width": 1.0})
    with pytest.raises(UserError, match="has no reward parameter"):
        make_task("cartpole-balance", num_envs=2, reward_params={"sigma": 1.0})
