"""SURAA's grouping "segment", the paper as written: rows sorted by length, Freedman–Diaconis segments, G1/G2/G3.

Rows are sorted by nonzeros per row (npr) descending, ties by first column
index (``n`` for an empty row), then by row index (a stable sort). The sorted
rows are cut into segments of ``freedman_diaconis_segments(npr)[0]`` rows each,
the last one partial; every segment, the partial one included, is judged by its
own mean npr. Because the rows are sorted, segment means never increase, so the
groups are contiguous runs of segments in the sorted order:

- G1: the leading segments whose mean is ``> threshold`` and whose rows fit the
  child-thread budget: each G1 row gets a child of ``c(r) = min(vector_cap,
  32·ceil(max(npr, 1) / 32))`` threads, and the sum of ``c(r)`` over G1 stays
  ``<= max_child_threads``. Segments join whole, from the top; the first one
  that is not long enough or does not fit closes G1. (Our reading of the paper's
  limit: a bound on the total child threads in flight. With children of at least
  32 threads it also keeps G1 at most 65536 / 32 = 2048 rows, the device
  runtime's default pending-launch count.)
- G2: the following segments with mean ``>= threshold``; a segment's rows get
  ``Y = min(vector_cap, 32·ceil(max npr / 32))`` threads each (``seg_threads``).
- G3: the segments with mean ``< threshold``, one thread per row.

The order is also grouping "row"'s for its long rows (:mod:`kernels.suraa_rows`);
the launches that run the groups are :class:`kernels.suraa.Suraa`'s. The
Freedman–Diaconis rule is also a matrix feature (``fd_seg_size``,
``fd_seg_count`` in :mod:`tuner.matrix.features`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from common.percentile import lerp, positions
from kernels._arrays import stable_argsort
from kernels._cuda import to_numpy

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "SEGMENT_KEYS",
    "Decomposition",
    "decompose",
    "freedman_diaconis_segments",
    "row_order",
    "segments_of_quartiles",
    "threads_per_row",
]

VECTOR_BLOCK = 256
"""G2 blocks hold ``max(1, VECTOR_BLOCK // Y)`` rows of ``Y`` threads (one row per block once Y >= 256)."""
SEGMENT_KEYS = ("perm", "seg_bounds", "seg_mean", "seg_threads", "group_of_segment", "group_bounds")
"""The keys of ``prepared.extra`` that hold this grouping's decomposition, equal on the GPU and reference paths."""


def freedman_diaconis_segments(npr: NDArray[np.integer]) -> tuple[int, int]:
    """Split ``m = len(npr)`` rows into equal segments by the Freedman–Diaconis rule, as SURAA does.

    Bin width ``h = 2·IQR(npr) / cbrt(m)`` (IQR from ``np.percentile``'s
    linear interpolation), segment count ``k = ceil((max − min) / h)`` clipped
    to ``[1, m]``, segment size ``ceil(m / k)`` rows. Returns
    ``(segment_size, segment_count)``.

    Guards: no rows gives ``(0, 0)``; one row, ``IQR = 0`` (the middle half
    of the rows alike) or ``max == min`` (all alike) gives ``k = 1``, one
    segment of all rows, since the rule has no spread to measure there.
    """
    if isinstance(npr, list | tuple):
        npr = np.asarray(npr)
    if isinstance(npr, np.ndarray):
        xp = np
    else:
        import cupy

        xp = cupy.get_array_module(npr)
    npr = xp.asarray(npr)
    m = npr.size
    if m == 0:
        return 0, 0
    q25, q75 = (float(q) for q in xp.percentile(npr, xp.asarray([25.0, 75.0])))
    return segments_of_quartiles(m, int(npr.min()), int(npr.max()), q25, q75)


def segments_of_quartiles(m: int, lo: int, hi: int, q25: float, q75: float) -> tuple[int, int]:
    """:func:`freedman_diaconis_segments` from ``m`` rows' shortest and longest lengths and quartiles
    (for callers that have them already, such as the features computed on the GPU)."""
    if m == 0:
        return 0, 0
    iqr = q75 - q25
    if m < 2 or iqr == 0 or hi == lo:
        k = 1
    else:
        k = min(max(math.ceil((hi - lo) / (2 * iqr / np.cbrt(m))), 1), m)
    return math.ceil(m / k), k


@dataclass(frozen=True)
class Decomposition:
    """Segments and groups of the sorted rows (positions are in the sorted order).

    ``seg_bounds`` (k+1, int64): segment s is positions ``[seg_bounds[s], seg_bounds[s+1])``;
    ``seg_mean`` (k, float64): its mean npr; ``seg_threads`` (k, int32): threads per row
    for its longest row (``Y`` in G2; the child width of that row in G1);
    ``group_of_segment`` (k, int8): 1, 2 or 3; ``group_bounds`` (4, int64):
    G1 = ``[b0, b1)``, G2 = ``[b1, b2)``, G3 = ``[b2, b3)`` with b0 = 0, b3 = m;
    ``child_threads``: sum of the G1 rows' child widths; ``g2_launches``: one
    ``(begin, end, threads_per_row, block)`` per run of G2 segments with equal ``Y``.
    """

    seg_bounds: np.ndarray
    seg_mean: np.ndarray
    seg_threads: np.ndarray
    group_of_segment: np.ndarray
    group_bounds: np.ndarray
    child_threads: int
    g2_launches: tuple[tuple[int, int, int, int], ...]

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in SEGMENT_KEYS if k != "perm"}



