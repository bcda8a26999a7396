"""SpMSpV, y = A·x for a sparse x, in the two modes of Hy-SpMSpV (Hong et al., 2018).

- ``sparse``: A is kept in CSC; only the columns that x's nonzeros select are
  read. Their entries, the *active products*, are numbered 0 .. total-1 column by
  column (``offsets[e]`` is where x entry e's column starts), one GPU thread per
  product, so the work is balanced by nonzeros however long a column is. The
  products are merged into y by ``merge``:

  - ``spa``: a sparse accumulator: atomic adds into a dense buffer that stays
    zero between calls, each row's first touch appended to a list, which is then
    sorted, read and zeroed again. Cost O(active products), never O(rows).
  - ``sort``: products written out, radix-sorted by row, equal rows summed.

- ``dense``: x is scattered into a zero-filled dense vector and an SpMV family
  computes the whole y: by default the paper's NuT (:mod:`kernels.nut`);
  ``{"kernel": name, ...its params}`` runs another (:func:`tuner.execute.spmspv.plan_spmspv`
  runs the SpMV that ``plan()`` picks for A). y's nonzeros are then found by a
  prefix sum (``flatnonzero``). Cost O(nnz(A) + rows + cols) whatever x holds.

Sparse x and y are ``(indices, values)``: int32 indices strictly increasing in
range, values of the matrix's dtype. Both modes return exactly the rows whose
value is nonzero (an exact zero from cancellation is left out in both, so the
two modes agree); :mod:`tuner.execute.spmspv` turns user input into this form.

Each mode has the GPU path (CuPy) and a CPU reference of its own decomposition
(:meth:`Mode.prepare_reference` / :meth:`Mode.run_reference`), as the SpMV
families do (:mod:`kernels._family`).

>>> import scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(30, 20, density=0.2, random_state=1))
>>> p = SPARSE.prepare_reference(A)
>>> idx, val = SPARSE.run_reference(p, np.array([3, 7], np.int32), np.array([1.0, -2.0]))
>>> bool(np.allclose(val, (A[:, [3, 7]] @ [1.0, -2.0])[idx]))
True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from kernels import REGISTRY, get_family
from kernels._arrays import stable_argsort
from kernels._cuda import c_type, device_attributes, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._space import Param, Space

SCAN_BLOCK = 1 << 15
"""Up to this many x entries, one block computes the sparse mode's offsets (else: counts, then a CuPy scan)."""

SMALL_SORT = 4096
"""Up to this many touched rows, one block sorts and collects them (``SMALL_SORT`` in spmspv.cu)."""

SparseVector = tuple[Any, Any]
"""``(indices, values)``: int32 indices, strictly increasing, and values (NumPy or CuPy arrays)."""


