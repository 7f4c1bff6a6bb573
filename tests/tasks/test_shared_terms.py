"""Go1's rewards, rebuilt from the shared terms (hetlab.tasks.terms), reproduce the numbers of its
own earlier implementation on a recorded trajectory.

`data/go1_joystick_trajectory.npz` was recorded before the terms were shared: 8 envs, seed 3,
60 steps of uniform random actions from numpy's default_rng(0) (11 falls, so resets take part),
each unweighted reward term, the reward, the terminations and the critic's privileged columns
(contacts, air time, foot heights). The physics is deterministic for a seed, so the same actions
replay the same trajectory; the tolerance only allows for other SIMD paths of numpy's exp/sqrt.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from hetlab.tasks import make_task

RECORDED = Path(__file__).parent / "data" / "go1_joystick_trajectory.npz"


def test_go1_rewards_built_from_shared_terms_match_the_recorded_trajectory():
    recorded = np.load(RECORDED)
    task = make_task("go1-joystick-flat", num_envs=8, threads=1, seed=3)
    captured = []  # per step, each term's unweighted values

    def recorded_by_name(name, function):
        def term(task, **params):
            if name == next(iter(task.rewards)):
                captured.append({})
            captured[-1][name] = function(task, **params)
            return captured[-1][name]
        return term

    task.rewards = {name: dataclasses.replace(term, function=recorded_by_name(name, term.function))
                    for name, term in task.rewards.items()}
    task.reset()
    rng = np.random.default_rng(0)
    rewards, terminated, extras = [], [], []
    for _ in range(len(recorded["reward"])):
        obs, reward, term, _, _ = task.step(rng.uniform(-1, 1, (8, 12)).astype(np.float32))
        rewards.append(reward), terminated.append(term), extras.append(obs["critic"][:, 48:])
    np.testing.assert_array_equal(np.stack(terminated), recorded["terminated"])
    np.testing.assert_allclose(np.stack(rewards), recorded["reward"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.stack(extras), recorded["critic_extras"], rtol=1e-6, atol=1e-7)
    names = sorted(key.removeprefix("term/") for key in recorded.files if key.startswith("term/"))
    assert names == sorted(task.reward_weights) == sorted(captured[0])
    for name in names:
        np.testing.assert_allclose(np.stack([c[name] for c in captured]), recorded[f"term/{name}"],
                                   rtol=1e-9, atol=1e-12, err_msg=name)
