"""``plan(A, op="spmspv")``: y = A·x for a sparse x, in the mode that suits this call.

The executor keeps both representations of A, built once: CSC for the sparse
mode and, for the dense mode, what its SpMV needs (:mod:`kernels.spmspv`): the
config ``plan(A)`` would run, or the paper's NuT tiles. It picks a mode per
call from x's fill (nnz(x) / cols) through a table that the mode selector
(:mod:`tuner.select.spmspv_selector`) filled for this matrix at plan time.
Without a GPU the same API runs both modes' CPU references.

x may be an ``(indices, values)`` tuple of NumPy or CuPy arrays, or a SciPy or
CuPy sparse matrix/array of shape (1, n) or (n, 1). Indices need not be sorted;
duplicate indices are summed (as SciPy does for COO); an index outside
``[0, n)``, NaN or Inf values, or mismatched lengths raise ``ValueError``.
y is ``(indices, values)``: int32 indices ascending, exactly the rows where y is
nonzero; ``ex(x, dense=True)`` gives the dense y instead.

Example::

    from tuner import plan
    from tuner.matrix.generate import generate
    ex = plan(generate("powerlaw", rows=100_000), op="spmspv")
    idx, val = ex((np.array([0, 5, 9]), np.ones(3)))
    print(ex.last_mode, ex.explain())
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from db.shared import shared_store
from db.store import Store
from kernels._cuda import gpu_available, require_cupy
from kernels.spmspv import MODES, sum_runs
from tuner.execute.choice import choose
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.io import as_csr
from tuner.select import spmspv_selector


def as_sparse_vector(x: Any, n: int, dtype: Any, xp: Any = np) -> tuple[Any, Any]:
    """``x`` as canonical ``xp`` arrays (int32 indices strictly increasing, values of ``dtype``).

    Raises ``TypeError`` for what is not a sparse vector and ``ValueError`` naming
    what is wrong with one (shape, lengths, an index out of range, NaN/Inf).
    """
    if isinstance(x, tuple) and len(x) == 2:
        indices, values = x
    elif sp.issparse(x) or type(x).__module__.startswith("cupyx.scipy.sparse"):
        if x.shape not in ((1, n), (n, 1)):
            raise ValueError(f"a sparse x must have shape (1, {n}) or ({n}, 1) for A with {n} columns, got {x.shape}")
        coo = x.tocoo()
        indices, values = (coo.col if x.shape[0] == 1 else coo.row), coo.data
    else:
        raise TypeError(f"x must be an (indices, values) tuple or a sparse vector, got {type(x).__name__}; "
                        "for a dense x use plan(A) (SpMV)")
    indices, values = xp.asarray(indices), xp.asarray(values)
    if indices.ndim != 1 or values.ndim != 1 or indices.shape != values.shape:
        raise ValueError(f"x's indices and values must be 1-D of one length, got shapes {indices.shape} and "
                         f"{values.shape}")
    if indices.size and indices.dtype.kind not in "iu":
        raise ValueError(f"x's indices must be integers, got dtype {indices.dtype}")
    if values.dtype.kind not in "biuf":
        raise ValueError(f"x's values must be real numbers, got dtype {values.dtype}")
    values = values.astype(dtype, copy=False)
    if indices.size == 0:
        return xp.empty(0, dtype=xp.int32), values
    indices = indices.astype(xp.int64, copy=False)
    steps = indices[1:] - indices[:-1]
    lo, hi, increasing, finite = (int(v) for v in _to_host(xp, xp.stack([
        indices.min(), indices.max(), xp.all(steps > 0).astype(xp.int64),
        xp.all(xp.isfinite(values)).astype(xp.int64)])))
    if lo < 0 or hi >= n:
        raise ValueError(f"x has index {lo if lo < 0 else hi}, outside [0, {n}) for A with {n} columns")
    if not finite:
        raise ValueError("x's values hold NaN or Inf")
    if not increasing:  # sort, and sum duplicates
        indices, values = sum_runs(xp, indices, values)
    return indices.astype(xp.int32), xp.ascontiguousarray(values)


def _to_host(xp: Any, a: Any) -> np.ndarray:
    return a if xp is np else a.get()


class SpMSpVExecutor:
    """y = ex(x) for sparse x: both modes prepared, one picked per call (``ex.last_mode`` says which)."""

    def __init__(self, A: sp.csr_matrix, *, on_gpu: bool, table: tuple[np.ndarray, np.ndarray],
                 selector_source: str, device: str, fingerprint: str,
                 params: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.shape: tuple[int, int] = tuple(A.shape)
        self.nnz = int(A.nnz)
        self.dtype = np.dtype(A.dtype)
        self.fingerprint, self.device, self.selector_source = fingerprint, device, selector_source
        self.table = table
        self._mode_at = spmspv_selector.mode_lookup(table)
        self.last_mode: str | None = None
        params = params or {}
        if on_gpu:
            import cupyx.scipy.sparse as cusp

            self.xp = require_cupy()
            A_dev = cusp.csr_matrix(A)
            self._prepared = {name: mode.prepare(A_dev, params.get(name)) for name, mode in MODES.items()}
        else:
            self.xp = np
            self._prepared = {name: mode.prepare_reference(A, params.get(name)) for name, mode in MODES.items()}
        self.params = {name: p.params for name, p in self._prepared.items()}
        csr = A.indptr.nbytes + A.indices.nbytes + A.data.nbytes
        self.memory = {"csr_bytes": csr, **{
            f"{name}_vs_csr": (MODES[name].structure_bytes(p) / csr if csr else 0.0)
            for name, p in self._prepared.items()}}

    def choose_mode(self, x_nnz: int) -> str:
        """The mode for an x with ``x_nnz`` nonzeros: the plan-time table at fill x_nnz / cols."""
        return self._mode_at(x_nnz / max(self.shape[1], 1))

    def __call__(self, x: Any, *, dense: bool = False, mode: str | None = None) -> Any:
        """y = A·x; ``mode`` ('sparse' or 'dense') overrides the selector for this call."""
        indices, values = as_sparse_vector(x, self.shape[1], self.dtype, self.xp)
        y = self.run(indices, values, mode=mode)
        if not dense:
            return y
        out = self.xp.zeros(self.shape[0], dtype=self.dtype)
        out[y[0]] = y[1]
        return out

    def run(self, indices: Any, values: Any, *, mode: str | None = None) -> tuple[Any, Any]:
        """y = A·x for x already canonical (as :func:`as_sparse_vector` returns it): no checks, no copies."""
        if mode is not None and mode not in MODES:
            raise ValueError(f"unknown SpMSpV mode {mode!r}; modes are {sorted(MODES)}")
        self.last_mode = mode = mode or self.choose_mode(int(indices.shape[0]))
        prepared = self._prepared[mode]
        if self.xp is np:
            return MODES[mode].run_reference(prepared, indices, values)
        return MODES[mode].run(prepared, indices, values)

    def crossover(self) -> float | None:
        """The smallest fill of the table at which the dense mode is chosen (None: never)."""
        fills, modes = self.table
        dense = np.flatnonzero(modes == "dense")
        return float(fills[dense[0]]) if dense.size else None

    def explain(self) -> str:
        where = "the GPU" if self.xp is not np else "the CPU references"
        rule = {"trained": "the SVM selector trained in the store", "shipped": "the SVM selector shipped for this GPU",
                "default": f"the default rule (no selector trained for this GPU and dtype: sparse below fill "
                           f"{spmspv_selector.DEFAULT_CROSSOVER:g})"}[self.selector_source]
        cross = self.crossover()
        at = f"dense from fill {cross:.2g} on" if cross is not None else "sparse at every fill"
        mem = ", ".join(f"{k[:-7]} {v:.2f}x CSR" for k, v in self.memory.items() if k.endswith("_vs_csr"))
        dense = dict(self.params["dense"])
        spmv = dense.pop("kernel")
        return (f"SpMSpV for a {self.shape[0]}x{self.shape[1]} {self.dtype} matrix with {self.nnz} nonzeros on "
                f"{where} ({self.device}): modes chosen by {rule}, {at}; the dense mode runs {spmv} {dense}; "
                f"memory beyond the CSR: {mem}.")

    def __repr__(self) -> str:
        return f"<SpMSpVExecutor {self.shape} selector={self.selector_source!r} last_mode={self.last_mode!r}>"


def plan_spmspv(A: Any, *, dtype: str | None = None, db: str | os.PathLike | Store | None = None,
                params: Mapping[str, Mapping[str, Any]] | None = None) -> SpMSpVExecutor:
    """Prepare y = A·x for sparse x (see :func:`tuner.execute.plan.plan` with ``op="spmspv"``).

    ``params`` may set each mode's parameters (``{"sparse": {...}, "dense": {"kernel": ..., ...}}``). On a
    GPU the dense mode runs, unless told otherwise, the SpMV that ``plan(A)`` runs (tuned, predicted or
    cuSPARSE): on Hopper that beats the paper's NuT on most matrices (``{"dense": {"kernel": "nut"}}``
    runs NuT). Without a GPU the dense mode's reference is NuT's.
    """
    A = as_csr(A, dtype=dtype)
    fp = fingerprint(A)
    on_gpu = gpu_available()
    device = "cpu (references)"
    selector, source = None, "default"
    params = dict(params or {})
    if on_gpu:  # (without a GPU no selector applies and the dense mode is NuT's reference: no features needed)
        from tuner.measure.backend import GpuBackend

        features = extract_features(A)
        device = GpuBackend().info.id
        store = db if isinstance(db, Store) else shared_store(db)
        selector, source = spmspv_selector.load(store, device=device, dtype=str(A.dtype))
        if "dense" not in params:  # the SpMV that plan(A) would run: tuned, predicted or cuSPARSE
            choice = choose(fp, store=store, device=device, dtype=str(A.dtype), features=features)
            params["dense"] = {"kernel": choice.kernel, **choice.params}
    table = selector.crossover_table(features) if selector else spmspv_selector.default_table()
    return SpMSpVExecutor(A, on_gpu=on_gpu, table=table, selector_source=source, device=device, fingerprint=fp,
                          params=params)


__all__ = ["SpMSpVExecutor", "as_sparse_vector", "plan_spmspv"]
