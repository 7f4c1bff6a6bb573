"""Every registered algorithm meets the contract the loops, checkpoints and export are written against
(hetlab.algos.contract), with the signatures the contract declares."""

from __future__ import annotations

import inspect

import pytest
import torch

from hetlab.algos import ALGO_CONFIGS, ALGOS
from hetlab.algos.contract import Algorithm, OnPolicyAlgorithm

OBS_SIZES = {"policy": 5, "critic": 7}
ACTIONS = 3


def _built(name: str):
    cls = ALGOS[name]
    return cls(OBS_SIZES, ACTIONS, cls.Config(), torch.device("cpu"), seed=0)


@pytest.mark.parametrize("name", list(ALGO_CONFIGS))
def test_each_algorithm_meets_the_contract(name):
    cls = ALGOS[name]
    algo = _built(name)
    assert isinstance(algo, Algorithm)
    assert (cls.name, cls.Config) == (name, ALGO_CONFIGS[name])
    assert isinstance(cls.off_policy, bool) and isinstance(cls.cpu_defaults, dict)
    if not cls.off_policy:
        assert isinstance(algo, OnPolicyAlgorithm) and cls.default_mode in ("sync", "async")
    for method in ("update", "state_dict", "load_state_dict"):
        declared = list(inspect.signature(getattr(Algorithm, method)).parameters)
        assert list(inspect.signature(getattr(cls, method)).parameters) == declared, (name, method)
    # The actor alone is the deterministic policy that eval, play and export rebuild.
    obs = torch.randn(4, OBS_SIZES["policy"])
    with torch.no_grad():
        first, again = algo.actor(obs), algo.actor(obs)
    assert first.shape == (4, ACTIONS)
    torch.testing.assert_close(first, again, rtol=0, atol=0)


def test_a_class_without_the_learner_methods_is_not_an_algorithm():
    class RolloutsOnly:
        name, off_policy, Config, cpu_defaults = "x", False, object, {}
        default_mode = "sync"
        actor = torch.nn.Identity()

        def update(self, batch):
            return {}

    assert not isinstance(RolloutsOnly(), Algorithm)
