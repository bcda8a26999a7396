"""The executor of ``plan(A)`` for a dense x: the kernel prepared once for one matrix, y = ex(x) on every call.

It runs the config :func:`tuner.execute.choice.choose` picked (on the GPU),
or, on a machine without a GPU, SciPy's product.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels import get_family
from tuner.execute.choice import Choice
from tuner.measure.backend import GpuBackend


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


__all__ = ["Executor"]
