"""tuner.measure.evaluate's round-robin timer: the products taken in turn, each figure the median of its rounds."""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.measure.backend import Timing
from tuner.measure.evaluate import round_robin


class _Clock:
    """A backend whose ``time`` runs the product once and hands out the next of the given medians."""

    def __init__(self, medians: list[float]) -> None:
        self.medians = iter(medians)
        self.flushed: list[bool] = []

    def time(self, fn: Any, *, repeats: int, max_duration: float, flush_l2: bool) -> Timing:
        fn()
        self.flushed.append(flush_l2)
        m = next(self.medians)
        return Timing(median_s=m, p10_s=m * 0.9, p90_s=m * 1.1, repeats=repeats)


def test_round_robin_takes_the_products_in_turn_and_the_median_of_their_rounds() -> None:
    order: list[str] = []
    # rounds of (a, b): a's medians 3, 1, 2 and b's 10, 30, 20, as the rounds hand them out in turn
    clock = _Clock([3.0, 10.0, 1.0, 30.0, 2.0, 20.0])
    timings = round_robin(clock, [lambda: order.append("a"), lambda: order.append("b")], rounds=3, repeats=7,
                          flush_l2=True)
    assert order == ["a", "b"] * 3
    assert [t.median_s for t in timings] == [2.0, 20.0]
    assert np.isclose(timings[0].p10_s, 0.9) and np.isclose(timings[0].p90_s, 3.3)
    assert np.isclose(timings[1].p10_s, 9.0) and np.isclose(timings[1].p90_s, 33.0)
    assert [t.repeats for t in timings] == [21, 21]
    assert clock.flushed == [True] * 6
