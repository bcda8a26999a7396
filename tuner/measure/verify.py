"""Checking a kernel's y against a float64 reference before it is ever timed.

The bound is element-wise and scaled by |A|·|x|, so a row of large terms that
cancel is judged against the size of its terms, not its tiny sum; it grows with
the square root of the longest row, the typical growth of rounding error in a
sum with mixed signs. An absolute term of (longest row) x the smallest normal
number covers products that underflow to subnormals, whose rounding error is
absolute, not relative. A missing or doubled entry is far above it in both dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Reference:
    """y = A·x and |A|·|x| in float64 for one random x, and the tolerance for a dtype."""

    x: np.ndarray
    y: np.ndarray
    scale: np.ndarray
    rtol: float
    atol: float = 0.0

    @classmethod
    def build(cls, A, dtype: np.dtype | str, *, seed: int = 0) -> Reference:
        dtype = np.dtype(dtype)
        x = np.random.default_rng(seed).uniform(-1.0, 1.0, A.shape[1]).astype(dtype)
        A64 = A.astype(np.float64)
        x64 = x.astype(np.float64)
        y = A64 @ x64
        scale = abs(A64) @ np.abs(x64)
        npr_max = int(np.diff(A.indptr).max(initial=0))
        rtol = float(np.finfo(dtype).eps) * (8.0 + 2.0 * np.sqrt(npr_max))
        atol = float(np.finfo(dtype).tiny) * 2.0 * max(npr_max, 1)
        return cls(x=x, y=np.asarray(y), scale=np.asarray(scale), rtol=rtol, atol=atol)

    def check(self, y: np.ndarray) -> tuple[bool, float, str]:
        """(passed, max relative error, message). NaN anywhere fails: outputs are poisoned with NaN first."""
        y = np.asarray(y, dtype=np.float64)
        if y.shape != self.y.shape:
            return False, float("inf"), f"y has shape {y.shape}, expected {self.y.shape}"
        bad = ~np.isfinite(y)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return False, float("inf"), f"{int(bad.sum())} entries of y not finite (first: row {i}); unwritten?"
        err = np.maximum(np.abs(y - self.y) - self.atol, 0.0)
        tiny = np.finfo(np.float64).tiny
        rel = err / np.maximum(self.scale, tiny)
        worst = int(np.argmax(rel)) if rel.size else 0
        max_rel = float(rel[worst]) if rel.size else 0.0
        if max_rel > self.rtol:
            return False, max_rel, (
                f"row {worst}: y={y[worst]!r}, reference {self.y[worst]!r} "
                f"(relative error {max_rel:.3g} > bound {self.rtol:.3g})"
            )
        return True, max_rel, ""
