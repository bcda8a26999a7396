"""The ``nut`` family: its decomposition written out by hand, its invariants on every
shared matrix, its reference y, its memory and preprocessing cost, and (marked ``gpu``)
the GPU arrays and y against the CPU reference."""

from __future__ import annotations

import functools
import time
import types

import numpy as np
import pytest
import scipy.sparse as sp

import kernels.nut as nut
from common.errors import InvalidConfigError
from kernels.nut import STRUCTURE, Nut, build, decode, paper_defaults
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.matrix.io import as_csr
from tuner.measure.verify import Reference

DTYPES = ("float64", "float32")
SMALL = {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 128}
LARGE = {"rows_per_panel": 8192, "cols_per_tile": 16384, "threads": 1024}
SLABBED = {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 256, "slabs": 4, "bands": 4}
CONFIGS = (
    {},
    SMALL,
    {"rows_per_panel": 512, "cols_per_tile": 2048, "threads": 256},
    SLABBED,
    {"rows_per_panel": 4096, "cols_per_tile": 8192, "threads": 512},
    LARGE,
    {"slabs": 8, "bands": 16},
    {"slabs": 2},
)


@functools.cache
def shared(name: str) -> sp.csr_matrix:
    return load_shared(name)


def hand_matrix() -> sp.csr_matrix:
    """10 x 12; values 1..14 in CSR order; rows 2 and 4-7 empty."""
    cols = [[0, 5, 9], [5], [], [1, 5, 7, 11], [], [], [], [], [2, 3, 4, 6], [3, 10]]
    indptr = np.cumsum([0] + [len(c) for c in cols]).astype(np.int32)
    indices = np.array([c for row in cols for c in row], dtype=np.int32)
    data = np.arange(1.0, len(indices) + 1)
    return as_csr(sp.csr_matrix((data, indices, indptr), shape=(10, 12)))


def hand_build(**kw):
    A = hand_matrix()
    args = {"rows_per_panel": 4, "cols_per_tile": 3, "threads": 2, "num_sms": 1, **kw}
    return A, build(A.indptr, A.indices, A.data, A.shape, **args)


def items_nnz(ex: dict) -> np.ndarray:
    """Each work item's nonzeros (0 for an item of no tile)."""
    return np.diff(np.r_[0, np.cumsum(ex["tile_nnz"])][ex["item_tile_ptr"]])


def neg(row: int, slot: int) -> int:
    return ~((row << 16) | slot)


# -- the decomposition, by hand -----------------------------------------------------
def test_hand_made_decomposition_uniform_panels():
    """4 rows a panel (3 panels >= 2 x 1 SM: uniform), 3 active columns a tile, 2 threads.

    Panel 0 (rows 0-3): active columns 0 1 5 7 9 11 -> tiles {0,1,5} and {7,9,11}.
      Tile 0, entries (0,0)=1 (0,5)=2 (1,5)=4 (3,1)=5 (3,5)=6: s=3, w=2; thread 0 takes
      the first three, thread 1 the last two; slots 0->0 1->1 5->2.
      Tile 1, entries (0,9)=3 (3,7)=7 (3,11)=8: s=2, w=2; slots 7->0 9->1 11->2.
    Panel 1 (rows 4-7): empty, no tile.
    Panel 2 (rows 8-9, local 0-1): active columns 2 3 4 6 10 -> tiles {2,3,4} and {6,10}.
      Tile 2, entries (8,2)=9 (8,3)=10 (8,4)=11 (9,3)=13: s=2, w=2.
      Tile 3, entries (8,6)=12 (9,10)=14: s=1, w=2.
    """
    A, got = hand_build()
    expected = {
        "panel_ptr": [0, 4, 8, 10],
        "item_order": [0, 2, 1],  # 8, 0 and 6 nonzeros: most first
        "item_panel": [0, 1, 2],  # each its panel's only item: it stores y
        "item_tile_ptr": [0, 2, 2, 4],  # panel 1's item has no tile (it stores zeros)
        "zero_rows": [],
        "tile_col_ptr": [0, 3, 6, 9, 11],
        "tile_cols": [0, 1, 5, 7, 9, 11, 2, 3, 4, 6, 10],
        "tile_nnz": [5, 3, 4, 2],
        "tile_ptr": [0, 6, 10, 14, 16],
        # Entry j of thread k at tile_ptr + j*w + k; the last slot of tile 0 and of tile 1 is padding.
        "enc_idx": [
            neg(0, 0), neg(3, 1), 2, 2, neg(1, 2), 0,   # tile 0: k0 = (0,0) (0,5) (1,5); k1 = (3,1) (3,5)
            neg(0, 1), neg(3, 2), neg(3, 0), 0,         # tile 1: k0 = (0,9) (3,7); k1 = (3,11)
            neg(0, 0), neg(0, 2), 1, neg(1, 1),         # tile 2: k0 = (8,2) (8,3); k1 = (8,4) (9,3)
            neg(0, 0), neg(1, 1),                       # tile 3: k0 = (8,6); k1 = (9,10)
        ],
        "enc_val": [1, 5, 2, 6, 4, 0, 3, 8, 7, 0, 9, 11, 10, 13, 12, 14],
    }
    for key, value in expected.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert got["enc_idx"].dtype == np.int32 and got["tile_ptr"].dtype == np.int64
    assert got["enc_val"].dtype == np.float64
    assert (got["max_panel_rows"], got["max_tile_cols"]) == (4, 3) and not got["zero_all"]
    assert neg(1, 2) == -65539 and neg(3, 1) == -196610  # the words as the kernel sees them

    rows, cols, vals = decode(got, threads=2)
    np.testing.assert_array_equal(rows, [0, 0, 1, 3, 3, 0, 3, 3, 8, 8, 8, 9, 8, 9])
    np.testing.assert_array_equal(cols, [0, 5, 5, 1, 5, 9, 7, 11, 2, 3, 4, 3, 6, 10])
    np.testing.assert_array_equal(vals, [1, 2, 4, 5, 6, 3, 7, 8, 9, 10, 11, 13, 12, 14])
    x = np.arange(1.0, 13.0)
    f = Nut(num_sms=1)
    assert np.allclose(np.bincount(rows, vals * x[cols], minlength=10), A @ x)
    p = f.prepare_reference(A, {"threads": 128})
    np.testing.assert_allclose(f.run_reference(p, x), A @ x, rtol=1e-15)


