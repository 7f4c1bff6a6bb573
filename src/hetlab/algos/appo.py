"""APPO: PPO made safe for stale rollouts with V-trace and a target network, IMPACT-style.

Sources: IMPALA (Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures", arXiv:1802.01561) for the V-trace targets and advantages;
IMPACT (Luo et al. 2020, "IMPACT: Importance Weighted Asynchronous Architectures with Clipped
Target Networks", arXiv:1912.00167) for the target network and clipping against it.

In the async runtime a rollout comes from weights some versions old: the behaviour policy μ.
V-trace corrects the value targets and the advantages for that lag with truncated importance
weights ρ_t = min(ρ̄, π_target/μ) and c_t = min(c̄, π_target/μ). The surrogate then clips
π_θ/π_target, a ratio to a policy the learner holds still, so several epochs on one batch stay
in a trust region however stale the batch was. The target network is a copy of the actor
(normaliser included) refreshed every `target_update_interval` updates. Time-outs are
bootstrapped as in PPO, and the batch is folded into the normalisers after the epochs. The
learning rate is fixed, or optionally follows PPO's KL schedule (on the KL from the target).
Advantages are divided by their standard deviation but not shifted: the actions were drawn
from μ, so subtracting a mean would bias the gradient back towards the behaviour policy.
"""

from __future__ import annotations

import copy

import torch
from torch.distributions import Normal, kl_divergence

from hetlab.algos.configs import APPOConfig
from hetlab.algos.networks import Critic, GaussianActor, build_actor_critic
from hetlab.algos.ppo import (
    apply_gradients,
    bootstrap_time_outs,
    clipped_surrogate_loss,
    kl_adapted_learning_rate,
    minibatch_indices,
    set_learning_rate,
)
from hetlab.devices import OPTIMIZER_OPTIONS


