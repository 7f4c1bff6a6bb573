"""FlashSAC: SAC with norm-bounded residual networks, a distributional critic and normalised rewards.

Source: Kim, Lee et al. 2026, "FlashSAC: Fast and Stable Off-Policy Reinforcement Learning for
High-Dimensional Robot Control" (arXiv:2604.04539), and the authors' implementation
(github.com/leeyngdo/FlashSAC, `flash_rl/agents/flashSAC/{layer,network,update,agent}.py`,
defaults from `configs/agent/flashSAC.yaml`). Kept:
- networks of inverted residual blocks (Linear h→4h, BatchNorm, ReLU, Linear 4h→h, BatchNorm,
  ReLU, + residual) after an embedder (BatchNorm on the raw input, then Linear), with RMSNorm
  after the blocks; linear layers without bias, orthogonally initialised; after every optimiser
  step each linear layer's weight rows are projected to unit norm, and each norm layer's scale
  (with its shift, for BatchNorm) to norm √d;
- BatchNorm with batch statistics wherever the reference trains with them: the critic and its
  target see the current and next state-actions as one batch, the actor its current and next
  observations; the actor acts, and the critic scores the actor's actions, with running statistics;
- a two-member C51 critic (101 atoms on [−G_max, G_max] = [−5, 5]) trained by cross-entropy
  against the projection of the target distribution of the member with the smaller expected value;
- an actor step every 2 updates, before the critic step, on min(Q1, Q2) − α log π, followed by the
  temperature step α·(H − H̄) with H̄ the entropy of a Gaussian of std 0.15 per action dimension;
  α starts at 0.01; the log std is squashed into [−10, 2];
- Adam 3e-4, batch 2048, γ 0.99, n-step 3, τ 0.01 after every update, 2 updates per vectorised step.

What differs:
- reward normalisation. The reference divides rewards by max(std(G), max|G| / G_max), with G
  each env's running discounted return, which needs the reward stream in env order; the learner
  here sees shuffled n-step windows. It divides instead by `return_bound / G_max`, where
  `return_bound` is a running maximum of |R_n| / (1 − γ^n) over every batch: the largest return
  |r|max / (1 − γ) the rewards seen so far could add up to, so normalised returns stay inside
  the critic's support (the role of the reference's max|G| term) — a looser scale when
  episodes end long before 1 / (1 − γ) steps;
- the learning-rate schedule (warm-up, then decay to 1.5e-4 over the run) is left out: an update
  does not know the run's length; the rate stays at the peak 3e-4;
- the reference repeats each exploration noise for a zeta-distributed number of steps; `explore`
  here draws fresh noise every step (a collector's actor copy keeps no per-env state);
- observations are normalised by the embedder's BatchNorm, as in the reference, so the
  `normalize_obs` running normaliser the other algorithms use is off by default.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from hetlab.algos.configs import FlashSACConfig
from hetlab.algos.off_policy_networks import (
    TanhGaussianPolicy,
    build_on_cpu,
    categorical_projection,
    fold_into_normalizer,
    frozen,
    gradient_step,
    maybe_compile,
    obs_normalizer,
    plain_metrics,
    restore,
    snapshot,
    soft_update,
    squash_log_std,
    standard_normal,
    tanh_gaussian_sample,
)
from hetlab.devices import OPTIMIZER_OPTIONS, mixed_precision


# -- layers: every one works on (members, batch, features), so the critic's twins run as one -------


class UnitLinear(nn.Module):
    """A bias-free linear map per member whose weight rows are kept at unit norm."""

    def __init__(self, members: int, in_size: int, out_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, out_size, in_size))
        for member_weight in self.weight.data:
            nn.init.orthogonal_(member_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight.transpose(1, 2))

    @torch.no_grad()
    def project(self) -> None:
        self.weight.copy_(F.normalize(self.weight, dim=-1, eps=1e-8))


class MemberBatchNorm(nn.Module):
    """BatchNorm over the batch of each member; scale and shift together are kept at norm √d."""

    def __init__(self, members: int, size: int, momentum: float = 0.01, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.weight = nn.Parameter(torch.ones(members, size))
        self.bias = nn.Parameter(torch.zeros(members, size))
        self.register_buffer("running_mean", torch.zeros(members, size))
        self.register_buffer("running_var", torch.ones(members, size))

    def forward(self, x: torch.Tensor, batch_stats: bool) -> torch.Tensor:
        if batch_stats:
            mean = x.mean(1, keepdim=True)
            var = x.var(1, correction=0, keepdim=True)
            with torch.no_grad():
                count = x.shape[1]
                self.running_mean.lerp_(mean.squeeze(1).float(), self.momentum)
                self.running_var.lerp_(var.squeeze(1).float() * count / max(count - 1, 1), self.momentum)
        else:
            mean, var = self.running_mean.unsqueeze(1), self.running_var.unsqueeze(1)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight.unsqueeze(1) + self.bias.unsqueeze(1)

    @torch.no_grad()
    def project(self) -> None:
        norm = (self.weight.square() + self.bias.square()).sum(-1, keepdim=True).add(1e-8).sqrt()
        factor = math.sqrt(self.weight.shape[-1]) / norm
        self.weight.mul_(factor)
        self.bias.mul_(factor)


class MemberRMSNorm(nn.Module):
    """RMSNorm per member; the scale is kept at norm √d."""

    def __init__(self, members: int, size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(members, size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight.unsqueeze(1)

    @torch.no_grad()
    def project(self) -> None:
        norm = self.weight.square().sum(-1, keepdim=True).add(1e-8).sqrt()
        self.weight.mul_(math.sqrt(self.weight.shape[-1]) / norm)


class InvertedResidualBlock(nn.Module):
    """x + ReLU(BN(W2 · ReLU(BN(W1 · x)))), the inner layer `expansion` times wider."""

    def __init__(self, members: int, hidden: int, expansion: int):
        super().__init__()
        self.expand = UnitLinear(members, hidden, hidden * expansion)
        self.expand_norm = MemberBatchNorm(members, hidden * expansion)
        self.contract = UnitLinear(members, hidden * expansion, hidden)
        self.contract_norm = MemberBatchNorm(members, hidden)

    def forward(self, x: torch.Tensor, batch_stats: bool) -> torch.Tensor:
        y = F.relu(self.expand_norm(self.expand(x), batch_stats))
        return x + F.relu(self.contract_norm(self.contract(y), batch_stats))


class Encoder(nn.Module):
    """BatchNorm(input) → Linear → inverted residual blocks → RMSNorm."""

    def __init__(self, members: int, in_size: int, hidden: int, blocks: int, expansion: int):
        super().__init__()
        self.input_norm = MemberBatchNorm(members, in_size)
        self.embed = UnitLinear(members, in_size, hidden)
        self.blocks = nn.ModuleList(InvertedResidualBlock(members, hidden, expansion) for _ in range(blocks))
        self.output_norm = MemberRMSNorm(members, hidden)

    def forward(self, x: torch.Tensor, batch_stats: bool) -> torch.Tensor:
        x = self.embed(self.input_norm(x, batch_stats))
        for block in self.blocks:
            x = block(x, batch_stats)
        return self.output_norm(x)


def project_to_unit_norm(module: nn.Module) -> None:
    """FlashSAC's weight projection, applied after every optimiser step (and at initialisation)."""
    for layer in module.modules():
        if isinstance(layer, (UnitLinear, MemberBatchNorm, MemberRMSNorm)):
            layer.project()