def test_hand_made_balanced_panels():
    """With 2 SMs, 4 panels are wanted but 4-row panels give 3: cut at 14*k//4 = 3, 7, 10 nonzeros.

    indptr = 0 3 4 4 8 8 8 8 8 12 14: the first rows reaching those counts are 1, 4 and 9,
    so the panels are rows 0 | 1-3 | 4-8 | 9; 4-8 has 5 rows > 4 and is cut into 4-7 | 8.
    """
    _, got = hand_build(num_sms=2)
    np.testing.assert_array_equal(got["panel_ptr"], [0, 1, 4, 8, 9, 10])
    np.testing.assert_array_equal(got["item_panel"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(got["item_tile_ptr"], [0, 1, 3, 3, 5, 6])  # panel 2 (rows 4-7): no tile
    np.testing.assert_array_equal(got["item_order"], [1, 3, 0, 4, 2])  # 3 5 0 4 2 nonzeros: most first
    assert got["zero_rows"].size == 0 and not got["zero_all"]
    np.testing.assert_array_equal(got["tile_cols"], [0, 5, 9, 1, 5, 7, 11, 2, 3, 4, 6, 3, 10])
    np.testing.assert_array_equal(got["tile_col_ptr"], [0, 3, 6, 7, 10, 11, 13])
    np.testing.assert_array_equal(got["tile_nnz"], [3, 4, 1, 3, 1, 2])
    # Tile 1 = rows 1 and 3 (local 0 and 2) over columns 1 5 7: (1,5) (3,1) | (3,5) (3,7).
    t1 = got["enc_idx"][got["tile_ptr"][1] : got["tile_ptr"][2]]
    np.testing.assert_array_equal(t1, [neg(0, 1), neg(2, 1), neg(2, 0), 2])


def test_hand_made_slabs_and_bands():
    """3 slabs of 4 columns (slab = c // 4) and 2 bands over the panels of the first example.

    Panel 0: slab 0 {0,1}: (0,0)=1 (3,1)=5 | slab 1 {5,7}: (0,5)=2 (1,5)=4 (3,5)=6 (3,7)=7 |
    slab 2 {9,11}: (0,9)=3 (3,11)=8. Panel 1: no tile in any slab. Panel 2: slab 0 {2,3}:
    (8,2)=9 (8,3)=10 (9,3)=13 | slab 1 {4,6}: (8,4)=11 (8,6)=12 | slab 2 {10}: (9,10)=14.
    Bands: rows 0-4 and 5-9 hold the first rows of panels 0-1 and 2.
    """
    A, got = hand_build(slabs=3, bands=2)
    np.testing.assert_array_equal(got["item_tile_ptr"], [0, 1, 2, 3, 3, 4, 5, 6])  # a group a tile here
    np.testing.assert_array_equal(got["item_panel"], [~0, ~0, ~0, 1, ~2, ~2, ~2])  # panels 0, 2 add to y
    # Band 0 (panels 0, 1) slab by slab, slab 0 heaviest first (2 nonzeros, then the empty panel), then band 1.
    np.testing.assert_array_equal(got["item_order"], [0, 3, 1, 2, 4, 5, 6])
    assert got["zero_all"] and got["zero_rows"].size == 0  # rows 0-3 and 8-9: over half of y
    np.testing.assert_array_equal(got["tile_cols"], [0, 1, 5, 7, 9, 11, 2, 3, 4, 6, 10])
    np.testing.assert_array_equal(got["tile_col_ptr"], [0, 2, 4, 6, 8, 10, 11])
    np.testing.assert_array_equal(got["tile_nnz"], [2, 4, 2, 3, 2, 1])
    # Tile 1, (0,5) (1,5) (3,5) (3,7) with s=2, w=2: thread 0 takes rows 0 and 1, thread 1 row 3.
    t1 = got["enc_idx"][got["tile_ptr"][1] : got["tile_ptr"][2]]
    np.testing.assert_array_equal(t1, [neg(0, 0), neg(3, 0), neg(1, 0), 1])
    rows, cols, vals = decode(got, threads=2)
    np.testing.assert_array_equal(rows, [0, 3, 0, 1, 3, 3, 0, 3, 8, 8, 9, 8, 8, 9])
    np.testing.assert_array_equal(cols, [0, 1, 5, 5, 5, 7, 9, 11, 2, 3, 3, 4, 6, 10])
    x = np.arange(1.0, 13.0)
    np.testing.assert_allclose(simulate_kernel(got, x, 2, A.shape[0]), A @ x, rtol=1e-15)
    # With one band, slab 0 of all panels comes first, heaviest first (3, 2, 0 nonzeros), and so on.
    _, one_band = hand_build(slabs=3)
    np.testing.assert_array_equal(one_band["item_order"], [4, 0, 3, 1, 5, 2, 6])


def test_hand_made_items_of_a_cut_panel():
    """A cap of 3 nonzeros cuts each panel of the first example at its second tile (which starts at
    entry 5 of panel 0 and entry 4 of panel 2): four items, all adding to y, heaviest first."""
    A, got = hand_build(max_item_nnz=3)
    np.testing.assert_array_equal(got["item_tile_ptr"], [0, 1, 2, 2, 3, 4])
    np.testing.assert_array_equal(got["item_panel"], [~0, ~0, 1, ~2, ~2])
    np.testing.assert_array_equal(got["item_order"], [0, 3, 1, 4, 2])  # 5 3 0 4 2 nonzeros
    assert got["zero_all"]  # rows 0-3 and 8-9: over half of y
    x = np.arange(1.0, 13.0)
    np.testing.assert_allclose(simulate_kernel(got, x, 2, A.shape[0]), A @ x, rtol=1e-15)
    # A cap of 6: panel 0's tiles start at entries 0 and 5 (one item), panel 2's at 0 and 4 (one item).
    _, whole = hand_build(max_item_nnz=6)
    np.testing.assert_array_equal(whole["item_panel"], [0, 1, 2])
    with pytest.raises(InvalidConfigError, match="max_item_nnz"):
        hand_build(max_item_nnz=0)


HUB = {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 128}


def hub_matrix() -> sp.csr_matrix:
    """One row of 60 000 entries among 20 000 rows of 3 (random columns of 100 000)."""
    rng = np.random.default_rng(0)
    rows = [rng.choice(100_000, 60_000, replace=False)] + [rng.choice(100_000, 3) for _ in range(20_000)]
    indptr = np.cumsum([0] + [len(r) for r in rows])
    cols = np.concatenate(rows)
    return as_csr(sp.csr_matrix((rng.uniform(-1, 1, len(cols)), cols, indptr), shape=(20_001, 100_000)))


def test_a_hub_row_is_cut_into_many_items():
    """The hub row's panel holds half the nonzeros; with 4 SMs the default cap cuts it into items no
    larger than the cap plus a tile, each adding to y; the other panels stay whole."""
    A, rng = hub_matrix(), np.random.default_rng(1)
    params = {**HUB, "num_sms": 4}
    ex = build(A.indptr, A.indices, A.data, A.shape, **params)
    cap = nut.item_cap(A.nnz, len(ex["panel_ptr"]) - 1, 4)
    item_panel = ex["item_panel"]
    hub = item_panel == ~0
    assert hub.sum() >= 60_000 // cap and np.all(item_panel[~hub] >= 0)
    item_nnz = items_nnz(ex)
    assert item_nnz.max() <= cap + ex["tile_nnz"].max()
    assert np.all(np.diff(item_nnz[ex["item_order"]]) <= 0)  # one band, one slab: heaviest first
    np.testing.assert_array_equal(ex["zero_rows"], np.arange(ex["panel_ptr"][1]))  # the hub's panel
    x = rng.uniform(-1, 1, A.shape[1])
    f = Nut(num_sms=4)
    p = f.prepare_reference(A, {k: v for k, v in params.items() if k != "num_sms"})
    np.testing.assert_allclose(f.run_reference(p, x), A @ x, rtol=1e-12)


def test_item_starts_cut_a_costly_group_where_it_shortens_a_large_launch():
    """A group of four 1 M-cost tiles among small ones (4 blocks at once) is cut into pieces of about half a share (a
    tile each: a tile is never cut), beside ``item_cap``'s cuts; not where a share is under ``MIN_SHARE`` (the same
    at a ten-thousandth of the cost), nor where an uncut tile as costly as the group would still end the launch
    (``CUT_GAIN``)."""
    for tile, cut in ((1_000_000, True), (100, False)):
        tile_nnz = np.array([tile] * 4 + [10] * 8)
        group_tile_ptr = np.array([0, 4, *range(5, 13)])
        starts = nut.item_starts(tile_nnz, np.zeros(12, dtype=np.int64), group_tile_ptr, cap=10**12, slots=4)
        assert starts.tolist() == ([True] * 4 if cut else [True] + [False] * 3) + [True] * 8
    tile_nnz = np.array([4_000_000] + [1_000_000] * 4)  # group 0 a single tile as costly as group 1's four
    starts = nut.item_starts(tile_nnz, np.zeros(5, dtype=np.int64), np.array([0, 1, 5]), cap=10**12, slots=4)
    assert starts.tolist() == [True, True, False, False, False]
    hub_cap = nut.item_starts(tile_nnz, np.zeros(5, dtype=np.int64), np.array([0, 1, 5]), cap=2_000_000, slots=4)
    assert hub_cap.tolist() == [True, True, False, True, False]  # item_cap's cuts stay


def long_rows_matrix() -> sp.csr_matrix:
    """8 rows of 200 000 columns: one of 40 000 random entries, seven of 5 000 (each entry a column of its own)."""
    rng = np.random.default_rng(5)
    lengths = [40_000] + [5_000] * 7
    cols = np.concatenate([np.sort(rng.choice(200_000, n, replace=False)) for n in lengths])
    indptr = np.cumsum([0, *lengths])
    return as_csr(sp.csr_matrix((rng.uniform(-1, 1, cols.size), cols, indptr), shape=(8, 200_000)))


LONG = {"rows_per_panel": 8192, "cols_per_tile": 4096, "threads": 1024}


def test_panels_costlier_than_a_share_are_cut_where_item_cap_leaves_them_whole(monkeypatch):
    """With 2 SMs (4 blocks of 1024 threads at once) the long row's panel costs twice a share: the share rule cuts it,
    and the next one, into items of half a share or a tile more, where ``item_cap`` alone (4 times the mean panel)
    left all three whole; the product is exact either way."""
    A, f = long_rows_matrix(), Nut(num_sms=2)
    cut = f.prepare_reference(A, LONG)
    monkeypatch.setattr(nut, "MIN_SHARE", float("inf"))
    whole = f.prepare_reference(A, LONG)
    assert np.all(whole.extra["item_panel"] >= 0) and whole.extra["item_order"].size == 3
    ex = cut.extra
    cost = ex["tile_nnz"] + nut.GATHER_COST * np.diff(ex["tile_col_ptr"])
    share = cost.sum() / nut.resident_blocks(LONG["threads"], (ex["max_panel_rows"] + ex["max_tile_cols"]) * 8, 2)
    item_cost = np.diff(np.r_[0, np.cumsum(cost)][ex["item_tile_ptr"]])
    pieces = ex["item_panel"] < 0
    assert np.sum(ex["item_panel"] == ~0) >= 4 and item_cost[pieces].max() <= share / 2 + cost.max()
    x = np.random.default_rng(6).uniform(-1, 1, A.shape[1])
    for p in (cut, whole):
        np.testing.assert_allclose(f.run_reference(p, x), A @ x, rtol=1e-12, atol=1e-12)


def dense_block_matrix() -> sp.csr_matrix:
    """A tridiagonal 40 000 x 40 000 matrix with a dense 600 x 600 block in its corner (360 000 of its ~480 000
    nonzeros): rows narrower than a tile, so a panel of them is one tile."""
    rng = np.random.default_rng(3)
    band = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], shape=(40_000, 40_000), format="lil")
    band[:600, :600] = rng.uniform(-1, 1, (600, 600))
    return as_csr(band.tocsr())


