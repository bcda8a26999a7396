"""``suraa``: SURAA (Muhammed et al., 2019): rows sorted by length, three groups G1/G2/G3.

Two groupings (the ``grouping`` parameter), so the paper and our change can be
tuned and compared side by side. Both write y in the original row order through
``perm`` (sorted position → row).

``grouping="segment"``: the paper, as written. Rows are sorted by nonzeros per
row (npr) descending, ties by first column index (``n`` for an empty row), then
by row index (a stable sort). The sorted rows are cut into segments of
``freedman_diaconis_segments(npr)[0]`` rows each, the last one partial; every
segment, the partial one included, is judged by its own mean npr. Because the
rows are sorted, segment means never increase, so the groups are contiguous runs
of segments in the sorted order:

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

Execution: G1 by ``suraa_parent``, one thread per row launching a one-block
child grid into ``cudaStreamFireAndForget`` (``g1_mode="dynamic"``), or by
``suraa_vector`` with one block per row (``g1_mode="block"``); G2 by
``suraa_vector``, one launch per run of consecutive G2 segments with the same
``Y``; G3 by ``suraa_scalar`` on the caller's stream. With ``streams=4`` the G1
launch and the G2 launches go round-robin onto up to four non-blocking streams,
which wait for the caller's stream (x and out ready) and are waited for by it,
through events; with ``streams=1`` everything is queued on the caller's stream.
Launches per SpMV: ``1 + len(g2_launches) + 1`` at most (plus an event record
and wait per side stream).

``grouping="row"``: our change for irregular matrices. Each ROW is judged by its
own npr (no segment mean hides a huge row among short ones), and gets a
power-of-two number of threads ``t`` (:func:`row_threads`):

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

Execution: ONE launch of ``suraa_rows`` with ``scalar_block`` = ``width``
threads per block over all bins: a bin with ``t <= width`` packs ``width / t``
rows per block (shuffle reduction up to a warp, shared memory beyond); a bin with
``t > width`` gives each row ``t / width`` blocks ("pieces", contiguous chunks of
the row), whose partials the last piece to finish adds in a fixed order
(deterministic; ``counters`` wrap back to zero by ``atomicInc``; no atomic adds on
y; the counters and partials are scratch of the prepared matrix, so two of its
runs must not overlap: runs queued on one stream never do). With
``g1_mode="dynamic"`` the same launch starts with one parent thread per
G1 row, which launches that row's blocks as a child grid (dynamic parallelism),
and the host grid skips the G1 rows' blocks. Launches per SpMV: one from the host
in both modes (plus one device-side child launch per G1 row in dynamic mode).

``layout`` (both groupings): ``"original"`` (the paper) reads the row at sorted
position ``pos`` where it is, row ``perm[pos]`` of the matrix, so neighbouring
positions read scattered rows (a 32-byte sector of the row pointer, values and
columns for a few useful bytes); ``"sorted"`` keeps a copy of the matrix with its
rows in the sorted order (:func:`sorted_copy`, built once on the GPU, counted in
``extra_bytes``) and reads row ``pos`` of it, so a run of positions reads
contiguous memory; y is written at ``perm[pos]`` either way. The sums, and so
the reference, are the same in both.

The decomposition (``DECOMPOSITION_KEYS[grouping]`` in ``prepared.extra``) is the
same on both paths: CuPy arrays on the GPU, NumPy arrays in the reference. The
GPU path also keeps ``fallbacks`` (uint32 counter): G1 rows whose child launch
the device runtime refused and the parent thread summed itself (0 when dynamic
parallelism really ran). In grouping "row" the GPU sort and the bin search run on
the GPU (:func:`decompose_rows` with ``xp=cupy``); only the bin table (tens of
entries) and the G1 prefix (at most 2049 values) come back to the host.

>>> import scipy.sparse as sp
>>> A = sp.csr_matrix(sp.diags([1.0, 2.0, 3.0]))
>>> p = Suraa().prepare_reference(A, {"grouping": "segment"})
>>> p.extra["perm"].tolist(), p.extra["group_bounds"].tolist()
([0, 1, 2], [0, 0, 0, 3])
>>> p = Suraa().prepare_reference(A)  # grouping "row": three short rows of one nonzero, one thread each
>>> p.extra["bins"].tolist(), p.extra["group_bounds"].tolist()
([[0, 3, 1, 0]], [0, 0, 0, 3])
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space
from tuner.features import freedman_diaconis_segments

__all__ = [
    "DECOMPOSITION_KEYS",
    "Decomposition",
    "RowDecomposition",
    "Suraa",
    "decompose",
    "decompose_rows",
    "row_order",
    "row_threads",
    "threads_per_row",
]

GROUPINGS = ("row", "segment")
LAYOUTS = ("original", "sorted")
G1_MODES = ("block", "dynamic")
MAX_CHILD_THREADS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
DEFAULT_BUDGET = 8192
"""G1's budget when ``max_child_threads`` is inactive (``g1_mode="block"``)."""
THRESHOLDS = (16, 32, 64)
VECTOR_CAPS = (128, 256, 512, 1024)
G3_ENTRIES = (2, 4, 8)
SCALAR_BLOCKS = (64, 128, 256, 512)
STREAMS = (1, 4)

