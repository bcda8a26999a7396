"""``plan(A)``: a ready-to-call y = A·x with the best config known for this matrix and GPU.

``op="spmv"`` (a dense x) gives an :class:`~tuner.execute.executor.Executor`
running the config of :func:`~tuner.execute.choice.choose` (``ex.source`` says
where it came from); ``op="spmspv"`` (a sparse x) a
:class:`~tuner.execute.spmspv.SpMSpVExecutor`. ``from tuner import plan`` is this.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from db.store import Store
from kernels._cuda import gpu_available
from tuner.execute.choice import Choice, choose
from tuner.execute.executor import Executor
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.io import as_csr
from tuner.measure.backend import GpuBackend
from tuner.select.shipped import may_predict

if TYPE_CHECKING:
    from tuner.execute.spmspv import SpMSpVExecutor


def plan(A: Any, *, dtype: str | None = None, db: str | os.PathLike | Store | None = None,
         op: str = "spmv") -> Executor | SpMSpVExecutor:
    """Prepare y = A·x for ``A`` (a .mtx path, SciPy/CuPy sparse matrix or CSR triple).

    Looks up the tuned best config for this matrix (by structural fingerprint)
    on this GPU model and dtype in the store ``db`` (default: the per-user
    store); without one it uses cuSPARSE. Preprocessing happens here, once.
    ``op="spmspv"`` prepares y = A·x for a *sparse* x instead
    (:class:`~tuner.execute.spmspv.SpMSpVExecutor`).
    """
    if op == "spmspv":
        from tuner.execute.spmspv import plan_spmspv

        return plan_spmspv(A, dtype=dtype, db=db)
    if op != "spmv":
        raise ValueError(f"unknown op {op!r}: 'spmv' (dense x) or 'spmspv' (sparse x)")
    given, A = A, as_csr(A, dtype=dtype)
    fp = fingerprint(A)
    if not gpu_available():
        return Executor(A=A, choice=Choice("scipy", {}, "cpu"), backend=None, fingerprint=fp)
    backend = GpuBackend()
    store = db if isinstance(db, Store) else Store(db)
    # only a model needs them; on the GPU for a canonical CuPy CSR matrix already there
    on_gpu = type(given).__module__.startswith("cupyx") and getattr(given, "format", None) == "csr" and \
        given.has_canonical_format
    features = extract_features(given if on_gpu else A) if may_predict(store, backend.info.id, str(A.dtype)) \
        else None
    choice = choose(fp, store=store, device=backend.info.id, dtype=str(A.dtype), features=features)
    return Executor(A=A, choice=choice, backend=backend, fingerprint=fp)


__all__ = ["plan"]