def test_a_panel_of_dense_rows_is_cut_into_panels():
    """The first two panels (256 dense rows of 600 entries each: one tile of ten work-item caps) are cut by rows
    into pieces of a cap and a row at most; the third (88 dense rows: a tile of 3.5 caps, under
    ``DENSE_TILE_CAPS``) and the tridiagonal's panels stay whole, and the product is exact."""
    A, rng = dense_block_matrix(), np.random.default_rng(4)
    ex = build(A.indptr, A.indices, A.data, A.shape, **HUB, num_sms=4)
    uniform = -(-A.shape[0] // HUB["rows_per_panel"])
    cap = nut.item_cap(A.nnz, uniform, 4)
    assert A.indptr[256] > nut.DENSE_TILE_CAPS * cap > A.indptr[600] - A.indptr[512]
    panel_ptr = ex["panel_ptr"].astype(np.int64)
    cut = panel_ptr[panel_ptr < 512]
    assert len(cut) >= 20 and np.diff(A.indptr[np.append(cut, 512)]).max() <= cap + 600
    np.testing.assert_array_equal(panel_ptr[panel_ptr >= 512], np.arange(512, A.shape[0], 256).tolist() + [A.shape[0]])
    assert ex["tile_nnz"].max() < nut.DENSE_TILE_CAPS * cap
    f = Nut(num_sms=4)
    x = rng.uniform(-1, 1, A.shape[1])
    np.testing.assert_allclose(f.run_reference(f.prepare_reference(A, HUB), x), A @ x, rtol=1e-12)


def test_a_corrupt_encoding_is_caught_by_decode():
    _, got = hand_build()
    bad = dict(got, enc_idx=got["enc_idx"].copy())
    bad["enc_idx"][1] = 1  # thread 1 of tile 0 would start without a row
    with pytest.raises(ValueError, match="negative"):
        decode(bad, threads=2)
    bad = dict(got, enc_idx=got["enc_idx"].copy())
    bad["enc_idx"][2] = 3  # slot 3 of a 3-column tile
    with pytest.raises(ValueError, match="active columns"):
        decode(bad, threads=2)


def test_the_cupy_code_path_builds_the_same_arrays(monkeypatch, shared_dir):
    """``build`` with a stand-in for CuPy (NumPy functions, but not ``numpy`` itself) takes the
    searchsorted expansion and the array-method argsort that CuPy takes; it must agree. (On the GPU the
    passes over the entries are nut.cu's kernels instead: the GPU tests compare their arrays.)"""
    fake = types.SimpleNamespace(
        **{n: getattr(np, n) for n in ("int32", "int64", "asarray", "zeros", "ones", "empty", "arange", "bincount",
                                      "concatenate", "cumsum", "diff", "nonzero", "searchsorted", "where")}
    )
    monkeypatch.setattr(nut, "stable_argsort", lambda xp, key: np.argsort(key, kind="stable"))
    for A in (hand_matrix(), CASES["empty_rows"](), CASES["huge_row"](), shared("Maragal_6")):
        for params in (dict(SMALL, num_sms=132), dict(rows_per_panel=4, cols_per_tile=3, threads=2, num_sms=1)):
            want = build(A.indptr, A.indices, A.data, A.shape, **params)
            got = build(A.indptr, A.indices, A.data, A.shape, **params, xp=fake)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def simulate_kernel(ex: dict, x: np.ndarray, threads: int, m: int) -> np.ndarray:
    """nut.cu's nut_spmv, launched as Nut._run launches it (y cleared where asked, then the
    items in ``item_order``), statement by statement, one thread after the other (small
    matrices only).

    Also checks the one claim the kernel's speed rests on: a row it adds without an atomic
    (``owned``) is touched by no other thread of the block in that tile.
    """
    y = np.full(m, np.nan)
    if ex["zero_all"]:
        y[:] = 0
    y[ex["zero_rows"]] = 0
    panel_ptr, item_tile_ptr, tile_col_ptr = ex["panel_ptr"], ex["item_tile_ptr"], ex["tile_col_ptr"]
    assert sorted(ex["item_order"]) == list(range(len(item_tile_ptr) - 1))
    for item in ex["item_order"]:
        code = int(ex["item_panel"][item])
        add, p = code < 0, (~code if code < 0 else code)
        r0, nr = panel_ptr[p], panel_ptr[p + 1] - panel_ptr[p]
        ys = np.zeros(ex["max_panel_rows"])
        for t in range(item_tile_ptr[item], item_tile_ptr[item + 1]):
            c0, nc = tile_col_ptr[t], tile_col_ptr[t + 1] - tile_col_ptr[t]
            xs = np.full(ex["max_tile_cols"], np.nan)
            xs[:nc] = x[ex["tile_cols"][c0 : c0 + nc]]
            e = int(ex["tile_nnz"][t])
            s = (e + threads - 1) // threads
            w = (e + s - 1) // s
            plain: dict[int, set] = {}
            touched: dict[int, set] = {}
            for k in range(min(w, threads)):
                count = min(s, e - k * s)
                base = int(ex["tile_ptr"][t]) + k
                code = ~int(ex["enc_idx"][base])
                assert code >= 0
                row, total = code >> 16, ex["enc_val"][base] * xs[code & 0xFFFF]
                owned = False
                touched[k], plain[k] = {row}, set()
                for j in range(1, count):
                    word, v = int(ex["enc_idx"][base + j * w]), ex["enc_val"][base + j * w]
                    if word < 0:
                        ys[row] += total
                        if owned:
                            plain[k].add(row)
                        owned = True
                        code = ~word
                        row, total = code >> 16, v * xs[code & 0xFFFF]
                        touched[k].add(row)
                    else:
                        total += v * xs[word]
                ys[row] += total
            for k, rows in plain.items():
                others = set().union(*(touched[o] for o in touched if o != k))
                assert not rows & others, f"tile {t}: rows {rows & others} added without an atomic are shared"
        if add:
            touched = ys[:nr] != 0
            y[r0 : r0 + nr][touched] += ys[:nr][touched]
        else:
            y[r0 : r0 + nr] = ys[:nr]
    return y


def test_the_kernel_walk_simulated_thread_by_thread():
    cases = [hand_matrix(), *(CASES[n]() for n in ("one_row", "one_column", "empty_rows", "huge_row"))]
    for A in cases:
        x = np.random.default_rng(1).uniform(-1, 1, A.shape[1])
        for params in ({"rows_per_panel": 4, "cols_per_tile": 3, "threads": 2},
                       {"rows_per_panel": 4, "cols_per_tile": 3, "threads": 2, "slabs": 3, "bands": 2},
                       {"rows_per_panel": 64, "cols_per_tile": 200, "threads": 32, "slabs": 8, "bands": 4},
                       {"rows_per_panel": 16, "cols_per_tile": 8, "threads": 4, "max_item_nnz": 20},
                       {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 128}):
            for sms in (1, 132):
                ex = build(A.indptr, A.indices, A.data, A.shape, **params, num_sms=sms)
                y = simulate_kernel(ex, x, params["threads"], A.shape[0])
                np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)


