"""Checking a kernel's y against a float64 reference before it is ever timed.

The bound is element-wise and scaled by |A|·|x|, so a row of large terms that
cancel is judged against the size of its terms, not its tiny sum; it grows with
the square root of the longest row, the typical growth of rounding error in a
sum with mixed signs. An absolute term of (longest row) x the smallest normal
number covers products that underflow to subnormals, whose rounding error is
absolute, not relative. A missing or doubled entry is far above it in both dtypes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels._cuda import C_TYPES, c_type, get_kernels, grid


@dataclass(frozen=True)
class Reference:
    """y = A·x and |A|·|x| in float64 for one random x, and the tolerance for a dtype.

    Where A is: NumPy and SciPy for a SciPy matrix, for a CuPy one on the GPU (:func:`_products_on_gpu`: one
    pass, no copy of A), so a matrix on the GPU is checked there without a copy to the host (``plan()``'s race
    checks every entrant this way). ``x`` is in the dtype, on the same side as A.
    """

    x: Any
    y: Any
    scale: Any
    rtol: float
    atol: float = 0.0

    @classmethod
    def build(cls, A: Any, dtype: np.dtype | str, *, seed: int = 0, npr_max: int | None = None,
              behind: bool = False) -> Reference:
        """The reference of ``A`` (SciPy, or CuPy: on the GPU) for one x drawn from ``seed``.

        ``npr_max``: A's longest row, where the caller knows it already (the features hold it): on the GPU
        the reference then costs no wait. ``behind`` (GPU only): its products run on a stream of their own
        while the host goes on (``plan()`` ranks the configs meanwhile); work queued afterwards on the
        current stream waits for them, the host does not.
        """
        dtype = np.dtype(dtype)
        if type(A).__module__.startswith("cupyx"):
            import cupy

            side = _side_stream(cupy.cuda.Device().id) if behind else None
            if side is not None:  # it starts once what is queued before it (A itself, maybe) is done
                side.wait_event(cupy.cuda.get_current_stream().record())
            with side if side is not None else contextlib.nullcontext():
                x = cupy.empty(A.shape[1], dtype=dtype)
                _uniform_kernel()(np.uint64(seed), x)  # a new cupy RandomState costs 0.5 ms: a race's 4 SpMVs
                y, scale = _products_on_gpu(A if A.dtype == dtype else A.astype(dtype), x)
                if npr_max is None:
                    npr_max = int(cupy.diff(A.indptr).max()) if A.shape[0] else 0
                done = side.record() if side is not None else None
            if done is not None:
                cupy.cuda.get_current_stream().wait_event(done)
        else:
            x = np.random.default_rng(seed).uniform(-1.0, 1.0, A.shape[1]).astype(dtype)
            A64 = A.astype(np.float64)
            x64 = x.astype(np.float64)
            y = np.asarray(A64 @ x64)
            scale = np.asarray(abs(A64) @ np.abs(x64))
            if npr_max is None:
                npr_max = int(np.diff(A.indptr).max(initial=0))
        rtol = float(np.finfo(dtype).eps) * (8.0 + 2.0 * np.sqrt(npr_max))
        atol = float(np.finfo(dtype).tiny) * 2.0 * max(npr_max, 1)
        return cls(x=x, y=y, scale=scale, rtol=rtol, atol=atol)

    def check_all(self, ys: Sequence[Any]) -> list[tuple[bool, float, str]]:
        """:meth:`check` of each of ``ys``; on the GPU, every check is queued behind the products that wrote
        them and their worst errors read back at once (a race checks its entrants so: the GPU runs one's
        product while the host queues the next), a failed one then checked again to say why."""
        if not ys or not type(self.y).__module__.startswith("cupy"):
            return [self.check(y) for y in ys]
        import cupy

        worst = cupy.zeros(len(ys), dtype=cupy.uint64)
        fast = [bool(type(y).__module__.startswith("cupy") and y.shape == self.y.shape and y.size) for y in ys]
        for i, y in enumerate(ys):
            if fast[i]:
                _queue_worst_rel(y, self.y, self.scale, self.atol, worst[i:i + 1])
        values = worst.get().view(np.float64).tolist()
        return [(True, value, "") if quick and value <= self.rtol else self.check(y)
                for y, quick, value in zip(ys, fast, values, strict=True)]

    def check(self, y: Any) -> tuple[bool, float, str]:
        """(passed, max relative error, message). NaN anywhere fails: outputs are poisoned with NaN first.
        ``y`` may be on either side; it is compared where the reference is."""
        xp = _module(self.y)
        if xp is np and not isinstance(y, np.ndarray):
            y = y.get()
        y = xp.asarray(y)
        if y.shape != self.y.shape:
            return False, float("inf"), f"y has shape {y.shape}, expected {self.y.shape}"
        if not y.size:
            return True, 0.0, ""
        if xp is not np:  # one pass, one reduction and one read-back on the GPU; what failed is found below
            if (worst_rel := _worst_rel_on_gpu(y, self.y, self.scale, self.atol)) <= self.rtol:
                return True, worst_rel, ""
        y = xp.asarray(y, dtype=xp.float64)
        bad = ~xp.isfinite(y)
        if n_bad := int(bad.sum()):
            first = int(xp.argmax(bad))
            return False, float("inf"), f"{n_bad} entries of y not finite (first: row {first}); unwritten?"
        err = xp.maximum(xp.abs(y - self.y) - self.atol, 0.0)
        rel = err / xp.maximum(self.scale, np.finfo(np.float64).tiny)
        worst = int(xp.argmax(rel))
        max_rel = float(rel[worst])
        if max_rel > self.rtol:
            return False, max_rel, (
                f"row {worst}: y={float(y[worst])!r}, reference {float(self.y[worst])!r} "
                f"(relative error {max_rel:.3g} > bound {self.rtol:.3g})"
            )
        return True, max_rel, ""


REFERENCE_CU, REFERENCE_ENTRIES = "reference_spmv.cu", 8
"""The kernel of the GPU reference (in :data:`kernels._cuda.KERNEL_DIR`) and the entries each thread sums."""


def reference_kernel_names(dtype: Any) -> tuple[str, ...]:
    """The instantiations of ``reference_spmv.cu`` for A's values and x (the reference), and for a y (its
    check), in ``dtype``."""
    return f"reference_spmv<{c_type(dtype)}>", f"rel_error_max<{c_type(dtype)}>"


def _products_on_gpu(A: Any, x: Any) -> tuple[Any, Any]:
    """(A·x, |A|·|x|) in float64 for a CuPy CSR matrix and x of A's dtype, in one pass over A's entries
    (reference_spmv.cu). A float64 copy of A and two cuSPARSE products took 0.9 ms of the GPU's time and 0.6 ms
    of the host's on a 24 M-entry float32 matrix on the H100, this 0.2 ms and 0.07 ms
    (bench/probe_reference.py)."""
    import cupy

    y, scale = cupy.zeros(A.shape[0], dtype=np.float64), cupy.zeros(A.shape[0], dtype=np.float64)
    if A.nnz:
        names = reference_kernel_names(A.dtype)  # one module for the reference and the checks against it
        threads = -(-A.nnz // REFERENCE_ENTRIES)
        get_kernels(REFERENCE_CU, names)[names[0]](
            (grid(threads, 256),), (256,),
            (np.int32(A.shape[0]), np.int64(A.nnz), np.int32(REFERENCE_ENTRIES), A.indptr, A.indices, A.data, x,
             y, scale))
    return y, scale


@functools.cache
def _side_stream(device: int) -> Any:
    """The stream a reference built ``behind`` the host runs on: one a device and process (kept: the memory
    freed on it stays its own), made while ``device`` is current."""
    import cupy

    return cupy.cuda.Stream(non_blocking=True)


@functools.cache
def _uniform_kernel() -> Any:
    """x_i uniform in [-1, 1) from splitmix64 of (seed, i): the same x for the same seed, in one pass."""
    import cupy

    return cupy.ElementwiseKernel(
        "uint64 seed", "T x",
        "unsigned long long z = seed + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ULL;"
        " z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL; z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;"
        " z ^= z >> 31; x = (T)((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);",
        "spmv_reference_x")


def _worst_rel_on_gpu(y: Any, ref: Any, scale: Any, atol: float) -> float:
    """:meth:`Reference.check`'s largest relative error of a CuPy ``y``, in one pass and one read-back of one
    word (``rel_error_max`` in reference_spmv.cu; what failed is found apart). An elementwise kernel, then
    CuPy's maximum, took four launches and an array of the rows' size: a tenth of a millisecond of the host's
    time for every config a race or a search checks."""
    import cupy

    worst = cupy.zeros(1, dtype=cupy.uint64)
    _queue_worst_rel(y, ref, scale, atol, worst)
    return float(worst.get().view(np.float64)[0])


def _queue_worst_rel(y: Any, ref: Any, scale: Any, atol: float, out: Any) -> None:
    """Queue ``rel_error_max`` for a CuPy ``y``: the largest relative error's float64 bits into ``out`` (one zeroed
    uint64 on the GPU), not read back."""
    import cupy

    if y.dtype not in C_TYPES:  # no instantiation for it: checked in float64
        y = y.astype(cupy.float64)
    y = cupy.ascontiguousarray(y)
    names = reference_kernel_names(y.dtype)
    get_kernels(REFERENCE_CU, names)[names[1]](
        (min(grid(y.size, 256), 4096),), (256,), (np.int32(y.size), y, ref, scale, np.float64(atol), out))


def _module(a: Any) -> Any:
    """NumPy for a NumPy array, else CuPy (imported only then)."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy
