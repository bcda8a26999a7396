"""``csr_scalar``: one thread per row, the simplest CSR SpMV (a baseline).

Fast when rows are short and even; slow on long or uneven rows (one thread
walks a whole row, and a warp waits for its longest row).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid
from kernels._family import Family, Prepared
from kernels._reference import RowSumReference
from kernels._space import Param, Space


class CsrScalar(RowSumReference, Family):
    name = "csr_scalar"
    summary = "one thread per row"
    source = "baseline (Bell & Garland, 2008: CSR scalar)"
    cu_file = "csr_scalar.cu"
    space = Space((Param("block_size", (64, 128, 256, 512, 1024), 256, "threads per block"),))

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return (f"csr_scalar<{c_type(dtype)}>",)

    def _prepare(self, prepared: Prepared) -> None:
        (prepared.extra["kernel"],) = get_kernels(self.cu_file, self.name_expressions(prepared.dtype)).values()

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, block = prepared.A, prepared.params["block_size"]
        m = prepared.shape[0]
        prepared.extra["kernel"](
            (grid(m, block),), (block,), (np.int32(m), A.indptr, A.indices, A.data, x, out)
        )
