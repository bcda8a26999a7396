"""NumPy building blocks shared by the families' CPU references."""

from __future__ import annotations

import numpy as np

from kernels._narrow import reference_columns


def row_ids(indptr: np.ndarray) -> np.ndarray:
    """The row of every stored entry (int32), from a CSR row pointer."""
    m = len(indptr) - 1
    return np.repeat(np.arange(m, dtype=np.int32), np.diff(indptr))


def products(A, x: np.ndarray, columns: np.ndarray | None = None) -> np.ndarray:
    """a_ij · x_j for every stored entry, in float64 (the references accumulate in float64); ``columns``: the
    entries' columns as the product reads them, where not A's own (narrow columns, :mod:`kernels._narrow`)."""
    return A.data.astype(np.float64) * x.astype(np.float64)[A.indices if columns is None else columns]


def segment_sums(segment: np.ndarray, values: np.ndarray, n_segments: int) -> np.ndarray:
    """Sum ``values`` into ``n_segments`` bins by ``segment`` id, in entry order (float64, empty input too)."""
    return np.bincount(segment, weights=values, minlength=n_segments).astype(np.float64, copy=False)


class RowSumReference:
    """The reference of a family whose decomposition is one sequential sum per row.

    Mixed into such a family (``class CsrScalar(RowSumReference, Family)``) it
    provides both reference hooks: the entries' rows once, then the row sums, each entry's column as the
    product reads it (narrow columns where the family's preparation attached them).
    """

    def _prepare_reference(self, prepared) -> None:
        prepared.extra["rows"] = row_ids(prepared.A.indptr)

    def _run_reference(self, prepared, x: np.ndarray) -> np.ndarray:
        A, ex = prepared.A, prepared.extra
        return segment_sums(ex["rows"], products(A, x, reference_columns(ex, A.indptr, A.indices)), prepared.shape[0])
