"""``suraa``: SURAA (Muhammed et al., 2019): sorted rows, Freedman–Diaconis segments, three groups.

Setup: rows are sorted by nonzeros per row (npr) descending, ties by first
column index (``n`` for an empty row), then by row index (a stable sort), giving
``perm`` (sorted position → row). The sorted rows are cut into segments of
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
``Y`` (same kernel, same block: merged to save launches); G3 by
``suraa_scalar`` on the caller's stream. The G1 launch and the G2 launches go
round-robin onto up to four non-blocking streams, which wait for the caller's
stream (x and out ready) and are waited for by it, through events, so ``run``
is ordered like any other launch on the caller's stream. y is written in the
original row order through ``perm``.

The decomposition (``DECOMPOSITION_KEYS`` in ``prepared.extra``) is the same on
both paths: CuPy arrays on the GPU, NumPy arrays in the reference. The GPU path
also keeps ``fallbacks`` (uint32 counter): G1 rows whose child launch the device
runtime refused and the parent thread summed itself (0 when dynamic parallelism
really ran).

>>> import scipy.sparse as sp
>>> A = sp.csr_matrix(sp.diags([1.0, 2.0, 3.0]))
>>> p = Suraa().prepare_reference(A)
>>> p.extra["perm"].tolist(), p.extra["group_bounds"].tolist()
([0, 1, 2], [0, 0, 0, 3])
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space
from tuner.features import freedman_diaconis_segments

__all__ = ["DECOMPOSITION_KEYS", "Decomposition", "Suraa", "decompose", "row_order", "threads_per_row"]

MAX_CHILD_THREADS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
THRESHOLDS = (16, 32, 64)
VECTOR_CAPS = (128, 256, 512, 1024)
SCALAR_BLOCKS = (64, 128, 256, 512)
G1_MODES = ("dynamic", "block")

VECTOR_BLOCK = 256
"""G2 blocks hold ``max(1, VECTOR_BLOCK // Y)`` rows of ``Y`` threads (one row per block once Y >= 256)."""
PARENT_BLOCK = 32
"""Threads per block of the G1 parent kernel: one warp, so the launches spread over many SMs."""
N_STREAMS = 4
"""Most side streams the G1 launch and the G2 launches are spread over."""
RDC = ("-rdc=true",)
"""Relocatable device code, linked with cudadevrt: needed for the device-side launches."""

DECOMPOSITION_KEYS = ("perm", "seg_bounds", "seg_mean", "seg_threads", "group_of_segment", "group_bounds")
"""Keys of ``prepared.extra`` that hold the decomposition, equal on the GPU and reference paths."""


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
        return {k: getattr(self, k) for k in DECOMPOSITION_KEYS if k != "perm"}


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


def _sort_key(xp: Any, indptr: Any, indices: Any, n_cols: int) -> tuple[Any, Any]:
    """(npr, key) with key ascending = npr descending, then first column ascending (n for an empty row).

    ``key = first_col − npr·(n + 1)`` fits int64 (``npr, n < 2**31``); a stable sort
    of it breaks the remaining ties by row index. Works with NumPy and CuPy alike.
    """
    npr = xp.diff(indptr)
    nnz = int(indices.size)
    first = xp.where(npr > 0, indices[xp.minimum(indptr[:-1], max(nnz - 1, 0))], n_cols) if nnz else n_cols
    return npr, xp.asarray(first).astype(xp.int64) - npr.astype(xp.int64) * (n_cols + 1)


def row_order(A: Any) -> np.ndarray:
    """``perm`` (int32) of a SciPy CSR matrix: rows by npr descending, then first column, then index."""
    _, key = _sort_key(np, np.asarray(A.indptr), np.asarray(A.indices), A.shape[1])
    return np.argsort(key, kind="stable").astype(np.int32)


class Suraa(Family):
    name = "suraa"
    summary = "rows sorted by length, FD segments; scalar, vector and dynamic-parallelism groups on streams"
    source = "SURAA (Muhammed, Mehmood, Albeshri & Katib, Applied Sciences 9(5):947, 2019)"
    cu_file = "suraa.cu"
    space = Space(
        (
            Param(
                "max_child_threads", MAX_CHILD_THREADS, 8192,
                "budget of G1: the sum of its rows' child-kernel widths min(vector_cap, 32*ceil(npr/32))",
            ),
            Param("threshold", THRESHOLDS, 32, "segment mean npr above which rows are long (G1/G2), else G3"),
            Param("vector_cap", VECTOR_CAPS, 1024, "most threads on one row (G2 vector, G1 child or block)"),
            Param("scalar_block", SCALAR_BLOCKS, 256, "threads per block of the G3 scalar kernel"),
            Param("g1_mode", G1_MODES, "dynamic", "G1 by dynamic-parallelism children or one block per row"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        t = c_type(dtype)
        return (f"suraa_scalar<{t}>", f"suraa_vector<{t}>", f"suraa_parent<{t}>")

    # -- GPU path ---------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, p = prepared.A, prepared.params
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype), options=RDC)
        scalar, vector, parent = kernels.values()
        npr, key = _sort_key(cupy, A.indptr, A.indices, prepared.shape[1])
        perm = cupy.argsort(key).astype(cupy.int32)  # CuPy's argsort is stable
        dec = decompose(
            npr[perm].get(),
            max_child_threads=p["max_child_threads"], threshold=p["threshold"], vector_cap=p["vector_cap"],
        )
        n_streams = min(N_STREAMS, len(dec.g2_launches) + int(dec.group_bounds[1] > 0))
        streams = tuple(cupy.cuda.Stream(non_blocking=True) for _ in range(n_streams))
        prepared.extra.update(
            perm=perm,
            **{k: cupy.asarray(v) for k, v in dec.arrays().items()},
            kernels=(scalar, vector, parent),
            streams=streams,
            ready=cupy.cuda.Event(disable_timing=True),
            fallbacks=cupy.zeros(1, dtype=cupy.uint32),
            done=tuple(cupy.cuda.Event(disable_timing=True) for _ in streams),
            **self._launch_config(dec),
        )

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        cupy = require_cupy()
        A, p, ex = prepared.A, prepared.params, prepared.extra
        scalar, vector, parent = ex["kernels"]
        tail = (ex["perm"], A.indptr, A.indices, A.data, x, out)
        g1_end, g2_end, m = ex["g1_end"], ex["g2_end"], prepared.shape[0]
        caller = cupy.cuda.get_current_stream()
        streams = ex["streams"]
        if streams:  # the side streams start after what the caller queued (x, out ready)
            ex["ready"].record(caller)
            for s in streams:
                s.wait_event(ex["ready"])
        side = itertools.cycle(streams)
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
        perm = row_order(A)
        dec = decompose(
            np.diff(A.indptr)[perm],
            max_child_threads=p["max_child_threads"], threshold=p["threshold"], vector_cap=p["vector_cap"],
        )
        prepared.extra.update(perm=perm, **dec.arrays(), rows=row_ids(A.indptr), **self._launch_config(dec))

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        """Each group writes y[perm[pos]] for its positions; a row no group covers stays NaN."""
        ex, m = prepared.extra, prepared.shape[0]
        row_sum = segment_sums(ex["rows"], products(prepared.A, x), m)
        y = np.full(m, np.nan)
        bounds = ex["group_bounds"]
        for g in range(3):
            rows = ex["perm"][bounds[g] : bounds[g + 1]]
            y[rows] = row_sum[rows]
        return y

    @staticmethod
    def _launch_config(dec: Decomposition) -> dict[str, Any]:
        """Host ints for the launches, the same on both paths."""
        g1_end = int(dec.group_bounds[1])
        return {
            "g1_end": g1_end,
            "g2_end": int(dec.group_bounds[2]),
            "g1_width": int(dec.seg_threads[0]) if g1_end else 0,
            "child_threads": dec.child_threads,
            "g2_launches": dec.g2_launches,
        }
