"""The executor of ``plan(A)`` for a dense x: the kernel prepared once for one matrix, y = ex(x) on every call.

It runs the config :func:`tuner.execute.choice.choose` picked (on the GPU),
or, on a machine without a GPU, SciPy's product.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from kernels import Prepared, get_family
from tuner.execute.choice import Choice
from tuner.execute.race import RaceResult
from tuner.execute.replay import BoundProduct, bind
from tuner.measure.backend import GpuBackend

SHORT_PRODUCT_S = 10e-6
"""A product measured shorter than this is host-bound in a caller's loop: :meth:`Executor.explain` points at
:meth:`Executor.bind` (``bench/loop.py``: 8-15 us a call of ``ex(x, out)`` on an H100 and an H200)."""


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

    def __init__(self, *, A: Any, choice: Choice, backend: GpuBackend | None, fingerprint: str,
                 prepared: Prepared | None = None) -> None:
        self.shape: tuple[int, int] = tuple(A.shape)
        self.nnz = int(A.nnz)
        self.dtype = np.dtype(A.dtype)
        self.fingerprint = fingerprint
        self.choice = choice
        self.kernel, self.params, self.source = choice.kernel, choice.params, choice.source
        self.expected_gflops, self.confidence = choice.expected_gflops, choice.confidence
        self.prepare_s: float | None = None
        self.race: RaceResult | None = None  # plan()'s race, when it ran one
        self.cost: dict[str, float] | None = None  # plan()'s seconds, step by step
        self._host = A if backend is None else None
        self.device = "cpu (SciPy)" if backend is None else backend.info.id
        if backend is not None:
            self._backend = backend
            self._family = get_family(self.kernel)
            if prepared is None:  # a raced winner comes prepared already
                prepared, self.prepare_s = backend.timed_prepare(self._family, backend.matrix(A), self.params)
            self._prepared = prepared

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

    def bind(self, x: Any, out: Any = None) -> BoundProduct:
        """y = A·x for this very x, into ``out`` (a new array when None), bound for a loop: ``bound()`` computes
        it from x as x is then, and returns ``out``. On the GPU x and out are CuPy arrays of the matrix's dtype
        and the product is captured as a CUDA graph (:mod:`tuner.execute.replay`): a call is one launch, for
        products so short that the host's ~10 us a call is what a loop of ``ex(x, out)`` waits on. Without a GPU,
        NumPy arrays, and each call is SciPy's product."""
        if self._host is not None:
            out = np.empty(self.shape[0], dtype=self.dtype) if out is None else out
            self(x, out)  # checks x and out
            return BoundProduct(lambda: self(x, out), out, reason="no GPU: SciPy computes y")
        cp = self._backend.cp
        if not isinstance(x, cp.ndarray) or x.dtype != self.dtype or not x.flags.c_contiguous:
            raise ValueError(f"bind() takes a contiguous CuPy x of dtype {self.dtype} (the product reads it where "
                             f"it lies), got {type(x).__name__} of dtype {getattr(x, 'dtype', None)}")
        out = cp.empty(self.shape[0], dtype=self.dtype) if out is None else out
        self(x, out)  # checks x and out, and compiles what the product launches
        product = functools.partial(self._family.run, self._prepared, x, out)
        if (reason := self._family.uncapturable(self._prepared.params)) is not None:
            return BoundProduct(product, out, reason=reason)
        return bind(product, out)

    def explain(self) -> str:
        """Why this kernel: where its config came from, what is known of its speed, and what plan() spent."""
        why = {
            "tuned": "the store holds a tuned best config for this matrix on this device and dtype",
            "raced": "no config was measured for this matrix on this device and dtype before: the race at plan "
                     "time measured these and kept the fastest (the store now holds them)",
            "predicted": "nothing is measured for this matrix on this device and dtype: the selector's first "
                         "config (plan(effort='predict'): the first cheap to prepare, or cuSPARSE where the training "
                         "matrices nearest this one mostly ran it faster), unmeasured (plan(effort='race') measures a "
                         "shortlist; `tuner tune` tunes)",
            "default": "nothing is stored for this matrix on this device and dtype, and no selector ranks configs "
                       "for this GPU: cuSPARSE, the safe default (plan(effort='race') or `tuner tune` measure)",
            "cpu": "no CUDA GPU (or CuPy) here: SciPy computes y on the CPU",
        }[self.source]
        if self.choice.time_s:
            speed = f"{self.choice.time_s * 1e6:.1f} us a product ({self.expected_gflops:.1f} GFLOP/s) as measured"
            if self.choice.cusparse_time_s:
                speed += f", {self.choice.cusparse_time_s / self.choice.time_s:.2f}x cuSPARSE's best measured beside"
        elif self.expected_gflops:
            speed = f"{self.expected_gflops:.1f} GFLOP/s expected by the selector"
        else:
            speed = "speed unknown"
        if self.confidence is not None:
            speed += f"; {self.confidence:.0%} of the selector's trees rank it first"
        lines = [f"{self.kernel} {self.params} for a {self.shape[0]}x{self.shape[1]} {self.dtype} matrix with "
                 f"{self.nnz} nonzeros on {self.device}: {why}; {speed}."]
        if self.choice.time_s and self.choice.time_s < SHORT_PRODUCT_S and self._host is None:
            lines.append("a product this short waits on the host in a loop of ex(x, out) (8-15 us a call): "
                         "ex.bind(x, out) makes each call one CUDA graph launch")
        if self.choice.basis:
            lines.append(f"ranked by: {self.choice.basis}")
        if self.race is not None:
            lines += ["the race (fastest first; * ran):", *(f"  {line}" for line in self.race.table())]
        if self.cost:
            steps = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.cost.items() if k != "total")
            lines.append(f"plan() took {self.cost['total'] * 1e3:.1f} ms ({steps} ms)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        speed = f", ~{self.expected_gflops:.1f} GFLOP/s" if self.expected_gflops else ""
        return f"<Executor {self.kernel} {self.params} source={self.source!r}{speed}>"


__all__ = ["Executor"]
