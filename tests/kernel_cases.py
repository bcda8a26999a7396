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


def arrow(n: int) -> sp.csr_matrix:
    """A diagonal plus one full first row: a row that crosses thousands of tiles of a load-balanced kernel."""
    return as_csr(sp.eye(n, format="csr") + sp.csr_matrix((np.ones(n), (np.zeros(n, int), np.arange(n))),
                                                          shape=(n, n)))


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


def gpu_runs(family, A: sp.csr_matrix, dtype: str, params: dict, *, runs: int = 2):
    """``A`` prepared by ``family``'s CPU reference and on the GPU, the GPU product run ``runs`` times into an
    output filled with NaN first (what a run reuses must not accumulate), each y checked against SciPy.

    Returns ``(ref, cpu, gpu, expected, x, y)``: the reference, both prepared matrices, the reference
    decomposition's y, x on the GPU and the last GPU y (on the host).
    """
    import cupy
    import cupyx.scipy.sparse as cusp

    from tuner.measure.verify import Reference

    ref = Reference.build(A, dtype, seed=2)
    cpu = family.prepare_reference(A, params)
    expected = family.run_reference(cpu, ref.x)
    gpu = family.prepare(cusp.csr_matrix(A), params)
    x = cupy.asarray(ref.x)
    out = cupy.empty(A.shape[0], dtype=dtype)
    for _ in range(runs):
        out.fill(cupy.nan)
        y = family.run(gpu, x, out).get()
        ok, _, msg = ref.check(y)
        assert ok, f"{params}: {msg}"
    return ref, cpu, gpu, expected, x, y
