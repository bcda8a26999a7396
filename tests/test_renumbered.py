"""plan_renumbered(): the orders (hubs first, every vertex by degree), the renumbered matrix, and products in its
numbering, on the CPU anywhere and on the GPU where there is one."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from kernels._cuda import gpu_available
from tests.conftest import SHARED_MATRICES
from tests.kernel_cases import CASES, arrow, load_shared, shared_cases
from tuner import plan_renumbered
from tuner.execute.renumbered import HUB_FACTOR, ORDERS, RenumberedExecutor, hub_order
from tuner.matrix.io import as_csr

SQUARE_CASES = {name: build for name, build in CASES.items() if name in ("zero_nnz", "one_by_one", "random")}
SQUARE_CASES |= {
    "zero_nnz_square": lambda: as_csr(sp.csr_matrix((6, 6))),
    "empty_rows_square": lambda: as_csr(sp.diags((np.arange(300) % 3 == 0).astype(float))
                                        @ sp.random(300, 300, density=0.05, random_state=5)),
    "arrow": lambda: arrow(500),
    "hubs": lambda: _hubs(800, seed=3),
}
del SQUARE_CASES["zero_nnz"]  # 7 x 5: not square


def _hubs(n: int, seed: int) -> sp.csr_matrix:
    """A graph whose columns are read Zipf-unevenly: a few hubs hold most entries."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), 6)
    cols = np.minimum(rng.zipf(1.3, rows.size) - 1, n - 1)
    return as_csr(sp.csr_matrix((rng.uniform(0.5, 1.0, rows.size), (rows, cols)), shape=(n, n)))


def _square_shared() -> list[str]:
    names = []
    for name in shared_cases():
        if (SHARED_MATRICES / f"{name}.mtx.gz").exists():
            A = load_shared(name)
            if A.shape[0] == A.shape[1]:
                names.append(name)
    return names


@pytest.mark.parametrize("name", sorted(SQUARE_CASES))
def test_hub_order_puts_hubs_first_by_entries_then_the_rest_in_place(name):
    A = SQUARE_CASES[name]()
    order = hub_order(A)
    counts = np.bincount(A.indices, minlength=A.shape[1])
    mean = A.nnz / A.shape[1]
    hubs = sorted((v for v in range(A.shape[1]) if counts[v] > HUB_FACTOR * mean), key=lambda v: (-counts[v], v))
    want = hubs + [v for v in range(A.shape[1]) if counts[v] <= HUB_FACTOR * mean]
    assert order.dtype == np.int32
    np.testing.assert_array_equal(order, want)


def test_the_hubs_come_first_and_a_matrix_without_keeps_its_order():
    A = _hubs(800, seed=3)
    order = hub_order(A)
    counts = np.bincount(A.indices, minlength=800)
    hubs = int((counts > HUB_FACTOR * A.nnz / 800).sum())
    assert 0 < hubs < 100 and counts[order[0]] == counts.max() and (np.diff(counts[order[:hubs]]) <= 0).all()
    np.testing.assert_array_equal(hub_order(CASES["random"]()), np.arange(1000))  # no column of twice the mean


@pytest.mark.parametrize("name", sorted(SQUARE_CASES))
def test_the_degree_order_sorts_every_vertex_by_readers_then_number(name):
    A = SQUARE_CASES[name]()
    counts = np.bincount(A.indices, minlength=A.shape[1])
    want = sorted(range(A.shape[1]), key=lambda v: (-counts[v], v))
    np.testing.assert_array_equal(hub_order(A, ORDERS["degree"]), want)


