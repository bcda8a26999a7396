"""Conformance suite every family must pass, parametrized over the registry.

CPU part (any machine): each family's reference, for every config of its
space, computes y = A·x within the verification bound on the hard cases and
on the shared matrices, and rejects bad shapes. GPU part (marked ``gpu``): each
family's GPU result matches its own CPU reference on the same cases and on every
shared matrix, in float64 and float32.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from common.errors import InvalidConfigError
from kernels import BASELINE, REGISTRY, get_family
from kernels.csr_vector import CsrVector
from tests.kernel_cases import CASES, load_shared, shared_cases
from tuner.measure.verify import Reference

FAMILIES = sorted(REGISTRY)
DTYPES = ("float64", "float32")


@functools.cache
def case(name: str, dtype: str):
    A = CASES[name]() if name in CASES else load_shared(name)
    return A.astype(dtype)


def configs(family: str, limit: int = 40) -> list[dict]:
    """Every config of a small space; an even, deterministic sample of a large one, plus the default and, for
    each value of a parameter the sample lacks, the first config with it (a stride can step over one)."""
    space = REGISTRY[family].space
    every = space.configs()
    if len(every) <= limit:
        return every
    sample = every[:: -(-len(every) // limit)]
    sample = sample if space.defaults() in sample else [space.defaults(), *sample]
    for p in space.params:
        for value in p.values:
            if not any(c.get(p.name) == value for c in sample):
                sample.append(next(c for c in every if c.get(p.name) == value))
    return sample


# -- the registry and the spaces -------------------------------------------------
def test_registry_names_and_baseline():
    assert BASELINE in REGISTRY
    for name, f in REGISTRY.items():
        assert f.name == name
        assert f.space.validate(f.space.defaults()) == f.space.defaults()
        assert f.describe()["params"] == f.space.to_dict()


def test_unknown_family_and_params_are_rejected_with_the_allowed_ones():
    with pytest.raises(InvalidConfigError, match="known kernels"):
        get_family("nope")
    f = get_family("csr_vector")
    with pytest.raises(InvalidConfigError, match="allowed"):
        f.space.validate({"threads_per_row": 3})
    with pytest.raises(InvalidConfigError, match="unknown parameter"):
        f.space.validate({"warp": 32})


# -- CPU references ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_reference_every_config_on_hard_cases(family, name, dtype):
    A = case(name, dtype)
    ref = Reference.build(A, dtype, seed=1)
    f = REGISTRY[family]
    for params in configs(family):
        y = f.run_reference(f.prepare_reference(A, params), ref.x)
        assert y.dtype == np.dtype(dtype) and y.shape == (A.shape[0],)
        ok, err, msg = ref.check(y)
        assert ok, f"{family} {params}: {msg}"


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_on_shared_matrices(family, shared_dir):
    """Each family computes A·x on the shared matrices, or refuses a large one it cannot pay on with the reason
    (rcm: no narrow order; rowsort: rows in order already, or scattered whatever their order): a tenth of them at
    most."""
    f = REGISTRY[family]
    refused = []
    for name in shared_cases():
        A = case(name, "float64")
        ref = Reference.build(A, "float64")
        try:
            prepared = f.prepare_reference(A, f.space.defaults())
        except InvalidConfigError as e:
            refused.append(f"{name}: {e}")
            assert max(A.shape) >= 1 << 16, f"{family} refused the small {name} ({A.shape}): {e}"
            continue
        ok, _, msg = ref.check(f.run_reference(prepared, ref.x))
        assert ok, f"{family} on {name}: {msg}"
    assert len(refused) <= len(shared_cases()) // 10, refused


@pytest.mark.parametrize("family", FAMILIES)
def test_reference_rejects_bad_vectors(family):
    f = REGISTRY[family]
    A = case("rectangular_wide", "float64")
    prepared = f.prepare_reference(A)
    with pytest.raises(ValueError, match="length 700"):
        f.run_reference(prepared, np.ones(40))
    with pytest.raises(ValueError, match="dtype"):
        f.run_reference(prepared, np.ones(700, dtype=np.float32))
    with pytest.raises(ValueError, match="out must be"):
        f.run_reference(prepared, np.ones(700), out=np.empty(39))
    out = np.full(40, np.nan)
    assert f.run_reference(prepared, np.ones(700), out=out) is out and np.isfinite(out).all()


def test_csr_vector_reference_reproduces_lane_partials_and_the_tree():
    """Row of 5 entries with 4 lanes: lanes hold (a0+a4, a1, a2, a3); the tree adds (l0+l2)+(l1+l3)."""
    import scipy.sparse as sp

    vals = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    A = sp.csr_matrix((vals, np.arange(5, dtype=np.int32), np.array([0, 5], dtype=np.int32)), shape=(1, 5))
    f = CsrVector()
    prepared = f.prepare_reference(A, {"threads_per_row": 4})
    np.testing.assert_array_equal(prepared.extra["slot"], [0, 1, 2, 3, 0])
    assert f.run_reference(prepared, np.ones(5))[0] == 31.0
    # Float32 rounding follows the same order: 2**24 + 1 + 1 is lost one way, kept the other.
    vals32 = np.array([2.0**24, 1.0, 1.0], dtype=np.float32)
    B = sp.csr_matrix((vals32, np.arange(3, dtype=np.int32), np.array([0, 3], dtype=np.int32)), shape=(1, 3))
    assert f.run_reference(f.prepare_reference(B, {"threads_per_row": 2}), np.ones(3, np.float32))[0] == 2.0**24 + 2


def test_csr_vector_runs_over_the_nonempty_rows_alone_where_most_rows_are_empty():
    """At least EMPTY_SHARE of the rows empty: the reference lists the nonempty rows, its row pointer is A's at
    those rows then nnz, and y is the same as without the list (empty rows 0); fewer empty: no list. A noted count
    decides (plan()'s structure pass counts them), and a stale one costs no wrong product."""
    from kernels.csr_vector import EMPTY_SHARE, note_empty_rows

    A, x = case("empty_rows", "float64"), np.linspace(-1.0, 1.0, 400)
    filled = np.flatnonzero(np.diff(A.indptr))
    assert filled.size <= (1 - EMPTY_SHARE) * A.shape[0]
    f = REGISTRY["csr_vector"]
    for params in ({"threads_per_row": 2}, {"threads_per_row": 32, "indices": "int32"}):
        listed = f.prepare_reference(A, params)
        np.testing.assert_array_equal(listed.extra["listed"], filled)
        np.testing.assert_array_equal(listed.extra["listed_ptr"], np.append(A.indptr[filled], A.nnz))
        y = f.run_reference(listed, x)
        whole = CsrVector(lists_rows=False).prepare_reference(A, params)
        assert "listed" not in whole.extra
        np.testing.assert_allclose(y, f.run_reference(whole, x), rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
        assert not y[np.diff(A.indptr) == 0].any()
    assert "listed" not in f.prepare_reference(case("rectangular_tall", "float64"), {}).extra  # 12 % empty
    stale = A.copy()
    note_empty_rows(stale, 0)
    assert "listed" not in f.prepare_reference(stale, {}).extra
    full = case("random", "float64").copy()
    note_empty_rows(full, full.shape[0])
    every = f.prepare_reference(full, {})
    assert every.extra["listed"].size == full.shape[0]
    np.testing.assert_allclose(f.run_reference(every, np.ones(1000)), full @ np.ones(1000), rtol=1e-12)


# -- GPU against the CPU references -------------------------------------------------
def _gpu_check(family: str, A, dtype: str, params: dict) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    f = REGISTRY[family]
    ref = Reference.build(A, dtype, seed=2)
    try:
        reference = f.prepare_reference(A, params)
    except InvalidConfigError as e:  # refused (see test_reference_on_shared_matrices): the GPU refuses alike
        with pytest.raises(InvalidConfigError, match=re.escape(str(e))):
            f.prepare(cusp.csr_matrix(A), params)
        return
    expected = f.run_reference(reference, ref.x)
    prepared = f.prepare(cusp.csr_matrix(A), params)
    out = cupy.full(A.shape[0], cupy.nan, dtype=dtype)
    y = f.run(prepared, cupy.asarray(ref.x), out).get()
    ok, err, msg = ref.check(y)
    assert ok, f"{family} {params}: {msg}"
    scale = np.maximum(ref.scale, np.finfo(np.float64).tiny)
    assert np.all(np.abs(y - expected) / scale <= 2 * ref.rtol), f"{family} {params}: GPU differs from its reference"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_every_config_on_hard_cases(family, name, dtype):
    for params in configs(family):
        _gpu_check(family, case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_on_every_shared_matrix(family, dtype, shared_dir):
    f = REGISTRY[family]
    for name in shared_cases():
        for params in (f.space.defaults(), *configs(family)[:: max(1, len(configs(family)) // 4)]):
            _gpu_check(family, case(name, dtype), dtype, params)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_csr_vector_lists_the_rows_the_structure_pass_found_filled(dtype):
    """A matrix padded to 10 times its rows (90 % empty), put on the GPU as plan() puts it: its empty rows noted
    by the structure pass, csr_vector runs over the filled rows alone and gives its reference's y, every empty
    row's entry 0 whatever ``out`` held; a count noted as 0 keeps every row."""
    import cupy
    import cupyx.scipy.sparse as cusp
    import scipy.sparse as sp

    from kernels.csr_vector import note_empty_rows
    from tuner.matrix.io import as_device_csr

    rng = np.random.default_rng(11)
    filled = np.sort(rng.choice(200_000, 20_000, replace=False))
    lengths = rng.integers(1, 300, filled.size)
    rows = np.repeat(filled, lengths)
    A = sp.csr_matrix((rng.standard_normal(rows.size), (rows, rng.integers(0, 50_000, rows.size))),
                      shape=(200_000, 50_000)).astype(dtype)
    A.sum_duplicates()
    B = as_device_csr(cusp.csr_matrix(A))
    f, x = REGISTRY["csr_vector"], Reference.build(A, dtype, seed=3).x
    tol = 1e-12 if dtype == "float64" else 1e-5
    for params in ({"threads_per_row": 4}, {"threads_per_row": 32, "indices": "int32"}):
        prepared = f.prepare(B, params)
        assert prepared.extra["listed"].size == filled.size
        out = cupy.full(A.shape[0], cupy.nan, dtype=dtype)
        y = f.run(prepared, cupy.asarray(x), out).get()
        expected = f.run_reference(f.prepare_reference(A, params), x)
        np.testing.assert_allclose(y, expected, rtol=tol, atol=tol * np.abs(expected).max())
        assert not y[np.setdiff1d(np.arange(A.shape[0]), filled)].any()
    C = cusp.csr_matrix(A)
    note_empty_rows(C, 0)
    assert "listed" not in f.prepare(C, {}).extra


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_gpu_rejects_bad_vectors(family):
    import cupy
    import cupyx.scipy.sparse as cusp

    f = REGISTRY[family]
    prepared = f.prepare(cusp.csr_matrix(case("rectangular_wide", "float64")))
    with pytest.raises(ValueError, match="length 700"):
        f.run(prepared, cupy.ones(40))
    with pytest.raises(ValueError, match="dtype"):
        f.run(prepared, cupy.ones(700, dtype=cupy.float32))
    with pytest.raises(TypeError, match="cupy"):
        f.run(prepared, np.ones(700))


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", ["csr_alg1", "csr_alg2"])
def test_gpu_cusparse_keeps_only_its_work_buffer(algorithm):
    """cuSPARSE's preparation holds its descriptors and work buffer, no vectors of m or n values (its vector
    descriptors are placeholders each product re-points): products into other x and y, one after another, are
    each A·x."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = case("rectangular_wide", "float64")
    f = REGISTRY[BASELINE]
    prepared = f.prepare(cusp.csr_matrix(A), {"algorithm": algorithm})
    ex = prepared.extra
    assert prepared.extra_bytes == ex["buffer"].nbytes + ex["alpha"].nbytes + ex["beta"].nbytes  # alpha, beta: 1 value
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = rng.uniform(-1, 1, A.shape[1])
        y = f.run(prepared, cupy.asarray(x)).get()
        np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
