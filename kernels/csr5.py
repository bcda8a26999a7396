"""``csr5``: CSR5-style tiles (Liu & Vinter, ICS 2015: CSR5, a storage format for cross-platform SpMV).

The nonzeros, in CSR order, are cut into tiles of ``OMEGA x sigma`` entries (``OMEGA`` = 32, the lanes of a
warp): lane l of tile t holds the ``sigma`` consecutive entries ``t*tile + l*sigma + k``. Prepared once, on
the GPU (``csr5_rows``, ``csr5_tiles`` and ``csr5_transpose``: no sort, one read-back):

- the values and columns of the full tiles copied *transposed*, lane l's k-th entry at
  ``t*tile + k*OMEGA + l``, so that each of a lane's ``sigma`` loads is coalesced over the warp;
- ``flags`` (uint32, one word a lane and tile): bit k set where the lane's k-th entry starts a row;
- ``tile_ptr`` (int32, n_tiles + 1): the row of each tile's first entry (the last row whose start is at or
  before it: a row pointer search), and of the first entry after the full tiles (m when there is none);
- ``dirty`` (uint8, a tile): set where the rows strictly between the tile's first row and the next tile's
  (from row 0 for tile 0) hold an empty row.

A run (``csr5.cu``) is a warp a tile: each lane sums its entries segment by segment (a row start closes a
segment), the row of a segment begun in the lane is ``tile_ptr`` plus the row starts before it in the tile
(an exclusive warp scan of ``__popc`` of the flags: no search of the row pointer) where the tile is clean, a
binary search of the row pointer between the tile's first and last rows where it is dirty; a segmented
suffix sum of the lanes' heads (their entries before their first row start) hands each lane's last segment
what the lanes after it hold of that row, and the tile's own head (its share of a row begun in an earlier
tile) goes to ``carry`` (tile t's to ``carry[t-1]``); a dirty tile writes 0 to the empty rows it owns. The
entries after the last full tile (fewer than a tile) are summed a thread a row by extra blocks of the same
launch (the tail).
``merge_path_fixup`` (``merge_path.cu``, reused) then adds each carry to its row, ``y[tile_ptr[t+1]] +=
carry[t]``, launched only where some tile (or the tail) starts inside a row. ``carry`` belongs to the prepared
matrix: two products of one prepared matrix must not run at once on different streams.

Simplified against CSR5's own code: the descriptor keeps only the bit flags (the lanes' ``y_offset`` and
``seg_offset`` are computed in the kernel with ``__popc`` and warp shuffles), the dirty flag is an array of
its own instead of ``tile_ptr``'s top bit, a dirty tile finds its rows by a search of the row pointer
instead of an ``empty_offset`` table, a tile whose first entry starts a row writes that row itself (CSR5
always calibrates the first segment), the carries are added by a fix-up kernel (CSR5's calibration),
and the values and columns are copied (CSR5 transposes them in place). Beyond CSR5: narrow columns
(``indices="narrow"``, :mod:`kernels._narrow`, a tile a segment).

The CPU reference reproduces the decomposition (the same tiles, transposed copies, flags, rows, carries,
tail and fix-up):

>>> import numpy as np, scipy.sparse as sp
>>> A = sp.csr_matrix(np.array([[1.0, 2, 3, 4, 5], [0, 0, 0, 0, 0], [6, 7, 0, 0, 0]]))
>>> dec = decompose(A.indptr, sigma=1, omega=2)  # tiles of 2 entries: (0, 1), (2, 3), (4, 5); 6 the tail
>>> dec["tile_ptr"].tolist(), dec["dirty"].tolist(), dec["flags"].tolist()  # row 1 is empty, between 0 and 2
([0, 0, 0, 2], [0, 0, 1], [1, 0, 0, 0, 0, 1])
>>> y, carry = spmv_reference(A.indptr, products(A, np.ones(5)), dec, sigma=1, omega=2)
>>> carry.tolist()  # what tiles 1 and 2 hold of row 0 (3 + 4, then 5), the tail of row 2 (7)
[7.0, 5.0, 7.0]
>>> y.tolist()  # tile 0 writes row 0 (1 + 2), tile 2 row 1 (empty) and row 2 (6); the fix-up adds the carries
[15.0, 0.0, 13.0]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common.errors import MatrixFormatError
from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._narrow import attach, indices_param, launch_columns, reference_columns
from kernels._reference import products, segment_sums
from kernels._space import Param, Space, Value

OMEGA = 32
SIGMAS = (4, 6, 8, 12, 16, 24, 32)
BLOCK_SIZES = (64, 128, 256, 512)
FIXUP_THREADS = 256
INDEX_MAX = int(np.iinfo(np.int32).max)
"""Rows, columns and nonzeros are 32-bit in the kernels: none may exceed this."""
STRUCTURE = ("values", "columns", "flags", "tile_ptr", "dirty", "carry", "base", "offsets")
"""The prepared arrays beyond the CSR's (:meth:`Csr5.memory_ratio`)."""


