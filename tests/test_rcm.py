"""rcm: the orders are permutations, they give a renumbered matrix of narrow band where the numbering was
random, and a product through them is A·x (the conformance suite, tests/test_kernels.py, runs every config
on every case on the CPU and the GPU)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from kernels.rcm import Rcm, orders, renumbered
from tuner.matrix.io import as_csr


def _bandwidth(A: sp.csr_matrix) -> int:
    coo = A.tocoo()
    return int(np.abs(coo.row.astype(np.int64) - coo.col).max())


def _shuffled_grid(side: int, seed: int) -> sp.csr_matrix:
    """A 2-D 5-point Laplacian with its vertices numbered at random: local structure, scattered columns."""
    one = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(side, side))
    grid = sp.kronsum(one, one, format="csr")
    p = np.random.default_rng(seed).permutation(side * side)
    return as_csr(grid[p][:, p])


def test_a_randomly_numbered_grid_gets_back_a_narrow_band():
    A = _shuffled_grid(40, seed=1)
    rows, cols = orders(A)
    assert np.array_equal(rows, cols)  # square: one order, the diagonal stays the diagonal
    assert np.array_equal(np.sort(rows), np.arange(A.shape[0]))
    B = renumbered(A, rows, cols)
    assert _bandwidth(A) > 1000 and _bandwidth(B) <= 2 * 40  # a front of about one grid line
    assert B.has_canonical_format and B.indices.dtype == np.int32
    np.testing.assert_array_equal(B.diagonal(), A.diagonal()[rows])


def test_a_rectangular_matrix_gets_a_row_order_and_a_column_order():
    A = as_csr(sp.random(300, 70, density=0.05, format="csr", random_state=2))
    rows, cols = orders(A)
    assert np.array_equal(np.sort(rows), np.arange(300)) and np.array_equal(np.sort(cols), np.arange(70))
    x = np.random.default_rng(3).standard_normal(70)
    np.testing.assert_allclose(renumbered(A, rows, cols) @ x[cols], (A @ x)[rows], rtol=1e-12, atol=1e-12)


def test_the_reference_goes_through_the_renumbered_matrix_and_back():
    """y = A·x from B·x[cols] scattered to rows; the inner csr_vector sees B, not A."""
    A = _shuffled_grid(20, seed=4)
    f = Rcm()
    p = f.prepare_reference(A, {"threads_per_row": 4, "block_size": 128})
    assert _bandwidth(p.extra["inner"].A) < _bandwidth(A)
    x = np.random.default_rng(5).standard_normal(A.shape[1])
    np.testing.assert_allclose(f.run_reference(p, x), A @ x, rtol=1e-12, atol=1e-12)
