"""tuner.matrix.structure_gpu: a CSR matrix is canonical exactly when its non-increasing neighbour pairs all span
two rows; the NumPy count against SciPy everywhere, the GPU's against the NumPy one; the fingerprint's sums of the
same pass against the NumPy twin's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.matrix.structure_gpu import canonical_reference


def crafted() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(indptr, indices) pairs at the edges of the count: descents at row starts (after empty rows too),
    within a row, a duplicate, a first row that starts low, one entry, none."""
    return {
        "descents at row starts": (np.array([0, 3, 3, 5, 7]), np.array([4, 6, 9, 0, 2, 1, 8])),
        "a descent within a row": (np.array([0, 3, 5]), np.array([4, 9, 6, 0, 2])),
        "a duplicate": (np.array([0, 2, 4]), np.array([1, 5, 3, 3])),
        "a duplicate across rows": (np.array([0, 2, 4]), np.array([1, 3, 3, 5])),
        "empty rows first": (np.array([0, 0, 0, 2, 3]), np.array([7, 8, 0])),
        "one entry": (np.array([0, 0, 1]), np.array([5])),
        "none": (np.array([0, 0, 0]), np.array([], dtype=np.int64)),
    }


def random_rows(m: int, n: int, longest: int, *, seed: int) -> sp.csr_matrix:
    """Rows of 0 to ``longest`` random columns, canonical (sp.random draws from all m x n cells: at millions of
    entries it took more memory than the GPU machine's workers have)."""
    rng = np.random.default_rng(seed)
    indptr = np.concatenate([[0], np.cumsum(rng.integers(0, longest + 1, m))])
    A = sp.csr_matrix((np.ones(indptr[-1]), rng.integers(0, n, indptr[-1]), indptr), shape=(m, n))
    A.sum_duplicates()
    return A


def scipy_says(indptr: np.ndarray, indices: np.ndarray) -> bool:
    m, n = indptr.size - 1, int(indices.max(initial=0)) + 1
    return sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(m, n)).has_canonical_format


def all_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    cases = crafted()
    for name, A in [*((n, make()) for n, make in CASES.items()), *((n, load_shared(n)) for n in shared_cases())]:
        A = sp.csr_matrix(A)
        cases[name] = (A.indptr, A.indices)
        if A.nnz > 1:  # its rows' columns reversed: not canonical wherever a row holds two
            rev = A.indices.copy()
            for i in range(A.shape[0]):
                rev[A.indptr[i]:A.indptr[i + 1]] = rev[A.indptr[i]:A.indptr[i + 1]][::-1]
            cases[name + " reversed"] = (A.indptr, rev)
    return cases


def test_the_count_agrees_with_scipy() -> None:
    cases = all_cases()
    assert [name for name, (p, i) in crafted().items() if not canonical_reference(p, i)] == \
        ["a descent within a row", "a duplicate"]
    for name, (indptr, indices) in cases.items():
        assert canonical_reference(indptr, indices) == scipy_says(indptr, indices), name