class FlashSACActor(TanhGaussianPolicy):
    """obs → [normaliser] → encoder → (mean, log std) heads; a tanh-Gaussian policy.

    `forward` and `explore` use the BatchNorm running statistics whatever the module's train/eval
    mode, so a collector's copy acts as the learner's actor does; only the learner's update
    passes `batch_stats=True`.
    """

    def __init__(self, obs_size: int, action_size: int, cfg: FlashSACConfig):
        super().__init__()
        self.log_std_min, self.log_std_max = cfg.log_std_min, cfg.log_std_max
        self.obs_normalizer = obs_normalizer(obs_size, cfg.normalize_obs)
        self.encoder = Encoder(1, obs_size, cfg.actor_hidden, cfg.actor_blocks, cfg.expansion)
        self.mean_head = UnitLinear(1, cfg.actor_hidden, action_size)
        self.mean_bias = nn.Parameter(torch.zeros(action_size))
        self.log_std_head = UnitLinear(1, cfg.actor_hidden, action_size)
        self.log_std_bias = nn.Parameter(torch.zeros(action_size))
        project_to_unit_norm(self)

    def mean_and_log_std(self, obs: torch.Tensor, batch_stats: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.obs_normalizer(obs).reshape(1, -1, obs.shape[-1])  # one member, any leading dims as the batch
        features = self.encoder(x, batch_stats)
        out_shape = (*obs.shape[:-1], self.mean_bias.shape[0])
        mean = (self.mean_head(features)[0] + self.mean_bias).reshape(out_shape)
        raw_log_std = (self.log_std_head(features)[0] + self.log_std_bias).reshape(out_shape)
        return mean, squash_log_std(raw_log_std, self.log_std_min, self.log_std_max)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor,
               batch_stats: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.mean_and_log_std(obs, batch_stats)
        return tanh_gaussian_sample(mean, log_std, noise)


class FlashSACCritic(nn.Module):
    """(critic obs, action) → C51 logits (members, batch, atoms), the members evaluated as one batch."""

    def __init__(self, obs_size: int, action_size: int, cfg: FlashSACConfig):
        super().__init__()
        self.members = cfg.num_q_networks
        self.obs_normalizer = obs_normalizer(obs_size, cfg.normalize_obs)
        self.encoder = Encoder(self.members, obs_size + action_size, cfg.critic_hidden, cfg.critic_blocks,
                               cfg.expansion)
        self.head = UnitLinear(self.members, cfg.critic_hidden, cfg.num_atoms)
        self.head_bias = nn.Parameter(torch.zeros(self.members, cfg.num_atoms))
        project_to_unit_norm(self)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor, batch_stats: bool) -> torch.Tensor:
        x = torch.cat([self.obs_normalizer(obs), actions], dim=-1)
        x = x.unsqueeze(0).expand(self.members, -1, -1)
        return self.head(self.encoder(x, batch_stats)) + self.head_bias.unsqueeze(1)

    def update_normalizer(self, obs: torch.Tensor) -> None:
        fold_into_normalizer(self.obs_normalizer, obs)