def check_size(shape: tuple[int, int], nnz: int) -> None:
    """MatrixFormatError where rows, columns or nonzeros do not fit the kernels' 32-bit indices."""
    if max(*shape, nnz) > INDEX_MAX:
        raise MatrixFormatError(
            f"csr5: a matrix of shape {shape} with {nnz} stored entries does not fit 32-bit indices (at most "
            f"{INDEX_MAX} rows, columns and entries); use another kernel"
        )


FLOAT64_SIGMA = 8
"""The most sigma a float64 config of the family's own rule takes (:meth:`Csr5.unranked_config`; a lane keeps its
sigma values in registers, two each in float64). On the H200's race survey
(``bench/results/corpus/..._survey-race.jsonl.gz``, every sigma measured), setSigma's sigma at most 8 ran 0.975 of
the best sigma's speed in float64 (geomean) on the 52 matrices of 8 M nonzeros and more, 0.898 on the 120 of 1 M
and more, against setSigma's own 0.929 and 0.842; in float32 no cap did better than none (at most 16: 0.941 against
0.929 and 0.821 against 0.855). On the H200's races of the unseen benchmark (stops 68-76), where setSigma's sigma
was over 8 and 8 raced beside it, 8 was the faster on 81 of 118 matrices in float64 (setSigma's took 1.033x its
time, geomean), on 38 of 118 in float32 (0.985x)."""

RACE_SIGMAS = (8, 16)
"""The sigma a race enters beside setSigma's (:meth:`Csr5.unranked_configs`): the first, or the second where
setSigma's is the first. On the H200's race survey (``bench/results/corpus/..._survey-race.jsonl.gz``, every sigma
measured), on the 104 cells (matrix x dtype) of 8 M nonzeros and more, setSigma's alone ran 0.929 of the best
sigma's speed in both dtypes (geomean), the faster of it and 8 0.986 (float64) and 0.977 (float32): of the seven
sigmas, 8 the closest second (12: 0.982 and 0.957; 16: 0.958 and 0.967)."""


def set_sigma(nnz_per_row: float) -> int:
    """CSR5's own choice of sigma from the mean entries a row (``setSigma`` of its public code: 4 up to 4
    a row, the row length up to 32, 32 up to 256, 6 beyond), rounded down to the values of the space."""
    npr = int(nnz_per_row)
    wanted = 4 if npr <= 4 else npr if npr <= 32 else 32 if npr <= 256 else 6
    return max(s for s in SIGMAS if s <= wanted)


