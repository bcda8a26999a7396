"""``cusparse``: cuSPARSE's generic SpMV, called the way a tuned user would.

The matrix descriptor and the work buffer are built once in ``prepare`` (the
plain ``A @ x`` of cupyx rebuilds them on every call, about 70 µs on an H100);
``run`` only re-points the two dense-vector descriptors and calls
``cusparseSpMV``. The CSR algorithm (ALG1: row-based, ALG2: load-balanced by
nonzeros, deterministic) is the tuned parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels._family import Family, Prepared
from kernels._reference import RowSumReference
from kernels._space import Param, Space

# cusparseSpMVAlg_t values (cusparse.h, CUDA 12 and 13).
ALGORITHMS = {"default": 0, "csr_alg1": 2, "csr_alg2": 3}


class CuSparse(RowSumReference, Family):
    """cuSPARSE's own decomposition is not public: its reference is the plain row sum."""

    name = "cusparse"
    summary = "cuSPARSE SpMV, descriptors and buffer built once"
    source = "NVIDIA cuSPARSE (cusparseSpMV)"
    space = Space(
        (Param("algorithm", tuple(ALGORITHMS), "default", "cusparseSpMVAlg_t for CSR: default, ALG1, ALG2"),)
    )

    def uncapturable(self, params: Mapping[str, Any]) -> str | None:
        return "CuPy refuses cuSPARSE calls on a stream being captured"

    def _prepare(self, prepared: Prepared) -> None:
        import cupy
        from cupy._core import _dtype
        from cupy.cuda import device
        from cupy_backends.cuda.libs import cusparse as _cusparse
        from cupyx import cusparse

        A = prepared.A
        cuda_dtype = _dtype.to_cuda_dtype(prepared.dtype)

        def vector(size: int) -> Any:
            """A dense-vector descriptor of ``size`` values made on A's values' address, a placeholder never read:
            each product points it at its own x or y first (no vectors of m and n values kept for it)."""
            desc = _cusparse.createDnVec(size, A.data.data.ptr, cuda_dtype)
            return cusparse.DnVecDescriptor(desc, _cusparse.dnVecGet, _cusparse.destroyDnVec)

        desc_x, desc_y = vector(prepared.shape[1]), vector(prepared.shape[0])
        alpha, beta = np.array(1, prepared.dtype), np.array(0, prepared.dtype)
        ex = prepared.extra
        ex.update(
            handle=device.get_cusparse_handle(),
            desc_A=cusparse.SpMatDescriptor.create(A),
            desc_x=desc_x,
            desc_y=desc_y,
            alpha=alpha,
            beta=beta,
            cuda_dtype=cuda_dtype,
            alg=ALGORITHMS[prepared.params["algorithm"]],
            lib=_cusparse,
        )
        size = _cusparse.spMV_bufferSize(
            ex["handle"], _cusparse.CUSPARSE_OPERATION_NON_TRANSPOSE, alpha.ctypes.data, ex["desc_A"].desc,
            desc_x.desc, beta.ctypes.data, desc_y.desc, ex["cuda_dtype"], ex["alg"],
        )
        ex["buffer"] = cupy.empty(max(int(size), 1), dtype=cupy.int8)

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        import cupy

        ex = prepared.extra
        lib = ex["lib"]
        lib.dnVecSetValues(ex["desc_x"].desc, x.data.ptr)
        lib.dnVecSetValues(ex["desc_y"].desc, out.data.ptr)
        lib.setStream(ex["handle"], cupy.cuda.get_current_stream().ptr)
        lib.spMV(
            ex["handle"], lib.CUSPARSE_OPERATION_NON_TRANSPOSE, ex["alpha"].ctypes.data, ex["desc_A"].desc,
            ex["desc_x"].desc, ex["beta"].ctypes.data, ex["desc_y"].desc, ex["cuda_dtype"], ex["alg"],
            ex["buffer"].data.ptr,
        )
