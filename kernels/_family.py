"""The kernel contract every family implements (see DESIGN.md, "The kernel contract").

A family is a stateless object with a name, a declared parameter space and two
paths that compute the same decomposition:

- the GPU path: ``prepare(A, params)`` once (A a ``cupyx.scipy.sparse.csr_matrix``),
  then ``run(prepared, x, out=None)`` per product;
- the CPU reference: ``prepare_reference(A, params)`` (A a SciPy CSR) and
  ``run_reference(prepared, x)``, in NumPy, reproducing the partitioning so it is
  tested on any machine and the GPU result is checked against it.

The base class does the checks common to every family (shapes, dtypes, the
trivial cases) so that each family writes only its decomposition.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kernels._cuda import require_cupy
from kernels._space import Space, Value


@dataclass
class Prepared:
    """What ``prepare`` hands to ``run``: the matrix, the config, family-specific arrays.

    ``extra`` holds the family's own arrays (device arrays on the GPU path, NumPy
    arrays on the CPU path); ``extra_bytes`` is their memory beyond the CSR arrays.
    """

    family: str
    params: dict[str, Value]
    shape: tuple[int, int]
    nnz: int
    dtype: np.dtype
    A: Any
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def extra_bytes(self) -> int:
        return int(sum(getattr(v, "nbytes", 0) for v in self.extra.values()))

    def ratio_to_csr(self, keys: Iterable[str]) -> float:
        """Bytes of the ``extra`` arrays named ``keys`` (those present) over the CSR arrays' (indptr, indices,
        data): a family's memory beyond the matrix."""
        csr = self.A.indptr.nbytes + self.A.indices.nbytes + self.A.data.nbytes
        return sum(self.extra[k].nbytes for k in keys if k in self.extra) / csr