class APPO:
    name = "appo"
    off_policy = False  # fed rollouts by the on-policy loop (hetlab.train.on_policy)
    default_mode = "async"  # collectors run ahead; V-trace corrects for the policy lag
    Config = APPOConfig
    # On a CPU learner, for the options left at their defaults: PPO's (hetlab.algos.ppo.PPO.cpu_defaults).
    cpu_defaults = {"envs": 512}

    def __init__(self, obs_sizes: dict[str, int], action_size: int, cfg: APPOConfig, device: torch.device,
                 seed: int = 0):
        self.cfg = cfg
        self.device = device
        self.actor: GaussianActor
        self.critic: Critic
        self.actor, self.critic = build_actor_critic(
            obs_sizes, action_size, cfg.actor_hidden, cfg.critic_hidden, cfg.init_noise_std, cfg.normalize_obs,
            device, seed,
        )
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.updates = 0
        self.learning_rate = cfg.learning_rate
        self.optimizer = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=cfg.learning_rate,
                                          **OPTIMIZER_OPTIONS)
        self.generator = torch.Generator().manual_seed(seed)

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One APPO iteration on a rollout (layout: hetlab.runtime.rollout_ring); returns metrics to log."""
        cfg = self.cfg
        policy_obs, critic_obs, actions = batch["policy_obs"], batch["critic_obs"], batch["actions"]
        dones = torch.maximum(batch["terminated"], batch["truncated"])

        with torch.no_grad():
            # 1. Values of every state, row T included, and the time-out bootstrap, as in PPO.
            values = self.critic(critic_obs)
            rewards = bootstrap_time_outs(
                batch["rewards"], batch["truncated"], batch["final_critic_obs"], self.critic, cfg.gamma
            )
            # 2. V-trace with the target policy against the behaviour policy.
            target = self.target_actor.distribution(policy_obs[:-1])
            target_log_probs = target.log_prob(actions).sum(-1)
            log_rhos = target_log_probs - batch["log_probs"]
            vtrace_targets, advantages = vtrace(rewards, values, dones, log_rhos, cfg.gamma, cfg.rho_bar, cfg.c_bar)
            if cfg.normalize_advantages:
                # Scaled only: the actions come from μ, not π_target, so a shifted advantage
                # would add a steady pull of the policy back towards the stale behaviour policy.
                advantages = advantages / (advantages.std() + 1e-8)
            importance_weights = log_rhos.exp()

        samples = {
            "policy_obs": policy_obs[:-1], "critic_obs": critic_obs[:-1], "actions": actions,
            "target_log_probs": target_log_probs, "vtrace_targets": vtrace_targets, "advantages": advantages,
            "target_mean": target.loc, "target_std": target.scale,
        }
        samples = {key: value.flatten(0, 1) for key, value in samples.items()}
        num_samples = samples["actions"].shape[0]
        totals = dict.fromkeys(("value_loss", "surrogate_loss", "entropy", "kl", "clip_fraction"), 0.0)

        # 3. Epochs × minibatches: clipped surrogate on π_θ/π_target, value regression to V-trace.
        minibatches = minibatch_indices(num_samples, cfg.num_mini_batches, self.generator, self.device)
        for _ in range(cfg.num_learning_epochs):
            for index in minibatches:
                mb = {key: value[index] for key, value in samples.items()}
                dist = self.actor.distribution(mb["policy_obs"])
                entropy = dist.entropy().sum(-1).mean()
                # As PPO: the learning rate follows the KL from the policy the ratio is clipped to.
                with torch.no_grad():
                    kl = kl_divergence(Normal(mb["target_mean"], mb["target_std"]), dist).sum(-1).mean()
                if cfg.desired_kl is not None:
                    self.learning_rate = kl_adapted_learning_rate(self.learning_rate, kl.item(), cfg)
                    set_learning_rate(self.optimizer, self.learning_rate)
                ratio = (dist.log_prob(mb["actions"]).sum(-1) - mb["target_log_probs"]).exp()
                surrogate_loss = clipped_surrogate_loss(ratio, mb["advantages"], cfg.clip_param)
                value_loss = (self.critic(mb["critic_obs"]) - mb["vtrace_targets"]).square().mean()

                loss = surrogate_loss + cfg.value_loss_coef * value_loss - cfg.entropy_coef * entropy
                apply_gradients(self.optimizer, loss, (self.actor, self.critic), cfg.max_grad_norm)

                totals["value_loss"] += value_loss.detach()
                totals["surrogate_loss"] += surrogate_loss.detach()
                totals["entropy"] += entropy.detach()
                totals["kl"] += kl
                totals["clip_fraction"] += ((ratio - 1).abs() > cfg.clip_param).float().mean()

        # 4. Fold the batch into the normalisers, then refresh the target when due (it copies them too).
        self.actor.update_normalizer(policy_obs[:-1])
        self.critic.update_normalizer(critic_obs[:-1])
        self.updates += 1
        if self.updates % cfg.target_update_interval == 0:
            self.target_actor.load_state_dict(self.actor.state_dict())

        # 5. Metrics.
        steps = cfg.num_learning_epochs * len(minibatches)
        metrics = {key: float(total / steps) for key, total in totals.items()}
        metrics["learning_rate"] = self.learning_rate
        metrics["action_std_mean"] = float(self.actor.log_std.detach().exp().mean())
        metrics["importance_weight_mean"] = float(importance_weights.mean())  # π_target/μ before truncation
        metrics["importance_weight_clip_fraction"] = float((importance_weights > cfg.rho_bar).float().mean())
        return metrics

    def state_dict(self) -> dict:
        """A snapshot (not live tensors) of everything an exact resume needs."""
        return copy.deepcopy({
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target_actor": self.target_actor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "learning_rate": self.learning_rate,
            "generator": self.generator.get_state(),
        })

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_actor.load_state_dict(state["target_actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        self.learning_rate = float(state["learning_rate"])
        self.generator.set_state(state["generator"].cpu())


def vtrace(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, log_rhos: torch.Tensor,
           gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets v_t and policy-gradient advantages, both (T, N) (Espeholt et al. 2018, §4).

    rewards, dones and log_rhos = log π_target(a_t|x_t) − log μ(a_t|x_t) are (T, N); values
    (T+1, N). With γ_t = γ(1 − done_t):
        δ_t = ρ_t (r_t + γ_t V(x_{t+1}) − V(x_t))
        v_t = V(x_t) + δ_t + γ_t c_t (v_{t+1} − V(x_{t+1})),   v_T = V(x_T)
        advantage_t = ρ_t (r_t + γ_t v_{t+1} − V(x_t))
    On-policy (ρ_t = c_t = 1) v_t is the n-step return bootstrapped from V(x_T), i.e. GAE(λ=1) + V.
    """
    weights = log_rhos.exp()
    rhos = weights.clamp(max=rho_bar)
    cs = weights.clamp(max=c_bar)
    discounts = gamma * (1.0 - dones)
    deltas = rhos * (rewards + discounts * values[1:] - values[:-1])
    targets = values.clone()  # row T stays V(x_T)
    correction = torch.zeros_like(values[0])  # v_{t+1} − V(x_{t+1})
    for t in reversed(range(rewards.shape[0])):
        correction = deltas[t] + discounts[t] * cs[t] * correction
        targets[t] = values[t] + correction
    advantages = rhos * (rewards + discounts * targets[1:] - values[:-1])
    return targets[:-1], advantages
