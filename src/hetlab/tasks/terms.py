"""Reward terms: how a task declares one, the forms several robots share, and the per-foot state
legged robots keep.

A task declares its reward as named `RewardTerm`s (`Task.rewards`): a function of the task that
returns the term's unweighted (num_envs,) value, its weight and its parameters, side by side.
The shared forms below are small functions of numpy arrays that the task's term functions call;
they follow MuJoCo Playground's locomotion tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RewardTerm:
    """One term of a task's reward: `function(task, **params)` is its unweighted (num_envs,) value,
    read from the task's state after the physics step (`task.actions` is the step's action,
    `task.last_actions` the one before). The reward adds up `weight` × value over the terms (the
    weight may be overridden per run: the task option `reward_weights`)."""

    function: Callable[..., np.ndarray]
    weight: float
    params: Mapping[str, Any] = field(default_factory=dict)
    penalty: bool = False  # weighed by the task's penalty curriculum, where its config has one


def alive(task) -> np.ndarray:
    """1 on every step an episode goes on."""
    return np.ones(task.num_envs)


def velocity_tracking(command: np.ndarray, velocity: np.ndarray, sigma: float) -> np.ndarray:
    """exp(−‖command − velocity‖² / σ) over the last axis: 1 when tracked exactly."""
    return np.exp(-np.square(command - velocity).sum(axis=1) / sigma)


def linear_tolerance(distance: np.ndarray, bound: float, margin: float, value_at_margin: float = 0.1) -> np.ndarray:
    """1 up to `bound`, then falling linearly: `value_at_margin` at `margin` past it, 0 further out
    (dm_control's `tolerance` with a linear sigmoid)."""
    beyond = np.maximum(distance - bound, 0.0) / margin
    return np.maximum(1.0 - (1.0 - value_at_margin) * beyond, 0.0)


def squared_norm(x: np.ndarray) -> np.ndarray:
    """‖x‖² over the last axis: e.g. roll/pitch rates, tilt (gravity's xy), action changes."""
    return np.square(x).sum(axis=1)


def joint_limit_violation(position: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """How far the joints are outside [low, high], summed."""
    return (np.clip(low - position, 0.0, None) + np.clip(position - high, 0.0, None)).sum(axis=1)


def pose_similarity(deviation: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """exp(−Σ w·Δq²): 1 in the default pose."""
    return np.exp(-(weights * np.square(deviation)).sum(axis=1))


def stand_still(deviation: np.ndarray, command_norm: np.ndarray, threshold: float = 0.01) -> np.ndarray:
    """Σ|Δq| while the command is (near) zero: moving away from the default pose for nothing."""
    return np.abs(deviation).sum(axis=1) * (command_norm < threshold)


def torque_magnitude(torques: np.ndarray) -> np.ndarray:
    """‖τ‖₂ + ‖τ‖₁."""
    return np.sqrt(np.square(torques).sum(axis=1)) + np.abs(torques).sum(axis=1)


def mechanical_power(joint_velocity: np.ndarray, torques: np.ndarray) -> np.ndarray:
    """Σ|q̇|·|τ|."""
    return (np.abs(joint_velocity) * np.abs(torques)).sum(axis=1)


def feet_clearance(feet_z: np.ndarray, feet_speed_xy2: np.ndarray, target_height: float) -> np.ndarray:
    """Σ |z − target| · |v_xy|^½ per foot: a moving foot should be at the swing height."""
    return (np.abs(feet_z - target_height) * np.sqrt(np.sqrt(feet_speed_xy2))).sum(axis=1)


class FeetState:
    """Contact, air time and swing height of each foot of `num_envs` legged robots.

    Per step: `update(feet_z, contact)` before the rewards, `advance()` after them. Contact is
    filtered over two steps (a foot that touched last step still counts), and a foot's first
    contact after a swing ends that swing: its air time and peak height are scored, then zeroed.
    """

    def __init__(self, num_envs: int, feet: int, dt: float):
        self.dt = dt
        self.air_time = np.zeros((num_envs, feet))
        self.swing_peak = np.zeros((num_envs, feet))
        self.last_contact = np.zeros((num_envs, feet), bool)
        self.contact = self.contact_filtered = self.first_contact = self.last_contact

    def update(self, feet_z: np.ndarray, contact: np.ndarray) -> None:
        self.contact = contact
        self.contact_filtered = contact | self.last_contact
        self.first_contact = (self.air_time > 0.0) & self.contact_filtered
        self.air_time += self.dt
        np.maximum(self.swing_peak, feet_z, out=self.swing_peak)

    def advance(self) -> None:
        swinging = ~self.contact_filtered
        self.air_time *= swinging
        self.swing_peak *= swinging
        self.last_contact = self.contact

    def reset(self, ids: np.ndarray) -> None:
        self.air_time[ids] = 0.0
        self.swing_peak[ids] = 0.0
        self.last_contact[ids] = False

    def air_time_reward(self, target: float, moving: np.ndarray) -> np.ndarray:
        """Σ (air time − target) over the feet that just landed, while commanded to move."""
        return ((self.air_time - target) * self.first_contact).sum(axis=1) * moving

    def landing_height_error(self, target_height: float) -> np.ndarray:
        """Σ (peak / target − 1)² over the feet that just landed."""
        return (np.square(self.swing_peak / target_height - 1.0) * self.first_contact).sum(axis=1)

    def slip(self, feet_speed_xy2: np.ndarray) -> np.ndarray:
        """Σ v_xy² over the feet in contact."""
        return (feet_speed_xy2 * self.contact).sum(axis=1)
