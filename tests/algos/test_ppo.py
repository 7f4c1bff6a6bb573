"""PPO: GAE and the time-out bootstrap against slow reference loops, the sync-mode ratio, the
KL-adaptive learning rate, the normaliser update, exact resume, and learning a small bandit."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from hetlab.algos import ALGOS
from hetlab.algos.ppo import PPO, PPOConfig, bootstrap_time_outs, gae
from hetlab.errors import UserError
from hetlab.tasks.symmetry import Mirror, TaskMirror

CPU = torch.device("cpu")
OBS_SIZES = {"policy": 3, "critic": 4}
SMALL = {"actor_hidden": (16, 16), "critic_hidden": (16, 16)}


def small_ppo(seed: int = 0, **overrides) -> PPO:
    return PPO(OBS_SIZES, 2, PPOConfig(**{**SMALL, **overrides}), CPU, seed=seed)


def reference_gae(rewards, values, dones, gamma, lam):
    """A_t = Σ_k (γλ)^k δ_{t+k}, summed explicitly per env until the episode ends."""
    T, N = rewards.shape
    advantages = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                next_value = 0.0 if dones[k, n] else values[k + 1, n]
                total += weight * (rewards[k, n] + gamma * next_value - values[k, n])
                if dones[k, n]:
                    break
                weight *= gamma * lam
            advantages[t, n] = total
    return advantages


def test_registry():
    assert ALGOS["ppo"] is PPO and PPO.name == "ppo" and PPO.Config is PPOConfig


def test_gae_matches_reference_loop():
    g = torch.Generator().manual_seed(0)
    T, N = 9, 6
    rewards = torch.randn(T, N, generator=g)
    values = torch.randn(T + 1, N, generator=g)
    terminated = (torch.rand(T, N, generator=g) < 0.2).float()
    truncated = (torch.rand(T, N, generator=g) < 0.15).float() * (1 - terminated)
    dones = torch.maximum(terminated, truncated)
    assert 0 < dones.sum() < T * N
    got = gae(rewards, values, dones, gamma=0.97, lam=0.9)
    expected = reference_gae(rewards.double().numpy(), values.double().numpy(), dones.numpy(), 0.97, 0.9)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_time_out_bootstrap_uses_final_critic_obs(make_batch):
    ppo = small_ppo()
    batch = make_batch(ppo.actor, horizon=8, num_envs=6)
    truncated = batch["truncated"]
    assert truncated.sum() > 0
    with torch.no_grad():
        got = bootstrap_time_outs(batch["rewards"], truncated, batch["final_critic_obs"], ppo.critic, 0.9)
        expected = batch["rewards"].clone()
        wrong = batch["rewards"].clone()  # bootstrapping from the next episode's first obs
        for t, n in truncated.nonzero().tolist():
            expected[t, n] += 0.9 * ppo.critic(batch["final_critic_obs"][t, n])
            wrong[t, n] += 0.9 * ppo.critic(batch["critic_obs"][t + 1, n])
    torch.testing.assert_close(got, expected)
    assert not torch.allclose(got, wrong)


def test_update_reads_final_critic_obs_only_where_an_episode_timed_out(make_batch):
    batch = make_batch(small_ppo().actor, horizon=8, num_envs=6)
    timed_out = batch["truncated"].bool()

    def weights_after(final_critic_obs):
        ppo = small_ppo()
        ppo.update({**batch, "final_critic_obs": final_critic_obs})
        return torch.cat([p.detach().flatten() for p in ppo.actor.parameters()])

    reference = weights_after(batch["final_critic_obs"])
    noise = torch.randn_like(batch["final_critic_obs"])
    elsewhere = batch["final_critic_obs"] + noise * (~timed_out)[..., None]
    at_time_outs = batch["final_critic_obs"] + noise * timed_out[..., None]
    assert torch.equal(weights_after(elsewhere), reference)
    assert not torch.equal(weights_after(at_time_outs), reference)


def test_sync_first_epoch_ratio_is_exactly_one(make_batch):
    ppo = small_ppo()
    ppo.update(make_batch(ppo.actor, seed=1))  # so the normaliser and weights are no longer at their start
    assert int(ppo.actor.obs_normalizer.count) > 0
    metrics = ppo.update(make_batch(ppo.actor, seed=2))
    # 1 up to float32 rounding: the collector's forward passes ran on 5 rows at a time, the
    # learner's on all 30, and matmul kernels may round differently for different batch sizes.
    # A normaliser updated before the epochs, or any mismatch of rows, would be off by far more.
    assert metrics["start_ratio_max_deviation"] < 1e-5


def test_ratio_measures_lag_when_behaviour_is_stale(make_batch):
    stale = small_ppo(seed=5).actor
    metrics = small_ppo().update(make_batch(stale))
    assert metrics["start_ratio_max_deviation"] > 0.01


def test_normalizers_fold_in_the_batch_after_the_epochs(make_batch):
    ppo = small_ppo()
    batch = make_batch(ppo.actor, horizon=6, num_envs=5)
    ppo.update(batch)
    for net, obs in [(ppo.actor, batch["policy_obs"]), (ppo.critic, batch["critic_obs"])]:
        rows = obs[:-1].reshape(-1, obs.shape[-1])  # row T is the next rollout's row 0
        assert int(net.obs_normalizer.count) == rows.shape[0]
        torch.testing.assert_close(net.obs_normalizer.mean, rows.mean(0))
        torch.testing.assert_close(net.obs_normalizer.var, rows.var(0, correction=0))


@pytest.mark.parametrize(("desired_kl", "expected"), [(1e-9, "down"), (10.0, "up"), (None, "fixed")])
def test_adaptive_learning_rate_moves_the_right_way(make_batch, desired_kl, expected):
    ppo = small_ppo(desired_kl=desired_kl)
    metrics = ppo.update(make_batch(ppo.actor, horizon=8, num_envs=8))
    lr = metrics["learning_rate"]
    assert lr == ppo.learning_rate == ppo.optimizer.param_groups[0]["lr"]
    cfg = ppo.cfg
    if expected == "down":
        assert metrics["kl"] > 2 * desired_kl
        assert lr == cfg.min_learning_rate  # 20 minibatches of ÷1.5 reach the floor
    elif expected == "up":
        assert lr == cfg.max_learning_rate
    else:
        assert lr == cfg.learning_rate


def test_metrics_are_plain_floats(make_batch):
    ppo = small_ppo()
    metrics = ppo.update(make_batch(ppo.actor))
    assert {"value_loss", "surrogate_loss", "entropy", "kl", "learning_rate", "action_std_mean",
            "clip_fraction", "start_ratio_max_deviation"} <= set(metrics)
    assert all(type(value) is float and np.isfinite(value) for value in metrics.values())


def test_exact_resume(make_batch, assert_same_state):
    batches = [make_batch(small_ppo().actor, horizon=8, num_envs=6, seed=s) for s in range(3)]
    uninterrupted = small_ppo()
    expected_metrics = [uninterrupted.update(b) for b in batches]

    first = small_ppo()
    first.update(batches[0])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    first.update(batches[1])  # training on must not change the saved state
    buffer.seek(0)
    resumed = small_ppo(seed=99)  # a different seed: everything must come from the state
    resumed.load_state_dict(torch.load(buffer))
    metrics = [resumed.update(b) for b in batches[1:]]

    assert metrics == expected_metrics[1:]
    assert_same_state(resumed.state_dict(), uninterrupted.state_dict())


def test_too_small_a_batch_for_the_minibatches_is_a_user_error(make_batch):
    ppo = small_ppo(num_mini_batches=64)
    with pytest.raises(UserError, match="minibatches"):
        ppo.update(make_batch(ppo.actor, horizon=4, num_envs=3))


def test_learns_a_continuous_bandit(train_on_bandit):
    rewards = train_on_bandit(PPO, PPOConfig(actor_hidden=(64, 64), critic_hidden=(64, 64)), updates=40)
    # A random policy scores about -1.3; the best one 0 (minus its own noise).
    assert rewards[0] < -1.0
    assert np.mean(rewards[-5:]) > -0.2


def test_bf16_updates_within_bf16_rounding_of_fp32(make_batch):
    """--ppo.bf16: the same step as fp32 but for bf16 rounding. Over seeds 0–4 (fixed learning rate,
    so that the KL adaptation does not amplify a difference) the parameter change differed by at most
    3.1 % of its norm, the same with ATen's and oneDNN's AVX2 and default kernels."""
    for seed in range(3):
        fp32, bf16 = small_ppo(seed, desired_kl=None), small_ppo(seed, desired_kl=None, bf16=True)
        batch = make_batch(fp32.actor, seed=seed, horizon=24, num_envs=64)
        start = torch.cat([p.detach().flatten() for p in [*fp32.actor.parameters(), *fp32.critic.parameters()]])
        fp32.update(batch), bf16.update(batch)
        a, b = (torch.cat([p.detach().flatten() for p in [*algo.actor.parameters(), *algo.critic.parameters()]])
                for algo in (fp32, bf16))
        difference = float((a - b).norm() / (a - start).norm())
        assert 1e-4 < difference < 0.1, (seed, difference)  # bf16 really ran, and it took the same step


def test_bf16_is_refused_on_a_learner_without_it(monkeypatch, tmp_path):
    import hetlab
    import hetlab.devices

    monkeypatch.setattr(hetlab.devices, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(UserError, match=r"--ppo.bf16: the learner \(.*\) has no native bfloat16 \(a CPU needs "
                                        r"AVX512_BF16 or AMX\); train without it"):
        hetlab.train_policy(task="cartpole-balance", algo="ppo", envs=16, max_iterations=1, ppo={"bf16": True},
                            runs_dir=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
    monkeypatch.setattr(hetlab.devices, "cpu_has_native_bf16", lambda: True)
    run = hetlab.train_policy(task="cartpole-balance", algo="ppo", envs=16, max_iterations=1, ppo={"bf16": True},
                              runs_dir=str(tmp_path / "runs"))
    assert (run / "summary.json").is_file()


def test_a_compiled_update_takes_the_eager_ones_step(make_batch):
    """--ppo.compile: inductor's fused kernels take the same step as eager PyTorch but for float
    rounding (fixed learning rate, so that the KL adaptation does not amplify a difference): the
    parameters differed by 7.7e-7 of the step's norm with ATen's default kernels and 8.8e-7 with
    AVX2 ones (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2), each with a cold inductor cache."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = small_ppo(0, desired_kl=None), small_ppo(0, desired_kl=None, compile=True)
    batch = make_batch(eager.actor, horizon=24, num_envs=64)
    start = torch.cat([p.detach().flatten() for p in [*eager.actor.parameters(), *eager.critic.parameters()]])
    metrics = eager.update(batch), compiled.update(batch)
    assert counters["stats"]["unique_graphs"] >= 1  # inductor really compiled it
    a, b = (torch.cat([p.detach().flatten() for p in [*algo.actor.parameters(), *algo.critic.parameters()]])
            for algo in (eager, compiled))
    difference = float((a - b).norm() / (a - start).norm())
    assert difference < 1e-4, difference
    assert metrics[1]["value_loss"] == pytest.approx(metrics[0]["value_loss"], rel=1e-4)


