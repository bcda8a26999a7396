"""common.percentile: NumPy's linear percentile to the same bits, without NumPy (a race's laps, the GPU features)."""

from __future__ import annotations

import numpy as np
import pytest

from common.percentile import percentile
from tuner.measure.backend import Timing


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 10, 101])
def test_percentile_is_numpys_to_the_bit(size: int) -> None:
    rng = np.random.default_rng(size)
    for values in (rng.random(size) * 1e-4, rng.integers(0, 5, size).astype(float)):  # ties too
        ordered = sorted(values.tolist())
        for q in (0, 10, 25, 50, 75, 90, 100, 33.3):
            assert percentile(ordered, q) == float(np.percentile(values, q)), (size, q)


def test_timing_from_samples_takes_lists_and_arrays_alike() -> None:
    samples = [3e-5, 1e-5, 2e-5, 9e-5]
    want = Timing(float(np.median(samples)), float(np.percentile(samples, 10)), float(np.percentile(samples, 90)), 4)
    assert Timing.from_samples(samples) == want
    assert Timing.from_samples(np.asarray(samples)) == want


def test_percentile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
