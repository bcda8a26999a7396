"""Small matrices with the shapes that break SpMV kernels, built from fixed seeds.

Shared by the CPU conformance suite and the GPU tests, so both check the same cases.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tests.conftest import SHARED_MATRICES, shared_manifest
from tuner.matrix.io import as_csr, read_mtx


def _random(rows: int, cols: int, density: float, seed: int) -> sp.csr_matrix:
    return as_csr(sp.random(rows, cols, density=density, format="csr", random_state=seed))


def _huge_row(rows: int, cols: int, seed: int) -> sp.csr_matrix:
    A = sp.random(rows, cols, density=3 / cols, format="lil", random_state=seed)
    A[rows // 2, :] = np.random.default_rng(seed).uniform(0.5, 1.0, cols)
    return as_csr(A)


def _empty_rows(rows: int, cols: int, seed: int) -> sp.csr_matrix:
    A = sp.random(rows, cols, density=0.05, format="csr", random_state=seed)
    keep = np.random.default_rng(seed).random(rows) < 0.3
    return as_csr(sp.diags(keep.astype(float)) @ A)


CASES = {
    "zero_nnz": lambda: as_csr(sp.csr_matrix((7, 5))),
    "zero_rows": lambda: as_csr(sp.csr_matrix((0, 4))),
    "one_by_one": lambda: as_csr(sp.csr_matrix(np.array([[2.5]]))),
    "one_row": lambda: _random(1, 300, 0.5, 1),
    "one_column": lambda: _random(300, 1, 0.5, 2),
    "rectangular_wide": lambda: _random(40, 700, 0.05, 3),
    "rectangular_tall": lambda: _random(700, 40, 0.05, 4),
    "empty_rows": lambda: _empty_rows(500, 400, 5),
    "huge_row": lambda: _huge_row(600, 5000, 6),
    "random": lambda: _random(1000, 1000, 0.01, 7),
}


def shared_cases() -> list[str]:
    """Names of the real (non-complex) shared matrices, for parametrization."""
    return [r["name"] for r in shared_manifest() if r["field"] != "complex"]


def load_shared(name: str) -> sp.csr_matrix:
    return read_mtx(SHARED_MATRICES / f"{name}.mtx.gz")
