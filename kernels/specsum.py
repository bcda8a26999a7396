"""``specsum``: speculative segmented sum (Liu & Vinter, 2015).

The nonzeros are split evenly into tiles of ``W*T`` entries (``T`` threads a
bunch, ``W`` entries a thread); a bunch walks ``S`` consecutive tiles and a
thread block holds ``B`` bunches. No preprocessing: each run, the bunch finds
the row of its first entry by a search of the row pointer made by its lanes
together, walks the row pointer from there (the segment descriptor of each
tile, the next tile's first row, empty rows), sums the segments, and writes the
partial sums. A tile is *dirty* when its row range holds an empty row. A bunch
that starts inside a row hands its partial sum of that row to a synchronizer
instead of y. What stage 1 does with dirty tiles is the parameter ``dirty``:

- ``"fixup"`` (the paper's speculation): every tile writes its segments
  *compacted*, segment g to ``y[first row of the tile + g]``, right unless the
  tile is dirty; a second stage repairs the dirty tiles;
- ``"search"`` (what CSR5 does with its empty-row descriptor): in dirty tiles
  each segment is written to its true row (the row of its first entry j, the
  last row r of the tile's range with indptr[r] <= j, which the walk records in
  shared memory where row r starts) and empty rows get 0, so stage 1 writes
  every row and the second stage only adds the synchronizer.

Stages and kernels (``specsum.cu``):

- stage 1, ``specsum_tiles<V, W, T, WIDE>`` (one launch; ``B``, ``S`` and the mode
  are runtime arguments): search, walk, descriptor, dirty flag, segmented sum,
  carry between the tiles of a bunch, writes, synchronizer; it records the
  decomposition (``tile_row``, ``dirty``, ``sync_row``, ``sync_val``). ``WIDE`` is
  chosen by ``prepare``, not tuned: when the bunches fit in one wave (a small
  matrix: latency-bound), each lane loads several row pointers a round of the
  search and of the walk; otherwise one (fewer registers, fewer loads);
- stage 2, ``dirty="search"``: ``specsum_sync<V>`` adds the synchronizer into y
  (atomically: a long row can span several bunches); when the bunches are few
  (:data:`FUSED_SYNC_PER_THREAD` a thread of a block), the last block of stage 1
  to finish does it instead, which saves a launch on small matrices (the blocks
  count themselves in a ticket of the prepared matrix, so two products of one
  prepared matrix must not run at once on different streams). ``dirty="fixup"`` with
  ``fixup="gpu"``: ``specsum_fixup<V>`` adds the synchronizer and re-scatters the
  compacted partial sums of each dirty tile to their rows, one warp a dirty tile
  with its rows over the lanes; ``fixup="host"``: the synchronizer, the dirty flags
  (the dirty-tile list as one byte a tile, so no counter has to be reset between
  runs) and the affected span of y are copied to pinned host memory, re-scattered
  on the CPU, and the span is copied back (no managed memory is used).
  Stage 2 is not launched when ``prepare`` saw that it has nothing to do: no
  bunch starts inside a row, and (``"fixup"``) no row is empty.

The CPU reference reproduces the same stages in NumPy (the same tiles, dirty
flags, writes, synchronizer and fix-up), so a broken stage shows on any machine:

>>> import numpy as np, scipy.sparse as sp
>>> A = sp.csr_matrix(np.array([[0, 0], [1.0, 2.0], [0, 0], [3.0, 0]]))
>>> f = SpecSum()
>>> p = f.prepare_reference(A, {"W": 1, "T": 16, "S": 1, "dirty": "fixup"})
>>> f.run_speculative_reference(p, np.ones(2)).tolist()  # row 3's sum lands on y[1 + 1]
[nan, 3.0, 3.0, nan]
>>> f.run_reference(p, np.ones(2)).tolist()
[0.0, 3.0, 0.0, 3.0]
>>> f.decomposition(p)["dirty"].tolist()
[1]
>>> p = f.prepare_reference(A, {"W": 1, "T": 16, "S": 1, "dirty": "search"})
>>> f.run_speculative_reference(p, np.ones(2)).tolist()  # already y: no re-scatter needed
[0.0, 3.0, 0.0, 3.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels._cuda import c_type, device_attributes, get_kernels, grid, require_cupy, resident_threads
from kernels._family import Family, Prepared, _check_vector
from kernels._reference import products, row_ids
from kernels._space import Param, Space

W_VALUES = (1, 2, 4, 6, 8, 12, 16)
T_VALUES = (16, 32)
B_VALUES = (1, 2, 4, 8)
S_VALUES = (1, 2, 4, 8, 16)
DIRTY_MODES = ("search", "fixup")
FIXUPS = ("gpu", "host")
DECOMPOSITION_KEYS = ("tile_row", "dirty", "sync_row", "sync_val")
STAGE2_THREADS = 256
FUSED_SYNC_PER_THREAD = 4
"""Search mode adds the synchronizer in stage 1's last block (no second launch) when the bunches number at
most this many per thread of a block: one round of loads a thread (``U`` in specsum_tiles)."""


@dataclass(frozen=True)
class Geometry:
    """How a matrix with ``nnz`` entries is cut: ``tile`` entries a tile, ``S`` tiles a bunch."""

    tile: int
    S: int
    n_tiles: int
    n_bunches: int

    @classmethod
    def of(cls, nnz: int, tile: int, S: int) -> Geometry:
        n_tiles = -(-nnz // tile)
        return cls(tile, S, n_tiles, -(-n_tiles // S))


# -- the CPU reference of the decomposition and the stages ----------------------------------------
def tile_rows(indptr: np.ndarray, tiles: np.ndarray, tile: int) -> np.ndarray:
    """Row of the first entry of each tile in ``tiles`` (``m`` for the boundary at nnz), as the GPU's search."""
    nnz = int(indptr[-1])
    bounds = np.minimum(np.asarray(tiles, dtype=np.int64) * tile, nnz)
    return (np.searchsorted(indptr, bounds, side="right") - 1).astype(np.int32)


