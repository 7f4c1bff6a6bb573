"""SAC: the temperature moves towards the target entropy, and the target critic follows by τ."""

from __future__ import annotations

import torch

from hetlab.algos.sac import SAC, SACConfig


def batch(seed: int, size: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"policy_obs": torch.randn(size, 3, generator=g), "critic_obs": torch.randn(size, 4, generator=g),
            "actions": torch.rand(size, 2, generator=g) * 2 - 1, "rewards": torch.randn(size, generator=g),
            "next_policy_obs": torch.randn(size, 3, generator=g), "next_critic_obs": torch.randn(size, 4, generator=g),
            "bootstrap": torch.full((size,), 0.99)}


def make(**overrides) -> SAC:
    cfg = SACConfig(**{"actor_hidden": (16,), "critic_hidden": (16,), "alpha_learning_rate": 1e-2, **overrides})
    return SAC({"policy": 3, "critic": 4}, 2, cfg, torch.device("cpu"))


def test_alpha_moves_toward_the_target_entropy():
    # Entropy above a very low target: α falls; below a very high target: α rises.
    for target_entropy, direction in ((-50.0, -1), (50.0, 1)):
        sac = make(target_entropy=target_entropy)
        alphas = [sac.update(batch(s))["alpha"] for s in range(6)]
        assert all(direction * (later - earlier) > 0 for earlier, later in zip(alphas, alphas[1:]))


def test_target_critic_moves_by_tau():
    sac = make(tau=0.2)
    flat = lambda module: torch.cat([p.detach().flatten() for p in module.parameters()])  # noqa: E731
    target_before = flat(sac.target_critic)
    sac.update(batch(0))
    torch.testing.assert_close(flat(sac.target_critic), 0.8 * target_before + 0.2 * flat(sac.critic))
