"""``rcm``: rows and columns renumbered by reverse Cuthill-McKee, then csr_vector on the renumbered matrix.

A matrix whose structure is local but whose numbering is not (a mesh, a graph numbered at random) has each
row's columns spread over all of x: every gather of x fetches a sector of its own, from L2 where x fits,
else from DRAM, and no kernel that keeps the numbering avoids it. Cuthill-McKee (Cuthill & McKee, 1969)
numbers the vertices of a graph breadth first, each level in the order of the numbers that reach it, so
that neighbours get near numbers; reversed (George, 1971), the renumbered matrix ``B = A[rows][:, cols]``
has a narrow band and its gathers of x come back to the same lines.

- The graph: a square matrix's rows are its vertices and its columns their neighbours (one order for rows
  and columns: the diagonal stays the diagonal); another matrix's bipartite graph (rows on one side,
  columns on the other), whose order splits into an order of the rows and one of the columns.
- The order (:func:`orders`), one level at a time, the same steps on the GPU and in NumPy (the reference): a
  vertex of the next level takes the lowest number of the level's vertices that reach it, and the level is
  numbered by that, then by vertex. A search starts at the vertex of fewest neighbours (then the lowest);
  where it ends before every vertex is numbered (another component), the next starts from the next such
  vertices, twice as many each time, so that a matrix of many components takes a few dozen searches, not one
  each; each start's share of the order stays together (a component two of whose vertices start the same
  search is cut in two). Vertices no search reaches (no entries, in no one's row, or beyond the depth a search
  stops at, :data:`DEEP_LEVELS`) come last. On the GPU a whole search is one cooperative launch
  (``rcm_search``: a warp a vertex of the level, grid-wide barriers between the steps, no sort, no read-back
  a level): a randomly numbered 2-D mesh has thousands of levels, and with a read-back and a dozen launches a
  level (0.2-0.5 ms on the device hosts) it took seconds.
- A large graph with no narrow order (a small-world graph: a random or power-law one, where some level holds
  a quarter of the vertices) makes the preparation fail (:class:`~common.errors.NotApplicableError`) as soon
  as that level appears: renumbering it would not bring gathers together. So does, before the search, a
  large matrix whose rows are in order already (:func:`require_out_of_order`: neighbouring rows' middle
  columns near, so a warp's rows gather x from the same lines; a diagonal matrix, a stencil in bit-reversed
  order), as rowsort's preparation does.

A product is then a gather of x into the new order and csr_vector on B (``threads_per_row``, ``block_size``:
its parameters, declared there), each row's sum written to its old row, or, on a matrix that streams too much
through the L2 for that (:func:`writes_in_place`), to a copy of y in the new order, gathered after. The
preparation takes a few launches and one read-back a search. A race at plan time enters it unranked where A is
square, its rows regular and its gathers of x scattered (:meth:`Rcm.unranked_config`).

>>> import numpy as np, scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(60, 60, density=0.05, random_state=0))
>>> f = Rcm()
>>> p = f.prepare_reference(A)
>>> bool(abs(f.run_reference(p, np.ones(60)) - A @ np.ones(60)).max() < 1e-12)
True
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from common.errors import NotApplicableError
from kernels._cuda import c_type, device_attributes, get_kernels, grid, require_cupy, resident_threads
from kernels._family import Family, Prepared
from kernels._space import Value
from kernels.csr_vector import CsrVector, threads_covering

_INNER = CsrVector(lists_rows=False)

SCATTERED_CF = 1.2
"""A race enters rcm unranked where fewer than this many of a row's entries, on average, fall in one window
of 128 columns (the feature ``cf_128``): nearly every gather of x on a line of its own (a randomly numbered
mesh: 1.0-1.05). A 7-point stencil numbered naturally has 1.4 (a row's i - 1, i and i + 1 share a window, its
four others do not) and a band already: renumbering would only copy it. (The bound was 1.5. The unseen kkt,
such a stencil beside scattered constraint rows, has 1.38 at a tenth of its size and 1.16 at full size: it still
races rcm, which there prepares in 8-12 ms and runs at 0.6x csr5.)"""

JUMP = 1024
"""Columns this far apart, or farther, sit on different lines of x and, on neighbouring rows, in different
pages of it (8 KB of float64)."""

OUT_OF_ORDER = 0.5
"""The share of pairs of neighbouring rows, both with entries, whose columns jump (:data:`JUMP`) at which the
rows count as out of order (A's order: middle columns; :func:`require_out_of_order`, where rcm and rowsort both
refuse a matrix in order) and, for rowsort, as scattered whatever their order (its order's first or last columns).
On 10^6 rows (built with tests/test_rowsort.py's helpers): a 7-point stencil in order 0 (and 0); its rows in random
order 0.998 and 0.0; ten random columns a row 0.996 and 1.0. On the unseen matrices rcm is raced on (stop 67, a
quarter of their size): perm27 0.98 and mesh2d 0.97 (where it wins), lowertri 0.83; diagonals, diagonal and bitrev5
(the 5-point stencil in bit-reversed order, whose rows a warp reads together gather x from neighbouring lines)
0.000-0.005, where it lost: bitrev5 in float32 135.6 us against csr_scalar's 65.8 after 37 ms of preparation, the
diagonal matrix 568 us against csr5's 154 after 56 ms (a race of 537 and 374 SpMVs)."""

CHECKED_ROWS = 1 << 16
"""From this many rows a preparation checks the order before it reorders (a smaller matrix is reordered in well
under a millisecond whatever its order, and its x sits in the L2)."""

REGULAR_CV = 1.0
"""... and where the rows' lengths vary less than this (``npr_cv``): csr_vector, the kernel on B, suits
regular rows; a heavy-tailed graph is also a small-world one. The same bound holds the columns' counts
(``col_cv``): a column that many rows read is a hub, and a graph with hubs has no narrow order either (the
unseen benchmark's hubcols, Zipf columns in rows of 4-8: col_cv 69; rcm prepared in 93 ms, 440 SpMVs, and ran
at half csr5's speed)."""

WIDE_LEVEL = 0.25
"""A level holding more than this share of the vertices (and :data:`SEED_SPREAD` times its search's
starting vertices) shows a graph with no narrow order, on a graph of at least :data:`LARGE_GRAPH` vertices
(a smaller one is ordered in milliseconds whatever its structure)."""

SEED_SPREAD = 64
LARGE_GRAPH = 1 << 16

DEEP_LEVELS = 512
NNZ_A_LEVEL = 1 << 13
"""A search stops after ``max(DEEP_LEVELS, entries of the graph / NNZ_A_LEVEL)`` levels, and no other starts: the
vertices not numbered by then keep their order, after the others. A level costs a few grid-wide barriers whatever
its size (18-20 us on an H100), and a long, thin graph has thousands (a 2-D mesh: one or two a node of its side),
while a product takes about 10 ps a nonzero (cuSPARSE on the unseen matrices whose x fits the L2, H100): so a
search is held to about 200 products, and to 10 ms on a graph of fewer than 4 M entries. On the H100 (stop 45)
the search of a randomly numbered 5-point mesh of 3000 x 3000 (6000 levels) took 149 ms, 140 products, in five
barriers a level (three since); renumbered, that mesh (x of 72 MB) ran no faster than cuSPARSE: the gather of x
and the scatter of y into the new order cost what the band saved. A 27-point stencil of 46 M nonzeros has 120
levels (7 ms)."""


class Renumbered(Family):
    """What rcm, rowsort and firsttouch share: A renumbered (its rows, its columns or both:
    :meth:`renumbering`), then csr_vector on the result, each product through it (:func:`keep_renumbered`,
    :func:`renumbered_product`), and the CPU reference the same way."""

    cu_file = "rcm.cu"
    space = _INNER.space

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return (f"rcm_renumber<{c_type(dtype)}>",)

    @abstractmethod
    def renumbering(self, A: Any, xp: Any) -> tuple[Any, Any]:
        """(rows, cols): the old number of each new row and each new column (int32; None where they keep their
        numbers) of A, a SciPy matrix with ``xp`` NumPy (the reference) or a CuPy one with CuPy; NotApplicableError
        where no renumbering pays."""

    # -- GPU path ---------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        keep_renumbered(prepared, *self.renumbering(prepared.A, require_cupy()))

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        renumbered_product(prepared.extra, x, out)

    # -- CPU reference ----------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        keep_renumbered_reference(prepared, *self.renumbering(prepared.A, np))

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        return renumbered_reference_product(prepared, x)


class Rcm(Renumbered):
    name = "rcm"
    summary = "rows and columns renumbered by reverse Cuthill-McKee, then csr_vector on the renumbered matrix"
    source = "Cuthill & McKee, 1969; George, 1971 (reverse Cuthill-McKee); csr_vector on the result"
    # H100 (stop 45): 6-8 ms on the unseen perm27 (46 M nonzeros, products of 200-280 us), 4-6 ms on kkt (19 M,
    # 120-160 us), 21 ms on mesh2d (13 M, 1,200 levels, 130-140 us)
    prepare_spmvs = 50.0

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        return SEARCH, *super().name_expressions(dtype)

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """Raced where A is square with regular rows and columns whose gathers of x are scattered (a mesh or a
        graph numbered at random, the matrices renumbering is for; elsewhere it fails fast or loses), with the
        threads a row whose first batches of loads cover a row of average length, the power of two nearest (by
        ratio) the lanes that takes. On the H100 (stop 45, ``..._probe_rcm_threads-f48e247.txt``) that was the
        fastest of 2, 4 and 8 each time: perm27 (27 a row) 8 in float64, 4 in float32 (1.57x and 2.20x
        cuSPARSE); mesh2d (9 a row) 2 in both (1.08x and 1.40x; 4, the fewest that cover a row at once in
        float64, ran at 1.03x)."""
        if (features is None or features["rows"] != features["cols"] or features["cf_128"] >= SCATTERED_CF
                or features["npr_cv"] >= REGULAR_CV or features["col_cv"] >= REGULAR_CV):
            return None
        return self.space.validate({"threads_per_row": threads_covering(features["npr_mean"], itemsize)},
                                   family=self.name)

    def renumbering(self, A: Any, xp: Any) -> tuple[Any, Any]:
        """Reverse Cuthill-McKee's rows and columns (:func:`orders`; the GPU's search on the GPU), where the rows are
        out of order (:func:`require_out_of_order`)."""
        require_out_of_order(A.indptr, A.indices, xp)
        return orders(A) if xp is np else orders(A, xp, gpu_search())


def keep_renumbered(prepared: Prepared, rows: Any, cols: Any) -> None:
    """Prepare csr_vector on B, A with its rows and its columns renumbered on the GPU (``rows``, ``cols``: the
    old number of each, CuPy int32; None: those keep their numbers), and keep in ``prepared.extra`` what
    :func:`renumbered_product` needs: B's arrays (counted in ``extra_bytes``: B is a copy of A), the columns' order
    and a vector for x in it, and B's rows, as ``rows`` itself where y is written in place (rows kept, or
    :func:`writes_in_place`), else as a copy of y in B's order and the new number of each old row (``inverse``),
    which gather y back in A's order."""
    cupy = require_cupy()
    B = renumbered_on_gpu(prepared.A, rows, cols)
    ex = prepared.extra
    ex.update(inner=_INNER.prepare(B, prepared.params), indptr=B.indptr, indices=B.indices, data=B.data)
    if cols is not None:
        ex.update(cols=cols, x_renumbered=cupy.empty(prepared.shape[1], dtype=prepared.dtype))
    if rows is None or writes_in_place(prepared.nnz, prepared.dtype.itemsize, device_attributes()["L2CacheSize"]):
        ex["rows"] = rows
    else:
        ex["y_renumbered"] = cupy.empty(prepared.shape[0], dtype=prepared.dtype)
        ex["inverse"] = inverse(rows, cupy)


def renumbered_product(ex: dict[str, Any], x: Any, out: Any) -> None:
    """y = A·x into ``out`` through B (``ex``: what :func:`keep_renumbered` kept): x gathered into B's numbering of
    the columns where it has one, each row's sum written to its old row, or to the copy of y in B's order, then
    gathered into ``out`` in A's (sequential writes, reads from a copy just written: on the unseen rowperm7 in
    float64, an H200, 130 us against 189 for a scatter ``out[rows] = copy``, stop 65's probe_rowsort)."""
    cupy = require_cupy()
    if "cols" in ex:
        x = cupy.take(x, ex["cols"], out=ex["x_renumbered"])
    if "y_renumbered" not in ex:
        _INNER.launch(ex["inner"], x, out, rows=ex["rows"])
        return
    _INNER.launch(ex["inner"], x, ex["y_renumbered"])
    cupy.take(ex["y_renumbered"], ex["inverse"], out=out)


def keep_renumbered_reference(prepared: Prepared, rows: np.ndarray | None, cols: np.ndarray | None) -> None:
    """:func:`keep_renumbered`'s CPU reference: csr_vector's reference on B, and B's rows and columns."""
    B = renumbered(prepared.A, rows, cols)
    prepared.extra.update(rows=rows, cols=cols, inner=_INNER.prepare_reference(B, prepared.params))


def renumbered_reference_product(prepared: Prepared, x: np.ndarray) -> np.ndarray:
    """:func:`renumbered_product`'s CPU reference: B's product (x renumbered where the columns are), each row's
    sum put back in its row of A (where the rows are)."""
    ex = prepared.extra
    y = _INNER.run_reference(ex["inner"], x if ex["cols"] is None else x[ex["cols"]])
    if ex["rows"] is None:
        return y
    out = np.empty(prepared.shape[0], dtype=prepared.dtype)
    out[ex["rows"]] = y
    return out


def writes_in_place(nnz: int, itemsize: int, l2_bytes: int) -> bool:
    """Whether rcm's and rowsort's products write y in A's order themselves (each row's sum to its old row, kept
    in the L2: csr_vector.cu's ROWS) rather than in B's order, gathered back by a second launch
    (:func:`renumbered_product`). A 32-byte sector of y gets 32 / itemsize sums, at random times through the
    product, between two of which about ``nnz * (itemsize + 4) * itemsize / 32`` bytes of the matrix stream
    through the L2; where that is more than the L2 holds, the sectors go back to DRAM written in part, again and
    again, and the copy wins.

    On the H100 (50 MiB of L2; stop 46, ``..._probe_rcm_writes-fae0e2e.txt``), in place against the copy, us:
    mesh2d 104 / 131 (37 MiB by that measure) and in float32 69 / 88; a 27-point stencil of 13.5 M entries 76 /
    89 (39 MiB), of 46 M in float32 154 / 183 (44 MiB); but the 46 M one in float64 294 / 279 (131 MiB), a
    7-point one of 28.5 M 452 / 364 (82 MiB), mesh2d three times as large 514 / 428 (111 MiB). Of 12 cases the
    rule missed two, by 1 % (37 MiB) and 5 % (54 MiB, where rcm lost to cuSPARSE either way). The copy was then
    scattered back (``out[rows] = copy``); gathered instead (stop 65, an H200,
    ``..._probe_rowsort-77eaeac.txt``, in place / gathered / scattered, us, at the threads a row that ran fastest)
    the rule still picks the faster way on rcm's perm27 (float64 224 / 194 / 223, float32 132 / 139 / 153), mesh2d
    (77 / 87 / 109, 59 / 69 / 75) and fem3x3 (143 / 139 / 153, 88 / 98 / 97), and on rowsort's rowperm7 (222 / 130 /
    189, 93 / 104 / 142) and rowhash9 (103 / 92 / 125, 59 / 71 / 83)."""
    return nnz * (itemsize + 4) * itemsize / 32 <= l2_bytes


Search = Callable[[Any, Any, Any, Any, Any, int, int, int, int], tuple[int, int, bool]]
"""A breadth-first search: (graph's indptr, its indices, number, order, root, start, count, wide, deep), from the
level ``order[start:start + count]`` (numbered already), numbering level after level (``order``: the vertices by
number, ``number``: each vertex's, ``root``: by number, the number of the search's start it came from) until a
level is empty -> (vertices numbered in all, 0, False), holds more than ``wide`` vertices -> (those numbered
before it, its size, False), or ``deep`` levels are numbered, the last one not searched -> (those numbered, 0,
True)."""

SEARCH = "rcm_search"
"""The GPU's :data:`Search`, a cooperative launch (``rcm.cu``)."""
BLOCK = 512
SM_BLOCKS = 2
"""Threads a block of :data:`SEARCH` (up to 1024), and its blocks an SM at most: every grid-wide barrier waits for
each block. On the H100 (stop 45) 512 x 2 and 1024 x 1 ordered the 27-point stencil of 46 M nonzeros in 6.3 ms,
a 7-point one of 4 M rows in 13.9-14.1 ms and 1,373 levels of a 2-D mesh in 25-27 ms; 256 x 4 took 6.5, 14.7 and
31 ms, 128 x 4 7.5, 17.5 and 33 ms."""


def orders(A: Any, xp: Any = np, search: Search | None = None) -> tuple[Any, Any]:
    """(rows, cols): the old number of each new row and of each new column (int32), by reverse Cuthill-McKee
    on A's graph (see the module's docstring); ``xp``: NumPy for a SciPy A (the reference), CuPy for a
    cupyx A with the GPU's ``search`` (:func:`gpu_search`). Raises NotApplicableError where the graph has no
    narrow order."""
    m, n = A.shape
    if m == n:
        indptr, indices = A.indptr.astype(np.int64), A.indices
    else:
        T = A.T.tocsr()
        indptr = xp.concatenate([A.indptr.astype(np.int64), T.indptr[1:].astype(np.int64) + A.nnz])
        indices = xp.concatenate([A.indices + np.int32(m), T.indices.astype(np.int32)])
    order = xp.ascontiguousarray(_cuthill_mckee(indptr, indices, xp, search or _cpu_search)[::-1])
    if m == n:
        return order, order
    return order[order < m], order[order >= m] - np.int32(m)


def require_out_of_order(indptr: Any, indices: Any, xp: Any = np) -> tuple[Any, Any]:
    """Each row's middle column (its entry ``length // 2``; any for a row without entries) and whether it has
    entries; on :data:`CHECKED_ROWS` rows or more, NotApplicableError where the rows are in order already (fewer
    than :data:`OUT_OF_ORDER` of the pairs of neighbouring rows have middle columns :data:`JUMP` or more apart: the
    rows a warp reads together gather x from the same lines, and a new order would only copy the matrix).
    ``xp``: NumPy or CuPy, the same steps; one read-back."""
    m = indptr.size - 1
    lengths = xp.diff(indptr)
    filled = lengths > 0
    last = int(indices.size) - 1
    middle = indices[xp.minimum(indptr[:-1] + lengths // 2, last)] if last >= 0 else xp.zeros(m, indices.dtype)
    if m >= CHECKED_ROWS and (in_order := jump_share((middle,), filled, xp)) < OUT_OF_ORDER:
        raise NotApplicableError(f"rows in order already: {in_order:.1%} of neighbouring rows have middle columns "
                                 f"{JUMP} or more apart (reordered where {OUT_OF_ORDER:.0%} or more)")
    return middle, filled


def jump_share(columns: tuple[Any, ...], filled: Any, xp: Any) -> float:
    """Of the pairs of neighbouring rows both with entries, the share in which any of ``columns`` (one each a
    row) are :data:`JUMP` or more apart (0 without pairs); one read-back."""
    pairs = filled[1:] & filled[:-1]
    jumps = xp.zeros(pairs.size, dtype=bool)
    for c in columns:
        jumps |= xp.abs(xp.diff(c.astype(np.int64))) >= JUMP
    count, jumped = (int(v) for v in xp.stack([xp.count_nonzero(pairs), xp.count_nonzero(jumps & pairs)]).tolist())
    return jumped / count if count else 0.0


def renumbered(A: sp.csr_matrix, rows: np.ndarray | None, cols: np.ndarray | None) -> sp.csr_matrix:
    """``A[rows][:, cols]`` as ``rcm_renumber`` builds it: each row's entries in A's order (so not sorted by
    their new columns), int32 indices; None: those keep their numbers (``A[rows]``, ``A[:, cols]``)."""
    if rows is None:
        rows = np.arange(A.shape[0], dtype=np.int32)
    lengths = np.diff(A.indptr)[rows]
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    pos = np.repeat(A.indptr[rows].astype(np.int64) - indptr[:-1], lengths) + np.arange(indptr[-1])
    indices = A.indices[pos] if cols is None else inverse(cols, np)[A.indices[pos]]
    return sp.csr_matrix((A.data[pos], indices.astype(np.int32, copy=False), indptr), shape=A.shape)


def renumbered_on_gpu(A: Any, rows: Any, cols: Any) -> Any:
    """:func:`renumbered` of a cupyx CSR matrix with CuPy orders (either may be None), on the GPU
    (``rcm_renumber``, a warp a row)."""
    cupy = require_cupy()
    import cupyx.scipy.sparse as cusp

    m = A.shape[0]
    if rows is None:
        rows = cupy.arange(m, dtype=np.int32)
    lengths = cupy.diff(A.indptr)[rows]
    indptr = cupy.zeros(m + 1, dtype=np.int32)
    cupy.cumsum(lengths, out=indptr[1:])
    indices, data = cupy.empty_like(A.indices), cupy.empty_like(A.data)
    renumber = f"rcm_renumber<{c_type(A.dtype)}>"
    get_kernels(Rcm.cu_file, (renumber,))[renumber](
        (grid(32 * m, 256),), (256,), (np.int32(m), rows, indptr, A.indptr, A.indices, A.data,
                                       None if cols is None else inverse(cols, cupy),
                                       indices, data))
    return cusp.csr_matrix((data, indices, indptr), shape=A.shape)


def inverse(order: Any, xp: Any) -> Any:
    """new[old]: the new number of each old one."""
    new = xp.empty(order.size, dtype=np.int32)
    new[order] = xp.arange(order.size, dtype=np.int32)
    return new


def _cuthill_mckee(indptr: Any, indices: Any, xp: Any, search: Search) -> Any:
    """The Cuthill-McKee order of the graph (its vertices in the order numbered), a search at a time; a search
    started from several vertices at once keeps each one's share together (ordered by where it started,
    then by number), as if each had had a search of its own."""
    size = indptr.size - 1
    degree = xp.diff(indptr)
    number = xp.full(size, -1, dtype=np.int32)
    order = xp.empty(size, dtype=np.int32)
    root = xp.empty(size, dtype=np.int32)  # by number: the number of the search's start it came from
    linked = xp.flatnonzero(degree > 0)
    starts, _ = _by_key(degree[linked], linked, xp)  # fewest neighbours first, then the lowest vertex
    numbered = taken = 0
    seeds_wanted = 1
    deep = max(DEEP_LEVELS, int(indices.size) // NNZ_A_LEVEL)

    def assign(vertices: Any) -> int:
        span = slice(numbered, numbered + vertices.size)
        order[span] = vertices
        number[vertices] = xp.arange(span.start, span.stop, dtype=np.int32)
        root[span] = number[vertices]
        return span.stop

    while taken < starts.size:
        free = xp.flatnonzero(number[starts[taken:]] < 0)[:seeds_wanted]
        if free.size == 0:
            break
        level = starts[taken + free]
        taken += int(free[-1]) + 1
        seeds, seeds_wanted = int(level.size), 2 * seeds_wanted
        begin, numbered = numbered, assign(level)
        wide = max(WIDE_LEVEL * size, SEED_SPREAD * seeds) if size >= LARGE_GRAPH else size
        numbered, too_wide, cut = search(indptr, indices, number, order, root, begin, seeds, int(wide), deep)
        if too_wide:
            raise NotApplicableError(
                f"rcm: no narrow order for this matrix: a breadth-first level holds {too_wide} of its "
                f"{size} vertices (a small-world graph); renumbering would not bring its gathers together")
        if cut:
            break
    assign(xp.flatnonzero(number < 0).astype(np.int32))
    by_search, _ = _by_key(root, xp.arange(size, dtype=np.int32), xp)
    return order[by_search]


def _by_key(key: Any, vertices: Any, xp: Any) -> tuple[Any, Any]:
    """``vertices`` (int32) sorted by ``key`` (non-negative int32), then by vertex, and their keys: one sort
    of 64-bit words."""
    words = xp.sort((key.astype(np.int64) << 32) | vertices.astype(np.int64))
    return (words & 0xFFFFFFFF).astype(np.int32), (words >> 32).astype(np.int32)


def _cpu_search(indptr: np.ndarray, indices: np.ndarray, number: np.ndarray, order: np.ndarray, root: np.ndarray,
                start: int, count: int, wide: int, deep: int) -> tuple[int, int, bool]:
    """The reference of :data:`SEARCH`, level by level: every (vertex of the level, neighbour) pair, vectorized,
    then a sort."""
    for _ in range(deep):
        if not count:
            break
        level = order[start:start + count]
        first, lengths = indptr[level], indptr[level + 1] - indptr[level]
        pos = np.repeat(first - (np.cumsum(lengths) - lengths), lengths) + np.arange(int(lengths.sum()))
        child, parent = indices[pos], np.repeat(number[level], lengths)
        keep = number[child] < 0
        child, parent = child[keep], parent[keep]
        by_child = np.lexsort((parent, child))
        child, parent = child[by_child], parent[by_child]
        first_of_child = np.concatenate([[True], child[1:] != child[:-1]]) if child.size else np.zeros(0, bool)
        children, parents = _by_key(parent[first_of_child], child[first_of_child], np)
        if children.size > wide:
            return start + count, int(children.size), False
        start, count = start + count, int(children.size)
        order[start:start + count] = children
        number[children] = np.arange(start, start + count, dtype=np.int32)
        root[start:start + count] = root[parents]
    return start + count, 0, count > 0


def gpu_search() -> Search:
    """:data:`SEARCH` on this GPU: as many blocks as it holds at once (a cooperative launch must have every
    block resident), with its work arrays (made at the first search of an order, kept for the others)."""
    cupy = require_cupy()
    kernel = get_kernels(Rcm.cu_file, (SEARCH,), cooperative=True)[SEARCH]
    attributes = device_attributes()
    sms = attributes["MultiProcessorCount"]
    blocks = sms * min(SM_BLOCKS, resident_threads(kernel.num_regs, BLOCK, attributes) // BLOCK // sms)
    work: dict[str, Any] = {}

    def search(indptr: Any, indices: Any, number: Any, order: Any, root: Any, start: int, count: int,
               wide: int, deep: int) -> tuple[int, int, bool]:
        if not work:
            work.update(parent=cupy.full(number.size, np.iinfo(np.int32).max, dtype=np.int32),
                        children=cupy.empty(number.size, dtype=np.int32),
                        block_sums=cupy.empty(blocks, dtype=np.int32), barrier=cupy.zeros(2, dtype=np.uint32),
                        result=cupy.empty(3, dtype=np.int32))
        kernel((blocks,), (BLOCK,), (indptr, indices, number, order, root, work["parent"], work["children"],
                                     work["block_sums"], work["barrier"], work["result"], np.int32(start),
                                     np.int32(count), np.int32(min(wide, np.iinfo(np.int32).max)), np.int32(deep)))
        numbered, too_wide, too_deep = (int(v) for v in work["result"].get())
        return numbered, too_wide, bool(too_deep)

    return search
