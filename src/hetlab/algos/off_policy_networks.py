"""What SAC, TD3, FastSAC and FlashSAC share: actors, Q ensembles, the C51 projection, target updates.

Every network normalises its own observations (`EmpiricalNormalization`, as the on-policy
networks do), so an actor's `state_dict()` is all a collector needs to act as the learner would:
`forward(obs)` is the deterministic policy (what ONNX export traces) and `explore(obs, generator)`
the behaviour policy, both with actions in [-1, 1]. Networks are built on the CPU from a private
copy of its random state (`build_on_cpu`), so a seed gives the same weights on every device.

The algorithms draw their own noise from a CPU `torch.Generator` (`standard_normal`) whatever
the learner device: its state is a small tensor in the checkpoint, so a resume is bit-exact.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from hetlab.algos.networks import EmpiricalNormalization


def build_on_cpu(seed: int, factory: Callable[[], tuple[nn.Module, ...]], device: torch.device) -> tuple[nn.Module, ...]:
    """`factory()`'s modules, initialised on the CPU from `seed` without touching the global RNG, then moved."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        modules = factory()
    return tuple(module.to(device) for module in modules)


def obs_normalizer(size: int, enabled: bool) -> nn.Module:
    return EmpiricalNormalization(size) if enabled else nn.Identity()


def fold_into_normalizer(normalizer: nn.Module, obs: torch.Tensor) -> None:
    if isinstance(normalizer, EmpiricalNormalization):
        normalizer.update(obs)


