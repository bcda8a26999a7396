"""Synthetic test matrices: vectorized NumPy, deterministic for a seed.

Each kind stands for a structure that favours a different SpMV kernel (regular
stencils, a dense band, uniform rows, power-law rows, a few huge rows, wide LP
rows, tall and skinny, mostly empty rows, FEM blocks, Kronecker graphs, a band
with dense rows and columns, tall bipartite matrices with clustered columns). :data:`KINDS` declares them in one
place, which the CLI and the docs read; :func:`generate` builds one in the
canonical CSR form of :mod:`tuner.matrix.io`. The same kind, size, options and seed
always give bit-identical ``indptr``, ``indices`` and ``data``. Some kinds take
options that move them across the feature space (``generate("banded", rows=1000,
half_width=32)``): :attr:`Generator.options` lists them with their defaults.

>>> generate("poisson2d", n=3).nnz
33
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from common.errors import InvalidConfigError
from tuner.matrix.io import as_csr

__all__ = ["KINDS", "Generator", "generate"]


@dataclass(frozen=True)
class Generator:
    """One kind of synthetic matrix: its name, a one-line description, and how it is sized.

    ``fn(size, rng, **options)`` builds the matrix (float64 values) from the size
    named by ``size_arg``: ``'n'``, the side of a stencil's grid, or ``'rows'``;
    its keyword parameters after ``rng`` are the kind's options.
    """

    name: str
    doc: str
    size_arg: Literal["n", "rows"]
    default_size: int
    fn: Callable[..., sp.csr_matrix]

    @property
    def options(self) -> dict[str, int | float]:
        """The kind's options and their defaults (``{}`` for a kind without any)."""
        params = list(inspect.signature(self.fn).parameters.values())[2:]
        return {p.name: p.default for p in params}


def generate(
    kind: str,
    *,
    n: int | None = None,
    rows: int | None = None,
    seed: int = 0,
    dtype: Any = "float64",
    **options: int | float,
) -> sp.csr_matrix:
    """Build a synthetic matrix of ``kind`` in canonical CSR form, deterministic for ``seed``.

    Stencils are sized by ``n`` (grid side), the other kinds by ``rows``; with
    neither, the kind's default size is used. ``options`` are the kind's own
    (:attr:`Generator.options`), each a positive number of its default's type.
    An unknown kind or option, the other kind's size argument, or a size or
    seed that is not a positive (non-negative) integer raises
    :class:`~common.errors.InvalidConfigError`.

    >>> generate("banded", rows=100, seed=1).shape
    (100, 100)
    >>> generate("uniform", rows=100, degree=4).nnz <= 400
    True
    """
    generator = KINDS.get(kind)
    if generator is None:
        raise InvalidConfigError(f"unknown matrix kind {kind!r}; choose one of: {', '.join(KINDS)}")
    size = _size(generator, n=n, rows=rows)
    if not _is_int(seed) or seed < 0:
        raise InvalidConfigError(f"seed must be a non-negative integer, got {seed!r}")
    _check_options(generator, options)
    return as_csr(generator.fn(size, np.random.default_rng(seed), **options), dtype=dtype)


def _check_options(generator: Generator, options: dict[str, Any]) -> None:
    """Each option known to ``generator`` and a positive number of its default's type."""
    known = generator.options
    for name, value in options.items():
        if name not in known:
            allowed = ", ".join(known) or "none"
            raise InvalidConfigError(f"{generator.name} has no option {name!r}; its options: {allowed}")
        if isinstance(known[name], int):
            ok = _is_int(value) and value >= 1
        else:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if not ok:
            kind = "integer" if isinstance(known[name], int) else "number"
            raise InvalidConfigError(f"{generator.name}: {name} must be a positive {kind}, got {value!r}")


def _size(generator: Generator, **sizes: int | None) -> int:
    """The size for ``generator`` from its own size argument (the other must be None), or its default."""
    other = "rows" if generator.size_arg == "n" else "n"
    if sizes[other] is not None:
        raise InvalidConfigError(
            f"{generator.name} is sized by {generator.size_arg}=, not {other}= (got {other}={sizes[other]!r})"
        )
    size = sizes[generator.size_arg]
    if size is None:
        return generator.default_size
    if not _is_int(size) or size < 1:
        raise InvalidConfigError(
            f"{generator.name}: {generator.size_arg} must be a positive integer, got {size!r}"
        )
    return int(size)