VECTOR_BLOCK = 256
"""G2 blocks hold ``max(1, VECTOR_BLOCK // Y)`` rows of ``Y`` threads (one row per block once Y >= 256)."""
PARENT_BLOCK = 32
"""Threads per block of the G1 parent kernel (grouping "segment"): one warp, so the launches spread over SMs."""
LONG_ENTRIES = 16
"""Grouping "row": a long row gets the fewest power-of-2 threads (at least 32) with at most this many nonzeros each."""
RDC = ("-rdc=true",)
"""Relocatable device code, linked with cudadevrt: needed for the device-side launches."""

DECOMPOSITION_KEYS = {
    "segment": ("perm", "seg_bounds", "seg_mean", "seg_threads", "group_of_segment", "group_bounds"),
    "row": ("perm", "bin_bounds", "bin_threads", "bin_blocks", "bins", "group_bounds"),
}
"""Per grouping, the keys of ``prepared.extra`` that hold the decomposition, equal on the GPU and reference paths."""
LAUNCH_KEYS = {
    "segment": ("g1_end", "g2_end", "g1_width", "child_threads", "g2_launches"),
    "row": (
        "g1_end", "g2_end", "child_threads", "n_multi", "n_multi_blocks",
        "parent_blocks", "first_pos", "skip_blocks", "grid_blocks",
    ),
}
"""Per grouping, the host ints of ``prepared.extra`` for the launches, equal on both paths."""


# -- grouping "segment" (the paper) -------------------------------------------------------
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
        return {k: getattr(self, k) for k in DECOMPOSITION_KEYS["segment"] if k != "perm"}


