"""``plan_renumbered(A)``: y = A·x in a numbering of A's own, for a caller whose vectors stay in it.

The columns of a graph with hubs (a power-law or Kronecker graph, a web or
citation graph) are read very unevenly: a few columns hold most entries, and
their values of x, scattered over all of it, share cache lines with values
hardly read. Numbered first, most read first, the hubs' values share a few
lines that stay in cache: ``B = P A Pᵀ``, one order for rows and columns
(:func:`hub_order`; every other vertex keeps its place, so the rest of the
numbering keeps whatever locality it has; or every vertex by its readers,
``order="degree"``, which packs x's reused values tighter where the numbering
has no locality to keep, and scatters it where it has). But moving x into that order and y
out of it costs about what B saves (the H100 probes of stops 46 and 47 in
``bench/results``, ``probe_degree_order`` and ``probe_column_order``), so no
kernel of ``plan(A)`` renumbers. A caller that keeps its vectors in B's
numbering through an iteration pays those moves once: PageRank, a power
iteration, a Krylov solver (their vector operations do not care about the
order)::

    ex = plan_renumbered(A)             # B renumbered, then plan(B): raced, stored
    x = ex.to_internal(x0)              # once, before
    for _ in range(iterations):
        x = ex(x)                       # y = B·x, in B's numbering
        x /= cupy.linalg.norm(x)
    result = ex.from_internal(x)        # once, after

Which order pays depends on the graph: the default ``order="best"`` plans B
in both (where the effort measures a product: ``race`` or ``tune``, on a GPU;
else hubs first) and keeps the faster; ``bench/unseen.py --renumbered`` races
B's plan against cuSPARSE on A. B is a copy of A (its memory besides A's; two
copies while both orders are planned), found again in the store by its own
fingerprint: a second ``plan_renumbered`` of the same matrix answers from the
store (and of a matrix without hubs, B is A, stored as A is).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from db.store import Store
from kernels._cuda import gpu_available
from kernels.rcm import renumbered, renumbered_on_gpu
from tuner.execute.executor import Executor
from tuner.execute.plan import check_effort, plan
from tuner.execute.replay import BoundProduct
from tuner.matrix.io import as_csr, as_device_csr

__all__ = ["ORDERS", "RenumberedExecutor", "hub_order", "plan_renumbered"]


HUB_FACTOR = 2.0
"""A column read by more than this many times the mean column's rows is a hub (:func:`hub_order`)."""

ORDERS = {"hubs": HUB_FACTOR, "degree": 0.0}
"""The orders :func:`plan_renumbered` renumbers by: the :func:`hub_order` factor of each (0: every vertex read
at all is a hub, so all are sorted by their readers)."""


def hub_order(A: Any, factor: float = HUB_FACTOR) -> Any:
    """The vertices of a square matrix's graph with its hubs first (columns read by more than ``factor`` times
    the mean column's rows), most read first, then every other vertex in A's order, ties by number:
    ``order[new] = old`` (int32), a NumPy array for a SciPy ``A``, a CuPy one for a cupyx one (the same steps).
    The hubs' values of x then share a few lines of cache, and the rest keeps whatever locality A's numbering
    has; a matrix without hubs keeps its order. ``factor=0``: every vertex by its readers."""
    xp = _module(A.indices)
    n = A.shape[1]
    counts = xp.bincount(A.indices, minlength=n).astype(np.int64)
    hub = counts * n > factor * A.nnz
    # one key a vertex, hubs by fewest missing entries, then the others, each then by number: unique, so any
    # sort gives the same order
    key = xp.where(hub, A.nnz - counts, A.nnz + 1) * n + xp.arange(n, dtype=np.int64)
    return xp.argsort(key).astype(np.int32)