@pytest.mark.gpu
def test_the_gpu_count_agrees_with_the_reference_and_plan_keeps_a_canonical_matrix_where_it_is() -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    from tuner.matrix.io import as_device_csr
    from tuner.matrix.structure_gpu import structure_pass

    big = random_rows(200_000, 150_000, 60, seed=3)  # about 6 M entries: strides of many blocks
    cases = {**all_cases(), "big": (big.indptr, big.indices)}
    swapped = big.indices.copy()
    row = int(np.flatnonzero(np.diff(big.indptr) > 1)[-1])  # the last row of two or more: its first two swapped
    swapped[[big.indptr[row], big.indptr[row] + 1]] = swapped[[big.indptr[row] + 1, big.indptr[row]]]
    cases["big, one row's first two swapped"] = (big.indptr, swapped)
    for name, (indptr, indices) in cases.items():
        found = structure_pass(cupy.asarray(indptr, dtype=cupy.int32), cupy.asarray(indices, dtype=cupy.int32))
        assert found.canonical == canonical_reference(indptr, indices), name
        assert found.nonempty_rows == np.count_nonzero(np.diff(indptr)), name
    A = cusp.csr_matrix(big)
    assert as_device_csr(A) is A and A.has_canonical_format
    A.indices[:] = cupy.asarray(swapped)  # changed in place: checked again, as every plan() checks its matrix
    B = as_device_csr(A)  # canonicalised through the host
    assert B is not A and B.has_canonical_format and np.array_equal(B.indices.get(), big.indices)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_pass_counts_nan_and_inf_values_as_numpy_does(dtype: str) -> None:
    """Each value's exponent is read where its entry is: NaN, +-Inf counted; the largest finite value,
    subnormals and -0.0 not; other value types are not checked."""
    import cupy

    from tuner.matrix.structure_gpu import structure_pass

    big = random_rows(300_000, 200_000, 9, seed=7)  # past the four-entry loop's strides
    values = np.random.default_rng(0).standard_normal(big.nnz).astype(dtype)
    info = np.finfo(dtype)
    special = [np.nan, np.inf, -np.inf, info.max, -info.max, info.smallest_subnormal, -0.0, -np.nan]
    at = np.random.default_rng(1).choice(big.nnz - 1, len(special), replace=False)
    values[at] = np.array(special, dtype=dtype)
    values[-1] = np.inf  # the last entry: the tail loop's
    indptr, indices = cupy.asarray(big.indptr), cupy.asarray(big.indices)
    canonical, sums, nonfinite, *_ = structure_pass(indptr, indices, values=cupy.asarray(values))
    assert canonical and sums == [] and nonfinite == int(np.count_nonzero(~np.isfinite(values))) == 5
    assert structure_pass(indptr, indices)[2] == 0
    assert structure_pass(indptr, indices, values=cupy.asarray(values.astype(np.complex128)))[2] == 0


@pytest.mark.gpu
def test_one_pass_checks_and_names_a_new_matrix_as_each_would_alone() -> None:
    """plan()'s first step: the canonical check and the fingerprint in one pass, the same answers as the
    NumPy count and the NumPy fingerprint, with or without the sums; a matrix that is not canonical is named by
    its canonical form. Asked to (``describe_if``, given the shape, nonzeros and dtype), the same round trip gives
    the features of the canonical form, as the CPU computes them."""
    import cupy
    import cupyx.scipy.sparse as cusp

    from tuner.matrix.features import extract_features
    from tuner.matrix.fingerprint import device_csr_and_fingerprint, fingerprint
    from tuner.matrix.structure_gpu import structure_pass

    def same_features(got: dict[str, float] | None, A: sp.csr_matrix) -> bool:
        want = extract_features(A)
        return got is not None and got.keys() == want.keys() and all(
            got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12) for k in want)

    big = random_rows(300_000, 200_000, 9, seed=5)  # 1.35 M entries: past the four-entry loop's strides
    cases = {"big": big, "big less a row": sp.csr_matrix(big[:-1]), "empty": sp.csr_matrix((3, 4)),
             "one entry": sp.csr_matrix(([1.0], [2], [0, 1]), shape=(1, 3))}
    for name, A in cases.items():
        on_gpu = cusp.csr_matrix(A)
        assert structure_pass(on_gpu.indptr, on_gpu.indices)[0], name
        B, fp, features = device_csr_and_fingerprint(on_gpu)
        assert B is on_gpu and fp == fingerprint(A) and features is None, name
        asked: list[tuple[int, ...]] = []
        B32, fp32, features = device_csr_and_fingerprint(
            on_gpu, dtype="float32", describe_if=lambda *shape, seen=asked: seen.append(shape) or True)
        assert B32.dtype == np.float32 and fp32 == fp and same_features(features, A), name
        assert asked == [(*A.shape, A.nnz, "float32")], name
        assert device_csr_and_fingerprint(A, describe_if=lambda *shape: False)[1:] == (fp, None), name
        assert same_features(device_csr_and_fingerprint(A, describe_if=lambda *shape: True)[2], A), name
    rev = big.indices.copy()
    row = int(np.flatnonzero(np.diff(big.indptr) > 1)[0])
    rev[big.indptr[row]:big.indptr[row + 1]] = rev[big.indptr[row]:big.indptr[row + 1]][::-1]
    unsorted = cusp.csr_matrix((cupy.ones(rev.size), cupy.asarray(rev), cupy.asarray(big.indptr)), shape=big.shape)
    assert not structure_pass(unsorted.indptr, unsorted.indices, tags=(1, 2, 3, 4))[0]
    B, fp, features = device_csr_and_fingerprint(unsorted, describe_if=lambda *shape: True)
    assert B is not unsorted and np.array_equal(B.indices.get(), big.indices) and fp == fingerprint(big)
    assert same_features(features, big)