def _is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# --------------------------------------------------------------------------- building blocks


def _values(rng: np.random.Generator, count: int) -> np.ndarray:
    """Random non-zero values: magnitude uniform in [0.1, 1], random sign."""
    magnitude = rng.uniform(0.1, 1.0, count)
    return np.where(rng.random(count) < 0.5, -magnitude, magnitude)


def _from_rows(
    shape: tuple[int, int], degrees: np.ndarray, cols: np.ndarray, rng: np.random.Generator
) -> sp.csr_matrix:
    """CSR whose row ``i`` holds the next ``degrees[i]`` entries of ``cols``, with random values.

    Duplicate columns in a row merge (so a row may end up shorter), then each
    stored entry gets a value drawn after the structure is final.
    """
    indptr = np.zeros(len(degrees) + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    A = sp.csr_matrix((np.ones(len(cols)), cols, indptr), shape=shape)
    A.sum_duplicates()
    A.data = _values(rng, A.nnz)
    return A


def _uniform_cols(rng: np.random.Generator, degrees: np.ndarray, n_cols: int) -> np.ndarray:
    """``degrees.sum()`` column indices drawn uniformly from ``[0, n_cols)``."""
    return rng.integers(0, n_cols, int(degrees.sum()))


def _random_rows(rows: int, cols: int, degrees: np.ndarray, rng: np.random.Generator) -> sp.csr_matrix:
    """A ``rows x cols`` matrix with rows of the given degrees and uniformly random columns."""
    return _from_rows((rows, cols), degrees, _uniform_cols(rng, degrees, cols), rng)


# --------------------------------------------------------------------------- the kinds


def _laplacian(n: int, dims: int) -> sp.csr_matrix:
    """The (2·dims+1)-point Laplacian on an n^dims grid: 2·dims on the diagonal, -1 to each neighbour.

    It is the sum over the axes of Kronecker products that put the 1-D second
    difference on that axis and the identity on the others.
    """
    second_difference = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n), format="csr")
    identity = sp.identity(n, format="csr")
    total = sp.csr_matrix((n**dims, n**dims))
    for axis in range(dims):
        factors = [second_difference if k == axis else identity for k in range(dims)]
        total = total + functools.reduce(functools.partial(sp.kron, format="csr"), factors)
    return total


