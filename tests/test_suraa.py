"""The ``suraa`` family: its decomposition by hand, its invariants on every matrix, its GPU path.

CPU part: the sort, the Freedman–Diaconis segments and the G1/G2/G3 groups
written out by hand for small matrices (ties, the IQR = 0 guard, the G1 budget),
then the invariants of the decomposition and y of the reference on the hard
cases and on every shared matrix. GPU part (marked ``gpu``): the GPU's
decomposition arrays equal the reference's, and y matches, for a config of each
g1_mode and each threshold; and a matrix with rows of 100k nonzeros runs G1
through dynamic parallelism.
"""

from __future__ import annotations

import functools
import itertools
import shutil
import subprocess

import numpy as np
import pytest
import scipy.sparse as sp

from kernels._cuda import KERNEL_DIR
from kernels.suraa import (
    DECOMPOSITION_KEYS,
    G1_MODES,
    THRESHOLDS,
    Suraa,
    decompose,
    row_order,
    threads_per_row,
)
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.features import freedman_diaconis_segments
from tuner.io import as_csr
from tuner.verify import Reference

FAMILY = Suraa()
DTYPES = ("float64", "float32")
LAUNCH_KEYS = ("g1_end", "g2_end", "g1_width", "child_threads", "g2_launches")

CONFIGS = (
    {},
    {"max_child_threads": 1024, "threshold": 16, "vector_cap": 128, "scalar_block": 64, "g1_mode": "block"},
    {"max_child_threads": 65536, "threshold": 64, "vector_cap": 1024, "scalar_block": 512},
    {"max_child_threads": 2048, "threshold": 32, "vector_cap": 256, "g1_mode": "block"},
)
"""A representative subset of the space for the CPU invariants (every config runs in test_kernels)."""

GPU_CONFIGS = tuple(
    {"g1_mode": mode, "threshold": t, "max_child_threads": mct, "vector_cap": cap, "scalar_block": block}
    for (mode, t), mct, cap, block in zip(
        itertools.product(G1_MODES, THRESHOLDS),
        (1024, 65536, 8192, 2048, 32768, 4096),
        (128, 1024, 256, 512, 1024, 128),
        (64, 128, 256, 512, 256, 128),
        strict=True,
    )
)
"""Each g1_mode with each threshold, the other parameters varied along."""


def rows_matrix(rows: list[tuple[int, int]], n_cols: int, *, seed: int = 0) -> sp.csr_matrix:
    """CSR matrix whose row i has ``npr`` contiguous entries from column ``first``: rows[i] = (first, npr)."""
    rng = np.random.default_rng(seed)
    indptr = np.concatenate(([0], np.cumsum([npr for _, npr in rows])))
    indices = np.concatenate([np.arange(first, first + npr) for first, npr in rows] + [np.zeros(0, int)])
    data = rng.uniform(0.5, 1.5, indptr[-1]) * rng.choice([-1.0, 1.0], indptr[-1])
    return as_csr((indptr, indices, data), shape=(len(rows), n_cols))


# -- a 12-row matrix, written out by hand --------------------------------------------
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
    ex = FAMILY.prepare_reference(A).extra
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
    ],
)
def test_hand_made_groups(params, groups, bounds, child, g2_launches):
    ex = FAMILY.prepare_reference(hand_matrix(), params).extra
    assert ex["group_of_segment"].tolist() == groups
    assert ex["group_bounds"].tolist() == bounds
    assert ex["child_threads"] == child
    assert ex["g2_launches"] == g2_launches
    assert ex["g1_end"] == bounds[1] and ex["g2_end"] == bounds[2]
    assert ex["g1_width"] == min(params.get("vector_cap", 1024), 320)


@pytest.mark.parametrize("g1_mode", G1_MODES)
def test_hand_made_y(g1_mode):
    A = hand_matrix()
    ref = Reference.build(A, "float64", seed=5)
    for params in ({"max_child_threads": 1024}, {"max_child_threads": 2048, "threshold": 64}):
        y = FAMILY.run_reference(FAMILY.prepare_reference(A, {**params, "g1_mode": g1_mode}), ref.x)
        ok, _, msg = ref.check(y)
        assert ok, msg


