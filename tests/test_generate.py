"""tuner.matrix.generate: every kind's shape and structure, determinism, the canonical form, errors, speed."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from common.errors import InvalidConfigError
from tests.test_io import assert_canonical
from tuner.matrix.generate import KINDS, Generator, generate

SMALL = {"n": 6, "rows": 3000}
RANDOM_KINDS = [name for name, g in KINDS.items() if g.size_arg == "rows"]  # random values
RANDOM_STRUCTURE = [name for name in RANDOM_KINDS if name not in ("banded", "blockfem")]  # fixed structures


def small(kind: str, **kwargs) -> dict:
    """Keyword arguments that give ``kind`` at a small size."""
    size_arg = KINDS[kind].size_arg
    return {size_arg: SMALL[size_arg], **kwargs}


def arrays(A) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return A.indptr, A.indices, A.data


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_canonical_and_finite(kind: str) -> None:
    A = generate(kind, **small(kind))
    assert_canonical(A)
    assert A.nnz > 0
    assert np.all(np.isfinite(A.data)) and np.all(A.data != 0)


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_bits(kind: str) -> None:
    first, second = generate(kind, **small(kind, seed=7)), generate(kind, **small(kind, seed=7))
    assert first.shape == second.shape
    for a, b in zip(arrays(first), arrays(second), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", RANDOM_KINDS)
def test_other_seed_other_values(kind: str) -> None:
    first, second = generate(kind, **small(kind, seed=1)), generate(kind, **small(kind, seed=2))
    assert not np.array_equal(first.data[:10], second.data[:10])


@pytest.mark.parametrize("kind", RANDOM_STRUCTURE)
def test_other_seed_other_structure(kind: str) -> None:
    first, second = generate(kind, **small(kind, seed=1)), generate(kind, **small(kind, seed=2))
    assert first.nnz != second.nnz or not np.array_equal(first.indices, second.indices)


@pytest.mark.parametrize("kind", RANDOM_KINDS)
def test_random_values_are_bounded_away_from_zero(kind: str) -> None:
    values = np.abs(generate(kind, **small(kind)).data)
    assert values.min() >= 0.1 and values.max() <= 1.0


@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_poisson2d(n: int) -> None:
    A = generate("poisson2d", n=n)
    assert_canonical(A)
    assert A.shape == (n * n, n * n)
    assert A.nnz == 5 * n * n - 4 * n
    assert np.all(A.diagonal() == 4)
    assert set(np.unique(A.data)) <= {4.0, -1.0}
    assert (A != A.T).nnz == 0
    grid = np.arange(n * n).reshape(n, n)
    if n > 2:  # an interior point couples to its four neighbours
        row = A[grid[1, 1]]
        assert sorted(row.indices) == sorted([grid[0, 1], grid[1, 0], grid[1, 1], grid[1, 2], grid[2, 1]])


@pytest.mark.parametrize("n", [1, 2, 4, 9])
def test_poisson3d(n: int) -> None:
    A = generate("poisson3d", n=n)
    assert_canonical(A)
    assert A.shape == (n**3, n**3)
    assert A.nnz == 7 * n**3 - 6 * n**2
    assert np.all(A.diagonal() == 6)
    assert set(np.unique(A.data)) <= {6.0, -1.0}
    assert (A != A.T).nnz == 0
    assert np.all(A @ np.ones(n**3) >= 0)  # diagonally dominant rows


def test_banded() -> None:
    rows = 1000
    A = generate("banded", rows=rows)
    assert A.shape == (rows, rows)
    assert A.nnz == 17 * rows - 2 * sum(range(1, 9))
    r, c = A.nonzero()
    assert np.abs(r - c).max() == 8


def test_uniform() -> None:
    A = generate("uniform", rows=5000)
    per_row = np.diff(A.indptr)
    assert A.shape == (5000, 5000)
    assert per_row.max() == 16 and per_row.mean() > 15.9


def test_powerlaw() -> None:
    A = generate("powerlaw", rows=50_000)
    per_row = np.diff(A.indptr)
    assert A.shape == (50_000, 50_000)
    assert 8 <= per_row.mean() <= 16
    assert per_row.max() > 20 * per_row.mean()  # a heavy tail
    assert np.diff(A.tocsc().indptr).max() > 100 * per_row.mean()  # hub columns


@pytest.mark.parametrize(("rows", "huge_len"), [(3000, 3000), (200_000, 100_000), (3, 3)])
def test_fewhuge(rows: int, huge_len: int) -> None:
    A = generate("fewhuge", rows=rows)
    per_row = np.diff(A.indptr)
    assert A.shape == (rows, rows)
    assert np.count_nonzero(per_row == huge_len) == min(4, rows)
    assert np.all(per_row[per_row != huge_len] <= 4)


def test_lp() -> None:
    A = generate("lp", rows=4000)
    per_row = np.diff(A.indptr)
    assert A.shape == (4000, 32_000)
    assert per_row.min() >= 1 and per_row.max() > 20 * np.median(per_row)


@pytest.mark.parametrize(("rows", "cols"), [(3000, 8), (20_000, 20)])
def test_tallskinny(rows: int, cols: int) -> None:
    A = generate("tallskinny", rows=rows)
    per_row = np.diff(A.indptr)
    assert A.shape == (rows, cols)
    assert per_row.min() >= 1 and per_row.max() <= 4


def test_emptyrows() -> None:
    A = generate("emptyrows", rows=20_000)
    per_row = np.diff(A.indptr)
    assert 0.67 < np.mean(per_row == 0) < 0.73
    assert per_row[per_row > 0].min() >= 4 and per_row.max() <= 32


def test_lp_width() -> None:
    assert generate("lp", rows=300, width=100).shape == (300, 30_000)


def test_emptyrows_lengths() -> None:
    A = generate("emptyrows", rows=20_000, empty=0.4, lo=1, hi=40)
    per_row = np.diff(A.indptr)
    assert 0.37 < np.mean(per_row == 0) < 0.43
    assert per_row[per_row > 0].min() == 1 and per_row.max() <= 40
    with pytest.raises(InvalidConfigError, match="lo must not exceed hi"):
        generate("emptyrows", rows=100, lo=9, hi=3)


@pytest.mark.parametrize(("block", "points", "per_node"), [(3, 27, 27), (2, 7, 7)])
def test_blockfem(block: int, points: int, per_node: int) -> None:
    A = generate("blockfem", rows=3000, block=block, points=points)
    side = round((3000 / block) ** (1 / 3))
    assert A.shape == (side**3 * block,) * 2
    per_row = np.diff(A.indptr)
    assert per_row.max() == per_node * block and per_row.min() % block == 0
    dense = A.toarray() != 0
    assert np.array_equal(dense, dense.T)
    assert np.array_equal(dense[:block, :block], np.ones((block, block), dtype=bool))  # a node's own block
    with pytest.raises(InvalidConfigError, match="points must be 7 or 27"):
        generate("blockfem", rows=100, points=9)


def test_kronecker_is_heavy_tailed_in_rows_and_columns() -> None:
    A = generate("kronecker", rows=20_000)
    per_row, per_col = np.diff(A.indptr), np.bincount(A.indices, minlength=A.shape[1])
    assert A.shape == (20_000, 20_000) and 0.8 * 16 * 20_000 < A.nnz <= 16 * 20_000
    assert per_row.max() > 50 * per_row.mean() and per_col.max() > 50 * per_col.mean()
    assert np.mean(per_row == 0) > 0.1  # R-MAT leaves many vertices without edges
    with pytest.raises(InvalidConfigError, match="below 1"):
        generate("kronecker", rows=100, a=0.5, b=0.3, c=0.3)


def test_arrowband() -> None:
    A = generate("arrowband", rows=10_000, half_width=2, dense=8, dense_frac=0.1)
    per_row, per_col = np.diff(A.indptr), np.bincount(A.indices, minlength=A.shape[1])
    assert np.sum(per_row >= 800) == 8 and np.sum(per_col >= 800) == 8  # 1000 drawn, duplicates merged
    assert np.median(per_row) <= 5 + 1
    rows = np.repeat(np.arange(A.shape[0]), per_row)
    assert np.mean(np.abs(rows - A.indices) <= 2) > 0.7  # most entries on the band


def test_bipartite_is_tall_with_hot_columns_first() -> None:
    A = generate("bipartite", rows=40_000, ratio=40, degree=8)
    per_row, per_col = np.diff(A.indptr), np.bincount(A.indices, minlength=A.shape[1])
    assert A.shape == (40_000, 1000) and per_row.min() >= 1 and per_row.max() <= 16
    assert per_col[:10].sum() > per_col[-500:].sum()  # popular columns sit together at the low indices


@pytest.mark.parametrize("dtype", ["float32", np.float32])
def test_float32(dtype) -> None:
    A = generate("uniform", rows=100, dtype=dtype)
    assert_canonical(A, np.float32)
    np.testing.assert_array_equal(A.data, generate("uniform", rows=100).data.astype(np.float32))


def test_default_size() -> None:
    assert generate("lp").shape[0] == KINDS["lp"].default_size
    assert generate("poisson3d", n=None).shape[0] == KINDS["poisson3d"].default_size ** 3


def test_kinds_declaration() -> None:
    required = "poisson2d poisson3d banded uniform powerlaw fewhuge lp tallskinny emptyrows".split()
    assert set(required) <= set(KINDS)
    for name, g in KINDS.items():
        assert isinstance(g, Generator) and g.name == name and g.doc
        assert g.size_arg in ("n", "rows") and g.default_size > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        KINDS["lp"].default_size = 1  # type: ignore[misc]


def test_unknown_kind_lists_the_kinds() -> None:
    with pytest.raises(InvalidConfigError, match="unknown matrix kind 'poisson4d'") as info:
        generate("poisson4d")
    assert all(name in str(info.value) for name in KINDS)


@pytest.mark.parametrize(
    ("kind", "kwargs", "match"),
    [
        ("poisson2d", {"rows": 10}, "sized by n=, not rows="),
        ("banded", {"n": 10}, "sized by rows=, not n="),
        ("banded", {"n": 10, "rows": 10}, "not n="),
        ("uniform", {"rows": 0}, "rows must be a positive integer"),
        ("uniform", {"rows": -5}, "rows must be a positive integer"),
        ("poisson3d", {"n": 2.5}, "n must be a positive integer"),
        ("poisson3d", {"n": True}, "n must be a positive integer"),
        ("lp", {"rows": "100"}, "rows must be a positive integer"),
        ("lp", {"seed": -1}, "seed must be a non-negative integer"),
        ("lp", {"seed": 1.5}, "seed must be a non-negative integer"),
    ],
)
def test_invalid_sizes(kind: str, kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        generate(kind, **kwargs)


def test_numpy_integer_sizes_are_accepted() -> None:
    assert generate("banded", rows=np.int64(20), seed=np.uint32(3)).shape == (20, 20)


def test_powerlaw_million_rows_is_fast() -> None:
    start = time.perf_counter()
    A = generate("powerlaw", rows=1_000_000)
    elapsed = time.perf_counter() - start
    print(f"powerlaw rows=1_000_000: {A.nnz} nonzeros in {elapsed:.2f} s")
    assert A.shape == (1_000_000, 1_000_000) and A.nnz > 5_000_000
