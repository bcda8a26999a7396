"""``csr_scalar``: one thread per row, the simplest CSR SpMV (a baseline).

Fast when rows are short and even; slow on long or uneven rows (one thread
walks a whole row, and a warp waits for its longest row). ``unroll`` loads a
row's first entries at once, ``indices`` reads a row's columns as 16-bit offsets
where they span fewer than 65,536 (narrow columns, as csr_vector; csr_scalar.cu
says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid
from kernels._family import Family, Prepared
from kernels._narrow import attach, indices_param, launch_columns, narrow_rows
from kernels._reference import RowSumReference
from kernels._space import Param, Space, Value
from kernels.csr_vector import lanes_balanced

UNROLL = (1, 2, 4, 8)


class CsrScalar(RowSumReference, Family):
    name = "csr_scalar"
    summary = "one thread per row"
    source = "baseline (Bell & Garland, 2008: CSR scalar)"
    cu_file = "csr_scalar.cu"
    row_columns = True
    space = Space((
        Param("block_size", (64, 128, 256, 512, 1024), 256, "threads per block"),
        Param("unroll", UNROLL, 4, "entries of a row a thread loads before it gathers their x (more loads in "
              "flight on short rows; 1: the plain loop, what configs recorded before this parameter ran)"),
        indices_param("row"),
    ))

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """Raced unranked (no selector for this GPU) as it is by default, where one lane a row keeps the lanes
        balanced (:func:`kernels.csr_vector.lanes_balanced`)."""
        return None if features is not None and not lanes_balanced(features, 1) else self.space.defaults()

    def adapt(self, params: Mapping[str, Any], *, cols: int, itemsize: int, l2_bytes: int) -> dict[str, Any] | None:
        """In float64, the same config with int32 columns where it reads narrow ones: an entry's 12 bytes
        become 10, and whether that pays for each row's base word depends on the rows and the GPU (probes at
        unroll 4: int32 7.5 % faster on tallskinny's 2.5 entries a row on both GPUs, narrow 6 % faster on
        poisson2d on the H100 and 3 % slower on the H200), so a race times both and a search measures both
        first. In float32 (8 bytes an entry become 6) narrow was as fast or faster on every matrix probed."""
        config = self.space.validate(params, family=self.name)
        return {**config, "indices": "int32"} if itemsize >= 8 and config["indices"] == "narrow" else None

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return tuple(f"csr_scalar<{c_type(dtype)}, {u}, {n}>" for u in UNROLL for n in ("true", "false"))

    def _prepare(self, prepared: Prepared) -> None:
        A, p, ex = prepared.A, prepared.params, prepared.extra
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        narrow = "true" if attach(ex, p, A.indptr, A.indices, narrow_rows(A)) else "false"
        ex["kernel"] = kernels[f"csr_scalar<{c_type(prepared.dtype)}, {p['unroll']}, {narrow}>"]

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, block = prepared.A, prepared.params["block_size"]
        m = prepared.shape[0]
        prepared.extra["kernel"](
            (grid(m, block),), (block,),
            (np.int32(m), A.indptr, A.indices, *launch_columns(prepared.extra, A.indices), A.data, x, out),
        )

    def _prepare_reference(self, prepared: Prepared) -> None:
        super()._prepare_reference(prepared)
        attach(prepared.extra, prepared.params, prepared.A.indptr, prepared.A.indices)