@pytest.mark.skipif(gpu_available(), reason="checks the CPU path")
@pytest.mark.parametrize("order", ["degree", "best"])
def test_orders_on_the_cpu(order, tmp_path):
    A = _hubs(800, seed=3)
    ex = plan_renumbered(A, db=tmp_path / "s.db", order=order)
    assert ex.order_name == ("degree" if order == "degree" else "hubs") and not ex.others  # nothing measured
    np.testing.assert_array_equal(ex.order, hub_order(A, ORDERS[ex.order_name]))
    x = np.random.default_rng(2).standard_normal(800)
    np.testing.assert_allclose(ex.from_internal(ex(ex.to_internal(x))), A @ x, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(gpu_available(), reason="checks the CPU path")
def test_a_matrix_without_hubs_is_planned_as_itself(tmp_path):
    from tuner import plan

    A = CASES["random"]()
    assert plan_renumbered(A, db=tmp_path / "s.db").inner.fingerprint == plan(A, db=tmp_path / "s.db").fingerprint


@pytest.mark.skipif(gpu_available(), reason="checks the CPU path")
@pytest.mark.parametrize("name", sorted(SQUARE_CASES))
def test_products_in_the_internal_numbering_match_A(name, tmp_path):
    A = SQUARE_CASES[name]()
    ex = plan_renumbered(A, db=tmp_path / "s.db")
    assert isinstance(ex, RenumberedExecutor) and ex.shape == A.shape
    x = np.random.default_rng(0).standard_normal(A.shape[0])
    y = ex.from_internal(ex(ex.to_internal(x)))
    np.testing.assert_allclose(y, A @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(ex.from_internal(ex.to_internal(x)), x)
    assert "hubs first" in ex.explain() and ex.inner.source == "cpu"
    inside = ex.to_internal(x)
    bound = ex.bind(inside)  # an iteration in B's numbering, bound to its vectors
    inside[...] = ex.to_internal(2 * x)
    np.testing.assert_allclose(ex.from_internal(bound()), 2 * (A @ x), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(gpu_available(), reason="checks the CPU path")
def test_shared_square_matrices(tmp_path):
    names = _square_shared()
    if not names:
        pytest.skip("shared matrices not found")
    for name in names:
        A = load_shared(name)
        ex = plan_renumbered(A, db=tmp_path / "s.db")
        x = np.random.default_rng(1).standard_normal(A.shape[0])
        B = A[ex.order][:, ex.order]  # SciPy's own renumbering: the reference
        np.testing.assert_allclose(ex(ex.to_internal(x)), B @ x[ex.order], rtol=1e-10, atol=1e-10, err_msg=name)
        np.testing.assert_allclose(ex.from_internal(ex(ex.to_internal(x))), A @ x, rtol=1e-10, atol=1e-10,
                                   err_msg=name)


@pytest.mark.parametrize(("A", "kwargs", "match"), [
    (lambda: CASES["rectangular_wide"](), {}, "needs a square matrix .*A is 40 x 700"),
    (lambda: CASES["random"](), {"effort": "fast"}, "unknown effort 'fast'"),
    (lambda: CASES["random"](), {"effort": "tune", "trials": -1}, "trials must be a non-negative integer"),
    (lambda: CASES["random"](), {"order": "rcm"}, "unknown order 'rcm': one of 'hubs', 'degree', 'best'"),
])
def test_refuses_what_it_cannot_mean(A, kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        plan_renumbered(A(), db=tmp_path / "s.db", **kwargs)


def test_vectors_of_the_wrong_length_are_refused(tmp_path):
    ex = plan_renumbered(CASES["random"](), db=tmp_path / "s.db")
    with pytest.raises(ValueError, match=r"shape \(1000,\)"):
        ex.to_internal(np.ones(999))
    with pytest.raises(ValueError, match=r"shape \(1000,\)"):
        ex.from_internal(np.ones(5))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(SQUARE_CASES))
def test_gpu_products_in_the_internal_numbering_match_the_reference(name, tmp_path):
    import cupy
    import cupyx.scipy.sparse as cusp

    A = SQUARE_CASES[name]()
    np.testing.assert_array_equal(hub_order(cusp.csr_matrix(A)).get(), hub_order(A))
    for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
        ex = plan_renumbered(cusp.csr_matrix(A.astype(dtype)), db=tmp_path / "s.db", effort="race")
        assert ex.inner.source in ("raced", "default", "predicted")
        np.testing.assert_array_equal(ex.order, hub_order(A, ORDERS[ex.order_name]))
        (other, other_s), = ex.others.items()  # the race planned both orders and kept the faster
        assert other != ex.order_name
        assert other_s is None or ex.inner.choice.time_s <= other_s
        x = np.random.default_rng(0).standard_normal(A.shape[0]).astype(dtype)
        want = A.astype(np.float64) @ x.astype(np.float64)
        x_dev = cupy.asarray(x)
        y_dev = ex.from_internal(ex(ex.to_internal(x_dev)))
        assert isinstance(y_dev, cupy.ndarray)
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(y_dev.get(), want, rtol=tol, atol=tol * scale)
        np.testing.assert_allclose(ex.from_internal(ex(ex.to_internal(x))), want, rtol=tol, atol=tol * scale)
        inside = ex.to_internal(cupy.zeros_like(x_dev))
        bound = ex.bind(inside)  # captured on B's numbering; x filled in afterwards, in place
        inside[...] = ex.to_internal(x_dev)
        np.testing.assert_allclose(ex.from_internal(bound()).get(), want, rtol=tol, atol=tol * scale)
        if name == "random" and ex.order_name == "hubs":  # no hubs: A itself, found in the store as plan(A) finds it
            from tuner import plan

            assert plan(cusp.csr_matrix(A.astype(dtype)), db=tmp_path / "s.db").fingerprint == ex.inner.fingerprint
        again = plan_renumbered(cusp.csr_matrix(A.astype(dtype)), db=tmp_path / "s.db", order=ex.order_name)
        assert again.inner.fingerprint == ex.inner.fingerprint  # B found again: answered from the store
        if ex.inner.source == "raced":
            assert again.inner.source == "raced" and again.inner.race is None