# -- the space --------------------------------------------------------------------------
def test_adapt_fits_the_slabs_to_the_l2_and_then_the_panels_to_the_slabs():
    """x in a third of the L2 a slab (at most 4); cut into slabs, panels of at least 32 KB of y, never fewer
    rows than asked; a config that fits already: None."""
    f, l2 = Nut(), 50 << 20
    small = {"rows_per_panel": 2048, "cols_per_tile": 4096, "threads": 512}
    assert f.adapt(small, cols=2_000_000, itemsize=8, l2_bytes=l2) is None  # x of 16 MB: one slab, as asked
    wide = f.adapt(small, cols=8_000_000, itemsize=8, l2_bytes=l2)
    assert (wide["slabs"], wide["rows_per_panel"], wide["cols_per_tile"], wide["threads"]) == (4, 4096, 4096, 512)
    assert f.adapt(small, cols=8_000_000, itemsize=4, l2_bytes=l2)["rows_per_panel"] == 8192
    assert f.adapt({**small, "rows_per_panel": 8192}, cols=8_000_000, itemsize=8, l2_bytes=l2)["rows_per_panel"] == 8192
    assert f.adapt(wide, cols=8_000_000, itemsize=8, l2_bytes=l2) is None
    assert f.adapt(small, cols=80_000_000, itemsize=8, l2_bytes=l2)["slabs"] == nut.FIT_SLABS
    assert f.adapt(small, cols=8_000_000, itemsize=8, l2_bytes=0) is None  # L2 unknown


