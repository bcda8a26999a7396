"""The ``suraa`` family: both groupings by hand, their invariants on every matrix, the GPU path.

CPU part, grouping "segment" (the paper): the sort, the Freedman–Diaconis
segments and the G1/G2/G3 groups written out by hand for small matrices (ties,
the IQR = 0 guard, the G1 budget). Grouping "row": the order, the bins (threads
per row, block layout), the groups and the dynamic-mode launch numbers written
out by hand, the fewhuge shape (IQR = 0 with a few huge rows) that the segments
send to G3, the pieces of a multi-block row. Then the invariants of both
decompositions and y of the reference on the hard cases and on every shared
matrix. GPU part (marked ``gpu``): the GPU's decomposition arrays and launch
numbers equal the reference's, and y matches, for configs covering each
grouping, g1_mode, threshold, g3_entries, block size and streams; rows of 100k
and 1M nonzeros in both groupings and modes; G1 ending inside a shared block;
repeated runs (bit-identical, counters back to zero); the caller's stream.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._cuda import KERNEL_DIR
from kernels.suraa import (
    DECOMPOSITION_KEYS,
    G1_MODES,
    G3_ENTRIES,
    LAUNCH_KEYS,
    LAYOUTS,
    SCALAR_BLOCKS,
    THRESHOLDS,
    Suraa,
    sorted_copy,
)
from kernels.suraa_rows import decompose_rows, row_threads
from kernels.suraa_segments import decompose, freedman_diaconis_segments, row_order, threads_per_row
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.matrix.io import as_csr
from tuner.measure.verify import Reference

FAMILY = Suraa()
DTYPES = ("float64", "float32")


def seg(**params) -> dict:
    """A grouping "segment" config (dynamic G1, so max_child_threads is active) with ``params`` on top."""
    return {"grouping": "segment", "g1_mode": "dynamic", **params}


def row(**params) -> dict:
    """A grouping "row" config (g3_entries 2, the hand-made cases' value; the default is 4) with ``params`` on top."""
    return {"grouping": "row", "g3_entries": 2, **params}


CONFIGS = (
    {},
    seg(),
    seg(max_child_threads=1024, threshold=16, vector_cap=128, scalar_block=64, g1_mode="block", streams=1),
    seg(max_child_threads=65536, threshold=64, vector_cap=1024, scalar_block=512),
    seg(max_child_threads=2048, threshold=32, vector_cap=256, g1_mode="block"),
    row(g1_mode="dynamic", max_child_threads=1024, threshold=16, g3_entries=2, scalar_block=64),
    row(g1_mode="dynamic", max_child_threads=65536, threshold=64, g3_entries=8, scalar_block=512),
    row(threshold=32, g3_entries=4, scalar_block=128, layout="sorted"),
)
"""A representative subset of the space for the CPU invariants (test_kernels samples the whole space)."""

GPU_CONFIGS = tuple(
    seg(g1_mode=mode, threshold=t, max_child_threads=mct, vector_cap=cap, scalar_block=block, streams=streams)
    for (mode, t), mct, cap, block, streams in zip(
        itertools.product(G1_MODES, THRESHOLDS),
        (1024, 65536, 8192, 2048, 32768, 4096),
        (128, 1024, 256, 512, 1024, 128),
        (64, 128, 256, 512, 256, 128),
        (4, 1, 4, 1, 4, 1),
        strict=True,
    )
) + tuple(
    row(g1_mode=mode, threshold=t, max_child_threads=mct, g3_entries=e, scalar_block=block, layout=layout)
    for (mode, t), mct, e, block, layout in zip(
        itertools.product(G1_MODES, THRESHOLDS),
        (1024, 65536, 8192, 2048, 32768, 4096),
        (2, 4, 8, 8, 2, 4),
        (64, 128, 512, 256, 64, 512),
        LAYOUTS * 3,
        strict=True,
    )
) + (
    seg(g1_mode="dynamic", max_child_threads=2048, threshold=16, vector_cap=256, layout="sorted"),
    seg(g1_mode="block", threshold=32, vector_cap=1024, scalar_block=64, streams=1, layout="sorted"),
)
"""Each grouping with each g1_mode and threshold; the other parameters (every value of each) varied along."""


def rows_matrix(rows: list[tuple[int, int]], n_cols: int, *, seed: int = 0) -> sp.csr_matrix:
    """CSR matrix whose row i has ``npr`` contiguous entries from column ``first``: rows[i] = (first, npr)."""
    rng = np.random.default_rng(seed)
    indptr = np.concatenate(([0], np.cumsum([npr for _, npr in rows])))
    indices = np.concatenate([np.arange(first, first + npr) for first, npr in rows] + [np.zeros(0, int)])
    data = rng.uniform(0.5, 1.5, indptr[-1]) * rng.choice([-1.0, 1.0], indptr[-1])
    return as_csr((indptr, indices, data), shape=(len(rows), n_cols))


# -- the Freedman–Diaconis segments ---------------------------------------------------------
@pytest.mark.parametrize(
    ("npr", "want"),
    [
        ([], (0, 0)),  # no rows
        ([7], (1, 1)),  # one row
        ([3, 3, 3], (3, 1)),  # max == min
        ([1, 1, 1, 1, 10], (5, 1)),  # IQR 0 although max > min
        ([3, 0, 1, 4], (2, 2)),  # IQR 2.5, h = 5 / cbrt(4), k = ceil(1.27) = 2
        ([0, 1, 1, 2, 1000], (1, 5)),  # IQR 1, k = ceil(1000·cbrt(5) / 2) = 855, clipped to m = 5
        # IQR 6 (q25 3, q75 9), h = 12 / cbrt(10) = 5.57, k = ceil(18 / 5.57) = 4, size ceil(10 / 4) = 3.
        ([0, 2, 3, 5, 5, 6, 8, 9, 12, 18], (3, 4)),
    ],
)
def test_freedman_diaconis_segments(npr: list[int], want: tuple[int, int]) -> None:
    got = freedman_diaconis_segments(np.array(npr, dtype=np.int32))
    assert got == want
    assert all(type(v) is int for v in got)


# -- grouping "segment": a 12-row matrix, written out by hand ------------------------------
# (first column, npr) per row. Sorted: 300 (row 6), 290 (3), 280 (9), 40 (7, first col 1),
# 40 (1, first col 3), 33 (11), 5 (4, col 2), 5 (10, col 2: the row index decides), 5 (0, col 7),
# 2 (8), 1 (5), 0 (2, empty). Ascending npr 0 1 2 5 5 5 33 40 40 280 290 300: q25 = 4.25,
# q75 = 100, IQR = 95.75, h = 2·95.75 / cbrt(12) = 83.65, k = ceil(300 / 83.65) = 4, size 3.
HAND_ROWS = [
    (7, 5), (3, 40), (0, 0), (0, 290), (2, 5), (9, 1), (1, 300), (1, 40), (0, 2), (5, 280), (2, 5), (0, 33),
]
HAND_PERM = [6, 3, 9, 7, 1, 11, 4, 10, 0, 8, 5, 2]
HAND_SEGMENTS = [0, 3, 6, 9, 12]
HAND_MEANS = [290.0, 113 / 3, 5.0, 1.0]


@functools.cache
def hand_matrix() -> sp.csr_matrix:
    return rows_matrix(HAND_ROWS, 400, seed=1)


def test_hand_made_sort_and_segments():
    A = hand_matrix()
    assert freedman_diaconis_segments(np.diff(A.indptr)) == (3, 4)
    ex = FAMILY.prepare_reference(A, seg()).extra
    assert ex["perm"].dtype == np.int32 and ex["perm"].tolist() == HAND_PERM
    assert row_order(A).tolist() == HAND_PERM
    assert ex["seg_bounds"].tolist() == HAND_SEGMENTS
    np.testing.assert_array_equal(ex["seg_mean"], HAND_MEANS)
    # Threads per row of each segment's longest row: 300 -> 320, 40 -> 64, 5 and 2 -> 32.
    assert ex["seg_threads"].tolist() == [320, 64, 32, 32]


@pytest.mark.parametrize(
    ("params", "groups", "bounds", "child", "g2_launches"),
    [
        # Child widths (cap 1024): 320 + 320 + 288 = 928 for segment 0, 64 · 3 = 192 for segment 1.
        # 928 fits 1024, 928 + 192 does not: segment 1 (mean 37.7 > 32) goes to G2.
        ({"max_child_threads": 1024}, [1, 2, 3, 3], [0, 3, 6, 12], 928, ((3, 6, 64, 256),)),
        ({"max_child_threads": 2048}, [1, 1, 3, 3], [0, 6, 6, 12], 1120, ()),
        # Threshold 64: segment 1 (37.7) is short.
        ({"max_child_threads": 1024, "threshold": 64}, [1, 3, 3, 3], [0, 3, 3, 12], 928, ()),
        # Threshold 16: segment 2 (mean 5) still short.
        ({"max_child_threads": 1024, "threshold": 16}, [1, 2, 3, 3], [0, 3, 6, 12], 928, ((3, 6, 64, 256),)),
        # Cap 128: widths 128 · 3 + 64 · 3 = 576 fit 1024.
        ({"max_child_threads": 1024, "vector_cap": 128}, [1, 1, 3, 3], [0, 6, 6, 12], 576, ()),
        # Cap 256: 256 · 3 = 768 fits, 768 + 192 = 960 fits too.
        ({"max_child_threads": 1024, "vector_cap": 256}, [1, 1, 3, 3], [0, 6, 6, 12], 960, ()),
        # g1_mode "block": max_child_threads is inactive, the budget is 8192 (everything long fits).
        ({"max_child_threads": 1024, "g1_mode": "block"}, [1, 1, 3, 3], [0, 6, 6, 12], 1120, ()),
    ],
)
def test_hand_made_groups(params, groups, bounds, child, g2_launches):
    prepared = FAMILY.prepare_reference(hand_matrix(), seg(**params))
    ex = prepared.extra
    assert ex["group_of_segment"].tolist() == groups
    assert ex["group_bounds"].tolist() == bounds
    assert ex["child_threads"] == child
    assert ex["g2_launches"] == g2_launches
    assert ex["g1_end"] == bounds[1] and ex["g2_end"] == bounds[2]
    assert ex["g1_width"] == min(params.get("vector_cap", 1024), 320)
    assert ("max_child_threads" in prepared.params) == (prepared.params["g1_mode"] == "dynamic")


@pytest.mark.parametrize("g1_mode", G1_MODES)
@pytest.mark.parametrize("grouping", ["segment", "row"])
def test_hand_made_y(grouping, g1_mode):
    A = hand_matrix()
    ref = Reference.build(A, "float64", seed=5)
    for params in ({"max_child_threads": 1024}, {"max_child_threads": 2048, "threshold": 64}):
        config = {**params, "grouping": grouping, "g1_mode": g1_mode}
        y = FAMILY.run_reference(FAMILY.prepare_reference(A, config), ref.x)
        ok, _, msg = ref.check(y)
        assert ok, msg


def test_ties_go_by_first_column_then_by_row_index():
    # Equal npr everywhere: the first column orders the rows; rows 1 and 3 tie there too.
    A = rows_matrix([(5, 3), (2, 3), (9, 3), (2, 3), (0, 3), (7, 0), (7, 0)], 20)
    assert row_order(A).tolist() == [4, 1, 3, 0, 2, 5, 6]
    assert FAMILY.prepare_reference(A, seg()).extra["perm"].tolist() == [4, 1, 3, 0, 2, 5, 6]
    # Grouping "row", threshold 16: all short (3 entries: 2 threads, then the empty rows: 1), by row index.
    assert FAMILY.prepare_reference(A, row(threshold=16)).extra["perm"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    # Threshold... the same rows long (npr >= 1 is not in the space): decompose_rows with threshold 3.
    npr, first = np.diff(A.indptr), np.array([5, 2, 9, 2, 0, 20, 20])
    d = decompose_rows(npr, first, n_cols=20, threshold=3, g3_entries=2, block=64, budget=1024)
    assert d.perm.tolist() == [4, 1, 3, 0, 2, 5, 6]  # long rows: the paper's order


def iqr_zero_matrix(long_npr: int) -> sp.csr_matrix:
    """20 rows: 18 of 4 entries, 2 of ``long_npr``, so the middle half is alike (IQR = 0)."""
    rows = [(i % 7, 4) for i in range(20)]
    rows[3], rows[11] = (0, long_npr), (1, long_npr)
    return rows_matrix(rows, 400, seed=2)


def test_iqr_zero_gives_one_segment_of_all_rows():
    A = iqr_zero_matrix(200)
    npr = np.diff(A.indptr)
    q25, q75 = np.percentile(npr, [25, 75])
    assert q25 == q75 == 4
    for params in (seg(), seg(threshold=16), seg(threshold=64, vector_cap=128)):
        ex = FAMILY.prepare_reference(A, params).extra
        assert ex["seg_bounds"].tolist() == [0, 20]
        assert ex["seg_mean"].tolist() == [23.6]  # (18·4 + 2·200) / 20
        assert ex["perm"][:2].tolist() == [3, 11]
    # Threshold 32 (or 64): the one segment is short, everything is G3.
    assert FAMILY.prepare_reference(A, seg()).extra["group_bounds"].tolist() == [0, 0, 0, 20]
    # Threshold 16: long; child widths 18·32 + 2·224 = 1024 fit a budget of exactly 1024.
    ex = FAMILY.prepare_reference(A, seg(threshold=16, max_child_threads=1024)).extra
    assert ex["group_bounds"].tolist() == [0, 20, 20, 20] and ex["child_threads"] == 1024
    assert ex["g1_width"] == 224


def test_g1_empty_when_the_first_segment_is_over_the_budget():
    # 18·32 + 2·320 = 1216 > 1024: the one long segment goes to G2, whole.
    A = iqr_zero_matrix(300)
    ex = FAMILY.prepare_reference(A, seg(threshold=16, max_child_threads=1024)).extra
    assert ex["group_of_segment"].tolist() == [2]
    assert ex["group_bounds"].tolist() == [0, 0, 20, 20]
    assert ex["g1_end"] == 0 and ex["g1_width"] == 0 and ex["child_threads"] == 0
    assert ex["g2_launches"] == ((0, 20, 320, 320),)
    ex = FAMILY.prepare_reference(A, seg(threshold=16, max_child_threads=2048)).extra
    assert ex["group_bounds"].tolist() == [0, 20, 20, 20]


def long_rows_matrix(n_long: int, long_npr: int, m: int = 2000, *, seed: int = 9) -> sp.csr_matrix:
    """``n_long`` rows of ``long_npr`` entries spread through ``m`` rows of 1..9 entries."""
    rng = np.random.default_rng(seed)
    n_cols = long_npr + 10
    rows = [(int(rng.integers(0, 10)), int(rng.integers(1, 10))) for _ in range(m)]
    for i in range(n_long):
        rows[(i + 1) * m // (n_long + 1)] = (i, long_npr)
    return rows_matrix(rows, n_cols, seed=seed)


def test_long_rows_over_the_budget_go_to_g2():
    # Rows of 1..9 entries: IQR > 0, so FD cuts one-row segments; each long row's child is 1024 wide.
    A = long_rows_matrix(3, 5000, m=200)
    long_rows = [50, 100, 150]
    for mct, g1 in ((1024, 1), (2048, 2), (4096, 3)):
        ex = FAMILY.prepare_reference(A, seg(max_child_threads=mct)).extra
        assert ex["seg_bounds"].tolist() == list(range(201))
        assert sorted(ex["perm"][:3].tolist()) == long_rows
        assert ex["group_bounds"].tolist() == [0, g1, 3, 200], mct
        assert ex["child_threads"] == 1024 * g1
        assert ex["g2_launches"] == (((g1, 3, 1024, 1024),) if g1 < 3 else ())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=400), st.sampled_from([1, 7, 1000]))
def test_decompose_reads_the_rule_and_the_sums_off_the_sorted_rows(lengths, scale):
    """decompose reads the quartiles at their positions in the sorted rows, and sums segments as differences
    of running sums: the segments of freedman_diaconis_segments (np.percentile), the sums of np.add.reduceat."""
    npr = np.sort(np.array(lengths, dtype=np.int64) // scale)[::-1]
    d = decompose(npr, max_child_threads=4096, threshold=32, vector_cap=1024)
    size, count = freedman_diaconis_segments(npr)
    np.testing.assert_array_equal(d.seg_bounds, np.append(np.arange(0, npr.size, size), npr.size))
    assert d.seg_bounds.size - 1 <= count
    np.testing.assert_array_equal(d.seg_mean, np.add.reduceat(npr, d.seg_bounds[:-1]) / np.diff(d.seg_bounds))
    np.testing.assert_array_equal(d.seg_threads, threads_per_row(npr[d.seg_bounds[:-1]], 1024))


def test_decompose_checks_its_input():
    with pytest.raises(ValueError, match="descending"):
        decompose(np.array([1, 5]), max_child_threads=1024, threshold=32, vector_cap=1024)
    with pytest.raises(ValueError, match="at least one row"):
        decompose(np.array([], dtype=int), max_child_threads=1024, threshold=32, vector_cap=1024)
    np.testing.assert_array_equal(threads_per_row(np.array([0, 1, 32, 33, 5000]), 256), [32, 32, 32, 64, 256])
    with pytest.raises(ValueError, match="at least one row"):
        decompose_rows(np.zeros(0, int), np.zeros(0, int), n_cols=3, threshold=32, g3_entries=2, block=64, budget=1)


# -- grouping "row", by hand --------------------------------------------------------------
def test_row_threads_table():
    npr = np.array([0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32, 63, 64, 512, 513, 1024, 1025, 100_000, 1_000_000])
    # Short rows (npr < threshold): 2^ceil(log2(ceil(npr / e))), 1 for an empty row, at most 32.
    # Long rows: 2^ceil(log2(ceil(npr / 16))), at least 32 (100k: 6250 -> 8192; 1M: 62500 -> 65536).
    expected = {
        (32, 2): [1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 16, 32, 32, 32, 32, 64, 64, 128, 8192, 65536],
        (32, 8): [1, 1, 1, 1, 1, 1, 1, 2, 2, 4, 4, 32, 32, 32, 32, 64, 64, 128, 8192, 65536],
        (64, 2): [1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 128, 8192, 65536],
        (16, 4): [1, 1, 1, 1, 1, 2, 2, 4, 32, 32, 32, 32, 32, 32, 32, 64, 64, 128, 8192, 65536],
    }
    for (t, e), want in expected.items():
        assert row_threads(npr, threshold=t, g3_entries=e).tolist() == want, (t, e)


# Rows 0..9 as (first column, npr): 20000, 5000, 3, 600, 40, 12, 3, 0, 45, 9.
# Threshold 32, g3_entries 2: long rows 0 (t 2048), 1 (512), 3 (64), 8 (45: 32), 4 (40: 32), by npr;
# short rows 5 (12: 8 threads), 9 (9: 8), 2 (3: 2), 6 (3: 2), 7 (0: 1), by threads, then row index.
ROW_HAND = [(0, 20000), (1, 5000), (0, 3), (2, 600), (0, 40), (5, 12), (3, 3), (0, 0), (1, 45), (4, 9)]
ROW_PERM = [0, 1, 3, 8, 4, 5, 9, 2, 6, 7]
# Block 256: 2048 threads = 8 blocks, 512 = 2; 64 threads: 4 rows a block; 32: 8; 8: 32; 2: 128; 1: 256.
ROW_BINS_256 = [[0, 1, 2048, 0], [1, 2, 512, 8], [2, 3, 64, 10], [3, 5, 32, 11], [5, 7, 8, 12], [7, 9, 2, 13],
                [9, 10, 1, 14]]
# Block 64: 2048 threads = 32 blocks, 512 = 8; 64 threads: one row a block; 32: 2 rows a block.
ROW_BINS_64 = [[0, 1, 2048, 0], [1, 2, 512, 32], [2, 3, 64, 40], [3, 5, 32, 41], [5, 7, 8, 42], [7, 9, 2, 43],
               [9, 10, 1, 44]]


@functools.cache
def row_hand_matrix() -> sp.csr_matrix:
    return rows_matrix(ROW_HAND, 20010, seed=3)


@pytest.mark.parametrize(
    ("params", "perm", "bins", "groups", "launch"),
    [
        # Block mode: budget 8192, all five rows with npr > 32 fit (2048 + 512 + 64 + 32 + 32 = 2688).
        ({}, ROW_PERM, ROW_BINS_256, [0, 5, 5, 10],
         {"child_threads": 2688, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 0, "first_pos": 0,
          "skip_blocks": 0, "grid_blocks": 15}),
        ({"scalar_block": 64}, ROW_PERM, ROW_BINS_64, [0, 5, 5, 10],
         {"child_threads": 2688, "n_multi": 2, "n_multi_blocks": 40, "parent_blocks": 0, "first_pos": 0,
          "skip_blocks": 0, "grid_blocks": 45}),
        # Threshold 64: rows 8 and 4 are short now (32 threads each): by row index, 4 before 8.
        ({"threshold": 64}, [0, 1, 3, 4, 8, 5, 9, 2, 6, 7], ROW_BINS_256, [0, 3, 3, 10],
         {"child_threads": 2624, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 0, "first_pos": 0,
          "skip_blocks": 0, "grid_blocks": 15}),
        # g3_entries 8: rows 5, 9 get 2 threads; rows 2, 6, 7 one.
        ({"g3_entries": 8}, ROW_PERM, ROW_BINS_256[:4] + [[5, 7, 2, 12], [7, 10, 1, 13]], [0, 5, 5, 10],
         {"child_threads": 2688, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 0, "first_pos": 0,
          "skip_blocks": 0, "grid_blocks": 14}),
        ({"g3_entries": 4}, ROW_PERM, ROW_BINS_256[:4] + [[5, 7, 4, 12], [7, 10, 1, 13]], [0, 5, 5, 10],
         {"child_threads": 2688, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 0, "first_pos": 0,
          "skip_blocks": 0, "grid_blocks": 14}),
        # Dynamic, budget 1024: row 0 (2048 threads) does not fit, G1 is empty: a plain launch.
        ({"g1_mode": "dynamic", "max_child_threads": 1024}, ROW_PERM, ROW_BINS_256, [0, 0, 5, 10],
         {"child_threads": 0, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 0, "first_pos": 0,
          "skip_blocks": 0, "grid_blocks": 15}),
        # Budget 2048: G1 = row 0; one parent block, then the layout from block 8 (row 1's): 1 + 15 - 8.
        ({"g1_mode": "dynamic", "max_child_threads": 2048}, ROW_PERM, ROW_BINS_256, [0, 1, 5, 10],
         {"child_threads": 2048, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 1, "first_pos": 1,
          "skip_blocks": 8, "grid_blocks": 8}),
        # Budget 4096: G1 = all five long rows; the layout from block 12 (the 8-thread bin): 1 + 15 - 12.
        ({"g1_mode": "dynamic", "max_child_threads": 4096}, ROW_PERM, ROW_BINS_256, [0, 5, 5, 10],
         {"child_threads": 2688, "n_multi": 2, "n_multi_blocks": 10, "parent_blocks": 1, "first_pos": 5,
          "skip_blocks": 12, "grid_blocks": 4}),
    ],
)
def test_row_grouping_by_hand(params, perm, bins, groups, launch):
    ex = FAMILY.prepare_reference(row_hand_matrix(), row(**params)).extra
    assert ex["perm"].dtype == np.int32 and ex["perm"].tolist() == perm
    assert ex["bins"].dtype == np.int32 and ex["bins"].tolist() == bins
    assert ex["bin_bounds"].tolist() == [b[0] for b in bins] + [10]
    assert ex["bin_threads"].tolist() == [b[2] for b in bins]
    assert ex["bin_blocks"].tolist() == [b[3] for b in bins] + [launch["grid_blocks"] + launch["skip_blocks"]
                                                                 - launch["parent_blocks"]]
    assert ex["group_bounds"].tolist() == groups
    assert {k: ex[k] for k in launch} == launch
    assert ex["g1_end"] == groups[1] and ex["g2_end"] == groups[2]


def test_row_grouping_g1_ending_inside_a_bin():
    # Budget 2656 = 2048 + 512 + 64 + 32: G1 ends after position 3, inside the bin [3, 5) of 32 threads,
    # whose 8-row block 11 holds positions 3 and 4: the host grid starts there and masks position 3.
    A = row_hand_matrix()
    npr, first = np.diff(A.indptr), A.indices[np.minimum(A.indptr[:-1], A.nnz - 1)]
    first = np.where(npr > 0, first, A.shape[1])
    d = decompose_rows(npr, first, n_cols=A.shape[1], threshold=32, g3_entries=2, block=256, budget=2656)
    assert d.group_bounds.tolist() == [0, 4, 5, 10] and d.child_threads == 2656
    assert [d.block_of(p) for p in range(11)] == [0, 8, 10, 11, 11, 12, 12, 13, 13, 14, 15]
    launch = Suraa._row_launch_config(d, {"g1_mode": "dynamic", "scalar_block": 256})
    assert (launch["parent_blocks"], launch["first_pos"], launch["skip_blocks"], launch["grid_blocks"]) == (1, 4, 11, 5)


def test_row_grouping_fixes_the_fewhuge_shape():
    """Short rows of 4 plus two huge rows: IQR = 0, so the segments put everything in G3 (one thread per row,
    the huge rows too); grouping "row" gives the huge rows 8192 threads (32 blocks of 256 each)."""
    rows = [(i % 7, 4) for i in range(20_000)]
    rows[3000], rows[15000] = (0, 100_000), (5, 100_000)
    A = rows_matrix(rows, 100_010, seed=4)
    ex = FAMILY.prepare_reference(A, seg()).extra
    assert ex["seg_bounds"].tolist() == [0, 20_000] and ex["group_bounds"].tolist() == [0, 0, 0, 20_000]
    ex = FAMILY.prepare_reference(A, row()).extra
    assert ex["perm"][:2].tolist() == [3000, 15000]
    assert ex["bins"].tolist() == [[0, 2, 8192, 0], [2, 20_000, 2, 64]]  # 19998 rows, 128 a block: 157 blocks
    # G1 within the block-mode budget of 8192 threads: the first huge row; G2 the other (same execution).
    assert ex["group_bounds"].tolist() == [0, 1, 2, 20_000] and ex["grid_blocks"] == 64 + 157
    assert ex["n_multi"] == 2 and ex["n_multi_blocks"] == 64
    np.testing.assert_array_equal(ex["perm"][2:], np.delete(np.arange(20_000), [3000, 15000]))  # row order
    ref = Reference.build(A, "float64", seed=8)
    ok, _, msg = ref.check(FAMILY.run_reference(FAMILY.prepare_reference(A, row()), ref.x))
    assert ok, msg


def test_reference_sums_a_multi_block_row_by_pieces():
    # One row of 20000 ones times x = 1..20000 with block 64: 2048 threads = 32 pieces of ceil(20000/32) = 625.
    n = 20_000
    A = as_csr((np.array([0, n]), np.arange(n), np.ones(n)), shape=(1, n))
    prepared = FAMILY.prepare_reference(A, row(scalar_block=64))
    assert prepared.extra["bins"].tolist() == [[0, 1, 2048, 0]] and prepared.extra["n_multi_blocks"] == 32
    x = np.arange(1.0, n + 1)
    assert FAMILY.run_reference(prepared, x)[0] == n * (n + 1) / 2


# -- layout "sorted" ---------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CASES))
def test_sorted_copy_is_the_matrix_in_the_sorted_row_order(name):
    """The copy layout "sorted" reads equals SciPy's A[perm] for both groupings' perm (empty rows,
    a huge row, one row, one column, no entries)."""
    A = case(name)
    for params in (row(), seg()):
        perm = FAMILY.prepare_reference(A, params).extra.get("perm", np.arange(A.shape[0], dtype=np.int32))
        indptr, indices, data = sorted_copy(A.indptr, A.indices, A.data, perm)
        expected = A[perm]
        assert indptr.dtype == A.indptr.dtype and indices.dtype == A.indices.dtype and data.dtype == A.data.dtype
        np.testing.assert_array_equal(indptr, expected.indptr)
        np.testing.assert_array_equal(indices, expected.indices)
        np.testing.assert_array_equal(data, expected.data)


# -- the space ---------------------------------------------------------------------------
def test_space_and_instantiations():
    defaults = FAMILY.space.defaults()
    assert defaults == {"grouping": "row", "g1_mode": "block", "threshold": 32, "g3_entries": 4, "scalar_block": 256,
                        "layout": "original"}
    # The default on the hand-made matrix: rows 5, 9 (12 and 9 nonzeros) get 4 threads, rows 2, 6, 7 one.
    assert FAMILY.prepare_reference(row_hand_matrix()).extra["bins"].tolist() == ROW_BINS_256[:4] + [
        [5, 7, 4, 12], [7, 10, 1, 13]
    ]
    configs = FAMILY.space.configs()
    # row: (7 budgets + block mode) · 3 thresholds · 3 g3_entries · 4 blocks;
    # segment: (7 + 1) · 3 thresholds · 4 caps · 4 blocks · 2 streams; both times 2 layouts.
    assert len(configs) == (8 * 3 * 3 * 4 + 8 * 3 * 4 * 4 * 2) * 2 == 2112
    assert {c["grouping"] for c in configs[:: -(-len(configs) // 40)]} == {"row", "segment"}  # test_kernels' sample
    names = (
        "suraa_scalar<float>", "suraa_vector<float>", "suraa_parent<float>",
        "suraa_rows<float, false>", "suraa_rows<float, true>",
    )
    assert FAMILY.name_expressions("float32") == names
    assert FAMILY.describe()["params"] == FAMILY.space.to_dict()
    assert set(G3_ENTRIES) == {2, 4, 8} and max(SCALAR_BLOCKS) <= 512  # suraa_rows has __launch_bounds__(512)


# -- invariants on every matrix -------------------------------------------------------
def _first_columns(A) -> np.ndarray:
    npr = np.diff(A.indptr)
    return np.where(npr > 0, A.indices[np.minimum(A.indptr[:-1], A.nnz - 1)], A.shape[1])


def check_invariants(A, prepared) -> None:
    """Everything the decomposition of either grouping promises, checked from its arrays alone."""
    m, p, ex = A.shape[0], prepared.params, prepared.extra
    if A.nnz == 0 or m == 0:
        assert ex == {}
        return
    perm = ex["perm"]
    assert perm.dtype == np.int32 and np.array_equal(np.sort(perm), np.arange(m))
    assert set(DECOMPOSITION_KEYS[p["grouping"]]) | set(LAUNCH_KEYS[p["grouping"]]) <= set(ex)
    if p["grouping"] == "row":
        check_row_invariants(A, prepared)
    else:
        check_segment_invariants(A, prepared)


def check_segment_invariants(A, prepared) -> None:
    m, p, ex = A.shape[0], prepared.params, prepared.extra
    npr = np.diff(A.indptr).astype(np.int64)
    first = _first_columns(A)
    perm = ex["perm"]
    s_npr, s_first = npr[perm], first[perm]
    assert np.all(np.diff(s_npr) <= 0), "npr must not increase along perm"
    tie = np.diff(s_npr) == 0
    assert np.all(np.diff(s_first)[tie] >= 0), "ties by first column"
    tie2 = tie & (np.diff(s_first) == 0)
    assert np.all(np.diff(perm)[tie2] > 0), "then by row index"

    size, _ = freedman_diaconis_segments(npr)
    bounds = ex["seg_bounds"]
    assert bounds[0] == 0 and bounds[-1] == m and np.all(np.diff(bounds)[:-1] == size)
    assert 0 < bounds[-1] - bounds[-2] <= size
    k = bounds.size - 1
    sums = np.add.reduceat(s_npr, bounds[:-1])
    lengths = np.diff(bounds)
    np.testing.assert_array_equal(ex["seg_mean"], sums / lengths)
    widths = np.minimum(p["vector_cap"], (np.maximum(s_npr, 1) + 31) // 32 * 32)
    np.testing.assert_array_equal(ex["seg_threads"], widths[bounds[:-1]])

    group, t = ex["group_of_segment"], p["threshold"]
    budget = p.get("max_child_threads", 8192)
    assert group.shape == (k,) and set(group.tolist()) <= {1, 2, 3} and np.all(np.diff(group) >= 0)
    gb = ex["group_bounds"]
    for g in (1, 2, 3):
        segs = np.flatnonzero(group == g)
        want = (bounds[segs[0]], bounds[segs[-1] + 1]) if segs.size else (gb[g - 1], gb[g - 1])
        assert (gb[g - 1], gb[g]) == want
    assert gb[0] == 0 and gb[3] == m  # every row in exactly one group: the groups tile [0, m)
    child = np.add.reduceat(widths, bounds[:-1])
    g1 = group == 1
    assert np.all(sums[g1] > t * lengths[g1])
    assert child[g1].sum() == ex["child_threads"] <= budget
    n1 = int(g1.sum())
    if n1 < k:  # G1 is maximal: the next segment is short or does not fit
        assert sums[n1] <= t * lengths[n1] or child[: n1 + 1].sum() > budget
    assert np.all(sums[group == 2] >= t * lengths[group == 2])
    assert np.all(sums[group == 3] < t * lengths[group == 3])

    covered = [(b, e) for b, e, _, _ in ex["g2_launches"]]
    assert covered == sorted(covered) and sum(e - b for b, e in covered) == gb[2] - gb[1]
    assert all(block % y == 0 and y % 32 == 0 and block <= 1024 for _, _, y, block in ex["g2_launches"])
    assert ex["g1_end"] == gb[1] and ex["g2_end"] == gb[2]


def check_row_invariants(A, prepared) -> None:
    m, p, ex = A.shape[0], prepared.params, prepared.extra
    t_min, e, block = p["threshold"], p["g3_entries"], p["scalar_block"]
    budget = p.get("max_child_threads", 8192)
    npr = np.diff(A.indptr).astype(np.int64)
    perm = ex["perm"]
    s_npr, s_first = npr[perm], _first_columns(A)[perm]
    s_t = row_threads(npr, threshold=t_min, g3_entries=e)[perm]
    s_long = s_npr >= t_min
    n_long = int(s_long.sum())
    assert s_long[:n_long].all() and not s_long[n_long:].any(), "long rows first"
    # Threads: powers of two, a warp or more for long rows, a warp or less for short ones, by the rule.
    assert np.all(s_t & (s_t - 1) == 0) and np.all(s_t[:n_long] >= 32) and np.all(s_t[n_long:] <= 32)
    lt, ln_ = s_t[:n_long], s_npr[:n_long]  # the fewest threads with at most 16 (long) or e (short) entries each
    assert np.all(lt * 16 >= ln_) and np.all((lt == 32) | (lt // 2 * 16 < ln_))
    st_, sn_ = s_t[n_long:], s_npr[n_long:]
    assert np.all(st_ * e >= sn_) and np.all((st_ == 1) | (st_ // 2 * e < sn_))
    # Long rows: the paper's order; short rows: threads descending, then row index.
    ln, lf, lp = s_npr[:n_long], s_first[:n_long], perm[:n_long]
    assert np.all(np.diff(ln) <= 0)
    tie = np.diff(ln) == 0
    assert np.all(np.diff(lf)[tie] >= 0) and np.all(np.diff(lp)[tie & (np.diff(lf) == 0)] > 0)
    st, sp_ = s_t[n_long:], perm[n_long:]
    assert np.all(np.diff(st) <= 0) and np.all(np.diff(sp_)[np.diff(st) == 0] > 0)

    # Bins: the maximal runs of equal (long, threads), threads from the rule; the table packs them.
    bb, bt = ex["bin_bounds"], ex["bin_threads"]
    assert bb[0] == 0 and bb[-1] == m and np.all(np.diff(bb) > 0) and bt.dtype == np.int32
    assert np.all(np.diff(bt) <= 0)
    for k in range(bt.size):
        assert np.all(s_t[bb[k] : bb[k + 1]] == bt[k]) and len(set(s_long[bb[k] : bb[k + 1]].tolist())) == 1
        if k:
            assert (bt[k], s_long[bb[k]]) != (bt[k - 1], s_long[bb[k] - 1]), "bins are maximal"
    rows = np.diff(bb)
    t64 = bt.astype(np.int64)
    per_bin = np.where(t64 > block, rows * (t64 // block), -(-rows // np.maximum(block // t64, 1)))
    np.testing.assert_array_equal(ex["bin_blocks"], np.concatenate(([0], np.cumsum(per_bin))))
    np.testing.assert_array_equal(ex["bins"], np.stack([bb[:-1], bb[1:], bt, ex["bin_blocks"][:-1]], axis=1))
    multi = s_t > block
    assert ex["n_multi"] == int(multi.sum()) and multi[: ex["n_multi"]].all()  # the multi-block rows lead
    assert ex["n_multi_blocks"] == int((s_t[multi] // block).sum())

    # Groups: G1 = the leading rows with npr > threshold within the budget, maximal; G2 = other long rows.
    gb = ex["group_bounds"]
    g1 = int(gb[1])
    assert gb.tolist() == [0, g1, n_long, m]
    assert np.all(s_npr[:g1] > t_min) and int(s_t[:g1].sum()) == ex["child_threads"] <= budget
    if g1 < m and s_npr[g1] > t_min:
        assert int(s_t[: g1 + 1].sum()) > budget
    assert ex["g1_end"] == g1 and ex["g2_end"] == n_long

    # Launch: the first block of every position, found independently; the grid and its dynamic skip.
    k_of = np.searchsorted(bb, np.arange(m), side="right") - 1
    rel = np.arange(m) - bb[k_of]
    bt_of = t64[k_of]
    first_block = ex["bin_blocks"][k_of] + np.where(
        bt_of > block, rel * (bt_of // block), rel // np.maximum(block // bt_of, 1)
    )
    assert np.all(np.diff(first_block) >= 0)
    dynamic = p["g1_mode"] == "dynamic" and g1 > 0
    skip = (int(first_block[g1]) if g1 < m else int(ex["bin_blocks"][-1])) if dynamic else 0
    parents = -(-g1 // block) if dynamic else 0
    assert (ex["parent_blocks"], ex["first_pos"], ex["skip_blocks"]) == (parents, g1 if dynamic else 0, skip)
    assert ex["grid_blocks"] == parents + int(ex["bin_blocks"][-1]) - skip >= 1


@functools.cache
def case(name: str, dtype: str = "float64"):
    A = CASES[name]() if name in CASES else load_shared(name)
    return A.astype(dtype)


def check_every_config(name: str) -> None:
    """The reference's decomposition invariants and y, for every config in CONFIGS."""
    A = case(name)
    ref = Reference.build(A, "float64", seed=4)
    for params in CONFIGS:
        prepared = FAMILY.prepare_reference(A, params)
        check_invariants(A, prepared)
        ok, _, msg = ref.check(FAMILY.run_reference(prepared, ref.x))
        assert ok, f"{name} {params}: {msg}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_invariants_and_y_on_hard_cases(name):
    check_every_config(name)


def test_invariants_and_y_on_shared_matrices(shared_dir):
    for name in shared_cases():
        check_every_config(name)


def test_invariants_on_long_rows():
    for A in (long_rows_matrix(4, 100_000), long_rows_matrix(3, 5000, m=200), row_hand_matrix(), hand_matrix()):
        for params in CONFIGS:
            check_invariants(A, FAMILY.prepare_reference(A, params))


@pytest.mark.parametrize("grouping", ["segment", "row"])
def test_reference_float32(grouping):
    A = case("huge_row", "float32")
    ref = Reference.build(A, "float32", seed=6)
    y = FAMILY.run_reference(FAMILY.prepare_reference(A, {"grouping": grouping, "scalar_block": 64}), ref.x)
    assert y.dtype == np.float32
    ok, _, msg = ref.check(y)
    assert ok, msg


# -- the CUDA source compiles -----------------------------------------------------------
NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")
def test_cu_file_compiles_with_nvcc(tmp_path):
    """What tests/test_cuda_sources.py does for every registered family, here before registration."""
    uses = "\n".join(f"    (void)&{e};" for d in DTYPES for e in FAMILY.name_expressions(d))
    wrapper = tmp_path / "suraa_check.cu"
    wrapper.write_text(f'#include "{KERNEL_DIR / FAMILY.cu_file}"\nvoid instantiate_all() {{\n{uses}\n}}\n')
    proc = subprocess.run(
        [NVCC, "-std=c++17", "-arch=sm_90", "-rdc=true", "-c", str(wrapper), "-o", str(tmp_path / "k.o")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


# -- GPU against the reference ------------------------------------------------------------
def gpu_check(A, dtype: str, params: dict, *, seed: int = 2) -> dict:
    """Decomposition arrays equal, launch configs equal, y right; returns the GPU's extra."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = A.astype(dtype)
    ref = Reference.build(A, dtype, seed=seed)
    expected_p = FAMILY.prepare_reference(A, params)
    expected = FAMILY.run_reference(expected_p, ref.x)
    prepared = FAMILY.prepare(cusp.csr_matrix(A), params)
    ex, grouping = prepared.extra, prepared.params["grouping"]
    if expected_p.extra:
        for key in DECOMPOSITION_KEYS[grouping]:
            got = ex[key]
            assert isinstance(got, cupy.ndarray), key
            np.testing.assert_array_equal(got.get(), expected_p.extra[key], err_msg=f"{key} {params}")
            assert got.dtype == expected_p.extra[key].dtype, key
        for key in LAUNCH_KEYS[grouping]:
            assert ex[key] == expected_p.extra[key], key
    else:
        assert ex == {}
    out = cupy.full(A.shape[0], cupy.nan, dtype=dtype)
    y = FAMILY.run(prepared, cupy.asarray(ref.x), out).get()
    ok, _, msg = ref.check(y)
    assert ok, f"{params}: {msg}"
    scale = np.maximum(ref.scale, np.finfo(np.float64).tiny)
    assert np.all(np.abs(y - expected) / scale <= 2 * ref.rtol), f"{params}: GPU differs from the reference"
    # Again on a non-blocking stream of the caller's own, into a fresh output.
    with cupy.cuda.Stream(non_blocking=True) as stream:
        y2 = FAMILY.run(prepared, cupy.asarray(ref.x))
        stream.synchronize()
    ok, _, msg = ref.check(y2.get())
    assert ok, f"{params} (caller's stream): {msg}"
    if grouping == "row":  # deterministic: the pieces are added in a fixed order, whatever finishes first
        np.testing.assert_array_equal(y2.get(), y, err_msg=f"{params}: runs differ")
    if "counters" in ex:  # absent when there is nothing to compute (no rows or no nonzeros)
        assert not ex["counters"].get().any(), "the multi-block counters must wrap back to zero"
    if "fallbacks" in ex:
        assert int(ex["fallbacks"].get()[0]) == 0, "a child launch was refused"
    return ex


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference_on_hard_cases(name, dtype):
    for params in GPU_CONFIGS:
        gpu_check(case(name), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_reference_on_shared_matrices(dtype, shared_dir):
    for name in shared_cases():
        for params in GPU_CONFIGS:
            gpu_check(case(name), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_hand_made_matrices(dtype):
    for A in (hand_matrix(), row_hand_matrix(), iqr_zero_matrix(200)):
        for params in GPU_CONFIGS:
            gpu_check(A, dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_rows_of_100k_take_the_dynamic_parallelism_path(dtype):
    A = long_rows_matrix(4, 100_000)
    for mct, g1 in ((8192, 4), (2048, 2)):
        ex = gpu_check(A, dtype, seg(max_child_threads=mct))
        assert ex["g1_end"] == g1 and ex["g2_end"] == 4 and ex["child_threads"] == 1024 * g1
        assert sorted(ex["perm"][:4].get().tolist()) == [400, 800, 1200, 1600]
        assert int(ex["fallbacks"].get()[0]) == 0  # every G1 row really ran as a child grid
    gpu_check(A, dtype, seg(g1_mode="block"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("long_npr", "t"), [(100_000, 8192), (1_000_000, 65536)])
def test_gpu_row_grouping_huge_rows_over_many_blocks(dtype, long_npr, t):
    """Rows of 100k and 1M nonzeros cut into t / block pieces, in one launch or as child grids."""
    A = long_rows_matrix(4, long_npr)
    for block in (64, 512):
        ex = gpu_check(A, dtype, row(scalar_block=block))
        assert ex["bins"][0].get().tolist() == [0, 4, t, 0] and ex["n_multi"] == 4
        assert ex["n_multi_blocks"] == 4 * t // block and ex["parent_blocks"] == 0
        for mct, g1 in ((65536, min(4, 65536 // t)), (32768, min(4, 32768 // t))):
            ex = gpu_check(A, dtype, row(g1_mode="dynamic", max_child_threads=mct, scalar_block=block))
            assert ex["g1_end"] == g1 and ex["parent_blocks"] == (1 if g1 else 0)
            assert int(ex["fallbacks"].get()[0]) == 0  # every G1 row really ran as a child grid


@pytest.mark.gpu
def test_gpu_row_grouping_is_deterministic_over_repeated_runs():
    import cupy
    import cupyx.scipy.sparse as cusp

    A = long_rows_matrix(4, 100_000)
    ref = Reference.build(A, "float64", seed=11)
    for params in (row(scalar_block=64), row(g1_mode="dynamic", max_child_threads=65536, scalar_block=128)):
        prepared = FAMILY.prepare(cusp.csr_matrix(A), params)
        x = cupy.asarray(ref.x)
        first = FAMILY.run(prepared, x).get()
        for _ in range(20):
            np.testing.assert_array_equal(FAMILY.run(prepared, x).get(), first, err_msg=str(params))
        assert not prepared.extra["counters"].get().any()
        ok, _, msg = ref.check(first)
        assert ok, msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_row_grouping_g1_ends_inside_a_shared_block(dtype):
    # One row of 600 (64 threads) and 100 of 40 (32 threads, 8 a block): budget 1024 = 64 + 30·32, so
    # G1 ends at position 31, inside the block of positions 25..32; the host grid starts with that block.
    A = rows_matrix([(0, 600)] + [(i % 50, 40) for i in range(100)] + [(i % 7, 3) for i in range(50)], 700)
    ex = gpu_check(A, dtype, row(g1_mode="dynamic", max_child_threads=1024, scalar_block=256))
    assert (ex["g1_end"], ex["first_pos"], ex["skip_blocks"], ex["parent_blocks"]) == (31, 31, 4, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("params", [seg(max_child_threads=1024, streams=4), seg(max_child_threads=1024, streams=1),
                                    row(g1_mode="dynamic", max_child_threads=1024), row()])
def test_gpu_repeated_runs_follow_the_callers_stream(params):
    """x changed in place between runs on one stream: each run must see its own x (event ordering)."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = long_rows_matrix(2, 3000, m=5000, seed=3)
    prepared = FAMILY.prepare(cusp.csr_matrix(A), params)
    if params["grouping"] == "segment":
        assert prepared.extra["g1_end"] == 1 and prepared.extra["g2_launches"]
        assert len(prepared.extra["streams"]) == (2 if params["streams"] == 4 else 0)
    refs = [Reference.build(A, "float64", seed=s) for s in range(4)]
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.empty(A.shape[1])
        ys = []
        for ref in refs:
            x.set(ref.x, stream=stream)
            ys.append(FAMILY.run(prepared, x).copy())
        stream.synchronize()
    for ref, y in zip(refs, ys, strict=True):
        ok, _, msg = ref.check(y.get())
        assert ok, msg


@pytest.mark.gpu
@pytest.mark.parametrize("grouping", ["row", "segment"])
def test_gpu_sorted_layout_copies_the_matrix_once_and_gives_the_same_y(grouping):
    """Layout "sorted": the GPU copy equals the CPU one, its bytes are counted, and y is the
    original layout's, bit for bit (the same entries summed in the same order)."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = case("huge_row")
    d_A = cusp.csr_matrix(A)
    x = cupy.asarray(Reference.build(A, "float64", seed=7).x)
    params = {"grouping": grouping}
    original = FAMILY.prepare(d_A, params)
    copied = FAMILY.prepare(d_A, {**params, "layout": "sorted"})
    perm = copied.extra["perm"].get()
    for key, value in zip(("indptr", "indices", "data"), sorted_copy(A.indptr, A.indices, A.data, perm), strict=True):
        np.testing.assert_array_equal(copied.extra[f"sorted_{key}"].get(), value)
    assert copied.extra_bytes - original.extra_bytes == A.indptr.nbytes + A.indices.nbytes + A.data.nbytes
    np.testing.assert_array_equal(FAMILY.run(copied, x).get(), FAMILY.run(original, x).get())
