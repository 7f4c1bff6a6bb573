"""FastSAC: SAC tuned for massively parallel simulation, as Holosoma implements it.

Source: Holosoma (github.com/amazon-far/holosoma, `agents/fast_sac/fast_sac.py` and
`fast_sac_agent.py`, defaults from `config_types/algo.py`), which carries FastTD3's recipe
(Seo et al. 2025, "FastTD3: Simple, Fast, and Capable Reinforcement Learning for Humanoid
Control", arXiv:2505.22642) over to SAC. Kept from Holosoma: large batches (8192) and many
updates per vectorised step (8); a distributional C51 critic (101 atoms on [−20, 20]) of two
Q-networks, each trained by cross-entropy against the projection of its own target network's
distribution; Linear → LayerNorm → SiLU networks (actor 512/256/128, critic 768/384/192) with
zero-initialised actor heads and the log std squashed into [−5, 0]; γ 0.97; τ 0.125 after every
critic step; the actor updated every 4 critic steps on the mean of the two Q-values; the
temperature updated with every critic step from the target's next-state log-probabilities,
starting at α = 0.001 with target entropy 0; AdamW (3e-4, betas 0.9/0.95, weight decay 1e-3);
no gradient clipping; asymmetric actor-critic; observation normalisation.

What differs:
- the runtime computes n-step returns and the bootstrap factor: each atom z is projected to
  `rewards + bootstrap·(z − α log π(a'|s'))`, which is Holosoma's target written with the
  bootstrap factor γ^k (or 0) it computes from `dones`, `truncations` and `effective_n_steps`;
- the temperature's AdamW has no weight decay (Holosoma's inherits AdamW's default 0.01,
  which pulls log α towards 0);
- the actor and the critic each own their normaliser, folded in with the batch's `policy_obs`
  and `critic_obs` at the start of every update (Holosoma folds in the sampled batch likewise);
- Holosoma's actor runs at critic steps 2 and 6 of each group of 8; here at every 4th update.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn

from hetlab.algos.configs import FastSACConfig
from hetlab.algos.off_policy_networks import (
    QEnsemble,
    TanhGaussianActor,
    build_on_cpu,
    categorical_projection,
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


class FastSAC:
    name = "fastsac"
    off_policy = True  # fed replay samples by the off-policy loop (hetlab.train.off_policy)
    Config = FastSACConfig
    # On a CPU learner, for the options left at their defaults (hetlab.train.device_defaults): the
    # recipe's batch of 8192 with 512/768-wide networks ran 0.6 updates/s on the CPU learner's thread,
    # at 8 updates per env step (a 150 s cartpole run ended before its first iteration); batch 256,
    # 128-128 / 256-256 networks and 1 update per step run ~60× as many. 256 envs, as for SAC. The
    # rest of the recipe (C51, LayerNorm, γ, τ, α, AdamW, actor every 4th update) stays.
    cpu_defaults = {"envs": 256, "fastsac.batch_size": 256, "fastsac.updates_per_step": 1.0,
                    "fastsac.actor_hidden": (128, 128), "fastsac.critic_hidden": (256, 256)}

    def __init__(self, obs_sizes: dict[str, int], action_size: int, cfg: FastSACConfig, device: torch.device,
                 seed: int = 0):
        self.cfg = cfg
        self.device = device
        self.actor: TanhGaussianActor
        self.critic: QEnsemble
        self.actor, self.critic = build_on_cpu(seed, lambda: (
            TanhGaussianActor(obs_sizes["policy"], action_size, cfg.actor_hidden, cfg.log_std_min, cfg.log_std_max,
                              cfg.normalize_obs, activation=nn.SiLU, layer_norm=cfg.layer_norm, zero_init_heads=True),
            QEnsemble(obs_sizes["critic"], action_size, cfg.critic_hidden, cfg.num_atoms, cfg.num_q_networks,
                      cfg.normalize_obs, activation=nn.SiLU, layer_norm=cfg.layer_norm),
        ), device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.support = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_atoms, device=device)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), device=device, requires_grad=True)
        self.target_entropy = -cfg.target_entropy_ratio * action_size
        adamw = {"betas": cfg.adam_betas, "weight_decay": cfg.weight_decay, **OPTIMIZER_OPTIONS}
        self.actor_optimizer = torch.optim.AdamW(self.actor.parameters(), lr=cfg.actor_learning_rate, **adamw)
        self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_learning_rate, **adamw)
        self.alpha_optimizer = torch.optim.AdamW([self.log_alpha], lr=cfg.alpha_learning_rate,
                                                 betas=cfg.adam_betas, weight_decay=0.0, **OPTIMIZER_OPTIONS)
        self.updates = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.sample_actions = maybe_compile(self.actor.sample, cfg.compile)
        self.q_logits = maybe_compile(self.critic, cfg.compile)
        self.target_q_logits = maybe_compile(self.target_critic, cfg.compile)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One critic and temperature step; an actor step every `policy_frequency` calls; then the target."""
        cfg = self.cfg
        self.updates += 1
        self.actor.update_normalizer(batch["policy_obs"])
        self.critic.update_normalizer(batch["critic_obs"])
        batch_size, action_size = batch["actions"].shape

        with mixed_precision(self.device, cfg.bf16):
            with torch.no_grad():
                noise = standard_normal((batch_size, action_size), self.generator, self.device)
                next_actions, next_log_probs = self.sample_actions(batch["next_policy_obs"], noise)
                next_log_probs = next_log_probs.float()
                alpha = self.log_alpha.exp()
                # The entropy bonus enters through the reward, so the same projection applies.
                soft_rewards = batch["rewards"] - batch["bootstrap"] * alpha * next_log_probs
                next_probs = F.softmax(self.target_q_logits(batch["next_critic_obs"], next_actions).float(), dim=-1)
                target_probs = categorical_projection(next_probs, self.support, soft_rewards, batch["bootstrap"])
            logits = self.q_logits(batch["critic_obs"], batch["actions"]).float()  # (K, B, atoms)
            # Cross-entropy of each member against its own target, averaged over the batch, summed over members.
            critic_loss = -(target_probs * F.log_softmax(logits, dim=-1)).sum(-1).mean(-1).sum()
        gradient_step(self.critic_optimizer, critic_loss, cfg.max_grad_norm)
        alpha_loss = -(self.log_alpha.exp() * (next_log_probs + self.target_entropy)).mean()
        gradient_step(self.alpha_optimizer, alpha_loss)
        q_mean = (F.softmax(logits.detach(), dim=-1) * self.support).sum(-1).mean()
        metrics: dict[str, torch.Tensor | float] = {
            "critic_loss": critic_loss, "q_mean": q_mean, "alpha": self.log_alpha.detach().exp(), "alpha_loss": alpha_loss,
        }

        if self.updates % cfg.policy_frequency == 0:
            with mixed_precision(self.device, cfg.bf16), frozen(self.critic):
                noise = standard_normal((batch_size, action_size), self.generator, self.device)
                actions, log_probs = self.sample_actions(batch["policy_obs"], noise)
                q_probs = F.softmax(self.q_logits(batch["critic_obs"], actions).float(), dim=-1)
                q_new = (q_probs * self.support).sum(-1).mean(0)  # the members' mean
                actor_loss = (self.log_alpha.detach().exp() * log_probs.float() - q_new).mean()
            gradient_step(self.actor_optimizer, actor_loss, cfg.max_grad_norm)
            metrics.update(actor_loss=actor_loss, entropy=-log_probs.mean())

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
