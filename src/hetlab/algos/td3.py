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
from dataclasses import dataclass

import torch

from hetlab.algos.off_policy_networks import (
    DeterministicActor,
    QEnsemble,
    build_on_cpu,
    check_common_config,
    frozen,
    gradient_step,
    maybe_compile,
    mixed_precision,
    plain_metrics,
    restore,
    snapshot,
    soft_update,
    standard_normal,
)
from hetlab.errors import UserError


@dataclass(frozen=True)
class TD3Config:
    actor_hidden: tuple[int, ...] = (256, 256)  # hidden-layer widths of the actor MLP
    critic_hidden: tuple[int, ...] = (256, 256)  # hidden-layer widths of the critic MLP
    normalize_obs: bool = True  # normalise observations by their running mean and std
    batch_size: int = 256  # transitions sampled per update
    gamma: float = 0.99  # discount factor
    n_step: int = 1  # steps summed in the n-step return
    updates_per_step: float = 1.0  # gradient updates per vectorised env step
    learning_starts: int = 100  # env steps per env of uniform-random actions before updates start
    tau: float = 0.005  # Polyak factor of the target networks
    actor_learning_rate: float = 3e-4  # Adam learning rate of the actor
    critic_learning_rate: float = 3e-4  # Adam learning rate of the critics
    policy_noise: float = 0.2  # std of the target policy smoothing noise
    noise_clip: float = 0.5  # bound of the target-policy smoothing noise
    exploration_noise: float = 0.1  # std of the behaviour policy's noise
    policy_frequency: int = 2  # critic updates per actor and target update
    compile: bool = False  # torch.compile the update (pays off on GPUs)
    bf16: bool = False  # bfloat16 autocast in the update (on devices that have it)

    def __post_init__(self):
        object.__setattr__(self, "actor_hidden", tuple(self.actor_hidden))
        object.__setattr__(self, "critic_hidden", tuple(self.critic_hidden))
        check_common_config(self, "TD3")
        if not self.actor_hidden or not self.critic_hidden:
            raise UserError("invalid TD3 config: actor_hidden and critic_hidden need at least one layer")
        if min(self.policy_noise, self.noise_clip, self.exploration_noise) < 0:
            raise UserError("invalid TD3 config: policy_noise, noise_clip and exploration_noise must be ≥ 0")


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
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.actor_learning_rate)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), lr=cfg.critic_learning_rate)
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
