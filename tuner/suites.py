"""Named suites of generated matrices for the benchmark, each at two scales.

``small`` runs anywhere in seconds (CI, ``--device cpu-reference``); ``large``
is sized for a GPU: 10 M to 100 M nonzeros, x well above a 50 MB L2 for the
power-law and LP cases. Each entry is (kind, size, seed): deterministic, so two
runs of a suite measure the same matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import scipy.sparse as sp

from tuner.errors import InvalidConfigError
from tuner.generate import KINDS, generate


@dataclass(frozen=True)
class SuiteMatrix:
    kind: str
    size: int
    seed: int = 1

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.size}"

    def build(self, dtype: str = "float64") -> sp.csr_matrix:
        arg = KINDS[self.kind].size_arg
        return generate(self.kind, **{arg: self.size}, seed=self.seed, dtype=dtype)


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
}


def suite(name: str) -> tuple[SuiteMatrix, ...]:
    try:
        return SUITES[name]
    except KeyError:
        raise InvalidConfigError(f"unknown suite {name!r}; known suites: {sorted(SUITES)}") from None

