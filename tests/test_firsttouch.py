"""firsttouch: the columns' first-read order brings a matrix whose columns alone were permuted back to its rows'
order, fails fast where the rows are in order already or no numbering of the columns brings them together, the
GPU orders as the reference does, and a race enters it only where the gathers are scattered and the numbering
could help (the conformance suite, tests/test_kernels.py, runs every config on every case on the CPU and the GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from common.errors import InvalidConfigError
from kernels.firsttouch import Firsttouch, column_order
from kernels.rcm import CHECKED_ROWS, JUMP, renumbered
from kernels.rowsort import DIAGONAL, MIN_ENTRIES
from tests.test_rowsort import _csr, _emptied, _stencil
from tuner.matrix.io import as_csr


def _box27(side: int) -> sp.csr_matrix:
    """The 27-point stencil on side**3 points, rows in order."""
    path = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(side, side))
    return as_csr(sp.kron(sp.kron(path, path), path, format="csr"))


def _cols_shuffled(A: sp.csr_matrix, seed: int) -> tuple[sp.csr_matrix, np.ndarray]:
    p = np.random.default_rng(seed).permutation(A.shape[1])
    return as_csr(A[:, p]), p


def test_a_stencil_with_its_columns_shuffled_gets_its_order_back():
    A = _stencil(48)  # 110,592 rows: the order is checked
    assert A.shape[0] >= CHECKED_ROWS
    P, p = _cols_shuffled(A, seed=3)
    cols = column_order(*_csr(P))
    assert cols.dtype == np.int32 and np.array_equal(np.sort(cols), np.arange(A.shape[1]))
    # each new column is A's column of that number, but for the first planes': the first rows read the first
    # plane's columns and the next plane's at once
    moved = np.abs(p[cols] - np.arange(A.shape[1]))
    assert np.mean(moved == 0) > 1 - 2 / 48 and moved.max() <= 48 * 48
    B = renumbered(P, None, cols)  # rows kept: B = P[:, cols], about A again
    assert (B != P[:, cols]).nnz == 0 and B.indices.dtype == np.int32
    assert np.abs(B.tocoo().col - B.tocoo().row).max() <= 2 * 48 * 48  # the stencil's band, twice in the first
    # a row's entries are in A's column order, not its stencil's: the rows' lowest new columns are what is checked
    # (its middle entry's new column, a random one of 27, jumped a plane's width on 59 % of the rows of the unseen
    # colperm27, and the check refused it)
    P27, _ = _cols_shuffled(_box27(48), seed=4)
    B27 = renumbered(P27, None, column_order(*_csr(P27))).tocoo()
    assert np.abs(B27.col - B27.row).max() <= 2 * (48 * 48 + 48 + 1)  # twice the stencil's band at most


def test_rows_in_order_already_or_that_no_numbering_brings_together_fail_fast_with_the_shares():
    with pytest.raises(InvalidConfigError, match=r"rows in order already: 0\.0% of neighbouring rows"):
        column_order(*_csr(_stencil(48)))
    rng = np.random.default_rng(1)
    rows = np.repeat(np.arange(100_000), 10)  # random columns: no two rows share any to bring together
    scattered = as_csr(sp.csr_matrix((np.ones(rows.size), (rows, rng.integers(0, 100_000, rows.size)))))
    shuffled_rows = as_csr(_stencil(48)[rng.permutation(48**3)])  # rowsort's matrix: the first reads scatter
    for A in (scattered, shuffled_rows):
        with pytest.raises(InvalidConfigError, match=rf"no numbering of the columns .* lowest columns {JUMP} or more"):
            column_order(*_csr(A))
    # below CHECKED_ROWS every order is taken: by first read, the columns no row reads last by number
    small = as_csr(sp.csr_matrix(np.array([[0, 0, 1.0, 0], [0, 0, 0, 0], [1.0, 0, 1.0, 0], [0, 0, 0, 1.0]])))
    np.testing.assert_array_equal(column_order(*_csr(small)), [2, 0, 3, 1])


def test_the_reference_computes_a_x_with_empty_rows_and_columns_no_row_reads():
    A, _ = _cols_shuffled(_stencil(20), seed=5)
    A = as_csr(sp.hstack([_emptied(A, 7), sp.csr_matrix((A.shape[0], 30))]))  # empty rows, unread columns
    x = np.random.default_rng(0).random(A.shape[1])
    f = Firsttouch()
    for params in ({}, {"threads_per_row": 2, "indices": "int32"}):
        np.testing.assert_allclose(f.run_reference(f.prepare_reference(A, params), x), A @ x, rtol=1e-12, atol=1e-12)
    assert np.array_equal(column_order(np.zeros(101, np.int64), np.zeros(0, np.int32), 50), np.arange(50))
    with pytest.raises(InvalidConfigError, match=r"rows in order already: 0\.0%"):
        column_order(np.zeros(CHECKED_ROWS + 1, np.int64), np.zeros(0, np.int32), 50)


def test_a_race_enters_it_on_scattered_regular_gathers_each_column_read_twice_or_more():
    f = Firsttouch()
    scattered = {"rows": 1e6, "cols": 1e6, "cf_128": 1.0, "npr_cv": 0.1, "col_cv": 0.1,
                 "npr_mean": 27.0, "diag_frac": 0.0}
    assert f.unranked_config(scattered, 8) == {"threads_per_row": 8, "block_size": 256, "indices": "narrow"}
    assert f.unranked_config(scattered, 4)["threads_per_row"] == 4
    assert f.unranked_config(None, 8) is None
    for changed in ({"rows": CHECKED_ROWS - 1.0}, {"cf_128": 1.4}, {"npr_cv": 1.5}, {"col_cv": 1.5},
                    {"npr_mean": 1.0}, {"cols": 2e7}, {"diag_frac": DIAGONAL}):
        assert f.unranked_config({**scattered, **changed}, 8) is None, changed
    # x read twice a value on average is enough; a rectangular matrix is raced whatever its diagonal
    assert f.unranked_config({**scattered, "cols": 27e6 / MIN_ENTRIES}, 8) is not None
    assert f.unranked_config({**scattered, "diag_frac": 1.0, "cols": 5e5}, 8) is not None


@pytest.mark.gpu
def test_the_gpu_orders_as_the_reference_and_computes_a_x():
    import cupy
    import cupyx.scipy.sparse as cusp

    P, _ = _cols_shuffled(_stencil(48), seed=9)
    G = cusp.csr_matrix(P)
    np.testing.assert_array_equal(cupy.asnumpy(column_order(G.indptr, G.indices, G.shape[1], cupy)),
                                  column_order(*_csr(P)))
    f = Firsttouch()
    prepared = f.prepare(G, {"threads_per_row": 2})
    assert "y_renumbered" not in prepared.extra and prepared.extra["rows"] is None  # y written in place
    x = np.random.default_rng(2).random(P.shape[1])
    y = cupy.full(P.shape[0], np.nan)
    f.run(prepared, cupy.asarray(x), y)
    np.testing.assert_allclose(cupy.asnumpy(y), f.run_reference(f.prepare_reference(P, {"threads_per_row": 2}), x),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(InvalidConfigError, match="rows in order already"):
        f.prepare(cusp.csr_matrix(_stencil(48)))
