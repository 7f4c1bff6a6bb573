"""Observation groups declared as terms: sizes and noise follow from the declaration, the critic is
composed in its order, and values that do not match it are refused."""

from __future__ import annotations

import numpy as np
import pytest

from hetlab.tasks import TASKS, task_class
from hetlab.tasks.observations import ObsTerm, Observations

DECLARED = Observations(policy=(ObsTerm("gyro", 3, noise=0.2), ObsTerm("last_action", 2)),
                        privileged=(ObsTerm("height", 1),))


def test_sizes_and_the_policy_noise_follow_from_the_terms():
    assert DECLARED.sizes == {"policy": 5, "critic": 6}
    np.testing.assert_array_equal(DECLARED.policy_noise, np.float32([0.2, 0.2, 0.2, 0.0, 0.0]))


def test_the_critic_is_the_policy_terms_then_the_privileged_ones_in_declared_order():
    values = {"height": np.full((4, 1), 9.0), "last_action": np.ones((4, 2), bool), "gyro": np.arange(12.0).reshape(4, 3)}
    critic = DECLARED.critic(values, 4)
    assert critic.dtype == np.float32 and critic.shape == (4, 6)
    np.testing.assert_array_equal(critic[1], [3, 4, 5, 1, 1, 9])


@pytest.mark.parametrize("values, message", [
    ({"gyro": np.zeros((4, 3)), "last_action": np.zeros((4, 2))}, "differ from those declared"),
    ({"gyro": np.zeros((4, 3)), "last_action": np.zeros((4, 3)), "height": np.zeros((4, 1))},
     r"last_action: shape \(4, 3\), declared \(4, 2\)"),
])
def test_values_that_do_not_match_the_declaration_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        DECLARED.critic(values, 4)


def test_a_term_named_twice_is_refused():
    with pytest.raises(ValueError, match=r"named twice: \['gyro'\]"):
        Observations(policy=(ObsTerm("gyro", 3),), privileged=(ObsTerm("gyro", 3),))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_declares_its_observations(name):
    cls = task_class(name)
    assert "observations" in vars(cls) and cls.obs_sizes == cls.observations.sizes
