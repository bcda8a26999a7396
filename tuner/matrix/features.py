"""Structural features of a CSR matrix: what the selector learns from.

The features describe what decides an SpMV kernel's speed: the shape, how the
nonzeros spread over rows (SURAA's and PCSR's row classes, load imbalance) and
columns, how far they sit from the diagonal, and how they cluster into column
panels (Hong et al.'s clustering factors, which drive the tile choice of
``nut``). Everything is computed from ``indptr`` and ``indices`` only: NumPy
for a SciPy matrix (one vectorized pass, a fraction of a second for 10 M
nonzeros; this path is the features' definition), and for a
``cupyx.scipy.sparse`` matrix already on the GPU a few fused kernels and one
read-back (:mod:`tuner.matrix.features_gpu`: the same values up to float
rounding, for a few SpMVs' worth of time, which ``plan()`` pays on every new
matrix).

Input is the canonical CSR form that :func:`tuner.matrix.io.as_csr` produces: int32
indices, sorted columns within each row, no duplicates.

>>> import scipy.sparse as sp
>>> A = sp.eye(4, format="csr")
>>> f = extract_features(A)
>>> f["npr_mean"], f["diag_frac"], f["fd_seg_count"]
(1.0, 1.0, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from common.errors import MatrixFormatError
from kernels.suraa_segments import freedman_diaconis_segments, segments_of_quartiles

if TYPE_CHECKING:
    from tuner.matrix.features_gpu import DeviceCounters
    from tuner.matrix.readback import ReadBack

__all__ = [
    "CF_WIDTHS",
    "FEATURE_NAMES",
    "LONG_ROW",
    "QueuedFeatures",
    "csr_arrays",
    "extract_features",
    "queue_features",
]

LONG_ROW = 32
"""A row with more nonzeros than this is long (SURAA's and the vector kernel's threshold)."""

CF_WIDTHS: tuple[int, ...] = tuple(2**k for k in range(7, 20))
"""Column-panel widths of the clustering factors: 128, 256, ..., 524288."""

FEATURE_NAMES: tuple[str, ...] = (
    "rows",
    "cols",
    "nnz",
    "density",
    "npr_min",
    "npr_max",
    "npr_mean",
    "npr_std",
    "npr_cv",
    "npr_gini",
    "empty_row_frac",
    "long_row_frac",
    "fd_seg_count",
    "fd_seg_size",
    "bandwidth",
    "diag_frac",
    "col_std",
    "col_cv",
    *(f"cf_{w}" for w in CF_WIDTHS),
)
"""The feature vector's names, in the fixed order the model and the store rely on."""

_INT32_LIMIT = 2**31


def csr_arrays(A: Any, *, checked_apart: bool = False) -> tuple[Any, int, int, Any, Any]:
    """Check that ``A`` is canonical CSR and return (xp, rows, cols, indptr, indices), int32 arrays of ``xp``
    (NumPy for a SciPy matrix, CuPy for a ``cupyx.scipy.sparse`` one).

    A non-canonical matrix would silently give wrong clustering factors and a
    fingerprint that differs from its canonical twin, so it is refused; but not asked
    with ``checked_apart``, where the caller checks it before using what is computed
    (CuPy answers ``has_canonical_format`` for a new matrix with a kernel and a wait).
    """
    if type(A).__module__.startswith("cupyx"):
        import cupy

        xp, is_csr = cupy, getattr(A, "format", None) == "csr"
    else:
        xp, is_csr = np, sp.issparse(A) and A.format == "csr" and A.ndim == 2
    if not is_csr:
        raise MatrixFormatError(f"expected a 2-D SciPy or CuPy sparse CSR matrix, got {type(A).__name__}")
    m, n = A.shape
    if max(m, n, A.nnz) >= _INT32_LIMIT:
        raise MatrixFormatError(f"shape {A.shape} with {A.nnz} entries does not fit int32 indices")
    if not checked_apart and not A.has_canonical_format:
        raise MatrixFormatError("CSR matrix has unsorted or duplicate column indices; canonicalise it first")
    return xp, m, n, xp.asarray(A.indptr, dtype=xp.int32), xp.asarray(A.indices, dtype=xp.int32)