# -- the decomposition's reference (NumPy; on the GPU csr5.cu's preparation kernels write the same) ----
def decompose(indptr: np.ndarray, *, sigma: int, omega: int = OMEGA) -> dict[str, np.ndarray]:
    """``tile_ptr`` (int32, n_tiles + 1), ``dirty`` (uint8, n_tiles) and ``flags`` (uint32, n_tiles * omega) of
    the full tiles of ``omega x sigma`` entries, from a row pointer: the reference (array operations, no loop
    over entries); the GPU writes the same with ``csr5_rows`` and ``csr5_tiles``. ``omega`` other than 32
    only in the reference's tests."""
    tile = omega * sigma
    n_tiles = int(indptr[-1]) // tile
    bounds = np.arange(n_tiles + 1, dtype=indptr.dtype) * tile
    tile_ptr = (np.searchsorted(indptr, bounds, side="right") - 1).astype(np.int32)
    empty = indptr[1:] == indptr[:-1]
    empties = np.concatenate((np.zeros(1, dtype=np.int64), np.cumsum(empty, dtype=np.int64)))  # before row r
    lo = tile_ptr[:-1] + 1
    lo[:1] = 0
    dirty = (empties[tile_ptr[1:]] > empties[np.minimum(lo, tile_ptr[1:])]).astype(np.uint8)
    starts = indptr[:-1][~empty]
    starts = starts[starts < n_tiles * tile].astype(np.int64)  # sorted: every row start in a full tile
    flags = np.zeros(n_tiles * omega, dtype=np.uint32)
    np.bitwise_or.at(flags, starts // sigma, (np.ones_like(starts) << (starts % sigma)).astype(np.uint32))
    return {"tile_ptr": tile_ptr, "dirty": dirty, "flags": flags}


def transposed(a: np.ndarray, *, sigma: int, n_tiles: int, omega: int = OMEGA) -> np.ndarray:
    """The first ``n_tiles`` tiles of ``a`` (values or columns), lane l's k-th entry at tile + k*omega + l."""
    return a[: n_tiles * omega * sigma].reshape(n_tiles, omega, sigma).transpose(0, 2, 1).ravel()


def tile_bounds(n_tiles: int, tile: int, xp: Any) -> Any:
    """The tiles as segments of the transposed copies (int32, n_tiles + 1): where narrow columns are cut."""
    return xp.arange(n_tiles + 1, dtype=np.int32) * tile


def needs_fixup(indptr: np.ndarray, tile_ptr: np.ndarray, tile: int) -> bool:
    """Whether some tile, or the tail, begins inside a row (has a carry to add): the reference (the GPU's
    ``csr5_tiles`` finds it as it writes ``tile_ptr``)."""
    n_tiles = tile_ptr.size - 1
    return bool((indptr[tile_ptr[1:]] < np.arange(1, n_tiles + 1, dtype=np.int64) * tile).any())


def spmv_reference(indptr: np.ndarray, prods: np.ndarray, dec: Mapping[str, np.ndarray], *, sigma: int,
                   omega: int = OMEGA) -> tuple[np.ndarray, np.ndarray]:
    """``(y, carry)`` as csr5_spmv and the fix-up compute them, from the products a_ij * x_j in CSR order
    (float64; the tiles' products as the transposed copies give them back): ``carry[t]`` is what tile t + 1
    (the tail for the last) holds of row ``tile_ptr[t+1]`` before its first row start. Rows no step writes
    are NaN."""
    indptr = np.asarray(indptr, dtype=np.int64)
    m, tile = indptr.size - 1, omega * sigma
    n_tiles = dec["tile_ptr"].size - 1
    y = np.full(m, np.nan)
    heads = np.zeros(n_tiles + 1)  # what each tile, and the tail, holds of a row begun before it
    if n_tiles:
        heads[:n_tiles] = _tiles(y, indptr, prods[: n_tiles * tile], dec, sigma=sigma, omega=omega)
    heads[n_tiles] = _tail(y, indptr, prods, n_tiles * tile, 0 if n_tiles == 0 else int(dec["tile_ptr"][-1]))
    carry = heads[1:]  # tile 0 begins with row 0's first entry: its head is 0
    rows = dec["tile_ptr"][1:].astype(np.int64)
    inside = rows < m
    np.add.at(y, rows[inside], carry[inside])  # merge_path_fixup
    return y, carry


def _tiles(y: np.ndarray, indptr: np.ndarray, prods: np.ndarray, dec: Mapping[str, np.ndarray], *, sigma: int,
           omega: int) -> np.ndarray:
    """Steps 2-5 of csr5_spmv for every full tile (lanes vectorized, entries walked in order): writes into y,
    returns the tiles' heads (their carries)."""
    tile_ptr = dec["tile_ptr"].astype(np.int64)
    n_tiles = tile_ptr.size - 1
    lanes = prods.reshape(n_tiles, omega, sigma)
    bits = (dec["flags"].reshape(n_tiles, omega, 1) >> np.arange(sigma, dtype=np.uint32)) & 1 == 1
    dirty = dec["dirty"].astype(bool)[:, None]
    popc = bits.sum(axis=2)
    next_row = tile_ptr[:-1, None] + 1 - bits[:, :1, 0].astype(np.int64) + np.cumsum(popc, axis=1) - popc
    first = np.arange(n_tiles)[:, None] * omega * sigma + np.arange(omega)[None, :] * sigma
    acc, head = np.zeros((n_tiles, omega)), np.zeros((n_tiles, omega))
    started = np.zeros((n_tiles, omega), dtype=bool)
    row = np.zeros((n_tiles, omega), dtype=np.int64)
    for k in range(sigma):
        b = bits[:, :, k]
        closes = b & started
        y[row[closes]] = acc[closes]
        head = np.where(b & ~started, acc, head)
        searched = np.searchsorted(indptr, first + k, side="right") - 1  # the row of entry first + k
        row = np.where(b, np.where(dirty, searched, next_row), row)
        next_row += b
        started |= b
        acc = np.where(b, 0.0, acc) + lanes[:, :, k]
    handed = _suffix_sum_to_stop(np.where(started, head, acc), started)
    after = np.concatenate((handed[:, 1:], np.zeros((n_tiles, 1))), axis=1)
    y[row[started]] = (acc + after)[started]
    _zero_empty_rows(y, indptr, tile_ptr, dec["dirty"])
    return handed[:, 0]


def _suffix_sum_to_stop(v: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """Each lane's v plus those of the lanes after it up to the first whose ``stop`` is set (included)."""
    out = v.copy()
    for lane in range(v.shape[1] - 2, -1, -1):
        out[:, lane] += np.where(stop[:, lane], 0.0, out[:, lane + 1])
    return out


def _zero_empty_rows(y: np.ndarray, indptr: np.ndarray, tile_ptr: np.ndarray, dirty: np.ndarray) -> None:
    """Step 5: a dirty tile t writes 0 to the empty rows strictly between tile_ptr[t] and tile_ptr[t+1]
    (from row 0 for tile 0)."""
    empty = np.flatnonzero(indptr[1:] == indptr[:-1])
    owner = np.searchsorted(tile_ptr[1:], empty, side="right")  # the tile t with e < tile_ptr[t+1]
    owned = owner < dirty.size
    owned[owned] = dirty[owner[owned]] != 0
    y[empty[owned]] = 0.0


def _tail(y: np.ndarray, indptr: np.ndarray, prods: np.ndarray, start: int, tail_row: int) -> float:
    """The tail: rows tail_row .. m-1 summed over their entries from ``start`` on; a row begun there written,
    the share of the row begun before it returned (its carry)."""
    m = indptr.size - 1
    rows = np.arange(tail_row, m)
    lo = indptr[rows]
    j = np.arange(start, int(indptr[-1]))
    sums = segment_sums(np.searchsorted(indptr, j, side="right") - 1 - tail_row, prods[start:], rows.size)
    begun = lo >= start
    y[rows[begun]] = sums[begun]
    return float(sums[~begun].sum())


def _capped(config: dict[str, Value], itemsize: int) -> dict[str, Value]:
    """``config`` with its sigma at most :data:`FLOAT64_SIGMA` where the values are of 8 bytes or more."""
    return config if itemsize < 8 else {**config, "sigma": min(int(config["sigma"]), FLOAT64_SIGMA)}


# -- the family -----------------------------------------------------------------------------------
class Csr5(Family):
    name = "csr5"
    summary = "CSR5 tiles: omega x sigma entries a warp, stored transposed, bit-flag descriptors, carries fixed up"
    source = "Liu & Vinter, ICS 2015: CSR5 (public code weifengliu-ssslab/Benchmark_SpMV_using_CSR5)"
    cu_file = "csr5.cu"
    prepare_spmvs = 8.0  # H100: 0.6-1.4 ms on the unseen rgg and skyline (24-31 M nonzeros), products of 70-140 us
    space = Space(
        (
            Param("sigma", SIGMAS, 16, "entries a lane: a tile is 32 x sigma entries (CSR5's setSigma: the "
                  "mean row length between 4 and 32)"),
            Param("block_size", BLOCK_SIZES, 128, "threads per block (block_size / 32 tiles a block)"),
            indices_param("tile"),
        )
    )

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        v = c_type(dtype)
        return (*(_spmv_name(v, s, n) for s in SIGMAS for n in (True, False)), "csr5_rows", "csr5_tiles",
                f"csr5_transpose<{v}>")

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """The family's own config for a matrix (what a recommendation's second opinion answers with, and the
        race's first csr5): sigma as CSR5's own code picks it from the mean row length (:func:`set_sigma`; the
        default without features), at most :data:`FLOAT64_SIGMA` in float64."""
        return _capped(self._set_sigma_config(features), itemsize)

    def unranked_configs(self, features: Mapping[str, float] | None, itemsize: int) -> list[dict[str, Value]]:
        """The family's own config (:meth:`unranked_config`) and, where its sigma was capped, the same with
        setSigma's, else with the second sigma of :data:`RACE_SIGMAS` (its first where the config's is not that):
        setSigma is a rule of thumb, and one more preparation (0.4-1 ms on the unseen matrices) takes back most of
        what it misses."""
        own = self._set_sigma_config(features)
        config = _capped(own, itemsize)
        second = own["sigma"] if own != config else RACE_SIGMAS[int(config["sigma"] == RACE_SIGMAS[0])]
        return [config, {**config, "sigma": second}]

    def judged_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """setSigma's config, uncapped (:meth:`_set_sigma_config`): in float64 the second opinion answers with a
        sigma of at most :data:`FLOAT64_SIGMA` (:meth:`unranked_config`), faster more often than not, and judges by
        setSigma's, a margin. Leaving each structure family of the H200's corpus out (replayed on its times,
        ``bench/results/2026-11-29_second-opinion-sigma-77.txt``), on its 92 matrices of 1 M nonzeros and more in
        float64: taught by the capped config's times, the second opinion answered on 54 against 36 and the
        recommendation went from 0.845 to 0.848 of the tuned best, its worst 5 % from 0.586 to 0.505 (lp: 0.810
        to 0.702); taught by setSigma's, 0.857 and 0.621."""
        return self._set_sigma_config(features)

    def _set_sigma_config(self, features: Mapping[str, float] | None) -> dict[str, Value]:
        """The config with setSigma's sigma (:func:`set_sigma`), the default without features."""
        return self.space.validate({} if features is None else {"sigma": set_sigma(features["npr_mean"])},
                                   family=self.name)

    def unranked_seeds(self, features: Mapping[str, float] | None, itemsize: int) -> list[dict[str, Value]]:
        """The race's configs and the sigmas next to its first in the space. On the 91 matrices of 1 M
        nonzeros and more of the H200's race survey (every sigma measured), setSigma picked the best sigma on
        21-22 % and one of the three on 42-45 %; the best of the three is 0.92-0.96 of the best sigma's speed,
        setSigma's alone 0.86-0.87. (A 30-trial search on the large suite's lp, seeded with setSigma's 24, never
        sampled the 16 that the runs before had found at trial 17-18.)"""
        raced = self.unranked_configs(features, itemsize)
        at = SIGMAS.index(raced[0]["sigma"])
        beside = [{**raced[0], "sigma": SIGMAS[k]} for k in (at - 1, at + 1) if 0 <= k < len(SIGMAS)]
        return [*raced, *(c for c in beside if c not in raced)]

    def memory_ratio(self, prepared: Prepared) -> float:
        """Bytes of the CSR5 structure (transposed copies, descriptors, carries) over the CSR arrays'."""
        return prepared.ratio_to_csr(STRUCTURE)

    # -- both paths -----------------------------------------------------------------------------
    def _finish(self, prepared: Prepared, xp: Any, *, tail_row: int, fixup: bool) -> None:
        """What both paths add to the tiles, descriptors and transposed copies: the carries, the tail's first
        row (row 0 without full tiles), whether the fix-up runs, narrow columns (``xp``: numpy or cupy)."""
        ex, n_tiles = prepared.extra, prepared.extra["tile_ptr"].size - 1
        ex["carry"] = xp.zeros(n_tiles, dtype=prepared.dtype)
        ex["tail_row"] = tail_row if n_tiles else 0
        ex["fixup"] = fixup
        tile = OMEGA * int(prepared.params["sigma"])
        ex["narrow"] = attach(ex, prepared.params, tile_bounds(n_tiles, tile, xp), ex["columns"])
        ex["runs"] = 0

    def decomposition(self, prepared: Prepared) -> dict[str, np.ndarray]:
        """``tile_ptr``, ``dirty``, ``flags``, the transposed ``values`` and ``columns``, and ``carry`` (that of the
        last run's x) as NumPy arrays, from either path."""
        ex = prepared.extra
        if not ex.get("runs"):
            raise RuntimeError(
                "csr5's carries come from a run: run the prepared matrix once first (a matrix without rows or "
                "stored entries has no decomposition)"
            )
        keys = ("tile_ptr", "dirty", "flags", "values", "columns", "carry")
        return {k: ex[k] if isinstance(ex[k], np.ndarray) else ex[k].get() for k in keys}

    # -- GPU path -------------------------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        """The descriptors and transposed copies by csr5.cu's three preparation kernels, one read-back."""
        cupy = require_cupy()
        check_size(prepared.shape, prepared.nnz)
        A, ex, p = prepared.A, prepared.extra, prepared.params
        v, sigma, m = c_type(prepared.dtype), int(p["sigma"]), prepared.shape[0]
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        n_tiles = prepared.nnz // (OMEGA * sigma)
        n = n_tiles * OMEGA * sigma
        ex.update(flags=cupy.zeros(n_tiles * OMEGA, dtype=np.uint32), dirty=cupy.zeros(n_tiles, dtype=np.uint8),
                  tile_ptr=cupy.empty(n_tiles + 1, dtype=np.int32), values=cupy.empty(n, dtype=prepared.dtype),
                  columns=cupy.empty(n, dtype=np.int32))
        found = cupy.zeros(2, dtype=np.int32)  # fixup, then the tail's first row
        kernels["csr5_rows"]((grid(m, 256),), (256,), (np.int32(m), np.int32(n_tiles), np.int32(sigma), A.indptr,
                                                       ex["flags"], ex["dirty"]))
        kernels["csr5_tiles"]((grid(n_tiles + 1, 256),), (256,), (np.int32(m), np.int32(n_tiles), np.int32(sigma),
                                                                  A.indptr, ex["tile_ptr"], found))
        if n:
            kernels[f"csr5_transpose<{v}>"]((grid(n, 256),), (256,), (np.int64(n), np.int32(sigma), A.indices,
                                                                      A.data, ex["columns"], ex["values"]))
        found[1:] = ex["tile_ptr"][-1:]
        fixup, tail_row = (int(f) for f in found.get())
        self._finish(prepared, cupy, tail_row=tail_row, fixup=bool(fixup))
        ex["spmv_kernel"] = kernels[_spmv_name(v, sigma, ex["narrow"])]
        ex["fixup_kernel"] = get_kernels("merge_path.cu", (f"merge_path_fixup<{v}>",))[f"merge_path_fixup<{v}>"]

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        A, ex, p = prepared.A, prepared.extra, prepared.params
        m, block = prepared.shape[0], int(p["block_size"])
        n_tiles = ex["tile_ptr"].size - 1
        tile_blocks = grid(n_tiles * OMEGA, block) if n_tiles else 0
        tail_blocks = -(-(m - ex["tail_row"]) // block)
        ex["spmv_kernel"](
            (tile_blocks + tail_blocks,),
            (block,),
            (np.int32(n_tiles), np.int32(tile_blocks), np.int32(ex["tail_row"]), np.int32(m), A.indptr, A.indices,
             A.data, ex["columns"], *launch_columns(ex, ex["columns"]), ex["values"], ex["flags"], ex["tile_ptr"],
             ex["dirty"], x, out, ex["carry"]),
        )
        if ex["fixup"]:
            ex["fixup_kernel"](
                (grid(n_tiles, FIXUP_THREADS),),
                (FIXUP_THREADS,),
                (np.int32(m), np.int32(n_tiles), ex["tile_ptr"], ex["carry"], out),
            )
        ex["runs"] += 1

    # -- CPU reference --------------------------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        check_size(prepared.shape, prepared.nnz)
        A, ex, sigma = prepared.A, prepared.extra, int(prepared.params["sigma"])
        ex.update(decompose(A.indptr, sigma=sigma))
        n_tiles = ex["tile_ptr"].size - 1
        ex["values"] = transposed(A.data, sigma=sigma, n_tiles=n_tiles)
        ex["columns"] = transposed(A.indices, sigma=sigma, n_tiles=n_tiles)
        self._finish(prepared, np, tail_row=int(ex["tile_ptr"][-1]),
                     fixup=needs_fixup(A.indptr, ex["tile_ptr"], OMEGA * sigma))

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        A, ex = prepared.A, prepared.extra
        sigma, n_tiles = int(prepared.params["sigma"]), ex["tile_ptr"].size - 1
        prods = products(A, x)  # the tail's, in CSR order
        tile = OMEGA * sigma
        columns = reference_columns(ex, tile_bounds(n_tiles, tile, np), ex["columns"])
        tiles = ex["values"].astype(np.float64) * x.astype(np.float64)[ex["columns"] if columns is None else columns]
        prods[: n_tiles * tile] = tiles.reshape(n_tiles, sigma, OMEGA).transpose(0, 2, 1).ravel()
        y, carry = spmv_reference(A.indptr, prods, ex, sigma=sigma)
        ex["carry"][...] = carry
        ex["runs"] += 1
        return y


def _spmv_name(ctype: str, sigma: int, narrow: bool) -> str:
    """The product's kernel for a value type, sigma and whether it reads narrow columns."""
    return f"csr5_spmv<{ctype}, {sigma}, {'true' if narrow else 'false'}>"


__all__ = ["Csr5", "check_size", "decompose", "needs_fixup", "set_sigma", "spmv_reference", "transposed"]
