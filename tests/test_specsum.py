"""``specsum``: the speculative segmented sum's decomposition, stages and fix-ups.

CPU (any machine): tile boundaries, dirty flags and the synchronizer on a matrix
written out by hand; the speculative output before and after the fix-up; the
invariants and y on every shared matrix and on matrices with whole tiles of
empty rows, for several configs and both fix-ups. GPU (marked ``gpu``): the
decomposition equal to the reference's, stage 1's output equal to the
reference's speculative output, and y within the verification bound, for a
representative subset of configs on the hard cases and the shared matrices.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._reference import products
from kernels.specsum import (
    SpecSum,
    add_synchronizer,
    decompose,
    dirty_rows,
    rescatter,
    speculate,
)
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.io import as_csr
from tuner.verify import Reference

FAMILY = SpecSum()

# A representative subset of the space: each fix-up, both T, W from 1 to 16 (odd-sized 6 and 12 too),
# B from 1 to 8, S from 1 to 16.
CONFIGS = (
    {},
    {"W": 1, "T": 16, "B": 1, "S": 1, "fixup": "host"},
    {"W": 16, "T": 32, "B": 8, "S": 16, "fixup": "gpu"},
    {"W": 8, "T": 16, "B": 2, "S": 4, "fixup": "host"},
    {"W": 6, "T": 32, "B": 1, "S": 2, "fixup": "gpu"},
    {"W": 12, "T": 16, "B": 8, "S": 16, "fixup": "gpu"},
    {"W": 2, "T": 32, "B": 2, "S": 1, "fixup": "host"},
    {"W": 16, "T": 16, "B": 4, "S": 8, "fixup": "host"},
)


def _csr(indptr, data=None, cols: int = 1) -> sp.csr_matrix:
    indptr = np.asarray(indptr, dtype=np.int32)
    nnz = int(indptr[-1])
    data = np.arange(1, nnz + 1, dtype=np.float64) if data is None else np.asarray(data, dtype=np.float64)
    indices = np.arange(nnz, dtype=np.int32) % cols
    A = sp.csr_matrix((data, indices, indptr), shape=(len(indptr) - 1, cols))
    return as_csr(A) if cols > 1 else A


@functools.cache
def _case(name: str, dtype: str) -> sp.csr_matrix:
    return (CASES[name]() if name in CASES else load_shared(name)).astype(dtype)


def _brute_force(indptr: np.ndarray, tile: int, S: int) -> dict[str, np.ndarray]:
    """The decomposition by its definition, one tile and one bunch at a time."""
    indptr = np.asarray(indptr, dtype=np.int64)
    m, nnz = len(indptr) - 1, int(indptr[-1])
    rows = np.repeat(np.arange(m), np.diff(indptr))  # the row of every entry
    empty = np.diff(indptr) == 0
    n_tiles = -(-nnz // tile)
    tile_row = [int(rows[i * tile]) for i in range(n_tiles)] + [m]
    dirty = [int(empty[(0 if i == 0 else tile_row[i]) : min(tile_row[i + 1], m - 1) + 1].any()) for i in range(n_tiles)]
    sync_row = []
    for b in range(-(-n_tiles // S)):
        start = b * S * tile  # the bunch's first entry
        sync_row.append(int(rows[start]) if start > 0 and rows[start - 1] == rows[start] else -1)
    return {"tile_row": np.array(tile_row), "dirty": np.array(dirty), "sync_row": np.array(sync_row)}


def _check_decomposition(A, tile: int, S: int, dec: dict[str, np.ndarray]) -> None:
    indptr = A.indptr.astype(np.int64)
    m, nnz = A.shape[0], A.nnz
    n_tiles = -(-nnz // tile)
    tr = dec["tile_row"].astype(np.int64)
    assert len(tr) == n_tiles + 1 and tr[-1] == m
    starts = np.arange(n_tiles) * tile
    assert np.all(indptr[tr[:-1]] <= starts) and np.all(starts < indptr[tr[:-1] + 1])  # row of the first entry
    assert len(dec["dirty"]) == n_tiles and len(dec["sync_row"]) == -(-n_tiles // S)
    if n_tiles <= 50_000:
        for key, value in _brute_force(A.indptr, tile, S).items():
            np.testing.assert_array_equal(dec[key], value, err_msg=key)


# -- the space ------------------------------------------------------------------------------------
def test_space_and_instantiations():
    space = FAMILY.space
    assert [p.name for p in space.params] == ["W", "T", "B", "S", "fixup"]
    assert set(space.params[0].values) >= {1, 4, 8, 16} and space.params[1].values == (16, 32)
    assert set(space.params[4].values) == {"gpu", "host"}
    for dtype, ctype in (("float64", "double"), ("float32", "float")):
        exprs = FAMILY.name_expressions(dtype)
        assert len(exprs) < 100 and len(set(exprs)) == len(exprs)
        for params in space.configs():
            assert f"specsum_tiles<{ctype}, {params['W']}, {params['T']}>" in exprs
        assert f"specsum_fixup<{ctype}>" in exprs
    assert FAMILY.describe()["params"] == space.to_dict()


# -- a tiny example written out by hand: W=2, T=2 (tiles of 4 entries), S=2 ------------------------
# rows: 0 empty | 1: e0 | 2 empty | 3: e1 | 4: e2-e4 (crosses tiles 0/1) | 5: e5 | 6 empty | 7: e6 |
#       8: e7-e11 (crosses tiles 1/2 and bunches 0/1) | 9: e12 | 10: e13-e19 (crosses bunches 1/2) | 11 empty
# a_e = e + 1, x = 1: row sums 0, 1, 0, 2, 12, 6, 0, 7, 50, 13, 119, 0.
HAND_INDPTR = [0, 0, 1, 1, 2, 5, 6, 6, 7, 12, 13, 20, 20]
HAND_Y = [0, 1, 0, 2, 12, 6, 0, 7, 50, 13, 119, 0]
NAN = np.nan


def test_hand_example_decomposition():
    dec = decompose(np.array(HAND_INDPTR), 4, 2)
    # tiles [0,4) [4,8) [8,12) [12,16) [16,20): rows of their first entries, then m.
    np.testing.assert_array_equal(dec["tile_row"], [1, 4, 8, 9, 10, 12])
    # tile 0: rows 0..4 hold empty rows 0 and 2; tile 1: rows 4..8 hold row 6; tile 4: rows 10..11 hold row 11.
    np.testing.assert_array_equal(dec["dirty"], [1, 1, 0, 0, 1])
    # bunch 0 starts at row 1's first entry; bunch 1 (entry 8) inside row 8; bunch 2 (entry 16) inside row 10.
    np.testing.assert_array_equal(dec["sync_row"], [-1, 8, 10])
    np.testing.assert_array_equal(dec["tile_row"], _brute_force(HAND_INDPTR, 4, 2)["tile_row"])


def test_hand_example_stages():
    A = _csr(HAND_INDPTR)
    dec = decompose(A.indptr, 4, 2)
    y_spec, sync_val = speculate(A.indptr, products(A, np.ones(1)), 4, 2, dec)
    # Tile 0: segments (row1: 1) (row3: 2) (row4: 3+4, carried); the second lands on y[1+1] = y[2], an empty row.
    # Tile 1: (row4: 5 + carry 7 = 12) (row5: 6) (row7: 7 -> y[6], empty) (row8: 8, last of the bunch -> y[8]).
    # Tile 2: all row 8, the bunch started inside it: 9+10+11+12 = 42 to the synchronizer.
    # Tile 3: (row9: 13) (row10: 14+15+16 = 45, last of the bunch -> y[10]).
    # Tile 4: all row 10, bunch 2 started inside it: 17+18+19+20 = 74 to the synchronizer.
    np.testing.assert_array_equal(y_spec, [NAN, 1, 2, NAN, 12, 6, 7, NAN, 8, 13, 45, NAN])
    np.testing.assert_array_equal(sync_val, [0, 42, 74])
    dirty = np.flatnonzero(dec["dirty"])
    r0, r1 = dec["tile_row"][dirty], dec["tile_row"][dirty + 1]
    np.testing.assert_array_equal(dirty_rows(dirty, r0, r1), [0, 2, 3, 5, 6, 7, 11])
    # Host fix-up: re-scatter (row 3 <- y[2], row 7 <- y[6], empty rows 0), then the synchronizer.
    y = y_spec.copy()
    rescatter(y, A.indptr, dirty, r0, r1)
    np.testing.assert_array_equal(y, [0, 1, 0, 2, 12, 6, 0, 7, 8, 13, 45, 0])
    add_synchronizer(y, dec["sync_row"], sync_val)
    np.testing.assert_array_equal(y, HAND_Y)


def test_hand_example_through_the_family_both_fixups():
    # W=1, T=16: tiles [0,16) and [16,20), one tile a bunch; bunch 1 starts inside row 10.
    A = _csr(HAND_INDPTR)
    for fixup in ("gpu", "host"):
        prepared = FAMILY.prepare_reference(A, {"W": 1, "T": 16, "S": 1, "fixup": fixup})
        np.testing.assert_array_equal(FAMILY.run_reference(prepared, np.ones(1)), HAND_Y)
        dec = FAMILY.decomposition(prepared)
        np.testing.assert_array_equal(dec["tile_row"], [1, 10, 12])
        np.testing.assert_array_equal(dec["dirty"], [1, 1])
        np.testing.assert_array_equal(dec["sync_row"], [-1, 10])
        np.testing.assert_array_equal(dec["sync_val"], [0, 17 + 18 + 19 + 20])


def test_speculative_output_differs_on_dirty_tiles_and_is_right_after_the_fixup():
    A = _case("empty_rows", "float64")
    ref = Reference.build(A, "float64", seed=3)
    for params in ({"W": 4, "T": 16, "S": 2}, {"W": 8, "T": 32, "S": 4}):
        for fixup in ("gpu", "host"):
            prepared = FAMILY.prepare_reference(A, {**params, "fixup": fixup})
            y_spec = FAMILY.run_speculative_reference(prepared, ref.x)
            dec = FAMILY.decomposition(prepared)
            dirty = np.flatnonzero(dec["dirty"])
            assert len(dirty) > 0
            repaired = dirty_rows(dirty, dec["tile_row"][dirty], dec["tile_row"][dirty + 1])
            synced = dec["sync_row"][dec["sync_row"] >= 0]
            wrong = ~np.isclose(y_spec, ref.y, rtol=0, atol=1e-12)  # NaN counts as wrong
            assert wrong[repaired].any(), "no dirty tile changed the speculative output"
            assert not np.isnan(np.delete(y_spec, repaired)).any(), "stage 1 left a row outside dirty tiles"
            assert not wrong[np.setdiff1d(np.arange(A.shape[0]), np.concatenate((repaired, synced)))].any()
            ok, _, msg = ref.check(FAMILY.run_reference(prepared, ref.x))
            assert ok, msg


def test_decomposition_needs_a_run_and_handles_zero_nnz():
    A = _csr(HAND_INDPTR)
    prepared = FAMILY.prepare_reference(A)
    with pytest.raises(RuntimeError, match="run"):
        FAMILY.decomposition(prepared)
    empty = FAMILY.decomposition(FAMILY.prepare_reference(as_csr(sp.csr_matrix((5, 3)))))
    assert len(empty["dirty"]) == 0 and len(empty["sync_row"]) == 0 and empty["tile_row"].tolist() == [5]


# -- invariants and y on many matrices -------------------------------------------------------------
def _check_reference(A, dtype: str, params: dict, *, seed: int = 0) -> None:
    ref = Reference.build(A, dtype, seed=seed)
    prepared = FAMILY.prepare_reference(A, params)
    y = FAMILY.run_reference(prepared, ref.x)
    ok, _, msg = ref.check(y)
    assert ok, f"{params}: {msg}"
    if A.nnz and A.shape[0]:
        p = prepared.params
        dec = FAMILY.decomposition(prepared)
        _check_decomposition(A, p["W"] * p["T"], p["S"], dec)
        # The synchronizer holds, per bunch that starts inside a row, that bunch's part of the row.
        tile, S = p["W"] * p["T"], p["S"]
        prods = products(A, ref.x)
        for b in np.flatnonzero(dec["sync_row"] >= 0)[:50]:
            r = dec["sync_row"][b]
            lo, hi = b * S * tile, min((b + 1) * S * tile, A.indptr[r + 1])
            assert abs(dec["sync_val"][b] - prods[lo:hi].sum()) <= 4 * ref.rtol * max(ref.scale[r], 1e-300)


@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_reference_on_every_shared_matrix(shared_dir, dtype):
    for name in shared_cases():
        A = _case(name, dtype)
        for params in CONFIGS:
            _check_reference(A, dtype, params)


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_on_hard_cases(name):
    for params in CONFIGS:
        _check_reference(_case(name, "float64"), "float64", params)


def _gaps(pattern: list[int]) -> sp.csr_matrix:
    """Rows with the given lengths (0: empty), values from a fixed seed, 7 columns."""
    indptr = np.concatenate(([0], np.cumsum(pattern)))
    data = np.random.default_rng(len(pattern)).uniform(-1, 1, indptr[-1])
    return _csr(indptr, data, cols=7)


@pytest.mark.parametrize(
    "pattern",
    [
        [0] * 300 + [40] + [0] * 500 + [3] + [0] * 2000,  # whole tiles' worth of empty rows, leading and trailing
        [16] + [0] * 50 + [16] + [0] * 50 + [16],  # empty rows exactly at tile boundaries (tile 16)
        [1, 0] * 400,  # every other row empty: every tile dirty
        [0] * 40 + [1] * 40 + [0] * 40 + [5000] + [0] * 3 + [1],  # a huge row spanning many bunches
        [3, 0, 0, 0, 5, 0, 33, 0, 0, 1, 0, 70, 2, 0, 0, 0],
    ],
)
def test_whole_tiles_of_empty_rows(pattern):
    A = _gaps(pattern)
    for params in (*CONFIGS, {"W": 1, "T": 16, "S": 16}, {"W": 16, "T": 32, "S": 1, "fixup": "host"}):
        _check_reference(A, "float64", params)
        _check_reference(A.astype(np.float32), "float32", params)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(0, 6), st.integers(20, 120)), min_size=1, max_size=80),
    tile=st.integers(1, 24),
    S=st.integers(1, 5),
)
def test_stages_reproduce_the_product_for_any_geometry(lengths, tile, S):
    """Any tile size (not only W*T of the space) and bunch length: both fix-ups give A @ x."""
    A = _gaps(lengths)
    x = np.random.default_rng(0).uniform(-1, 1, A.shape[1])
    dec = decompose(A.indptr, tile, S)
    for key, value in _brute_force(A.indptr, tile, S).items():
        np.testing.assert_array_equal(dec[key], value, err_msg=key)
    y_spec, sync_val = speculate(A.indptr, products(A, x), tile, S, dec)
    if A.nnz == 0:  # stage 1 has no tile; run() fills y with zeros before any launch
        assert len(dec["dirty"]) == 0 and np.isnan(y_spec).all()
        return
    dirty = np.flatnonzero(dec["dirty"])
    r0, r1 = dec["tile_row"][dirty], dec["tile_row"][dirty + 1]
    expected = A @ x
    host = y_spec.copy()
    rescatter(host, A.indptr, dirty, r0, r1)
    add_synchronizer(host, dec["sync_row"], sync_val)
    np.testing.assert_allclose(host, expected, rtol=1e-12, atol=1e-12)
    gpu = y_spec.copy()
    rows = dirty_rows(dirty, r0, r1)
    gpu[rows] = expected[rows]
    add_synchronizer(gpu, dec["sync_row"], sync_val)
    np.testing.assert_allclose(gpu, expected, rtol=1e-12, atol=1e-12)


# -- GPU against the reference ----------------------------------------------------------------------
def _gpu_check(A, dtype: str, params: dict) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    ref = Reference.build(A, dtype, seed=2)
    cpu = FAMILY.prepare_reference(A, params)
    expected = FAMILY.run_reference(cpu, ref.x)
    gpu = FAMILY.prepare(cusp.csr_matrix(A), params)
    x = cupy.asarray(ref.x)
    out = cupy.empty(A.shape[0], dtype=dtype)
    for _ in range(2):  # twice: buffers (and the host path's pinned ones) are reused
        out.fill(cupy.nan)
        y = FAMILY.run(gpu, x, out).get()
        ok, _, msg = ref.check(y)
        assert ok, f"{params}: {msg}"
    scale = np.maximum(ref.scale, np.finfo(np.float64).tiny)
    assert np.all(np.abs(y - expected) / scale <= 2 * ref.rtol), f"{params}: GPU differs from its reference"
    if not (A.nnz and A.shape[0]):
        return
    got, want = FAMILY.decomposition(gpu), FAMILY.decomposition(cpu)
    for key in ("tile_row", "dirty", "sync_row"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{params}: {key}")
    live = want["sync_row"] >= 0
    bound = 2 * ref.rtol * scale[want["sync_row"][live]]
    assert np.all(np.abs(got["sync_val"][live] - want["sync_val"][live]) <= bound), f"{params}: sync_val"
    assert np.all(got["sync_val"][~live] == 0)
    # Stage 1 alone writes the same rows with the same values (scaled by the same partial sums of |a||x|).
    spec_gpu = FAMILY.run_speculative(gpu, x).get()
    spec_cpu = FAMILY.run_speculative_reference(cpu, ref.x)
    np.testing.assert_array_equal(np.isnan(spec_gpu), np.isnan(spec_cpu), err_msg=f"{params}: rows stage 1 writes")
    p = cpu.params
    abs_prods = np.abs(A.data.astype(np.float64)) * np.abs(ref.x.astype(np.float64))[A.indices]
    spec_scale, _ = speculate(A.indptr, abs_prods, p["W"] * p["T"], p["S"], FAMILY.decomposition(cpu))
    written = ~np.isnan(spec_cpu)
    err = np.abs(spec_gpu[written] - spec_cpu[written]) / np.maximum(spec_scale[written], np.finfo(np.float64).tiny)
    assert np.all(err <= 2 * ref.rtol), f"{params}: stage 1 values differ"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float64", "float32"))
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference_on_hard_cases(name, dtype):
    for params in CONFIGS:
        _gpu_check(_case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_gpu_matches_reference_on_every_shared_matrix(shared_dir, dtype):
    for name in shared_cases():
        for params in CONFIGS:
            _gpu_check(_case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_gpu_whole_tiles_of_empty_rows(dtype):
    for pattern in ([0] * 300 + [40] + [0] * 500 + [3] + [0] * 2000, [1, 0] * 400, [0] * 40 + [5000] + [0] * 3 + [1]):
        A = _gaps(pattern).astype(dtype)
        for params in CONFIGS:
            _gpu_check(A, dtype, params)
