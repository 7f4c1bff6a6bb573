"""Statistics the reports share."""

from __future__ import annotations

import math


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95 % for z = 1.96)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference_interval(both: int, only_first: int, only_second: int, neither: int,
                               z: float = 1.96) -> tuple[float, float]:
    """Interval for p1 − p2, two success rates measured on the same units (each unit: did it succeed
    under the first, under the second), by Newcombe's method 10 (Statistics in Medicine 17, 1998):
    the Wilson intervals of p1 and p2 combined through the pairs' correlation, so agreeing pairs
    narrow it. 95 % for z = 1.96."""
    n = both + only_first + only_second + neither
    if n == 0:
        return -1.0, 1.0
    first, second = both + only_first, both + only_second
    p1, p2 = first / n, second / n
    low1, high1 = wilson_interval(first, n, z)
    low2, high2 = wilson_interval(second, n, z)
    margins = first * (n - first) * second * (n - second)
    agreement = both * neither - only_first * only_second
    # The correlation of the pairs, shrunk towards 0 when positive (Newcombe's continuity correction).
    corrected = max(agreement - n / 2, 0.0) if agreement > 0 else agreement
    phi = corrected / math.sqrt(margins) if margins else 0.0
    difference = p1 - p2
    low = difference - math.sqrt((p1 - low1) ** 2 - 2 * phi * (p1 - low1) * (high2 - p2) + (high2 - p2) ** 2)
    high = difference + math.sqrt((high1 - p1) ** 2 - 2 * phi * (high1 - p1) * (p2 - low2) + (p2 - low2) ** 2)
    return max(-1.0, low), min(1.0, high)
