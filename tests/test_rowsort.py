"""rowsort: the order brings rows stored out of order back to the order of their columns, fails fast where the
rows are in order already or scattered whatever their order, the GPU orders as the reference does, and a race
enters it only where its preparation can check the order (the conformance suite, tests/test_kernels.py, runs
every config on every case on the CPU and the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from common.errors import InvalidConfigError
from kernels.rcm import CHECKED_ROWS, JUMP, renumbered
from kernels.rowsort import DIAGONAL, MIN_ENTRIES, Rowsort, row_order
from tuner.matrix.io import as_csr


def _stencil(side: int) -> sp.csr_matrix:
    """The 3-D 7-point Laplacian on side**3 points, rows in order."""
    one = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(side, side))
    return as_csr(sp.kronsum(sp.kronsum(one, one), one, format="csr"))


def _emptied(A: sp.csr_matrix, every: int) -> sp.csr_matrix:
    """A with every ``every``-th row emptied."""
    keep = np.ones(A.shape[0])
    keep[::every] = 0
    return as_csr(sp.diags(keep) @ A)


def _rows_shuffled(A: sp.csr_matrix, seed: int) -> tuple[sp.csr_matrix, np.ndarray]:
    p = np.random.default_rng(seed).permutation(A.shape[0])
    return as_csr(A[p]), p


def _random_rows(m: int, n: int, per_row: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(m), per_row)
    return as_csr(sp.csr_matrix((np.ones(rows.size), (rows, rng.integers(0, n, rows.size))), shape=(m, n)))


def test_a_stencil_with_its_rows_shuffled_gets_its_order_back():
    A = _stencil(48)  # 110,592 rows: the order is checked
    assert A.shape[0] >= CHECKED_ROWS
    P, p = _rows_shuffled(A, seed=3)
    rows = row_order(P.indptr, P.indices, P.shape[1])
    assert rows.dtype == np.int32 and np.array_equal(np.sort(rows), np.arange(A.shape[0]))
    moved = np.abs(p[rows] - np.arange(A.shape[0]))  # where each of A's rows ends up against where it was
    assert np.mean(moved == 0) > 0.9 and moved.max() <= 48 * 48  # interior rows exactly; boundary rows near
    B = renumbered(P, rows, None)  # columns kept: B = P[rows]
    assert (B != P[rows]).nnz == 0 and B.indices.dtype == np.int32


def test_rows_in_order_already_or_scattered_whatever_their_order_fail_fast_with_the_shares():
    with pytest.raises(InvalidConfigError, match=r"rows in order already: 0\.0% of neighbouring rows"):
        row_order(*_csr(_stencil(48)))
    scattered = _random_rows(100_000, 100_000, 10, seed=1)  # out of order, and no order brings its rows together
    with pytest.raises(InvalidConfigError, match=rf"no order of the rows brings them together: .*{JUMP} or more"):
        row_order(*_csr(scattered))
    # below CHECKED_ROWS every order is taken: sorted by middle column, ties by number, empty rows last
    small = as_csr(sp.csr_matrix(np.array([[0, 0, 1.0], [0, 0, 0], [1.0, 0, 0], [0, 0, 1.0]])))
    np.testing.assert_array_equal(row_order(*_csr(small)), [2, 0, 3, 1])


def _csr(A: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, int]:
    return A.indptr, A.indices, A.shape[1]


def test_the_reference_computes_a_x_on_rows_out_of_order_with_empty_ones():
    P, _ = _rows_shuffled(_emptied(_stencil(44), 7), seed=5)
    x = np.random.default_rng(0).random(P.shape[1])
    f = Rowsort()
    for params in ({}, {"threads_per_row": 2, "indices": "int32"}):
        np.testing.assert_allclose(f.run_reference(f.prepare_reference(P, params), x), P @ x, rtol=1e-12, atol=1e-12)
    # no entries at all: below CHECKED_ROWS rows the rows keep their order, from it nothing is in need of one
    assert np.array_equal(row_order(np.zeros(101, np.int64), np.zeros(0, np.int32), 50), np.arange(100))
    with pytest.raises(InvalidConfigError, match=r"rows in order already: 0\.0%"):
        row_order(np.zeros(CHECKED_ROWS + 1, np.int64), np.zeros(0, np.int32), 50)


def test_a_race_enters_it_on_enough_regular_rows_not_in_the_order_of_a_stored_diagonal():
    f = Rowsort()
    regular = {"rows": 1e6, "cols": 1e6, "npr_cv": 0.2, "npr_mean": 7.0, "diag_frac": 0.0}
    assert f.unranked_config(regular, 8) == {"threads_per_row": 2, "block_size": 256, "indices": "narrow"}
    assert f.unranked_config({**regular, "npr_mean": 27.0}, 8)["threads_per_row"] == 8
    assert f.unranked_config({**regular, "rows": CHECKED_ROWS - 1.0}, 8) is None
    assert f.unranked_config({**regular, "npr_cv": 1.5}, 8) is None and f.unranked_config(None, 8) is None
    # a row of one entry gains nothing from the order (a scattered write of y for a scattered read of x)
    assert f.unranked_config({**regular, "npr_mean": 1.0, "npr_cv": 0.0}, 8) is None
    assert f.unranked_config({**regular, "npr_mean": MIN_ENTRIES}, 8) is not None
    # a square matrix with its diagonal stored reads x in its rows' order already; a rectangular one is raced
    assert f.unranked_config({**regular, "diag_frac": DIAGONAL}, 8) is None
    assert f.unranked_config({**regular, "diag_frac": 1.0, "cols": 2e5}, 8) is not None


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [True, False])
def test_the_gpu_orders_as_the_reference_and_writes_y_either_way(in_place, monkeypatch):
    import cupy
    import cupyx.scipy.sparse as cusp

    import kernels.rcm

    monkeypatch.setattr(kernels.rcm, "writes_in_place", lambda *args: in_place)
    P, _ = _rows_shuffled(_emptied(_stencil(48), 5), seed=9)
    G = cusp.csr_matrix(P)
    rows = row_order(G.indptr, G.indices, G.shape[1], cupy)
    np.testing.assert_array_equal(cupy.asnumpy(rows), row_order(*_csr(P)))
    f = Rowsort()
    prepared = f.prepare(G, {"threads_per_row": 2})
    assert ("y_renumbered" in prepared.extra) is not in_place
    x = np.random.default_rng(2).random(P.shape[1])
    y = cupy.full(P.shape[0], np.nan)
    f.run(prepared, cupy.asarray(x), y)
    np.testing.assert_allclose(cupy.asnumpy(y), f.run_reference(f.prepare_reference(P, {"threads_per_row": 2}), x),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(InvalidConfigError, match="rows in order already"):
        f.prepare(cusp.csr_matrix(_stencil(48)))
