"""``specsum``: the speculative segmented sum's decomposition, stages and fix-ups.

CPU (any machine): tile boundaries, dirty flags and the synchronizer on a matrix
written out by hand; stage 1's output in both modes (compacted in the paper's
``dirty="fixup"``, true rows in ``dirty="search"``) before and after stage 2; the
invariants and y on every shared matrix and on matrices with whole tiles of
empty rows, for several configs, both modes and both fix-ups. GPU (marked
``gpu``): the decomposition equal to the reference's, stage 1's output equal to
the reference's, and y within the verification bound, for a representative
subset of configs (both modes, T = 16 and 32) on the hard cases and the shared
matrices, in float64 and float32.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels._cuda import resident_threads
from kernels._reference import products
from kernels.specsum import (
    SpecSum,
    add_synchronizer,
    decompose,
    dirty_rows,
    rescatter,
    speculate,
)
from tests.kernel_cases import CASES, gpu_runs, load_shared, shared_cases
from tuner.matrix.io import as_csr
from tuner.measure.verify import Reference

FAMILY = SpecSum()

# A representative subset of the space: both modes (search; fixup on the GPU and on the host), each with
# both T, W from 1 to 16 (odd-sized 6 and 12 too; W = 1 scalar loads, W = 2 and 4 no transposition in
# float32, 8- and 16-byte vector loads otherwise), B from 1 to 8, S from 1 to 16.
FIXUP_GPU, FIXUP_HOST = {"dirty": "fixup", "fixup": "gpu"}, {"dirty": "fixup", "fixup": "host"}
SEARCH = {"dirty": "search"}
CONFIGS = (
    {},
    {"W": 1, "T": 16, "B": 1, "S": 1, **FIXUP_HOST},
    {"W": 16, "T": 32, "B": 8, "S": 16, **FIXUP_GPU},
    {"W": 8, "T": 16, "B": 2, "S": 4, **FIXUP_HOST},
    {"W": 6, "T": 32, "B": 1, "S": 2, **FIXUP_GPU},
    {"W": 12, "T": 16, "B": 8, "S": 16, **FIXUP_GPU},
    {"W": 2, "T": 32, "B": 2, "S": 1, **FIXUP_HOST},
    {"W": 16, "T": 16, "B": 4, "S": 8, **FIXUP_HOST},
    {"W": 1, "T": 16, "B": 1, "S": 1, **SEARCH},
    {"W": 4, "T": 16, "B": 2, "S": 4, **SEARCH},
    {"W": 2, "T": 16, "B": 8, "S": 16, **SEARCH},
    {"W": 6, "T": 16, "B": 1, "S": 2, **SEARCH},
    {"W": 8, "T": 32, "B": 8, "S": 1, **SEARCH},
    {"W": 12, "T": 32, "B": 2, "S": 8, **SEARCH},
    {"W": 16, "T": 32, "B": 1, "S": 16, **SEARCH},
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
    params = {p.name: p for p in space.params}
    assert list(params) == ["W", "T", "dirty", "fixup", "B", "S"]
    assert set(params["W"].values) >= {1, 4, 8, 16} and params["T"].values == (16, 32)
    assert set(params["dirty"].values) == {"search", "fixup"} and params["dirty"].default == "search"
    assert set(params["fixup"].values) == {"gpu", "host"}
    # The fix-up is a choice of the paper's mode only: search mode has no fix-up to place.
    assert space.validate({"dirty": "search", "fixup": "host"}) == space.defaults()
    assert "fixup" not in space.defaults() and space.validate(FIXUP_HOST)["fixup"] == "host"
    modes = {(c["dirty"], c.get("fixup")) for c in space.configs()}
    assert modes == {("search", None), ("fixup", "gpu"), ("fixup", "host")}
    for dtype, ctype in (("float64", "double"), ("float32", "float")):
        exprs = FAMILY.name_expressions(dtype)
        assert len(exprs) < 100 and len(set(exprs)) == len(exprs)
        for config in space.configs():
            for wide in ("false", "true"):
                assert f"specsum_tiles<{ctype}, {config['W']}, {config['T']}, {wide}>" in exprs
        assert f"specsum_sync<{ctype}>" in exprs and f"specsum_fixup<{ctype}>" in exprs
    assert FAMILY.describe()["params"] == space.to_dict()


def test_conformance_sample_covers_every_mode():
    """tests/test_kernels.py samples 40 configs of the space: every mode and every W and T is among them."""
    from tests.test_kernels import configs

    sample = configs("specsum")
    assert {(c["dirty"], c.get("fixup")) for c in sample} == {("search", None), ("fixup", "gpu"), ("fixup", "host")}
    assert {c["W"] for c in sample} == set(FAMILY.space.params[0].values)
    assert {(c["T"], c["dirty"]) for c in sample} == {(t, d) for t in (16, 32) for d in ("search", "fixup")}


# -- a tiny example written out by hand: W=2, T=2 (tiles of 4 entries), S=2 ------------------------
# rows: 0 empty | 1: e0 | 2 empty | 3: e1 | 4: e2-e4 (crosses tiles 0/1) | 5: e5 | 6 empty | 7: e6 |
#       8: e7-e11 (crosses tiles 1/2 and bunches 0/1) | 9: e12 | 10: e13-e19 (crosses bunches 1/2) | 11 empty
# a_e = e + 1, x = 1: row sums 0, 1, 0, 2, 12, 6, 0, 7, 50, 13, 119, 0.
HAND_INDPTR = [0, 0, 1, 1, 2, 5, 6, 6, 7, 12, 13, 20, 20]
HAND_Y = [0, 1, 0, 2, 12, 6, 0, 7, 50, 13, 119, 0]
# Stage 1 alone, written out for both modes (NaN: not written); the synchronizer adds 42 to row 8, 74 to row 10.
HAND_Y_FIXUP = [np.nan, 1, 2, np.nan, 12, 6, 7, np.nan, 8, 13, 45, np.nan]
HAND_Y_SEARCH = [0, 1, 0, 2, 12, 6, 0, 7, 8, 13, 45, 0]
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
    np.testing.assert_array_equal(y_spec, HAND_Y_FIXUP)
    np.testing.assert_array_equal(sync_val, [0, 42, 74])
    dirty = np.flatnonzero(dec["dirty"])
    r0, r1 = dec["tile_row"][dirty], dec["tile_row"][dirty + 1]
    np.testing.assert_array_equal(dirty_rows(dirty, r0, r1), [0, 2, 3, 5, 6, 7, 11])
    # The fix-up (specsum_fixup or the host): re-scatter (row 3 <- y[2], row 7 <- y[6], empty rows 0), then the
    # synchronizer.
    y = y_spec.copy()
    rescatter(y, A.indptr, dirty, r0, r1)
    np.testing.assert_array_equal(y, [0, 1, 0, 2, 12, 6, 0, 7, 8, 13, 45, 0])
    add_synchronizer(y, dec["sync_row"], sync_val)
    np.testing.assert_array_equal(y, HAND_Y)


def test_hand_example_search_mode():
    A = _csr(HAND_INDPTR)
    dec = decompose(A.indptr, 4, 2)
    y_spec, sync_val = speculate(A.indptr, products(A, np.ones(1)), 4, 2, dec, search=True)
    # Dirty tiles 0, 1 and 4 write each segment to the row of its first entry and 0 to their empty rows:
    # tile 0 (rows 0..4): row 1 <- 1, row 3 <- 2 (row 3 starts at e1, the tile's offset 1), rows 0 and 2 <- 0,
    #   row 4's 3+4 carried;
    # tile 1 (rows 4..8): row 4 <- 5 + 7, row 5 <- 6, row 7 <- 7 (offset 2 of the tile), row 6 <- 0, row 8 <- 8;
    # tile 4 (rows 10..11): row 10's 74 to the synchronizer, row 11 <- 0.
    # Clean tiles 2 and 3 write as in the paper's mode (tile 2: the synchronizer; tile 3: rows 9 and 10).
    np.testing.assert_array_equal(y_spec, HAND_Y_SEARCH)
    np.testing.assert_array_equal(sync_val, [0, 42, 74])
    # The same as the paper's stage 1 followed by its re-scatter: search mode moves the fix-up into stage 1.
    y_fixup, _ = speculate(A.indptr, products(A, np.ones(1)), 4, 2, dec)
    dirty = np.flatnonzero(dec["dirty"])
    rescatter(y_fixup, A.indptr, dirty, dec["tile_row"][dirty], dec["tile_row"][dirty + 1])
    np.testing.assert_array_equal(y_fixup, y_spec)
    add_synchronizer(y_spec, dec["sync_row"], sync_val)
    np.testing.assert_array_equal(y_spec, HAND_Y)


def test_hand_example_through_the_family_every_mode():
    # W=1, T=16: tiles [0,16) and [16,20), one tile a bunch; bunch 1 starts inside row 10.
    A = _csr(HAND_INDPTR)
    for mode in (FIXUP_GPU, FIXUP_HOST, SEARCH):
        prepared = FAMILY.prepare_reference(A, {"W": 1, "T": 16, "S": 1, **mode})
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
        for mode in (FIXUP_GPU, FIXUP_HOST):
            prepared = FAMILY.prepare_reference(A, {**params, **mode})
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


def test_search_mode_stage1_writes_every_row_and_only_the_synchronizer_is_left():
    A = _case("empty_rows", "float64")
    ref = Reference.build(A, "float64", seed=3)
    for params in ({"W": 4, "T": 16, "S": 2}, {"W": 8, "T": 32, "S": 4}, {"W": 1, "T": 16, "S": 1}):
        prepared = FAMILY.prepare_reference(A, {**params, **SEARCH})
        y_spec = FAMILY.run_speculative_reference(prepared, ref.x)
        dec = FAMILY.decomposition(prepared)
        assert dec["dirty"].any() and not np.isnan(y_spec).any()
        synced = np.unique(dec["sync_row"][dec["sync_row"] >= 0])
        others = np.setdiff1d(np.arange(A.shape[0]), synced)
        np.testing.assert_allclose(y_spec[others], ref.y[others], rtol=0, atol=1e-12)
        assert np.all(y_spec[np.diff(A.indptr) == 0] == 0)
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
    """Rows with the given lengths (0: empty), values from a fixed seed, at least 7 columns.

    There are as many columns as the longest row has entries, so that no row holds a column twice
    (``as_csr`` would merge the duplicates and shorten the row).
    """
    indptr = np.concatenate(([0], np.cumsum(pattern)))
    data = np.random.default_rng(len(pattern)).uniform(-1, 1, indptr[-1])
    A = _csr(indptr, data, cols=max(7, *pattern))
    assert A.nnz == indptr[-1]
    return A


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
    y_search, sync_search = speculate(A.indptr, products(A, x), tile, S, dec, search=True)
    np.testing.assert_array_equal(sync_search, sync_val)
    if A.nnz == 0:  # stage 1 has no tile; run() fills y with zeros before any launch
        assert len(dec["dirty"]) == 0 and np.isnan(y_spec).all() and np.isnan(y_search).all()
        return
    dirty = np.flatnonzero(dec["dirty"])
    r0, r1 = dec["tile_row"][dirty], dec["tile_row"][dirty + 1]
    expected = A @ x
    # The paper's mode: the re-scatter (GPU or host) repairs exactly the rows dirty_rows names.
    fixed = y_spec.copy()
    rescatter(fixed, A.indptr, dirty, r0, r1)
    changed = ~((fixed == y_spec) | (np.isnan(fixed) & np.isnan(y_spec)))
    assert np.isin(np.flatnonzero(changed), dirty_rows(dirty, r0, r1)).all()
    # Search mode writes in stage 1 what the re-scatter produces: all of y but the synchronizer's share.
    np.testing.assert_array_equal(y_search, fixed)
    assert not np.isnan(y_search).any()
    add_synchronizer(fixed, dec["sync_row"], sync_val)
    np.testing.assert_allclose(fixed, expected, rtol=1e-12, atol=1e-12)


# -- GPU against the reference ----------------------------------------------------------------------
def _underflow_floor(A, dtype: str) -> float:
    """Absolute error a dtype's arithmetic may add below its normal range, on top of the relative bound.

    The bound rtol * sum |a||x| models rounding as relative; in the subnormal range it is absolute: a
    product of magnitude below finfo.tiny (float32: 1.2e-38) is rounded to a multiple of the smallest
    subnormal (error <= 2**-150), or flushed to 0 under flush-to-zero (error < tiny), and the same holds
    for each addition. A partial sum of k products made only of such terms can then be off by a large
    fraction of its own |a||x| scale: bayer10 in float32 holds a = -6.9e-43, the only entry of its row
    in one 16-entry tile, whose product rounds from -1.61e-44 to -1.54e-44 (4 %). Each stage-1 value
    sums at most npr_max products of one row, so 2 * npr_max * tiny bounds that part of the error.
    """
    npr_max = int(np.diff(A.indptr).max(initial=0))
    return 2.0 * max(npr_max, 1) * float(np.finfo(dtype).tiny)


def _gpu_check(A, dtype: str, params: dict) -> None:
    # run twice: buffers (and the host path's pinned ones) are reused
    ref, cpu, gpu, expected, x, y = gpu_runs(FAMILY, A, dtype, params)
    floor = _underflow_floor(A, dtype)
    assert np.all(np.abs(y - expected) <= 2 * ref.rtol * ref.scale + floor), f"{params}: GPU differs from its reference"
    if not (A.nnz and A.shape[0]):
        return
    got, want = FAMILY.decomposition(gpu), FAMILY.decomposition(cpu)
    for key in ("tile_row", "dirty", "sync_row"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{params}: {key}")
    live = want["sync_row"] >= 0
    bound = 2 * ref.rtol * ref.scale[want["sync_row"][live]] + floor
    assert np.all(np.abs(got["sync_val"][live] - want["sync_val"][live]) <= bound), f"{params}: sync_val"
    assert np.all(got["sync_val"][~live] == 0)
    # Stage 2 is launched exactly when it has something to do.
    needed = live.any() or (cpu.params["dirty"] == "fixup" and bool((np.diff(A.indptr) == 0).any()))
    assert gpu.extra["stage2"] == needed, f"{params}: stage 2 launched {gpu.extra['stage2']}, needed {needed}"
    # Stage 1 alone writes the same rows with the same values (scaled by the same partial sums of |a||x|).
    spec_gpu = FAMILY.run_speculative(gpu, x).get()
    spec_cpu = FAMILY.run_speculative_reference(cpu, ref.x)
    np.testing.assert_array_equal(np.isnan(spec_gpu), np.isnan(spec_cpu), err_msg=f"{params}: rows stage 1 writes")
    p = cpu.params
    abs_prods = np.abs(A.data.astype(np.float64)) * np.abs(ref.x.astype(np.float64))[A.indices]
    spec_scale, _ = speculate(
        A.indptr, abs_prods, p["W"] * p["T"], p["S"], FAMILY.decomposition(cpu), search=p["dirty"] == "search"
    )
    written = ~np.isnan(spec_cpu)
    err = np.abs(spec_gpu[written] - spec_cpu[written])
    bound = 2 * ref.rtol * spec_scale[written] + floor
    if not np.all(err <= bound):
        at = np.flatnonzero(written)[np.argmax(err - bound)]
        raise AssertionError(
            f"{params}: stage 1 values differ, row {at}: GPU {spec_gpu[at]!r}, reference {spec_cpu[at]!r}, "
            f"scale {spec_scale[at]!r}"
        )


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
    for pattern in (
        [0] * 300 + [40] + [0] * 500 + [3] + [0] * 2000,
        [1, 0] * 400,
        [0] * 40 + [5000] + [0] * 3 + [1],
        [0] * 3000 + [2] + [0] * 70,  # the walk of one tile crosses a hundred 32-row chunks
    ):
        A = _gaps(pattern).astype(dtype)
        for params in CONFIGS:
            _gpu_check(A, dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ("float64", "float32"))
def test_gpu_subnormal_products_in_a_partial_sum(dtype):
    """bayer10's float32 case in small: a row whose first tile holds only a subnormal-range product."""
    tiny = float(np.finfo(dtype).tiny)
    data = np.concatenate((np.full(15, 0.5), [-6.9e-43 if dtype == "float32" else 3e-310, 0.01, -2.27]))
    A = _csr([0, 15, 18], data, cols=18).astype(dtype)  # rows of 15 and 3 entries: tile 0 holds e15 of row 1
    assert 0 < abs(float(A.data[15])) < tiny
    for params in ({"W": 1, "T": 16, "B": 1, "S": 1, **FIXUP_HOST}, {"W": 1, "T": 16, "B": 1, "S": 1, **SEARCH}):
        _gpu_check(A, dtype, params)


