"""``csr_vector``: a group of ``threads_per_row`` threads per row (a baseline, its loads batched).

Lane l of a row's group sums the entries l, l+T, l+2T, ... of the row, then the
group reduces its T partial sums with a halving tree of warp shuffles. Suits
rows of tens to hundreds of nonzeros; wastes lanes on short rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid
from kernels._family import Family, Prepared
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space

THREADS_PER_ROW = (2, 4, 8, 16, 32)
BATCH_BYTES = 32
"""What a lane loads of its entries' values before it gathers their x (csr_vector.cu: 4 doubles, 8 floats)."""


class CsrVector(Family):
    name = "csr_vector"
    summary = "a group of threads per row, warp-shuffle reduction"
    source = "baseline (Bell & Garland, 2008: CSR vector)"
    cu_file = "csr_vector.cu"
    space = Space(
        (
            Param("threads_per_row", THREADS_PER_ROW, 8, "threads sharing one row (a power of two <= 32)"),
            Param("block_size", (64, 128, 256, 512, 1024), 256, "threads per block"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return tuple(f"csr_vector<{c_type(dtype)}, {t}>" for t in THREADS_PER_ROW)

    def _prepare(self, prepared: Prepared) -> None:
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        tpr = prepared.params["threads_per_row"]
        prepared.extra["kernel"] = kernels[f"csr_vector<{c_type(prepared.dtype)}, {tpr}>"]

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, p = prepared.A, prepared.params
        m, block = prepared.shape[0], p["block_size"]
        prepared.extra["kernel"](
            (grid(m * p["threads_per_row"], block),),
            (block,),
            (np.int32(m), A.indptr, A.indices, A.data, x, out),
        )

    def _prepare_reference(self, prepared: Prepared) -> None:
        indptr, tpr = prepared.A.indptr, prepared.params["threads_per_row"]
        rows = row_ids(indptr)
        lane = (np.arange(prepared.nnz, dtype=np.int64) - indptr[rows]) % tpr
        prepared.extra["slot"] = rows.astype(np.int64) * tpr + lane

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        m, tpr = prepared.shape[0], prepared.params["threads_per_row"]
        partial = segment_sums(prepared.extra["slot"], products(prepared.A, x), m * tpr).reshape(m, tpr)
        offset = tpr // 2
        while offset:
            partial[:, :offset] += partial[:, offset : 2 * offset]
            offset //= 2
        return partial[:, 0]
