"""rcm: the orders are permutations, they give a renumbered matrix of narrow band where the numbering was
random, a graph with no narrow order fails fast, the GPU orders as the reference does, and a race enters it
only where renumbering can pay (the conformance suite, tests/test_kernels.py, runs every config on every
case on the CPU and the GPU)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

from common.errors import InvalidConfigError
from kernels.rcm import CHECKED_ROWS, DEEP_LEVELS, LARGE_GRAPH, Rcm, orders, renumbered, writes_in_place
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.matrix.features import extract_features
from tuner.matrix.io import as_csr


def _distances(A: sp.csr_matrix) -> np.ndarray:
    coo = A.tocoo()
    return np.abs(coo.row.astype(np.int64) - coo.col)


def _shuffled(A: sp.spmatrix, seed: int) -> sp.csr_matrix:
    """A with its rows and columns under one random permutation: the same structure, scattered columns."""
    p = np.random.default_rng(seed).permutation(A.shape[0])
    return as_csr(sp.csr_matrix(A)[p][:, p])


def _grid(side: int) -> sp.csr_matrix:
    """The 2-D 5-point Laplacian."""
    one = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(side, side))
    return sp.kronsum(one, one, format="csr")


def _random_graph(n: int, degree: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n, n * degree), rng.integers(0, n, n * degree)
    return as_csr(sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n)))


def test_a_randomly_numbered_grid_gets_back_a_narrow_band():
    A = _shuffled(_grid(40), seed=1)
    rows, cols = orders(A)
    assert np.array_equal(rows, cols)  # square: one order, the diagonal stays the diagonal
    assert np.array_equal(np.sort(rows), np.arange(A.shape[0])) and rows.dtype == np.int32
    B = renumbered(A, rows, cols)
    assert _distances(A).max() > 1000 and _distances(B).max() <= 40 + 1  # a front of about one grid line
    assert B.indices.dtype == np.int32
    np.testing.assert_array_equal(B.diagonal(), A.diagonal()[rows])


def test_the_renumbered_matrix_keeps_each_rows_entries_in_a_s_order():
    """What rcm_renumber writes: row i of B is row rows[i] of A, its columns renumbered, not re-sorted."""
    A = _shuffled(_grid(6), seed=7)
    rows, cols = orders(A)
    B = renumbered(A, rows, cols)
    new = np.empty_like(cols)
    new[cols] = np.arange(cols.size)
    for i in (0, 5, 17, 35):
        got, was = slice(B.indptr[i], B.indptr[i + 1]), slice(A.indptr[rows[i]], A.indptr[rows[i] + 1])
        np.testing.assert_array_equal(B.indices[got], new[A.indices[was]])
        np.testing.assert_array_equal(B.data[got], A.data[was])


def test_a_rectangular_matrix_gets_a_row_order_and_a_column_order():
    A = as_csr(sp.random(300, 70, density=0.05, format="csr", random_state=2))
    rows, cols = orders(A)
    assert np.array_equal(np.sort(rows), np.arange(300)) and np.array_equal(np.sort(cols), np.arange(70))
    x = np.random.default_rng(3).standard_normal(70)
    np.testing.assert_allclose(renumbered(A, rows, cols) @ x[cols], (A @ x)[rows], rtol=1e-12, atol=1e-12)


def test_many_components_are_ordered_each_in_one_piece():
    """60 shuffled dense blocks: the searches restart from 1, 2, 4, ... vertices at once, and each start's
    share of the order stays together: most entries land within their block of 5 (a block two of whose
    vertices start the same search is cut in two)."""
    A = _shuffled(sp.block_diag([np.ones((5, 5))] * 60, format="csr"), seed=4)
    rows, cols = orders(A)
    assert np.array_equal(np.sort(rows), np.arange(300))
    d = _distances(renumbered(A, rows, cols))
    assert _distances(A).mean() > 50 and np.mean(d < 5) > 0.85


def test_vertices_no_search_reaches_come_last():
    """Empty rows that are no row's column: rows 3 and 7 of a matrix whose other rows link to each other."""
    A = sp.lil_matrix((10, 10))
    for i in (0, 1, 2, 4, 5, 6, 8, 9):
        A[i, i] = 1.0
        A[i, (i + 1) % 10 if (i + 1) % 10 not in (3, 7) else (i + 2) % 10] = 1.0
    rows, _ = orders(as_csr(A))
    assert sorted(rows[:2]) == [3, 7]  # last in Cuthill-McKee: first once reversed


def _path(n: int) -> sp.csr_matrix:
    """The path 0 - 1 - ... - n-1 with its diagonal: n levels from an end."""
    return sp.diags([1.0, 2.0, 1.0], [-1, 0, 1], shape=(n, n), format="csr")


