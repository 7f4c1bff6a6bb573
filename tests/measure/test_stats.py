"""The paired-difference interval the study report gives for INT8 − FP32 success."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetlab.measure.stats import paired_difference_interval, wilson_interval


def unpaired_square_and_add(first: int, second: int, n: int) -> tuple[float, float]:
    """Newcombe's interval for two independent rates: what the paired one becomes with no correlation."""
    (low1, high1), (low2, high2) = wilson_interval(first, n), wilson_interval(second, n)
    p1, p2 = first / n, second / n
    return (p1 - p2 - math.hypot(p1 - low1, high2 - p2), p1 - p2 + math.hypot(high1 - p1, p2 - low2))


def test_it_holds_the_difference_and_swapping_the_two_negates_it():
    for table in [(36, 12, 2, 0), (20, 3, 9, 18), (45, 0, 5, 0), (0, 0, 0, 50), (1, 1, 7, 12)]:
        both, only_first, only_second, neither = table
        difference = (only_first - only_second) / sum(table)
        low, high = paired_difference_interval(*table)
        assert -1 <= low <= difference <= high <= 1
        assert paired_difference_interval(both, only_second, only_first, neither) == pytest.approx((-high, -low))


def test_agreeing_pairs_narrow_it_and_no_correlation_gives_the_unpaired_interval():
    # 30 pairs succeed under both and 14 under neither: the pairs agree, so the interval is narrower.
    paired = paired_difference_interval(30, 5, 1, 14)
    unpaired = unpaired_square_and_add(35, 31, 50)
    assert paired[1] - paired[0] < 0.8 * (unpaired[1] - unpaired[0])
    # Every pair succeeds under the first: no correlation to use, the two intervals are the same.
    assert paired_difference_interval(40, 10, 0, 0) == pytest.approx(unpaired_square_and_add(50, 40, 50))


def test_identical_outcomes_give_an_interval_around_zero_that_narrows_with_more_pairs():
    low, high = paired_difference_interval(50, 0, 0, 0)
    assert low == pytest.approx(-high) and 0 < high < 0.1
    assert paired_difference_interval(500, 0, 0, 0)[1] < high


def test_it_covers_the_true_difference_about_95_percent_of_the_time():
    # Pairs of correlated successes (as two conditions on the same episodes): p1 = 0.85, p2 = 0.75.
    rng = np.random.default_rng(0)
    cells = np.array([0.72, 0.13, 0.03, 0.12])  # both, only first, only second, neither
    true_difference = cells[1] - cells[2]
    draws = rng.multinomial(50, cells, size=2000)
    covered = [low <= true_difference <= high for low, high in (paired_difference_interval(*map(int, d)) for d in draws)]
    assert 0.93 <= np.mean(covered) <= 0.99