def hidden_layers(in_size: int, hidden: Sequence[int], activation: type[nn.Module], layer_norm: bool) -> nn.Sequential:
    """Linear layers of widths `hidden`, each followed by an optional LayerNorm and `activation`."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers.append(nn.Linear(in_size, width))
        if layer_norm:
            layers.append(nn.LayerNorm(width))
        layers.append(activation())
        in_size = width
    return nn.Sequential(*layers)


def squash_log_std(raw: torch.Tensor, log_std_min: float, log_std_max: float) -> torch.Tensor:
    """Maps a raw output smoothly into [min, max] with tanh (SpinUp / Yarats), so the std never explodes."""
    return log_std_min + 0.5 * (log_std_max - log_std_min) * (torch.tanh(raw) + 1.0)


def tanh_gaussian_sample(mean: torch.Tensor, log_std: torch.Tensor,
                         noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """tanh(mean + std·noise) and its log-density summed over action dims (change of variables).

    log(1 − tanh(u)²) is written as 2(log 2 − u − softplus(−2u)), exact and stable for large |u|.
    """
    pre_tanh = mean + log_std.exp() * noise
    gaussian_log_prob = -0.5 * noise.square() - log_std - 0.5 * math.log(2 * math.pi)
    log_det_jacobian = 2.0 * (math.log(2.0) - pre_tanh - F.softplus(-2.0 * pre_tanh))
    return torch.tanh(pre_tanh), (gaussian_log_prob - log_det_jacobian).sum(-1)


def standard_normal(shape: Sequence[int], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """N(0, 1) noise drawn from a CPU generator and moved to `device`."""
    return torch.randn(tuple(shape), generator=generator).to(device)


class TanhGaussianPolicy(nn.Module):
    """What every tanh-Gaussian actor shares, given its `mean_and_log_std(obs)` and `obs_normalizer`:
    the deterministic action tanh(mean), exploration samples, and the normaliser update."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action tanh(mean)."""
        return torch.tanh(self.mean_and_log_std(obs)[0])

    @torch.no_grad()
    def explore(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A sample of the policy; `generator` must live on `obs`'s device."""
        mean, log_std = self.mean_and_log_std(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return tanh_gaussian_sample(mean, log_std, noise)[0]

    def update_normalizer(self, obs: torch.Tensor) -> None:
        fold_into_normalizer(self.obs_normalizer, obs)


class TanhGaussianActor(TanhGaussianPolicy):
    """obs → normaliser → MLP → (mean, log std); actions tanh(mean + std·ε) (SAC, FastSAC).

    The log std comes from its own head, squashed into [log_std_min, log_std_max]. With
    `zero_init_heads` both heads start at zero (FastSAC), so the first policy is tanh(0) = 0 with
    the mid-range std.
    """

    def __init__(self, obs_size: int, action_size: int, hidden: Sequence[int], log_std_min: float,
                 log_std_max: float, normalize_obs: bool, activation: type[nn.Module] = nn.ReLU,
                 layer_norm: bool = False, zero_init_heads: bool = False):
        super().__init__()
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.obs_normalizer = obs_normalizer(obs_size, normalize_obs)
        self.trunk = hidden_layers(obs_size, hidden, activation, layer_norm)
        self.mean_head = nn.Linear(hidden[-1], action_size)
        self.log_std_head = nn.Linear(hidden[-1], action_size)
        if zero_init_heads:
            for head in (self.mean_head, self.log_std_head):
                nn.init.zeros_(head.weight)
                nn.init.zeros_(head.bias)

    def mean_and_log_std(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(self.obs_normalizer(obs))
        return self.mean_head(features), squash_log_std(self.log_std_head(features), self.log_std_min, self.log_std_max)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions for standard-normal `noise`, and their log-probabilities."""
        mean, log_std = self.mean_and_log_std(obs)
        return tanh_gaussian_sample(mean, log_std, noise)


class DeterministicActor(nn.Module):
    """obs → normaliser → MLP → tanh (TD3); explores with clipped Gaussian noise of std `exploration_noise`."""

    def __init__(self, obs_size: int, action_size: int, hidden: Sequence[int], exploration_noise: float,
                 normalize_obs: bool):
        super().__init__()
        self.exploration_noise = exploration_noise
        self.obs_normalizer = obs_normalizer(obs_size, normalize_obs)
        self.net = nn.Sequential(hidden_layers(obs_size, hidden, nn.ReLU, False), nn.Linear(hidden[-1], action_size))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(self.obs_normalizer(obs)))

    @torch.no_grad()
    def explore(self, obs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The deterministic action plus N(0, exploration_noise²), clipped to [-1, 1]."""
        actions = self(obs)
        noise = torch.randn(actions.shape, generator=generator, device=actions.device, dtype=actions.dtype)
        return (actions + self.exploration_noise * noise).clamp(-1.0, 1.0)

    def update_normalizer(self, obs: torch.Tensor) -> None:
        fold_into_normalizer(self.obs_normalizer, obs)


class QEnsemble(nn.Module):
    """`num_q` independent MLPs on (normalised critic obs, action), evaluated together: (num_q, ..., out_size).

    `out_size` is 1 for a scalar Q (SAC, TD3) or the number of atoms for C51 logits (FastSAC).
    The observation normaliser is shared by the members.
    """

    def __init__(self, obs_size: int, action_size: int, hidden: Sequence[int], out_size: int, num_q: int,
                 normalize_obs: bool, activation: type[nn.Module] = nn.ReLU, layer_norm: bool = False):
        super().__init__()
        self.obs_normalizer = obs_normalizer(obs_size, normalize_obs)
        self.members = nn.ModuleList(
            nn.Sequential(hidden_layers(obs_size + action_size, hidden, activation, layer_norm),
                          nn.Linear(hidden[-1], out_size))
            for _ in range(num_q)
        )

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.obs_normalizer(obs), actions], dim=-1)
        return torch.stack([member(x) for member in self.members])

    def first(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The first member only (TD3's actor follows Q1)."""
        return self.members[0](torch.cat([self.obs_normalizer(obs), actions], dim=-1))

    def update_normalizer(self, obs: torch.Tensor) -> None:
        fold_into_normalizer(self.obs_normalizer, obs)


def categorical_projection(next_probs: torch.Tensor, support: torch.Tensor, rewards: torch.Tensor,
                           bootstrap: torch.Tensor) -> torch.Tensor:
    """C51's projection of the distribution of `rewards + bootstrap·Z` back onto `support`.

    next_probs (..., B, N) are the probabilities of the atoms `support` (N,), evenly spaced;
    rewards and bootstrap are (B,). Each shifted atom is clamped into the support and its mass
    split between the two neighbouring atoms in proportion to the distance, so the mass is
    conserved; with bootstrap 0 it all lands on the atoms around the reward.
    """
    num_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    atom_gap = (v_max - v_min) / (num_atoms - 1)
    shifted = (rewards.unsqueeze(-1) + bootstrap.unsqueeze(-1) * support).clamp(v_min, v_max)  # (B, N)
    position = (shifted - v_min) / atom_gap
    # The lower neighbour stops one short of the last atom, so the upper one always exists;
    # at the last atom the whole mass goes to the upper one.
    lower = position.floor().clamp(max=num_atoms - 2)
    upper_weight = position - lower
    lower_index = lower.long().expand_as(next_probs)
    projected = torch.zeros_like(next_probs)
    projected.scatter_add_(-1, lower_index, next_probs * (1.0 - upper_weight))
    projected.scatter_add_(-1, lower_index + 1, next_probs * upper_weight)
    return projected


@torch.no_grad()
def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging target ← (1 − τ)·target + τ·source of the parameters.

    Buffers (observation statistics, BatchNorm running moments) are copied instead: a target
    must read its inputs exactly as its source does.
    """
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)
    for target_buffer, source_buffer in zip(target.buffers(), source.buffers()):
        target_buffer.copy_(source_buffer)


@contextlib.contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """No gradients into `module`'s parameters (the actor loss backpropagates through the critic to the actions only)."""
    module.requires_grad_(False)
    try:
        yield
    finally:
        module.requires_grad_(True)


def maybe_compile(fn: Callable, enabled: bool) -> Callable:
    """`torch.compile(fn)` when enabled. The compiled callable is kept by the algorithm, never set on a
    module, so a deep copy of the actor (a collector's copy, ONNX export) stays a plain module."""
    return torch.compile(fn) if enabled else fn


def gradient_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor, max_grad_norm: float = 0.0) -> None:
    """zero_grad → backward → optional global norm clip (0: none) → step."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if max_grad_norm > 0:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()


def plain_metrics(metrics: dict[str, torch.Tensor | float]) -> dict[str, float]:
    """Python floats, with one device sync for all the (scalar) tensors."""
    tensors = {key: value for key, value in metrics.items() if isinstance(value, torch.Tensor)}
    synced = dict(zip(tensors, torch.stack([v.detach().float() for v in tensors.values()]).tolist())) if tensors else {}
    return {key: float(synced.get(key, value)) for key, value in metrics.items()}


def snapshot(algo, names: Sequence[str]) -> dict:
    """A copy (not live tensors) of the named attributes of `algo`: modules and optimizers by
    their state_dict, tensors detached, generators by their state, numbers as they are."""
    state = {}
    for name in names:
        value = getattr(algo, name)
        if isinstance(value, torch.Generator):
            state[name] = value.get_state()
        elif isinstance(value, torch.Tensor):
            state[name] = value.detach()
        elif hasattr(value, "state_dict"):
            state[name] = value.state_dict()
        else:
            state[name] = value
    return copy.deepcopy(state)


def restore(algo, state: dict, names: Sequence[str]) -> None:
    """Load a `snapshot` back: learnable tensors in place (optimizers hold them), other tensors replaced."""
    for name in names:
        value = getattr(algo, name)
        if isinstance(value, torch.Generator):
            value.set_state(state[name].cpu())
        elif isinstance(value, torch.Tensor) and value.requires_grad:
            with torch.no_grad():
                value.copy_(state[name])
        elif isinstance(value, torch.Tensor):
            setattr(algo, name, state[name].to(value.device).clone())
        elif hasattr(value, "load_state_dict"):
            value.load_state_dict(state[name])
        else:
            setattr(algo, name, type(value)(state[name]))
