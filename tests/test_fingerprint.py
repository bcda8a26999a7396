"""Tests of tuner.matrix.fingerprint: the scheme-2 fingerprint against a plain-Python reading of its
definition, what it must tell apart, chunking, the GPU twin; and scheme 1's layout."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import scipy.sparse as sp

from common.errors import MatrixFormatError
from tests.test_features import canonical, from_rows, random_canonical
from tuner.matrix import fingerprint as fp_module
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint, legacy_fingerprint

MASK = (1 << 64) - 1


def mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def by_definition(A: sp.csr_matrix) -> str:
    """The module's docstring, element by element, in Python integers."""
    seeds = (0x452821E638D01377, 0xBE5466CF34E90C6C)
    tags = ((0x243F6A8885A308D3, 0x13198A2E03707344), (0xA4093822299F31D0, 0x082EFA98EC4E6C89))
    lanes = []
    for lane, seed in enumerate(seeds):
        sums = [sum(mix(((i << 32) | int(w)) ^ tags[a][lane]) for i, w in enumerate(arr)) & MASK
                for a, arr in enumerate((A.indptr, A.indices))]
        h = mix(seed ^ A.shape[0])
        h = mix(h ^ A.shape[1])
        h = mix(h ^ A.nnz)
        h = mix((h + sums[0]) & MASK)
        lanes.append(mix((h + sums[1]) & MASK))
    return f"{lanes[0]:016x}{lanes[1]:016x}"


@pytest.mark.parametrize("A", [from_rows([[0, 2], [], [1]], 4), canonical(sp.csr_matrix((0, 3))),
                               canonical(sp.csr_matrix((5, 2))), random_canonical(3, (40, 70), 300)],
                         ids=["hand", "no rows", "no nonzeros", "random"])
def test_fingerprint_follows_its_definition(A: sp.csr_matrix) -> None:
    assert fingerprint(A) == by_definition(A)
    assert len(fingerprint(A)) == 32


def test_fingerprint_is_pinned() -> None:
    """A change of scheme must be deliberate: every store's lookups depend on these bits."""
    assert fingerprint(from_rows([[0, 2], [], [1]], 4)) == by_definition(from_rows([[0, 2], [], [1]], 4))
    assert fingerprint(sp.eye(3, format="csr")) == "0afb768a41f5637c677650bf432a4633"


def test_chunks_do_not_change_the_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    A = random_canonical(4, (300, 200), 2_000)
    whole = fingerprint(A)
    monkeypatch.setattr(fp_module, "_CHUNK", 7)
    assert fingerprint(A) == whole


@pytest.mark.parametrize("f", [fingerprint, legacy_fingerprint])
def test_fingerprints_ignore_values_and_dtype(f) -> None:
    A = random_canonical(5, (50, 70), 400)
    B = A.astype(np.float32)
    B.data[:] = np.arange(B.nnz)
    assert f(A) == f(B) == f(A.copy())


@pytest.mark.parametrize("f", [fingerprint, legacy_fingerprint])
def test_fingerprints_see_every_index_and_the_shape(f) -> None:
    rows = [[0, 2], [], [1, 3]]
    base = f(from_rows(rows, 5))
    moved_one_index = [[[1, 2], [], [1, 3]], [[0, 4], [], [1, 3]], [[0, 2], [], [0, 3]], [[0, 2], [], [1, 4]]]
    for variant in moved_one_index:
        assert f(from_rows(variant, 5)) != base, variant
    assert f(from_rows([[0, 2], [1], [3]], 5)) != base  # same indices, other indptr
    assert f(from_rows(rows, 6)) != base  # same arrays, one more column
    assert f(from_rows(rows + [[]], 5)) != base  # one more (empty) row
    assert f(canonical(sp.csr_matrix((0, 3)))) != f(canonical(sp.csr_matrix((0, 4))))
    assert f(from_rows([[1], [0]], 2)) != f(from_rows([[0], [1]], 2))  # the same entries in other rows


def test_legacy_fingerprint_layout() -> None:
    A = from_rows([[0, 2], [], [1]], 4)
    h = hashlib.blake2b(struct.pack("<qq", 3, 4), digest_size=16)
    h.update(struct.pack("<4i", 0, 2, 2, 3))
    h.update(struct.pack("<3i", 0, 2, 1))
    assert legacy_fingerprint(A) == h.hexdigest()


@pytest.mark.parametrize("f", [fingerprint, legacy_fingerprint, extract_features])
def test_non_canonical_input_is_refused(f) -> None:
    unsorted = sp.csr_matrix(
        (np.ones(2), np.array([3, 1], dtype=np.int32), np.array([0, 2], dtype=np.int32)), shape=(1, 4)
    )
    with pytest.raises(MatrixFormatError, match="canonicalise"):
        f(unsorted)
    with pytest.raises(MatrixFormatError, match="CSR"):
        f(sp.coo_matrix(np.eye(2)))