@pytest.mark.parametrize(("asked", "itemsize", "fitted"), [
    ((8192, 16384), 8, (8192, 4096)),  # 192 KB asked: the tile narrowed to 96 KB in all
    ((2048, 16384), 8, (4096, 8192)),  # the panel grown to 32 KB of y, the tile narrowed to fit beside it
    ((8192, 16384), 4, (8192, 16384)),  # 96 KB: fits as asked
    ((2048, 1024), 8, (4096, 1024)),  # a narrow tile is never widened
])
def test_adapt_narrows_the_tiles_of_a_config_cut_into_slabs_to_two_blocks_an_sm(asked, itemsize, fitted):
    rows, cols = asked
    out = Nut().adapt({"rows_per_panel": rows, "cols_per_tile": cols, "threads": 1024}, cols=40_000_000,
                      itemsize=itemsize, l2_bytes=50 << 20)
    assert out["slabs"] > 1 and (out["rows_per_panel"], out["cols_per_tile"]) == fitted
    assert (out["rows_per_panel"] + out["cols_per_tile"]) * itemsize <= nut.FIT_SHARED_BYTES
    one_slab = Nut().adapt({"rows_per_panel": rows, "cols_per_tile": cols, "threads": 1024}, cols=1000,
                           itemsize=itemsize, l2_bytes=50 << 20)
    assert one_slab is None  # x in the L2: nothing fitted, however wide the tile


def test_space_and_paper_defaults():
    f = Nut()
    assert paper_defaults("float64") == (2048, 4096) and paper_defaults("float32") == (4096, 8192)
    d = f.space.defaults()
    assert d == {"rows_per_panel": 2048, "cols_per_tile": 4096, "threads": 1024, "slabs": 1}
    assert (d["rows_per_panel"], d["cols_per_tile"]) == paper_defaults("float64")
    r32, c32 = paper_defaults("float32")
    assert r32 in nut.ROWS_PER_PANEL and c32 in nut.COLS_PER_TILE
    # Every config fits Hopper's 227 KB of shared memory per block in float64.
    assert (max(nut.ROWS_PER_PANEL) + max(nut.COLS_PER_TILE)) * 8 <= 227 * 1024
    assert max(nut.ROWS_PER_PANEL) <= nut._MAX_ROWS and max(nut.COLS_PER_TILE) <= nut._MAX_SLOTS
    assert len(f.space.configs()) == 120 * (1 + 3 * 5)  # bands only with more than one slab
    assert f.name_expressions("float32")[:2] == ("nut_spmv<float>", "nut_encode<float>")
    assert set(f.name_expressions("float32")[2:]) == {
        "nut_slots", "nut_bit_counts", "nut_bit_ranks", "nut_bit_list", "nut_chunk_ranks",
        *(f"{k}<{t}>" for k in ("nut_keys", "nut_runs", "nut_actives", "nut_mark", "nut_uids")
          for t in ("int", "long long"))}
    with pytest.raises(InvalidConfigError, match="allowed"):
        f.space.validate({"cols_per_tile": 3})


