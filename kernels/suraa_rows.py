"""SURAA's grouping "row", our change for irregular matrices: each row by its own length, in bins of equal threads.

Each ROW is judged by its own npr (no segment mean hides a huge row among short
ones), and gets a power-of-two number of threads ``t`` (:func:`row_threads`):

- a long row (``npr >= threshold``: G1 or G2) gets ``t = max(32, 2^ceil(log2(ceil(npr / 16))))``,
  at least a warp and at most 16 nonzeros per thread;
- a short row (``npr < threshold``: G3) gets ``t = min(32, 2^ceil(log2(max(1, ceil(npr / g3_entries)))))``
  threads, at most ``g3_entries`` nonzeros each (a sub-warp group; one thread
  for an empty row).

Order: the long rows first, by npr descending, then first column, then row index
(the paper's order); then the short rows by ``t`` descending, then row index, so
that neighbouring rows of a bin are neighbours in memory too. The bins are the
runs of rows with the same (long, ``t``): contiguous ranges of the sorted order,
with ``t`` never increasing. G1 is the leading long rows with ``npr > threshold``
whose threads ``t`` sum to at most the budget (``max_child_threads``; 8192 when
``g1_mode="block"``, where the parameter is inactive), G2 the other long rows, G3
the short ones. ``group_bounds`` = ``[0, g1_end, n_long, m]``.

The launch over the bins is :class:`kernels.suraa.Suraa`'s; the long rows keep
the paper's order (:mod:`kernels.suraa_segments`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels._arrays import stable_argsort
from kernels._cuda import to_numpy

__all__ = ["ROW_KEYS", "RowDecomposition", "decompose_rows", "row_threads"]

LONG_ENTRIES = 16
"""A long row gets the fewest power-of-2 threads (at least 32) with at most this many nonzeros each."""
ROW_KEYS = ("perm", "bin_bounds", "bin_threads", "bin_blocks", "bins", "group_bounds")
"""The keys of ``prepared.extra`` that hold this grouping's decomposition, equal on the GPU and reference paths."""


def _row_classes(xp: Any, npr: Any, *, threshold: int, g3_entries: int) -> tuple[Any, Any]:
    """(long, log2 t) per row: long = ``npr >= threshold``; t the row's threads (see the module doc).

    ``ceil(log2(v))`` is taken exactly, in integers: the exponent of frexp(v − 1)
    (exact for v < 2**53; 0 for v = 1). Works with NumPy and CuPy alike.
    """
    npr = npr.astype(xp.int64)
    long_ = npr >= threshold
    need = xp.where(
        long_, (npr + LONG_ENTRIES - 1) // LONG_ENTRIES, xp.maximum((npr + g3_entries - 1) // g3_entries, 1)
    )
    _, exponent = xp.frexp((xp.maximum(need, 1) - 1).astype(xp.float64))
    lg = exponent.astype(xp.int64)
    return long_, xp.where(long_, xp.maximum(lg, 5), xp.minimum(lg, 5))


def row_threads(npr: np.ndarray, *, threshold: int, g3_entries: int) -> np.ndarray:
    """Threads per row in grouping "row" (int64): at least a warp for long rows, up to a warp for short ones.

    >>> row_threads(np.array([0, 1, 2, 3, 5, 9, 17, 31, 32, 513, 100_000]), threshold=32, g3_entries=2)
    array([   1,    1,    1,    2,    4,    8,   16,   16,   32,   64, 8192])
    """
    _, lg = _row_classes(np, np.asarray(npr), threshold=threshold, g3_entries=g3_entries)
    return np.left_shift(1, lg)


