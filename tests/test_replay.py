"""``Executor.bind``: a product bound to one x and one out, for loops (a CUDA graph on the GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from db.store import Store
from kernels import REGISTRY
from kernels._cuda import gpu_available
from tests.kernel_cases import CASES
from tuner import plan
from tuner.execute.choice import Choice
from tuner.execute.executor import Executor

CONFIGS = [(name, {}) for name in REGISTRY] + [
    ("suraa", {"grouping": "segment", "g1_mode": "block", "streams": 4}),  # side streams, joined by events
    ("suraa", {"g1_mode": "dynamic"}),  # child grids launched from the GPU
    ("suraa", {"grouping": "segment", "g1_mode": "dynamic", "streams": 4}),
]


@pytest.mark.skipif(gpu_available(), reason="checks the CPU fallback")
def test_without_a_gpu_a_bound_product_is_scipys_and_follows_x(tmp_path) -> None:
    A = CASES["huge_row"]()
    x = np.random.default_rng(0).standard_normal(A.shape[1])
    bound = plan(A, db=tmp_path / "s.db").bind(x)
    assert not bound.captured and "no GPU" in bound.reason
    np.testing.assert_allclose(bound(), A @ x)
    x[...] = 2.0  # updated in place, as an iterative method does
    assert bound() is bound.out
    np.testing.assert_allclose(bound.out, A @ x)


@pytest.mark.gpu
@pytest.mark.parametrize(("kernel", "params"), CONFIGS, ids=lambda v: v if isinstance(v, str) else str(v or ""))
@pytest.mark.parametrize("case", ["huge_row", "empty_rows", "rectangular_wide", "zero_nnz"])
def test_a_family_is_captured_where_it_allows_and_the_graph_reads_x_where_it_lies(kernel, params, case) -> None:
    import cupy
    import cupyx.scipy.sparse as cusp

    from tuner.measure.backend import GpuBackend

    A = CASES[case]()
    ex = Executor(A=cusp.csr_matrix(A), choice=Choice(kernel, params, "tuned"), backend=GpuBackend(),
                  fingerprint="test")
    rng = np.random.default_rng(1)
    x = cupy.asarray(rng.standard_normal(A.shape[1]))
    bound = ex.bind(x)
    refusal = ex._family.uncapturable(ex._prepared.params)  # the config as prepared, its defaults filled in
    assert bound.captured == (refusal is None), bound.reason
    assert bound.captured or bound.reason == refusal
    for _ in range(3):  # each launch reads x as it is then; other arrays allocated between do not disturb it
        x[...] = cupy.asarray(rng.standard_normal(A.shape[1]))
        noise = cupy.full(A.shape[0] * 4 + 1024, np.nan)
        y = bound()
        assert y is bound.out
        np.testing.assert_allclose(y.get(), A @ x.get(), rtol=1e-10, atol=1e-12)
        del noise


def test_only_cusparse_and_child_grids_are_not_captured() -> None:
    refused = {(name, str(params)): REGISTRY[name].uncapturable(REGISTRY[name].space.validate(params, family=name))
               for name, params in CONFIGS}
    assert {key for key, why in refused.items() if why} == {
        ("cusparse", "{}"), ("suraa", "{'g1_mode': 'dynamic'}"),
        ("suraa", "{'grouping': 'segment', 'g1_mode': 'dynamic', 'streams': 4}")}


@pytest.mark.gpu
def test_bind_refuses_an_x_it_would_have_to_copy(tmp_path) -> None:
    import cupy

    A = CASES["random"]()
    ex = plan(A, db=Store(tmp_path / "s.db"), effort="predict")
    for x in (np.ones(A.shape[1]), cupy.ones(A.shape[1], dtype=cupy.float32), cupy.ones((A.shape[1], 2))[:, 0]):
        with pytest.raises(ValueError, match="bind\\(\\) takes a contiguous CuPy x of dtype float64"):
            ex.bind(x)
    with pytest.raises(ValueError, match="shape"):
        ex.bind(cupy.ones(A.shape[1] + 1))
