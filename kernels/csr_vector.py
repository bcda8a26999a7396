"""``csr_vector``: a group of ``threads_per_row`` threads per row (a baseline, its loads batched).

Lane l of a row's group sums the entries l, l+T, l+2T, ... of the row, then the
group reduces its T partial sums with a halving tree of warp shuffles. Suits
rows of tens to hundreds of nonzeros; wastes lanes on short rows.

Narrow columns (``indices="narrow"``, beyond the baseline; :mod:`kernels._narrow`, a row a segment): a row
whose columns span fewer than 65,536 reads them as 16-bit offsets from its lowest, a wider one its int32
columns. One loop a kind of row, so that no branch splits a batch's loads (with one inside the batch, the
offsets lost to int32 everywhere). On the H200: a random geometric graph 1.33x -> 1.51x cuSPARSE in float64,
1.11x -> 1.51x in float32; dense diagonal blocks 1.28x -> 1.34x in float64 (probe F of
bench/probe_unseen_configs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid
from kernels._family import Family, Prepared
from kernels._narrow import attach, indices_param, launch_columns, narrow_rows, reference_columns
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space

THREADS_PER_ROW = (2, 4, 8, 16, 32)
BATCH_BYTES = 32
"""What a lane loads of its entries' values before it gathers their x (csr_vector.cu: 4 doubles, 8 floats)."""


def threads_covering(npr_mean: float, itemsize: int) -> int:
    """The threads a row whose first batches of loads (:data:`BATCH_BYTES` a lane) cover a row of ``npr_mean``
    entries of ``itemsize`` bytes: the power of two of :data:`THREADS_PER_ROW` nearest (by ratio) the lanes that
    takes (what rcm and rowsort race on their reordered matrices, :meth:`kernels.rcm.Rcm.unranked_config`)."""
    lanes = npr_mean * itemsize / BATCH_BYTES
    return next((t for t in THREADS_PER_ROW if t * t >= lanes * lanes / 2), THREADS_PER_ROW[-1])


class CsrVector(Family):
    name = "csr_vector"
    summary = "a group of threads per row, warp-shuffle reduction"
    source = "baseline (Bell & Garland, 2008: CSR vector); narrow columns after CSR-DU (Kourtis et al., 2008)"
    cu_file = "csr_vector.cu"
    row_columns = True
    space = Space(
        (
            Param("threads_per_row", THREADS_PER_ROW, 8, "threads sharing one row (a power of two <= 32)"),
            Param("block_size", (64, 128, 256, 512, 1024), 256, "threads per block"),
            indices_param("row"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        v = c_type(dtype)
        return tuple(f"csr_vector<{v}, {t}, {n}>" for t in THREADS_PER_ROW for n in ("true", "false"))

    def _prepare(self, prepared: Prepared) -> None:
        A, p, ex = prepared.A, prepared.params, prepared.extra
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        narrow = "true" if attach(ex, p, A.indptr, A.indices, narrow_rows(A)) else "false"
        ex["kernel"] = kernels[f"csr_vector<{c_type(prepared.dtype)}, {p['threads_per_row']}, {narrow}>"]

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        self.launch(prepared, x, out)

    def launch(self, prepared: Prepared, x: Any, out: Any, rows: Any = None) -> None:
        """The product into ``out``; with ``rows`` (int32, a row's number in ``out``), row i's sum is
        ``out[rows[i]]`` (rcm's and rowsort's matrices, reordered, writing y in A's order)."""
        A, p, ex = prepared.A, prepared.params, prepared.extra
        m, block = prepared.shape[0], p["block_size"]
        ex["kernel"](
            (grid(m * p["threads_per_row"], block),),
            (block,),
            (np.int32(m), A.indptr, A.indices, *launch_columns(ex, A.indices), A.data, x, out, rows),
        )

    def _prepare_reference(self, prepared: Prepared) -> None:
        indptr, tpr = prepared.A.indptr, prepared.params["threads_per_row"]
        rows = row_ids(indptr)
        lane = (np.arange(prepared.nnz, dtype=np.int64) - indptr[rows]) % tpr
        prepared.extra["slot"] = rows.astype(np.int64) * tpr + lane
        attach(prepared.extra, prepared.params, indptr, prepared.A.indices)

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        A, ex = prepared.A, prepared.extra
        m, tpr = prepared.shape[0], prepared.params["threads_per_row"]
        partial = segment_sums(ex["slot"], products(A, x, reference_columns(ex, A.indptr, A.indices)),
                               m * tpr).reshape(m, tpr)
        offset = tpr // 2
        while offset:
            partial[:, :offset] += partial[:, offset : 2 * offset]
            offset //= 2
        return partial[:, 0]
