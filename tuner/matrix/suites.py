"""Named suites of generated matrices: for the benchmark, and the corpus the selector learns from.

``small`` runs anywhere in seconds (CI, ``--device cpu-reference``); ``large``
is sized for a GPU: 10 M to 100 M nonzeros, x well above a 50 MB L2 for the
power-law and LP cases; ``graphs``: power-law graphs of 12 M and 16 M rows
(over 100 M nonzeros each); ``issue18``: the six structures issue #18 names, at its sizes (a 3 x 3-block FEM
matrix, an R-MAT graph, a band with dense rows and columns, a tall 8 M x 200 K bipartite matrix with clustered
columns, 40 % empty rows, a wide 20 K x 4 M LP matrix). ``corpus`` (:func:`corpus`) is the selector's training
set and ``corpus-smoke`` one small matrix of each kind from it, to try the
corpus pipeline on a CPU; ``corpus-more`` (:func:`corpus_more`) its second part,
the structures the first lacks and every kind above 10 M nonzeros, with its own
``corpus-more-smoke``. Each entry is (kind, size, options, seed):
deterministic, so two runs of a suite measure the same matrices, and a worker
builds each one itself (nothing is written to disk).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import scipy.sparse as sp

from common.errors import InvalidConfigError
from tuner.matrix.generate import KINDS, generate

__all__ = ["SUITES", "SuiteMatrix", "approx_nnz", "corpus", "suite"]


@dataclass(frozen=True)
class SuiteMatrix:
    """One generated matrix: ``generate(kind, <size_arg>=size, seed=seed, **dict(options))``."""

    kind: str
    size: int
    seed: int = 1
    options: tuple[tuple[str, int | float], ...] = ()

    @property
    def name(self) -> str:
        """``kind-size``, then each option as ``-namevalue`` and a seed other than 1 as ``-sN``."""
        opts = "".join(f"-{k}{v:g}" for k, v in self.options)
        return f"{self.kind}-{self.size}{opts}" + (f"-s{self.seed}" if self.seed != 1 else "")

    @property
    def key(self) -> str:
        """What identifies the matrix without building it (``tune-many`` skips done studies by it)."""
        opts = ",".join(f"{k}={v!r}" for k, v in self.options)
        return f"generate:{self.kind}:{KINDS[self.kind].size_arg}={self.size}:{opts}:seed={self.seed}"

    def build(self, dtype: str = "float64") -> sp.csr_matrix:
        arg = KINDS[self.kind].size_arg
        return generate(self.kind, **{arg: self.size}, seed=self.seed, dtype=dtype, **dict(self.options))


def approx_nnz(kind: str, size: int, options: Mapping[str, Any] | None = None) -> float:
    """The nonzeros ``generate`` gives for a kind, size and options, within ~15%: for sizing suites
    without building their matrices."""
    o = {**KINDS[kind].options, **(options or {})}
    if kind == "poisson2d":
        return 5.0 * size**2 - 4.0 * size
    if kind == "poisson3d":
        return 7.0 * size**3 - 6.0 * size**2
    if kind == "banded":  # the band less its two corners
        h = min(o["half_width"], size - 1)
        return size * (2.0 * h + 1.0) - h * (h + 1.0)
    if kind == "uniform":  # distinct columns among `degree` uniform draws
        return size * size * -math.expm1(o["degree"] * math.log1p(-1.0 / size)) if size > 1 else 1.0
    per_row = {
        # floor(minimum * (1 + Pareto(shape))): mean minimum * shape / (shape - 1) - 1/2, less merged duplicates
        "powerlaw": lambda: 0.95 * (o["minimum"] * o["shape"] / max(o["shape"] - 1.0, 0.2) - 0.5),
        "lp": lambda: 2.05 * o.get("median", 0),  # log-normal with sigma 1.2: mean = median * e^0.72
        "tallskinny": lambda: 2.5,
        "emptyrows": lambda: (o["lo"] + o["hi"]) / 2.0 * (1.0 - o.get("empty", 0)),
        "blockfem": lambda: o["points"] * o["block"] * 0.9,  # fewer neighbours on the mesh's faces
        "kronecker": lambda: 0.95 * o["edge_factor"],  # less the duplicate edges among hubs
        "bipartite": lambda: o["degree"] + 0.5,
    }
    if kind == "fewhuge":
        return 4.0 * size + min(o["huge"], size) * min(size, o["huge_len"])
    if kind == "arrowband":
        return size * (2.0 * o["half_width"] + 1.0) + 2.0 * min(o["dense"], size) * max(1.0, o["dense_frac"] * size)
    return per_row[kind]() * size


def _size_for(kind: str, nnz: float, options: Mapping[str, Any]) -> int:
    """The smallest size whose :func:`approx_nnz` reaches ``nnz`` (bisection; sizes are monotone)."""
    lo, hi = 1, 2
    while approx_nnz(kind, hi, options) < nnz:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if approx_nnz(kind, mid, options) < nnz else (lo, mid)
    return lo


# Every kind, and options that move it across the feature space (nonzeros per row 1 to 129, row-length
# CV 0 to ~75, empty rows 0 to 95%): 24 variants.
CORPUS_VARIANTS: tuple[tuple[str, tuple[tuple[str, int | float], ...]], ...] = (
    ("poisson2d", ()),
    ("poisson3d", ()),
    *(("banded", (("half_width", h),)) for h in (1, 3, 8, 24, 64)),
    *(("uniform", (("degree", d),)) for d in (2, 6, 16, 48, 128)),
    ("powerlaw", ()),
    ("powerlaw", (("shape", 1.3), ("minimum", 2))),
    ("powerlaw", (("shape", 2.5), ("minimum", 12))),
    ("fewhuge", ()),
    ("fewhuge", (("huge", 64), ("huge_len", 5000))),
    ("lp", ()),
    ("lp", (("median", 4.0),)),
    ("lp", (("median", 48.0),)),
    ("tallskinny", ()),
    ("emptyrows", ()),
    ("emptyrows", (("empty", 0.3),)),
    ("emptyrows", (("empty", 0.95),)),
)
CORPUS_TIERS: tuple[tuple[float, float, int], ...] = ((1e4, 3e5, 6), (3e5, 3e6, 3))
"""(lowest nnz, highest nnz, matrices per variant): log-spaced, shifted per variant so no two coincide."""
CORPUS_LARGE: tuple[tuple[str, tuple[tuple[str, int | float], ...]], ...] = (
    *((kind, ()) for kind in dict.fromkeys(kind for kind, _ in CORPUS_VARIANTS)),  # the kinds of its time
    ("banded", (("half_width", 64),)),
    ("uniform", (("degree", 128),)),
    ("lp", (("median", 48.0),)),
)
"""One large matrix each, 3 M to 50 M nonzeros log-spaced in this order."""
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def corpus() -> tuple[SuiteMatrix, ...]:
    """The selector's training corpus: 228 generated matrices of 10 K to 50 M nonzeros, fewest first.

    The first nine kinds of :data:`tuner.matrix.generate.KINDS` in the 24 :data:`CORPUS_VARIANTS`,
    each at 6 sizes of 10 K to 300 K nonzeros and 3 of 300 K to 3 M
    (:data:`CORPUS_TIERS`), plus 12 large ones of 3 M to 50 M
    (:data:`CORPUS_LARGE`). Random kinds get a distinct seed per matrix.

    Why so few large ones: the corpus is tuned in about 10 minutes of two
    GPUs for both dtypes (``tune-many``, 24 trials a study), about 170
    seconds of wall time per dtype once the ~60 shared matrices are counted.
    A study of a matrix below 300 K nonzeros costs about 0.65 GPU-seconds
    (40 shared matrices took 26 GPU-seconds on two H200s), one of a few
    million perhaps 1.5, and one of tens of millions 5-15 (the matrix is
    built, its features and reference computed, and the slow configs time
    out near 0.5 s each). So: 144 small, 72 medium and 12 large studies,
    ~340 GPU-seconds a dtype. The list is ordered by size so a run cut short
    by its time limit leaves the largest undone, for the next run to finish.
    """
    out: list[SuiteMatrix] = []
    seed = 1
    for v, (kind, options) in enumerate(CORPUS_VARIANTS):
        for lo, hi, count in CORPUS_TIERS:
            for i in range(count):
                shift = (v * _GOLDEN) % 1.0  # per variant, so two variants of a kind differ in size
                nnz = lo * (hi / lo) ** ((i + shift) / count)
                seed += 1
                out.append(_entry(kind, nnz, seed, options))
    for i, (kind, options) in enumerate(CORPUS_LARGE):
        seed += 1
        out.append(_entry(kind, 3e6 * (5e7 / 3e6) ** (i / (len(CORPUS_LARGE) - 1)), seed, options))
    return tuple(sorted(out, key=lambda m: (approx_nnz(m.kind, m.size, dict(m.options)), m.name)))


CORPUS_MORE_VARIANTS: tuple[tuple[str, tuple[tuple[str, int | float], ...]], ...] = (
    ("blockfem", (("block", 2),)),
    ("blockfem", (("block", 3),)),
    ("blockfem", (("block", 4), ("points", 7))),
    ("blockfem", (("block", 6), ("points", 7))),
    ("kronecker", ()),
    ("kronecker", (("edge_factor", 4), ("a", 0.45), ("b", 0.22), ("c", 0.22))),
    ("kronecker", (("edge_factor", 48),)),
    ("arrowband", ()),
    ("arrowband", (("half_width", 10), ("dense", 16), ("dense_frac", 0.1))),
    ("arrowband", (("half_width", 1), ("dense", 256), ("dense_frac", 0.005))),
    ("bipartite", ()),
    ("bipartite", (("ratio", 10), ("degree", 3), ("zipf", 0.8))),
    ("bipartite", (("ratio", 200), ("degree", 20), ("zipf", 1.5))),
    ("lp", (("width", 100),)),
    ("lp", (("width", 500), ("median", 100.0))),
    ("emptyrows", (("empty", 0.4), ("lo", 1), ("hi", 40))),
    ("emptyrows", (("empty", 0.85), ("lo", 1), ("hi", 200))),
)
"""The structures the first corpus lacks (FEM blocks, Kronecker graphs, bands with dense rows and columns,
tall bipartite and very wide matrices, sparse mixtures of empty rows): 17 variants."""
CORPUS_MORE_TIERS: tuple[tuple[float, float, int], ...] = ((3e5, 3e6, 2), (4e6, 4e7, 3))
"""Two medium and three large matrices a variant: the large ones are what the first corpus misses most."""
CORPUS_XL: tuple[tuple[str, tuple[tuple[str, int | float], ...]], ...] = tuple(
    (kind, ()) for kind in dict.fromkeys(kind for kind, _ in CORPUS_VARIANTS))
"""The first corpus's kinds once more above 10 M nonzeros (12 M to 60 M, log-spaced)."""


