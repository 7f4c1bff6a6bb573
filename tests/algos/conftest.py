"""Rollout batches for the algorithm tests, built directly in torch (no sim, no runtime).

`make_batch` gives a random rollout in the runtime's batch layout, with terminations, time-outs
and actions sampled from a given actor. `Bandit` is a tiny continuous task to check that an
algorithm learns: obs ~ U(-1, 1)^3, the best action is W·obs, reward −mean((a − W·obs)²), and
every step ends its episode.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hetlab.algos.networks import GaussianActor


def _make_batch(actor: GaussianActor, horizon: int = 6, num_envs: int = 5, critic_size: int = 4, seed: int = 0,
                done_prob: float = 0.2) -> dict[str, torch.Tensor]:
    """A random rollout whose actions and log-probs come from `actor`, one env step at a time as a
    collector samples them."""
    g = torch.Generator().manual_seed(seed)
    policy_size = actor.mean_net[0].in_features
    policy_obs = 2.0 + 3.0 * torch.randn(horizon + 1, num_envs, policy_size, generator=g)
    critic_obs = -1.0 + 2.0 * torch.randn(horizon + 1, num_envs, critic_size, generator=g)
    steps = [actor.act(policy_obs[t], generator=g) for t in range(horizon)]
    terminated = (torch.rand(horizon, num_envs, generator=g) < done_prob).float()
    truncated = (torch.rand(horizon, num_envs, generator=g) < done_prob).float() * (1 - terminated)
    final_critic_obs = torch.randn(horizon, num_envs, critic_size, generator=g) * truncated[..., None]
    return {
        "policy_obs": policy_obs,
        "critic_obs": critic_obs,
        "actions": torch.stack([actions for actions, _ in steps]),
        "log_probs": torch.stack([log_probs for _, log_probs in steps]),
        "rewards": torch.randn(horizon, num_envs, generator=g),
        "terminated": terminated,
        "truncated": truncated,
        "final_critic_obs": final_critic_obs,
        "policy_version": torch.zeros(num_envs, dtype=torch.int64),
    }


class Bandit:
    OBS_SIZE = 3
    ACTION_SIZE = 2
    W = torch.tensor([[0.8, -0.5, 0.3], [-0.4, 0.2, 0.9]])

    def __init__(self, num_envs: int = 64, horizon: int = 8, seed: int = 0):
        self.num_envs, self.horizon = num_envs, horizon
        self.generator = torch.Generator().manual_seed(seed)

    def rollout(self, actor: GaussianActor) -> tuple[dict[str, torch.Tensor], float]:
        """A batch collected with `actor` (the behaviour policy) and its mean reward."""
        T, N = self.horizon, self.num_envs
        obs = torch.rand(T + 1, N, self.OBS_SIZE, generator=self.generator) * 2 - 1
        actions, log_probs = actor.act(obs[:-1], generator=self.generator)
        rewards = -(actions - obs[:-1] @ self.W.T).square().mean(-1)
        batch = {
            "policy_obs": obs, "critic_obs": obs.clone(), "actions": actions, "log_probs": log_probs,
            "rewards": rewards, "terminated": torch.ones(T, N), "truncated": torch.zeros(T, N),
            "final_critic_obs": torch.zeros(T, N, self.OBS_SIZE), "policy_version": torch.zeros(N, dtype=torch.int64),
        }
        return batch, float(rewards.mean())


def _train_on_bandit(algo_class, cfg, updates: int, lag: int = 0, seed: int = 0) -> list[float]:
    """Mean reward of each batch while a new `algo_class(cfg)` trains for `updates` updates. The
    behaviour actor is refreshed from the learner every `lag + 1` updates: with lag > 0 the data is stale."""
    sizes = {"policy": Bandit.OBS_SIZE, "critic": Bandit.OBS_SIZE}
    algo = algo_class(sizes, Bandit.ACTION_SIZE, cfg, torch.device("cpu"), seed=seed)
    bandit = Bandit(seed=seed)
    behaviour = copy.deepcopy(algo.actor)
    rewards = []
    for update in range(updates):
        if update % (lag + 1) == 0:
            behaviour.load_state_dict(algo.actor.state_dict())
        batch, mean_return = bandit.rollout(behaviour)
        algo.update(batch)
        rewards.append(mean_return)
    return rewards


def _assert_same_state(a, b, path: str = "state") -> None:
    """Nested states (tensors, dicts, lists, numbers) are bit-for-bit equal."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same_state(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{path}/{i}")
    else:
        assert a == b, path


# Fixtures hand out the helpers: test modules are imported with --import-mode=importlib, so
# they cannot import this file.


@pytest.fixture
def make_batch():
    """`make_batch(actor, horizon=6, num_envs=5, critic_size=4, seed=0, done_prob=0.2)`."""
    return _make_batch


@pytest.fixture
def train_on_bandit():
    """`train_on_bandit(algo_class, cfg, updates, lag=0, seed=0) -> mean reward per update`."""
    return _train_on_bandit


@pytest.fixture
def assert_same_state():
    """`assert_same_state(a, b)`: two algorithm states are bit-for-bit equal."""
    return _assert_same_state
