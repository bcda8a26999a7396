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
from kernels.nut import STRUCTURE, Nut, build, decode, paper_defaults
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.errors import InvalidConfigError
from tuner.io import as_csr
from tuner.verify import Reference

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
        "panel_order": [0, 2, 1],  # 8, 6 and 0 nonzeros
        "panel_tile_ptr": [0, 2, 2, 4],
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
    assert (got["max_panel_rows"], got["max_tile_cols"]) == (4, 3)
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
    np.testing.assert_array_equal(got["panel_order"], [1, 3, 0, 4, 2])  # 3 5 0 4 2 nonzeros: most first
    np.testing.assert_array_equal(got["panel_tile_ptr"], [0, 1, 3, 3, 5, 6])
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
    np.testing.assert_array_equal(got["panel_tile_ptr"], [0, 1, 2, 3, 3, 3, 3, 4, 5, 6])
    np.testing.assert_array_equal(got["tile_cols"], [0, 1, 5, 7, 9, 11, 2, 3, 4, 6, 10])
    np.testing.assert_array_equal(got["tile_col_ptr"], [0, 2, 4, 6, 8, 10, 11])
    np.testing.assert_array_equal(got["tile_nnz"], [2, 4, 2, 3, 2, 1])
    assert got["slabs"] == 3 and got["band_ptr"] == [0, 2, 3]
    np.testing.assert_array_equal(got["panel_order"], [0, 1, 2])  # band by band: (0: 8, 1: 0 nonzeros), (2)
    # Tile 1, (0,5) (1,5) (3,5) (3,7) with s=2, w=2: thread 0 takes rows 0 and 1, thread 1 row 3.
    t1 = got["enc_idx"][got["tile_ptr"][1] : got["tile_ptr"][2]]
    np.testing.assert_array_equal(t1, [neg(0, 0), neg(3, 0), neg(1, 0), 1])
    rows, cols, vals = decode(got, threads=2)
    np.testing.assert_array_equal(rows, [0, 3, 0, 1, 3, 3, 0, 3, 8, 8, 9, 8, 8, 9])
    np.testing.assert_array_equal(cols, [0, 1, 5, 5, 5, 7, 9, 11, 2, 3, 3, 4, 6, 10])
    x = np.arange(1.0, 13.0)
    np.testing.assert_allclose(simulate_kernel(got, x, 2, A.shape[0]), A @ x, rtol=1e-15)
    # One band per row range: a band's launches cover its panels' rows only, every band a range of panels.
    for bands in (1, 2, 3, 5, 100):
        _, ex = hand_build(bands=bands, slabs=2)
        band_ptr = ex["band_ptr"]
        assert band_ptr[0] == 0 and band_ptr[-1] == 3 and np.all(np.diff(band_ptr) > 0)
        assert len(band_ptr) - 1 <= bands


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
    searchsorted expansion and the array-method argsort of the GPU path; it must agree."""
    fake = types.SimpleNamespace(
        **{n: getattr(np, n) for n in ("int32", "int64", "asarray", "zeros", "ones", "empty", "arange",
                                      "concatenate", "cumsum", "diff", "searchsorted", "where")}
    )
    monkeypatch.setattr(nut, "_stable_argsort", lambda xp, key: np.argsort(key, kind="stable"))
    for A in (hand_matrix(), CASES["empty_rows"](), CASES["huge_row"](), shared("Maragal_6")):
        for params in (dict(SMALL, num_sms=132), dict(rows_per_panel=4, cols_per_tile=3, threads=2, num_sms=1)):
            want = build(A.indptr, A.indices, A.data, A.shape, **params)
            got = build(A.indptr, A.indices, A.data, A.shape, **params, xp=fake)
            for key in want:
                np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def simulate_kernel(ex: dict, x: np.ndarray, threads: int, m: int) -> np.ndarray:
    """nut.cu's nut_spmv, launched as Nut._run launches it (band after band, slab after slab),
    statement by statement, one thread after the other (small matrices only).

    Also checks the one claim the kernel's speed rests on: a row it adds without an atomic
    (``owned``) is touched by no other thread of the block in that tile.
    """
    y = np.full(m, np.nan)
    panel_ptr, panel_tile_ptr, tile_col_ptr = ex["panel_ptr"], ex["panel_tile_ptr"], ex["tile_col_ptr"]
    slabs, band_ptr = ex["slabs"], ex["band_ptr"]
    launches = [(int(ex["panel_order"][b]), slab) for b0, b1 in zip(band_ptr[:-1], band_ptr[1:], strict=True)
                for slab in range(slabs) for b in range(b0, b1)]
    assert sorted(launches) == [(p, s) for p in range(len(panel_ptr) - 1) for s in range(slabs)]
    for p, slab in launches:
        group, accumulate = p * slabs + slab, slab > 0
        if accumulate and panel_tile_ptr[group] == panel_tile_ptr[group + 1]:
            continue
        r0, nr = panel_ptr[p], panel_ptr[p + 1] - panel_ptr[p]
        ys = np.zeros(ex["max_panel_rows"])
        for t in range(panel_tile_ptr[group], panel_tile_ptr[group + 1]):
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
        y[r0 : r0 + nr] = y[r0 : r0 + nr] + ys[:nr] if accumulate else ys[:nr]
    return y


def test_the_kernel_walk_simulated_thread_by_thread():
    cases = [hand_matrix(), *(CASES[n]() for n in ("one_row", "one_column", "empty_rows", "huge_row"))]
    for A in cases:
        x = np.random.default_rng(1).uniform(-1, 1, A.shape[1])
        for params in ({"rows_per_panel": 4, "cols_per_tile": 3, "threads": 2},
                       {"rows_per_panel": 4, "cols_per_tile": 3, "threads": 2, "slabs": 3, "bands": 2},
                       {"rows_per_panel": 64, "cols_per_tile": 200, "threads": 32, "slabs": 8, "bands": 4},
                       {"rows_per_panel": 256, "cols_per_tile": 1024, "threads": 128}):
            for sms in (1, 132):
                ex = build(A.indptr, A.indices, A.data, A.shape, **params, num_sms=sms)
                y = simulate_kernel(ex, x, params["threads"], A.shape[0])
                np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)


# -- the space --------------------------------------------------------------------------
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
    assert f.name_expressions("float32") == ("nut_spmv<float>",)
    with pytest.raises(InvalidConfigError, match="allowed"):
        f.space.validate({"cols_per_tile": 3})


# -- invariants on every shared matrix -----------------------------------------------------
def check_invariants(A, ex: dict, params: dict) -> None:
    R, C, T = params["rows_per_panel"], params["cols_per_tile"], params["threads"]
    K = params.get("slabs", 1)
    m, n = A.shape
    panel_ptr, panel_tile_ptr = ex["panel_ptr"].astype(np.int64), ex["panel_tile_ptr"].astype(np.int64)
    tile_col_ptr, tile_cols = ex["tile_col_ptr"].astype(np.int64), ex["tile_cols"]
    e = ex["tile_nnz"].astype(np.int64)
    n_tiles = len(e)
    # Panels cover the rows, in order, at most R rows each; tiles are numbered panel by panel.
    assert panel_ptr[0] == 0 and panel_ptr[-1] == m
    assert np.all(np.diff(panel_ptr) >= 1) and np.all(np.diff(panel_ptr) <= R)
    assert panel_tile_ptr[0] == 0 and panel_tile_ptr[-1] == n_tiles and np.all(np.diff(panel_tile_ptr) >= 0)
    # Tile groups: one per (panel, slab). Each tile has exactly C active columns but a group's last, which
    # has 1..C, and all of them in the group's slab.
    assert ex["slabs"] == K and len(panel_tile_ptr) == (len(panel_ptr) - 1) * K + 1
    ncols = np.diff(tile_col_ptr)
    last = np.zeros(n_tiles, dtype=bool)
    last[panel_tile_ptr[1:][np.diff(panel_tile_ptr) > 0] - 1] = True
    assert np.all(ncols[~last] == C) and np.all((ncols[last] >= 1) & (ncols[last] <= C))
    assert np.all(e >= 1) and len(tile_cols) == tile_col_ptr[-1]
    # A panel's tiles list its active columns once each, ascending (the indirection arrays).
    group_of_tile = np.repeat(np.arange(len(panel_tile_ptr) - 1), np.diff(panel_tile_ptr))
    panel_of_tile = group_of_tile // K
    tile_of_col = np.repeat(np.arange(n_tiles), ncols)
    np.testing.assert_array_equal(tile_cols.astype(np.int64) * K // n, group_of_tile[tile_of_col] % K)
    colkey = panel_of_tile[tile_of_col].astype(np.int64) * A.shape[1] + tile_cols
    assert np.all(np.diff(colkey) > 0)
    rows_of = np.repeat(np.arange(m), np.diff(A.indptr))
    panel_of_row = np.repeat(np.arange(len(panel_ptr) - 1), np.diff(panel_ptr))
    np.testing.assert_array_equal(colkey, np.unique(panel_of_row[rows_of].astype(np.int64) * A.shape[1] + A.indices))
    # Bands: ranges of panels covering them all in order; inside each, the panels most nonzeros first.
    band_ptr = ex["band_ptr"]
    assert band_ptr[0] == 0 and band_ptr[-1] == len(panel_ptr) - 1 and np.all(np.diff(band_ptr) > 0)
    order = ex["panel_order"].astype(np.int64)
    panel_nnz = np.diff(A.indptr[panel_ptr])
    for b0, b1 in zip(band_ptr[:-1], band_ptr[1:], strict=True):
        np.testing.assert_array_equal(np.sort(order[b0:b1]), np.arange(b0, b1))
        assert np.all(np.diff(panel_nnz[order[b0:b1]]) <= 0)
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
    assert np.any(np.diff(p.extra["panel_tile_ptr"]) == 0)  # rows 500..1099 hold an empty panel
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
            n_panels, n_tiles = len(ex["panel_ptr"]) - 1, len(ex["tile_nnz"])
            tables = 8 * (n_panels + 1) + 4 * n_panels + 20 * n_tiles + 12  # panel_ptr, panel_order, tiles
            assert A.nnz * (4 + v) / csr <= ratio <= (A.nnz * (8 + v) + padding * (4 + v) + tables) / csr
            s = (ex["tile_nnz"].astype(np.int64) + p.params["threads"] - 1) // p.params["threads"]
            assert padding <= int((s - 1).sum())  # less than one stretch a tile
            print(f"nut memory ratio {name:18s} {str(params or 'default'):70s} {ratio:.3f}")
    assert f.memory_ratio(f.prepare_reference(CASES["zero_nnz"]())) == 0.0


def test_preprocessing_reference_time_on_a_million_rows():
    from tuner.generate import generate

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
    for key in (*STRUCTURE, "max_panel_rows", "max_tile_cols"):
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