def corpus_more() -> tuple[SuiteMatrix, ...]:
    """The corpus's second part: :data:`CORPUS_MORE_VARIANTS` at :data:`CORPUS_MORE_TIERS` (85 matrices of
    0.3 M to 40 M nonzeros) and :data:`CORPUS_XL` (9 of 12 M to 60 M), fewest nonzeros first; seeds apart
    from :func:`corpus`'s."""
    out: list[SuiteMatrix] = []
    seed = 10_000
    for v, (kind, options) in enumerate(CORPUS_MORE_VARIANTS):
        for lo, hi, count in CORPUS_MORE_TIERS:
            for i in range(count):
                shift = (v * _GOLDEN) % 1.0
                seed += 1
                out.append(_entry(kind, lo * (hi / lo) ** ((i + shift) / count), seed, options))
    for i, (kind, options) in enumerate(CORPUS_XL):
        seed += 1
        out.append(_entry(kind, 1.2e7 * (6e7 / 1.2e7) ** (i / (len(CORPUS_XL) - 1)), seed, options))
    return tuple(sorted(out, key=lambda m: (approx_nnz(m.kind, m.size, dict(m.options)), m.name)))


def _entry(kind: str, nnz: float, seed: int, options: tuple[tuple[str, int | float], ...]) -> SuiteMatrix:
    """A corpus matrix of about ``nnz`` nonzeros; the stencils, which draw nothing at random, get seed 1."""
    return SuiteMatrix(kind, _size_for(kind, nnz, dict(options)), seed if KINDS[kind].size_arg == "rows" else 1,
                       options)


