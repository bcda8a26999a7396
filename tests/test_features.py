"""Tests of tuner.matrix.features: hand-computed features, brute-force references, speed, the GPU path."""

from __future__ import annotations

import gzip
import math
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import shared_manifest
from tuner.matrix.features import CF_WIDTHS, FEATURE_NAMES, extract_features


def canonical(M, shape: tuple[int, int] | None = None) -> sp.csr_matrix:
    """The canonical CSR form tuner.matrix.io.as_csr gives: int32 indices, sorted, no duplicates."""
    A = sp.csr_matrix(M, shape=shape)
    A.sum_duplicates()
    A.sort_indices()
    A.indptr = A.indptr.astype(np.int32)
    A.indices = A.indices.astype(np.int32)
    return A


def from_rows(rows: list[list[int]], cols: int, dtype: type = np.float64) -> sp.csr_matrix:
    """A canonical CSR matrix whose row i holds the (sorted, distinct) column indices rows[i]."""
    indptr = np.cumsum([0] + [len(r) for r in rows], dtype=np.int32)
    indices = np.array([c for r in rows for c in r], dtype=np.int32)
    data = np.arange(1, indices.size + 1, dtype=dtype)
    return canonical((data, indices, indptr), shape=(len(rows), cols))


def with_row_counts(npr: list[int]) -> sp.csr_matrix:
    """A matrix whose row i holds npr[i] nonzeros (in its first columns)."""
    return from_rows([list(range(k)) for k in npr], max(npr, default=0))


def cf(*values: float) -> dict[str, float]:
    """Expected clustering factors: one value per width in CF_WIDTHS, the last repeated for the rest."""
    padded = list(values) + [values[-1]] * (len(CF_WIDTHS) - len(values))
    return {f"cf_{w}": v for w, v in zip(CF_WIDTHS, padded, strict=True)}


def expected(
    shape: tuple[int, int],
    nnz: int,
    *,
    density: float,
    npr: tuple[float, float, float, float],
    gini: float,
    empty: float,
    long: float,
    fd: tuple[int, int],
    band: int,
    diag: float,
    col: tuple[float, float],
    cfs: dict[str, float],
) -> dict[str, float]:
    """A full expected feature dict from hand-computed groups: npr = (min, max, mean, std),
    fd = (count, size), col = (std, mean) of the column counts; each cv is std / mean."""
    npr_min, npr_max, npr_mean, npr_std = npr
    col_std, col_mean = col
    return {
        "rows": shape[0],
        "cols": shape[1],
        "nnz": nnz,
        "density": density,
        "npr_min": npr_min,
        "npr_max": npr_max,
        "npr_mean": npr_mean,
        "npr_std": npr_std,
        "npr_cv": npr_std / npr_mean if npr_mean else 0,
        "npr_gini": gini,
        "empty_row_frac": empty,
        "long_row_frac": long,
        "fd_seg_count": fd[0],
        "fd_seg_size": fd[1],
        "bandwidth": band,
        "diag_frac": diag,
        "col_std": col_std,
        "col_cv": col_std / col_mean if col_mean else 0,
        **cfs,
    }


