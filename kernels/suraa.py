"""``suraa``: SURAA (Muhammed et al., 2019): rows sorted by length, three groups G1/G2/G3.

Two groupings (the ``grouping`` parameter), so the paper and our change can be
tuned and compared side by side: the paper's segments (:mod:`kernels.suraa_segments`)
and our per-row bins (:mod:`kernels.suraa_rows`). This module is the family
itself: its parameter space, the launches of each grouping and the reference.
Both groupings write y in the original row order through ``perm`` (sorted
position → row).

Grouping "segment" runs G1 by ``suraa_parent``, one thread per row launching a
one-block child grid into ``cudaStreamFireAndForget`` (``g1_mode="dynamic"``),
or by ``suraa_vector`` with one block per row (``g1_mode="block"``); G2 by
``suraa_vector``, one launch per run of consecutive G2 segments with the same
``Y``; G3 by ``suraa_scalar`` on the caller's stream. With ``streams=4`` the G1
launch and the G2 launches go round-robin onto up to four non-blocking streams,
which wait for the caller's stream (x and out ready) and are waited for by it,
through events; with ``streams=1`` everything is queued on the caller's stream.
Launches per SpMV: ``1 + len(g2_launches) + 1`` at most (plus an event record
and wait per side stream).

Grouping "row" runs ONE launch of ``suraa_rows`` with ``scalar_block`` =
``width`` threads per block over all bins: a bin with ``t <= width`` packs ``width / t``
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
the GPU (:func:`~kernels.suraa_rows.decompose_rows` with ``xp=cupy``); only the bin table (tens of
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
from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels._arrays import stable_argsort
from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space
from kernels.suraa_rows import ROW_KEYS, RowDecomposition, _row_pieces, decompose_rows
from kernels.suraa_segments import (
    SEGMENT_KEYS,
    Decomposition,
    _npr_first,
    _sort_key,
    decompose,
    row_order,
)

__all__ = ["DECOMPOSITION_KEYS", "Suraa", "sorted_copy"]

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

PARENT_BLOCK = 32
"""Threads per block of the G1 parent kernel (grouping "segment"): one warp, so the launches spread over SMs."""
RDC = ("-rdc=true",)
"""Relocatable device code, linked with cudadevrt: needed for the device-side launches."""

DECOMPOSITION_KEYS = {"segment": SEGMENT_KEYS, "row": ROW_KEYS}
"""Per grouping, the keys of ``prepared.extra`` that hold the decomposition, equal on the GPU and reference paths."""
LAUNCH_KEYS = {
    "segment": ("g1_end", "g2_end", "g1_width", "child_threads", "g2_launches"),
    "row": (
        "g1_end", "g2_end", "child_threads", "n_multi", "n_multi_blocks",
        "parent_blocks", "first_pos", "skip_blocks", "grid_blocks",
    ),
}
"""Per grouping, the host ints of ``prepared.extra`` for the launches, equal on both paths."""


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

    def uncapturable(self, params: Mapping[str, Any]) -> str | None:
        if params.get("g1_mode") == "dynamic":
            return "its child grids, launched from the GPU into the fire-and-forget stream, are not waited for by " \
                   "a replayed graph: after a replay and a sync of its stream, y was not yet written in 275 of 300 " \
                   "replays (H100, stop 49)"
        return None

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
        perm = stable_argsort(cupy, key).astype(cupy.int32)
        dec = self._decompose_segments(npr[perm], p, cupy)  # on the GPU: only the segments come back
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
    def _decompose_segments(npr_sorted: Any, p: dict[str, Any], xp: Any = np) -> Decomposition:
        return decompose(
            npr_sorted,
            max_child_threads=p.get("max_child_threads", DEFAULT_BUDGET),
            threshold=p["threshold"],
            vector_cap=p["vector_cap"],
            xp=xp,
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
