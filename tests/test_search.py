"""The whole tuning loop on the CPU references: search, verification, failures, store, resume."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import optuna
import pytest
import scipy.sparse as sp

from common.errors import InvalidConfigError, NoDeviceError, NotApplicableError
from db.store import Store
from kernels import REGISTRY, get_family
from kernels.csr_scalar import CsrScalar
from kernels.csr_vector import CsrVector
from tests.conftest import REPO
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend, get_backend
from tuner.search.loop import tune
from tuner.search.storage import open_storage
from tuner.search.study import study_name

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def A():
    return as_csr(sp.random(300, 250, density=0.03, format="csr", random_state=3))


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "t.db")


def run(A, store, storage, **kw):
    return tune(A, backend=CpuReferenceBackend(), store=store, storage=storage, name="m", **kw)


def test_tune_records_trials_best_and_summary(A, store, tmp_path):
    storage = open_storage(str(tmp_path / "j.log"))
    result = run(A, store, storage, trials=12)
    rows = store.trials(result.fingerprint)
    assert len(rows) == len(result.trials) > 0
    assert all(r["verified"] == 1 and r["state"] == "ok" and r["time_s"] > 0 for r in rows)
    assert {r["kernel"] for r in rows} == set(REGISTRY)  # every family's default is measured first
    best = store.best(result.fingerprint, device=result.device.id, dtype="float64")
    assert best["time_s"] == min(r["time_s"] for r in rows)
    assert {s.kernel for s in result.summary} == set(REGISTRY)
    cusparse = next(s for s in result.summary if s.kernel == "cusparse")
    assert cusparse.ratio_to_cusparse == pytest.approx(1.0)
    assert all(s.gflops > 0 and s.bandwidth_fraction > 0 for s in result.summary)
    assert store.device(result.device.id)["kind"] == "cpu-reference"


def test_running_again_continues_the_study(A, store, tmp_path):
    storage = open_storage(str(tmp_path / "j.log"))
    first = run(A, store, storage, trials=6)
    second = run(A, store, storage, trials=6)
    study = optuna.load_study(study_name=first.study, storage=storage)
    assert second.study == first.study
    # with more families than 6 trials, defaults the first run queued still wait: run, never queued twice
    assert len(study.trials) == 12 and all(t.state.is_finished() for t in study.trials)
    numbers = [r["trial_number"] for r in store.trials(first.fingerprint)]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_restricting_kernels_only_tries_those(A, store, tmp_path):
    result = run(A, store, open_storage(str(tmp_path / "j.log")), trials=8, kernels=["csr_vector"])
    assert {t.kernel for t in result.trials} == {"csr_vector"}
    with pytest.raises(InvalidConfigError, match="known kernels"):
        run(A, store, open_storage(str(tmp_path / "j.log")), trials=1, kernels=["nope"])


class _Wrong(CsrScalar):
    """A deliberately broken kernel: drops the last entry of every row for block_size 64."""

    def _run_reference(self, prepared, x):
        y = super()._run_reference(prepared, x)
        if prepared.params["block_size"] == 64:
            A = prepared.A
            last = A.indptr[1:][np.diff(A.indptr) > 0] - 1
            rows = np.flatnonzero(np.diff(A.indptr) > 0)
            y[rows] -= A.data[last] * x[A.indices[last]]
        return y


class _Crash(CsrVector):
    def _prepare_reference(self, prepared):
        raise MemoryError("pretend the device ran out of memory")


def test_wrong_answers_and_crashes_are_recorded_and_the_search_goes_on(A, store, tmp_path, monkeypatch):
    monkeypatch.setitem(REGISTRY, "csr_scalar", _Wrong())
    monkeypatch.setitem(REGISTRY, "csr_vector", _Crash())
    storage = open_storage(str(tmp_path / "j.log"))
    result = run(A, store, storage, trials=25, kernels=["csr_scalar", "csr_vector"],
                 enqueue=[("csr_scalar", {"block_size": 64})])  # the broken config surely measured
    rows = store.trials(result.fingerprint)
    kinds = {r["error_kind"] for r in rows if r["state"] == "failed"}
    assert "out_of_memory" in kinds
    wrong = [r for r in rows if r["kernel"] == "csr_scalar" and r["params"]["block_size"] == 64]
    assert wrong and all(r["error_kind"] == "wrong_answer" and r["verified"] == 0 for r in wrong)
    assert "relative error" in wrong[0]["error"]
    good = [r for r in rows if r["state"] == "ok"]
    assert good and all(r["kernel"] == "csr_scalar" and r["params"]["block_size"] != 64 for r in good)
    best = store.best(result.fingerprint, device=result.device.id, dtype="float64")
    assert best["kernel"] == "csr_scalar" and best["params"]["block_size"] != 64
    study = optuna.load_study(study_name=result.study, storage=storage)
    assert any(t.state == optuna.trial.TrialState.FAIL for t in study.trials)


class _Refuses(CsrVector):
    def _prepare_reference(self, prepared):
        raise NotApplicableError("pretend this matrix's rows are in order already")


def test_a_family_that_refuses_the_matrix_is_sampled_no_more_and_spends_no_budget(A, store, tmp_path, monkeypatch):
    """A refusal whatever the parameters (NotApplicableError: rowsort on rows in order) fails that one trial;
    optuna's later picks of the family are pruned, not measured and not counted, in this run and the next."""
    monkeypatch.setitem(REGISTRY, "csr_vector", _Refuses())
    storage = open_storage(str(tmp_path / "j.log"))
    result = run(A, store, storage, trials=30, summary=False)
    refused = [t for t in result.trials if t.kernel == "csr_vector"]
    assert len(refused) == 1 and refused[0].error_kind == "not_applicable"
    assert "rows are in order" in refused[0].error
    study = optuna.load_study(study_name=result.study, storage=storage)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.FAIL) == 1 and states.count(optuna.trial.TrialState.COMPLETE) == 29
    pruned = [t for t in study.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert all(t.params["kernel"] == "csr_vector" for t in pruned)
    again = run(A, store, storage, trials=10, summary=False)
    assert all(t.kernel != "csr_vector" for t in again.trials)
    study = optuna.load_study(study_name=result.study, storage=storage)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) == 39
    rows = store.trials(result.fingerprint)
    assert [r["error_kind"] for r in rows if r["kernel"] == "csr_vector"] == ["not_applicable"]
    # a search of the refusing family alone ends after its refusal instead of asking forever
    alone = run(A, store, open_storage(str(tmp_path / "k.log")), trials=5, kernels=["csr_vector"], summary=False)
    assert len(alone.trials) == 0  # the store knew already: nothing to measure
    fresh = run(A, Store(tmp_path / "u.db"), open_storage(str(tmp_path / "l.log")), trials=5, kernels=["csr_vector"],
                summary=False)
    assert [t.error_kind for t in fresh.trials] == ["not_applicable"]