def _smoke(matrices: tuple[SuiteMatrix, ...]) -> tuple[SuiteMatrix, ...]:
    """The smallest matrix of each kind."""
    first: dict[str, SuiteMatrix] = {}
    for m in matrices:
        first.setdefault(m.kind, m)
    return tuple(first.values())


_CORPUS = corpus()
_CORPUS_MORE = corpus_more()

SUITES: dict[str, tuple[SuiteMatrix, ...]] = {
    "small": (
        SuiteMatrix("poisson2d", 64),
        SuiteMatrix("poisson3d", 16),
        SuiteMatrix("banded", 4_000),
        SuiteMatrix("uniform", 4_000),
        SuiteMatrix("powerlaw", 8_000),
        SuiteMatrix("fewhuge", 8_000),
        SuiteMatrix("emptyrows", 8_000),
        SuiteMatrix("lp", 500),
        SuiteMatrix("tallskinny", 20_000),
    ),
    "large": (
        SuiteMatrix("poisson2d", 2_000),         # 4 M rows, 20 M nnz
        SuiteMatrix("poisson3d", 200),           # 8 M rows, 56 M nnz
        SuiteMatrix("banded", 2_000_000),        # 34 M nnz
        SuiteMatrix("uniform", 2_000_000),       # 32 M nnz
        SuiteMatrix("powerlaw", 2_000_000),      # ~21 M nnz, x + y = 32 MB in float64
        SuiteMatrix("powerlaw", 8_000_000),      # ~86 M nnz, x + y = 128 MB: well above L2
        SuiteMatrix("fewhuge", 4_000_000),       # ~18 M nnz, 4 rows of 100 k
        SuiteMatrix("emptyrows", 6_000_000),     # 70 % empty, ~36 M nnz
        SuiteMatrix("lp", 400_000),              # 400 k x 3.2 M, ~10 M nnz, x = 26 MB
        SuiteMatrix("tallskinny", 20_000_000),   # 20 M x 20 k, ~50 M nnz
    ),
    "graphs": (  # power-law graphs over 10 M rows: x (96-128 MB in float64) far above L2
        SuiteMatrix("powerlaw", 12_000_000),                                      # ~129 M nnz
        SuiteMatrix("powerlaw", 16_000_000, options=(("shape", 1.3), ("minimum", 2))),  # heavier tail
    ),
    "issue18": (  # the six structures issue #18 names, at its sizes: kinds the corpus has, larger than most of it
        SuiteMatrix("blockfem", 600_000),                                          # 3 x 3 blocks, ~46 M nnz
        SuiteMatrix("kronecker", 1 << 21),                                         # R-MAT, ~32 M nnz
        SuiteMatrix("arrowband", 4_000_000),                                       # a band, 64 dense rows and columns
        SuiteMatrix("bipartite", 8_000_000),                                       # 8 M x 200 K, ~60 M nnz
        SuiteMatrix("emptyrows", 3_000_000, options=(("empty", 0.4),)),            # 40 % empty, ~36 M nnz
        SuiteMatrix("lp", 20_000, options=(("width", 200), ("median", 400.0))),   # 20 K x 4 M, ~16 M nnz
    ),
    "corpus": _CORPUS,
    "corpus-more": _CORPUS_MORE,
    "corpus-smoke": _smoke(_CORPUS),
    "corpus-more-smoke": _smoke(tuple(m for m in _CORPUS_MORE if (m.kind, m.options) in CORPUS_MORE_VARIANTS)),
}


def suite(name: str) -> tuple[SuiteMatrix, ...]:
    try:
        return SUITES[name]
    except KeyError:
        raise InvalidConfigError(f"unknown suite {name!r}; known suites: {sorted(SUITES)}") from None
