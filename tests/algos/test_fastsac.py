"""FastSAC: the Holosoma defaults, the actor every 4th update, and the C51 critic's target."""

from __future__ import annotations

import torch

from hetlab.algos.fastsac import FastSAC, FastSACConfig


def batch(seed: int, size: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"policy_obs": torch.randn(size, 3, generator=g), "critic_obs": torch.randn(size, 4, generator=g),
            "actions": torch.rand(size, 2, generator=g) * 2 - 1, "rewards": torch.randn(size, generator=g),
            "next_policy_obs": torch.randn(size, 3, generator=g), "next_critic_obs": torch.randn(size, 4, generator=g),
            "bootstrap": torch.full((size,), 0.97)}


def make(**overrides) -> FastSAC:
    cfg = FastSACConfig(**{"actor_hidden": (16, 16), "critic_hidden": (16, 16), **overrides})
    return FastSAC({"policy": 3, "critic": 4}, 2, cfg, torch.device("cpu"))


def test_recipe_defaults():
    cfg = FastSACConfig()
    assert (cfg.gamma, cfg.tau, cfg.num_atoms, cfg.policy_frequency, cfg.init_alpha) == (0.97, 0.125, 101, 4, 1e-3)
    assert cfg.layer_norm and cfg.batch_size == 8192 and cfg.updates_per_step == 8.0


def test_actor_every_fourth_update_target_every_update():
    fastsac = make(tau=0.125)
    flat = lambda module: torch.cat([p.detach().flatten() for p in module.parameters()])  # noqa: E731
    for update in range(1, 9):
        actor, target = flat(fastsac.actor), flat(fastsac.target_critic)
        metrics = fastsac.update(batch(update))
        assert ("actor_loss" in metrics) == (update % 4 == 0)
        assert torch.equal(flat(fastsac.actor), actor) == (update % 4 != 0)
        torch.testing.assert_close(flat(fastsac.target_critic), 0.875 * target + 0.125 * flat(fastsac.critic))


def test_critic_fits_terminal_rewards():
    # Terminal transitions: the target is all mass at the reward, so Q learns the reward.
    fastsac = make(critic_learning_rate=3e-3)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(64, 4, generator=g)
    data = {**batch(0, 64), "critic_obs": obs, "rewards": 3.0 * obs[:, 0], "bootstrap": torch.zeros(64)}
    for _ in range(150):
        fastsac.update(data)
    with torch.no_grad():
        q = (torch.softmax(fastsac.critic(obs, data["actions"]), -1) * fastsac.support).sum(-1).mean(0)
    assert (q - data["rewards"]).abs().mean() < 0.5