class Mode(ABC):
    """One way of computing SpMSpV: a declared parameter space, a GPU path and a CPU reference."""

    name: ClassVar[str]
    summary: ClassVar[str]
    space: ClassVar[Space]
    cu_file: ClassVar[str] = "spmspv.cu"

    @abstractmethod
    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        """The kernels this mode compiles from ``cu_file`` for ``dtype``."""

    # -- GPU path ---------------------------------------------------------------
    def prepare(self, A: Any, params: Mapping[str, Any] | None = None) -> Prepared:
        """One-time setup for a canonical ``cupyx`` CSR matrix."""
        prepared = self._new(A, params)
        if prepared.nnz:
            self._prepare(prepared)
        return prepared

    def run(self, prepared: Prepared, indices: Any, values: Any) -> SparseVector:
        """y = A·x on the GPU for x = (indices, values) as CuPy arrays in the canonical form."""
        cupy = require_cupy()
        if prepared.nnz == 0 or indices.shape[0] == 0:
            return cupy.empty(0, dtype=cupy.int32), cupy.empty(0, dtype=prepared.dtype)
        return self._run(prepared, indices, values)

    # -- CPU reference ----------------------------------------------------------
    def prepare_reference(self, A: Any, params: Mapping[str, Any] | None = None) -> Prepared:
        """The same decomposition in NumPy, for a canonical SciPy CSR matrix."""
        prepared = self._new(A, params)
        if prepared.nnz:
            self._prepare_reference(prepared)
        return prepared

    def run_reference(self, prepared: Prepared, indices: np.ndarray, values: np.ndarray) -> SparseVector:
        """y = A·x through this mode's decomposition, on the CPU (sums in float64)."""
        if prepared.nnz == 0 or indices.shape[0] == 0:
            return np.empty(0, dtype=np.int32), np.empty(0, dtype=prepared.dtype)
        rows, sums = self._run_reference(prepared, indices, values)
        sums = sums.astype(prepared.dtype)
        keep = sums != 0
        return rows[keep].astype(np.int32), sums[keep]

    def _new(self, A: Any, params: Mapping[str, Any] | None) -> Prepared:
        config = self.space.validate(params or {}, family=f"spmspv {self.name} mode")
        return Prepared(self.name, config, tuple(A.shape), int(A.nnz), np.dtype(A.dtype), A)

    @abstractmethod
    def structure_bytes(self, prepared: Prepared) -> int:
        """Bytes of this mode's representation of A (what it keeps besides the CSR)."""

    @abstractmethod
    def _prepare(self, prepared: Prepared) -> None: ...

    @abstractmethod
    def _run(self, prepared: Prepared, indices: Any, values: Any) -> SparseVector: ...

    @abstractmethod
    def _prepare_reference(self, prepared: Prepared) -> None: ...

    @abstractmethod
    def _run_reference(self, prepared: Prepared, indices: np.ndarray, values: np.ndarray) -> SparseVector:
        """(rows ascending, float64 sums) before the zero sums are dropped."""