def test_a_search_stops_at_its_depth_and_the_vertices_beyond_keep_their_order():
    """A shuffled path of 3000 vertices: the search from an end numbers DEEP_LEVELS levels beyond it, one vertex
    each, along the path, and stops; the others follow in their own order (all reversed, as RCM is)."""
    n = 3000
    A = _shuffled(_path(n), seed=2)
    cm = orders(A)[0][::-1]
    assert np.array_equal(np.sort(cm), np.arange(n))
    walked, rest = cm[:DEEP_LEVELS + 1], cm[DEEP_LEVELS + 1:]
    assert A[walked[0]].nnz == 2  # an end of the path: fewest neighbours
    assert all(A[a, b] != 0 for a, b in zip(walked[:-1], walked[1:], strict=True))
    assert np.array_equal(rest, np.sort(rest))


def test_a_small_world_graph_fails_fast_with_the_reason():
    A = _random_graph(LARGE_GRAPH + 4000, 8, seed=5)
    with pytest.raises(InvalidConfigError, match="no narrow order.*small-world"):
        orders(A)
    with pytest.raises(InvalidConfigError, match="no narrow order"):
        Rcm().prepare_reference(A)
    small = _random_graph(5000, 8, seed=5)  # below LARGE_GRAPH it is ordered anyway
    assert np.array_equal(np.sort(orders(small)[0]), np.arange(5000))


def _bit_reversed(A: sp.csr_matrix) -> sp.csr_matrix:
    """A with its rows and columns in the order of their numbers' bits reversed (an FFT's permutation)."""
    n = A.shape[0]
    bits = (n - 1).bit_length()
    key = sum(((np.arange(n) >> b) & 1) << (bits - 1 - b) for b in range(bits))
    p = np.argsort(key, kind="stable")
    return as_csr(A[p][:, p])


def test_a_large_matrix_whose_rows_gather_x_in_order_already_is_refused_before_the_search():
    """A diagonal matrix and a grid in bit-reversed order (every row's columns far apart, but a warp's rows read
    neighbouring entries of x): the preparation refuses them with the share it measured, as rowsort's does; the
    same grid numbered at random is ordered, and below CHECKED_ROWS rows nothing is checked."""
    diagonal = as_csr(sp.identity(CHECKED_ROWS + 100, format="csr"))
    bit_reversed = _bit_reversed(_grid(260))
    assert extract_features(bit_reversed)["cf_128"] < 1.2  # scattered rows, as the race's entry measures them
    for A in (diagonal, bit_reversed):
        with pytest.raises(InvalidConfigError, match=r"rows in order already: \d+\.\d% of neighbouring rows"):
            Rcm().prepare_reference(A)
    A = _shuffled(_grid(260), seed=3)
    prepared = Rcm().prepare_reference(A)
    x = np.random.default_rng(0).random(A.shape[1])
    np.testing.assert_allclose(Rcm().run_reference(prepared, x), A @ x, rtol=1e-12, atol=1e-12)
    small = as_csr(sp.identity(1_000, format="csr"))
    np.testing.assert_allclose(Rcm().run_reference(Rcm().prepare_reference(small), x[:1_000]), x[:1_000])


def test_the_reference_goes_through_the_renumbered_matrix_and_back():
    """y = A·x from B·x[cols] scattered to rows; the inner csr_vector sees B, not A."""
    A = _shuffled(_grid(20), seed=4)
    f = Rcm()
    p = f.prepare_reference(A, {"threads_per_row": 4, "block_size": 128})
    assert _distances(p.extra["inner"].A).max() < _distances(A).max()
    x = np.random.default_rng(5).standard_normal(A.shape[1])
    np.testing.assert_allclose(f.run_reference(p, x), A @ x, rtol=1e-12, atol=1e-12)


def test_a_race_enters_it_only_on_square_regular_scattered_matrices():
    f = Rcm()
    assert f.unranked_config(extract_features(_shuffled(_grid(60), seed=6)), 8) is not None
    assert f.unranked_config(extract_features(_grid(60)), 8) is None  # numbered well already
    assert f.unranked_config(extract_features(as_csr(sp.random(400, 300, density=0.01, random_state=1))), 8) is None
    heavy = extract_features(_shuffled(sp.csr_matrix(sp.random(3000, 3000, density=0.002, random_state=2)
                                                     + sp.csr_matrix(([1.0] * 3000, ([5] * 3000, range(3000))),
                                                                     shape=(3000, 3000))), seed=3))
    assert heavy["npr_cv"] > 1 and f.unranked_config(heavy, 8) is None  # a heavy row: not csr_vector's
    hub = extract_features(_shuffled(sp.csr_matrix(_random_graph(3000, 4, seed=7)
                                                   + sp.csr_matrix(([1.0] * 3000, (range(3000), [5] * 3000)),
                                                                   shape=(3000, 3000))), seed=8))
    assert hub["npr_cv"] < 1 < hub["col_cv"] and f.unranked_config(hub, 8) is None  # a column every row reads
    assert f.unranked_config(None, 8) is None


