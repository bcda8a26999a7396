"""``firsttouch``: the columns renumbered in the order the rows first read them, then csr_vector on the result.

A matrix whose rows are in order and local among themselves but whose columns are numbered apart from them (a
mesh's equations assembled in order over unknowns numbered at random; a graph's targets under hashed ids) has
each row's gathers of x spread over all of it, though neighbouring rows read nearly the same entries: each value
of x comes from a line of its own, read again by the next rows only where the L2 still holds it. Numbered in the
order the rows first read them (:func:`column_order`: each column by the first entry that reads it, columns no
row reads last, by number), the columns come back to the rows' order: ``B = A[:, cols]`` of a stencil whose
columns alone were permuted is the stencil again. A product gathers x into that order (n values, against the
matrix's nnz) and runs csr_vector on B, y written in place. rowsort reorders the rows alone, rcm rows and columns
by one order (the diagonal stays the diagonal); this, the columns alone.

On :data:`~kernels.rcm.CHECKED_ROWS` rows or more the preparation fails fast
(:class:`~common.errors.NotApplicableError`, with the share it measured) where the rows are in order already
(:func:`kernels.rcm.require_out_of_order`: neighbouring rows' middle columns near) or where the new numbering
would not bring them together (:data:`~kernels.rcm.OUT_OF_ORDER` of the pairs of neighbouring rows, renumbered,
with lowest columns :data:`~kernels.rcm.JUMP` or more apart: rows in random order, whose first reads scatter
the numbers, or random columns no two rows share; the lowest, as a row's entries keep A's order, in which its
middle one is any of its columns). A race enters it unranked where the gathers are scattered and
the rows and columns regular, each read twice or more, unless A is square with its diagonal stored
(:meth:`Firsttouch.unranked_config`).

>>> import numpy as np, scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(60, 40, density=0.05, random_state=0))
>>> f = Firsttouch()
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
    SCATTERED_CF,
    Renumbered,
    inverse,
    jump_share,
    require_out_of_order,
)
from kernels.rowsort import DIAGONAL, MIN_ENTRIES


class Firsttouch(Renumbered):
    name = "firsttouch"
    summary = "columns renumbered in the order the rows first read them, then csr_vector on the renumbered matrix"
    source = "beyond the papers: the columns alone renumbered for the locality of x's gathers; csr_vector on the result"
    prepare_spmvs = 20.0  # as rowsort's: an order of the columns, one copy of the matrix

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """Raced where A has at least :data:`~kernels.rcm.CHECKED_ROWS` rows (its preparation checks the order),
        scattered gathers of x (``cf_128`` under rcm's :data:`~kernels.rcm.SCATTERED_CF`), rows and columns of
        regular lengths (rcm's :data:`~kernels.rcm.REGULAR_CV`: hubs have no order to come back to) and
        :data:`~kernels.rowsort.MIN_ENTRIES` entries or more a row and a column on average (a value of x read
        once has nothing to share a line with), and is not square with most of its diagonal stored (its columns
        in its rows' order already: rcm's matrices), with the threads a row that cover an average row's first
        loads (:func:`kernels.csr_vector.threads_covering`)."""
        if (features is None or features["rows"] < CHECKED_ROWS or features["cf_128"] >= SCATTERED_CF
                or features["npr_cv"] >= REGULAR_CV or features["col_cv"] >= REGULAR_CV
                or features["npr_mean"] < MIN_ENTRIES
                or features["npr_mean"] * features["rows"] < MIN_ENTRIES * features["cols"]
                or (features["rows"] == features["cols"] and features["diag_frac"] >= DIAGONAL)):
            return None
        return self.space.validate({"threads_per_row": threads_covering(features["npr_mean"], itemsize)},
                                   family=self.name)

    def renumbering(self, A: Any, xp: Any) -> tuple[Any, Any]:
        """A's columns in the order the rows first read them (:func:`column_order`), its rows kept."""
        return None, column_order(A.indptr, A.indices, A.shape[1], xp)


def column_order(indptr: Any, indices: Any, n: int, xp: Any = np) -> Any:
    """The ``n`` columns (int32, ``cols[new] = old``) in the order the rows first read them (by the first entry
    of each; columns no row reads last, by number); ``xp``: NumPy (the reference) or CuPy, the same steps. On
    :data:`~kernels.rcm.CHECKED_ROWS` rows or more, NotApplicableError where the rows are in order already
    (checked first) or where neighbouring rows, renumbered, still read far apart (see the module's docstring)."""
    _, filled = require_out_of_order(indptr, indices, xp)
    nnz = int(indices.size)
    entries = xp.arange(nnz, dtype=np.int32)
    first = xp.full(n, nnz, dtype=np.int32)
    xp.minimum.at(first, indices, entries)
    key = xp.where(first < nnz, first.astype(np.int64), nnz + xp.arange(n, dtype=np.int64))
    cols = xp.argsort(key).astype(np.int32)
    m = indptr.size - 1
    if m < CHECKED_ROWS:
        return cols
    lowest = xp.full(m, n, dtype=np.int32)  # each row's lowest new column
    xp.minimum.at(lowest, (xp.searchsorted(indptr, entries, side="right") - 1).astype(np.int32),
                  inverse(cols, xp)[indices])
    scattered = jump_share((lowest,), filled, xp)
    if scattered >= OUT_OF_ORDER:
        raise NotApplicableError(f"no numbering of the columns brings the rows together: in the order the rows "
                                 f"first read them {scattered:.1%} of neighbouring rows still have lowest columns "
                                 f"{JUMP} or more apart")
    return cols
