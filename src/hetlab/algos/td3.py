"""Twin Delayed Deep Deterministic policy gradient (TD3).

Source: Fujimoto et al. 2018, "Addressing Function Approximation Error in Actor-Critic Methods"
(arXiv:1802.09477), and the authors' implementation (github.com/sfujim/TD3, `TD3.py`, whose
defaults the paper's later revision adopted). Kept: 256×256 ReLU networks, Adam 3e-4, batch 256,
γ 0.99, τ 0.005; clipped double Q-learning (the target takes the smaller twin); target policy
smoothing (N(0, 0.2²) noise clipped to ±0.5 on the target action, then clipped to the action
bounds); delayed updates: the actor (maximising Q1) and both target networks update every
`policy_frequency` = 2 critic steps; exploration with N(0, 0.1²) noise on the deterministic action.

What differs:
- the target is `rewards + bootstrap·min Q'(s', ã')` with the runtime's n-step returns and
  bootstrap factor (n_step 1 by default);
- each network normalises its observations, and the critic reads the `critic` observation group;
- `updates_per_step` counts updates per vectorised env step (the authors' 1 update per
  transition is `updates_per_step = num_envs`), and `learning_starts` counts env steps per env
  where the authors count 25 000 single-env steps.
"""

from __future__ import annotations

import copy

import torch

from hetlab.algos.configs import TD3Config
from hetlab.algos.off_policy_networks import (
    DeterministicActor,
    QEnsemble,
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


class TD3:
    name = "td3"
    off_policy = True  # fed replay samples by the off-policy loop (hetlab.train.off_policy)
    Config = TD3Config
    # On a CPU learner, for the options left at their defaults: SAC's (hetlab.algos.sac.SAC.cpu_defaults).
    cpu_defaults = {"envs": 256}

    def __init__(self, obs_sizes: dict[str, int], action_size: int, cfg: TD3Config, device: torch.device,
                 seed: int = 0):
        self.cfg = cfg
        self.device = device
        self.actor: DeterministicActor
        self.critic: QEnsemble
        self.actor, self.critic = build_on_cpu(seed, lambda: (
            DeterministicActor(obs_sizes["policy"], action_size, cfg.actor_hidden, cfg.exploration_noise,
                               cfg.normalize_obs),
            QEnsemble(obs_sizes["critic"], action_size, cfg.critic_hidden, 1, 2, cfg.normalize_obs),
        ), device)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_learning_rate,
                                                **OPTIMIZER_OPTIONS)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_learning_rate,
                                                 **OPTIMIZER_OPTIONS)
        self.updates = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.policy = maybe_compile(self.actor, cfg.compile)
        self.target_policy = maybe_compile(self.target_actor, cfg.compile)
        self.q_values = maybe_compile(self.critic, cfg.compile)
        self.q1 = maybe_compile(self.critic.first, cfg.compile)
        self.target_q_values = maybe_compile(self.target_critic, cfg.compile)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One critic step; an actor step and both target updates every `policy_frequency` calls."""
        cfg = self.cfg
        self.updates += 1
        self.actor.update_normalizer(batch["policy_obs"])
        self.critic.update_normalizer(batch["critic_obs"])

        with mixed_precision(self.device, cfg.bf16):
            with torch.no_grad():
                # Target policy smoothing: the target action is perturbed by clipped noise.
                noise = standard_normal(batch["actions"].shape, self.generator, self.device)
                noise = (cfg.policy_noise * noise).clamp(-cfg.noise_clip, cfg.noise_clip)
                next_actions = (self.target_policy(batch["next_policy_obs"]) + noise).clamp(-1.0, 1.0)
                next_q = self.target_q_values(batch["next_critic_obs"], next_actions).squeeze(-1).min(0).values
                target = batch["rewards"] + batch["bootstrap"] * next_q
            q = self.q_values(batch["critic_obs"], batch["actions"]).squeeze(-1)  # (2, B)
            critic_loss = (q.float() - target.float()).square().mean(-1).sum()
        gradient_step(self.critic_optimizer, critic_loss)
        metrics: dict[str, torch.Tensor | float] = {"critic_loss": critic_loss, "q_mean": q.mean()}

        if self.updates % cfg.policy_frequency == 0:
            with mixed_precision(self.device, cfg.bf16), frozen(self.critic):
                actor_loss = -self.q1(batch["critic_obs"], self.policy(batch["policy_obs"])).float().mean()
            gradient_step(self.actor_optimizer, actor_loss)
            soft_update(self.target_actor, self.actor, cfg.tau)
            soft_update(self.target_critic, self.critic, cfg.tau)
            metrics["actor_loss"] = actor_loss
        return plain_metrics(metrics)

    # Everything an exact resume needs.
    STATE = (
        "actor", "critic", "target_actor", "target_critic", "actor_optimizer", "critic_optimizer", "updates",
        "generator",
    )

    def state_dict(self) -> dict:
        return snapshot(self, self.STATE)

    def load_state_dict(self, state: dict) -> None:
        restore(self, state, self.STATE)
