"""TD3: the actor and both targets move only every `policy_frequency` critic updates, by τ."""

from __future__ import annotations

import torch

from hetlab.algos.td3 import TD3, TD3Config


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def batch(seed: int, size: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"policy_obs": torch.randn(size, 3, generator=g), "critic_obs": torch.randn(size, 4, generator=g),
            "actions": torch.rand(size, 2, generator=g) * 2 - 1, "rewards": torch.randn(size, generator=g),
            "next_policy_obs": torch.randn(size, 3, generator=g), "next_critic_obs": torch.randn(size, 4, generator=g),
            "bootstrap": torch.full((size,), 0.99)}


def test_delayed_actor_and_target_updates_move_by_tau():
    cfg = TD3Config(actor_hidden=(16,), critic_hidden=(16,), policy_frequency=3, tau=0.1)
    td3 = TD3({"policy": 3, "critic": 4}, 2, cfg, torch.device("cpu"))
    for update in range(1, 7):
        actor, target_actor, target_critic = flat(td3.actor), flat(td3.target_actor), flat(td3.target_critic)
        metrics = td3.update(batch(update))
        due = update % 3 == 0
        assert ("actor_loss" in metrics) == due
        assert torch.equal(flat(td3.actor), actor) != due
        if due:
            torch.testing.assert_close(flat(td3.target_actor), 0.9 * target_actor + 0.1 * flat(td3.actor))
            torch.testing.assert_close(flat(td3.target_critic), 0.9 * target_critic + 0.1 * flat(td3.critic))
        else:
            assert torch.equal(flat(td3.target_actor), target_actor)
            assert torch.equal(flat(td3.target_critic), target_critic)


def test_exploration_noise_is_clipped_gaussian_around_the_policy():
    td3 = TD3({"policy": 3, "critic": 4}, 2, TD3Config(actor_hidden=(16,), critic_hidden=(16,)), torch.device("cpu"))
    obs = torch.randn(4000, 3)
    with torch.no_grad():
        noise = td3.actor.explore(obs, torch.Generator().manual_seed(0)) - td3.actor(obs)
    assert abs(float(noise.std()) - td3.cfg.exploration_noise) < 0.01