MIRROR_Y = Mirror((0, 1, 2), (1.0, -1.0, 1.0))  # in a mirror the second observation changes sign ...
BANDIT_MIRROR = TaskMirror({"policy": MIRROR_Y, "critic": MIRROR_Y}, Mirror((0, 1), (1.0, -1.0)))  # ... and action


def _best_action(obs: torch.Tensor) -> torch.Tensor:
    """A left-right symmetric bandit's answer: the same in a mirror, and not linear across the mirror plane."""
    return torch.stack([1.5 * obs[..., 1].abs() - 0.75, 0.8 * obs[..., 0] * obs[..., 1].sign()], dim=-1)


def _bandit_ppo_on_one_side(symmetry: bool, seed: int) -> tuple[PPO, list[dict]]:
    """PPO trained for 25 sync updates on observations from one side of the mirror only (second one > 0)."""
    cfg = PPOConfig(actor_hidden=(32, 32), critic_hidden=(32, 32), symmetry=symmetry)
    ppo = PPO({"policy": 3, "critic": 3}, 2, cfg, CPU, seed=seed, mirror=BANDIT_MIRROR if symmetry else None)
    g = torch.Generator().manual_seed(seed)
    metrics = []
    for _ in range(25):
        obs = torch.rand(9, 64, 3, generator=g) * torch.tensor([2.0, 1.0, 2.0]) - torch.tensor([1.0, 0.0, 1.0])
        with torch.no_grad():
            actions, log_probs = ppo.actor.act(obs[:-1], generator=g)
        metrics.append(ppo.update({
            "policy_obs": obs, "critic_obs": obs.clone(), "actions": actions, "log_probs": log_probs,
            "rewards": -(actions - _best_action(obs[:-1])).square().mean(-1), "terminated": torch.ones(8, 64),
            "truncated": torch.zeros(8, 64), "final_critic_obs": torch.zeros(8, 64, 3),
            "policy_version": torch.zeros(64, dtype=torch.int64)}))
    return ppo, metrics