def test_ties_go_by_first_column_then_by_row_index():
    # Equal npr everywhere: the first column orders the rows; rows 1 and 3 tie there too.
    A = rows_matrix([(5, 3), (2, 3), (9, 3), (2, 3), (0, 3), (7, 0), (7, 0)], 20)
    assert row_order(A).tolist() == [4, 1, 3, 0, 2, 5, 6]
    assert FAMILY.prepare_reference(A).extra["perm"].tolist() == [4, 1, 3, 0, 2, 5, 6]


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
    for params in ({}, {"threshold": 16}, {"threshold": 64, "vector_cap": 128}):
        ex = FAMILY.prepare_reference(A, params).extra
        assert ex["seg_bounds"].tolist() == [0, 20]
        assert ex["seg_mean"].tolist() == [23.6]  # (18·4 + 2·200) / 20
        assert ex["perm"][:2].tolist() == [3, 11]
    # Threshold 32 (or 64): the one segment is short, everything is G3.
    assert FAMILY.prepare_reference(A).extra["group_bounds"].tolist() == [0, 0, 0, 20]
    # Threshold 16: long; child widths 18·32 + 2·224 = 1024 fit a budget of exactly 1024.
    ex = FAMILY.prepare_reference(A, {"threshold": 16, "max_child_threads": 1024}).extra
    assert ex["group_bounds"].tolist() == [0, 20, 20, 20] and ex["child_threads"] == 1024
    assert ex["g1_width"] == 224


def test_g1_empty_when_the_first_segment_is_over_the_budget():
    # 18·32 + 2·320 = 1216 > 1024: the one long segment goes to G2, whole.
    A = iqr_zero_matrix(300)
    ex = FAMILY.prepare_reference(A, {"threshold": 16, "max_child_threads": 1024}).extra
    assert ex["group_of_segment"].tolist() == [2]
    assert ex["group_bounds"].tolist() == [0, 0, 20, 20]
    assert ex["g1_end"] == 0 and ex["g1_width"] == 0 and ex["child_threads"] == 0
    assert ex["g2_launches"] == ((0, 20, 320, 320),)
    ex = FAMILY.prepare_reference(A, {"threshold": 16, "max_child_threads": 2048}).extra
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
        ex = FAMILY.prepare_reference(A, {"max_child_threads": mct}).extra
        assert ex["seg_bounds"].tolist() == list(range(201))
        assert sorted(ex["perm"][:3].tolist()) == long_rows
        assert ex["group_bounds"].tolist() == [0, g1, 3, 200], mct
        assert ex["child_threads"] == 1024 * g1
        assert ex["g2_launches"] == (((g1, 3, 1024, 1024),) if g1 < 3 else ())


def test_decompose_checks_its_input():
    with pytest.raises(ValueError, match="descending"):
        decompose(np.array([1, 5]), max_child_threads=1024, threshold=32, vector_cap=1024)
    with pytest.raises(ValueError, match="at least one row"):
        decompose(np.array([], dtype=int), max_child_threads=1024, threshold=32, vector_cap=1024)
    np.testing.assert_array_equal(threads_per_row(np.array([0, 1, 32, 33, 5000]), 256), [32, 32, 32, 64, 256])


def test_space_and_instantiations():
    defaults = FAMILY.space.defaults()
    assert defaults == {
        "max_child_threads": 8192,
        "threshold": 32,
        "vector_cap": 1024,
        "scalar_block": 256,
        "g1_mode": "dynamic",
    }
    assert len(FAMILY.space.configs()) == 7 * 3 * 4 * 4 * 2
    names = ("suraa_scalar<float>", "suraa_vector<float>", "suraa_parent<float>")
    assert FAMILY.name_expressions("float32") == names
    assert FAMILY.describe()["params"] == FAMILY.space.to_dict()


