"""NumPy's linear percentile (its default method) in plain Python, to the same bits.

Two callers need it without NumPy's own: a race's timings (a dozen laps of a
few products each, where ``np.percentile`` cost 30-65 us a call on the GPU
machines' hosts, a race's whole host time being a few milliseconds), and the
features read back from the GPU, where only the two sorted positions a
percentile interpolates between are fetched (:func:`positions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["lerp", "percentile", "positions"]


def positions(m: int, q: float) -> tuple[int, int, float]:
    """The two positions of ``m`` sorted values that the ``q``-th percentile interpolates between, and the
    weight of the second."""
    pos = (m - 1) * (q / 100.0)  # NumPy's order of operations: the same bits
    lo = math.floor(pos)
    return lo, min(lo + 1, m - 1), pos - lo


def lerp(a: float, b: float, t: float) -> float:
    """NumPy's linear interpolation for percentiles, its two formulas included (so ties round alike)."""
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of values sorted ascending, as ``np.percentile`` gives it."""
    if not ordered:
        raise ValueError("the percentile of no values")
    lo, hi, t = positions(len(ordered), q)
    return lerp(float(ordered[lo]), float(ordered[hi]), t)