def _error(ppo: PPO, side: float) -> float:
    """Mean squared error of the policy's mean action on fresh observations from one side of the mirror."""
    obs = torch.rand(4096, 3, generator=torch.Generator().manual_seed(99)) * 2 - 1
    obs[:, 1] = side * obs[:, 1].abs()
    with torch.no_grad():
        return float((ppo.actor.distribution(obs).loc - _best_action(obs)).square().mean())


def test_symmetry_trains_on_the_mirror_images():
    """--ppo.symmetry on data from one side of the mirror only: the policy also learns the other side,
    which without the mirror images it gets wrong. Over seeds 0–4 the squared error on the unseen side
    was 0.010–0.014 with the mirror images and 1.31–1.48 without; on the seen side 0.010–0.014 and 0.001."""
    mirrored, metrics = _bandit_ppo_on_one_side(True, seed=0)
    plain, _ = _bandit_ppo_on_one_side(False, seed=0)
    assert _error(mirrored, -1.0) < 0.1 and _error(plain, -1.0) > 0.5
    assert _error(mirrored, 1.0) < 0.1 and _error(plain, 1.0) < 0.1
    # The logged gap, the policy's asymmetry on each batch before its update, ended at 0.016–0.030.
    assert metrics[-1]["symmetry_gap"] < 0.1