def test_float32_study_is_separate(A, store, tmp_path):
    storage = open_storage(str(tmp_path / "j.log"))
    r64 = run(A, store, storage, trials=3)
    r32 = run(A, store, storage, trials=3, dtype="float32")
    assert r64.study != r32.study == study_name(r64.fingerprint, r64.device, "float32")
    assert store.best(r32.fingerprint, device=r32.device.id, dtype="float32") is not None


def test_gpu_backend_without_gpu_says_so():
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    with pytest.raises(NoDeviceError, match="cpu-reference"):
        get_backend("gpu")
    with pytest.raises(InvalidConfigError, match="unknown device"):
        get_backend("tpu")


def test_two_processes_tune_at_once_without_database_is_locked(tmp_path):
    """The default storage (a journal file) and the WAL store take two concurrent tuners."""
    script = textwrap.dedent(
        f"""
        import sys, optuna, scipy.sparse as sp
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        from db.store import Store
        from tuner.measure.backend import CpuReferenceBackend
        from tuner.matrix.io import as_csr
        from tuner.search.loop import tune
        from tuner.search.storage import open_storage, default_storage
        store = Store({str(tmp_path / 'shared.db')!r})
        A = as_csr(sp.random(400, 400, density=0.02, format="csr", random_state=int(sys.argv[1])))
        tune(A, backend=CpuReferenceBackend(), store=store, storage=open_storage(default_storage(store.path)),
             trials=15, seed=int(sys.argv[1]))
        print("done")
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(s)], cwd=REPO, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for s in (1, 2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "done" in out, err
        assert "locked" not in err
    store = Store(tmp_path / "shared.db")
    assert store.count_matrices() == 2
    for m in store.matrices():
        assert len(store.trials(m["fingerprint"])) > 0


def test_a_second_store_on_the_same_study_gets_its_own_measurements(A, tmp_path):
    """Configs the shared study already knows are measured again for a store that lacks them."""
    storage = open_storage(str(tmp_path / "j.log"))
    run(A, Store(tmp_path / "a.db"), storage, trials=10)
    other = Store(tmp_path / "b.db")
    result = run(A, other, storage, trials=len(REGISTRY))
    assert {r["kernel"] for r in other.trials(result.fingerprint)} == set(REGISTRY)
    assert {s.kernel for s in result.summary} == set(REGISTRY)


def test_verification_catches_a_dropped_entry_and_admits_subnormal_rounding():
    import dataclasses

    from tuner.measure.verify import Reference

    A = as_csr(sp.csr_matrix(np.array([[3e-43, 0.0, 0.0], [1.0, 2.0, 3.0]], dtype=np.float32)))
    ref = Reference.build(A, "float32", seed=4)
    ref = dataclasses.replace(ref, x=np.array([0.3, 0.5, -0.7], np.float32))
    x64 = ref.x.astype(np.float64)
    ref = dataclasses.replace(ref, y=A.astype(np.float64) @ x64, scale=abs(A.astype(np.float64)) @ np.abs(x64))
    y32 = np.array([A.data[0] * ref.x[0], (A.data[1:] * ref.x).sum(dtype=np.float32)], np.float32)
    assert ref.check(y32)[0]  # row 0 is one subnormal product: its rounding error is absolute
    assert not dataclasses.replace(ref, atol=0.0).check(y32)[0]
    dropped = y32.copy()
    dropped[1] -= np.float32(3.0) * ref.x[2]
    ok, _, msg = ref.check(dropped)
    assert not ok and "row 1" in msg
    nan = y32.copy()
    nan[0] = np.nan
    assert not ref.check(nan)[0]


def test_enqueued_configs_are_measured_once_each_before_the_defaults(A, store, tmp_path):
    storage = open_storage(str(tmp_path / "j.log"))
    extra = [("csr_vector", {"threads_per_row": 2, "block_size": 64, "indices": "int32"}),
             ("csr_scalar", {"block_size": 1024, "unroll": 2, "indices": "int32"}),
             ("csr_vector", {"threads_per_row": 32, "block_size": 1024, "indices": "narrow"})]
    first = run(A, store, storage, trials=len(REGISTRY) + len(extra) - 2, enqueue=extra)
    measured = [(t.kernel, t.params) for t in first.trials]
    assert measured[: len(extra)] == extra  # the enqueued configs first, in order
    # then the defaults of the families none of them is of (csr_vector's and csr_scalar's are not needed)
    assert {k for k, _ in measured[len(extra):]} == set(REGISTRY) - {"csr_vector", "csr_scalar"}
    assert all(p == get_family(k).space.defaults() for k, p in measured[len(extra):])
    again = run(A, store, storage, trials=3, enqueue=extra)  # already in the study: not queued or measured again
    assert not {(t.kernel, json.dumps(t.params, sort_keys=True)) for t in again.trials} & {
        (k, json.dumps(p, sort_keys=True)) for k, p in extra}
    only = run(A, Store(tmp_path / "other.db"), open_storage(str(tmp_path / "k.log")), trials=2,
               kernels=["csr_scalar"], enqueue=extra)  # configs of families left out are not queued
    assert [(t.kernel, t.params) for t in only.trials][:1] == [extra[1]]