class RenumberedExecutor:
    """y = ex(x) for ``B = P A Pᵀ`` (A renumbered by :func:`hub_order`): x and y in B's numbering.
    :meth:`to_internal` and :meth:`from_internal` move a vector of A's numbering into B's and back; ``inner``
    is B's :class:`~tuner.execute.executor.Executor` (its kernel, source, race and cost)."""

    def __init__(self, inner: Executor, order: Any, renumber_s: float, *, name: str = "hubs",
                 others: dict[str, float | None] | None = None) -> None:
        self.inner = inner
        self.shape, self.dtype, self.nnz = inner.shape, inner.dtype, inner.nnz
        self.order = _host(order)  # order[new] = old
        self.order_name = name  # which of ORDERS
        self.others = dict(others or {})  # the other orders planned, with their product's measured seconds
        self._device_order = None if isinstance(order, np.ndarray) else order
        self.renumber_s = renumber_s  # seconds to order A and build B (each order tried), before plan(B)

    def __call__(self, x: Any, out: Any = None) -> Any:
        """y = B·x, both in B's numbering (NumPy in, NumPy out; CuPy in, CuPy out)."""
        return self.inner(x, out)

    def bind(self, x: Any, out: Any = None) -> BoundProduct:
        """y = B·x for this very x (B's numbering), bound for a loop: :meth:`Executor.bind` of ``inner``."""
        return self.inner.bind(x, out)

    def to_internal(self, v: Any) -> Any:
        """``v`` (A's numbering) in B's: ``v[order]``, in v's module."""
        return v[self._order_for(v)]

    def from_internal(self, v: Any, out: Any = None) -> Any:
        """``v`` (B's numbering) in A's, into ``out`` when given: ``out[order] = v``."""
        order = self._order_for(v)
        if out is None:
            out = _module(v).empty_like(v)
        out[order] = v
        return out

    def _order_for(self, v: Any) -> Any:
        if getattr(v, "shape", None) != (self.shape[0],):
            raise ValueError(f"the vector must have shape ({self.shape[0]},) for A of shape {self.shape}, "
                             f"got {getattr(v, 'shape', type(v).__name__)}")
        if _module(v) is np:
            return self.order
        if self._device_order is None:
            self._device_order = _module(v).asarray(self.order)
        return self._device_order

    def explain(self) -> str:
        """B's executor's explanation, after how A was renumbered."""
        how = "with its hubs first" if self.order_name == "hubs" else "by its columns' readers"
        others = "".join(f"; by {name}: {t * 1e6:.1f} us a product" if t else f"; by {name}: not measured"
                         for name, t in self.others.items())
        return (f"A renumbered {how} (rows and columns in one order, the most read columns first) in "
                f"{self.renumber_s * 1e3:.1f} ms{others}; vectors in that numbering (to_internal, "
                "from_internal).\n" + self.inner.explain())

    def __repr__(self) -> str:
        return f"RenumberedExecutor({self.inner!r})"


def plan_renumbered(A: Any, *, dtype: str | None = None, db: str | os.PathLike | Store | None = None,
                    effort: str = "race", trials: int | None = None, race_size: int = 4,
                    order: str = "best") -> RenumberedExecutor:
    """Renumber a square ``A`` (as :func:`~tuner.execute.plan.plan` takes it) by ``order`` (one of
    :data:`ORDERS`, or ``"best"``: each, where ``effort`` measures a product, keeping the faster; else hubs
    first), then ``plan()`` the renumbered matrix with these arguments (see the module's doc). On the GPU where
    there is one, else with SciPy. ValueError for a matrix that is not square (x and y share one numbering), an
    unknown ``order`` and what ``plan()`` refuses, before any work."""
    check_effort(effort, trials, race_size)
    if order not in (*ORDERS, "best"):
        raise ValueError(f"unknown order {order!r}: one of {', '.join(map(repr, (*ORDERS, 'best')))}")
    start = time.perf_counter()
    on_gpu = gpu_available()
    M = as_device_csr(A, dtype=dtype) if on_gpu else as_csr(A, dtype=dtype)
    if M.shape[0] != M.shape[1]:
        raise ValueError(f"plan_renumbered needs a square matrix (x and y share one numbering); A is "
                         f"{M.shape[0]} x {M.shape[1]}: use plan()")
    names = list(ORDERS) if order == "best" and effort != "predict" and on_gpu else \
        ["hubs" if order == "best" else order]
    planned, renumber_s = {}, time.perf_counter() - start
    for name in names:
        start = time.perf_counter()
        numbering, B = _renumbered(M, ORDERS[name], on_gpu)
        renumber_s += time.perf_counter() - start
        planned[name] = numbering, plan(B, dtype=dtype, db=db, effort=effort, trials=trials, race_size=race_size)
        del B  # plan()'s executor holds what it runs
    times = {name: ex.choice.time_s for name, (_, ex) in planned.items()}
    best = min(names, key=lambda name: times[name] or math.inf)
    numbering, inner = planned[best]
    return RenumberedExecutor(inner, numbering, renumber_s, name=best,
                              others={name: t for name, t in times.items() if name != best})


def _renumbered(M: Any, factor: float, on_gpu: bool) -> tuple[Any, Any]:
    """(order, B): :func:`hub_order` of M with ``factor`` and M renumbered by it, canonical (M itself where the
    order is M's)."""
    order = hub_order(M, factor)
    B = M  # without hubs, A itself (no copy)
    if bool((order != _module(order).arange(len(order), dtype=np.int32)).any()):
        B = renumbered_on_gpu(M, order, order) if on_gpu else renumbered(M, order, order)
        # each row's entries by their new columns (canonical, as plan() takes it in place): transposed twice,
        # as the GPU's sort of each row took 5x longer (H100, stop 47: 21 ms against 4 on the unseen hubcols)
        B = B.T.tocsr().T.tocsr()
    if on_gpu:
        _module(order).cuda.Device().synchronize()
    return order, B


def _module(a: Any) -> Any:
    """NumPy or CuPy, whichever ``a`` belongs to (CuPy imported only for a CuPy array)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _host(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()
