"""The shared off-policy pieces (C51 projection, tanh-Gaussian log-density, target updates) and the
contract all four off-policy algorithms keep with the runtime: shapes, actions in [-1, 1], the
deterministic forward, exact resume through a real checkpoint, seed determinism, and learning a
contextual bandit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributions import Normal

from hetlab.algos import ALGOS
from hetlab.algos.off_policy_networks import categorical_projection, soft_update, tanh_gaussian_sample
from hetlab.checkpoint import load_checkpoint, save_checkpoint
from hetlab.errors import UserError

CPU = torch.device("cpu")
OBS_SIZES = {"policy": 3, "critic": 4}
ACTION_SIZE = 2
# Small networks so every test runs in well under a second per update.
SMALL = {
    "sac": dict(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=64),
    "td3": dict(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=64),
    "fastsac": dict(actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=64),
    "flashsac": dict(actor_hidden=16, critic_hidden=16, actor_blocks=1, critic_blocks=1, batch_size=64),
}
NAMES = list(SMALL)


def small(name: str, seed: int = 0, obs_sizes=OBS_SIZES, **overrides):
    algo_class = ALGOS[name]
    return algo_class(obs_sizes, ACTION_SIZE, algo_class.Config(**{**SMALL[name], **overrides}), CPU, seed=seed)


def random_batch(size: int = 64, seed: int = 0, obs_sizes=OBS_SIZES) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    terminated = torch.rand(size, generator=g) < 0.2
    return {
        "policy_obs": 1.0 + 2.0 * torch.randn(size, obs_sizes["policy"], generator=g),
        "critic_obs": torch.randn(size, obs_sizes["critic"], generator=g),
        "actions": torch.rand(size, ACTION_SIZE, generator=g) * 2 - 1,
        "rewards": torch.randn(size, generator=g),
        "next_policy_obs": 1.0 + 2.0 * torch.randn(size, obs_sizes["policy"], generator=g),
        "next_critic_obs": torch.randn(size, obs_sizes["critic"], generator=g),
        "bootstrap": torch.where(terminated, 0.0, 0.99),
    }


# -- shared pieces ----------------------------------------------------------------------------------


def test_projection_hand_computed_shift():
    support = torch.linspace(-2.0, 2.0, 5)  # atoms -2, -1, 0, 1, 2
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]])
    # r + 1·z with r = 0.5: every atom lands halfway between two atoms; the top one is clamped to 2.
    got = categorical_projection(probs, support, torch.tensor([0.5]), torch.tensor([1.0]))
    expected = torch.tensor([[0.05, 0.15, 0.25, 0.25, 0.30]])
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(got.sum(-1), torch.ones(1))


def test_projection_exact_atoms_and_discount():
    support = torch.linspace(-2.0, 2.0, 5)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.2, 0.2]])
    # r = 1, bootstrap 1: an exact shift by one atom; the top two atoms pile up at 2.
    got = categorical_projection(probs, support, torch.tensor([1.0]), torch.tensor([1.0]))
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4]]))
    # r = 0, bootstrap 0.5: atoms shrink towards 0, -2 → -1, -1 → -0.5 (split), 1 → 0.5, 2 → 1.
    got = categorical_projection(probs, support, torch.tensor([0.0]), torch.tensor([0.5]))
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.2, 0.5, 0.3, 0.0]]))


def test_projection_terminal_puts_all_mass_at_the_reward_and_batches_over_members():
    support = torch.linspace(-10.0, 10.0, 101)
    probs = torch.softmax(torch.randn(3, 4, 101, generator=torch.Generator().manual_seed(0)), -1)  # (K, B, atoms)
    rewards = torch.tensor([0.3, -4.0, 25.0, 1.0])
    bootstrap = torch.tensor([0.0, 0.0, 0.0, 0.9])
    got = categorical_projection(probs, support, rewards, bootstrap)
    torch.testing.assert_close(got.sum(-1), torch.ones(3, 4))
    expected_value = (got * support).sum(-1)
    torch.testing.assert_close(expected_value[:, :3], torch.tensor([0.3, -4.0, 10.0]).expand(3, 3))  # 25 clamped
    assert torch.equal((got[:, 1] > 0).nonzero()[:, 1].unique(), torch.tensor([30]))  # -4 is exactly atom 30
    assert torch.allclose(expected_value[:, 3], 1.0 + 0.9 * (probs[:, 3] * support).sum(-1), atol=1e-5)


def test_tanh_gaussian_log_prob_matches_change_of_variables():
    g = torch.Generator().manual_seed(0)
    mean, log_std, noise = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g) * 0.5, torch.randn(6, 3, generator=g)
    actions, log_probs = tanh_gaussian_sample(mean, log_std, noise)
    pre_tanh = mean + log_std.exp() * noise
    expected = (Normal(mean, log_std.exp()).log_prob(pre_tanh) - torch.log(1 - torch.tanh(pre_tanh) ** 2)).sum(-1)
    torch.testing.assert_close(actions, torch.tanh(pre_tanh))
    torch.testing.assert_close(log_probs, expected, rtol=1e-4, atol=1e-4)


def test_soft_update_moves_parameters_by_tau_and_copies_buffers():
    source, target = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        source.weight.fill_(2.0)
        source.running_mean.fill_(5.0)
    soft_update(target, source, 0.25)
    torch.testing.assert_close(target.weight, torch.full((3,), 1.25))
    torch.testing.assert_close(target.running_mean, torch.full((3,), 5.0))


# -- the contract of every off-policy algorithm -----------------------------------------------------


def test_registry():
    assert {"ppo", "appo", "sac", "td3", "fastsac", "flashsac"} == set(ALGOS)
    for name in NAMES:
        assert ALGOS[name].name == name
        cfg = ALGOS[name].Config()
        for field in ("batch_size", "gamma", "n_step", "updates_per_step", "learning_starts", "compile", "bf16"):
            assert hasattr(cfg, field), (name, field)


@pytest.mark.parametrize("name", NAMES)
def test_config_reads_back_from_json_lists_and_rejects_bad_values(name):
    cfg_class = ALGOS[name].Config
    hashable = cfg_class(**{key: list(value) if isinstance(value, tuple) else value for key, value in SMALL[name].items()})
    hash(hashable)
    for bad in ({"gamma": 0.0}, {"batch_size": 0}, {"n_step": 0}, {"tau": 1.5}, {"updates_per_step": 0.0}):
        with pytest.raises(UserError):
            cfg_class(**bad)


@pytest.mark.parametrize("name", NAMES)
def test_actor_shapes_range_and_determinism(name):
    algo = small(name)
    algo.update(random_batch())  # so normalisers and weights are no longer at their start
    obs = 3.0 * torch.randn(7, OBS_SIZES["policy"], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        deterministic = algo.actor(obs)
    assert deterministic.shape == (7, ACTION_SIZE) and deterministic.abs().max() <= 1.0
    assert torch.equal(deterministic, algo.actor(obs.clone()).detach())
    explored = algo.actor.explore(obs, torch.Generator().manual_seed(2))
    assert explored.shape == (7, ACTION_SIZE) and explored.abs().max() <= 1.0 and not explored.requires_grad
    assert torch.equal(explored, algo.actor.explore(obs, torch.Generator().manual_seed(2)))
    assert not torch.equal(explored, deterministic)
    assert algo.actor.explore(obs.reshape(7, 1, -1), torch.Generator()).shape == (7, 1, ACTION_SIZE)


@pytest.mark.parametrize("name", NAMES)
def test_actor_state_dict_is_all_a_collector_needs(name):
    algo = small(name)
    for seed in range(3):
        algo.update(random_batch(seed=seed))
    collector_actor = copy.deepcopy(small(name, seed=7).actor).eval()
    collector_actor.load_state_dict(algo.actor.state_dict())
    obs = torch.randn(5, OBS_SIZES["policy"])
    with torch.no_grad():
        assert torch.equal(collector_actor(obs), algo.actor(obs))
    assert torch.equal(collector_actor.explore(obs, torch.Generator().manual_seed(3)),
                       algo.actor.explore(obs, torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("name", NAMES)
def test_metrics_are_plain_floats(name):
    algo = small(name)
    metrics = [algo.update(random_batch(seed=s)) for s in range(4)]
    assert any("actor_loss" in m for m in metrics) and all("critic_loss" in m for m in metrics)
    assert all(type(v) is float and v == v for m in metrics for v in m.values())


@pytest.mark.parametrize("name", NAMES)
def test_exact_resume_through_a_checkpoint(name, tmp_path, assert_same_state):
    batches = [random_batch(seed=s) for s in range(6)]
    uninterrupted = small(name)
    expected = [uninterrupted.update(b) for b in batches]

    first = small(name)
    for b in batches[:3]:
        first.update(b)
    save_checkpoint(tmp_path, 3, {"algo": first.state_dict()})
    first.update(batches[3])  # training on must not change the saved state
    resumed = small(name, seed=99)  # a different seed: everything must come from the state
    resumed.load_state_dict(load_checkpoint(tmp_path)["algo"])
    assert [resumed.update(b) for b in batches[3:]] == expected[3:]
    assert_same_state(resumed.state_dict(), uninterrupted.state_dict())


@pytest.mark.parametrize("name", NAMES)
def test_seed_determinism(name):
    a, b, c = small(name), small(name), small(name, seed=1)
    assert [a.update(random_batch(seed=s)) for s in range(2)] == [b.update(random_batch(seed=s)) for s in range(2)]
    weights = [torch.cat([p.detach().flatten() for p in algo.actor.parameters()]) for algo in (c, small(name))]
    assert not torch.equal(*weights)


# A contextual bandit: obs ~ U(-1, 1)^3, best action W·obs, reward −mean((a − W·obs)²); every
# transition ends its episode (bootstrap 0). A random policy scores about −0.4, the best one 0.
BANDIT_W = 0.5 * torch.tensor([[0.8, -0.5, 0.3], [-0.4, 0.2, 0.9]])
# Sized for the bandit: faster learning rates; FlashSAC's unit-norm weights move slowly at 3e-4,
# and its reward scale assumes returns of up to 1/(1 − γ^n) rewards, so γ is small here.
LEARNS = {
    "sac": dict(actor_hidden=(64, 64), critic_hidden=(64, 64), actor_learning_rate=1e-3, critic_learning_rate=1e-3),
    "td3": dict(actor_hidden=(64, 64), critic_hidden=(64, 64), actor_learning_rate=1e-3, critic_learning_rate=1e-3),
    "fastsac": dict(actor_hidden=(64, 64), critic_hidden=(64, 64), actor_learning_rate=1e-3,
                    critic_learning_rate=1e-3, policy_frequency=2),
    "flashsac": dict(actor_hidden=32, critic_hidden=32, actor_blocks=1, critic_blocks=1, gamma=0.5, n_step=1,
                     learning_rate=3e-3),
}


def bandit_reward(obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return -(actions - obs @ BANDIT_W.T).square().mean(-1)


@pytest.mark.parametrize("name", NAMES)
def test_learns_a_contextual_bandit(name):
    algo_class = ALGOS[name]
    batch_size = 128
    algo = algo_class({"policy": 3, "critic": 3}, 2, algo_class.Config(**LEARNS[name], batch_size=batch_size), CPU)
    g = torch.Generator().manual_seed(0)
    eval_obs = torch.rand(512, 3, generator=g) * 2 - 1
    with torch.no_grad():
        start = float(bandit_reward(eval_obs, algo.actor(eval_obs)).mean())
    obs_seen, actions_seen = [], []
    for step in range(40):
        obs = torch.rand(64, 3, generator=g) * 2 - 1
        # Uniform-random actions first, as the runtime does for `learning_starts` steps.
        actions = torch.rand(64, 2, generator=g) * 2 - 1 if step < 2 else algo.actor.explore(obs, g)
        obs_seen.append(obs)
        actions_seen.append(actions)
        if step < 2:
            continue
        all_obs, all_actions = torch.cat(obs_seen), torch.cat(actions_seen)
        all_rewards = bandit_reward(all_obs, all_actions)
        for _ in range(8):
            i = torch.randint(len(all_obs), (batch_size,), generator=g)
            algo.update({"policy_obs": all_obs[i], "critic_obs": all_obs[i], "actions": all_actions[i],
                         "rewards": all_rewards[i], "next_policy_obs": all_obs[i], "next_critic_obs": all_obs[i],
                         "bootstrap": torch.zeros(batch_size)})
    with torch.no_grad():
        final = float(bandit_reward(eval_obs, algo.actor(eval_obs)).mean())
    assert final > -0.06 and final > start + 0.05, (start, final)