HAND_CASES = {
    # Row 1 empty: npr [3, 0, 1, 4], column counts [2, 1, 2, 1, 2] (std sqrt(0.24)).
    # Gini: sorted npr [0, 1, 3, 4], sum of |xi - xj| over ordered pairs 28, MAD 28/16, / (2·2) = 0.4375.
    # FD: q25 0.75, q75 3.25, IQR 2.5, h = 5 / cbrt(4) = 3.15, k = ceil(4 / 3.15) = 2, size 2.
    # Bandwidth |0 - 4|; diagonal (0,0), (2,2), (3,3) of 4; cf: one panel per row, 3 non-empty rows.
    "4x5_empty_row": (
        from_rows([[0, 2, 4], [], [2], [0, 1, 3, 4]], 5),
        expected(
            (4, 5),
            8,
            density=0.4,
            npr=(0, 4, 2, math.sqrt(2.5)),
            gini=0.4375,
            empty=0.25,
            long=0,
            fd=(2, 2),
            band=4,
            diag=0.75,
            col=(math.sqrt(0.24), 1.6),
            cfs=cf(8 / 3),
        ),
    ),
    # All rows alike: IQR 0 -> one FD segment of all rows.
    "identity_5": (
        canonical(sp.eye(5)),
        expected(
            (5, 5),
            5,
            density=0.2,
            npr=(1, 1, 1, 0),
            gini=0,
            empty=0,
            long=0,
            fd=(1, 5),
            band=0,
            diag=1,
            col=(0, 1),
            cfs=cf(1),
        ),
    ),
    # Column counts [1, 0, 1, 0, 0, 1]: std 0.5, mean 0.5.
    "one_row": (
        from_rows([[0, 2, 5]], 6),
        expected(
            (1, 6),
            3,
            density=0.5,
            npr=(3, 3, 3, 0),
            gini=0,
            empty=0,
            long=0,
            fd=(1, 1),
            band=5,
            diag=1,
            col=(0.5, 0.5),
            cfs=cf(3),
        ),
    ),
    # npr [1, 0, 1, 1]: var 0.1875; Gini (6/16) / 1.5 = 0.25;
    # FD: q25 0.75, q75 1, h = 0.5 / cbrt(4), k = ceil(3.17) = 4 = m, size 1.
    "one_col": (
        from_rows([[0], [], [0], [0]], 1),
        expected(
            (4, 1),
            3,
            density=0.75,
            npr=(0, 1, 0.75, math.sqrt(0.1875)),
            gini=0.25,
            empty=0.25,
            long=0,
            fd=(4, 1),
            band=3,
            diag=1,
            col=(0, 3),
            cfs=cf(1),
        ),
    ),
    "zero_3x3": (
        canonical(sp.csr_matrix((3, 3))),
        expected(
            (3, 3),
            0,
            density=0,
            npr=(0, 0, 0, 0),
            gini=0,
            empty=1,
            long=0,
            fd=(1, 3),
            band=0,
            diag=0,
            col=(0, 0),
            cfs=cf(0),
        ),
    ),
    "empty_0x0": (
        canonical(sp.csr_matrix((0, 0))),
        expected(
            (0, 0),
            0,
            density=0,
            npr=(0, 0, 0, 0),
            gini=0,
            empty=0,
            long=0,
            fd=(0, 0),
            band=0,
            diag=0,
            col=(0, 0),
            cfs=cf(0),
        ),
    ),
    # npr [40, 1]: one long row of two; Gini 39 / (2·41); FD: IQR 19.5, k = ceil(39·cbrt(2) / 39) = 2.
    # Column counts: 2 for column 0, 1 for columns 1..39 (sum of squares 43).
    "long_row": (
        from_rows([list(range(40)), [0]], 40),
        expected(
            (2, 40),
            41,
            density=41 / 80,
            npr=(1, 40, 20.5, 19.5),
            gini=39 / 82,
            empty=0,
            long=0.5,
            fd=(2, 1),
            band=39,
            diag=0.5,
            col=(math.sqrt(43 / 40 - (41 / 40) ** 2), 41 / 40),
            cfs=cf(20.5),
        ),
    ),
    # Panels that change inside rows, and rows starting in the previous row's last panel:
    # segments for w = 128: 4 + 2 + 1, 256: 3 + 2 + 1, 512: 2 + 1 + 1, >= 1024: 1 + 1 + 1.
    # npr [5, 2, 2]: Gini 6/27; FD: q25 2, q75 3.5, k = ceil(3·cbrt(3) / 3) = 2, size 2.
    # Column counts: 1 for columns 0, 127, 128, 300, 1001; 2 for 599, 1000 (sum of squares 13).
    "panels": (
        from_rows([[0, 127, 128, 300, 599], [599, 1000], [1000, 1001]], 1100),
        expected(
            (3, 1100),
            9,
            density=9 / 3300,
            npr=(2, 5, 3, math.sqrt(2)),
            gini=2 / 9,
            empty=0,
            long=0,
            fd=(2, 2),
            band=999,
            diag=1 / 3,
            col=(math.sqrt(13 / 1100 - (9 / 1100) ** 2), 9 / 1100),
            cfs=cf(9 / 7, 9 / 6, 9 / 4, 9 / 3),
        ),
    ),
}


