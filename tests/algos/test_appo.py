"""APPO: V-trace against a slow reference loop and, on-policy, against GAE(λ=1) returns; the
target network's refresh; exact resume; learning a small bandit from stale data."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from hetlab.algos import ALGOS
from hetlab.algos.appo import APPO, APPOConfig, vtrace
from hetlab.algos.ppo import bootstrap_time_outs, gae

CPU = torch.device("cpu")
OBS_SIZES = {"policy": 3, "critic": 4}
SMALL = {"actor_hidden": (16, 16), "critic_hidden": (16, 16)}


def small_appo(seed: int = 0, **overrides) -> APPO:
    return APPO(OBS_SIZES, 2, APPOConfig(**{**SMALL, **overrides}), CPU, seed=seed)


def reference_vtrace(rewards, values, dones, log_rhos, gamma, rho_bar, c_bar):
    """v_s = V(x_s) + Σ_t γ^{t-s} (Π_{i<t} c_i) δ_t, summed explicitly per env until the episode
    ends (Espeholt et al. 2018, eq. 1); advantage_s = ρ_s (r_s + γ_s v_{s+1} − V(x_s))."""
    T, N = rewards.shape
    ratios = np.exp(log_rhos)
    rhos, cs = np.minimum(rho_bar, ratios), np.minimum(c_bar, ratios)
    targets = np.array(values, dtype=np.float64)  # row T stays V(x_T)
    for n in range(N):
        for s in range(T):
            total, weight = values[s, n], 1.0
            for t in range(s, T):
                next_value = 0.0 if dones[t, n] else values[t + 1, n]
                total += weight * rhos[t, n] * (rewards[t, n] + gamma * next_value - values[t, n])
                if dones[t, n]:
                    break
                weight *= gamma * cs[t, n]
            targets[s, n] = total
    discounts = gamma * (1.0 - dones)
    advantages = rhos * (rewards + discounts * targets[1:] - values[:-1])
    return targets[:-1], advantages


def random_episodes(seed: int, T: int = 9, N: int = 6):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g)
    values = torch.randn(T + 1, N, generator=g)
    terminated = (torch.rand(T, N, generator=g) < 0.2).float()
    truncated = (torch.rand(T, N, generator=g) < 0.15).float() * (1 - terminated)
    log_rhos = 0.7 * torch.randn(T, N, generator=g)  # many ratios above 1: truncation matters
    return rewards, values, torch.maximum(terminated, truncated), log_rhos


def test_registry():
    assert ALGOS["appo"] is APPO and APPO.name == "appo" and APPO.Config is APPOConfig


@pytest.mark.parametrize(("rho_bar", "c_bar"), [(1.0, 1.0), (1.5, 0.8)])
def test_vtrace_matches_reference_loop(rho_bar, c_bar):
    rewards, values, dones, log_rhos = random_episodes(seed=0)
    assert 0 < dones.sum() < dones.numel() and (log_rhos > 0).any()
    targets, advantages = vtrace(rewards, values, dones, log_rhos, 0.97, rho_bar, c_bar)
    expected_targets, expected_advantages = reference_vtrace(
        *(x.double().numpy() for x in (rewards, values, dones, log_rhos)), 0.97, rho_bar, c_bar
    )
    np.testing.assert_allclose(targets.numpy(), expected_targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantages.numpy(), expected_advantages, rtol=1e-5, atol=1e-5)


def test_on_policy_vtrace_targets_are_gae_lambda_one_returns(make_batch):
    appo = small_appo()
    batch = make_batch(appo.actor, horizon=10, num_envs=6)  # behaviour = actor = target
    with torch.no_grad():
        values = appo.critic(batch["critic_obs"])
        rewards = bootstrap_time_outs(batch["rewards"], batch["truncated"], batch["final_critic_obs"],
                                      appo.critic, 0.99)
        target_log_probs = appo.target_actor.distribution(batch["policy_obs"][:-1]).log_prob(batch["actions"]).sum(-1)
    log_rhos = target_log_probs - batch["log_probs"]
    assert log_rhos.abs().max() < 1e-5
    dones = torch.maximum(batch["terminated"], batch["truncated"])
    targets, advantages = vtrace(rewards, values, dones, log_rhos, 0.99)
    n_step_advantages = gae(rewards, values, dones, 0.99, lam=1.0)
    torch.testing.assert_close(targets, n_step_advantages + values[:-1], rtol=1e-4, atol=1e-4)
    # The policy-gradient advantage bootstraps from v_{t+1}: on-policy that is the same return.
    torch.testing.assert_close(advantages, n_step_advantages, rtol=1e-4, atol=1e-4)

    metrics = appo.update(batch)
    assert abs(metrics["importance_weight_mean"] - 1.0) < 1e-5
    assert {"value_loss", "surrogate_loss", "entropy", "learning_rate", "action_std_mean", "clip_fraction",
            "importance_weight_mean", "importance_weight_clip_fraction"} <= set(metrics)
    assert all(type(value) is float and np.isfinite(value) for value in metrics.values())


def test_stale_behaviour_gives_importance_weights_away_from_one(make_batch):
    metrics = small_appo().update(make_batch(small_appo(seed=5).actor, horizon=8, num_envs=8))
    assert abs(metrics["importance_weight_mean"] - 1.0) > 0.01
    assert 0.0 < metrics["importance_weight_clip_fraction"] < 1.0


def test_target_network_refreshes_every_interval(make_batch):
    appo = small_appo(target_update_interval=2)
    initial = {k: v.clone() for k, v in appo.actor.state_dict().items()}

    def target_equals(state):
        return all(torch.equal(v, state[k]) for k, v in appo.target_actor.state_dict().items())

    assert target_equals(appo.actor.state_dict())
    appo.update(make_batch(appo.actor, seed=1))
    assert target_equals(initial) and not target_equals(appo.actor.state_dict())
    appo.update(make_batch(appo.actor, seed=2))
    assert target_equals(appo.actor.state_dict())  # weights and normaliser statistics
    assert appo.updates == 2
    assert not any(p.requires_grad for p in appo.target_actor.parameters())


def test_update_reads_final_critic_obs_only_where_an_episode_timed_out(make_batch):
    batch = make_batch(small_appo().actor, horizon=8, num_envs=6)
    timed_out = batch["truncated"].bool()

    def weights_after(final_critic_obs):
        appo = small_appo()
        appo.update({**batch, "final_critic_obs": final_critic_obs})
        return torch.cat([p.detach().flatten() for p in appo.actor.parameters()])

    reference = weights_after(batch["final_critic_obs"])
    noise = torch.randn_like(batch["final_critic_obs"])
    assert torch.equal(weights_after(batch["final_critic_obs"] + noise * (~timed_out)[..., None]), reference)
    assert not torch.equal(weights_after(batch["final_critic_obs"] + noise * timed_out[..., None]), reference)


def test_exact_resume(make_batch, assert_same_state):
    # Interval 3 and a save after one update: the target differs from the actor, and the
    # update counter decides when it is next refreshed.
    stale = small_appo(seed=7).actor
    batches = [make_batch(stale, horizon=8, num_envs=6, seed=s) for s in range(4)]
    uninterrupted = small_appo(target_update_interval=3)
    expected_metrics = [uninterrupted.update(b) for b in batches]

    first = small_appo(target_update_interval=3)
    first.update(batches[0])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = small_appo(seed=99, target_update_interval=3)
    resumed.load_state_dict(torch.load(buffer))
    metrics = [resumed.update(b) for b in batches[1:]]

    assert metrics == expected_metrics[1:]
    assert_same_state(resumed.state_dict(), uninterrupted.state_dict())


def test_learns_a_continuous_bandit_from_stale_data(train_on_bandit):
    cfg = APPOConfig(actor_hidden=(64, 64), critic_hidden=(64, 64), learning_rate=1e-3)  # small nets learn faster
    rewards = train_on_bandit(APPO, cfg, updates=50, lag=2)  # behaviour 0-2 updates behind
    # A random policy scores about -1.3; the best one 0 (minus its own noise).
    assert rewards[0] < -1.0
    assert np.mean(rewards[-5:]) > -0.3
