"""``rowsort``: the rows in the order of their middle columns, then csr_vector on the reordered matrix.

A matrix whose rows are local (each row's columns near one another: a stencil, a mesh, a banded or block
matrix) but stored in another order than their columns (rows numbered at random, sorted by length, assembled
element by element, a permutation applied to A's rows only) has the rows a warp reads at once gathering x from
lines far apart, where the same rows in order would share them; no kernel that reads A's rows in A's order gets
that back, and the matrix's features (each row alone, the columns' spread) do not see it. Ordered by their
middle columns (:func:`row_order`; a stable sort, ties by A's order, rows without entries last), the rows
``B = A[rows]`` come back to the order of their columns: a 7-point stencil of 3.4 M rows in random order comes
back to the stencil. The columns keep their numbers, so x is read as it is (rcm, which renumbers rows and
columns by a breadth-first search, gathers x into its new order each product and takes tens of SpMVs to
prepare).

A product is csr_vector on B (``threads_per_row``, ``block_size``: its parameters) writing each row's sum to its row
of A, or, where too much of the matrix streams through the L2 between two writes of a sector of y
(:func:`kernels.rcm.writes_in_place`), to a copy of y in B's order, gathered after (rcm's way:
:func:`kernels.rcm.renumbered_product`). On a matrix of at least :data:`CHECKED_ROWS` rows the preparation fails
fast (:class:`~common.errors.NotApplicableError`, with the shares it measured) where the rows are in order already
(fewer than :data:`OUT_OF_ORDER` of the pairs of neighbouring rows have middle columns :data:`JUMP` or more apart)
or where the order would not bring the rows together (as many pairs, in the new order, with first or last columns
that far apart: a random graph, whose rows spread over all of x whatever their order). A race at plan time enters it
unranked on such a matrix with rows regular enough for csr_vector and of two entries or more, unless it is square
with its diagonal stored (:meth:`Rowsort.unranked_config`).

>>> import numpy as np, scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(60, 40, density=0.05, random_state=0))
>>> f = Rowsort()
>>> p = f.prepare_reference(A)
>>> bool(abs(f.run_reference(p, np.ones(40)) - A @ np.ones(40)).max() < 1e-12)
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from common.errors import NotApplicableError
from kernels._space import Value
from kernels.csr_vector import threads_covering
from kernels.rcm import (
    CHECKED_ROWS,
    JUMP,
    OUT_OF_ORDER,
    REGULAR_CV,
    Renumbered,
    jump_share,
    require_out_of_order,
)

DIAGONAL = 0.5
"""A square matrix with at least this share of its diagonal stored has its rows in the order of its columns
already (row i reads x's entry i, its neighbours the entries beside it): reordering the rows would take that
away, and where the rows' other columns are scattered (a symmetric permutation: the unseen perm27, mesh2d,
fem3x3) no order of the rows brings them together either. Raced without this bound (stop 65, H200), rowsort
was refused on every such unseen matrix, after a sort of its rows where their middle columns jumped."""

MIN_ENTRIES = 2.0
"""The fewest entries a row, on average, of a matrix a race enters rowsort on: the order turns each row's gathers
of x into streams and its write of y into a scattered one, so rows of fewer entries have less to gain than that
write costs them. On the unseen onehot (24 M rows of one entry, stop 67, H200) it ran at 888 us against csr_scalar's
270 in float64 (1371 against 202 in float32), after 15-16 ms of preparation: a sixth of the race's cost."""


class Rowsort(Renumbered):
    name = "rowsort"
    summary = "rows reordered by their middle columns, then csr_vector on the reordered matrix"
    source = "beyond the papers: the rows alone reordered for the locality of x's gathers; csr_vector on the result"
    prepare_spmvs = 20.0  # H200 (stop 65's probe_rowsort): 16-24 SpMVs on rowperm7 and rowhash9, 23-30 tallshuffled

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """Raced where A has at least :data:`CHECKED_ROWS` rows (its preparation checks their order) of regular
        lengths (csr_vector's rows, as for rcm) and :data:`MIN_ENTRIES` entries or more on average, and is not a
        square matrix with most of its diagonal stored (:data:`DIAGONAL`), with the threads a row that cover an
        average row's first loads (:func:`kernels.csr_vector.threads_covering`)."""
        if (features is None or features["rows"] < CHECKED_ROWS or features["npr_cv"] >= REGULAR_CV
                or features["npr_mean"] < MIN_ENTRIES
                or (features["rows"] == features["cols"] and features["diag_frac"] >= DIAGONAL)):
            return None
        threads = threads_covering(features["npr_mean"], itemsize)
        return self.space.validate({"threads_per_row": threads}, family=self.name)

    def renumbering(self, A: Any, xp: Any) -> tuple[Any, Any]:
        """A's rows by their middle columns (:func:`row_order`), its columns kept."""
        return row_order(A.indptr, A.indices, A.shape[1], xp), None


def row_order(indptr: Any, indices: Any, n: int, xp: Any = np) -> Any:
    """The rows (int32, ``rows[new] = old``) by their middle columns (entry ``length // 2`` of the row), ties by
    number, those without entries last; ``xp``: NumPy (the reference) or CuPy, the same steps. On
    :data:`CHECKED_ROWS` rows or more, raises NotApplicableError where the order is not worth a copy of the
    matrix (see the module's docstring): checked before the sort where the rows are in order already."""
    m = indptr.size - 1
    middle, filled = require_out_of_order(indptr, indices, xp)
    last = max(int(indices.size) - 1, 0)
    checked = m >= CHECKED_ROWS
    key = xp.where(filled, middle, n).astype(np.int64) * m + xp.arange(m, dtype=np.int64)
    rows = xp.argsort(key).astype(np.int32)
    if not checked:
        return rows
    starts, ends = indptr[:-1][rows], indptr[1:][rows]
    ends -= 1
    scattered = jump_share((indices[xp.minimum(starts, last)], indices[xp.maximum(ends, 0)]), filled[rows], xp)
    if scattered >= OUT_OF_ORDER:
        raise NotApplicableError(f"no order of the rows brings them together: in the order of their middle columns "
                                 f"{scattered:.1%} of neighbouring rows still have first or last columns {JUMP} or "
                                 f"more apart")
    return rows