class SparseMode(Mode):
    name = "sparse"
    summary = "CSC columns of x's nonzeros, one thread per active product, merged by a sparse accumulator or a sort"
    space = Space(
        (
            Param("merge", ("spa", "sort"), "spa", "how products meet in y: sparse accumulator or sort by row"),
            Param("block_size", (128, 256, 512, 1024), 256, "threads per block of the product kernel"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        t = c_type(dtype)
        return ("spmspv_counts", "spmspv_offsets", f"spmspv_spa<{t}>", f"spmspv_collect_small<{t}>",
                f"spmspv_collect<{t}>", f"spmspv_gather<{t}>")

    def structure_bytes(self, prepared: Prepared) -> int:
        ex = prepared.extra
        return sum(int(ex[k].nbytes) for k in ("col_ptr", "row_idx", "vals") if k in ex)

    def products(self, prepared: Prepared, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The decomposition (CPU): ``offsets`` (k+1), and for each active product its x entry and CSC position."""
        col_ptr = prepared.extra["col_ptr"]
        counts = col_ptr[indices.astype(np.int64) + 1] - col_ptr[indices]
        offsets = np.zeros(indices.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        p = np.arange(offsets[-1], dtype=np.int64)
        owner = np.searchsorted(offsets, p, side="right") - 1  # the kernel's binary search
        return offsets, owner, col_ptr[indices[owner]] + p - offsets[owner]

    # -- GPU path ---------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        csc = prepared.A.tocsc()  # cuSPARSE csr2csc: row indices sorted in each column
        ex, m, dtype = prepared.extra, prepared.shape[0], prepared.dtype
        ex.update(col_ptr=csc.indptr.astype(cupy.int64), row_idx=csc.indices.astype(cupy.int32), vals=csc.data)
        ex["longest"] = int(cupy.diff(ex["col_ptr"]).max())
        ex["kernels"] = get_kernels(self.cu_file, self.name_expressions(dtype))
        ex["blocks_cap"] = 16 * device_attributes()["MultiProcessorCount"]
        if prepared.params["merge"] == "spa":  # the accumulator, all zero between calls, and its counters
            ex.update(acc=cupy.zeros(m, dtype=dtype), mark=cupy.zeros(m, dtype=cupy.int32),
                      touched=cupy.empty(m, dtype=cupy.int32), counters=cupy.zeros(2, dtype=cupy.int32))

    def _run(self, prepared: Prepared, indices: Any, values: Any) -> SparseVector:
        cupy = require_cupy()
        ex, block, dtype = prepared.extra, prepared.params["block_size"], prepared.dtype
        kernels, col_ptr = ex["kernels"], ex["col_ptr"]
        k = indices.shape[0]
        spa = prepared.params["merge"] == "spa"
        if spa and k <= SCAN_BLOCK:  # one block scans the counts and zeroes the counters: one launch
            offsets = cupy.empty(k + 1, dtype=cupy.int64)
            kernels["spmspv_offsets"]((1,), (1024,), (np.int32(k), indices, col_ptr, offsets, ex["counters"]))
        else:
            counts = cupy.empty(k + 1, dtype=cupy.int64)
            kernels["spmspv_counts"]((grid(k + 1, 256),), (256,), (np.int32(k), indices, col_ptr, counts))
            offsets = cupy.cumsum(counts)  # offsets[e] = where x entry e's products start (not in place: unsafe)
            if spa:
                ex["counters"].fill(0)
        head = (np.int32(k), offsets, indices, values, col_ptr, ex["row_idx"], ex["vals"])
        # Every product kernel reads the total from offsets[k] itself: no host round trip before it.
        blocks = (min(grid(min(prepared.nnz, k * ex["longest"]), block), ex["blocks_cap"]),)
        t = c_type(dtype)
        if spa:
            acc, mark, counters, touched = ex["acc"], ex["mark"], ex["counters"], ex["touched"]
            kernels[f"spmspv_spa<{t}>"](blocks, (block,), (*head, acc, mark, touched, counters))
            rows = cupy.empty(SMALL_SORT, dtype=cupy.int32)
            sums = cupy.empty(SMALL_SORT, dtype=dtype)
            kernels[f"spmspv_collect_small<{t}>"]((1,), (1024,), (touched, acc, mark, rows, sums, counters))
            n, zeros = (int(v) for v in counters.get())  # the one wait: y's size (and cancellations)
            if n <= SMALL_SORT:
                rows, sums = rows[:n], sums[:n]
            else:  # too many rows for one block: sorted here, then collected
                rows = cupy.sort(touched[:n])
                sums = cupy.empty(n, dtype=dtype)
                kernels[f"spmspv_collect<{t}>"]((grid(n, 256),), (256,), (np.int32(n), rows, acc, mark, sums,
                                                                           counters, counters[1:]))
                zeros = int(counters[1])
            if not zeros:  # no sum cancelled to zero: y is complete
                return rows, sums
        else:
            total = int(offsets[-1])
            rows = cupy.empty(total, dtype=cupy.int32)
            products = cupy.empty(total, dtype=dtype)
            kernels[f"spmspv_gather<{t}>"](blocks, (block,), (*head, rows, products))
            rows, sums = sum_runs(cupy, rows, products)
        keep = sums != 0
        return rows[keep], sums[keep]

    # -- CPU reference ----------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        csc = prepared.A.tocsc()
        csc.sort_indices()
        prepared.extra.update(col_ptr=csc.indptr.astype(np.int64), row_idx=csc.indices.astype(np.int32),
                              vals=csc.data)

    def _run_reference(self, prepared: Prepared, indices: np.ndarray, values: np.ndarray) -> SparseVector:
        ex = prepared.extra
        _, owner, position = self.products(prepared, indices)
        rows = ex["row_idx"][position].astype(np.int64)
        products = ex["vals"][position].astype(np.float64) * values.astype(np.float64)[owner]
        if rows.size == 0:
            return rows, products
        if prepared.params["merge"] == "spa":  # first touches, sorted; sums gathered from the accumulator
            touched = np.unique(rows)
            return touched, np.bincount(rows, weights=products, minlength=prepared.shape[0])[touched]
        return sum_runs(np, rows, products)  # sort by row, sum each run of equal rows


class DenseMode(Mode):
    name = "dense"
    summary = "x zero-filled into a dense vector, an SpMV family (the paper's NuT by default), y's nonzeros by a scan"
    space = Space(
        (
            Param("kernel", tuple(sorted(REGISTRY)), "nut",
                  "the SpMV family run on the zero-filled x; that family's own params go beside it"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return (f"spmspv_scatter<{c_type(dtype)}>",)

    def _new(self, A: Any, params: Mapping[str, Any] | None) -> Prepared:
        own = dict(params or {})
        kernel = own.pop("kernel", self.space.defaults()["kernel"])
        family = get_family(str(kernel))
        config = {"kernel": family.name, **family.space.validate(own, family=f"spmspv dense mode ({family.name})")}
        return Prepared(self.name, config, tuple(A.shape), int(A.nnz), np.dtype(A.dtype), A)

    @staticmethod
    def _spmv(prepared: Prepared) -> tuple[Family, dict[str, Any]]:
        """The SpMV family of this dense mode and its params."""
        params = dict(prepared.params)
        return get_family(params.pop("kernel")), params

    def structure_bytes(self, prepared: Prepared) -> int:
        spmv = prepared.extra.get("spmv")
        return 0 if spmv is None else spmv.extra_bytes

    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        m, n = prepared.shape
        family, params = self._spmv(prepared)
        (name,) = self.name_expressions(prepared.dtype)
        prepared.extra.update(spmv=family.prepare(prepared.A, params), x=cupy.zeros(n, dtype=prepared.dtype),
                              y=cupy.empty(m, dtype=prepared.dtype),
                              scatter=get_kernels(self.cu_file, (name,))[name])

    def _run(self, prepared: Prepared, indices: Any, values: Any) -> SparseVector:
        cupy = require_cupy()
        ex = prepared.extra
        x, y, scatter = ex["x"], ex["y"], ex["scatter"]
        family, _ = self._spmv(prepared)
        k = np.int32(indices.shape[0])
        scatter((grid(k, 256),), (256,), (k, indices, values, np.bool_(False), x))
        family._run(ex["spmv"], x, y)  # x and y are this mode's own buffers: the checks of run() hold
        scatter((grid(k, 256),), (256,), (k, indices, values, np.bool_(True), x))  # x all zero again
        rows = cupy.flatnonzero(y).astype(cupy.int32)
        return rows, y[rows]

    def _prepare_reference(self, prepared: Prepared) -> None:
        family, params = self._spmv(prepared)
        prepared.extra["spmv"] = family.prepare_reference(prepared.A, params)

    def _run_reference(self, prepared: Prepared, indices: np.ndarray, values: np.ndarray) -> SparseVector:
        family, _ = self._spmv(prepared)
        x = np.zeros(prepared.shape[1], dtype=prepared.dtype)
        x[indices] = values
        spmv = prepared.extra["spmv"]
        y = family._run_reference(spmv, x) if spmv.nnz and spmv.shape[0] else np.zeros(prepared.shape[0])
        rows = np.flatnonzero(y)
        return rows, y[rows]


def sum_runs(xp: Any, keys: Any, values: Any) -> tuple[Any, Any]:
    """(distinct keys ascending, the sum of each key's values) for unsorted ``keys`` (``xp``: NumPy or CuPy).

    A stable sort, then each run of equal keys summed: ``numpy.add.reduceat`` on
    the CPU; on the GPU ``cupy.add.at`` into the runs (``cupy.add.reduceat``
    lost up to 1e-4 of float32 sums here).
    """
    if keys.shape[0] == 0:
        return keys, values
    order = stable_argsort(xp, keys)
    keys, values = keys[order], values[order]
    first = xp.ones(keys.shape[0], dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    if xp is np:
        starts = np.flatnonzero(first)
        return keys[starts], np.add.reduceat(values, starts)
    run = xp.cumsum(first) - 1  # each value's run
    distinct = keys[first]
    sums = xp.zeros(distinct.shape[0], dtype=values.dtype)
    xp.add.at(sums, run, values)  # cupyx.scatter_add, which CuPy 14 deprecates
    return distinct, sums


SPARSE = SparseMode()
DENSE = DenseMode()
MODES: dict[str, Mode] = {SPARSE.name: SPARSE, DENSE.name: DENSE}
"""The two modes by name."""

__all__ = ["DENSE", "MODES", "SPARSE", "DenseMode", "Mode", "SparseMode", "SparseVector", "sum_runs"]