def threads_per_row(npr: np.ndarray, vector_cap: int) -> np.ndarray:
    """``min(vector_cap, 32·ceil(max(npr, 1) / 32))``: the smallest whole warps covering a row, capped."""
    npr = np.maximum(np.asarray(npr, dtype=np.int64), 1)
    return np.minimum(vector_cap, (npr + 31) // 32 * 32)


def _leading_true(mask: np.ndarray) -> int:
    """Length of the run of True at the start of ``mask``."""
    return int(mask.size if mask.all() else np.argmin(mask))


def decompose(
    npr_sorted: np.ndarray, *, max_child_threads: int, threshold: int, vector_cap: int
) -> Decomposition:
    """The segments and groups for row lengths already sorted in descending order (m >= 1).

    >>> npr = np.array([300, 290, 280, 40, 40, 33, 5, 5, 5, 2, 1, 0])
    >>> d = decompose(npr, max_child_threads=1024, threshold=32, vector_cap=1024)
    >>> d.seg_bounds.tolist(), d.group_of_segment.tolist(), d.group_bounds.tolist(), d.child_threads
    ([0, 3, 6, 9, 12], [1, 2, 3, 3], [0, 3, 6, 12], 928)
    """
    npr = np.asarray(npr_sorted, dtype=np.int64)
    m = npr.size
    if m == 0:
        raise ValueError("decompose needs at least one row")
    if np.any(np.diff(npr) > 0):
        raise ValueError("npr_sorted must be in descending order")
    size, _ = freedman_diaconis_segments(npr)
    starts = np.arange(0, m, size, dtype=np.int64)
    seg_bounds = np.append(starts, m)
    lengths = np.diff(seg_bounds)
    sums = np.add.reduceat(npr, starts)
    child = np.add.reduceat(threads_per_row(npr, vector_cap), starts)

    # mean > t and mean >= t compared exactly, in integers.
    n_g1 = _leading_true((sums > threshold * lengths) & (np.cumsum(child) <= max_child_threads))
    group = np.where(sums >= threshold * lengths, 2, 3).astype(np.int8)
    group[:n_g1] = 1
    if np.any(np.diff(group) < 0):  # impossible: means do not increase along the sorted rows
        raise AssertionError(f"groups out of order: {group.tolist()}")
    seg_of_group_end = np.searchsorted(group, [1, 2, 3], side="right")
    group_bounds = np.concatenate(([0], seg_bounds[seg_of_group_end])).astype(np.int64)

    seg_threads = threads_per_row(npr[starts], vector_cap).astype(np.int32)
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


def _argsort_stable(xp: Any, key: Any) -> Any:
    """Stable argsort as int32 (CuPy's argsort is always stable and takes no ``kind``)."""
    order = np.argsort(key, kind="stable") if xp is np else xp.argsort(key)
    return order.astype(xp.int32)


def sorted_copy(indptr: Any, indices: Any, data: Any, perm: Any, xp: Any = np) -> tuple[Any, Any, Any]:
    """(indptr, indices, data) of the matrix with its rows in the order ``perm`` (``A[perm]``), NumPy or CuPy.

    Entry j of the copy belongs to the copy's row ``i = searchsorted(indptr', j, "right") - 1``
    and comes from entry ``indptr[perm[i]] + (j - indptr'[i])``: one gather, no loop over rows.
    """
    npr = xp.diff(indptr.astype(xp.int64))[perm]
    out_ptr = xp.zeros(perm.size + 1, dtype=xp.int64)
    xp.cumsum(npr, out=out_ptr[1:])
    j = xp.arange(int(out_ptr[-1]), dtype=xp.int64)
    i = xp.searchsorted(out_ptr, j, side="right") - 1
    src = indptr.astype(xp.int64)[perm][i] + (j - out_ptr[i])
    return out_ptr.astype(indptr.dtype), indices[src], data[src]


def row_order(A: Any) -> np.ndarray:
    """``perm`` (int32) of grouping "segment" for a SciPy CSR matrix: npr descending, first column, index."""
    _, key = _sort_key(np, np.asarray(A.indptr), np.asarray(A.indices), A.shape[1])
    return _argsort_stable(np, key)


# -- grouping "row" -------------------------------------------------------------------------
def _host(a: Any) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return np.asarray(a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a)


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
        return {k: getattr(self, k) for k in DECOMPOSITION_KEYS["row"] if k != "perm"}

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
    perm = _argsort_stable(xp, key)
    code = (long_.astype(xp.int64) * 64 + lg)[perm]  # never increases along the sorted order
    starts = _host(xp.flatnonzero(xp.diff(code)) + 1).astype(np.int64)
    bin_bounds = np.concatenate(([0], starts, [m])).astype(np.int64)
    codes = _host(code[xp.asarray(bin_bounds[:-1])]).astype(np.int64)
    if np.any(np.diff(codes) >= 0):  # impossible: the key sorts the codes in descending order
        raise AssertionError(f"bins out of order: {codes.tolist()}")
    bin_threads = np.left_shift(1, codes % 64).astype(np.int32)

    n_long = int(long_.sum())
    n_above = int((npr > threshold).sum())  # G1 candidates: the leading long rows, npr > threshold
    lead = _host(code[: min(n_above, budget // 32 + 1)]).astype(np.int64)  # each t >= 32
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


class Suraa(Family):
    name = "suraa"
    summary = (
        "rows sorted by length; the paper's segments (scalar, vector and dynamic-parallelism groups on streams) "
        "or per-row bins in one launch"
    )
    source = "SURAA (Muhammed, Mehmood, Albeshri & Katib, Applied Sciences 9(5):947, 2019)"
    cu_file = "suraa.cu"
    space = Space(
        (
            Param(
                "grouping", GROUPINGS, "row",
                "segment: the paper (Freedman-Diaconis segments judged by their mean npr, a kernel per group); "
                "row: each row by its own npr, power-of-two threads per row, all rows in one launch",
            ),
            Param("g1_mode", G1_MODES, "block", "G1 by dynamic-parallelism children or by blocks of the host grid"),
            Param(
                "max_child_threads", MAX_CHILD_THREADS, DEFAULT_BUDGET,
                "budget of G1: the sum of its rows' child widths (8192 when g1_mode=block)",
                when={"g1_mode": ("dynamic",)},
            ),
            Param("threshold", THRESHOLDS, 32, "npr (segment mean, or the row's own) from which rows are long (G1/G2)"),
            Param(
                "vector_cap", VECTOR_CAPS, 1024, "most threads on one row (G2 vector, G1 child or block)",
                when={"grouping": ("segment",)},
            ),
            Param(
                "g3_entries", G3_ENTRIES, 4, "most nonzeros per thread of a short (G3) row: sets its sub-warp group",
                when={"grouping": ("row",)},
            ),
            Param(
                "scalar_block", SCALAR_BLOCKS, 256, "threads per block of the G3 scalar kernel, or of the row kernel"
            ),
            Param(
                "streams", STREAMS, 4, "streams for G1 and the G2 launches (1: all on the caller's stream)",
                when={"grouping": ("segment",)},
            ),
            Param(
                "layout", LAYOUTS, "original",
                "original: rows read where they are (the paper); sorted: a copy of the matrix with its rows in "
                "the sorted order, read contiguously (one more CSR in GPU memory)",
            ),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        t = c_type(dtype)
        return (
            f"suraa_scalar<{t}>", f"suraa_vector<{t}>", f"suraa_parent<{t}>",
            f"suraa_rows<{t}, false>", f"suraa_rows<{t}, true>",
        )

    # -- GPU path ---------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        if prepared.params["grouping"] == "row":
            self._prepare_rows(prepared)
        else:
            self._prepare_segments(prepared)

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        if prepared.params["grouping"] == "row":
            self._run_rows(prepared, x, out)
        else:
            self._run_segments(prepared, x, out)

    def _prepare_rows(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, p = prepared.A, prepared.params
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype), options=RDC)
        npr, first = _npr_first(cupy, A.indptr, A.indices, prepared.shape[1])
        dec = self._decompose_rows(cupy, npr, first, prepared)
        config = self._row_launch_config(dec, p)
        name = self.name_expressions(prepared.dtype)[4 if config["parent_blocks"] else 3]
        self._lay_out(prepared, dec.perm)
        prepared.extra.update(
            perm=dec.perm,
            **{k: cupy.asarray(v) for k, v in dec.arrays().items()},
            kernel=kernels[name],
            counters=cupy.zeros(max(1, dec.n_multi), dtype=cupy.uint32),
            partials=cupy.zeros(max(1, dec.n_multi_blocks), dtype=prepared.dtype),
            fallbacks=cupy.zeros(1, dtype=cupy.uint32),
            **config,
        )

    def _run_rows(self, prepared: Prepared, x: Any, out: Any) -> None:
        ex = prepared.extra
        ex["kernel"](
            (ex["grid_blocks"],), (prepared.params["scalar_block"],),
            (
                ex["bins"], np.int32(ex["bins"].shape[0]), np.int32(ex["parent_blocks"]),
                np.int32(ex["first_pos"]), np.int32(ex["skip_blocks"]),
                ex["counters"], ex["partials"], ex["fallbacks"],
                ex["perm"], *self._matrix_args(prepared), x, out,
            ),
        )

    @staticmethod
    def _lay_out(prepared: Prepared, perm: Any) -> None:
        """Layout "sorted": keep the copy of the matrix in the sorted order in ``extra`` (counted in its bytes)."""
        if prepared.params["layout"] == "sorted":
            cupy = require_cupy()
            A = prepared.A
            indptr, indices, data = sorted_copy(A.indptr, A.indices, A.data, perm, cupy)
            prepared.extra.update(sorted_indptr=indptr, sorted_indices=indices, sorted_data=data)

    @staticmethod
    def _matrix_args(prepared: Prepared) -> tuple[Any, ...]:
        """The kernels' ``sorted`` flag and the matrix arrays they read (see the Layout note in suraa.cu)."""
        ex = prepared.extra
        if "sorted_indptr" in ex:
            return np.int32(1), ex["sorted_indptr"], ex["sorted_indices"], ex["sorted_data"]
        A = prepared.A
        return np.int32(0), A.indptr, A.indices, A.data

    def _prepare_segments(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, p = prepared.A, prepared.params
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype), options=RDC)
        scalar, vector, parent = (kernels[n] for n in self.name_expressions(prepared.dtype)[:3])
        npr, key = _sort_key(cupy, A.indptr, A.indices, prepared.shape[1])
        perm = _argsort_stable(cupy, key)
        dec = self._decompose_segments(npr[perm].get(), p)
        self._lay_out(prepared, perm)
        n_side = len(dec.g2_launches) + int(dec.group_bounds[1] > 0)
        n_streams = min(p["streams"], n_side) if p["streams"] > 1 else 0
        streams = tuple(cupy.cuda.Stream(non_blocking=True) for _ in range(n_streams))
        prepared.extra.update(
            perm=perm,
            **{k: cupy.asarray(v) for k, v in dec.arrays().items()},
            kernels=(scalar, vector, parent),
            streams=streams,
            ready=cupy.cuda.Event(disable_timing=True),
            fallbacks=cupy.zeros(1, dtype=cupy.uint32),
            done=tuple(cupy.cuda.Event(disable_timing=True) for _ in streams),
            **self._segment_launch_config(dec),
        )

    def _run_segments(self, prepared: Prepared, x: Any, out: Any) -> None:
        cupy = require_cupy()
        p, ex = prepared.params, prepared.extra
        scalar, vector, parent = ex["kernels"]
        tail = (ex["perm"], *self._matrix_args(prepared), x, out)
        g1_end, g2_end, m = ex["g1_end"], ex["g2_end"], prepared.shape[0]
        caller = cupy.cuda.get_current_stream()
        streams = ex["streams"]
        if streams:  # the side streams start after what the caller queued (x, out ready)
            ex["ready"].record(caller)
            for s in streams:
                s.wait_event(ex["ready"])
        side = itertools.cycle(streams) if streams else itertools.repeat(contextlib.nullcontext())
        if g1_end:
            with next(side):
                if p["g1_mode"] == "dynamic":
                    parent(
                        (grid(g1_end, PARENT_BLOCK),), (PARENT_BLOCK,),
                        (np.int32(g1_end), np.int32(p["vector_cap"]), ex["fallbacks"], *tail),
                    )
                else:
                    width = ex["g1_width"]
                    vector((g1_end,), (width,), (np.int32(0), np.int32(g1_end), np.int32(width), *tail))
        for begin, end, y, block in ex["g2_launches"]:
            with next(side):
                blocks = grid(end - begin, block // y)
                vector((blocks,), (block,), (np.int32(begin), np.int32(end), np.int32(y), *tail))
        if g2_end < m:
            block = p["scalar_block"]
            scalar((grid(m - g2_end, block),), (block,), (np.int32(g2_end), np.int32(m), *tail))
        for s, done in zip(streams, ex["done"], strict=True):  # the caller's stream waits for G1, G2
            done.record(s)
            caller.wait_event(done)

    # -- CPU reference ----------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        A, p = prepared.A, prepared.params
        indptr, indices = np.asarray(A.indptr), np.asarray(A.indices)
        if p["grouping"] == "row":
            npr, first = _npr_first(np, indptr, indices, prepared.shape[1])
            dec = self._decompose_rows(np, npr, first, prepared)
            prepared.extra.update(
                perm=dec.perm, **dec.arrays(), rows=row_ids(indptr), **self._row_launch_config(dec, p)
            )
        else:
            perm = row_order(A)
            dec = self._decompose_segments(np.diff(indptr)[perm], p)
            prepared.extra.update(
                perm=perm, **dec.arrays(), rows=row_ids(indptr), **self._segment_launch_config(dec)
            )

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        """Each group (segment) or bin (row) writes y[perm[pos]] for its positions.

        A row no group covers, or one covered twice, is NaN. In grouping "row" a row
        of a bin with more threads than a block is summed piece by piece, as the
        kernel cuts it, and its pieces then added in order.
        """
        ex, m = prepared.extra, prepared.shape[0]
        prods = products(prepared.A, x)
        row_sum = segment_sums(ex["rows"], prods, m)
        y = np.zeros(m)
        count = np.zeros(m, dtype=np.int64)
        if prepared.params["grouping"] == "row":
            block, indptr = prepared.params["scalar_block"], np.asarray(prepared.A.indptr)
            for lo, hi, t, _ in ex["bins"].tolist():
                rows = ex["perm"][lo:hi]
                if t > block:
                    pieces = t // block
                    entry, slot = _row_pieces(indptr, rows, pieces)
                    partial = np.bincount(slot, weights=prods[entry], minlength=rows.size * pieces)
                    y[rows] = partial.reshape(rows.size, pieces).sum(axis=1)
                else:
                    y[rows] = row_sum[rows]
                np.add.at(count, rows, 1)
        else:
            bounds = ex["group_bounds"]
            for g in range(3):
                rows = ex["perm"][bounds[g] : bounds[g + 1]]
                y[rows] = row_sum[rows]
                np.add.at(count, rows, 1)
        y[count != 1] = np.nan
        return y

    # -- shared by both paths -----------------------------------------------------
    @staticmethod
    def _decompose_segments(npr_sorted: np.ndarray, p: dict[str, Any]) -> Decomposition:
        return decompose(
            npr_sorted,
            max_child_threads=p.get("max_child_threads", DEFAULT_BUDGET),
            threshold=p["threshold"],
            vector_cap=p["vector_cap"],
        )

    @staticmethod
    def _decompose_rows(xp: Any, npr: Any, first: Any, prepared: Prepared) -> RowDecomposition:
        p = prepared.params
        return decompose_rows(
            npr, first, n_cols=prepared.shape[1], threshold=p["threshold"], g3_entries=p["g3_entries"],
            block=p["scalar_block"], budget=p.get("max_child_threads", DEFAULT_BUDGET), xp=xp,
        )

    @staticmethod
    def _segment_launch_config(dec: Decomposition) -> dict[str, Any]:
        """Host ints for the launches of grouping "segment", the same on both paths."""
        g1_end = int(dec.group_bounds[1])
        return {
            "g1_end": g1_end,
            "g2_end": int(dec.group_bounds[2]),
            "g1_width": int(dec.seg_threads[0]) if g1_end else 0,
            "child_threads": dec.child_threads,
            "g2_launches": dec.g2_launches,
        }

    @staticmethod
    def _row_launch_config(dec: RowDecomposition, p: dict[str, Any]) -> dict[str, Any]:
        """Host ints for the one launch of grouping "row", the same on both paths.

        With g1_mode "dynamic" (and G1 not empty) the grid starts with
        ``parent_blocks`` blocks of parent threads, then the layout's blocks from
        ``skip_blocks`` (the block holding the first non-G1 position) on; rows below
        ``first_pos`` (= g1_end) are the children's.
        """
        g1_end, block = int(dec.group_bounds[1]), p["scalar_block"]
        dynamic = p["g1_mode"] == "dynamic" and g1_end > 0
        parent_blocks = grid(g1_end, block) if dynamic else 0
        skip = dec.block_of(g1_end) if dynamic else 0
        return {
            "g1_end": g1_end,
            "g2_end": int(dec.group_bounds[2]),
            "child_threads": dec.child_threads,
            "n_multi": dec.n_multi,
            "n_multi_blocks": dec.n_multi_blocks,
            "parent_blocks": parent_blocks,
            "first_pos": g1_end if dynamic else 0,
            "skip_blocks": skip,
            "grid_blocks": parent_blocks + int(dec.bin_blocks[-1]) - skip,
        }