def decompose(indptr: np.ndarray, tile: int, S: int) -> dict[str, np.ndarray]:
    """The static decomposition: ``tile_row`` (n_tiles + 1), ``dirty`` (n_tiles), ``sync_row`` (n_bunches).

    Tile i covers entries [i*tile, (i+1)*tile); its row range is tile_row[i] ..
    min(tile_row[i+1], m-1) (from row 0 for tile 0). It is dirty when that range
    holds an empty row. ``sync_row[b]`` is the row bunch b starts in when it
    starts inside that row, else -1.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    m, nnz = len(indptr) - 1, int(indptr[-1])
    geo = Geometry.of(nnz, tile, S)
    tile_row = tile_rows(indptr, np.arange(geo.n_tiles + 1), tile)
    empties = np.concatenate(([0], np.cumsum(indptr[1:] == indptr[:-1])))  # empty rows before row r
    lo = tile_row[:-1].astype(np.int64)
    if geo.n_tiles:
        lo[0] = 0
    hi = np.minimum(tile_row[1:], m - 1).astype(np.int64)
    dirty = (empties[hi + 1] - empties[lo] > 0).astype(np.uint8)
    head = tile_row[np.arange(geo.n_bunches) * S]
    head_open = indptr[head] < np.arange(geo.n_bunches, dtype=np.int64) * S * tile
    sync_row = np.where(head_open, head, -1).astype(np.int32)
    return {"tile_row": tile_row, "dirty": dirty, "sync_row": sync_row}


def speculate(
    indptr: np.ndarray, prods: np.ndarray, tile: int, S: int, dec: dict[str, np.ndarray], *, search: bool = False
):
    """Stage 1 on the CPU: ``(y_speculative, sync_val)``; rows stage 1 leaves unwritten are NaN.

    ``prods`` are the entries' products a_ij * x_j (float64). Segments are the
    runs of a tile's entries that share a row; a segment that continues the
    previous tile's last row (in the same bunch) gets that segment's value added
    (the carry), and each value is written where specsum_tiles writes it: segment
    g of a tile at y[first row of the tile + g], except, with ``search``, in dirty
    tiles, where it goes to its true row (the row of its first entry) and every
    empty row gets 0 (every empty row lies in a dirty tile's range, so stage 1
    then writes all of y but the synchronizer's share).
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    m, nnz = len(indptr) - 1, int(indptr[-1])
    geo = Geometry.of(nnz, tile, S)
    tile_row = dec["tile_row"].astype(np.int64)
    y = np.full(m, np.nan)
    sync_val = np.zeros(geo.n_bunches)
    if nnz == 0:
        return y, sync_val
    e = np.arange(nnz, dtype=np.int64)
    rows = row_ids(indptr)
    row_start = e == indptr[rows]
    first = np.flatnonzero(row_start | (e % tile == 0))  # first entry of every segment
    seg_val = np.add.reduceat(prods, first) if len(first) else np.zeros(0)
    seg_tile = first // tile
    seg_row_start = row_start[first]
    tile_first = np.searchsorted(seg_tile, np.arange(geo.n_tiles + 1))
    g = np.arange(len(first)) - tile_first[seg_tile]
    n_in_tile = np.diff(tile_first)

    # Carry: a segment that does not start its row continues the previous tile's last segment.
    carried = seg_val.copy()
    chain_start = seg_row_start | (seg_tile % S == 0)
    chain_first = np.maximum.accumulate(np.where(chain_start, np.arange(len(first)), 0))
    depth = np.arange(len(first)) - chain_first
    for d in range(1, int(depth.max(initial=0)) + 1):
        at = np.flatnonzero(depth == d)
        carried[at] += carried[at - 1]

    r0, r1 = tile_row[seg_tile], tile_row[seg_tile + 1]
    te = np.minimum((seg_tile + 1) * tile, nnz)
    open_end = (r1 < m) & (indptr[np.minimum(r1, m)] < te)
    is_last = g == n_in_tile[seg_tile] - 1
    last_in_bunch = (seg_tile % S == S - 1) | (seg_tile == geo.n_tiles - 1)
    bunch = seg_tile // S
    head_row = tile_row[bunch * S]
    head_open = indptr[head_row] < bunch * S * tile
    to_sync = (g == 0) & head_open & (r0 == head_row)
    carried_on = ~to_sync & is_last & open_end
    to_next_row = carried_on & last_in_bunch
    compacted = ~to_sync & ~carried_on
    target = r0 + g
    if search:
        y[indptr[1:] == indptr[:-1]] = 0.0
        target = np.where(dec["dirty"][seg_tile] != 0, rows[first], target)
    y[target[compacted]] = carried[compacted]
    y[r1[to_next_row]] = carried[to_next_row]
    at = np.flatnonzero(to_sync)
    if len(at):
        last = np.append(bunch[at][1:] != bunch[at][:-1], True)  # the chain's final (cumulative) value
        sync_val[bunch[at][last]] = carried[at][last]
    return y, sync_val


def _dirty_rows(tiles: np.ndarray, r0: np.ndarray, r1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows, owner): the rows the fix-up repairs, grouped by dirty tile, and the tile's position in ``tiles``."""
    start = np.where(np.asarray(tiles) == 0, 0, r0 + 1)
    counts = np.maximum(r1 - start, 0)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    owner = np.repeat(np.arange(len(counts)), counts)
    rows = start[owner] + np.arange(offsets[-1]) - offsets[owner]
    keep = rows != r0[owner]
    return rows[keep], owner[keep]


def dirty_rows(tiles: np.ndarray, r0: np.ndarray, r1: np.ndarray) -> np.ndarray:
    """Rows the fix-up repairs for the dirty ``tiles`` (first rows ``r0``, next tiles' first rows ``r1``).

    The rows strictly between r0 and r1 lie wholly inside the tile (the tile holds
    all their entries); for tile 0 the rows before r0 (all empty) are added.
    """
    return _dirty_rows(tiles, np.asarray(r0, dtype=np.int64), np.asarray(r1, dtype=np.int64))[0]


def rescatter(y: np.ndarray, indptr: np.ndarray, tiles: np.ndarray, r0: np.ndarray, r1: np.ndarray) -> None:
    """Fix-up of dirty tiles (``dirty="fixup"``), in place: move the compacted partial sums to their rows.

    In a dirty tile the k-th non-empty row after r0 got its sum at y[r0 + k]
    (k from 1); empty rows get 0. Every source is read before any row is written.
    """
    r0, r1 = np.asarray(r0, dtype=np.int64), np.asarray(r1, dtype=np.int64)
    rows, owner = _dirty_rows(tiles, r0, r1)
    if not len(rows):
        return
    filled = indptr[rows + 1] > indptr[rows]  # the rows before r0 of tile 0 are empty
    rank = np.cumsum(filled)
    before = np.concatenate(([0], rank))[np.searchsorted(owner, np.arange(len(r0)))]
    src = r0[owner] + rank - before[owner]  # the k-th non-empty row of its tile <- y[r0 + k]
    y[rows] = np.where(filled, y[np.where(filled, src, rows)], 0)


def add_synchronizer(y: np.ndarray, sync_row: np.ndarray, sync_val: np.ndarray) -> None:
    """y[sync_row[b]] += sync_val[b] for every bunch that started inside a row."""
    live = sync_row >= 0
    np.add.at(y, sync_row[live], sync_val[live])


class SpecSum(Family):
    name = "specsum"
    summary = "speculative segmented sum over even tiles of nonzeros; dirty tiles fixed afterwards or searched"
    source = "Liu & Vinter, 2015: speculative segmented sum for SpMV on heterogeneous processors"
    cu_file = "specsum.cu"
    space = Space(
        (
            Param("W", W_VALUES, 4, "nonzeros per thread (CSR5 and the paper: 4 for double, 8 for float)"),
            Param("T", T_VALUES, 32, "threads per bunch: a warp (32) or half a warp (16); the kernel takes 2..32"),
            Param(
                "dirty",
                DIRTY_MODES,
                "search",
                "tiles holding an empty row: their segments written to their true rows in stage 1 (search), "
                "or written compacted and repaired by a second stage (fixup, the paper's speculation)",
            ),
            Param(
                "fixup",
                FIXUPS,
                "gpu",
                "the paper's second stage on the GPU (a warp a dirty tile) or on the host (pinned copies)",
                when={"dirty": ("fixup",)},
            ),
            Param("B", B_VALUES, 4, "bunches per thread block (block = B*T threads)"),
            Param("S", S_VALUES, 8, "consecutive tiles per bunch (one row search a bunch, then a walk over its rows)"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        v = c_type(dtype)
        tiles = tuple(f"specsum_tiles<{v}, {w}, {t}, {wide}>" for w in W_VALUES for t in T_VALUES
                      for wide in ("false", "true"))
        return (*tiles, f"specsum_sync<{v}>", f"specsum_fixup<{v}>")

    @staticmethod
    def _geometry(prepared: Prepared) -> Geometry:
        p = prepared.params
        return Geometry.of(prepared.nnz, int(p["W"]) * int(p["T"]), int(p["S"]))

    @staticmethod
    def _mode(prepared: Prepared) -> str:
        """``"search"``, ``"gpu"`` (the paper's speculation, GPU fix-up) or ``"host"`` (host fix-up)."""
        p = prepared.params
        return "search" if p["dirty"] == "search" else str(p["fixup"])

    # -- GPU path -------------------------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        A, p, geo, ex = prepared.A, prepared.params, self._geometry(prepared), prepared.extra
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        v = c_type(prepared.dtype)
        attributes = device_attributes()
        ex["resident_warps"] = attributes["MultiProcessorCount"] * attributes["MaxThreadsPerMultiProcessor"] // 32
        # Bunches that fit in one wave wait on their dependent rounds of loads: the wide kernel loads several
        # row pointers a lane a round. With more, loads and registers (occupancy) count: the narrow one.
        wide = kernels[f"specsum_tiles<{v}, {p['W']}, {p['T']}, true>"]
        block = int(p["B"]) * int(p["T"])
        ex["wide"] = geo.n_bunches * int(p["T"]) <= resident_threads(wide.num_regs, block, attributes)
        ex["tiles_kernel"] = wide if ex["wide"] else kernels[f"specsum_tiles<{v}, {p['W']}, {p['T']}, false>"]
        ex["sync_kernel"] = kernels[f"specsum_sync<{v}>"]
        ex["fixup_kernel"] = kernels[f"specsum_fixup<{v}>"]
        # Stage 1 loads values and columns as 8- or 16-byte vectors: an array that does not start on 16
        # bytes (a view into a larger buffer) is copied once (and counted in extra_bytes).
        for key in ("data", "indices"):
            if getattr(A, key).data.ptr % 16:
                ex[key] = getattr(A, key).copy()
        ex["tile_row"] = cupy.empty(geo.n_tiles + 1, dtype=np.int32)
        ex["dirty"] = cupy.empty(geo.n_tiles, dtype=np.uint8)
        ex["sync_row"] = cupy.empty(geo.n_bunches, dtype=np.int32)
        ex["sync_val"] = cupy.empty(geo.n_bunches, dtype=prepared.dtype)
        ex["runs"] = 0
        # Whether stage 2 has anything to do (a bunch that starts inside a row; an empty row, for the
        # paper's mode): two reductions, once, so that a run launches nothing it does not need.
        indptr = A.indptr
        starts = (cupy.arange(geo.n_bunches, dtype=np.int64) * (geo.S * geo.tile)).astype(indptr.dtype)  # < nnz
        inside = indptr[cupy.searchsorted(indptr, starts, side="right") - 1] < starts
        has_sync = bool(inside.any())
        has_empty = bool((indptr[1:] == indptr[:-1]).any())
        ex["stage2"] = has_sync or (p["dirty"] == "fixup" and has_empty)
        if ex["stage2"] and p["dirty"] == "search" and geo.n_bunches <= FUSED_SYNC_PER_THREAD * block:
            ex["ticket"] = cupy.zeros(1, dtype=np.uint32)  # the blocks' count; wraps back to 0 every run
        if self._mode(prepared) == "host":
            import cupyx

            ex["host_indptr"] = indptr.get()
            ex["host_dirty"] = cupyx.empty_pinned(geo.n_tiles, dtype=np.uint8)
            ex["host_sync_row"] = cupyx.empty_pinned(geo.n_bunches, dtype=np.int32)
            ex["host_sync_val"] = cupyx.empty_pinned(geo.n_bunches, dtype=prepared.dtype)
            ex["host_y"] = cupyx.empty_pinned(prepared.shape[0], dtype=prepared.dtype)

    def _stage1(self, prepared: Prepared, x: Any, out: Any, *, fused: bool = True) -> None:
        """Stage 1, and with ``fused`` stage 2 as well where ``prepare`` gave it to stage 1's last block."""
        A, p, ex, geo = prepared.A, prepared.params, prepared.extra, self._geometry(prepared)
        W, T, B, S = (int(p[k]) for k in ("W", "T", "B", "S"))
        itemsize = np.dtype(prepared.dtype).itemsize
        prods = W * T + (W * T) // (128 // itemsize) + 1  # Layout<V, W, T>::prods in specsum.cu
        shared = B * (prods * itemsize + T * 4)
        ex["tiles_kernel"](
            (grid(geo.n_bunches, B),),
            (B * T,),
            (
                np.int32(prepared.shape[0]),
                np.int32(prepared.nnz),
                np.int32(geo.n_tiles),
                np.int32(geo.n_bunches),
                np.int32(S),
                np.int32(p["dirty"] == "search"),
                A.indptr,
                ex.get("indices", A.indices),
                ex.get("data", A.data),
                x,
                out,
                ex["tile_row"],
                ex["dirty"],
                ex["sync_row"],
                ex["sync_val"],
                ex["ticket"] if fused and "ticket" in ex else None,
            ),
            shared_mem=shared,
        )
        ex["runs"] += 1

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        self._stage1(prepared, x, out)
        if not prepared.extra["stage2"] or "ticket" in prepared.extra:
            return
        mode = self._mode(prepared)
        if mode == "search":
            self._sync_gpu(prepared, out)
        elif mode == "gpu":
            self._fixup_gpu(prepared, out)
        else:
            self._fixup_host(prepared, out)

    def _sync_gpu(self, prepared: Prepared, out: Any) -> None:
        ex, geo = prepared.extra, self._geometry(prepared)
        blocks = min(grid(geo.n_bunches, STAGE2_THREADS), grid(ex["resident_warps"] * 32, STAGE2_THREADS))
        ex["sync_kernel"]((blocks,), (STAGE2_THREADS,), (np.int32(geo.n_bunches), out, ex["sync_row"], ex["sync_val"]))

    def _fixup_gpu(self, prepared: Prepared, out: Any) -> None:
        A, ex, geo = prepared.A, prepared.extra, self._geometry(prepared)
        # A warp a tile (it skips clean ones at once; its threads also take the synchronizer, n_bunches <=
        # n_tiles), never more warps than the GPU holds at a time: the kernel strides over the rest.
        blocks = grid(min(geo.n_tiles, ex["resident_warps"]) * 32, STAGE2_THREADS)
        ex["fixup_kernel"](
            (blocks,),
            (STAGE2_THREADS,),
            (
                np.int32(prepared.shape[0]),
                np.int32(geo.n_tiles),
                np.int32(geo.n_bunches),
                A.indptr,
                out,
                ex["tile_row"],
                ex["dirty"],
                ex["sync_row"],
                ex["sync_val"],
            ),
        )

    def _fixup_host(self, prepared: Prepared, out: Any) -> None:
        cupy = require_cupy()
        ex, geo = prepared.extra, self._geometry(prepared)
        stream = cupy.cuda.get_current_stream()
        ex["dirty"].get(stream=stream, out=ex["host_dirty"], blocking=False)
        ex["sync_row"].get(stream=stream, out=ex["host_sync_row"], blocking=False)
        ex["sync_val"].get(stream=stream, out=ex["host_sync_val"], blocking=True)
        indptr, sync_row = ex["host_indptr"], ex["host_sync_row"]
        tiles = np.flatnonzero(ex["host_dirty"])
        r0 = tile_rows(indptr, tiles, geo.tile)
        r1 = tile_rows(indptr, tiles + 1, geo.tile)
        touched = np.concatenate((dirty_rows(tiles, r0, r1), sync_row[sync_row >= 0]))
        if not len(touched):
            return
        lo, hi = int(touched.min()), int(touched.max()) + 1  # every source and target lies in [lo, hi)
        y = ex["host_y"]
        out[lo:hi].get(stream=stream, out=y[lo:hi], blocking=True)
        rescatter(y, indptr, tiles, r0, r1)
        add_synchronizer(y, sync_row, ex["host_sync_val"])
        out[lo:hi].set(y[lo:hi], stream=stream)

    def run_speculative(self, prepared: Prepared, x: Any) -> Any:
        """Stage 1 alone on the GPU, into a NaN-filled y (for tests: compare with ``run_speculative_reference``)."""
        cupy = require_cupy()
        x = _check_vector(prepared, x, cupy)
        out = cupy.full(prepared.shape[0], cupy.nan, dtype=prepared.dtype)
        if prepared.nnz and prepared.shape[0]:
            self._stage1(prepared, x, out, fused=False)
        return out

    # -- CPU reference --------------------------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        geo = self._geometry(prepared)
        prepared.extra.update(decompose(prepared.A.indptr, geo.tile, geo.S))
        prepared.extra["sync_val"] = np.zeros(geo.n_bunches, dtype=prepared.dtype)
        prepared.extra["runs"] = 0

    def run_speculative_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        """Stage 1 alone on the CPU (float64; NaN where stage 1 writes nothing); updates ``sync_val``."""
        x = _check_vector(prepared, x, np)
        if not (prepared.nnz and prepared.shape[0]):
            return np.full(prepared.shape[0], np.nan)
        return self._speculate_reference(prepared, x)[0]

    def _speculate_reference(self, prepared: Prepared, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        geo, ex = self._geometry(prepared), prepared.extra
        search = prepared.params["dirty"] == "search"
        y, sync_val = speculate(prepared.A.indptr, products(prepared.A, x), geo.tile, geo.S, ex, search=search)
        ex["sync_val"][...] = sync_val
        ex["runs"] += 1
        return y, sync_val

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        A, ex = prepared.A, prepared.extra
        y, sync_val = self._speculate_reference(prepared, x)
        if prepared.params["dirty"] == "fixup":  # specsum_fixup and the host path: re-scatter
            tiles = np.flatnonzero(ex["dirty"])
            rescatter(y, np.asarray(A.indptr, dtype=np.int64), tiles, ex["tile_row"][tiles], ex["tile_row"][tiles + 1])
        add_synchronizer(y, ex["sync_row"], sync_val)
        return y

    # -- both paths -----------------------------------------------------------------------------
    def decomposition(self, prepared: Prepared) -> dict[str, np.ndarray]:
        """``tile_row``, ``dirty``, ``sync_row``, ``sync_val`` as NumPy arrays, from either path, in either mode.

        The GPU computes them during a run, so this needs one run (``run`` or
        ``run_reference``) first; ``sync_val`` is that of the last run's x.
        """
        if not (prepared.nnz and prepared.shape[0]):
            indptr = prepared.A.indptr
            indptr = np.asarray(indptr if isinstance(indptr, np.ndarray) else indptr.get())
            return {**decompose(indptr, 1, 1), "sync_val": np.zeros(0, dtype=prepared.dtype)}
        ex = prepared.extra
        if not ex.get("runs"):
            raise RuntimeError("specsum computes its decomposition during a run: run the prepared matrix once first")
        return {k: np.asarray(ex[k] if isinstance(ex[k], np.ndarray) else ex[k].get()) for k in DECOMPOSITION_KEYS}


__all__ = [
    "SpecSum", "add_synchronizer", "decompose", "dirty_rows", "rescatter", "speculate", "tile_rows",
]
