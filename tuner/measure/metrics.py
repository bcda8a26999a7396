"""Throughput figures, computed one way everywhere (DESIGN.md, "Measuring")."""

from __future__ import annotations

import numpy as np


def effective_bytes(rows: int, cols: int, nnz: int, dtype: np.dtype | str) -> int:
    """Fewest bytes one CSR SpMV must move: values and column indices, row pointer, x read once, y written."""
    v = np.dtype(dtype).itemsize
    return nnz * (v + 4) + (rows + 1) * 4 + cols * v + rows * v


def gflops(nnz: int, seconds: float) -> float:
    """2·nnz floating-point operations per product."""
    return 2 * nnz / seconds / 1e9 if seconds > 0 else 0.0


def gbps(rows: int, cols: int, nnz: int, dtype: np.dtype | str, seconds: float) -> float:
    return effective_bytes(rows, cols, nnz, dtype) / seconds / 1e9 if seconds > 0 else 0.0
