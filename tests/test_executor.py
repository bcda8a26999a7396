"""plan(): the executor, on the CPU anywhere and on the GPU where there is one."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
import scipy.sparse as sp

from db.store import Store
from kernels._cuda import gpu_available
from tuner import Executor, MatrixFormatError, plan
from tuner.matrix.io import as_csr

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def A():
    return as_csr(sp.random(120, 90, density=0.05, format="csr", random_state=11))


@pytest.mark.skipif(gpu_available(), reason="checks the CPU fallback")
def test_plan_without_gpu_uses_scipy_and_says_so(A, tmp_path):
    ex = plan(A, db=tmp_path / "s.db")
    assert isinstance(ex, Executor)
    assert ex.source == "cpu" and ex.kernel == "scipy"
    assert "no CUDA GPU" in ex.explain() and "source='cpu'" in repr(ex)
    x = np.random.default_rng(0).standard_normal(90)
    np.testing.assert_allclose(ex(x), A @ x)
    out = np.empty(120)
    assert ex(x, out=out) is out
    np.testing.assert_allclose(out, A @ x)
    with pytest.raises(ValueError, match=r"shape \(90,\)"):
        ex(np.ones(120))


def test_plan_accepts_paths_triples_and_dtypes(A, tmp_path):
    from tuner.matrix.io import write_mtx

    path = tmp_path / "a.mtx"
    write_mtx(path, A)
    ex_path = plan(path, db=tmp_path / "s.db")
    ex_triple = plan((A.indptr, A.indices, A.data), db=tmp_path / "s.db")
    assert ex_path.fingerprint == ex_triple.fingerprint
    assert plan(A, dtype="float32", db=tmp_path / "s.db").dtype == np.float32
    with pytest.raises(MatrixFormatError):
        plan(np.ones((3, 3)), db=tmp_path / "s.db")


@pytest.mark.gpu
def test_plan_on_gpu_default_then_tuned(A, tmp_path):
    import cupy

    from tuner.measure.backend import GpuBackend
    from tuner.search.loop import tune
    from tuner.search.storage import open_storage

    store = Store(tmp_path / "s.db")
    ex = plan(A, db=store)
    assert ex.source == "default" and ex.kernel == "cusparse"
    result = tune(A, backend=GpuBackend(), store=store, storage=open_storage(str(tmp_path / "j.log")), trials=8)
    ex = plan(A, db=store)
    best = store.best(result.fingerprint, device=result.device.id, dtype="float64")
    assert ex.source == "tuned" and (ex.kernel, ex.params) == (best["kernel"], best["params"])
    assert "tuned" in ex.explain() and ex.prepare_s is not None
    x = np.random.default_rng(1).standard_normal(90)
    np.testing.assert_allclose(ex(x), A @ x, rtol=1e-12, atol=1e-12)
    y_dev = ex(cupy.asarray(x))
    assert isinstance(y_dev, cupy.ndarray)
    np.testing.assert_allclose(y_dev.get(), A @ x, rtol=1e-12, atol=1e-12)
    out = cupy.empty(120)
    assert ex(cupy.asarray(x), out=out) is out
    # Another dtype has no tuned entry yet.
    assert plan(A, dtype="float32", db=store).source == "default"
