"""Proximal Policy Optimization, as rsl_rl implements it.

Source: rsl_rl (github.com/leggedrobotics/rsl_rl, `rsl_rl/algorithms/ppo.py` and
`rsl_rl/storage/rollout_storage.py`; Rudin et al. 2021, "Learning to Walk in Minutes Using
Massively Parallel Deep Reinforcement Learning"), which implements PPO (Schulman et al. 2017,
arXiv:1707.06347) with GAE (Schulman et al. 2016, arXiv:1506.02438). Kept from rsl_rl: its
defaults, the clipped surrogate and clipped value loss, advantages normalised over the whole
batch, the entropy bonus, the learning rate adapted to the KL after every minibatch, one
shuffle of the batch reused by every epoch, and gradient norms clipped per network.

What differs, because here the learner gets a finished rollout instead of stepping the envs:
- the values and the starting policy's mean and std are computed at the start of `update`
  (the behaviour policy's log-probs still come from the collector);
- a time-out is bootstrapped from the value of the episode's final observation, which the task
  keeps, where rsl_rl uses the value of the observation before the last step;
- the observation normalisers fold in the batch after the epochs, not at every env step, so the
  epochs run with the normaliser the collectors used;
- the KL is the exact Gaussian KL, and the minibatches leave out a random remainder of the
  batch (rsl_rl always leaves out the same last samples);
- with `symmetry` (rsl_rl's symmetry extension, Mittal et al. 2024, arXiv:2403.04359), each
  mirror-image sample takes its value and KL anchor from the starting critic and policy on the
  mirrored observation, where rsl_rl reuses the original's value and measures the KL on the
  originals only; the normalisers fold in both samples, so they stay symmetric.

`bootstrap_time_outs`, `gae`, `minibatch_indices`, `kl_adapted_learning_rate`,
`clipped_surrogate_loss` and `apply_gradients` at the end of the file are the pieces APPO shares.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributions import Normal, kl_divergence

from hetlab.algos.configs import PPOConfig
from hetlab.algos.networks import Critic, GaussianActor, build_actor_critic
from hetlab.devices import OPTIMIZER_OPTIONS, mixed_precision
from hetlab.errors import UserError

if TYPE_CHECKING:
    from hetlab.tasks.symmetry import TaskMirror


class PPO:
    name = "ppo"
    off_policy = False  # fed rollouts by the on-policy loop (hetlab.train.on_policy)
    default_mode = "sync"  # collect → learn → collect: every rollout from the newest weights
    Config = PPOConfig
    # On a CPU learner, for the options left at their defaults (hetlab.train.device_defaults): 512 envs,
    # as `make run` trains Go1 on a 2-core CPU. The learner's epochs over envs × horizon samples are the
    # bottleneck there, so an iteration takes half as long. rsl_rl's networks stay: with make run's
    # 256-128-64 ones APPO (fixed learning rate; PPO's adapts to the KL) turned its weights to NaN on
    # cartpole after ~100 iterations, and PPO learns cartpole within 150 s without them.
    cpu_defaults = {"envs": 512}

    def __init__(self, obs_sizes: dict[str, int], action_size: int, cfg: PPOConfig, device: torch.device,
                 seed: int = 0, mirror: TaskMirror | None = None):
        self.cfg = cfg
        self.device = device
        if cfg.symmetry and mirror is None:
            raise ValueError("PPO with symmetry needs the task's mirror")
        # The mirrors of the observation groups and of the actions, as (column index, sign) on the device.
        self.mirrors = {name: (torch.tensor(m.index, device=device), torch.tensor(m.sign, device=device))
                        for name, m in ({**mirror.obs, "actions": mirror.action} if cfg.symmetry else {}).items()}
        self.actor: GaussianActor
        self.critic: Critic
        self.actor, self.critic = build_actor_critic(
            obs_sizes, action_size, cfg.actor_hidden, cfg.critic_hidden, cfg.init_noise_std, cfg.normalize_obs,
            device, seed,
        )
        self.learning_rate = cfg.learning_rate
        self.optimizer = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=cfg.learning_rate,
                                          **OPTIMIZER_OPTIONS)
        # On the CPU whatever the device: a checkpoint then shuffles the same way wherever it resumes.
        self.generator = torch.Generator().manual_seed(seed)
        # With --ppo.compile, inductor fuses each minibatch's forward passes and losses (and their backward).
        self.minibatch_losses = torch.compile(self._minibatch_losses) if cfg.compile else self._minibatch_losses

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One PPO iteration on a rollout (layout: hetlab.runtime.rollout_ring); returns metrics to log."""
        cfg = self.cfg
        policy_obs, critic_obs, actions = batch["policy_obs"], batch["critic_obs"], batch["actions"]
        dones = torch.maximum(batch["terminated"], batch["truncated"])

        with torch.no_grad():
            # 1. The value of every state, row T included: it bootstraps rollouts cut off mid-episode.
            values = self.critic(critic_obs)
            # 2. A time-out is not a real end: its last reward gets the discounted value of where it stopped.
            rewards = bootstrap_time_outs(
                batch["rewards"], batch["truncated"], batch["final_critic_obs"], self.critic, cfg.gamma
            )
            # 3. GAE; the returns are the value targets.
            advantages = gae(rewards, values, dones, cfg.gamma, cfg.lam)
            returns = advantages + values[:-1]
            # 4. Advantages normalised over the whole batch.
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
            # The policy the epochs start from: its mean and std anchor the KL. Its ratio to the
            # behaviour policy is 1 in sync mode and measures the policy lag in async mode.
            start = self.actor.distribution(policy_obs[:-1])
            start_ratio = (start.log_prob(actions).sum(-1) - batch["log_probs"]).exp()

        samples = {
            "policy_obs": policy_obs[:-1], "critic_obs": critic_obs[:-1], "actions": actions,
            "log_probs": batch["log_probs"], "values": values[:-1], "returns": returns, "advantages": advantages,
            "start_mean": start.loc, "start_std": start.scale,
        }
        samples = {key: value.flatten(0, 1) for key, value in samples.items()}
        num_samples = samples["actions"].shape[0]
        totals = dict.fromkeys(("value_loss", "surrogate_loss", "entropy", "kl", "clip_fraction"), 0.0)

        # 5. Epochs × minibatches, one shuffle for all epochs.
        minibatches = minibatch_indices(num_samples, cfg.num_mini_batches, self.generator, self.device)
        if self.mirrors:  # the mirror images follow the samples; each minibatch holds its samples' (row + num_samples)
            samples, symmetry_gap = self._with_mirror_images(samples)
            minibatches = tuple(torch.cat([index, index + num_samples]) for index in minibatches)
        for _ in range(cfg.num_learning_epochs):
            for index in minibatches:
                losses = self.minibatch_losses({key: value[index] for key, value in samples.items()})
                # KL-adaptive learning rate, set before this minibatch's step.
                if cfg.desired_kl is not None:
                    self.learning_rate = kl_adapted_learning_rate(self.learning_rate, losses["kl"].item(), cfg)
                    set_learning_rate(self.optimizer, self.learning_rate)
                apply_gradients(self.optimizer, losses["loss"], (self.actor, self.critic), cfg.max_grad_norm)
                for key in totals:
                    totals[key] += losses[key].detach()

        # 6. Only now fold the batch (and its mirror image) into the normalisers, for the next rollouts and update.
        self.actor.update_normalizer(samples["policy_obs"])
        self.critic.update_normalizer(samples["critic_obs"])

        # 7. Metrics.
        steps = cfg.num_learning_epochs * len(minibatches)
        metrics = {key: float(total / steps) for key, total in totals.items()}
        metrics["learning_rate"] = self.learning_rate
        metrics["action_std_mean"] = float(self.actor.log_std.detach().exp().mean())
        metrics["start_ratio_max_deviation"] = float((start_ratio - 1).abs().max())
        if self.mirrors:
            metrics["symmetry_gap"] = symmetry_gap
        return metrics

    def _mirror(self, group: str, x: torch.Tensor) -> torch.Tensor:
        index, sign = self.mirrors[group]
        return x[..., index] * sign

    @torch.no_grad()
    def _with_mirror_images(self, samples: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
        """The samples followed by their mirror images. A mirror image keeps its original's advantage and
        return (the task is the same in a mirror) and behaviour log-prob: the mirrored behaviour policy
        drew the mirrored action with the same probability, and that, not the starting policy's on the
        mirrored observation, weighs it (with the latter the policy drifted from symmetric on cartpole).
        Its value and KL anchor are the starting critic's and policy's on the mirrored observation. Also
        the mean distance between the policy's mean action on a mirrored observation and its mirrored
        mean action: how far the policy is from being symmetric."""
        policy_obs, critic_obs = self._mirror("policy", samples["policy_obs"]), self._mirror("critic", samples["critic_obs"])
        actions = self._mirror("actions", samples["actions"])
        start = self.actor.distribution(policy_obs)
        mirrored = {"policy_obs": policy_obs, "critic_obs": critic_obs, "actions": actions,
                    "log_probs": samples["log_probs"], "values": self.critic(critic_obs),
                    "returns": samples["returns"], "advantages": samples["advantages"],
                    "start_mean": start.loc, "start_std": start.scale}
        gap = (start.loc - self._mirror("actions", samples["start_mean"])).abs().mean()
        return {key: torch.cat([samples[key], mirrored[key]]) for key in samples}, float(gap)

    def _minibatch_losses(self, mb: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The epochs' forward passes and losses on one minibatch, and the KL from the starting policy."""
        cfg = self.cfg
        with mixed_precision(self.device, cfg.bf16):
            dist = self.actor.distribution(mb["policy_obs"])
            values_now = self.critic(mb["critic_obs"])
        log_probs = dist.log_prob(mb["actions"]).sum(-1)
        entropy = dist.entropy().sum(-1).mean()
        with torch.no_grad():
            kl = kl_divergence(Normal(mb["start_mean"], mb["start_std"]), dist).sum(-1).mean()

        ratio = (log_probs - mb["log_probs"]).exp()
        surrogate_loss = clipped_surrogate_loss(ratio, mb["advantages"], cfg.clip_param)

        if cfg.use_clipped_value_loss:
            # The value may move at most clip_param from the one the returns were computed with.
            clipped = mb["values"] + (values_now - mb["values"]).clamp(-cfg.clip_param, cfg.clip_param)
            value_loss = torch.maximum(
                (values_now - mb["returns"]).square(), (clipped - mb["returns"]).square()
            ).mean()
        else:
            value_loss = (values_now - mb["returns"]).square().mean()

        return {"loss": surrogate_loss + cfg.value_loss_coef * value_loss - cfg.entropy_coef * entropy,
                "value_loss": value_loss, "surrogate_loss": surrogate_loss, "entropy": entropy, "kl": kl,
                "clip_fraction": ((ratio - 1).abs() > cfg.clip_param).float().mean()}

    def state_dict(self) -> dict:
        """A snapshot (not live tensors) of everything an exact resume needs."""
        return copy.deepcopy({
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "learning_rate": self.learning_rate,
            "generator": self.generator.get_state(),
        })

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.learning_rate = float(state["learning_rate"])
        self.generator.set_state(state["generator"].cpu())


# -- pieces APPO shares ---------------------------------------------------------------------------


def bootstrap_time_outs(rewards: torch.Tensor, truncated: torch.Tensor, final_critic_obs: torch.Tensor,
                        critic: Critic, gamma: float) -> torch.Tensor:
    """`rewards` + γ·V(final obs) where the episode timed out at that step, (T, N).

    The value is computed for every row (zeros where nothing timed out) and masked, which
    costs one critic pass but no device sync to find the time-outs.
    """
    return rewards + gamma * truncated * critic(final_critic_obs)


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates (T, N) from rewards (T, N), values (T+1, N) and dones (T, N).

    A done at step t stops both the bootstrap from V(s_{t+1}) and the trace: obs t+1 already
    belongs to the next episode.
    """
    advantages = torch.empty_like(rewards)
    next_advantage = torch.zeros_like(values[0])
    not_done = 1.0 - dones
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * not_done[t] * values[t + 1] - values[t]
        next_advantage = delta + gamma * lam * not_done[t] * next_advantage
        advantages[t] = next_advantage
    return advantages


def minibatch_indices(num_samples: int, num_mini_batches: int, generator: torch.Generator,
                      device: torch.device) -> tuple[torch.Tensor, ...]:
    """A random split of the samples into equal minibatches; a remainder is left out."""
    size = num_samples // num_mini_batches
    if size == 0:
        raise UserError(
            f"a batch of {num_samples} samples cannot be split into {num_mini_batches} minibatches; "
            "use more envs or a longer horizon, or fewer minibatches"
        )
    order = torch.randperm(num_samples, generator=generator)[: size * num_mini_batches]
    return order.to(device).view(num_mini_batches, size).unbind(0)


def kl_adapted_learning_rate(learning_rate: float, kl: float, cfg) -> float:
    """rsl_rl's schedule: ÷1.5 when the KL overshoots twice the target, ×1.5 below half of it."""
    if kl > 2.0 * cfg.desired_kl:
        return max(cfg.min_learning_rate, learning_rate / 1.5)
    if kl < 0.5 * cfg.desired_kl:
        return min(cfg.max_learning_rate, learning_rate * 1.5)
    return learning_rate


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def clipped_surrogate_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """PPO's pessimistic policy loss: the worse of the plain and the clipped ratio."""
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()


def apply_gradients(optimizer: torch.optim.Optimizer, loss: torch.Tensor, nets: tuple[nn.Module, ...],
                    max_grad_norm: float) -> None:
    """Backpropagate, clip each network's gradient norm separately, step."""
    optimizer.zero_grad()
    loss.backward()
    for net in nets:
        nn.utils.clip_grad_norm_(net.parameters(), max_grad_norm)
    optimizer.step()