# -- invariants on every shared matrix -----------------------------------------------------
def check_invariants(A, ex: dict, params: dict) -> None:
    R, C, T = params["rows_per_panel"], params["cols_per_tile"], params["threads"]
    K = params.get("slabs", 1)
    m, n = A.shape
    panel_ptr, item_tile_ptr = ex["panel_ptr"].astype(np.int64), ex["item_tile_ptr"].astype(np.int64)
    tile_col_ptr, tile_cols = ex["tile_col_ptr"].astype(np.int64), ex["tile_cols"]
    e = ex["tile_nnz"].astype(np.int64)
    n_tiles, n_panels = len(e), len(panel_ptr) - 1
    # Panels cover the rows, in order, at most R rows each.
    assert panel_ptr[0] == 0 and panel_ptr[-1] == m
    assert np.all(np.diff(panel_ptr) >= 1) and np.all(np.diff(panel_ptr) <= R)
    # Items: runs of at least one tile covering the tiles in order, panel by panel; a tile's group is its
    # (panel, slab), the slab read from its columns, and the groups follow each other in order too.
    assert item_tile_ptr[0] == 0 and item_tile_ptr[-1] == n_tiles and np.all(np.diff(item_tile_ptr) >= 0)
    code = ex["item_panel"].astype(np.int64)
    item_panel = np.where(code < 0, ~code, code)
    items_of_panel = np.bincount(item_panel, minlength=n_panels)
    assert np.all(items_of_panel >= 1) and np.all(np.diff(item_panel) >= 0)
    np.testing.assert_array_equal(code < 0, items_of_panel[item_panel] > 1)  # several items: they add to y
    # An item of no tile is the only item of a panel without entries.
    no_tile = np.diff(item_tile_ptr) == 0
    np.testing.assert_array_equal(no_tile, np.diff(A.indptr[panel_ptr])[item_panel] == 0)
    ncols = np.diff(tile_col_ptr)
    item_of_tile = np.repeat(np.arange(len(item_panel)), np.diff(item_tile_ptr))
    tile_of_col = np.repeat(np.arange(n_tiles), ncols)
    slab_of_col = tile_cols.astype(np.int64) * K // n
    slab = slab_of_col[tile_col_ptr[:-1]]
    assert np.all(slab_of_col == slab[tile_of_col])  # a tile's columns lie in one slab
    group = item_panel[item_of_tile] * K + slab
    assert np.all(np.diff(group) >= 0)
    first = np.r_[True, group[1:] != group[:-1]]
    assert np.all(np.isin(np.flatnonzero(first), item_tile_ptr[:-1]))  # an item never spans two groups
    # Each tile has exactly C active columns but a group's last, which has 1..C.
    last = np.r_[group[1:] != group[:-1], True]
    assert np.all(ncols[~last] == C) and np.all((ncols[last] >= 1) & (ncols[last] <= C))
    assert np.all(e >= 1) and len(tile_cols) == tile_col_ptr[-1]
    # A panel's tiles list its active columns once each, ascending (the indirection arrays).
    colkey = item_panel[item_of_tile][tile_of_col].astype(np.int64) * n + tile_cols
    assert np.all(np.diff(colkey) > 0)
    rows_of = np.repeat(np.arange(m), np.diff(A.indptr))
    panel_of_row = np.repeat(np.arange(n_panels), np.diff(panel_ptr))
    np.testing.assert_array_equal(colkey, np.unique(panel_of_row[rows_of].astype(np.int64) * n + A.indices))
    # Cleared rows: exactly those of panels with several items (all of y, or the list).
    cleared = np.repeat(items_of_panel > 1, np.diff(panel_ptr))
    if ex["zero_all"]:
        assert ex["zero_rows"].size == 0 and 2 * cleared.sum() >= m
    else:
        np.testing.assert_array_equal(ex["zero_rows"], np.flatnonzero(cleared))
    # Order: every item once; band by band (of panels), slab by slab, inside each the most nonzeros first.
    order = ex["item_order"].astype(np.int64)
    np.testing.assert_array_equal(np.sort(order), np.arange(len(item_panel)))
    item_nnz = items_nnz(ex)
    item_slab = np.where(no_tile, 0, slab[np.minimum(item_tile_ptr[:-1], n_tiles - 1)])  # no tile: slab 0
    band = np.searchsorted(nut._band_starts(panel_ptr, m, params.get("bands", 1)), item_panel, side="right")
    launch = (band * K + item_slab)[order]
    assert np.all(np.diff(launch) >= 0)
    same = np.diff(launch) == 0
    assert np.all(np.diff(item_nnz[order])[same] <= 0)
    # Storage: s*w slots a tile, padding zero; max sizes as reported.
    s = (e + T - 1) // T
    w = (e + s - 1) // s
    np.testing.assert_array_equal(np.diff(ex["tile_ptr"]), s * w)
    assert ex["max_panel_rows"] == np.diff(panel_ptr).max() and ex["max_tile_cols"] == ncols.max()
    # Every nonzero decoded exactly once, with its value; the padding is never read and zero.
    rows, cols, vals = decode(ex, threads=T)
    order = np.lexsort((cols, rows))
    np.testing.assert_array_equal(rows[order], rows_of)
    np.testing.assert_array_equal(cols[order], A.indices)
    np.testing.assert_array_equal(vals[order], A.data)
    unread = np.ones(len(ex["enc_idx"]), dtype=bool)
    tile = np.repeat(np.arange(n_tiles), e)
    q = np.arange(len(tile)) - np.repeat(np.cumsum(e) - e, e)
    unread[ex["tile_ptr"][tile] + (q % s[tile]) * w[tile] + q // s[tile]] = False
    assert unread.sum() == ex["tile_ptr"][-1] - A.nnz
    assert np.all(ex["enc_idx"][unread] == 0) and np.all(ex["enc_val"][unread] == 0)


@pytest.mark.parametrize("params", [{}, SMALL, LARGE, SLABBED], ids=["default", "small", "large", "slabbed"])
def test_invariants_on_every_shared_matrix(params, shared_dir):
    f = Nut()
    config = f.space.validate(params)
    for name in shared_cases():
        A = shared(name)
        prepared = f.prepare_reference(A, config)
        if A.nnz:
            check_invariants(A, prepared.extra, config)


def test_invariants_on_hard_cases_with_small_sizes():
    """Tiny panels and tiles (not in the space, through ``build``) make many of each."""
    for make in CASES.values():
        A = make()
        if not (A.nnz and A.shape[0]):
            continue
        for params in ({"rows_per_panel": 7, "cols_per_tile": 5, "threads": 3},
                       {"rows_per_panel": 7, "cols_per_tile": 5, "threads": 3, "slabs": 3, "bands": 5},
                       {"rows_per_panel": 1, "cols_per_tile": 1, "threads": 32, "slabs": 8, "bands": 16}):
            for sms in (1, 132):
                ex = build(A.indptr, A.indices, A.data, A.shape, **params, num_sms=sms)
                check_invariants(A, ex, params)


def test_invariants_where_the_sort_keys_need_64_bits():
    """(panel, column) keys of a matrix 2^30 columns wide, 64 one-row panels: past int32, sorted as int64."""
    rng = np.random.default_rng(7)
    A = as_csr(sp.random(64, 1 << 30, density=3e-9, format="csr", random_state=rng))
    params = {"rows_per_panel": 1, "cols_per_tile": 4, "threads": 3}
    assert A.nnz > 100 and 64 * A.shape[1] > np.iinfo(np.int32).max
    check_invariants(A, build(A.indptr, A.indices, A.data, A.shape, **params, num_sms=1), params)


# -- the reference y -----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_y_on_hard_cases(name, dtype):
    A = CASES[name]().astype(dtype)
    ref = Reference.build(A, dtype, seed=3)
    f = Nut()
    for params in (*CONFIGS, *f.space.configs()[::97]):
        y = f.run_reference(f.prepare_reference(A, params), ref.x)
        assert y.dtype == np.dtype(dtype) and y.shape == (A.shape[0],)
        ok, _, msg = ref.check(y)
        assert ok, f"{name} {params}: {msg}"


def test_reference_y_on_every_shared_matrix(shared_dir):
    f = Nut()
    for name in shared_cases():
        A = shared(name)
        for dtype in DTYPES:
            B = A.astype(dtype)
            ref = Reference.build(B, dtype, seed=4)
            for params in CONFIGS[:3]:
                ok, _, msg = ref.check(f.run_reference(f.prepare_reference(B, params), ref.x))
                assert ok, f"{name} {dtype} {params}: {msg}"


def test_reference_y_with_uniform_panels_and_an_empty_panel():
    """num_sms=1 keeps uniform panels on small matrices (the balanced rule needs 2 x SMs)."""
    A = CASES["empty_rows"]()
    A = as_csr(sp.vstack([A, sp.csr_matrix((600, A.shape[1])), A]).tocsr())
    f = Nut(num_sms=1)
    p = f.prepare_reference(A, SMALL)
    # Rows 500..1099 are empty: panels 2 and 3 (rows 512-767, 768-1023) have one item of no tile each.
    ex = p.extra
    no_tile = np.flatnonzero(np.diff(ex["item_tile_ptr"]) == 0)
    np.testing.assert_array_equal(ex["panel_ptr"][ex["item_panel"][no_tile]], [512, 768])
    ref = Reference.build(A, "float64", seed=5)
    ok, _, msg = ref.check(f.run_reference(p, ref.x))
    assert ok, msg


# -- memory and preprocessing cost ------------------------------------------------------------
def test_memory_ratio(shared_dir):
    """NuT stores every entry once (index + value, like CSR's indices + data) plus the tiles'
    indirection arrays (at most one int per entry), the stretch padding and a few words per
    panel and tile; it has no row pointer. So nnz·(4+v) <= bytes <= nnz·(8+v) + padding + tables."""
    f = Nut()
    for name in ("bcsstk16", "G3_circuit", "lp_fit2d", "LFAT5_hypersparse", "arrow"):
        A = shared(name)
        for params in ({}, SMALL):
            p = f.prepare_reference(A, params)
            ex, v = p.extra, A.data.itemsize
            csr = A.indptr.nbytes + A.indices.nbytes + A.data.nbytes
            ratio = f.memory_ratio(p)
            assert ratio == sum(ex[k].nbytes for k in STRUCTURE) / csr
            padding = int(ex["tile_ptr"][-1]) - A.nnz
            n_panels, n_items, n_tiles = len(ex["panel_ptr"]) - 1, len(ex["item_panel"]), len(ex["tile_nnz"])
            # panel_ptr; item_order, item_panel, item_tile_ptr; zero_rows; tile_col_ptr, tile_nnz, tile_ptr
            tables = 4 * (n_panels + 1) + 12 * n_items + 4 + 4 * ex["zero_rows"].size + 16 * n_tiles + 12
            assert A.nnz * (4 + v) / csr <= ratio <= (A.nnz * (8 + v) + padding * (4 + v) + tables) / csr
            s = (ex["tile_nnz"].astype(np.int64) + p.params["threads"] - 1) // p.params["threads"]
            assert padding <= int((s - 1).sum())  # less than one stretch a tile
            print(f"nut memory ratio {name:18s} {str(params or 'default'):70s} {ratio:.3f}")
    assert f.memory_ratio(f.prepare_reference(CASES["zero_nnz"]())) == 0.0


def test_preprocessing_reference_time_on_a_million_rows():
    from tuner.matrix.generate import generate

    A = generate("powerlaw", rows=1_000_000, seed=0)
    f = Nut()
    start = time.perf_counter()
    p = f.prepare_reference(A)
    elapsed = time.perf_counter() - start
    x = np.random.default_rng(0).uniform(-1, 1, A.shape[1])
    start = time.perf_counter()
    y = f.run_reference(p, x)
    run = time.perf_counter() - start
    print(
        f"nut reference on powerlaw 1M rows, nnz {A.nnz}: prepare {elapsed:.2f} s, run {run:.2f} s, "
        f"{len(p.extra['panel_ptr']) - 1} panels, {len(p.extra['tile_nnz'])} tiles, "
        f"memory ratio {f.memory_ratio(p):.3f}"
    )
    ok, _, msg = Reference.build(A, "float64", seed=0).check(y)
    assert ok, msg


# -- GPU against the CPU reference ------------------------------------------------------------
GPU_CONFIGS = CONFIGS


def _gpu_check(f: Nut, A, dtype: str, params: dict) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    A = A.astype(dtype)
    ref = Reference.build(A, dtype, seed=2)
    cpu = f.prepare_reference(A, params)
    gpu = f.prepare(cusp.csr_matrix(A), params)
    for key in (*STRUCTURE, "max_panel_rows", "max_tile_cols", "zero_all"):
        if key in cpu.extra:
            got = gpu.extra[key]
            got = got.get() if isinstance(got, cupy.ndarray) else got
            np.testing.assert_array_equal(got, cpu.extra[key], err_msg=f"{key} {params}")
            assert np.asarray(got).dtype == np.asarray(cpu.extra[key]).dtype, key
    assert set(cpu.extra) <= set(gpu.extra)
    expected = f.run_reference(cpu, ref.x)
    out = cupy.full(A.shape[0], cupy.nan, dtype=dtype)
    y = f.run(gpu, cupy.asarray(ref.x), out).get()
    ok, _, msg = ref.check(y)
    assert ok, f"{params}: {msg}"
    scale = np.maximum(ref.scale, np.finfo(np.float64).tiny)
    assert np.all(np.abs(y - expected) / scale <= 2 * ref.rtol), f"{params}: GPU differs from its reference"
    if cpu.nnz and cpu.shape[0]:
        assert f.memory_ratio(gpu) == pytest.approx(f.memory_ratio(cpu))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_reference_on_hard_cases(name, dtype):
    for f in (Nut(), Nut(num_sms=1)):
        for params in GPU_CONFIGS:
            _gpu_check(f, CASES[name](), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_matches_reference_on_every_shared_matrix(dtype, shared_dir):
    f = Nut()
    for name in shared_cases():
        for params in GPU_CONFIGS:
            _gpu_check(f, shared(name), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_items_of_a_hub_row_add_to_y(dtype):
    """The hub row's panel cut into items that add to y atomically, beside panels that store theirs;
    with slabs, every panel's items add."""
    f = Nut(num_sms=4)
    p = f.prepare_reference(hub_matrix(), HUB)
    assert np.sum(p.extra["item_panel"] < 0) > 1 and np.any(p.extra["item_panel"] >= 0)
    for params in (HUB, {**HUB, "slabs": 4, "bands": 4}):
        _gpu_check(f, hub_matrix(), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_panels_of_dense_rows_cut(dtype):
    """The dense block's panels cut by rows (as the CPU reference cuts them), with and without slabs."""
    for params in (HUB, {**HUB, "slabs": 2, "bands": 2}):
        _gpu_check(Nut(num_sms=4), dense_block_matrix(), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_panels_costlier_than_a_share_cut(dtype):
    """The long rows' panels cut by the share rule (as the CPU reference cuts them): 1024 threads, and 512 with and
    without slabs (3 and 6 items without the rule, 9, 18 and 18 with it)."""
    for params in (LONG, {**LONG, "threads": 512}, {**LONG, "threads": 512, "slabs": 2, "bands": 2}):
        _gpu_check(Nut(num_sms=2), long_rows_matrix(), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_shared_memory_above_48_kb(dtype):
    """Uniform 8192-row panels with 16384-column tiles: 192 KB (float64) / 96 KB (float32) a block."""
    A = as_csr(sp.random(20_000, 20_000, density=10 / 20_000, format="csr", random_state=8))
    f = Nut(num_sms=1)
    p = f.prepare_reference(A.astype(dtype), LARGE)
    assert (p.extra["max_panel_rows"], p.extra["max_tile_cols"]) == (8192, 16384)
    _gpu_check(f, A, dtype, LARGE)


@pytest.mark.gpu
def test_gpu_out_is_reused_and_every_row_written():
    import cupy
    import cupyx.scipy.sparse as cusp

    A = CASES["empty_rows"]()
    f = Nut()
    prepared = f.prepare(cusp.csr_matrix(A))
    out = cupy.full(A.shape[0], cupy.nan)
    x = np.random.default_rng(0).uniform(-1, 1, A.shape[1])
    assert f.run(prepared, cupy.asarray(x), out) is out
    np.testing.assert_allclose(out.get(), A @ x, rtol=1e-12, atol=1e-14)


ACTIVES = {"bitmap": 1 << 40, "sort": 0}
"""``nut.BITMAP_BITS_PER_NONZERO`` that makes the GPU find the active columns one way or the other."""


def _gpu_build_equals_numpy(A, params: dict) -> None:
    """Every array of ``build`` on the GPU as NumPy builds it, and of the same dtype."""
    import cupy

    want = build(A.indptr, A.indices, A.data, A.shape, **params)
    got = build(cupy.asarray(A.indptr), cupy.asarray(A.indices), cupy.asarray(A.data), A.shape, **params, xp=cupy)
    assert set(got) == set(want)
    for key, value in want.items():
        value_got = got[key].get() if isinstance(got[key], cupy.ndarray) else got[key]
        np.testing.assert_array_equal(value_got, value, err_msg=f"{key} {params}")
        assert np.asarray(value_got).dtype == np.asarray(value).dtype, key


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [32, nut._CHUNK])
@pytest.mark.parametrize("actives", sorted(ACTIVES))
def test_gpu_structure_with_active_columns_from_a_bitmap_or_a_sort(actives, chunk, monkeypatch):
    """Both ways the GPU finds the active columns (a bit a (panel, column) pair, or a sort of the pairs), on
    every hard case and a hub row's matrix, in slabs and bands too: NumPy's arrays. With chunks of 32 entries
    a panel's entries are ranked in many chunks, and the hub row's panel (about 60 tiles) takes larger ones."""
    monkeypatch.setattr(nut, "BITMAP_BITS_PER_NONZERO", ACTIVES[actives])
    monkeypatch.setattr(nut, "_CHUNK", chunk)
    for A in (*(CASES[name]() for name in sorted(CASES)), hub_matrix(), dense_block_matrix()):
        if A.nnz == 0 or A.shape[0] == 0:
            continue
        for params in (*CONFIGS, {**HUB, "slabs": 4, "bands": 4}):
            _gpu_build_equals_numpy(as_csr(A), {**Nut().space.defaults(), **params, "num_sms": 4})


@pytest.mark.gpu
@pytest.mark.parametrize("slabs", [1, 4])
@pytest.mark.parametrize("actives", sorted(ACTIVES))
def test_gpu_structure_where_the_sort_keys_need_64_bits(slabs: int, actives: str, monkeypatch) -> None:
    """4096 panels of 256 rows by 2^20 columns: (panel, column) keys past int32 on the GPU's kernels too
    (nut_keys<long long>, and nut_mark and nut_uids where a bitmap finds the active columns); every array as
    NumPy builds it."""
    monkeypatch.setattr(nut, "BITMAP_BITS_PER_NONZERO", ACTIVES[actives])
    rng = np.random.default_rng(11)
    m = n = 1 << 20
    rows, cols = rng.integers(0, m, 3 * m), rng.integers(0, n, 3 * m)
    A = as_csr(sp.csr_matrix((rng.uniform(0.1, 1.0, rows.size), (rows, cols)), shape=(m, n)))
    params = {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 128, "num_sms": 132, "slabs": slabs}
    assert (m // 256) * n > np.iinfo(np.int32).max
    _gpu_build_equals_numpy(A, params)


@pytest.mark.parametrize(("rows", "threads", "itemsize", "given", "tile"), [
    (2048, 1024, 8, 4096, 8192),    # 16 KB of y, 64 KB of x: 96 KB, two blocks an SM
    (2048, 1024, 4, 4096, 16384),
    (8192, 1024, 8, 16384, 4096),   # 64 KB of y leaves 32 KB
    (8192, 1024, 4, 4096, 16384),
    (2048, 512, 8, 16384, 4096),    # four blocks of 512 threads: 48 KB each
    (2048, 512, 4, 4096, 8192),
    (8192, 512, 8, 4096, 1024),     # no room at all: the narrowest
    (256, 128, 8, 16384, 16384),    # fewer threads than JOIN_THREADS: the tile as given
])
def test_a_joined_config_takes_the_widest_tile_its_threads_share_of_shared_memory_holds(rows, threads, itemsize,
                                                                                        given, tile):
    """Nut.joined: FIT_SHARED_BYTES (96 KB) for 1,024 threads, half for 512, less the panel's y; the rest of the
    config as given, and a config of fewer threads as given."""
    asked = {"rows_per_panel": rows, "threads": threads, "cols_per_tile": given}
    joined = Nut(num_sms=132).joined(asked, itemsize=itemsize)
    assert joined == {**Nut.space.validate(asked, family="nut"), "cols_per_tile": tile}