@pytest.mark.parametrize("name", HAND_CASES)
def test_hand_computed_features(name: str) -> None:
    A, want = HAND_CASES[name]
    assert extract_features(A) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_feature_names_are_stable() -> None:
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == 18 + 13
    assert FEATURE_NAMES[:4] == ("rows", "cols", "nnz", "density")
    assert FEATURE_NAMES[-13:] == tuple(f"cf_{2**k}" for k in range(7, 20))


DEGENERATE = {  # name: (cols, column indices of each row)
    "0x0": (0, []),
    "0x4": (4, []),
    "3x0": (0, [[], [], []]),
    "1x1_empty": (1, [[]]),
    "1x1": (1, [[0]]),
    "3x3_zero": (3, [[], [], []]),
    "one_row": (7, [[1, 6]]),
    "one_col": (1, [[0], [], [], [0], []]),
}


@pytest.mark.parametrize("name", DEGENERATE)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_degenerate_matrices_give_full_finite_vectors(name: str, dtype: type) -> None:
    cols, rows = DEGENERATE[name]
    f = extract_features(from_rows(rows, cols, dtype))
    assert tuple(f) == FEATURE_NAMES
    assert all(type(v) is float and math.isfinite(v) for v in f.values())
    assert (f["rows"], f["cols"]) == (len(rows), cols)


