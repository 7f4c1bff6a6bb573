"""The penalty curriculum: penalties shrink while episodes are short and grow back as they lengthen,
within bounds, and bad settings are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from hetlab.errors import UserError
from hetlab.tasks.curriculum import PenaltyCurriculum, PenaltyCurriculumConfig


def test_short_episodes_shrink_the_penalties_and_long_ones_grow_them_back_within_bounds():
    curriculum = PenaltyCurriculum(PenaltyCurriculumConfig(initial_scale=0.5, min_scale=0.2, rate=0.1, window=10), 1000)
    curriculum.episodes_ended(np.full(10, 50))  # a whole window: the average is these episodes'
    assert float(curriculum.mean_length) == 50 and float(curriculum.scale) == pytest.approx(0.45)
    for _ in range(30):
        curriculum.episodes_ended(np.full(5, 50))
    assert float(curriculum.scale) == 0.2  # held at min_scale
    curriculum.episodes_ended(np.full(5, 1000))  # half a window: the average moves halfway
    assert float(curriculum.mean_length) == pytest.approx(525) and float(curriculum.scale) == 0.2  # in between: held
    for _ in range(40):
        curriculum.episodes_ended(np.full(10, 1000))
    assert float(curriculum.scale) == 1.0  # held at max_scale


@pytest.mark.parametrize("options, message", [
    ({"initial_scale": 2.0}, "min_scale ≤ initial_scale ≤ max_scale"),
    ({"shrink_below": 0.8, "grow_above": 0.5}, "shrink_below ≤ grow_above"),
    ({"window": 0}, "window ≥ 1"),
])
def test_settings_that_cannot_work_are_refused(options, message):
    with pytest.raises(UserError, match=message):
        PenaltyCurriculumConfig(**options)
