"""``csr_vector``: a group of ``threads_per_row`` threads per row (a baseline, its loads batched).

Lane l of a row's group sums the entries l, l+T, l+2T, ... of the row, then the
group reduces its T partial sums with a halving tree of warp shuffles. Suits
rows of tens to hundreds of nonzeros; wastes lanes on short rows.

Narrow columns (``indices="narrow"``, beyond the baseline; index compression as in CSR-DU, Kourtis et al.,
2008): a row whose columns span fewer than 65,536 stores them as 16-bit offsets from its lowest column,
which the row keeps in a 32-bit word (:func:`narrow_columns`), so a local matrix (a mesh, a band, a renumbered
graph, blocks) moves 10 bytes an entry instead of 12 in float64 and 6 instead of 8 in float32. Rows that span
more read the CSR's int32 columns. Where the offsets save fewer bytes than the per-row words cost (fewer
than 2 entries a row in narrow rows), the product keeps the int32 columns throughout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._reference import row_ids, segment_sums
from kernels._space import Param, Space

THREADS_PER_ROW = (2, 4, 8, 16, 32)
BATCH_BYTES = 32
"""What a lane loads of its entries' values before it gathers their x (csr_vector.cu: 4 doubles, 8 floats)."""
OFFSET_LIMIT = 1 << 16
"""A row's columns are stored as 16-bit offsets where its highest and lowest are fewer than this apart."""
_WORD, _OFFSET, _INT32 = 4, 2, 4
"""Bytes of a row's base column, of an offset and of a CSR column."""


class CsrVector(Family):
    name = "csr_vector"
    summary = "a group of threads per row, warp-shuffle reduction"
    source = "baseline (Bell & Garland, 2008: CSR vector); narrow columns after CSR-DU (Kourtis et al., 2008)"
    cu_file = "csr_vector.cu"
    space = Space(
        (
            Param("threads_per_row", THREADS_PER_ROW, 8, "threads sharing one row (a power of two <= 32)"),
            Param("block_size", (64, 128, 256, 512, 1024), 256, "threads per block"),
            Param("indices", ("narrow", "int32"), "narrow", "columns read as 16-bit offsets from the row's "
                  "lowest where a row spans fewer than 65,536 and that saves bytes (narrow), or as int32"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        v = c_type(dtype)
        return ("csr_narrow", *(f"csr_vector<{v}, {t}, {n}>" for t in THREADS_PER_ROW for n in ("true", "false")))

    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, p, ex, m = prepared.A, prepared.params, prepared.extra, prepared.shape[0]
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        if p["indices"] == "narrow":
            base, offsets = cupy.empty(m, dtype=np.int32), cupy.empty(prepared.nnz, dtype=np.uint16)
            kernels["csr_narrow"]((grid(32 * m, 256),), (256,), (np.int32(m), A.indptr, A.indices, base, offsets))
            narrow_entries = int(cupy.diff(A.indptr)[base >= 0].sum(dtype=np.int64))
            if _narrow_pays(narrow_entries, m):
                ex.update(base=base, offsets=offsets)
        narrow = "true" if "base" in ex else "false"
        ex["kernel"] = kernels[f"csr_vector<{c_type(prepared.dtype)}, {p['threads_per_row']}, {narrow}>"]

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, p, ex = prepared.A, prepared.params, prepared.extra
        m, block = prepared.shape[0], p["block_size"]
        # The int32 instantiation never reads base and offsets: A's columns stand in for them.
        ex["kernel"](
            (grid(m * p["threads_per_row"], block),),
            (block,),
            (np.int32(m), A.indptr, A.indices, ex.get("base", A.indices), ex.get("offsets", A.indices), A.data,
             x, out),
        )

    def _prepare_reference(self, prepared: Prepared) -> None:
        indptr, tpr = prepared.A.indptr, prepared.params["threads_per_row"]
        rows = row_ids(indptr)
        lane = (np.arange(prepared.nnz, dtype=np.int64) - indptr[rows]) % tpr
        prepared.extra["slot"] = rows.astype(np.int64) * tpr + lane
        if prepared.params["indices"] == "narrow":
            narrow = narrow_columns(indptr, prepared.A.indices)
            if narrow is not None:
                prepared.extra.update(base=narrow[0], offsets=narrow[1])

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        A, ex = prepared.A, prepared.extra
        m, tpr = prepared.shape[0], prepared.params["threads_per_row"]
        columns = A.indices
        if "base" in ex:
            lowest = ex["base"][row_ids(A.indptr)]
            columns = np.where(lowest >= 0, lowest.astype(np.int64) + ex["offsets"], A.indices)
        values = A.data.astype(np.float64) * x.astype(np.float64)[columns]
        partial = segment_sums(ex["slot"], values, m * tpr).reshape(m, tpr)
        offset = tpr // 2
        while offset:
            partial[:, :offset] += partial[:, offset : 2 * offset]
            offset //= 2
        return partial[:, 0]


def narrow_columns(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(base, offsets) as ``csr_narrow`` writes them (wide rows' offsets 0 here, unwritten there), or None
    where they do not pay: base[i] is row i's lowest column where its columns span fewer than
    :data:`OFFSET_LIMIT` (0 for an empty row), else -1; offsets (uint16) the columns less their row's base."""
    m = indptr.size - 1
    lengths = np.diff(indptr)
    filled = lengths > 0
    lo, hi = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    if indices.size:
        lo[filled] = np.minimum.reduceat(indices, indptr[:-1][filled])
        hi[filled] = np.maximum.reduceat(indices, indptr[:-1][filled])
    fits = hi - lo < OFFSET_LIMIT
    if not _narrow_pays(int(lengths[fits].sum()), m):
        return None
    rows = row_ids(indptr)
    offsets = np.where(fits[rows], indices - lo[rows], 0).astype(np.uint16)
    return np.where(fits, lo, -1).astype(np.int32), offsets


def _narrow_pays(narrow_entries: int, rows: int) -> bool:
    """Whether 16-bit offsets in the narrow rows save more bytes than every row's base word costs."""
    return narrow_entries * (_INT32 - _OFFSET) > rows * _WORD