def random_canonical(seed: int, shape: tuple[int, int], nnz: int) -> sp.csr_matrix:
    """A seeded random canonical matrix; duplicates drawn twice are summed away."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, shape[0], nnz)
    cols = rng.integers(0, shape[1], nnz)
    return canonical(sp.coo_matrix((rng.standard_normal(nnz), (rows, cols)), shape=shape))


@pytest.mark.parametrize(
    ("seed", "shape", "nnz"),
    [(0, (40, 3_000), 600), (1, (7, 1_500_000), 900), (2, (300, 1_100_000), 2_000), (3, (1, 600_000), 50)],
)
def test_clustering_factors_match_brute_force(seed: int, shape: tuple[int, int], nnz: int) -> None:
    A = random_canonical(seed, shape, nnz)
    coo = A.tocoo()
    f = extract_features(A)
    for w in CF_WIDTHS:
        segments = {(r, c // w) for r, c in zip(coo.row.tolist(), coo.col.tolist(), strict=True)}
        assert f[f"cf_{w}"] == pytest.approx(A.nnz / len(segments), rel=1e-12), w


@settings(database=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=40))
def test_gini_matches_pairwise_formula(npr: list[int]) -> None:
    x = np.array(npr, dtype=np.float64)
    mad = np.abs(x[:, None] - x[None, :]).mean()
    want = mad / (2 * x.mean()) if x.sum() else 0.0
    assert extract_features(with_row_counts(npr))["npr_gini"] == pytest.approx(want, abs=1e-12)


def generated_matrix(m: int, n: int, nnz: int, *, seed: int = 0) -> sp.csr_matrix:
    """A canonical m×n matrix with exactly nnz nonzeros, 0..2·nnz/m per row, built without sorting.

    Columns are running sums of random gaps below n / (2·nnz/m), so they rise within a row and stay below n.
    """
    rng = np.random.default_rng(seed)
    per = nnz // m
    assert per * m == nnz
    npr = np.full(m, per, dtype=np.int32)
    delta = rng.integers(-per, per + 1, m // 2, dtype=np.int32)
    npr[: m // 2] += delta
    npr[m // 2 : 2 * (m // 2)] -= delta
    rng.shuffle(npr)
    indptr = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(npr, out=indptr[1:])
    gaps = rng.integers(1, n // (2 * per), nnz, dtype=np.int32)
    heads = indptr[:-1][npr > 0]
    cols = np.cumsum(gaps, dtype=np.int64)
    cols -= np.repeat(cols[heads] - gaps[heads], npr[npr > 0])
    return sp.csr_matrix((np.ones(nnz), cols.astype(np.int32), indptr), shape=(m, n))


def test_extract_features_is_fast_on_10m_nonzeros(capsys: pytest.CaptureFixture[str]) -> None:
    A = generated_matrix(1_000_000, 1_000_000, 10_000_000)
    start = time.perf_counter()
    f = extract_features(A)
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nextract_features: {elapsed:.3f} s for 1 M rows, 10 M nonzeros")
    assert f["nnz"] == 10_000_000 and f["npr_max"] <= 20
    assert elapsed < 4.0


SHARED = [row for row in shared_manifest() if row["field"] != "complex"]


@pytest.mark.parametrize("row", SHARED, ids=[row["name"] for row in SHARED])
def test_shared_matrices_match_manifest(shared_dir: Path, row: dict[str, str]) -> None:
    with gzip.open(shared_dir / row["file"]) as fh:
        A = canonical(scipy.io.mmread(fh).tocsr())
    f = extract_features(A)
    assert (f["rows"], f["cols"]) == (int(row["rows"]), int(row["cols"]))
    assert f["npr_max"] == int(row["npr_max"])
    assert round(f["empty_row_frac"] * f["rows"]) == int(row["empty_rows"])
    assert f["npr_mean"] == pytest.approx(float(row["npr_mean"]), abs=6e-4)
    assert f["npr_std"] == pytest.approx(float(row["npr_std"]), abs=6e-4)


@pytest.mark.gpu
def test_features_on_the_gpu_equal_the_cpu_ones() -> None:
    import cupyx.scipy.sparse as cusp

    from tests.kernel_cases import CASES, load_shared, shared_cases

    for A in [CASES[c]() for c in sorted(CASES)] + [load_shared(n) for n in shared_cases()]:
        want, got = extract_features(A), extract_features(cusp.csr_matrix(A))
        assert got.keys() == want.keys()
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12), name


@pytest.mark.gpu
@pytest.mark.parametrize("aggregate_below", [0, 10**9], ids=["one atomic an entry", "a warp's lanes aggregated"])
def test_both_ways_of_counting_columns_give_the_cpu_features(monkeypatch, aggregate_below) -> None:
    """The column counts either way, on a matrix with hub columns (short rows naming the same few columns, where
    a warp's lanes share them) and one without, whatever the rows' mean length would pick."""
    import cupyx.scipy.sparse as cusp

    from tuner.matrix import features_gpu

    monkeypatch.setattr(features_gpu, "AGGREGATE_BELOW", aggregate_below)
    rng = np.random.default_rng(11)
    m, n = 50_000, 40_000
    hubs = rng.integers(0, n, 5)
    rows = np.repeat(np.arange(m), 6)
    cols = np.where(rng.random(rows.size) < 0.5, hubs[rng.integers(0, 5, rows.size)], rng.integers(0, n, rows.size))
    for A in (sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(m, n)),
              sp.random(3000, 5000, density=0.02, format="csr", random_state=2)):
        A.sum_duplicates()
        want, got = extract_features(A), extract_features(cusp.csr_matrix(A))
        for name in want:
            assert got[name] == pytest.approx(want[name], rel=1e-9, abs=1e-12), name
