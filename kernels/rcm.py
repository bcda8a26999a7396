"""``rcm``: rows and columns renumbered by reverse Cuthill-McKee, then csr_vector on the renumbered matrix.

A matrix whose structure is local but whose numbering is not (a mesh, a graph numbered at random) has each
row's columns spread over all of x: every gather of x fetches a sector of its own, from L2 where x fits,
else from DRAM, and no kernel that keeps the numbering avoids it. Reverse Cuthill-McKee (Cuthill & McKee,
1969; George, 1971) numbers the vertices of a graph breadth first from a peripheral one, the fewest
neighbours first, and reverses that order, so that neighbours get near numbers: the renumbered matrix
``B = A[rows][:, cols]`` has a narrow band and its gathers of x come back to the same lines.

- A square matrix gets one order for its rows and its columns, of the graph of A + Aᵀ (the diagonal stays
  the diagonal).
- Another gets one order of its bipartite graph (rows on one side, columns on the other), split into an
  order of the rows and one of the columns.

A product is then a gather of x into the new order, csr_vector on B (``threads_per_row``, ``block_size``:
its parameters, declared there) and a scatter of y back to the old rows: a few percent more bytes than the
product itself. The preparation (the order, by SciPy on the host, and B) takes of the order of a second on
tens of millions of nonzeros: worth it for a matrix multiplied thousands of times (``tuner tune``,
``plan(effort="tune")``), not in a race at plan time (:attr:`races_unranked` is False).

>>> import numpy as np, scipy.sparse as sp
>>> from tuner.matrix.io import as_csr
>>> A = as_csr(sp.random(60, 60, density=0.05, random_state=0))
>>> f = Rcm()
>>> p = f.prepare_reference(A)
>>> bool(abs(f.run_reference(p, np.ones(60)) - A @ np.ones(60)).max() < 1e-12)
True
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from kernels._cuda import require_cupy
from kernels._family import Family, Prepared
from kernels.csr_vector import CsrVector

_INNER = CsrVector()


class Rcm(Family):
    name = "rcm"
    summary = "rows and columns renumbered by reverse Cuthill-McKee, then csr_vector on the renumbered matrix"
    source = "Cuthill & McKee, 1969; George, 1971 (reverse Cuthill-McKee); csr_vector on the result"
    races_unranked = False
    space = _INNER.space

    # -- GPU path ---------------------------------------------------------------
    def _prepare(self, prepared: Prepared) -> None:
        cupy = require_cupy()
        import cupyx.scipy.sparse as cusp

        A = prepared.A
        host = sp.csr_matrix((A.data.get(), A.indices.get(), A.indptr.get()), shape=prepared.shape)
        rows, cols = orders(host)
        B = cusp.csr_matrix(renumbered(host, rows, cols))
        ex = prepared.extra
        ex["inner"] = _INNER.prepare(B, prepared.params)
        ex.update(indptr=B.indptr, indices=B.indices, data=B.data,  # counted in extra_bytes: B is a copy of A
                  rows=cupy.asarray(rows), cols=cupy.asarray(cols),
                  x_renumbered=cupy.empty(prepared.shape[1], dtype=prepared.dtype),
                  y_renumbered=cupy.empty(prepared.shape[0], dtype=prepared.dtype))

    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        cupy = require_cupy()
        ex = prepared.extra
        cupy.take(x, ex["cols"], out=ex["x_renumbered"])
        _INNER.run(ex["inner"], ex["x_renumbered"], ex["y_renumbered"])
        out[ex["rows"]] = ex["y_renumbered"]

    # -- CPU reference ----------------------------------------------------------
    def _prepare_reference(self, prepared: Prepared) -> None:
        rows, cols = orders(prepared.A)
        prepared.extra.update(rows=rows, cols=cols, inner=_INNER.prepare_reference(
            renumbered(prepared.A, rows, cols), prepared.params))

    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        ex = prepared.extra
        y = np.empty(prepared.shape[0], dtype=prepared.dtype)
        y[ex["rows"]] = _INNER.run_reference(ex["inner"], x[ex["cols"]])
        return y


def orders(A: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols): the old number of each new row and of each new column (int32), by reverse
    Cuthill-McKee on the pattern of A + Aᵀ where A is square, else on its bipartite graph."""
    m, n = A.shape
    pattern = sp.csr_matrix((np.ones(A.nnz, dtype=np.int32), A.indices, A.indptr), shape=A.shape)
    if m == n:
        order = reverse_cuthill_mckee(pattern, symmetric_mode=False).astype(np.int32)
        return order, order
    graph = sp.bmat([[None, pattern], [pattern.T, None]], format="csr")
    order = reverse_cuthill_mckee(graph, symmetric_mode=True).astype(np.int32)
    return order[order < m], order[order >= m] - np.int32(m)


def renumbered(A: sp.csr_matrix, rows: np.ndarray, cols: np.ndarray) -> sp.csr_matrix:
    """``A[rows][:, cols]`` in canonical CSR (int32 indices, columns sorted in each row)."""
    B = A[rows][:, cols].tocsr()
    B.sort_indices()
    B.indptr, B.indices = B.indptr.astype(np.int32, copy=False), B.indices.astype(np.int32, copy=False)
    return B
