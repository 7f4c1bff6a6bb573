"""The modules PPO and APPO share: a running observation normaliser, a Gaussian actor and a critic.

They follow rsl_rl (github.com/leggedrobotics/rsl_rl: `EmpiricalNormalization`, the MLP actor and
critic with ELU): each network normalises its own observations, so the actor is self-contained.
Its `state_dict()` (weights, `log_std` and the normaliser's buffers) is everything a collector
needs to act exactly as the learner would, and `forward` (normalise → MLP → mean) is the
deterministic policy that ONNX export traces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributions import Normal


class FullPrecisionLinear(nn.Linear):
    """A linear layer that computes in fp32 under bf16 autocast too: as the output layer it keeps the
    action mean and the value exact to fp32, where bf16's 8-bit mantissa would round them by up to
    0.4 % before PPO's ratio, KL and value loss are taken from them. It is the network's smallest matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(x.device.type):  # fp32 already (a collector's step): no context to enter
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return super().forward(x.float())


def mlp(in_size: int, hidden: Sequence[int], out_size: int, activation: type[nn.Module] = nn.ELU) -> nn.Sequential:
    """Linear layers of widths `hidden`, each followed by `activation`, then a linear output layer in fp32."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(in_size, width), activation()]
        in_size = width
    layers.append(FullPrecisionLinear(in_size, out_size))
    return nn.Sequential(*layers)


class EmpiricalNormalization(nn.Module):
    """Normalises by the running mean and variance of every sample folded in with `update`.

    The statistics are exact over all samples seen (Chan et al.'s parallel combination of
    batch moments), as rsl_rl computes them. `eps` is added to the standard deviation, so
    near-constant inputs are not blown up.
    """

    def __init__(self, size: int, eps: float = 1e-2):
        super().__init__()
        self.size = size
        self.eps = eps
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("var", torch.ones(size))
        self.register_buffer("count", torch.tensor(0, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / (self.var.sqrt() + self.eps)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch of samples, shape (..., size), into the statistics."""
        x = x.reshape(-1, self.size)
        if x.shape[0] == 0:
            return
        self.count += x.shape[0]
        rate = x.shape[0] / self.count  # this batch's share of all samples seen
        batch_mean = x.mean(dim=0)
        batch_var = x.var(dim=0, correction=0)
        delta = batch_mean - self.mean
        self.mean += rate * delta
        self.var += rate * (batch_var - self.var + delta * (batch_mean - self.mean))


def _normalizer(size: int, enabled: bool) -> nn.Module:
    return EmpiricalNormalization(size) if enabled else nn.Identity()


class GaussianActor(nn.Module):
    """obs → normaliser → MLP → action mean; a diagonal Gaussian with a state-independent std."""

    def __init__(
        self,
        obs_size: int,
        action_size: int,
        hidden: Sequence[int] = (512, 256, 128),
        init_noise_std: float = 1.0,
        normalize_obs: bool = True,
    ):
        super().__init__()
        self.obs_normalizer = _normalizer(obs_size, normalize_obs)
        self.mean_net = mlp(obs_size, hidden, action_size)
        self.log_std = nn.Parameter(torch.full((action_size,), math.log(init_noise_std)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action (the distribution's mean)."""
        return self.mean_net(self.obs_normalizer(obs))

    def distribution(self, obs: torch.Tensor) -> Normal:
        mean = self(obs)  # fp32 also under bf16 autocast (FullPrecisionLinear): log-probs and the KL need it
        return Normal(mean, self.log_std.exp().expand_as(mean), validate_args=False)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled actions (..., A) and their log-probabilities (...,), summed over action dims."""
        dist = self.distribution(obs)
        noise = torch.randn(dist.loc.shape, generator=generator, device=dist.loc.device, dtype=dist.loc.dtype)
        actions = dist.loc + dist.scale * noise
        return actions, dist.log_prob(actions).sum(-1)

    def update_normalizer(self, obs: torch.Tensor) -> None:
        if isinstance(self.obs_normalizer, EmpiricalNormalization):
            self.obs_normalizer.update(obs)


class Critic(nn.Module):
    """obs → normaliser → MLP → state value, shape (...,)."""

    def __init__(self, obs_size: int, hidden: Sequence[int] = (512, 256, 128), normalize_obs: bool = True):
        super().__init__()
        self.obs_normalizer = _normalizer(obs_size, normalize_obs)
        self.value_net = mlp(obs_size, hidden, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_net(self.obs_normalizer(obs)).squeeze(-1)

    def update_normalizer(self, obs: torch.Tensor) -> None:
        if isinstance(self.obs_normalizer, EmpiricalNormalization):
            self.obs_normalizer.update(obs)


def build_actor_critic(
    obs_sizes: dict[str, int],
    action_size: int,
    actor_hidden: Sequence[int],
    critic_hidden: Sequence[int],
    init_noise_std: float,
    normalize_obs: bool,
    device: torch.device,
    seed: int,
) -> tuple[GaussianActor, Critic]:
    """The actor (on the `policy` obs group) and critic (on `critic`), initialised from `seed`.

    They are initialised on the CPU from a private copy of its random state, so a seed gives
    the same weights on every device and building them never shifts anyone else's randomness.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        actor = GaussianActor(obs_sizes["policy"], action_size, actor_hidden, init_noise_std, normalize_obs)
        critic = Critic(obs_sizes["critic"], critic_hidden, normalize_obs)
    return actor.to(device), critic.to(device)
