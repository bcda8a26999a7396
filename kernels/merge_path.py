"""``merge_path``: merge-based CSR SpMV (Merrill & Garland, SC16; the algorithm of CUB's DeviceSpmv).

The row ends (``indptr[1:]``) and the nonzero indices ``0 .. nnz-1`` merge into
one path of ``m + nnz`` items (row end r comes before nonzero j when
``indptr[r+1] <= j``), and the path is cut into equal pieces: ``items_per_thread``
items a thread, ``block_size * items_per_thread`` a tile (a thread block). Rows
and nonzeros are balanced together, so a thread never does more than its share
whatever the row lengths: it helps where they vary a lot (power-law rows), where
many rows are empty (each costs one item, not a thread), and where one row is
huge (it spans many tiles; an arrow matrix's full row is cut like any other).

Stages and kernels (``merge_path.cu``):

- prepare: ``merge_path_search`` finds the coordinate (row, nonzero) of every
  tile boundary once, by a binary search along its diagonal (``tile_row``,
  ``tile_nz``; the matrix does not change between runs);
- ``merge_path_spmv<V, IPT, STAGED, NARROW>``: a block stages its tile's row ends and its
  products (value times x, read by the whole block in order: coalesced, as CUB
  does) in shared memory, each thread finds its start there, sums its items in order and writes
  the rows it closes; the partial sums of rows that go on past a thread
  (carry-outs) are combined by a block-wide scan by row, and the tile's own
  carry-out (its share of the row it ends in) goes to ``carry``;
- narrow columns (``indices="narrow"``, beyond CUB; :mod:`kernels._narrow`, a tile a segment): a tile whose
  columns span fewer than 65,536 reads them as 16-bit offsets from its lowest, a wider one its int32 columns;
- ``merge_path_fixup<V>``: ``y[tile_row[b+1]] += carry[b]`` for the rows that span
  tiles (launched only when some tile ends inside a row). ``carry`` belongs to
  the prepared matrix: two products of one prepared matrix must not run at once
  on different streams.

The CPU reference reproduces the decomposition (the same searches, the threads'
partial sums, the tiles' carry-outs and the fix-up):

>>> import numpy as np, scipy.sparse as sp
>>> A = sp.csr_matrix(np.array([[1.0, 2.0, 3.0], [0, 0, 0], [4.0, 0, 5.0]]))
>>> merge_path_search(A.indptr, np.arange(9)).T.tolist()  # (row ends, nonzeros) consumed at each diagonal
[[0, 0], [0, 1], [0, 2], [0, 3], [1, 3], [2, 3], [2, 4], [2, 5], [3, 5]]
>>> dec = decompose(A.indptr, items_per_thread=1, block_size=2)  # tiles of 2 items: diagonals 0, 2, 4, 6, 8
>>> dec["tile_row"].tolist(), dec["tile_nz"].tolist()
([0, 0, 1, 2, 3], [0, 2, 3, 4, 5])
>>> y, carry = spmv_reference(A.indptr, A.data, dec, items_per_thread=1, block_size=2)  # x = 1
>>> carry.tolist()  # tile 0 ends inside row 0 (1 + 2 carried), tile 2 inside row 2 (4 carried)
[3.0, 0.0, 4.0, 0.0]
>>> y.tolist()  # tile 1 closes row 0 with 3, tile 3 row 2 with 5; the fix-up adds the carries
[6.0, 0.0, 9.0]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common.errors import MatrixFormatError
from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._narrow import attach, indices_param, launch_columns, reference_columns
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space, Value

ITEMS_PER_THREAD = (2, 3, 4, 5, 6, 7, 9, 12, 16)
BLOCK_SIZES = (64, 128, 256, 512)
LOADS = ("block", "thread")
SEARCH_THREADS = 128
FIXUP_THREADS = 256
PATH_MAX = int(np.iinfo(np.int32).max)
"""The merge path's coordinates are 32-bit: m + nnz must not exceed this."""


