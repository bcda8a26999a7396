"""Graph algorithms built on the tuned products: breadth-first search on SpMSpV.

>>> import scipy.sparse as sp
>>> path = sp.diags([1.0, 1.0], [-1, 1], shape=(5, 5), format="csr")   # 0 - 1 - 2 - 3 - 4
>>> bfs(path, 1).tolist()
[1, 0, 1, 2, 3]
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import scipy.sparse as sp

from db.store import Store
from tuner.execute.spmspv import SpMSpVExecutor, plan_spmspv
from tuner.matrix.io import as_csr


def frontier_matrix(A: Any) -> sp.csr_matrix:
    """B = pattern(A)ᵀ in float32 with ones, so that y = B·x is nonzero at the out-neighbours of x's vertices.

    A[i, j] != 0 is an edge i -> j (SciPy's csgraph convention).
    """
    A = as_csr(A)
    if A.shape[0] != A.shape[1]:
        raise ValueError(f"bfs needs a square adjacency matrix, got shape {A.shape}")
    pattern = sp.csr_matrix((np.ones(A.nnz, dtype=np.float32), A.indices, A.indptr), shape=A.shape)
    return as_csr(pattern.T.tocsr())


def bfs(A: Any, source: int, *, mode: str | None = None, executor: SpMSpVExecutor | None = None,
        db: str | os.PathLike | Store | None = None) -> np.ndarray:
    """Level of every vertex in a breadth-first search from ``source`` (-1 where unreachable).

    Each step is one SpMSpV, y = B·x with x the frontier; the executor picks the
    sparse or dense mode per step by the frontier's size (``mode`` forces one).
    Pass ``executor=plan_spmspv(frontier_matrix(A))`` to reuse one across searches.
    """
    ex = executor or plan_spmspv(frontier_matrix(A), db=db)
    n = ex.shape[0]
    if ex.shape != (n, n):
        raise ValueError(f"bfs needs a square matrix, got shape {ex.shape}")
    if not 0 <= int(source) < n:
        raise ValueError(f"source {source} is outside [0, {n})")
    xp = ex.xp
    levels = xp.full(n, -1, dtype=xp.int32)
    levels[int(source)] = 0
    frontier = xp.asarray([int(source)], dtype=xp.int32)
    depth = 0
    while frontier.shape[0]:
        depth += 1
        reached, _ = ex.run(frontier, xp.ones(frontier.shape[0], dtype=ex.dtype), mode=mode)
        frontier = reached[levels[reached] < 0]
        levels[frontier] = depth
    return levels if xp is np else levels.get()


__all__ = ["bfs", "frontier_matrix"]
