"""``plan(A)``: a ready-to-call y = A·x with the best config known for this matrix and GPU.

Where the config comes from is part of the answer (``ex.source``):
``'tuned'`` when the store has a best config for this matrix's fingerprint on
this device model and dtype, ``'predicted'`` when it has none but holds a
trained selector for the device and dtype (:mod:`tuner.select.model`), ``'default'``
otherwise (cuSPARSE, the safe choice), and ``'cpu'`` on a machine without a
GPU, where SciPy computes y.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.errors import InvalidConfigError
from db.store import Store
from kernels import BASELINE, get_family
from kernels._cuda import gpu_available
from tuner.matrix.features import FEATURE_NAMES, extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.io import as_csr
from tuner.measure.backend import GpuBackend
from tuner.select.shipped import may_predict

if TYPE_CHECKING:
    from tuner.execute.spmspv import SpMSpVExecutor


class Executor:
    """y = ex(x): the prepared kernel for one matrix, with where its config came from.

    Example (on a generated matrix)::

        from tuner import plan
        from tuner.matrix.generate import generate
        A = generate("poisson2d", n=500)
        ex = plan(A)
        y = ex(np.ones(A.shape[1]))
        print(ex.explain())
    """

    def __init__(self, *, A: Any, choice: Choice, backend: GpuBackend | None, fingerprint: str) -> None:
        self.shape: tuple[int, int] = tuple(A.shape)
        self.nnz = int(A.nnz)
        self.dtype = np.dtype(A.dtype)
        self.fingerprint = fingerprint
        self.kernel, self.params, self.source = choice.kernel, choice.params, choice.source
        self.expected_gflops, self.confidence = choice.expected_gflops, choice.confidence
        self.prepare_s: float | None = None
        self._host = A if backend is None else None
        self.device = "cpu (SciPy)" if backend is None else backend.info.id
        if backend is not None:
            self._backend = backend
            self._family = get_family(self.kernel)
            self._prepared, self.prepare_s = backend.timed_prepare(self._family, backend.matrix(A), self.params)

    def __call__(self, x: Any, out: Any = None) -> Any:
        """y = A·x. A NumPy x gives a NumPy y (copied through the GPU), a CuPy x a CuPy y."""
        if getattr(x, "shape", None) != (self.shape[1],):
            raise ValueError(f"x must have shape ({self.shape[1]},) for A of shape {self.shape}, "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
        if self._host is not None:
            y = self._host @ np.asarray(x, dtype=self.dtype)
            if out is None:
                return y
            out[...] = y
            return out
        cp = self._backend.cp
        on_gpu = isinstance(x, cp.ndarray)
        x_dev = cp.asarray(x, dtype=self.dtype)
        if on_gpu:
            return self._family.run(self._prepared, x_dev, out)
        y = self._family.run(self._prepared, x_dev).get()
        if out is None:
            return y
        out[...] = y
        return out

    def explain(self) -> str:
        """Why this kernel: the source of the config and what is known of its speed."""
        why = {
            "tuned": "the store holds a tuned best config for this matrix on this device and dtype",
            "predicted": "nothing is tuned for this matrix on this device and dtype: the trained selector "
                         "predicted this config from the matrix's features (run `tuner tune` to tune it)",
            "default": "nothing is stored for this matrix on this device and dtype: cuSPARSE, the safe default "
                       "(run `tuner tune` to tune it)",
            "cpu": "no CUDA GPU (or CuPy) here: SciPy computes y on the CPU",
        }[self.source]
        when = "as the nearest tuned matrices measured it" if self.source == "predicted" else "when tuned"
        speed = f"{self.expected_gflops:.1f} GFLOP/s {when}" if self.expected_gflops else "speed unknown"
        if self.confidence is not None:
            speed += f"; the selector's confidence in the family: {self.confidence:.0%}"
        return (f"{self.kernel} {self.params} for a {self.shape[0]}x{self.shape[1]} {self.dtype} matrix "
                f"with {self.nnz} nonzeros on {self.device}: {why}; {speed}.")

    def __repr__(self) -> str:
        speed = f", ~{self.expected_gflops:.1f} GFLOP/s" if self.expected_gflops else ""
        return f"<Executor {self.kernel} {self.params} source={self.source!r}{speed}>"


@dataclass(frozen=True)
class Choice:
    """A kernel config and where it came from ('tuned', 'predicted' or 'default'); for a tuned one, the
    times of it and of cuSPARSE the store holds (``cusparse_time_s`` may be unknown); for a predicted one,
    the GFLOP/s its neighbours measured (may be unknown) and the selector's probability of the family."""

    kernel: str
    params: dict[str, Any]
    source: str
    expected_gflops: float | None = None
    time_s: float | None = None
    cusparse_time_s: float | None = None
    confidence: float | None = None


def choose(fp: str, *, store: Store | None, device: str, dtype: str, use_tuned: bool = True,
           features: Mapping[str, float] | None = None) -> Choice:
    """The config plan() runs: the stored best for (fingerprint, device, dtype), else the
    prediction from ``features`` of the store's latest model for (device, dtype) or, without one, of
    the model shipped in the package for exactly that device and dtype, else the default.

    ``use_tuned=False`` gives what plan() would pick for a matrix it has never
    tuned (the benchmark compares that with the tuned best).
    """
    best = store.best(fp, device=device, dtype=dtype) if (use_tuned and store is not None) else None
    if best is not None:
        return Choice(best["kernel"], best["params"], "tuned", best["gflops"], best["time_s"], best["cusparse_time_s"])
    if features is not None and set(FEATURE_NAMES) <= set(features) and may_predict(store, device, dtype):
        from tuner.select.model import find_model  # scikit-learn only when a model is stored or shipped

        model = find_model(store, device=device, dtype=dtype)
        if model is not None:
            p = model.predict_details(features)[0]
            try:  # a model trained before the registry changed may name what no longer exists
                return Choice(p.kernel, get_family(p.kernel).space.validate(p.params, family=p.kernel), "predicted",
                              expected_gflops=p.expected_gflops, confidence=p.confidence)
            except InvalidConfigError:
                pass
    return Choice(BASELINE, get_family(BASELINE).space.defaults(), "default")


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


__all__ = ["Choice", "Executor", "choose", "plan"]