def test_symmetry_keeps_a_cartpole_policy_symmetric(tmp_path):
    """A whole run with --ppo.symmetry: the policy's asymmetry on its batches falls from 0.41 at the
    start to 0.02–0.06 from the 4th iteration on. Weighing the mirror images by the starting policy's
    log-probs instead of their originals' let it grow to 1.2 by the 10th."""
    import hetlab

    run = hetlab.train_policy(task="cartpole-balance", max_iterations=10, ppo={"symmetry": True},
                              runs_dir=str(tmp_path / "runs"))
    rows = json.loads((run / "history.json").read_text())
    assert json.loads((run / "config.json").read_text())["option_sources"]["ppo.symmetry"] != "default"
    assert rows[0]["loss/symmetry_gap"] > 0.2
    assert max(row["loss/symmetry_gap"] for row in rows[4:]) < 0.15


def test_symmetry_without_the_tasks_mirror_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mirror"):
        PPO(OBS_SIZES, 2, PPOConfig(**SMALL, symmetry=True), CPU)
    import hetlab

    with pytest.raises(UserError, match="leap-cube-reorient is not the same in a mirror.*drop the option"):
        hetlab.train_policy(task="leap-cube-reorient", algo="ppo", envs=4, max_iterations=1, ppo={"symmetry": True},
                            runs_dir=str(tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()
