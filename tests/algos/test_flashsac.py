"""FlashSAC: unit-norm weights after every update, running statistics for acting, reward scaling."""

from __future__ import annotations

import math

import torch

from hetlab.algos.flashsac import FlashSAC, FlashSACConfig, MemberBatchNorm, MemberRMSNorm, UnitLinear


def batch(seed: int, size: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"policy_obs": torch.randn(size, 3, generator=g), "critic_obs": torch.randn(size, 4, generator=g),
            "actions": torch.rand(size, 2, generator=g) * 2 - 1, "rewards": torch.randn(size, generator=g),
            "next_policy_obs": torch.randn(size, 3, generator=g), "next_critic_obs": torch.randn(size, 4, generator=g),
            "bootstrap": torch.full((size,), 0.99)}


def make(**overrides) -> FlashSAC:
    cfg = FlashSACConfig(**{"actor_hidden": 16, "critic_hidden": 16, "actor_blocks": 1, "critic_blocks": 1, **overrides})
    return FlashSAC({"policy": 3, "critic": 4}, 2, cfg, torch.device("cpu"))


def test_weights_have_unit_norm_after_an_update():
    flashsac = make(learning_rate=1e-2)
    for seed in range(2):  # the second update also steps the actor
        flashsac.update(batch(seed))
    for network in (flashsac.actor, flashsac.critic):
        checked = 0
        for layer in network.modules():
            if isinstance(layer, UnitLinear):
                torch.testing.assert_close(layer.weight.norm(dim=-1), torch.ones(layer.weight.shape[:2]))
            elif isinstance(layer, MemberBatchNorm):
                norms = (layer.weight.square() + layer.bias.square()).sum(-1).sqrt()
                torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(layer.weight.shape[-1])))
            elif isinstance(layer, MemberRMSNorm):
                norms = layer.weight.norm(dim=-1)
                torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(layer.weight.shape[-1])))
            else:
                continue
            checked += 1
        assert checked >= 6


def test_acting_uses_running_statistics_in_train_and_eval_mode():
    flashsac = make()
    flashsac.update(batch(0))
    obs = torch.randn(9, 3)
    with torch.no_grad():
        train_mode = flashsac.actor.train()(obs)
        eval_mode = flashsac.actor.eval()(obs)
        one_row = flashsac.actor(obs[:1])
    assert torch.equal(train_mode, eval_mode)
    torch.testing.assert_close(one_row, eval_mode[:1])  # no batch statistics: one row acts as in a batch


def test_rewards_are_scaled_so_returns_fit_the_support():
    flashsac = make()
    data = batch(0)
    metrics = flashsac.update(data)
    bound = float(data["rewards"].abs().max()) / (1 - 0.99 ** 3)
    assert math.isclose(metrics["reward_scale"], bound / 5.0, rel_tol=1e-5)
    # A later batch of smaller rewards leaves the running bound where it was.
    metrics = flashsac.update({**data, "rewards": 0.1 * data["rewards"]})
    assert math.isclose(metrics["reward_scale"], bound / 5.0, rel_tol=1e-5)


def test_temperature_target_entropy_is_a_gaussian_of_std_0_15():
    flashsac = make()
    assert math.isclose(flashsac.target_entropy, 2 * 0.5 * math.log(2 * math.pi * math.e * 0.15 ** 2))