def _xp(a: Any) -> Any:
    """The array module of ``a``: NumPy, or CuPy for a CuPy array."""
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy.get_array_module(a)


def _spread(counts: Any, total: int) -> tuple[float, float]:
    """Population std and coefficient of variation of ``counts`` (summing to ``total``); 0 when undefined."""
    if counts.size == 0 or total == 0:
        return 0.0, 0.0
    std = float(_xp(counts).std(counts.astype(np.float64)))
    return std, std / (total / counts.size)


def _gini(npr: Any, nnz: int) -> float:
    """Gini coefficient of the row lengths: mean absolute difference / (2·mean), 0 when all are equal.

    Uses the sorted form ``Σ (2i − m − 1)·x_(i) / (m·Σx)`` (i = 1..m), O(m log m).
    """
    m = npr.size
    if nnz == 0 or int(npr.min()) == int(npr.max()):
        return 0.0
    xp = _xp(npr)
    weights = xp.arange(1 - m, m, 2, dtype=np.float64)
    return float(weights @ xp.sort(npr).astype(np.float64)) / (m * nnz)


def _clustering_factors(indptr: Any, indices: Any) -> list[float]:
    """Hong et al.'s clustering factor ``nnz / non-empty (row, col // w) segments`` for each width.

    With sorted columns, entry ``i + 1`` opens a new segment exactly when it
    starts a row or ``col // w`` changes, i.e. when the XOR of the two columns
    is ``>= w`` (w a power of two). One XOR pass serves every width.
    """
    nnz = indices.size
    if nnz == 0:
        return [0.0] * len(CF_WIDTHS)
    change = indices[1:] ^ indices[:-1]
    starts = indptr[1:-1]
    starts = starts[(starts > 0) & (starts < nnz)]
    change[starts - 1] = np.iinfo(np.int32).max  # a new row always opens a new segment
    xp = _xp(change)
    return [nnz / (1 + int(xp.count_nonzero(change >= w))) for w in CF_WIDTHS]


def extract_features(A: Any) -> dict[str, float]:
    """The feature vector of a canonical CSR matrix (SciPy, or CuPy: computed on the GPU): keys exactly
    :data:`FEATURE_NAMES`, finite floats.

    Values do not matter, only structure. Every ratio is defined as 0 where its
    denominator is 0 (no rows, no columns, no nonzeros), so degenerate
    matrices (0×0, all-zero, one row, one column) still give a full vector.
    """
    return queue_features(A)()


@dataclass(frozen=True)
class QueuedFeatures:
    """:func:`queue_features`' answer: called, the feature vector (read back from the GPU where its kernels were
    queued); ``on_device``: those kernels' counters, still on the GPU, for work queued behind them (``plan()``
    ranks the configs there, :mod:`tuner.select.rank_gpu`), None where the features were computed otherwise."""

    read: Callable[[], dict[str, float]]
    on_device: DeviceCounters | None = None

    def __call__(self) -> dict[str, float]:
        return self.read()


def queue_features(A: Any, *, checked_apart: bool = False, into: ReadBack | None = None) -> QueuedFeatures:
    """:func:`extract_features` of ``A``, its GPU work (a CuPy matrix's) launched now and read back when the
    returned object is called: ``plan()`` queues it behind the matrix's structure pass, in the same read-back
    (``into``), and uses it only where that pass finds ``A`` canonical (``checked_apart``, :func:`csr_arrays`)."""
    xp, m, n, indptr, indices = csr_arrays(A, checked_apart=checked_apart)
    nnz = int(indices.size)
    if xp is not np and nnz and m:
        return _gpu_features(xp, m, n, indptr, indices, into)
    features = _features(xp, m, n, indptr, indices)
    return QueuedFeatures(lambda: features)