# -- the algorithm ---------------------------------------------------------------------------------


class FlashSAC:
    name = "flashsac"
    off_policy = True  # fed replay samples by the off-policy loop (hetlab.train.off_policy)
    Config = FlashSACConfig
    # On a CPU learner, for the options left at their defaults (hetlab.train.device_defaults): the
    # reference's batch of 2048 and two blocks of width 128 / 256 with 4× inner layers ran 0.2 updates/s
    # on the CPU learner's thread; batch 128 and one block of width 64 with a 2× inner layer run ~250×
    # as many. 256 envs, as for SAC; the 2 updates per env step stay.
    cpu_defaults = {"envs": 256, "flashsac.batch_size": 128, "flashsac.actor_blocks": 1, "flashsac.critic_blocks": 1,
                    "flashsac.actor_hidden": 64, "flashsac.critic_hidden": 64, "flashsac.expansion": 2}

    def __init__(self, obs_sizes: dict[str, int], action_size: int, cfg: FlashSACConfig, device: torch.device,
                 seed: int = 0):
        self.cfg = cfg
        self.device = device
        self.actor: FlashSACActor
        self.critic: FlashSACCritic
        self.actor, self.critic = build_on_cpu(seed, lambda: (
            FlashSACActor(obs_sizes["policy"], action_size, cfg),
            FlashSACCritic(obs_sizes["critic"], action_size, cfg),
        ), device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = torch.linspace(-cfg.return_max, cfg.return_max, cfg.num_atoms, device=device)
        self.log_temperature = torch.tensor(math.log(cfg.init_temperature), device=device, requires_grad=True)
        # The entropy of a Gaussian of std σ in every action dimension (actions span [-1, 1]).
        self.target_entropy = 0.5 * action_size * math.log(2 * math.pi * math.e * cfg.target_entropy_std ** 2)
        # The largest |R_n| / (1 − γ^n) seen: the bound on returns that scales the rewards.
        self.return_bound = torch.zeros((), device=device)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.learning_rate, **OPTIMIZER_OPTIONS)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.learning_rate, **OPTIMIZER_OPTIONS)
        self.temperature_optimizer = torch.optim.Adam([self.log_temperature], lr=cfg.learning_rate, **OPTIMIZER_OPTIONS)
        self.updates = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.sample_actions = maybe_compile(self.actor.sample, cfg.compile)
        self.q_logits = maybe_compile(self.critic, cfg.compile)
        self.target_q_logits = maybe_compile(self.target_critic, cfg.compile)

    def reward_scale(self) -> torch.Tensor:
        """What the rewards are divided by: returns up to `return_bound` map into [−G_max, G_max]."""
        return (self.return_bound / self.cfg.return_max).clamp_min(1e-8)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """An actor and temperature step every `policy_frequency` calls, then a critic step and the target."""
        cfg = self.cfg
        self.updates += 1
        self.actor.update_normalizer(batch["policy_obs"])
        self.critic.update_normalizer(batch["critic_obs"])
        rewards = batch["rewards"]
        if cfg.normalize_reward:
            window_bound = rewards.abs().max() / (1.0 - cfg.gamma ** cfg.n_step)
            self.return_bound = torch.maximum(self.return_bound, window_bound)
            rewards = rewards / self.reward_scale()
        metrics: dict[str, torch.Tensor | float] = {}
        if self.updates % cfg.policy_frequency == 0:
            metrics.update(self._actor_and_temperature_step(batch))
        metrics.update(self._critic_step(batch, rewards))
        soft_update(self.target_critic, self.critic, cfg.tau)
        metrics.update(temperature=self.log_temperature.detach().exp(), reward_scale=self.reward_scale())
        return plain_metrics(metrics)

    def _actor_and_temperature_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        batch_size, action_size = batch["actions"].shape
        # The actor's BatchNorm takes its statistics over current and next observations together.
        both_obs = torch.cat([batch["policy_obs"], batch["next_policy_obs"]])
        noise = standard_normal((2 * batch_size, action_size), self.generator, self.device)
        with mixed_precision(self.device, self.cfg.bf16), frozen(self.critic):
            actions, log_probs = self.sample_actions(both_obs, noise, batch_stats=True)
            actions, log_probs = actions[:batch_size], log_probs[:batch_size].float()
            q = self._expected_values(self.q_logits(batch["critic_obs"], actions, batch_stats=False)).min(0).values
            actor_loss = (self.log_temperature.detach().exp() * log_probs - q).mean()
        gradient_step(self.actor_optimizer, actor_loss)
        project_to_unit_norm(self.actor)

        entropy = -log_probs.detach().mean()
        temperature_loss = self.log_temperature.exp() * (entropy - self.target_entropy)
        gradient_step(self.temperature_optimizer, temperature_loss)
        return {"actor_loss": actor_loss, "entropy": entropy, "temperature_loss": temperature_loss}

    def _critic_step(self, batch: dict[str, torch.Tensor], rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        batch_size, action_size = batch["actions"].shape
        noise = standard_normal((batch_size, action_size), self.generator, self.device)
        both_obs = torch.cat([batch["critic_obs"], batch["next_critic_obs"]])
        with mixed_precision(self.device, self.cfg.bf16):
            with torch.no_grad():
                next_actions, next_log_probs = self.sample_actions(batch["next_policy_obs"], noise)
                both_actions = torch.cat([batch["actions"], next_actions])
                # The target critic sees (s, a) and (s', a') as one batch, as the online critic does.
                next_logits = self.target_q_logits(both_obs, both_actions, batch_stats=True)[:, batch_size:].float()
                next_probs = F.softmax(next_logits, dim=-1)
                # Per transition, the distribution of the member with the smaller expected value.
                pessimist = self._expected_values(next_logits).argmin(0)
                next_probs = next_probs.gather(0, pessimist[None, :, None].expand(1, -1, next_probs.shape[-1]))[0]
                soft_rewards = rewards - batch["bootstrap"] * self.log_temperature.exp() * next_log_probs.float()
                target_probs = categorical_projection(next_probs, self.support, soft_rewards, batch["bootstrap"])
            logits = self.q_logits(both_obs, both_actions, batch_stats=True)[:, :batch_size].float()
            critic_loss = -(target_probs * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        gradient_step(self.critic_optimizer, critic_loss)
        project_to_unit_norm(self.critic)
        return {"critic_loss": critic_loss, "q_mean": self._expected_values(logits.detach()).mean()}

    def _expected_values(self, logits: torch.Tensor) -> torch.Tensor:
        return (F.softmax(logits.float(), dim=-1) * self.support).sum(-1)

    # Everything an exact resume needs.
    STATE = (
        "actor", "critic", "target_critic", "log_temperature", "return_bound", "actor_optimizer",
        "critic_optimizer", "temperature_optimizer", "updates", "generator",
    )

    def state_dict(self) -> dict:
        return snapshot(self, self.STATE)

    def load_state_dict(self, state: dict) -> None:
        restore(self, state, self.STATE)