def path_length(m: int, nnz: int) -> int:
    """``m + nnz``, the merge path's length; MatrixFormatError when 32-bit coordinates cannot hold it."""
    if m + nnz > PATH_MAX:
        raise MatrixFormatError(
            f"merge_path: a matrix of {m} rows and {nnz} stored entries has a merge path of {m + nnz} items, "
            f"more than its 32-bit coordinates hold ({PATH_MAX}); use another kernel"
        )
    return m + nnz


def n_tiles(m: int, nnz: int, tile: int) -> int:
    """Tiles of ``tile`` path items (thread blocks) for m rows and nnz entries."""
    return -(-path_length(m, nnz) // tile)


# -- the CPU reference of the decomposition -------------------------------------------------------
def merge_path_search(indptr: np.ndarray, diagonals: np.ndarray) -> np.ndarray:
    """``(2, k)`` int64: the (row ends, nonzeros) consumed at each diagonal, by the kernels' binary search.

    Row end r (value ``indptr[r+1]``) comes before nonzero j when ``indptr[r+1] <= j``;
    all diagonals are searched together, one halving of their ranges a round (the
    GPU searches tile boundaries in the whole row pointer, threads in their tile's
    row ends: the same coordinates).
    """
    ends = np.asarray(indptr, dtype=np.int64)[1:]
    m, nnz = len(ends), int(ends[-1]) if len(ends) else 0
    d = np.asarray(diagonals, dtype=np.int64)
    lo, hi = np.maximum(d - nnz, 0), np.minimum(d, m)
    while (active := lo < hi).any():
        pivot = (lo + hi) // 2
        before = active & (ends[np.minimum(pivot, m - 1)] <= d - pivot - 1)
        lo = np.where(before, pivot + 1, lo)
        hi = np.where(active & ~before, pivot, hi)
    return np.stack((lo, d - lo))


def decompose(indptr: np.ndarray, *, items_per_thread: int, block_size: int) -> dict[str, np.ndarray]:
    """The static decomposition: ``tile_row``, ``tile_nz`` (int32, n_tiles + 1), as merge_path_search writes them."""
    m, nnz = len(indptr) - 1, int(indptr[-1])
    tile = items_per_thread * block_size
    k = np.arange(n_tiles(m, nnz, tile) + 1, dtype=np.int64)
    rows, nzs = merge_path_search(indptr, np.minimum(k * tile, m + nnz))
    return {"tile_row": rows.astype(np.int32), "tile_nz": nzs.astype(np.int32)}


def ends_inside_a_row(indptr: Any, tile_row: Any, tile_nz: Any) -> bool:
    """Whether some tile ends inside a row (has entries of the row it ends in): only then has the fix-up work.

    NumPy or CuPy arrays (the GPU path asks this once, at prepare time).
    """
    return bool((tile_nz[1:-1] > indptr[tile_row[1:-1]]).any())


def spmv_reference(
    indptr: np.ndarray, prods: np.ndarray, dec: dict[str, np.ndarray], *, items_per_thread: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(y, carry)`` as merge_path_spmv and merge_path_fixup compute them, from the products a_ij * x_j.

    Every thread of every tile starts where the search on its diagonal puts it;
    its nonzeros of one row form one partial sum. A partial sum of a row the
    thread closes, or of a row closed later in the same tile (a thread carry-out,
    taken in by the block's scan), is written by the tile that closes the row;
    the rest, the tile's share of the row it ends in, is its ``carry``, which the
    fix-up adds to that row.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    m, nnz = len(indptr) - 1, int(indptr[-1])
    n_threads = (len(dec["tile_row"]) - 1) * block_size
    d = np.minimum(np.arange(n_threads + 1, dtype=np.int64) * items_per_thread, m + nnz)
    thread_row, thread_nz = merge_path_search(indptr, d)
    nz_thread = np.searchsorted(thread_nz, np.arange(nnz), side="right") - 1  # the thread of every nonzero
    closer = np.searchsorted(thread_row, np.arange(m), side="right") - 1  # the thread of every row end
    rows = row_ids(indptr)
    first = np.flatnonzero(np.diff(nz_thread, prepend=-1) | np.diff(rows, prepend=-1))  # the threads' row runs
    partial, run_row, run_tile = np.add.reduceat(prods, first), rows[first], nz_thread[first] // block_size
    in_tile = run_tile == closer[run_row] // block_size  # written by the tile that closes the row
    y = segment_sums(run_row[in_tile], partial[in_tile], m)
    carry = segment_sums(run_tile[~in_tile], partial[~in_tile], len(dec["tile_row"]) - 1)
    ends_in = dec["tile_row"][1:].astype(np.int64)
    open_ = ends_in < m
    return y + segment_sums(ends_in[open_], carry[open_], m), carry


# -- the family -----------------------------------------------------------------------------------
class MergePath(Family):
    name = "merge_path"
    summary = "merge-based CSR: rows + nonzeros split evenly over threads, carry-outs fixed up"
    source = "Merrill & Garland, SC16: merge-based parallel SpMV (CUB DeviceSpmv)"
    cu_file = "merge_path.cu"
    # Default: CUB's tuning for float64 since sm_50 (64 threads, 6 items a thread; float32 takes 128 and 7).
    space = Space(
        (
            Param("loads", LOADS, "block", "who reads a tile's values and columns: the block, in order, its "
                  "products staged in shared memory (coalesced, as CUB), or each thread its own items"),
            Param("items_per_thread", ITEMS_PER_THREAD, 6, "merge-path items (row ends + nonzeros) a thread"),
            Param("block_size", BLOCK_SIZES, 64, "threads per block (a tile is block_size * items_per_thread)"),
            indices_param("tile"),
        )
    )

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """None: a race leaves merge_path to the selectors that rank it. csr5, the other family that balances
        entries across threads, is raced unranked instead: on the H200's 351 corpus matrices where both were
        surveyed (26 merge_path configs, 14 csr5), merge_path was the fastest of every family on 6-7 a dtype,
        by 3 % or more on 2 (few long rows: lp_fit2d, Maragal_6), and leaving it out costs the corpus 0.09 %
        (geomean); in the unseen benchmark's races since csr5 joined, it never won, and each cost a preparation
        (0.5-1 ms), a check and its products: 10-16 SpMVs of a 24 M-entry float32 matrix."""
        return None

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        v = c_type(dtype)
        return ("merge_path_search", f"merge_path_fixup<{v}>",
                *(_spmv_name(v, k, w, n) for w in LOADS for k in ITEMS_PER_THREAD for n in (True, False)))

    @staticmethod
    def shared_bytes(params: dict[str, Any], dtype: Any) -> int:
        """Dynamic shared memory of a block: a tile's row ends, and its products when the block loads them
        (a tile of items in all, each at most a value's size, and 16 bytes to align the products)."""
        tile = int(params["items_per_thread"]) * int(params["block_size"])
        return tile * np.dtype(dtype).itemsize + 16 if params["loads"] == "block" else tile * 4

    @staticmethod
    def _tile(prepared: Prepared) -> int:
        return int(prepared.params["items_per_thread"]) * int(prepared.params["block_size"])

    # -- GPU path -------------------------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, ex, tile = prepared.A, prepared.extra, self._tile(prepared)
        m, nnz = prepared.shape[0], prepared.nnz
        count = n_tiles(m, nnz, tile)
        v, p = c_type(prepared.dtype), prepared.params
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        ex["fixup_kernel"] = kernels[f"merge_path_fixup<{v}>"]
        ex["tile_row"] = cupy.empty(count + 1, dtype=np.int32)
        ex["tile_nz"] = cupy.empty(count + 1, dtype=np.int32)
        ex["carry"] = cupy.zeros(count, dtype=prepared.dtype)
        kernels["merge_path_search"](
            (grid(count + 1, SEARCH_THREADS),),
            (SEARCH_THREADS,),
            (np.int32(m), np.int32(nnz), np.int32(tile), np.int32(count), A.indptr, ex["tile_row"], ex["tile_nz"]),
        )
        ex["fixup"] = ends_inside_a_row(A.indptr, ex["tile_row"], ex["tile_nz"])
        narrow = attach(ex, p, ex["tile_nz"], A.indices)
        ex["spmv_kernel"] = kernels[_spmv_name(v, p["items_per_thread"], p["loads"], narrow)]
        ex["shared_bytes"] = self.shared_bytes(p, prepared.dtype)
        if ex["shared_bytes"] > ex["spmv_kernel"].max_dynamic_shared_size_bytes:  # above 48 KB: opt in (once)
            ex["spmv_kernel"].max_dynamic_shared_size_bytes = ex["shared_bytes"]
        ex["runs"] = 0

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, ex = prepared.A, prepared.extra
        count = len(ex["carry"])
        block = int(prepared.params["block_size"])
        ex["spmv_kernel"](
            (count,),
            (block,),
            (A.indptr, A.indices, *launch_columns(ex, A.indices), A.data, x, out, ex["tile_row"], ex["tile_nz"],
             ex["carry"]),
            shared_mem=ex["shared_bytes"],
        )
        if ex["fixup"]:
            ex["fixup_kernel"](
                (grid(count, FIXUP_THREADS),),
                (FIXUP_THREADS,),
                (np.int32(prepared.shape[0]), np.int32(count), ex["tile_row"], ex["carry"], out),
            )
        ex["runs"] += 1

    # -- CPU reference --------------------------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        path_length(prepared.shape[0], prepared.nnz)  # before any array is touched
        p = prepared.params
        prepared.extra.update(
            decompose(prepared.A.indptr, items_per_thread=int(p["items_per_thread"]), block_size=int(p["block_size"]))
        )
        prepared.extra["carry"] = np.zeros(len(prepared.extra["tile_row"]) - 1, dtype=prepared.dtype)
        prepared.extra["runs"] = 0
        attach(prepared.extra, p, prepared.extra["tile_nz"], prepared.A.indices)

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        p, ex, A = prepared.params, prepared.extra, prepared.A
        y, carry = spmv_reference(
            A.indptr,
            products(A, x, reference_columns(ex, ex["tile_nz"], A.indices)),
            ex,
            items_per_thread=int(p["items_per_thread"]),
            block_size=int(p["block_size"]),
        )
        ex["carry"][...] = carry
        ex["runs"] += 1
        return y

    # -- both paths -----------------------------------------------------------------------------
    def decomposition(self, prepared: Prepared) -> dict[str, np.ndarray]:
        """``tile_row``, ``tile_nz`` and ``carry`` (that of the last run's x) as NumPy arrays, from either path."""
        ex = prepared.extra
        if not ex.get("runs"):
            raise RuntimeError(
                "merge_path's carry-outs come from a run: run the prepared matrix once first (a matrix without "
                "rows or stored entries has no decomposition)"
            )
        return {k: ex[k] if isinstance(ex[k], np.ndarray) else ex[k].get() for k in ("tile_row", "tile_nz", "carry")}


def _spmv_name(ctype: str, items_per_thread: int, loads: str, narrow: bool) -> str:
    """The product's kernel for a value type, items a thread, who loads (STAGED: the block) and whether it
    reads narrow columns."""
    return (f"merge_path_spmv<{ctype}, {items_per_thread}, {'true' if loads == 'block' else 'false'}, "
            f"{'true' if narrow else 'false'}>")


__all__ = ["MergePath", "decompose", "ends_inside_a_row", "merge_path_search", "path_length", "spmv_reference"]