@pytest.mark.gpu
def test_gpu_stage2_skipped_when_nothing_to_fix_and_unaligned_arrays():
    import cupy
    import cupyx.scipy.sparse as cusp

    # 64 rows of 16 entries: with W*T*S a multiple of 16 no bunch starts inside a row, and no row is empty.
    A = _gaps([16] * 64)
    ref = Reference.build(A, "float64", seed=4)
    for params in ({"W": 4, "T": 16, "S": 1, **SEARCH}, {"W": 1, "T": 16, "S": 2, **FIXUP_GPU}):
        gpu = FAMILY.prepare(cusp.csr_matrix(A), params)
        assert not gpu.extra["stage2"]
        ok, _, msg = ref.check(FAMILY.run(gpu, cupy.asarray(ref.x)).get())
        assert ok, msg
    # Values and columns that do not start on 16 bytes (views one entry into larger buffers) are copied.
    B = _gaps([3, 0, 5, 17, 0, 0, 40, 1] * 20)
    G = cusp.csr_matrix(B)
    data, indices = cupy.empty(B.nnz + 1), cupy.empty(B.nnz + 1, dtype=np.int32)
    data[1:], indices[1:] = G.data, G.indices
    G.data, G.indices = data[1:], indices[1:]
    assert G.data.data.ptr % 16 and G.indices.data.ptr % 16
    ref = Reference.build(B, "float64", seed=5)
    for params in ({"W": 4, "T": 32, **SEARCH}, {"W": 8, "T": 16, **FIXUP_GPU}):
        gpu = FAMILY.prepare(G, params)
        assert "data" in gpu.extra and "indices" in gpu.extra
        ok, _, msg = ref.check(FAMILY.run(gpu, cupy.asarray(ref.x)).get())
        assert ok, msg


