"""A penalty curriculum: a task's penalty terms weigh little while its episodes are short, and grow to
their full weight as the robot learns to stay up (after Holosoma's G1 locomotion recipe).

Early on a policy that cannot yet balance pays every penalty for each step it stays up, about as
much as falling costs, so falling at once scores no worse than standing. Scaling the penalties by
`scale` (from `initial_scale`) leaves staying up and tracking the command as what pays. After each
step on which episodes ended, their lengths move an average over about `window` episodes, and
`scale` shrinks by `rate` (relatively) while that average is below `shrink_below` of the episode's
steps, and grows by `rate` while it is above `grow_above`, within [min_scale, max_scale].

The curriculum is the task's: each collector's task keeps its own, from its own episodes, and it is
part of the task's state, so a run that checkpoints its collectors' tasks (sync on-policy training)
resumes it exactly; elsewhere (async, off-policy, a replaced collector) it starts over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetlab.errors import UserError


@dataclass(frozen=True)
class PenaltyCurriculumConfig:
    initial_scale: float = 0.1
    min_scale: float = 0.0
    max_scale: float = 1.0
    shrink_below: float = 0.15  # share of the episode's steps
    grow_above: float = 0.75
    rate: float = 0.00025  # relative change per step on which episodes ended
    window: int = 1000  # episodes the average length spans

    def __post_init__(self):
        if not 0 <= self.min_scale <= self.initial_scale <= self.max_scale:
            raise UserError(f"penalty curriculum: needs 0 ≤ min_scale ≤ initial_scale ≤ max_scale, got "
                            f"{self.min_scale}, {self.initial_scale}, {self.max_scale}")
        if not 0 <= self.shrink_below <= self.grow_above <= 1:
            raise UserError(f"penalty curriculum: needs 0 ≤ shrink_below ≤ grow_above ≤ 1 (shares of an episode), "
                            f"got {self.shrink_below}, {self.grow_above}")
        if not 0 <= self.rate < 1 or self.window < 1:
            raise UserError(f"penalty curriculum: needs 0 ≤ rate < 1 and window ≥ 1, got {self.rate}, {self.window}")


class PenaltyCurriculum:
    """The curriculum's state: `scale` and `mean_length` (0-d arrays, so a task's state_dict holds them)."""

    def __init__(self, cfg: PenaltyCurriculumConfig, episode_steps: int):
        self.cfg = cfg
        self.shrink_below, self.grow_above = cfg.shrink_below * episode_steps, cfg.grow_above * episode_steps
        self.scale = np.array(cfg.initial_scale)
        self.mean_length = np.array(0.0)

    def episodes_ended(self, lengths: np.ndarray) -> None:
        weight = min(len(lengths) / self.cfg.window, 1.0)
        self.mean_length[...] = (1 - weight) * self.mean_length + weight * lengths.mean()
        if self.mean_length < self.shrink_below:
            self.scale[...] = max(self.cfg.min_scale, self.scale * (1 - self.cfg.rate))
        elif self.mean_length > self.grow_above:
            self.scale[...] = min(self.cfg.max_scale, self.scale * (1 + self.cfg.rate))
