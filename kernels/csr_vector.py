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

Mostly empty rows (at least :data:`EMPTY_SHARE` of them, beyond the baseline): the product runs over the nonempty
rows alone, y zeroed first, each group's sum written to its row (csr_vector.cu's ROWS): a matrix padded to a larger
size otherwise spends a group of threads on each empty row, reading its two row pointers and writing a zero. The
nonempty rows' entries are A's own arrays, in the same order (an empty row holds none), so the matrix they make
needs only its row pointer (A's at those rows, then nnz): no copy of the entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernels._cuda import c_type, get_kernels, grid, require_cupy
from kernels._family import Family, Prepared
from kernels._narrow import attach, indices_param, launch_columns, narrow_rows, reference_columns
from kernels._reference import products, row_ids, segment_sums
from kernels._space import Param, Space, Value

THREADS_PER_ROW = (2, 4, 8, 16, 32)
BATCH_BYTES = 32
"""What a lane loads of its entries' values before it gathers their x (csr_vector.cu: 4 doubles, 8 floats)."""
EMPTY_SHARE = 0.5
"""csr_vector runs over the nonempty rows alone (:func:`listed_rows`) where at least this share of the rows is
empty."""
LISTED_SPREAD = 8.0
"""A race enters csr_vector fitted to the nonempty rows (:meth:`CsrVector.fitted_configs`) only where the longest is
at most this many times their mean: one group size fits them all."""
RESIDENT_LANES = 1 << 18
"""About the threads an H100 or H200 keeps resident (132 SMs x 2,048): a product's entries spread over them."""
LONGEST_SHARE = 4.0
"""A kernel of a few lanes a row races without a selector only where its longest row gives a lane at most this
many times the entries each resident lane takes on average (eight at least): :func:`lanes_balanced`."""

_EMPTY_ROWS = "_spmv_empty_rows"
"""The attribute :func:`note_empty_rows` keeps its count in."""


def threads_covering(npr_mean: float, itemsize: int) -> int:
    """The threads a row whose first batches of loads (:data:`BATCH_BYTES` a lane) cover a row of ``npr_mean``
    entries of ``itemsize`` bytes: the power of two of :data:`THREADS_PER_ROW` nearest (by ratio) the lanes that
    takes (what rcm and rowsort race on their reordered matrices, :meth:`kernels.rcm.Rcm.unranked_config`)."""
    lanes = npr_mean * itemsize / BATCH_BYTES
    return next((t for t in THREADS_PER_ROW if t * t >= lanes * lanes / 2), THREADS_PER_ROW[-1])


def lanes_balanced(features: Mapping[str, float], threads_per_row: int) -> bool:
    """Whether a kernel of ``threads_per_row`` lanes a row (csr_scalar: one) keeps the longest row of a matrix of
    these features within :data:`LONGEST_SHARE` of a lane's average share of the entries (:data:`RESIDENT_LANES`):
    where not, the lanes of that row run on long after the others. A race without a selector enters csr_scalar
    and csr_vector only where they are balanced: on the unseen fewlongrows (64 rows of 470 K entries, stop 76, the
    H200 without a selector) csr_scalar's product took 63 ms and csr_vector's (32 threads a row) 1.9 against
    cuSPARSE's 0.37, and their checks and screening products made most of the race's 720 SpMVs. Of the 49 unseen
    matrices either family won a race on with the shipped selector ranking, csr_vector's unranked config is balanced
    on all, csr_scalar's on all csr_scalar won (out only where rows run to hundreds of entries or more)."""
    share = max(features["nnz"] / RESIDENT_LANES, 8.0)
    return features["npr_max"] / threads_per_row <= LONGEST_SHARE * share


def note_empty_rows(A: Any, count: int) -> None:
    """Keep on the CSR matrix object ``A`` how many of its rows are empty, as a pass over it counted them
    (``plan()``'s structure pass, :mod:`tuner.matrix.structure_gpu`), so that a preparation need not count and wait
    for the count. A stale count costs speed, never a wrong product: the rows listed are found from the row
    pointer itself."""
    setattr(A, _EMPTY_ROWS, int(count))


def empty_rows(A: Any, xp: Any) -> int:
    """The empty rows of ``A`` (a CSR matrix of ``xp``: NumPy or CuPy): what :func:`note_empty_rows` kept, else
    counted (on the GPU, a reduction and a read-back)."""
    noted = getattr(A, _EMPTY_ROWS, None)
    return noted if noted is not None else int(A.shape[0] - xp.count_nonzero(xp.diff(A.indptr)))


def listed_rows(xp: Any, indptr: Any, empty: int) -> tuple[Any, Any] | None:
    """Where at least :data:`EMPTY_SHARE` of the rows of ``indptr`` are ``empty``: the nonempty rows (int32) and
    the row pointer of the matrix they make of the same entries (``indptr`` at those rows, then nnz); else
    None."""
    m = indptr.size - 1
    if m == 0 or empty < EMPTY_SHARE * m:
        return None
    rows = xp.flatnonzero(xp.diff(indptr)).astype(np.int32)
    return rows, xp.concatenate([indptr[rows], indptr[-1:]])


class CsrVector(Family):
    """``lists_rows``: list the nonempty rows where most are empty (the registry's); rcm, rowsort and firsttouch
    run it on their renumbered matrices without (their products write each row's sum through rows of their own,
    :meth:`launch`)."""

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

    def __init__(self, *, lists_rows: bool = True) -> None:
        self.lists_rows = lists_rows

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        v = c_type(dtype)
        return tuple(f"csr_vector<{v}, {t}, {n}>" for t in THREADS_PER_ROW for n in ("true", "false"))

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """Raced unranked (no selector for this GPU) with the threads a row that cover an average row's first loads
        (:func:`threads_covering`), as rcm and rowsort race theirs, where those keep the lanes balanced
        (:func:`lanes_balanced`); the default without features."""
        if features is None:
            return self.space.defaults()
        threads = threads_covering(features["npr_mean"], itemsize)
        if not lanes_balanced(features, threads):
            return None
        return self.space.validate({"threads_per_row": threads}, family=self.name)

    def fitted_configs(self, features: Mapping[str, float] | None, itemsize: int) -> list[dict[str, Value]]:
        """Where at least :data:`EMPTY_SHARE` of the rows are empty (the product runs over the others alone) and the
        others are alike (the longest at most :data:`LISTED_SPREAD` times their mean): the threads a row that cover
        their mean's first loads (:func:`threads_covering`), which the selector's corpus did not teach it. On the
        unseen topheavy (98 % of 5 M rows empty, the others of 100 to 300 entries) it ranks 8 (float64) or 4
        (float32) threads a row, and 32 run 1.19x and 1.39x faster, listed (1.28x and 1.29x cuSPARSE;
        ``bench/results/2026-11-29_probe_listed-70.txt``)."""
        if not features or not self.lists_rows or features.get("empty_row_frac", 0.0) < EMPTY_SHARE:
            return []
        filled = features["rows"] * (1.0 - features["empty_row_frac"])
        mean = features["nnz"] / max(filled, 1.0)
        if features["npr_max"] > LISTED_SPREAD * mean:
            return []
        return [self.space.validate({"threads_per_row": threads_covering(mean, itemsize)}, family=self.name)]

    def _listed(self, prepared: Prepared, xp: Any, narrow_entries: int | None = None) -> tuple[Any, bool]:
        """The row pointer the product runs over, A's or its nonempty rows' (those rows kept as ``listed``), and
        whether narrow columns were attached: A's rows' (those :func:`~kernels._narrow.rows_written_once` wrote,
        where it did), the listed rows taking their bases (their entries' offsets are the same)."""
        A, p, ex = prepared.A, prepared.params, prepared.extra
        narrow = attach(ex, p, A.indptr, A.indices, narrow_entries)
        listed = listed_rows(xp, A.indptr, empty_rows(A, xp)) if self.lists_rows else None
        if listed is None:
            return A.indptr, narrow
        ex["listed"], ex["listed_ptr"] = listed
        if narrow:
            ex["base"] = ex["base"][ex["listed"]]
        return ex["listed_ptr"], narrow

    def _prepare(self, prepared: Prepared) -> None:
        A, p, ex = prepared.A, prepared.params, prepared.extra
        kernels = get_kernels(self.cu_file, self.name_expressions(prepared.dtype))
        narrow = "true" if self._listed(prepared, require_cupy(), narrow_rows(A))[1] else "false"
        ex["kernel"] = kernels[f"csr_vector<{c_type(prepared.dtype)}, {p['threads_per_row']}, {narrow}>"]

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        self.launch(prepared, x, out)

    def launch(self, prepared: Prepared, x: Any, out: Any, rows: Any = None) -> None:
        """The product into ``out``; with ``rows`` (int32, a row's number in ``out``), row i's sum is
        ``out[rows[i]]`` (rcm's and rowsort's matrices, reordered, writing y in A's order; prepared without
        ``lists_rows``). Over listed rows: ``out`` zeroed, then the nonempty rows' sums written to their rows."""
        A, p, ex = prepared.A, prepared.params, prepared.extra
        ptr, block = A.indptr, p["block_size"]
        if "listed" in ex:
            if rows is not None:
                raise ValueError("csr_vector with its nonempty rows listed writes them itself: prepare it with "
                                 "CsrVector(lists_rows=False) to give rows of your own")
            out.data.memset_async(0, out.nbytes)
            ptr, rows = ex["listed_ptr"], ex["listed"]
        m = ptr.size - 1
        ex["kernel"](
            (grid(m * p["threads_per_row"], block),),
            (block,),
            (np.int32(m), ptr, A.indices, *launch_columns(ex, A.indices), A.data, x, out, rows),
        )

    def _prepare_reference(self, prepared: Prepared) -> None:
        tpr = prepared.params["threads_per_row"]
        ptr = self._listed(prepared, np)[0]
        rows = row_ids(ptr)
        lane = (np.arange(prepared.nnz, dtype=np.int64) - ptr[rows]) % tpr
        prepared.extra["slot"] = rows.astype(np.int64) * tpr + lane

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        A, ex = prepared.A, prepared.extra
        ptr, tpr = ex.get("listed_ptr", A.indptr), prepared.params["threads_per_row"]
        m = ptr.size - 1
        partial = segment_sums(ex["slot"], products(A, x, reference_columns(ex, ptr, A.indices)),
                               m * tpr).reshape(m, tpr)
        offset = tpr // 2
        while offset:
            partial[:, :offset] += partial[:, offset : 2 * offset]
            offset //= 2
        if "listed" not in ex:
            return partial[:, 0]
        y = np.zeros(prepared.shape[0])
        y[ex["listed"]] = partial[:, 0]
        return y