def threads_per_row(npr: Any, vector_cap: int, xp: Any = np) -> Any:
    """``min(vector_cap, 32·ceil(max(npr, 1) / 32))``: the smallest whole warps covering a row, capped (int64,
    in ``xp``: NumPy or CuPy)."""
    return xp.minimum(vector_cap, (xp.maximum(xp.asarray(npr, dtype=np.int64), 1) + 31) & ~31)  # & ~31: // 32 * 32


def _leading_true(mask: np.ndarray) -> int:
    """Length of the run of True at the start of ``mask``."""
    return int(mask.size if mask.all() else np.argmin(mask))


def decompose(
    npr_sorted: Any, *, max_child_threads: int, threshold: int, vector_cap: int, xp: Any = np
) -> Decomposition:
    """The segments and groups for row lengths already sorted in descending order (m >= 1).

    ``xp`` is ``numpy`` (the reference) or ``cupy`` (prepare: the passes over the rows run on the GPU; only
    what a segment needs comes back). The result is NumPy either way, the same from both.

    >>> npr = np.array([300, 290, 280, 40, 40, 33, 5, 5, 5, 2, 1, 0])
    >>> d = decompose(npr, max_child_threads=1024, threshold=32, vector_cap=1024)
    >>> d.seg_bounds.tolist(), d.group_of_segment.tolist(), d.group_bounds.tolist(), d.child_threads
    ([0, 3, 6, 9, 12], [1, 2, 3, 3], [0, 3, 6, 12], 928)
    """
    npr = xp.asarray(npr_sorted, dtype=np.int64)
    m = int(npr.size)
    if m == 0:
        raise ValueError("decompose needs at least one row")
    # Checked on the host; on the GPU the caller's sort made the order (a reduction would cost CuPy a kernel
    # build for every new number of rows, on a machine's first use).
    if xp is np and np.any(npr[1:] > npr[:-1]):
        raise ValueError("npr_sorted must be in descending order")
    size, _ = segments_of_quartiles(m, *_sorted_spread(xp, npr))
    starts = np.arange(0, m, size, dtype=np.int64)
    seg_bounds = np.append(starts, m)
    lengths = np.diff(seg_bounds)
    # Per segment: the sum of its rows' lengths and of their child widths (differences of running sums, exact
    # in int64), and its first (longest) row; one read-back.
    running = xp.zeros((2, m + 1), dtype=np.int64)
    xp.cumsum(npr, out=running[0, 1:])
    xp.cumsum(threads_per_row(npr, vector_cap, xp), out=running[1, 1:])
    bounds = xp.asarray(seg_bounds)
    per_segment = to_numpy(xp.concatenate([(running[:, bounds[1:]] - running[:, bounds[:-1]]).ravel(),
                                            npr[bounds[:-1]]]))
    sums, child, longest = per_segment.reshape(3, len(starts))

    # mean > t and mean >= t compared exactly, in integers.
    n_g1 = _leading_true((sums > threshold * lengths) & (np.cumsum(child) <= max_child_threads))
    group = np.where(sums >= threshold * lengths, 2, 3).astype(np.int8)
    group[:n_g1] = 1
    if np.any(np.diff(group) < 0):  # impossible: means do not increase along the sorted rows
        raise AssertionError(f"groups out of order: {group.tolist()}")
    seg_of_group_end = np.searchsorted(group, [1, 2, 3], side="right")
    group_bounds = np.concatenate(([0], seg_bounds[seg_of_group_end])).astype(np.int64)

    seg_threads = threads_per_row(longest, vector_cap).astype(np.int32)
    # G2 is a contiguous run of segments; cut it where Y changes (Y never grows: at most 32 runs).
    g2 = np.flatnonzero(group == 2)
    cuts = np.flatnonzero(np.diff(seg_threads[g2])) + 1
    launches: list[tuple[int, int, int, int]] = []
    for first, last in zip(np.r_[0, cuts], np.r_[cuts, g2.size] - 1, strict=True):
        if g2.size:
            y = int(seg_threads[g2[first]])
            block = y * max(1, VECTOR_BLOCK // y)
            launches.append((int(seg_bounds[g2[first]]), int(seg_bounds[g2[last] + 1]), y, block))
    return Decomposition(
        seg_bounds=seg_bounds,
        seg_mean=sums / lengths,
        seg_threads=seg_threads,
        group_of_segment=group,
        group_bounds=group_bounds,
        child_threads=int(child[:n_g1].sum()),
        g2_launches=tuple(launches),
    )


def _sorted_spread(xp: Any, npr_desc: Any) -> tuple[int, int, float, float]:
    """(shortest, longest, 25th and 75th percentiles) of row lengths sorted in descending order: the four
    lengths the quartiles interpolate between read back with the two ends (:mod:`common.percentile`, NumPy's
    own floats), without ``np.percentile``'s partition of every row (0.8 s on 24 M rows on a device host)."""
    m = int(npr_desc.shape[0])
    q25, q75 = positions(m, 25.0), positions(m, 75.0)
    at = [m - 1 - p for p in (*q25[:2], *q75[:2])]  # ascending position p is descending m - 1 - p
    got = to_numpy(npr_desc[xp.asarray([0, m - 1, *at])]).astype(np.float64)
    return int(got[1]), int(got[0]), lerp(got[2], got[3], q25[2]), lerp(got[4], got[5], q75[2])


def _npr_first(xp: Any, indptr: Any, indices: Any, n_cols: int) -> tuple[Any, Any]:
    """(npr, first column) per row, both int64; the first column of an empty row is ``n_cols``."""
    npr = xp.diff(indptr).astype(xp.int64)
    nnz = int(indices.size)
    if not nnz:
        return npr, xp.full(npr.shape, n_cols, dtype=xp.int64)
    first = xp.where(npr > 0, indices[xp.minimum(indptr[:-1], nnz - 1)], n_cols)
    return npr, xp.asarray(first).astype(xp.int64)


def _sort_key(xp: Any, indptr: Any, indices: Any, n_cols: int) -> tuple[Any, Any]:
    """(npr, key) with key ascending = npr descending, then first column ascending (n for an empty row).

    ``key = first_col − npr·(n + 1)`` fits int64 (``npr, n < 2**31``); a stable sort
    of it breaks the remaining ties by row index. Works with NumPy and CuPy alike.
    """
    npr, first = _npr_first(xp, indptr, indices, n_cols)
    return npr, first - npr * (n_cols + 1)


def row_order(A: Any) -> np.ndarray:
    """``perm`` (int32) of grouping "segment" for a SciPy CSR matrix: npr descending, first column, index."""
    _, key = _sort_key(np, np.asarray(A.indptr), np.asarray(A.indices), A.shape[1])
    return stable_argsort(np, key).astype(np.int32)