def _poisson2d(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """5-point stencil on an n x n grid (n² rows, 5n² - 4n nonzeros)."""
    return _laplacian(n, 2)


def _poisson3d(n: int, rng: np.random.Generator) -> sp.csr_matrix:
    """7-point stencil on an n x n x n grid (n³ rows, 7n³ - 6n² nonzeros)."""
    return _laplacian(n, 3)


def _banded(rows: int, rng: np.random.Generator, half_width: int = 8) -> sp.csr_matrix:
    """Every entry within ``half_width`` of the diagonal (17 per interior row)."""
    cols = np.arange(rows)[:, None] + np.arange(-half_width, half_width + 1)[None, :]
    inside = (cols >= 0) & (cols < rows)
    return _from_rows((rows, rows), inside.sum(axis=1), cols[inside], rng)


def _uniform(rows: int, rng: np.random.Generator, degree: int = 16) -> sp.csr_matrix:
    """``degree`` (16) uniformly random columns per row (fewer where two coincide)."""
    return _random_rows(rows, rows, np.full(rows, degree), rng)


def _powerlaw(rows: int, rng: np.random.Generator, shape: float = 1.8, minimum: int = 5) -> sp.csr_matrix:
    """Pareto row degrees (shape 1.8, minimum 5: mean about 11, capped at the column count) and
    columns skewed towards low indices (hub columns), like a scale-free graph."""
    degrees = np.minimum(np.floor(minimum * (1.0 + rng.pareto(shape, rows))).astype(np.int64), rows)
    cols = np.floor(rows * rng.random(int(degrees.sum())) ** 2).astype(np.int64)
    return _from_rows((rows, rows), degrees, cols, rng)


def _fewhuge(rows: int, rng: np.random.Generator, huge: int = 4, huge_len: int = 100_000) -> sp.csr_matrix:
    """Rows of 4 random nonzeros, plus ``huge`` random rows of min(cols, huge_len) distinct ones."""
    length = min(rows, huge_len)
    huge_rows = rng.choice(rows, size=min(huge, rows), replace=False)
    degrees = np.full(rows, 4)
    degrees[huge_rows] = length
    cols = _uniform_cols(rng, degrees, rows)
    starts = np.concatenate(([0], np.cumsum(degrees)[:-1]))
    spread = np.arange(length) * rows // length  # distinct, evenly spread over the columns
    offsets = rng.integers(0, rows, len(huge_rows))
    cols[starts[huge_rows][:, None] + np.arange(length)] = (offsets[:, None] + spread) % rows
    return _from_rows((rows, rows), degrees, cols, rng)


def _lp(rows: int, rng: np.random.Generator, median: float = 12.0, width: int = 8) -> sp.csr_matrix:
    """Wide LP-like constraints: rows x width·rows (8), log-normal row lengths (median 12, a long tail)."""
    cols = width * rows
    degrees = np.clip(np.rint(rng.lognormal(np.log(median), 1.2, rows)), 1, cols).astype(np.int64)
    return _random_rows(rows, cols, degrees, rng)


def _tallskinny(rows: int, rng: np.random.Generator) -> sp.csr_matrix:
    """rows x max(rows // 1000, 8), 1 to 4 random nonzeros per row."""
    return _random_rows(rows, max(rows // 1000, 8), rng.integers(1, 5, rows), rng)


def _emptyrows(rows: int, rng: np.random.Generator, empty: float = 0.7, lo: int = 8, hi: int = 32
               ) -> sp.csr_matrix:
    """A fraction ``empty`` (70%) of the rows empty, the others ``lo`` to ``hi`` (8 to 32) random nonzeros."""
    if not empty < 1.0:
        raise InvalidConfigError(f"emptyrows: empty must be a fraction below 1, got {empty!r}")
    if lo > hi:
        raise InvalidConfigError(f"emptyrows: lo must not exceed hi, got lo={lo!r}, hi={hi!r}")
    degrees = np.where(rng.random(rows) < empty, 0, rng.integers(lo, hi + 1, rows))
    return _random_rows(rows, rows, degrees, rng)



def _blockfem(rows: int, rng: np.random.Generator, block: int = 3, points: int = 27) -> sp.csr_matrix:
    """FEM-like: ``block`` x ``block`` dense blocks (unknowns per node) on a 3-D grid of nodes joined by a
    ``points``-point stencil (27: every neighbour in the 3x3x3 box; 7: the faces), about ``rows`` rows."""
    if points not in (7, 27):
        raise InvalidConfigError(f"blockfem: points must be 7 or 27, got {points!r}")
    side = max(2, round((rows / block) ** (1.0 / 3.0)))
    if points == 27:
        path = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(side, side), format="csr")
        nodes = sp.kron(sp.kron(path, path, format="csr"), path, format="csr")
    else:
        nodes = _laplacian(side, 3)
    A = sp.kron(nodes, np.ones((block, block)), format="csr")
    A.data = _values(rng, A.nnz)
    return A


def _kronecker(rows: int, rng: np.random.Generator, edge_factor: int = 16, a: float = 0.57, b: float = 0.19,
               c: float = 0.19) -> sp.csr_matrix:
    """An R-MAT (Kronecker) graph as Graph500 draws it: ``edge_factor`` x rows edges, each placed by
    recursive quadrant choice with probabilities a, b, c, 1-a-b-c over 2^k vertices, the vertices relabelled
    at random and scaled onto ``rows`` (heavy-tailed degrees in rows and columns, no locality)."""
    if not a + b + c < 1.0:
        raise InvalidConfigError(f"kronecker: a + b + c must be below 1, got {a + b + c!r}")
    scale = max(1, math.ceil(math.log2(rows)))
    edges = edge_factor * rows
    src = np.zeros(edges, dtype=np.int64)
    dst = np.zeros(edges, dtype=np.int64)
    for _ in range(scale):
        r = rng.random(edges, dtype=np.float32)
        src = 2 * src + (r >= a + b)
        dst = 2 * dst + (((r >= a) & (r < a + b)) | (r >= a + b + c))
    relabel = rng.permutation(1 << scale)
    src = relabel[src] * rows >> scale
    dst = relabel[dst] * rows >> scale
    order = np.argsort(src, kind="stable")
    return _from_rows((rows, rows), np.bincount(src, minlength=rows), dst[order], rng)


def _arrowband(rows: int, rng: np.random.Generator, half_width: int = 3, dense: int = 64,
               dense_frac: float = 0.02) -> sp.csr_matrix:
    """A band of ``half_width`` plus ``dense`` random rows and as many random columns holding ``dense_frac``
    of their entries each (spread over the whole row or column): a few long rows and many short ones."""
    band = _banded(rows, rng, half_width=half_width)
    k = min(dense, rows)
    length = max(1, min(rows, round(dense_frac * rows)))
    lines = rng.choice(rows, size=k, replace=False)
    others = np.sort(rng.random((k, length)) * rows, axis=1).astype(np.int64)  # spread positions
    r = np.concatenate([np.repeat(lines, length), others.ravel()])
    cc = np.concatenate([others.ravel(), np.repeat(lines, length)])
    extra = sp.csr_matrix((np.ones(r.size), (r, cc)), shape=(rows, rows))
    A = (band + extra).tocsr()
    A.sum_duplicates()
    A.data = _values(rng, A.nnz)
    return A


def _bipartite(rows: int, rng: np.random.Generator, ratio: int = 40, degree: int = 8,
               zipf: float = 1.2) -> sp.csr_matrix:
    """Tall rows x (rows // ratio): 1 to 2·degree entries a row, columns drawn from a Zipf law of exponent
    ``zipf`` whose popular columns sit together at the low indices (users x items, clustered hot items)."""
    cols = max(rows // ratio, 8)
    degrees = rng.integers(1, 2 * degree + 1, rows)
    u = rng.random(int(degrees.sum()))
    s = 1.0 - zipf
    x = ((cols**s - 1.0) * u + 1.0) ** (1.0 / s) if abs(s) > 1e-9 else cols**u  # truncated power law on [1, cols]
    return _from_rows((rows, cols), degrees, np.minimum(x.astype(np.int64) - 1, cols - 1).clip(0), rng)


KINDS: dict[str, Generator] = {
    g.name: g
    for g in (
        Generator("poisson2d", "5-point Poisson stencil on an n x n grid (4 / -1)", "n", 1024, _poisson2d),
        Generator("poisson3d", "7-point Poisson stencil on an n x n x n grid (6 / -1)", "n", 100, _poisson3d),
        Generator("banded", "dense band of half-width 8 (17 nonzeros per row)", "rows", 1 << 18, _banded),
        Generator("uniform", "16 uniformly random columns per row", "rows", 1 << 18, _uniform),
        Generator("powerlaw", "Pareto row degrees (mean ~11), skewed columns", "rows", 1 << 18, _powerlaw),
        Generator("fewhuge", "4 nonzeros per row plus 4 rows of up to 100k", "rows", 1 << 18, _fewhuge),
        Generator("lp", "wide LP-like rows x 8·rows, log-normal row lengths", "rows", 1 << 15, _lp),
        Generator("tallskinny", "rows x max(rows//1000, 8), 1 to 4 per row", "rows", 1 << 20, _tallskinny),
        Generator("emptyrows", "70% empty rows, the others 8-32 nonzeros", "rows", 1 << 18, _emptyrows),
        Generator("blockfem", "3x3 dense blocks on a 27-point 3-D mesh of nodes (FEM)", "rows", 1 << 18, _blockfem),
        Generator("kronecker", "R-MAT graph, 16 edges a vertex (Graph500's Kronecker)", "rows", 1 << 18, _kronecker),
        Generator("arrowband", "band of half-width 3 plus 64 dense-ish rows and columns", "rows", 1 << 18,
                  _arrowband),
        Generator("bipartite", "tall rows x rows/40, Zipf columns clustered at low indices", "rows", 1 << 20,
                  _bipartite),
    )
}
"""Every synthetic kind, by name: the one place the CLI and the docs read."""
