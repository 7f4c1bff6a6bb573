"""The shared modules: normaliser statistics, the actor's distribution and sampling, and that the
actor's state_dict is all a collector needs to act exactly as the learner."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hetlab.algos.networks import (Critic, EmpiricalNormalization, FullPrecisionLinear, GaussianActor, build_actor_critic,
                                   mlp)


def test_normalizer_matches_numpy_over_concatenated_batches():
    g = torch.Generator().manual_seed(0)
    norm = EmpiricalNormalization(3)
    batches = [5.0 + 2.0 * torch.randn(shape + (3,), generator=g, dtype=torch.float64).float()
               for shape in [(7,), (4, 9), (1,), (3, 5, 2)]]
    for batch in batches:
        norm.update(batch)
    everything = np.concatenate([b.reshape(-1, 3).numpy().astype(np.float64) for b in batches])
    assert int(norm.count) == len(everything)
    np.testing.assert_allclose(norm.mean.numpy(), everything.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), everything.var(0), rtol=1e-4)
    x = torch.randn(2, 3, generator=g)
    expected = (x.numpy() - everything.mean(0)) / (np.sqrt(everything.var(0)) + 1e-2)
    np.testing.assert_allclose(norm(x).numpy(), expected, rtol=1e-4, atol=1e-6)


def test_fresh_normalizer_is_identity_and_empty_update_changes_nothing():
    norm = EmpiricalNormalization(2)
    x = torch.tensor([[1.0, -2.0]])
    torch.testing.assert_close(norm(x), x / (1 + 1e-2))
    norm.update(torch.empty(0, 2))
    assert int(norm.count) == 0


def test_mlp_layout():
    net = mlp(4, (8, 6), 2)
    assert [type(m) for m in net] == [nn.Linear, nn.ELU, nn.Linear, nn.ELU, FullPrecisionLinear]
    assert (net[0].in_features, net[2].in_features, net[4].in_features, net[4].out_features) == (4, 8, 6, 2)
    assert net(torch.zeros(3, 5, 4)).shape == (3, 5, 2)


def test_actor_distribution_and_sampling():
    torch.manual_seed(0)
    actor = GaussianActor(4, 2, hidden=(16,), init_noise_std=0.5)
    obs = torch.randn(3, 5, 4)
    dist = actor.distribution(obs)
    torch.testing.assert_close(dist.loc, actor(obs))
    torch.testing.assert_close(dist.scale, torch.full((3, 5, 2), 0.5))
    actions, log_probs = actor.act(obs, generator=torch.Generator().manual_seed(1))
    assert actions.shape == (3, 5, 2) and log_probs.shape == (3, 5)
    torch.testing.assert_close(log_probs, dist.log_prob(actions).sum(-1))
    again, _ = actor.act(obs, generator=torch.Generator().manual_seed(1))
    assert torch.equal(actions, again)
    assert not actions.requires_grad


def test_actor_state_dict_reproduces_the_policy_exactly():
    torch.manual_seed(0)
    actor = GaussianActor(4, 2, hidden=(16, 8))
    actor.update_normalizer(3.0 + torch.randn(50, 4))
    with torch.no_grad():
        actor.log_std.add_(-0.3)
    state = actor.state_dict()
    assert {"obs_normalizer.mean", "obs_normalizer.var", "obs_normalizer.count", "log_std"} <= set(state)

    torch.manual_seed(1)  # different initial weights: everything must come from the state
    copy = GaussianActor(4, 2, hidden=(16, 8))
    copy.load_state_dict(state)
    obs = torch.randn(6, 4)
    assert torch.equal(copy(obs), actor(obs))
    a1, lp1 = actor.act(obs, generator=torch.Generator().manual_seed(2))
    a2, lp2 = copy.act(obs, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a1, a2) and torch.equal(lp1, lp2)


def test_without_normalization_there_are_no_statistics():
    actor = GaussianActor(3, 1, hidden=(8,), normalize_obs=False)
    critic = Critic(3, hidden=(8,), normalize_obs=False)
    obs = torch.randn(4, 3)
    before = actor(obs)
    actor.update_normalizer(obs + 10)
    critic.update_normalizer(obs + 10)
    assert torch.equal(actor(obs), before)
    assert not any("normalizer" in key for key in [*actor.state_dict(), *critic.state_dict()])


def test_critic_value_shape_and_normalizer():
    critic = Critic(5, hidden=(8,))
    assert critic(torch.randn(7, 3, 5)).shape == (7, 3)
    critic.update_normalizer(torch.randn(7, 3, 5))
    assert int(critic.obs_normalizer.count) == 21


@pytest.mark.parametrize("seed", [0, 3])
def test_build_actor_critic_is_seeded_and_leaves_global_rng_alone(seed):
    sizes = {"policy": 4, "critic": 6}
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    actor, critic = build_actor_critic(sizes, 2, (8,), (8,), 1.0, True, torch.device("cpu"), seed)
    assert torch.equal(torch.rand(1), expected_draw)
    actor2, critic2 = build_actor_critic(sizes, 2, (8,), (8,), 1.0, True, torch.device("cpu"), seed)
    for a, b in zip([*actor.state_dict().values(), *critic.state_dict().values()],
                    [*actor2.state_dict().values(), *critic2.state_dict().values()]):
        assert torch.equal(a, b)
    assert critic.value_net[0].in_features == 6 and actor.mean_net[0].in_features == 4


def test_output_layers_compute_in_fp32_under_bf16_autocast():
    """Under --<algo>.bf16 the hidden layers run in bf16 and the output layers in fp32: the action mean
    and the value are fp32 values of the bf16 hidden activations, not bf16-rounded ones."""
    torch.manual_seed(0)
    actor, critic = GaussianActor(5, 3, hidden=(64, 64)), Critic(5, hidden=(64, 64))
    obs = torch.randn(256, 5)
    for net, head in ((actor, actor.mean_net), (critic, critic.value_net)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = net(obs)
            hidden = head[:-1](net.obs_normalizer(obs))
        assert out.dtype == torch.float32 and hidden.dtype == torch.bfloat16
        exact = head[-1](hidden.float()).squeeze(-1)
        assert torch.equal(out, exact)
        assert not torch.equal(out, exact.bfloat16().float())  # bf16 rounding would have changed it
        assert 0 < (out - net(obs)).abs().max() < 0.05  # the hidden layers did run in bf16
