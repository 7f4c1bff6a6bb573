"""The Python API does what the command line does: train, then act with the trained policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hetlab
from hetlab.errors import UserError
from hetlab.tasks import make_task


def test_train_then_act_from_python(tmp_path):
    run = hetlab.train_policy(task="cartpole-balance", envs=16, horizon=8, max_iterations=3, runs_dir=str(tmp_path),
                              ppo={"actor_hidden": (32, 32), "critic_hidden": (32, 32)})
    assert run.parent == tmp_path / "cartpole-balance-ppo"
    config = json.loads((run / "config.json").read_text())
    assert config["max_iterations"] == 3 and config["algos"]["ppo"]["actor_hidden"] == [32, 32]

    policy = hetlab.load_policy(run)
    observations = make_task("cartpole-balance", num_envs=4, threads=1, seed=1).reset()["policy"]
    actions = policy.act(observations)
    assert actions.shape == (4, 1) and np.isfinite(actions).all()
    np.testing.assert_array_equal(actions, policy.act(observations))  # deterministic
    with pytest.raises(UserError, match=r"shape \(batch, 5\), got \(4, 3\)"):
        policy.act(observations[:, :3])


def test_an_unknown_option_is_named():
    with pytest.raises(UserError, match="unexpected keyword argument 'env'"):
        hetlab.train_policy(task="cartpole-balance", env=16)
    with pytest.raises(UserError, match="unexpected keyword argument 'actor_width'"):
        hetlab.train_policy(ppo={"actor_width": 3})