# -- invariants on every matrix -------------------------------------------------------
def check_invariants(A, prepared) -> None:
    """Everything the decomposition promises, checked from its arrays alone."""
    m, p, ex = A.shape[0], prepared.params, prepared.extra
    if A.nnz == 0 or m == 0:
        assert ex == {}
        return
    npr = np.diff(A.indptr).astype(np.int64)
    first = np.where(npr > 0, A.indices[np.minimum(A.indptr[:-1], A.nnz - 1)], A.shape[1])
    perm = ex["perm"]
    assert perm.dtype == np.int32 and np.array_equal(np.sort(perm), np.arange(m))
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
    assert child[g1].sum() == ex["child_threads"] <= p["max_child_threads"]
    n1 = int(g1.sum())
    if n1 < k:  # G1 is maximal: the next segment is short or does not fit
        assert sums[n1] <= t * lengths[n1] or child[: n1 + 1].sum() > p["max_child_threads"]
    assert np.all(sums[group == 2] >= t * lengths[group == 2])
    assert np.all(sums[group == 3] < t * lengths[group == 3])

    covered = [(b, e) for b, e, _, _ in ex["g2_launches"]]
    assert covered == sorted(covered) and sum(e - b for b, e in covered) == gb[2] - gb[1]
    assert all(block % y == 0 and y % 32 == 0 and block <= 1024 for _, _, y, block in ex["g2_launches"])
    assert ex["g1_end"] == gb[1] and ex["g2_end"] == gb[2]


@functools.cache
def case(name: str, dtype: str = "float64"):
    A = CASES[name]() if name in CASES else load_shared(name)
    return A.astype(dtype)


@pytest.mark.parametrize("name", sorted(CASES))
def test_invariants_and_y_on_hard_cases(name):
    A = case(name)
    ref = Reference.build(A, "float64", seed=4)
    for params in CONFIGS:
        prepared = FAMILY.prepare_reference(A, params)
        check_invariants(A, prepared)
        ok, _, msg = ref.check(FAMILY.run_reference(prepared, ref.x))
        assert ok, f"{name} {params}: {msg}"


def test_invariants_and_y_on_shared_matrices(shared_dir):
    for name in shared_cases():
        A = case(name)
        ref = Reference.build(A, "float64", seed=4)
        for params in CONFIGS:
            prepared = FAMILY.prepare_reference(A, params)
            check_invariants(A, prepared)
            ok, _, msg = ref.check(FAMILY.run_reference(prepared, ref.x))
            assert ok, f"{name} {params}: {msg}"


def test_reference_float32():
    A = case("huge_row", "float32")
    ref = Reference.build(A, "float32", seed=6)
    y = FAMILY.run_reference(FAMILY.prepare_reference(A), ref.x)
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
    ex = prepared.extra
    if expected_p.extra:
        for key in DECOMPOSITION_KEYS:
            got = ex[key]
            assert isinstance(got, cupy.ndarray), key
            np.testing.assert_array_equal(got.get(), expected_p.extra[key], err_msg=f"{key} {params}")
            assert got.dtype == expected_p.extra[key].dtype, key
        for key in LAUNCH_KEYS:
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
def test_gpu_rows_of_100k_take_the_dynamic_parallelism_path(dtype):
    A = long_rows_matrix(4, 100_000)
    for mct, g1 in ((8192, 4), (2048, 2)):
        ex = gpu_check(A, dtype, {"g1_mode": "dynamic", "max_child_threads": mct})
        assert ex["g1_end"] == g1 and ex["g2_end"] == 4 and ex["child_threads"] == 1024 * g1
        assert sorted(ex["perm"][:4].get().tolist()) == [400, 800, 1200, 1600]
        assert int(ex["fallbacks"].get()[0]) == 0  # every G1 row really ran as a child grid
    gpu_check(A, dtype, {"g1_mode": "block"})


@pytest.mark.gpu
def test_gpu_repeated_runs_follow_the_callers_stream():
    """x changed in place between runs on one stream: each run must see its own x (event ordering)."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = long_rows_matrix(2, 3000, m=5000, seed=3)
    prepared = FAMILY.prepare(cusp.csr_matrix(A), {"max_child_threads": 1024})
    assert prepared.extra["g1_end"] == 1 and prepared.extra["g2_launches"]
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