class Family(ABC):
    """Base of every kernel family; subclasses set the class attributes and the four hooks."""

    name: ClassVar[str]
    space: ClassVar[Space]
    summary: ClassVar[str]
    source: ClassVar[str]
    cu_file: ClassVar[str | None] = None
    prepare_spmvs: ClassVar[float | None] = None
    """What a preparation costs, in SpMVs of the prepared matrix, where no selector has measured it: a race
    where the selector ranks none of the family's configs (:meth:`unranked_config`) takes an entrant above
    :data:`tuner.execute.race.CHEAP_SPMVS` as costly to prepare. None: about as cheap as a product."""
    row_columns: ClassVar[bool] = False
    """Whether its preparation takes the 16-bit columns of the matrix's own rows where its ``indices`` are narrow
    (:func:`kernels._narrow.attach` over ``A.indptr``): those ``plan()`` may write ahead of it
    (:func:`kernels._narrow.rows_written_once`)."""
    adapt_first: ClassVar[str | None] = None
    """The parameter :meth:`adapt` fits first (NuT: its slabs, to the L2): of the configs a selector ranks,
    those with it right already are the ones to fit further (:func:`tuner.execute.race.adapted`)."""

    def unranked_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """The config a race at plan time measures where the selector ranks none of the family's (one added
        after the selector was trained), on a matrix of these features (None: unknown) with values of
        ``itemsize`` bytes; None where the family does not race there. Here: its default, everywhere."""
        return self.space.defaults()

    def judged_config(self, features: Mapping[str, float] | None, itemsize: int) -> dict[str, Value] | None:
        """The config whose times teach a second opinion on the family (:mod:`tuner.select.gate`: where is the
        config it answers with, :meth:`unranked_config`, faster than the ranking's first?). Here that config."""
        return self.unranked_config(features, itemsize)

    def unranked_configs(self, features: Mapping[str, float] | None, itemsize: int) -> list[dict[str, Value]]:
        """Every config a race at plan time enters where the selector ranks none of the family's
        (:func:`tuner.execute.race.unranked_entrants`): here :meth:`unranked_config`, none where it is None."""
        config = self.unranked_config(features, itemsize)
        return [] if config is None else [config]

    def unranked_seeds(self, features: Mapping[str, float] | None, itemsize: int) -> list[dict[str, Value]]:
        """What a search measures first of a family no selector ranks (:func:`tuner.execute.race.search_seeds`):
        here the configs a race enters (:meth:`unranked_configs`)."""
        return self.unranked_configs(features, itemsize)

    def fitted_configs(self, features: Mapping[str, float] | None, itemsize: int) -> list[dict[str, Value]]:
        """Configs a race at plan time enters beside those the selector ranks of this family, on a matrix of these
        ``features`` with values of ``itemsize`` bytes: where the family knows a config that fits such a matrix
        and its corpus taught the selector none (the ranked family's counterpart of :meth:`unranked_configs`;
        :func:`tuner.execute.race.fitted_entrants`). Here: none."""
        return []

    def name_expressions(self, dtype: Any) -> tuple[str, ...]:
        """Template instantiations compiled from ``cu_file`` for ``dtype`` (empty: no CUDA source)."""
        return ()

    def adapt(self, params: Mapping[str, Any], *, cols: int, itemsize: int, l2_bytes: int) -> dict[str, Value] | None:
        """``params`` fitted to a matrix of ``cols`` columns of ``itemsize``-byte values on a GPU with
        ``l2_bytes`` of L2, where the family knows how (a race at plan time times it beside ``params``, a
        search measures it right after); None where it does not, or ``params`` fit already. Beyond what a
        selector learned from its corpus."""
        return None

    def joined(self, params: Mapping[str, Any], *, itemsize: int) -> dict[str, Value]:
        """The config a race enters where it adds ``params`` of this family to the selector's shortlist (a family
        with :attr:`adapt_first`, on a matrix :meth:`adapt` leaves as it is: :func:`tuner.execute.race.adapted`),
        for values of ``itemsize`` bytes. Here: ``params``, as the family's space reads them."""
        return self.space.validate(params, family=self.name)

    def uncapturable(self, params: Mapping[str, Any]) -> str | None:
        """Why a product of ``params`` is not to be captured into a CUDA graph (``Executor.bind`` then runs it
        as it is); None where it may be."""
        return None

    # -- GPU path ---------------------------------------------------------------
    def prepare(self, A: Any, params: Mapping[str, Any] | None = None) -> Prepared:
        """One-time setup on the GPU for a canonical ``cupyx`` CSR matrix."""
        config = self.space.validate(params or {}, family=self.name)
        prepared = Prepared(self.name, config, tuple(A.shape), int(A.nnz), np.dtype(A.dtype), A)
        if prepared.nnz and prepared.shape[0]:
            self._prepare(prepared)
        return prepared

    def run(self, prepared: Prepared, x: Any, out: Any = None) -> Any:
        """y = A·x on the GPU; ``out`` (a CuPy array of the right shape and dtype) is reused."""
        cupy = require_cupy()
        x = _check_vector(prepared, x, cupy)
        if out is None:
            out = cupy.empty(prepared.shape[0], dtype=prepared.dtype)
        else:
            _check_out(prepared, out, cupy)
        if prepared.nnz == 0:
            out.fill(0)
        elif prepared.shape[0]:
            self._run(prepared, x, out)
        return out

    @abstractmethod
    def _prepare(self, prepared: Prepared) -> None:
        """Fill ``prepared.extra`` (called only for nnz > 0)."""

    @abstractmethod
    def _run(self, prepared: Prepared, x: Any, out: Any) -> None:
        """Launch the kernel(s) writing every element of ``out`` (nnz > 0)."""

    # -- CPU reference ----------------------------------------------------------
    def prepare_reference(self, A: Any, params: Mapping[str, Any] | None = None) -> Prepared:
        """The same decomposition in NumPy, for a canonical SciPy CSR matrix."""
        config = self.space.validate(params or {}, family=self.name)
        prepared = Prepared(self.name, config, tuple(A.shape), int(A.nnz), np.dtype(A.dtype), A)
        if prepared.nnz and prepared.shape[0]:
            self._prepare_reference(prepared)
        return prepared

    def run_reference(self, prepared: Prepared, x: Any, out: np.ndarray | None = None) -> np.ndarray:
        """y = A·x through the family's decomposition, on the CPU."""
        x = _check_vector(prepared, x, np)
        y = self._run_reference(prepared, x) if prepared.nnz and prepared.shape[0] else None
        if out is None:
            out = np.empty(prepared.shape[0], dtype=prepared.dtype)
        else:
            _check_out(prepared, out, np)
        out[...] = 0 if y is None else y
        return out

    @abstractmethod
    def _prepare_reference(self, prepared: Prepared) -> None:
        """Fill ``prepared.extra`` with the decomposition's NumPy arrays."""

    @abstractmethod
    def _run_reference(self, prepared: Prepared, x: np.ndarray) -> np.ndarray:
        """Return y (any float dtype; cast by the caller)."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "source": self.source,
            "params": self.space.to_dict(),
        }

    def __repr__(self) -> str:
        return f"<kernel family {self.name!r}: {self.summary}>"


def _check_vector(prepared: Prepared, x: Any, xp: Any) -> Any:
    n = prepared.shape[1]
    if getattr(x, "ndim", None) != 1 or x.shape[0] != n:
        raise ValueError(f"x must be a vector of length {n} (A is {prepared.shape}), got shape {x.shape}")
    if x.dtype != prepared.dtype:
        raise ValueError(f"x has dtype {x.dtype}, the prepared matrix has {prepared.dtype}")
    if not isinstance(x, xp.ndarray):
        raise TypeError(f"x must be a {xp.__name__} array on this path, got {type(x).__name__}")
    return xp.ascontiguousarray(x)


def _check_out(prepared: Prepared, out: Any, xp: Any) -> None:
    if not isinstance(out, xp.ndarray) or out.shape != (prepared.shape[0],) or out.dtype != prepared.dtype:
        raise ValueError(
            f"out must be a contiguous {xp.__name__} array of shape ({prepared.shape[0]},) and dtype "
            f"{prepared.dtype}, got {type(out).__name__} {getattr(out, 'shape', None)} "
            f"{getattr(out, 'dtype', None)}"
        )
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