def test_plans_first_step_queues_the_pass_and_the_features_then_waits_once(monkeypatch) -> None:
    """device_csr_and_fingerprint's order of work, on any machine (the GPU's steps replaced by NumPy ones that log
    when they are queued and read): the structure pass queued, the store asked (describe_if), the features
    queued, the selector found (meanwhile, told the matrix described), then the read-backs; a matrix found not
    canonical drops the features queued on it, unread, and its canonical form is checked and described the same
    way; without describe_if, no features."""
    from kernels._narrow import encode, narrow_rows
    from tuner.matrix.structure_gpu import Structure, canonical_reference

    log: list[str] = []
    read_backs: list[object] = []  # the one each matrix's pass and features write into: one copy back for both

    def queue_pass(indptr, indices, tags=None, values=None, into=None):
        log.append("pass")
        read_backs.append(into)
        sums = [*fp_module._sums_numpy(indptr, fp_module._TAGS[0]), *fp_module._sums_numpy(indices, fp_module._TAGS[1])]
        return lambda: log.append("read pass") or Structure(canonical_reference(indptr, indices), sums, 0,
                                                            encode(indptr, indices)[2],
                                                            int(np.count_nonzero(np.diff(indptr))))

    def queue_features(A, checked_apart=False, into=None):
        assert checked_apart  # CuPy's own check (a kernel and a wait) is not asked: the pass answers it
        assert into is read_backs[-1] is not None
        log.append(f"features of {A.nnz}")
        return lambda: log.append("read features") or extract_features(canonical(A))

    monkeypatch.setattr(fp_module, "ReadBack", lambda kept: object())  # plan()'s, its buffer kept by the thread
    monkeypatch.setattr(fp_module, "stays_on_device", lambda A: isinstance(A, sp.csr_matrix))
    monkeypatch.setattr(fp_module, "queue_structure_pass", queue_pass)
    monkeypatch.setattr(fp_module, "queue_features", queue_features)
    monkeypatch.setattr(fp_module, "kept_on_device", lambda A, dtype, found: A.astype(dtype or A.dtype))
    monkeypatch.setattr(fp_module, "as_device_csr", lambda A, dtype=None: canonical(A).astype(dtype or A.dtype))

    def describe(rows: int, cols: int, nnz: int, values: str) -> bool:
        log.append(f"describe {rows}x{cols} {nnz} {values}")
        return True

    def find(dtype: str, queued: object, of: sp.csr_matrix) -> None:
        log.append(f"selector {dtype} of {of.nnz}")

    A = random_canonical(3, (40, 30), 120)

    B, fp, features = fp_module.device_csr_and_fingerprint(A, dtype="float32", describe_if=describe, meanwhile=find)
    assert log == ["pass", f"describe 40x30 {A.nnz} float32", f"features of {A.nnz}", f"selector float32 of {A.nnz}",
                   "read pass", "read features"]
    assert B.dtype == np.float32 and fp == fingerprint(A) and features == extract_features(A)

    log.clear()  # columns of a row out of order, and a duplicate: dropped, then its canonical form described
    unsorted = sp.csr_matrix((np.ones(4), np.array([2, 1, 3, 3], dtype=np.int32), np.array([0, 2, 4], dtype=np.int32)),
                             shape=(2, 5))
    B, fp, features = fp_module.device_csr_and_fingerprint(unsorted, describe_if=describe, meanwhile=find)
    assert log == ["pass", "describe 2x5 4 float64", "features of 4", "selector float64 of 4", "read pass",
                   "pass", "describe 2x5 3 float64", "features of 3", "selector float64 of 3", "read pass",
                   "read features"]
    assert fp == fingerprint(canonical(unsorted)) and features == extract_features(canonical(unsorted))
    assert narrow_rows(B) == 3  # its canonical form's pass counted, and the count kept on it

    log.clear()
    assert fp_module.device_csr_and_fingerprint(A)[2] is None and log == ["pass", "read pass"]


@pytest.mark.gpu
def test_fingerprints_on_the_gpu_equal_the_cpu_ones() -> None:
    import cupyx.scipy.sparse as cusp

    from tests.kernel_cases import CASES, load_shared, shared_cases

    for A in [CASES[c]() for c in sorted(CASES)] + [load_shared(n) for n in shared_cases()]:
        on_gpu = cusp.csr_matrix(A)
        assert fingerprint(on_gpu) == fingerprint(A)
        assert legacy_fingerprint(on_gpu) == legacy_fingerprint(A)


@pytest.mark.gpu
def test_a_fingerprint_of_millions_of_entries_on_the_gpu_equals_the_cpu_one() -> None:
    """Past three strides of the kernel's grid (about 0.8 M words on an H100) each thread loads four words at a
    time: the sums, and so the fingerprint, are the same."""
    import cupyx.scipy.sparse as cusp

    from tests.test_structure_gpu import random_rows

    A = random_rows(300_000, 200_000, 8, seed=7)  # 1.2 M entries
    for B in (A, A[: A.shape[0] - 1]):  # and one row fewer: the four-word loop ends mid-stride
        B = sp.csr_matrix(B)
        assert fingerprint(cusp.csr_matrix(B)) == fingerprint(B)