@pytest.mark.gpu
def test_gpu_synchronizer_added_by_the_last_block_when_the_bunches_are_few():
    """Search mode with at most FUSED_SYNC_PER_THREAD bunches a thread: stage 1's last block adds the
    synchronizer (no second launch), right run after run (the ticket wraps back to 0); with more bunches
    the separate kernel does it."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from kernels.specsum import FUSED_SYNC_PER_THREAD

    params = {"W": 4, "T": 32, "B": 2, "S": 1, **SEARCH}  # 128 entries a bunch, 64 threads a block
    few = _gaps([1000] * 8 + [0, 3] * 10)  # 8 030 entries: 63 bunches, most starting inside a row
    many = _gaps([1000] * 40)  # 40 000 entries: 313 bunches > 4 * 64
    for A, fused in ((few, True), (many, False)):
        n_bunches = -(-A.nnz // 128)
        assert (n_bunches <= FUSED_SYNC_PER_THREAD * 64) == fused
        ref = Reference.build(A, "float64", seed=6)
        gpu = FAMILY.prepare(cusp.csr_matrix(A), params)
        assert gpu.extra["stage2"] and ("ticket" in gpu.extra) == fused
        x = cupy.asarray(ref.x)
        for _ in range(3):
            out = cupy.full(A.shape[0], cupy.nan)
            ok, _, msg = ref.check(FAMILY.run(gpu, x, out).get())
            assert ok, msg
            if fused:
                assert int(gpu.extra["ticket"][0]) == 0
        # The decomposition, and stage 1 alone (run_speculative: the synchronizer left out), as the reference's.
        _gpu_check(A, "float64", params)


def test_resident_threads_by_registers_threads_and_blocks():
    """The wide kernel runs only where its bunches fit in one wave: with 80 registers a thread and blocks
    of 128, an H100/H200 SM holds 6 blocks (65 536 / (80 * 128)), not the 16 its 2 048 threads allow."""
    h200 = {"MultiProcessorCount": 132, "MaxRegistersPerMultiprocessor": 65536, "MaxThreadsPerMultiProcessor": 2048,
            "MaxBlocksPerMultiprocessor": 32}
    assert resident_threads(80, 128, h200) == 132 * 6 * 128
    assert resident_threads(77, 128, h200) == 132 * 6 * 128  # 77 registers are given out as 80
    assert resident_threads(32, 128, h200) == 132 * 16 * 128  # the threads' limit
    assert resident_threads(16, 32, h200) == 132 * 32 * 32  # the blocks' limit


@pytest.mark.gpu
def test_gpu_wide_kernel_for_one_wave_narrow_for_more():
    """The wide kernel (several row pointers a lane a round) serves launches whose bunches fit in one wave,
    the narrow one the others; both agree with the reference, on runs of empty rows inside the matrix and
    after its last entry (rows the walk does not load) and on long rows."""
    import cupy
    import cupyx.scipy.sparse as cusp

    params = {"W": 1, "T": 16, "B": 8, "S": 1, **SEARCH}  # 16 entries a bunch
    pattern = ([3, 0, 0, 700, 1] + [0] * 300 + [5] * 40) * 4
    for repeats, wide in ((1, True), (150, False)):  # 3 600 entries: 225 bunches; 540 000: 33 750
        A = _gaps(pattern * repeats + [2] + [0] * 5000)
        ref = Reference.build(A, "float64", seed=7)
        gpu = FAMILY.prepare(cusp.csr_matrix(A), params)
        assert gpu.extra["wide"] is wide
        ok, _, msg = ref.check(FAMILY.run(gpu, cupy.asarray(ref.x)).get())
        assert ok, msg
        _gpu_check(A, "float64", params)