@dataclass(frozen=True)
class RowDecomposition:
    """Bins and groups of grouping "row" (positions are in its sorted order, ``perm``).

    ``bin_bounds`` (k+1, int64): bin i is positions ``[bin_bounds[i], bin_bounds[i+1])``,
    every row there with ``bin_threads[i]`` (k, int32) threads; ``bin_blocks`` (k+1,
    int64): the bin's first block in the block layout of a ``block``-thread grid
    (``ceil(rows / (block / t))`` blocks for ``t <= block``, ``rows · t / block``
    for ``t > block``), the last entry the total; ``bins`` (k, 4, int32): the kernel's
    table, ``[first position, end position, t, first block]`` per bin;
    ``group_bounds`` (4, int64): ``[0, g1_end, n_long, m]``; ``child_threads``: the
    sum of t over G1; ``n_multi``: the rows with ``t > block`` (the leading ones: they
    have a counter each); ``n_multi_blocks``: their blocks (a partial slot each).
    ``perm`` is a NumPy or CuPy array, as the input; the rest is NumPy.
    """

    perm: Any
    bin_bounds: np.ndarray
    bin_threads: np.ndarray
    bin_blocks: np.ndarray
    bins: np.ndarray
    group_bounds: np.ndarray
    child_threads: int
    n_multi: int
    n_multi_blocks: int
    block: int

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in ROW_KEYS if k != "perm"}

    def block_of(self, pos: int) -> int:
        """The block of the layout holding sorted position ``pos`` (the total for ``pos = m``)."""
        k = int(np.searchsorted(self.bin_bounds, pos, side="right")) - 1
        if k >= self.bin_threads.size:
            return int(self.bin_blocks[-1])
        t, rel = int(self.bin_threads[k]), pos - int(self.bin_bounds[k])
        return int(self.bin_blocks[k]) + (rel * (t // self.block) if t > self.block else rel // (self.block // t))


def decompose_rows(
    npr: Any, first: Any, *, n_cols: int, threshold: int, g3_entries: int, block: int, budget: int, xp: Any = np
) -> RowDecomposition:
    """The order, bins and groups of grouping "row" from each row's npr and first column (m >= 1).

    ``xp`` is ``numpy`` (the reference) or ``cupy`` (prepare: the sort runs on the
    GPU; only the bin table and the G1 prefix come back). Integer arithmetic only,
    so both give the same arrays.

    >>> npr = np.array([5, 300, 0, 40, 1, 33])
    >>> d = decompose_rows(npr, np.zeros(6, int), n_cols=400, threshold=32, g3_entries=2, block=256, budget=8192)
    >>> d.perm.tolist(), d.bins.tolist(), d.group_bounds.tolist()
    ([1, 3, 5, 0, 2, 4], [[0, 3, 32, 0], [3, 4, 4, 1], [4, 6, 1, 2]], [0, 3, 3, 6])
    """
    m = int(npr.size)
    if m == 0:
        raise ValueError("decompose_rows needs at least one row")
    npr = npr.astype(xp.int64)
    long_, lg = _row_classes(xp, npr, threshold=threshold, g3_entries=g3_entries)
    # Long rows: key < 0 (npr >= threshold >= 1), the paper's order; short rows: 5 − log2 t in [0, 5].
    key = xp.where(long_, first.astype(xp.int64) - npr * (n_cols + 1), 5 - lg)
    perm = stable_argsort(xp, key).astype(xp.int32)
    code = (long_.astype(xp.int64) * 64 + lg)[perm]  # never increases along the sorted order
    starts = to_numpy(xp.flatnonzero(xp.diff(code)) + 1).astype(np.int64)
    bin_bounds = np.concatenate(([0], starts, [m])).astype(np.int64)
    codes = to_numpy(code[xp.asarray(bin_bounds[:-1])]).astype(np.int64)
    if np.any(np.diff(codes) >= 0):  # impossible: the key sorts the codes in descending order
        raise AssertionError(f"bins out of order: {codes.tolist()}")
    bin_threads = np.left_shift(1, codes % 64).astype(np.int32)

    # Counted from the sorted order (no reduction kernel: CuPy builds one per new size on a machine's first
    # use, seconds): the long rows lead, npr descending; the G1 candidates (npr > threshold) lead them.
    n_long = int(bin_bounds[np.count_nonzero(codes >= 64)])
    long_npr = npr[perm[:n_long]]
    n_above = int(xp.searchsorted(-long_npr, xp.asarray([-threshold], dtype=xp.int64))[0])
    lead = to_numpy(code[: min(n_above, budget // 32 + 1)]).astype(np.int64)  # each t >= 32
    lead_threads = np.left_shift(1, lead - 64)
    g1_end = int(np.count_nonzero(np.cumsum(lead_threads) <= budget))  # cumsum increases: a prefix
    group_bounds = np.array([0, g1_end, n_long, m], dtype=np.int64)

    rows = np.diff(bin_bounds)
    t = bin_threads.astype(np.int64)
    multi = t > block
    per_bin = np.where(multi, rows * (t // block), -(-rows // np.maximum(block // t, 1)))
    bin_blocks = np.concatenate(([0], np.cumsum(per_bin))).astype(np.int64)
    if bin_blocks[-1] >= 2**31:
        raise ValueError(f"{int(bin_blocks[-1])} blocks do not fit a grid")
    n_multi_bins = int(multi.sum())  # t never increases along the bins: the multi-block bins lead
    bins = np.stack([bin_bounds[:-1], bin_bounds[1:], t, bin_blocks[:-1]], axis=1).astype(np.int32)
    return RowDecomposition(
        perm=perm,
        bin_bounds=bin_bounds,
        bin_threads=bin_threads,
        bin_blocks=bin_blocks,
        bins=bins,
        group_bounds=group_bounds,
        child_threads=int(lead_threads[:g1_end].sum()),
        n_multi=int(bin_bounds[n_multi_bins]),
        n_multi_blocks=int(bin_blocks[n_multi_bins]),
        block=block,
    )


def _row_pieces(indptr: np.ndarray, rows: np.ndarray, pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """(entry, slot) for every entry of ``rows``, each row cut into ``pieces`` chunks of ``ceil(npr / pieces)``.

    ``slot = i·pieces + piece`` for the i-th row: the kernel's piece of that entry.
    """
    begin = indptr[rows].astype(np.int64)
    npr = indptr[rows + 1].astype(np.int64) - begin
    chunk = np.maximum(-(-npr // pieces), 1)
    offset = np.arange(int(npr.sum())) - np.repeat(np.cumsum(npr) - npr, npr)  # index within its row
    entry = np.repeat(begin, npr) + offset
    slot = np.repeat(np.arange(rows.size) * pieces, npr) + offset // np.repeat(chunk, npr)
    return entry, slot

