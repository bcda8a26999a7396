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


def test_plan_refuses_a_matrix_with_nan_and_stores_nothing(A, tmp_path):
    bad = A.copy()
    bad.data[5] = np.nan
    with pytest.raises(MatrixFormatError, match="1 NaN or Inf value"):
        plan(bad, db=tmp_path / "s.db")
    if gpu_available():  # a CuPy matrix stays on the GPU, where its values are checked
        import cupyx.scipy.sparse as cusp

        with pytest.raises(MatrixFormatError, match="1 NaN or Inf value"):
            plan(cusp.csr_matrix(bad), db=tmp_path / "s.db")
    assert not Store(tmp_path / "s.db").db["matrices"].count


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"effort": "fast"}, "unknown effort 'fast': one of 'predict', 'race', 'tune'"),
    ({"effort": "tune", "trials": -1}, "trials must be a non-negative integer"),
    ({"effort": "tune", "trials": 2.5}, "trials must be a non-negative integer"),
    ({"effort": "race", "trials": 3}, "trials is for effort='tune' only"),
    ({"race_size": 0}, "race_size must be a positive integer"),
])
def test_plan_refuses_what_it_cannot_mean(A, tmp_path, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        plan(A, db=tmp_path / "s.db", **kwargs)


@pytest.mark.gpu
def test_plan_on_gpu_predicts_races_then_answers_from_the_store(A, tmp_path):
    import cupy

    store = Store(tmp_path / "s.db")
    ex = plan(A, db=store, effort="predict")  # no selector for this GPU in the tests: cuSPARSE
    assert ex.source == "default" and ex.kernel == "cusparse" and ex.race is None
    ex = plan(A, db=store)  # the default effort races, and stores every lap (behind: the next plan() waits)
    assert ex.source == "raced" and ex.race is not None and ex.race.winner is not None
    assert ex.race.recorded.result() > 0 and set(ex.race.seconds) >= {"reference", "record"}
    laps = ex.race.laps
    assert len(laps) == len(store.trials(ex.fingerprint, device=ex.device, dtype="float64"))
    assert {lap.entrant.kernel for lap in laps} >= {"cusparse", "csr_vector", "csr_scalar"}
    assert (ex.kernel, ex.params) == (ex.race.winner.entrant.kernel, ex.race.winner.entrant.params)
    assert ex.race.winner.time_s == min(lap.time_s for lap in laps)
    assert ex.prepare_s is None  # the winner came prepared from the race
    # a matrix of a shape the store never held: described in the matrix's round trip, nothing looked up
    assert set(ex.cost) >= {"matrix+features", "rank", "race", "prepare", "total"} and "lookup" not in ex.cost
    assert "the race" in ex.explain() and "plan() took" in ex.explain()
    assert "ex.bind(x, out)" in ex.explain()  # a product of a few us: a loop of them waits on the host
    x = np.random.default_rng(1).standard_normal(90)
    np.testing.assert_allclose(ex(x), A @ x, rtol=1e-12, atol=1e-12)
    again = plan(A, db=store)  # measured before: from the store, no race
    assert again.source == "raced" and again.race is None and (again.kernel, again.params) == (ex.kernel, ex.params)
    assert "lookup" in again.cost and not {"features", "matrix+features"} & set(again.cost)
    y_dev = again(cupy.asarray(x))
    assert isinstance(y_dev, cupy.ndarray)
    np.testing.assert_allclose(y_dev.get(), A @ x, rtol=1e-12, atol=1e-12)
    out = cupy.empty(120)
    assert again(cupy.asarray(x), out=out) is out
    assert plan(A, dtype="float32", db=store, effort="predict").source == "default"  # another dtype: nothing
    other = A.copy()  # the shape and nonzeros of a stored matrix, not its structure: looked up, then described
    r = int(np.flatnonzero(np.diff(A.indptr))[0])
    other.indices[A.indptr[r]] = next(c for c in range(A.shape[1]) if c not in A.indices[A.indptr[r]:A.indptr[r + 1]])
    other.sort_indices()
    guessed = plan(other, db=store, effort="predict")
    assert guessed.fingerprint != ex.fingerprint and guessed.source == "default"
    assert {"matrix", "lookup", "features"} <= set(guessed.cost)


@pytest.mark.gpu
def test_plan_tunes_and_keeps_a_matrix_on_the_gpu(A, tmp_path):
    import cupyx.scipy.sparse as cusp

    store = Store(tmp_path / "s.db")
    A_dev = cusp.csr_matrix(A)
    ex = plan(A_dev, db=store, effort="tune", trials=6)
    best = store.best(ex.fingerprint, device=ex.device, dtype="float64")
    assert ex.source == "tuned" and (ex.kernel, ex.params) == (best["kernel"], best["params"])
    assert ex._prepared.A is A_dev  # prepared where it was: no copy through the host
    assert "tune" in ex.cost


@pytest.mark.gpu
def test_plan_finds_what_was_tuned_under_the_old_fingerprint(A, tmp_path):
    from tuner.matrix.fingerprint import legacy_fingerprint
    from tuner.measure.backend import GpuBackend

    store = Store(tmp_path / "s.db")
    old = legacy_fingerprint(A)
    backend = GpuBackend()
    store.add_matrix(old, name="old", rows=120, cols=90, nnz=A.nnz, fingerprint_scheme=1)
    store.add_device(backend.info.record(None))
    store.add_trial({"fingerprint": old, "device": backend.info.id, "dtype": "float64", "kernel": "csr_vector",
                     "params": {"threads_per_row": 2, "block_size": 64}, "state": "ok", "time_s": 1e-6,
                     "verified": True, "study": "an old study"})
    ex = plan(A, db=store)
    assert ex.source == "tuned" and ex.params == {"threads_per_row": 2, "block_size": 64}
    np.testing.assert_allclose(ex(np.ones(90)), A @ np.ones(90), rtol=1e-12)