def _features(xp: Any, m: int, n: int, indptr: Any, indices: Any) -> dict[str, float]:
    """:func:`extract_features` by array operations (NumPy's, or CuPy's for a matrix without rows or entries)."""
    nnz = int(indices.size)
    npr = xp.diff(indptr)

    # Signed distance of each entry from the diagonal, in the int32 row-id buffer itself.
    if xp is np:
        offset = np.repeat(np.arange(m, dtype=np.int32), npr)
    else:  # CuPy's repeat takes no device array of counts: each entry's row by a search of indptr
        offset = (xp.searchsorted(indptr, xp.arange(nnz, dtype=xp.int32), side="right") - 1).astype(xp.int32)
    offset -= indices

    npr_std, npr_cv = _spread(npr, nnz)
    col_std, col_cv = _spread(xp.bincount(indices, minlength=n), nnz)
    seg_size, seg_count = freedman_diaconis_segments(npr)
    diag_len = min(m, n)
    features = {
        "rows": m,
        "cols": n,
        "nnz": nnz,
        "density": nnz / (m * n) if nnz else 0,
        "npr_min": int(npr.min()) if m else 0,
        "npr_max": int(npr.max()) if m else 0,
        "npr_mean": nnz / m if m else 0,
        "npr_std": npr_std,
        "npr_cv": npr_cv,
        "npr_gini": _gini(npr, nnz),
        "empty_row_frac": int(xp.count_nonzero(npr == 0)) / m if m else 0,
        "long_row_frac": int(xp.count_nonzero(npr > LONG_ROW)) / m if m else 0,
        "fd_seg_count": seg_count,
        "fd_seg_size": seg_size,
        "bandwidth": max(int(offset.max()), -int(offset.min())) if nnz else 0,
        "diag_frac": int(xp.count_nonzero(offset == 0)) / diag_len if diag_len else 0,
        "col_std": col_std,
        "col_cv": col_cv,
        **dict(zip((f"cf_{w}" for w in CF_WIDTHS), _clustering_factors(indptr, indices), strict=True)),
    }
    return {name: float(features[name]) for name in FEATURE_NAMES}


def _gpu_features(cupy: Any, m: int, n: int, indptr: Any, indices: Any, into: ReadBack | None) -> QueuedFeatures:
    """:func:`queue_features` for a CuPy matrix with rows and nonzeros, from the fused kernels' numbers."""
    from tuner.matrix.features_gpu import queue_device_features

    nnz = int(indices.size)
    counters, raw_later = queue_device_features(cupy, m, n, indptr, indices, long_row=LONG_ROW, cf_widths=CF_WIDTHS,
                                                into=into)
    return QueuedFeatures(lambda: _from_raw(raw_later(), m, n, nnz), counters)


def _from_raw(raw: dict[str, float], m: int, n: int, nnz: int) -> dict[str, float]:
    """The feature vector from :func:`~tuner.matrix.features_gpu.queue_device_features`' numbers (its twin on the
    GPU, :mod:`tuner.select.rank_gpu`, follows it step by step)."""
    mean = nnz / m
    npr_std = math.sqrt(max(raw["npr_sum_sq"] / m - mean * mean, 0.0))
    col_mean = nnz / n
    col_std = math.sqrt(max(raw["col_sum_sq"] / n - col_mean * col_mean, 0.0))
    seg_size, seg_count = segments_of_quartiles(m, int(raw["npr_min"]), int(raw["npr_max"]), raw["q25"], raw["q75"])
    diag_len = min(m, n)
    features = {
        "rows": m, "cols": n, "nnz": nnz, "density": nnz / (m * n),
        "npr_min": raw["npr_min"], "npr_max": raw["npr_max"], "npr_mean": mean,
        "npr_std": npr_std, "npr_cv": npr_std / mean,
        "npr_gini": 0.0 if raw["npr_min"] == raw["npr_max"] else raw["gini_sum"] / (m * nnz),
        "empty_row_frac": raw["empty"] / m, "long_row_frac": raw["long"] / m,
        "fd_seg_count": seg_count, "fd_seg_size": seg_size,
        "bandwidth": raw["bandwidth"], "diag_frac": raw["diag"] / diag_len if diag_len else 0,
        "col_std": col_std, "col_cv": col_std / col_mean,
        **{f"cf_{w}": nnz / segments for w, segments in zip(CF_WIDTHS, raw["segments"], strict=True)},
    }  # fmt: skip
    return {name: float(features[name]) for name in FEATURE_NAMES}
