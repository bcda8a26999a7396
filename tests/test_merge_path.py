"""``merge_path``: the merge-path search, the tiles and threads it cuts, the carry-outs and the fix-up.

CPU (any machine): the search against a brute-force merge at every diagonal
(hand-made, random and hypothesis-drawn row lengths); tile boundaries; a hand
example of a row spanning many tiles with its carries written out; the reference
against SciPy on the hard cases, with tiles far smaller than a row, and on shared
matrices; when the fix-up has work; the 32-bit guard. GPU (marked ``gpu``): tile
coordinates equal to the reference's, carries and y within the bound of the
reference's and SciPy's, for every ``items_per_thread`` in both dtypes.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import MatrixFormatError
from kernels._reference import products
from kernels.merge_path import (
    BLOCK_SIZES,
    ITEMS_PER_THREAD,
    LOADS,
    PATH_MAX,
    MergePath,
    decompose,
    ends_inside_a_row,
    merge_path_search,
    path_length,
    spmv_reference,
)
from tests.kernel_cases import CASES, arrow, gpu_runs, load_shared
from tuner.measure.verify import Reference

FAMILY = MergePath()
DTYPES = ("float64", "float32")
# Every items_per_thread, the block sizes in turn: tiles from 128 to 8192 items.
GPU_CONFIGS = tuple(
    {"items_per_thread": k, "block_size": BLOCK_SIZES[n % len(BLOCK_SIZES)], "loads": loads}
    for n, k in enumerate(ITEMS_PER_THREAD) for loads in LOADS
)
CPU_CONFIGS = (
    FAMILY.space.defaults(),
    {"items_per_thread": 2, "block_size": 64, "loads": "thread"},
    {"items_per_thread": 16, "block_size": 512, "loads": "block"},
    {"items_per_thread": 7, "block_size": 128, "loads": "thread"},
)
# Shared matrices of the shapes merge_path is for: huge rows (arrow, lp_fit2d: 25 rows of ~5 000 entries),
# many empty rows (LFAT5_hypersparse, mbeacxc), power-law rows (rajat01, ca-HepPh_rawids).
SHARED = ("arrow", "lp_fit2d", "LFAT5_hypersparse", "mbeacxc", "rajat01", "ca-HepPh_rawids")


@functools.cache
def _case(name: str, dtype: str) -> sp.csr_matrix:
    return (CASES[name]() if name in CASES else load_shared(name)).astype(dtype)


def _rows(lengths: list[int], *, seed: int = 0) -> sp.csr_matrix:
    """Rows of the given lengths (0: empty), columns 0 .. length-1, values from a fixed seed."""
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    indices = np.concatenate([np.arange(n) for n in lengths] or [[]]).astype(np.int32)
    data = np.random.default_rng(seed).uniform(-1, 1, int(indptr[-1]))
    return sp.csr_matrix((data, indices, indptr), shape=(len(lengths), max(1, *lengths)))


def _brute_merge(indptr: np.ndarray) -> np.ndarray:
    """``(2, m + nnz + 1)``: the (row ends, nonzeros) consumed after each item, merging one item at a time."""
    ends, nnz = [int(e) for e in indptr[1:]], int(indptr[-1])
    i = j = 0
    path = [(0, 0)]
    while i < len(ends) or j < nnz:
        if i < len(ends) and (j == nnz or ends[i] <= j):  # a row end comes before the nonzero it equals
            i += 1
        else:
            j += 1
        path.append((i, j))
    return np.array(path, dtype=np.int64).T


def _check_against_scipy(A, dtype: str, params: dict) -> None:
    ref = Reference.build(A, dtype, seed=1)  # y = A @ x by SciPy in float64; the bound scales with |A|·|x|
    y = FAMILY.run_reference(FAMILY.prepare_reference(A, params), ref.x)
    assert y.dtype == np.dtype(dtype)
    ok, _, msg = ref.check(y)
    assert ok, f"{params}: {msg}"


# -- the space ------------------------------------------------------------------------------------
def test_space_and_instantiations():
    params = {p.name: p for p in FAMILY.space.params}
    assert list(params) == ["loads", "items_per_thread", "block_size", "indices"]
    assert params["items_per_thread"].values == ITEMS_PER_THREAD and params["block_size"].values == BLOCK_SIZES
    assert params["loads"].values == LOADS
    # CUB's float64, columns narrow where they fit
    assert FAMILY.space.defaults() == {"loads": "block", "items_per_thread": 6, "block_size": 64, "indices": "narrow"}
    largest = {"items_per_thread": max(ITEMS_PER_THREAD), "block_size": max(BLOCK_SIZES)}
    assert FAMILY.shared_bytes({**largest, "loads": "thread"}, "float64") <= 48 * 1024  # row ends: no opt-in
    assert FAMILY.shared_bytes({**largest, "loads": "block"}, "float64") <= 227 * 1024  # Hopper's opt-in limit
    for dtype, ctype in (("float64", "double"), ("float32", "float")):
        exprs = FAMILY.name_expressions(dtype)
        assert len(set(exprs)) == len(exprs)
        assert {"merge_path_search", f"merge_path_fixup<{ctype}>"} <= set(exprs)
        for k in ITEMS_PER_THREAD:
            assert {f"merge_path_spmv<{ctype}, {k}, {w}, {n}>" for w in ("true", "false")
                    for n in ("true", "false")} <= set(exprs)
    assert FAMILY.describe()["params"] == FAMILY.space.to_dict()


def test_conformance_suite_runs_every_config():
    """tests/test_kernels.py samples about 40 configs of a space: of merge_path's 144, every items_per_thread
    with both ways of loading, and both kinds of columns (the GPU tests here run every items_per_thread both
    ways)."""
    from tests.test_kernels import configs

    assert len(FAMILY.space.configs()) == len(ITEMS_PER_THREAD) * len(BLOCK_SIZES) * len(LOADS) * 2
    sample = configs("merge_path")
    assert {(c["items_per_thread"], c["loads"]) for c in sample} == {(k, w) for k in ITEMS_PER_THREAD for w in LOADS}
    assert {c["indices"] for c in sample} == {"narrow", "int32"}


# -- the search -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "lengths",
    [
        [3, 0, 2],
        [0, 0, 0, 5],
        [5, 0, 0, 0],
        [1],
        [0],
        [0, 0],
        [40],
        [1, 0] * 20,
        [0] * 30 + [200] + [0] * 10 + [1],
    ],
)
def test_search_matches_a_brute_force_merge_at_every_diagonal(lengths):
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    expected = _brute_merge(indptr)
    np.testing.assert_array_equal(merge_path_search(indptr, np.arange(expected.shape[1])), expected)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.one_of(st.just(0), st.integers(0, 5), st.integers(20, 90)), min_size=1, max_size=60))
def test_search_matches_a_brute_force_merge_for_any_rows(lengths):
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    expected = _brute_merge(indptr)
    diagonals = np.arange(expected.shape[1])
    np.testing.assert_array_equal(merge_path_search(indptr, diagonals), expected)
    # In random order too: the diagonals are searched independently.
    shuffled = np.random.default_rng(len(lengths)).permutation(diagonals)
    np.testing.assert_array_equal(merge_path_search(indptr, shuffled), expected[:, shuffled])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("ipt,block", [(1, 1), (2, 3), (6, 64), (16, 512)])
def test_tile_starts_are_the_merge_at_multiples_of_the_tile(name, ipt, block):
    A = _case(name, "float64")
    m, nnz = A.shape[0], A.nnz
    path = _brute_merge(A.indptr)
    tile = ipt * block
    dec = decompose(A.indptr, items_per_thread=ipt, block_size=block)
    assert dec["tile_row"].dtype == dec["tile_nz"].dtype == np.int32
    n_tiles = -(-(m + nnz) // tile)
    assert len(dec["tile_row"]) == n_tiles + 1
    diagonals = np.minimum(np.arange(n_tiles + 1) * tile, m + nnz)
    np.testing.assert_array_equal(np.stack((dec["tile_row"], dec["tile_nz"])), path[:, diagonals])
    items = np.diff(dec["tile_row"].astype(np.int64) + dec["tile_nz"])
    if n_tiles:
        assert np.all(items[:-1] == tile) and 0 < items[-1] <= tile


# -- a row spanning many tiles, written out: items_per_thread=2, block_size=2 (tiles of 4 items) -----
# rows: 0 empty | 1: e0 .. e19 | 2 empty | 3: e20; a_e = e + 1, x = 1: y = 0, 210, 0, 21.
# The path: end0, e0 .. e19, end1, end2, e20, end3 (25 items). Tile 0 = end0 e0 e1 e2 ends inside row 1
# (carry 1+2+3), tiles 1-4 hold row 1 only (carries 4+5+6+7 ...), tile 5 = e19 end1 end2 e20 closes rows 1
# (with 20) and 2 and ends inside row 3 (carry 21), tile 6 = end3 closes row 3 with nothing of its own.
HAND_INDPTR = np.array([0, 0, 20, 20, 21])
HAND_TILE_ROW = [0, 1, 1, 1, 1, 1, 3, 4]
HAND_TILE_NZ = [0, 3, 7, 11, 15, 19, 21, 21]
HAND_CARRY = [6, 22, 38, 54, 70, 21, 0]
HAND_Y = [0, 210, 0, 21]


def test_hand_example_row_spanning_many_tiles():
    dec = decompose(HAND_INDPTR, items_per_thread=2, block_size=2)
    np.testing.assert_array_equal(dec["tile_row"], HAND_TILE_ROW)
    np.testing.assert_array_equal(dec["tile_nz"], HAND_TILE_NZ)
    y, carry = spmv_reference(HAND_INDPTR, np.arange(1.0, 22.0), dec, items_per_thread=2, block_size=2)
    np.testing.assert_array_equal(carry, HAND_CARRY)
    np.testing.assert_array_equal(y, HAND_Y)
    assert ends_inside_a_row(HAND_INDPTR, dec["tile_row"], dec["tile_nz"])
    # One thread a tile of 4 items, or 4 threads of one item: the same tiles, the same carries.
    dec1 = decompose(HAND_INDPTR, items_per_thread=1, block_size=4)
    np.testing.assert_array_equal(dec1["tile_row"], HAND_TILE_ROW)
    y1, carry1 = spmv_reference(HAND_INDPTR, np.arange(1.0, 22.0), dec1, items_per_thread=1, block_size=4)
    np.testing.assert_array_equal(carry1, HAND_CARRY)
    np.testing.assert_array_equal(y1, HAND_Y)


def test_hand_example_through_the_family():
    A = sp.csr_matrix((np.arange(1.0, 22.0), np.r_[np.arange(20), 0], HAND_INDPTR), shape=(4, 20))
    prepared = FAMILY.prepare_reference(A, {"items_per_thread": 2, "block_size": 64})  # one tile of 128 items
    with pytest.raises(RuntimeError, match="run the prepared matrix once"):
        FAMILY.decomposition(prepared)
    np.testing.assert_array_equal(FAMILY.run_reference(prepared, np.ones(20)), HAND_Y)
    dec = FAMILY.decomposition(prepared)
    np.testing.assert_array_equal(dec["tile_row"], [0, 4])
    np.testing.assert_array_equal(dec["tile_nz"], [0, 21])
    np.testing.assert_array_equal(dec["carry"], [0])


# -- the reference against SciPy ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_scipy_on_hard_cases(name, dtype):
    for params in CPU_CONFIGS:
        _check_against_scipy(_case(name, dtype), dtype, params)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("ipt,block", [(1, 1), (1, 2), (2, 1), (3, 2), (5, 3)])
def test_tiles_far_smaller_than_a_row(name, ipt, block):
    """Tiles of 1 to 15 items: huge_row's row of 5 000 entries spans hundreds of tiles, one_row's all of them."""
    A = _case(name, "float64")
    if not (A.nnz and A.shape[0]):
        return
    x = np.random.default_rng(3).uniform(-1, 1, A.shape[1])
    dec = decompose(A.indptr, items_per_thread=ipt, block_size=block)
    y, carry = spmv_reference(A.indptr, products(A, x), dec, items_per_thread=ipt, block_size=block)
    np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
    # A tile carries only a share of the row it ends in; the last tile ends the path and carries nothing.
    open_tiles = dec["tile_nz"][1:] > A.indptr[np.minimum(dec["tile_row"][1:], A.shape[0])]
    assert not open_tiles[-1] and np.all(carry[~open_tiles] == 0)
    if name == "huge_row":
        assert np.bincount(dec["tile_row"]).max() > 300  # its row of 5 000 entries holds over 300 tile starts


@pytest.mark.parametrize("name", SHARED)
def test_reference_matches_scipy_on_shared_matrices(name, shared_dir):
    for dtype in DTYPES:
        for params in CPU_CONFIGS:
            _check_against_scipy(_case(name, dtype), dtype, params)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.one_of(st.just(0), st.integers(0, 6), st.integers(20, 120)), min_size=1, max_size=80),
    ipt=st.integers(1, 16),
    block=st.integers(1, 8),
)
def test_reference_reproduces_the_product_for_any_geometry(lengths, ipt, block):
    A = _rows(lengths)
    if A.nnz == 0:
        return
    x = np.random.default_rng(1).uniform(-1, 1, A.shape[1])
    dec = decompose(A.indptr, items_per_thread=ipt, block_size=block)
    y, carry = spmv_reference(A.indptr, products(A, x), dec, items_per_thread=ipt, block_size=block)
    np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
    if not ends_inside_a_row(A.indptr, dec["tile_row"], dec["tile_nz"]):
        assert np.all(carry == 0)  # the fix-up, skipped, would have added nothing


# -- when the fix-up runs, and the 32-bit guard ---------------------------------------------------
def test_fixup_needed_only_where_a_tile_ends_inside_a_row():
    # Rows of 63 entries and their ends: 64 items a row, 2 rows a tile of 2 x 64: every tile ends at a row start.
    aligned = _rows([63] * 10)
    dec = decompose(aligned.indptr, items_per_thread=2, block_size=64)
    assert len(dec["tile_row"]) == 6 and not ends_inside_a_row(aligned.indptr, dec["tile_row"], dec["tile_nz"])
    shifted = _rows([64] * 10)  # one item more a row: the tiles drift into the rows
    dec = decompose(shifted.indptr, items_per_thread=2, block_size=64)
    assert ends_inside_a_row(shifted.indptr, dec["tile_row"], dec["tile_nz"])
    one_tile = decompose(shifted.indptr, items_per_thread=16, block_size=512)
    assert len(one_tile["tile_row"]) == 2 and not ends_inside_a_row(shifted.indptr, one_tile["tile_row"],
                                                                     one_tile["tile_nz"])


def test_path_longer_than_32_bit_coordinates_is_refused():
    assert path_length(PATH_MAX - 5, 5) == PATH_MAX
    with pytest.raises(MatrixFormatError, match="32-bit"):
        path_length(PATH_MAX - 4, 5)
    # Both paths check before touching the arrays.
    huge = SimpleNamespace(shape=(2**31 - 10, 3), nnz=10, dtype=np.dtype(np.float64))
    with pytest.raises(MatrixFormatError, match="merge path of 2147483648 items"):
        FAMILY.prepare_reference(huge)


# -- GPU against the reference and SciPy ----------------------------------------------------------
def _gpu_check(A, dtype: str, params: dict) -> None:
    # run twice: the carries are overwritten, y is written whole
    ref, cpu, gpu, expected, _, y = gpu_runs(FAMILY, A, dtype, params)
    bound = 2 * ref.rtol * ref.scale + ref.atol
    assert np.all(np.abs(y - expected) <= bound), f"{params}: GPU differs from its reference"
    if not (A.nnz and A.shape[0]):
        return
    got, want = FAMILY.decomposition(gpu), FAMILY.decomposition(cpu)
    for key in ("tile_row", "tile_nz"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{params}: {key}")
    # A carry is a partial sum of one row: bounded by the same partial sum of |a||x|.
    abs_prods = np.abs(A.data.astype(np.float64)) * np.abs(ref.x.astype(np.float64))[A.indices]
    p = cpu.params
    _, carry_scale = spmv_reference(A.indptr, abs_prods, want, items_per_thread=p["items_per_thread"],
                                    block_size=p["block_size"])
    assert np.all(np.abs(got["carry"] - want["carry"]) <= 2 * ref.rtol * carry_scale + ref.atol), f"{params}: carry"
    assert gpu.extra["fixup"] == ends_inside_a_row(A.indptr, want["tile_row"], want["tile_nz"])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_every_items_per_thread_on_hard_cases(name, dtype):
    for params in GPU_CONFIGS:
        _gpu_check(_case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_on_shared_matrices(dtype, shared_dir):
    for name in SHARED:
        for params in CPU_CONFIGS:
            _gpu_check(_case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_arrow_row_across_thousands_of_tiles(dtype):
    """One row of all 300 000 columns (about 2 300 tiles of 128 items) plus a diagonal: the fix-up sums
    thousands of carries of one row, a warp's worth at a time; aligned rows need no fix-up at all."""
    A = arrow(300_000)
    for params in ({"items_per_thread": 2, "block_size": 64}, FAMILY.space.defaults()):
        _gpu_check(A.astype(dtype), dtype, params)
    _gpu_check(_rows([63] * 200).astype(dtype), dtype, {"items_per_thread": 2, "block_size": 64})
