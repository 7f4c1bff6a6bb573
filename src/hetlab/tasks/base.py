"""The Task contract: an MDP over a whole BatchSim at once, in vectorised numpy.

A task turns actions into controls, steps the physics with decimation, and returns
observation groups (`policy`, and `critic` with privileged extras), a reward that is a
weighted sum of named terms, and separate `terminated` (a real end) and `truncated`
(time-out) flags. Finished envs are reset inside `step`; their last observation is kept
in `info["final_obs"]` so a learner can bootstrap from it on time-outs. Every call returns
fresh arrays: keeping last step's observations needs no copy.

A task declares its observation groups as named terms (`observations`, see observations.py: the
sizes and the policy's noise follow from it) and computes them in `_observation_terms`; it declares
its reward as named terms, each a function with its weight and parameters (`rewards`, see terms.py).
Subclasses implement `_control`, `_terminated` and `_observation_terms`; optional
hooks are `_update_state` (derive this step's quantities from physics, before rewards),
`_timed_out` (an episode's end by time, when that is more than the step count, e.g. a clip's end),
`_advance` (move per-env schedules on to the next step, after rewards), `_reset_envs`
(their own start-state randomisation) and `_episode_metrics` (what a finished episode scored
besides its return, e.g. goals reached, reported in `info["episode_metrics"]`). A task names the
unweighted reward terms whose per-step mean over an episode is one of its metrics in
`tracked_terms`, and what "solved" means for it in `solved` (see criteria.py). A left-right
symmetric task declares its mirrors (symmetry.py): each observation term's and `action_mirror`. A task whose
config has a penalty curriculum (curriculum.py) sets `curriculum`, which scales the weights of
its penalty terms and is part of its state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import mujoco
import numpy as np

from hetlab.sim.contract import BatchSim
from hetlab.tasks.criteria import Criterion
from hetlab.tasks.curriculum import PenaltyCurriculum
from hetlab.tasks.terms import RewardTerm
from hetlab.tasks.observations import Observations
from hetlab.tasks.symmetry import Mirror, TaskMirror

Obs = dict[str, np.ndarray]
Index = slice | np.ndarray  # all envs (slice(None)) or an array of env ids


@dataclass(frozen=True)
class TaskConfig:
    """Options every task has; task configs subclass this and add their own."""

    num_envs: int = 256
    sim: str = "mujoco"  # physics backend (hetlab.sim.SIMS)
    threads: int = 0  # physics threads; 0 = every core
    seed: int = 0
    obs_noise: float = 1.0  # multiplies the task's observation-noise scales; 0 = exact observations
    randomise: bool = True  # domain randomisation on reset
    reset_noise: float = 0.0  # uniform ± noise on joint positions/velocities at reset
    sim_dt: float = 0.0  # physics step in seconds, dividing the control step; 0 = the task's own
    reward_weights: dict[str, float] = field(default_factory=dict)  # reward terms' weights over the task's own
    reward_params: dict[str, float] = field(default_factory=dict)  # "term.parameter": value, over the task's own


class Task(ABC):
    """Base class; see the module docstring for the contract."""

    name: ClassVar[str]
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    control_dt: ClassVar[float]  # seconds per env step
    episode_seconds: ClassVar[float]
    keyframe: ClassVar[str | None] = None  # the state envs reset to
    observations: ClassVar[Observations]  # the policy's terms and the critic's privileged ones
    obs_sizes: ClassVar[dict[str, int]]  # per observation group, from `observations`
    action_size: int
    action_mirror: ClassVar[Mirror | None] = None  # its actions in a mirror (symmetry.py); None: not symmetric
    rewards: ClassVar[dict[str, RewardTerm]]  # the reward's terms by name
    reward_scale: float = 1.0  # multiplies the weighted sum (e.g. by dt, as MuJoCo Playground does)
    reward_floor: float | None = None  # the scaled reward is clipped from below to this, if set
    # Reward terms whose unweighted per-step mean over an episode is an episode metric of that name.
    tracked_terms: ClassVar[tuple[str, ...]] = ()
    solved: ClassVar[tuple[Criterion, ...]] = ()  # what a deterministic evaluation must pass; () = undefined
    # Per-env arrays that, with the sim's state and the generator, make up the task's state;
    # subclasses extend the tuple with their own (dotted names reach into members).
    state_arrays: ClassVar[tuple[str, ...]] = ("episode_step", "episode_return", "last_actions", "tracked_sums")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "observations" in cls.__dict__:
            cls.obs_sizes = cls.observations.sizes
            cls._policy_noise = cls.observations.policy_noise

    @classmethod
    def mirror(cls) -> TaskMirror | None:
        """How the task's observations and actions look in a mirror; None where it is not left-right symmetric."""
        obs = cls.observations.mirrors
        return None if obs is None or cls.action_mirror is None else TaskMirror(obs, cls.action_mirror)

    @classmethod
    @abstractmethod
    def build_spec(cls, cfg: TaskConfig) -> mujoco.MjSpec:
        """The task's scene as an MjSpec: physics backends compile it or read it as MJCF."""

    @classmethod
    def physics_spec(cls, cfg: TaskConfig) -> mujoco.MjSpec:
        """`build_spec` at the config's physics step (`sim_dt`), what every backend is given."""
        spec = cls.build_spec(cfg)
        if cfg.sim_dt:
            spec.option.timestep = cfg.sim_dt
        return spec

    @classmethod
    def build_model(cls, cfg: TaskConfig) -> mujoco.MjModel:
        """The task's scene, compiled by MuJoCo."""
        return cls.physics_spec(cfg).compile()

    @classmethod
    def check_assets(cls, cfg: TaskConfig) -> None:
        """UserError naming what to install when files the scene needs are missing; cheap (no
        model is built), so commands call it before they start anything. Built-in scenes need none."""

    def __init__(self, sim: BatchSim, cfg: TaskConfig):
        self.sim = sim
        self.cfg = cfg
        self.num_envs = sim.num_envs
        self.substeps = max(1, round(self.control_dt / sim.timestep))
        self.dt = self.substeps * sim.timestep
        self.max_episode_steps = round(self.episode_seconds / self.dt)
        # Separate from the sim's generator, so task randomness never shifts the physics'.
        self.rng = np.random.default_rng([cfg.seed, 1])
        n = self.num_envs
        self.episode_step = np.zeros(n, np.int64)
        self.episode_return = np.zeros(n, np.float64)
        self.last_actions = np.zeros((n, self.action_size), np.float32)
        self.actions = self.last_actions  # this step's, once stepped
        self.reward_weights = {name: term.weight for name, term in self.rewards.items()} | cfg.reward_weights
        self.reward_params = {name: dict(term.params) for name, term in self.rewards.items()}
        for key, value in cfg.reward_params.items():
            name, parameter = key.split(".")
            self.reward_params[name][parameter] = value
        self.tracked_sums = np.zeros((n, len(self.tracked_terms)), np.float64)
        self.curriculum: PenaltyCurriculum | None = None
        self._obs: Obs | None = None

    # -- the contract -------------------------------------------------------------------------

    def reset(self) -> Obs:
        """Reset every env; returns the first observation groups."""
        self._reset(np.arange(self.num_envs))
        self._obs = self._observe(slice(None))
        return self._obs

    def step(self, actions: np.ndarray) -> tuple[Obs, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Advance every env one control step. Returns obs, reward, terminated, truncated, info."""
        if self._obs is None:
            raise RuntimeError("call reset() before step()")
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != self.last_actions.shape:
            raise ValueError(f"actions must have shape {self.last_actions.shape}, got {actions.shape}")
        # Every task acts in [-1, 1]: a Gaussian policy's samples beyond it are clipped, here,
        # so controls, rewards and the last-action observation all see the same action.
        actions = np.clip(actions, -1.0, 1.0)
        diverged = self.sim.step(self._control(actions), self.substeps)
        self.episode_step += 1
        self.actions = actions
        self._update_state(actions)

        terms = {name: term.function(self, **self.reward_params[name]) for name, term in self.rewards.items()}
        reward = np.zeros(self.num_envs, np.float64)
        term_means = {}
        penalty_scale = float(self.curriculum.scale) if self.curriculum is not None else 1.0
        for name, value in terms.items():
            weight = self.reward_weights[name] * self.reward_scale
            weighted = (weight * penalty_scale if self.rewards[name].penalty else weight) * value
            reward += weighted
            term_means[name] = float(weighted.mean())
        for column, name in enumerate(self.tracked_terms):
            # "Solved" is judged on the task's own kernels, whatever a run's reward_params make of them.
            own = self.rewards[name].params
            self.tracked_sums[:, column] += (terms[name] if self.reward_params[name] == own
                                             else self.rewards[name].function(self, **own))
        if self.reward_floor is not None:
            np.maximum(reward, self.reward_floor, out=reward)
        reward = reward.astype(np.float32)

        terminated = self._terminated() | diverged
        truncated = self._timed_out() & ~terminated
        self.last_actions[:] = actions
        self._advance()
        self.episode_return += reward
        obs = self._observe(slice(None))
        info: dict[str, Any] = {"reward_terms": term_means, "diverged": int(diverged.sum())}

        done = terminated | truncated
        if done.any():
            ids = np.flatnonzero(done)
            info["done_ids"] = ids
            info["final_obs"] = {group: values[ids] for group, values in obs.items()}
            info["episode_return"] = self.episode_return[ids].copy()
            info["episode_length"] = self.episode_step[ids].copy()
            tracked = self.tracked_sums[ids] / np.maximum(self.episode_step[ids], 1)[:, None]
            info["episode_metrics"] = {**{name: tracked[:, column] for column, name in enumerate(self.tracked_terms)},
                                       **self._episode_metrics(ids)}
            if self.curriculum is not None:  # the scale the episode ended at, logged as episode/penalty_scale
                info["episode_metrics"]["penalty_scale"] = np.full(len(ids), penalty_scale)
                self.curriculum.episodes_ended(self.episode_step[ids])
            self._reset(ids)
            for group, values in self._observe(ids).items():
                obs[group][ids] = values
        self._obs = obs
        return obs, reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the task's future, for an exact resume: per-env arrays, the
        current observations, the generator and the physics state."""
        if self._obs is None:
            raise RuntimeError("call reset() before state_dict()")
        return {
            "arrays": {name: self._resolve(name).copy() for name in self._state_names()},
            "obs": {group: values.copy() for group, values in self._obs.items()},
            "rng": self.rng.bit_generator.state,
            "sim": self.sim.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> Obs:
        """Restore a `state_dict()` of a task built with the same config; returns the current obs."""
        for name, values in state["arrays"].items():
            self._resolve(name)[...] = values
        self.rng.bit_generator.state = state["rng"]
        self.sim.set_state(state["sim"])
        self._obs = {group: values.copy() for group, values in state["obs"].items()}
        return self._obs

    def _state_names(self) -> tuple[str, ...]:
        return self.state_arrays + (("curriculum.scale", "curriculum.mean_length") if self.curriculum else ())

    def _resolve(self, dotted: str) -> np.ndarray:
        owner = self
        for part in dotted.split("."):
            owner = getattr(owner, part)
        return owner

    # -- shared machinery ---------------------------------------------------------------------

    def _reset(self, ids: np.ndarray) -> None:
        self.sim.reset(ids, noise=self.cfg.reset_noise)
        self.episode_step[ids] = 0
        self.episode_return[ids] = 0.0
        self.last_actions[ids] = 0.0
        self.tracked_sums[ids] = 0.0
        self._reset_envs(ids)
        self.sim.forward(ids)  # sensors and body poses of the new start states

    def _observe(self, ids: Index) -> Obs:
        """Observation groups for the envs `ids`, float32: the critic's exact, the policy's its first
        columns with noise."""
        envs = self.num_envs if isinstance(ids, slice) else len(ids)
        critic = self.observations.critic(self._observation_terms(ids), envs)
        return {"policy": self._add_noise(critic[:, :self.obs_sizes["policy"]], self._policy_noise), "critic": critic}

    def _add_noise(self, exact: np.ndarray, scales: np.ndarray | float) -> np.ndarray:
        """A noisy copy of `exact`: uniform ±`scales` per column, times the config's level."""
        if self.cfg.obs_noise == 0.0:
            return exact.copy()
        scale = np.float32(2.0 * self.cfg.obs_noise) * np.asarray(scales, np.float32)
        noise = self.rng.random(exact.shape, dtype=np.float32) - np.float32(0.5)
        return exact + noise * scale

    # -- hooks for subclasses -----------------------------------------------------------------

    @abstractmethod
    def _control(self, actions: np.ndarray) -> np.ndarray:
        """Map policy actions to the sim's ctrl (e.g. PD position targets)."""

    def _update_state(self, actions: np.ndarray) -> None:
        """Derive this step's quantities from the new physics state, before rewards."""

    def _advance(self) -> None:
        """Move per-env schedules (commands, timers) on to the next step, after rewards."""

    @abstractmethod
    def _terminated(self) -> np.ndarray:
        """(num_envs,) bool: the episode ended for a reason other than time."""

    @abstractmethod
    def _observation_terms(self, ids: Index) -> dict[str, np.ndarray]:
        """Each term of `observations` for the envs `ids`: (envs, its size)."""

    def _timed_out(self) -> np.ndarray:
        """(num_envs,) bool: the episode ran out of time (a truncation, not a failure)."""
        return self.episode_step >= self.max_episode_steps

    def _reset_envs(self, ids: np.ndarray) -> None:
        """Task-specific start-state randomisation after the sim reset `ids` (before the
        forward pass that refreshes their sensors); optional."""

    def _episode_metrics(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Per-episode values of the envs `ids`, whose episodes just ended (before their reset):
        name → (len(ids),) array; none by default."""
        return {}
