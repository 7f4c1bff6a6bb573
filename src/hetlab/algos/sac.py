"""Soft Actor-Critic with automatic temperature tuning.

Source: Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications" (arXiv:1812.05905;
the algorithm of arXiv:1801.01290 with a learned temperature), and its reference implementation
softlearning (github.com/rail-berkeley/softlearning, `algorithms/sac.py`). Kept: the defaults of
the paper's Table 1 (Adam 3e-4 for all three, 256×256 ReLU networks, batch 256, τ 0.005, γ 0.99,
one gradient step per environment step, target entropy −|A|, α starting at 1), twin Q-networks
with the minimum in the target, the soft target r + γ(min Q' − α log π), the critic loss ½·MSE
per network, the temperature loss −log α·(log π + H̄) on the actor's fresh samples, and the
target networks updated after every step.

What differs:
- transitions arrive with n-step returns and a bootstrap factor already computed by the runtime:
  the target is `rewards + bootstrap·(min Q'(s', a') − α log π(a'|s'))` (n_step 1 by default);
- the actor's log std is squashed into [−5, 2] with tanh (as Yarats' pytorch_sac does) where
  softlearning clips it to [−20, 2];
- each network normalises its observations (the runtime's tasks are not pre-normalised), and
  the critic reads the `critic` observation group (asymmetric actor-critic);
- with many envs one vectorised step brings many transitions: `updates_per_step` counts
  updates per vectorised step, so the paper's ratio of 1 update per transition is
  `updates_per_step = num_envs`; the default of 1 trades sample efficiency for speed.
"""

from __future__ import annotations

import copy
import math

import torch

from hetlab.algos.configs import SACConfig
from hetlab.algos.off_policy_networks import (
    QEnsemble,
    TanhGaussianActor,
    build_on_cpu,
    frozen,
    gradient_step,
    maybe_compile,
    plain_metrics,
    restore,
    snapshot,
    soft_update,
    standard_normal,
)
from hetlab.devices import OPTIMIZER_OPTIONS, mixed_precision


class SAC:
    name = "sac"
    off_policy = True  # fed replay samples by the off-policy loop (hetlab.train.off_policy)
    Config = SACConfig
    # On a CPU learner, for the options left at their defaults (hetlab.train.device_defaults): 256 envs.
    # The paper's networks and batch are CPU-sized already, but each update pays for a step of every
    # env: 1024 envs kept the CPU collector busy for half of a cartpole run, and Go1's physics
    # (~11k env steps/s on 2 cores) would hold the learner to ~10 updates/s.
    cpu_defaults = {"envs": 256}

    def __init__(self, obs_sizes: dict[str, int], action_size: int, cfg: SACConfig, device: torch.device,
                 seed: int = 0):
        self.cfg = cfg
        self.device = device
        self.actor: TanhGaussianActor
        self.critic: QEnsemble
        self.actor, self.critic = build_on_cpu(seed, lambda: (
            TanhGaussianActor(obs_sizes["policy"], action_size, cfg.actor_hidden, cfg.log_std_min, cfg.log_std_max,
                              cfg.normalize_obs),
            QEnsemble(obs_sizes["critic"], action_size, cfg.critic_hidden, 1, 2, cfg.normalize_obs),
        ), device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = -float(action_size) if cfg.target_entropy is None else cfg.target_entropy
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_learning_rate,
                                                **OPTIMIZER_OPTIONS)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_learning_rate,
                                                 **OPTIMIZER_OPTIONS)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=cfg.alpha_learning_rate, **OPTIMIZER_OPTIONS)
        self.updates = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.sample_actions = maybe_compile(self.actor.sample, cfg.compile)
        self.q_values = maybe_compile(self.critic, cfg.compile)
        self.target_q_values = maybe_compile(self.target_critic, cfg.compile)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One critic step; an actor and temperature step every `policy_frequency` calls."""
        cfg = self.cfg
        self.updates += 1
        self.actor.update_normalizer(batch["policy_obs"])
        self.critic.update_normalizer(batch["critic_obs"])
        batch_size, action_size = batch["actions"].shape
        alpha = self.log_alpha.detach().exp()

        with mixed_precision(self.device, cfg.bf16):
            with torch.no_grad():
                noise = standard_normal((batch_size, action_size), self.generator, self.device)
                next_actions, next_log_probs = self.sample_actions(batch["next_policy_obs"], noise)
                next_q = self.target_q_values(batch["next_critic_obs"], next_actions).squeeze(-1).min(0).values
                target = batch["rewards"] + batch["bootstrap"] * (next_q - alpha * next_log_probs)
            q = self.q_values(batch["critic_obs"], batch["actions"]).squeeze(-1)  # (2, B)
            critic_loss = 0.5 * (q.float() - target.float()).square().mean(-1).sum()
        gradient_step(self.critic_optimizer, critic_loss)
        metrics: dict[str, torch.Tensor | float] = {"critic_loss": critic_loss, "q_mean": q.mean(), "alpha": alpha}

        if self.updates % cfg.policy_frequency == 0:
            with mixed_precision(self.device, cfg.bf16), frozen(self.critic):
                noise = standard_normal((batch_size, action_size), self.generator, self.device)
                actions, log_probs = self.sample_actions(batch["policy_obs"], noise)
                q_new = self.q_values(batch["critic_obs"], actions).squeeze(-1).min(0).values
                actor_loss = (alpha * log_probs - q_new).float().mean()
            gradient_step(self.actor_optimizer, actor_loss)
            alpha_loss = -(self.log_alpha * (log_probs.detach().float() + self.target_entropy)).mean()
            gradient_step(self.alpha_optimizer, alpha_loss)
            metrics.update(actor_loss=actor_loss, alpha_loss=alpha_loss, entropy=-log_probs.mean())

        if self.updates % cfg.target_update_interval == 0:
            soft_update(self.target_critic, self.critic, cfg.tau)
        return plain_metrics(metrics)

    # Everything an exact resume needs.
    STATE = (
        "actor", "critic", "target_critic", "log_alpha", "actor_optimizer", "critic_optimizer",
        "alpha_optimizer", "updates", "generator",
    )

    def state_dict(self) -> dict:
        return snapshot(self, self.STATE)

    def load_state_dict(self, state: dict) -> None:
        restore(self, state, self.STATE)
