"""Per-env planar velocity commands (forward, lateral, yaw rate), resampled on a schedule."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class VelocityCommandConfig:
    lin_vel_x: tuple[float, float] = (-1.5, 1.5)  # m/s, body frame
    lin_vel_y: tuple[float, float] = (-0.8, 0.8)  # m/s
    yaw_rate: tuple[float, float] = (-1.2, 1.2)  # rad/s
    resample_seconds: float = 10.0
    stand_still_probability: float = 0.1  # share of commands that are exactly zero


class VelocityCommands:
    """(num_envs, 3) commands; new ones on reset and every `resample_seconds` of an episode."""

    def __init__(self, cfg: VelocityCommandConfig, num_envs: int, dt: float, rng: np.random.Generator):
        self.cfg = cfg
        self.rng = rng
        self.resample_steps = max(1, round(cfg.resample_seconds / dt))
        self._low = np.array([cfg.lin_vel_x[0], cfg.lin_vel_y[0], cfg.yaw_rate[0]])
        self._high = np.array([cfg.lin_vel_x[1], cfg.lin_vel_y[1], cfg.yaw_rate[1]])
        self.values = np.zeros((num_envs, 3), np.float32)

    def resample(self, ids: np.ndarray) -> None:
        new = self.rng.uniform(self._low, self._high, (len(ids), 3))
        new[self.rng.random(len(ids)) < self.cfg.stand_still_probability] = 0.0
        self.values[ids] = new

    def update(self, episode_step: np.ndarray) -> None:
        """Resample the envs whose episode just reached a multiple of the period."""
        due = np.flatnonzero(episode_step % self.resample_steps == 0)
        if due.size:
            self.resample(due)
