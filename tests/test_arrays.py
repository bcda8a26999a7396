"""kernels._arrays: the host argsort of unique-made keys gives the stable order, whatever the keys."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._arrays import argsort_unique

KEY_TYPES = (np.int32, np.int64, np.uint32, np.uint64)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_argsort_unique_is_the_stable_order(data):
    dtype = np.dtype(data.draw(st.sampled_from(KEY_TYPES)))
    info = np.iinfo(dtype)
    lo = data.draw(st.integers(info.min, info.max))
    width = data.draw(st.sampled_from([0, 3, 1000, 2**40, int(info.max) - int(info.min)]))  # ties .. full range
    hi = min(lo + width, int(info.max))
    keys = np.array(data.draw(st.lists(st.integers(lo, hi), max_size=300)), dtype=dtype)
    np.testing.assert_array_equal(argsort_unique(keys), np.argsort(keys, kind="stable"))


def test_argsort_unique_falls_back_where_key_times_position_overflows():
    keys = np.array([2**62, -(2**62), 5, 5, -(2**62)], dtype=np.int64)  # range * n beyond int64: stable sort
    np.testing.assert_array_equal(argsort_unique(keys), [1, 4, 2, 3, 0])


def test_argsort_unique_of_keys_spanning_their_whole_type():
    for dtype in KEY_TYPES:
        info = np.iinfo(dtype)
        keys = np.array([info.max, info.min, 0 if info.min < 0 else 1, info.max, info.min], dtype=dtype)
        np.testing.assert_array_equal(argsort_unique(keys), np.argsort(keys, kind="stable"))