def test_a_race_gives_it_the_power_of_two_threads_nearest_the_lanes_a_row_fills():
    """A lane's first loads are 4 doubles or 8 floats: 27 entries a row (perm27) fill 6.75 lanes in float64
    and 3.4 in float32, so 8 and 4 threads; 9 a row (mesh2d) fill 2.25 and 1.1, so 2 in both (the fastest on
    the H100's probe, stop 45), not the 4 that would cover a row of doubles in one batch."""
    features = {"rows": 1e6, "cols": 1e6, "cf_128": 1.0, "npr_cv": 0.07, "col_cv": 0.07, "npr_mean": 26.6}
    f = Rcm()
    assert f.unranked_config(features, 8) == {"threads_per_row": 8, "block_size": 256, "indices": "narrow"}
    assert f.unranked_config(features, 4) == {"threads_per_row": 4, "block_size": 256, "indices": "narrow"}
    assert f.unranked_config({**features, "npr_mean": 9.0}, 8)["threads_per_row"] == 2
    assert f.unranked_config({**features, "npr_mean": 12.0}, 8)["threads_per_row"] == 4  # 3 lanes: nearer 4
    assert f.unranked_config({**features, "npr_mean": 3.0}, 4)["threads_per_row"] == 2  # the fewest there are
    assert f.unranked_config({**features, "npr_mean": 900.0}, 8)["threads_per_row"] == 32  # the most


def test_y_is_written_in_place_unless_a_sector_s_writes_are_an_l2_of_matrix_apart():
    """nnz * (itemsize + 4) * itemsize / 32 against the L2 (the H100's 50 MiB): the unseen mesh2d (13 M entries)
    in place in both dtypes, the 46 M-entry 27-point stencil in place in float32 only."""
    l2 = 50 * 2**20
    assert writes_in_place(12_945_604, 8, l2) and writes_in_place(12_945_604, 4, l2)
    assert writes_in_place(45_882_712, 4, l2) and not writes_in_place(45_882_712, 8, l2)


@pytest.mark.gpu
def test_gpu_y_in_place_and_through_a_copy_are_the_same(monkeypatch):
    """Both ways of writing y (csr_vector's ROWS, or a copy in B's order gathered back) give the same y, bit for
    bit (the same sums in the same order), and the reference's."""
    import cupy
    import cupyx.scipy.sparse as cusp

    import kernels.rcm

    A = _shuffled(_grid(120), seed=11)
    x = np.random.default_rng(3).random(A.shape[1])
    f = Rcm()
    ys = []
    for in_place in (True, False):
        monkeypatch.setattr(kernels.rcm, "writes_in_place", lambda *args, answer=in_place: answer)
        prepared = f.prepare(cusp.csr_matrix(A), {"threads_per_row": 2})
        assert ("y_renumbered" in prepared.extra) != in_place
        ys.append(f.run(prepared, cupy.asarray(x)).get())
    np.testing.assert_array_equal(ys[0], ys[1])
    np.testing.assert_allclose(ys[0], A @ x, rtol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["shuffled_grid", "blocks", "deep_path", "rectangular_tall", "rectangular_wide",
                                  "empty_rows", "huge_row", *shared_cases()])
def test_gpu_orders_as_the_reference_does(name):
    """The GPU's searches (rcm_search: a cooperative launch a search) give exactly the reference's order, and its B
    is the reference's B, on the cases and every shared matrix."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from kernels.rcm import gpu_search

    if name == "shuffled_grid":
        A = _shuffled(_grid(300), seed=8)
    elif name == "blocks":
        A = _shuffled(sp.block_diag([np.ones((3, 3))] * 3000, format="csr"), seed=9)
    elif name == "deep_path":  # the search stops at DEEP_LEVELS
        A = _shuffled(_path(5000), seed=10)
    else:
        A = CASES[name]() if name in CASES else load_shared(name)
    f = Rcm()
    A_dev = cusp.csr_matrix(A)
    rows, cols = orders(A_dev, cupy, gpu_search())
    want_rows, want_cols = orders(A)
    np.testing.assert_array_equal(rows.get(), want_rows)
    np.testing.assert_array_equal(cols.get(), want_cols)
    if not A.nnz:
        return
    try:
        f.prepare_reference(A)
    except InvalidConfigError as e:  # rows in order already (a large matrix): the GPU refuses it alike
        with pytest.raises(InvalidConfigError, match=re.escape(str(e))):
            f.prepare(A_dev)
        return
    B = f.prepare(A_dev).extra["inner"].A
    want = renumbered(A, want_rows, want_cols)
    for got, expected in ((B.indptr, want.indptr), (B.indices, want.indices), (B.data, want.data)):
        np.testing.assert_array_equal(got.get(), expected)


@pytest.mark.gpu
def test_gpu_a_small_world_graph_fails_fast():
    import cupyx.scipy.sparse as cusp

    with pytest.raises(InvalidConfigError, match="no narrow order"):
        Rcm().prepare(cusp.csr_matrix(_random_graph(LARGE_GRAPH + 4000, 8, seed=5)))
