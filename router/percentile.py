"""Percentiles, in the two definitions the project uses.

`percentile`: the router's live statistics — nearest rank, the smallest value at or above q%.

`linear_percentile`: the bench's summaries and the compute model's predictions of them — linear
interpolation between the two nearest ranks (numpy's default "linear", Hyndman & Fan type 7): for
sorted values x[0..n−1] and p in [0, 100],

    rank = p / 100 × (n − 1),   i = ⌊rank⌋,   value = x[i] + (rank − i) × (x[i+1] − x[i])

so p0 is the minimum, p100 the maximum, and p50 of an even count the mean of the middle two.
Either gives None for no values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None without values."""
    return percentile_of_sorted(sorted(values), q)


def percentile_of_sorted(ordered: Sequence[float], q: float) -> float | None:
    """`percentile` of values already in ascending order (a window kept sorted as it moves)."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def linear_percentile(values: Sequence[float], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation (see the module docstring); None for no values."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    if not values:
        return None
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (rank - low) * (ordered[high] - ordered[low])
