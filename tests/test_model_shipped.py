"""The selector shipped in the package (tuner.select.shipped, tuner.select.model.ship_model) and its evaluation
(tuner.select.evaluation), on synthetic stores: no GPU, no claim about real accuracy."""

from __future__ import annotations

import gzip
import importlib
import json
import logging

import numpy as np
import pytest
from typer.testing import CliRunner

from common.errors import InvalidConfigError
from db.store import Store
from kernels import BASELINE, REGISTRY, get_family
from tests.test_model import DEV_A, DEV_B, DTYPE, _features, _fill
from tuner.cli import app
from tuner.execute.choice import choose
from tuner.matrix.features import FEATURE_NAMES
from tuner.select import shipped
from tuner.select.evaluation import evaluate_selector
from tuner.select.model import (
    KernelSelector,
    find_model,
    load_shipped,
    save_model,
    select_model,
    ship_model,
    training_table,
)

FP_NEW = "f" * 32


@pytest.fixture
def models(tmp_path, monkeypatch):
    """An empty folder as the place shipped selectors are looked for."""
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv(shipped.ENV, str(folder))
    return folder


@pytest.fixture
def table():
    with Store(memory=True) as s:
        _fill(s, DEV_A, 40, seed=1)
        yield training_table(s, device=DEV_A, dtype=DTYPE)


def _feats(table, i: int = 0) -> dict[str, float]:
    return dict(zip(FEATURE_NAMES, table.X[i], strict=True))


def test_a_shipped_model_predicts_on_a_fresh_store_for_exactly_its_device_and_dtype(models, table):
    sel = KernelSelector(classifier="random_forest").fit(table.X, table.kernels, table.params)
    path = ship_model(sel, device=DEV_A, dtype=DTYPE, metrics={"note": "test"}, folder=models)
    assert path == shipped.shipped_path(DEV_A, DTYPE) and path.parent == models
    header = shipped.read_header(path)
    assert (header["device"], header["dtype"], header["task"], header["n_train"]) == (DEV_A, DTYPE, "spmv", 40)
    assert json.loads(header["metrics"])["note"] == "test" and "sklearn" in json.loads(header["metrics"])

    with Store(memory=True) as fresh:  # no model, no trial: a fresh install
        got = choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE, features=_feats(table))
        kernel, params = sel.predict(table.X[:1])[0]
        assert got.source == "predicted" and (got.kernel, got.params) == (kernel, get_family(kernel).space.validate(
            params))
        assert choose(FP_NEW, store=None, device=DEV_A, dtype=DTYPE, features=_feats(table)).source == "predicted"
        # another device, another dtype, or no features: the default
        assert choose(FP_NEW, store=fresh, device=DEV_B, dtype=DTYPE, features=_feats(table)).source == "default"
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype="float32", features=_feats(table)).source == "default"
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE).source == "default"


def test_a_model_for_another_device_is_not_used_even_under_this_devices_file_name(models, table):
    sel = KernelSelector(classifier="random_forest").fit(table.X, table.kernels, table.params)
    other = ship_model(sel, device=DEV_B, dtype=DTYPE, folder=models)
    assert not shipped.may_predict(None, DEV_A, DTYPE)
    other.rename(shipped.shipped_path(DEV_A, DTYPE))  # a file named for DEV_A whose header says DEV_B
    assert shipped.may_predict(None, DEV_A, DTYPE)  # the cheap check only looks at the name...
    assert shipped.read_shipped(DEV_A, DTYPE) is None and load_shipped(DEV_A, DTYPE) is None  # ...the header decides
    with Store(memory=True) as fresh:
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE, features=_feats(table)).source == "default"
    # slugs that collide still need the exact id
    assert shipped.shipped_path("GPU X (sm_90)", DTYPE) == shipped.shipped_path("GPU-X sm 90", DTYPE)
    ship_model(sel, device="GPU X (sm_90)", dtype=DTYPE, folder=models)
    assert load_shipped("GPU-X sm 90", DTYPE) is None and load_shipped("GPU X (sm_90)", DTYPE) is not None


def test_the_stores_own_model_comes_before_the_shipped_one(models, table):
    ship_model(KernelSelector().fit(table.X, ["csr_scalar"] * len(table), [{"block_size": 64}] * len(table)),
               device=DEV_A, dtype=DTYPE, folder=models)
    with Store(memory=True) as store:
        store.add_device({"id": DEV_A, "name": DEV_A, "kind": "gpu"})
        assert choose(FP_NEW, store=store, device=DEV_A, dtype=DTYPE, features=_feats(table)).kernel == "csr_scalar"
        own = KernelSelector().fit(table.X, ["csr_vector"] * len(table), [{"threads_per_row": 4}] * len(table))
        save_model(store, own, device=DEV_A, dtype=DTYPE)
        got = choose(FP_NEW, store=store, device=DEV_A, dtype=DTYPE, features=_feats(table))
        assert (got.source, got.kernel) == ("predicted", "csr_vector")
        assert find_model(store, device=DEV_A, dtype=DTYPE).predict(table.X[:1])[0][0] == "csr_vector"


def test_where_shipped_models_are_looked_for(monkeypatch, tmp_path):
    monkeypatch.delenv(shipped.ENV)
    assert shipped.shipped_dir() == shipped.DATA_DIR and shipped.DATA_DIR.parent.name == "tuner"
    assert shipped.shipped_path("NVIDIA H200 (sm_90)", "float32") == \
        shipped.DATA_DIR / "spmv-selector_NVIDIA-H200-sm-90_float32.pkl.gz"
    monkeypatch.setenv(shipped.ENV, "")  # off: what the tests run with
    assert shipped.shipped_dir() is None and shipped.shipped_path(DEV_A, DTYPE) is None
    assert not shipped.may_predict(None, DEV_A, DTYPE) and load_shipped(DEV_A, DTYPE) is None
    monkeypatch.setenv(shipped.ENV, str(tmp_path))
    assert shipped.shipped_dir() == tmp_path


def test_a_damaged_shipped_file_gives_the_default_and_a_log_line(models, table, caplog):
    path = shipped.shipped_path(DEV_A, DTYPE)
    path.write_bytes(gzip.compress(b"not a header\n"))
    with pytest.raises(InvalidConfigError, match="not a shipped selector"):
        shipped.read_header(path)
    with caplog.at_level(logging.WARNING, logger="tuner.select.model"):
        assert choose(FP_NEW, store=None, device=DEV_A, dtype=DTYPE, features=_feats(table)).source == "default"
    assert "cannot be loaded" in caplog.text


def test_select_model_reports_every_candidate_failing_as_a_tuner_error():
    X = np.random.default_rng(0).random((4, len(FEATURE_NAMES)))
    # each training part holds one family only: an SVM fails in every fold (scikit-learn raises then)
    with pytest.raises(InvalidConfigError, match="every candidate classifier failed"):
        select_model(X, np.array(["a", "a", "b", "b"], dtype=object), ["m0", "m0", "m1", "m1"], n_splits=2,
                     candidates=("svm",))


# -- the evaluation ---------------------------------------------------------------------------------------


def _measured_store(store: Store, n: int, seed: int = 0) -> None:
    """Matrices with every family's default measured and one tuned config each; the fastest family is a
    function of two features (learnable), and cuSPARSE's default is 1.5x the best everywhere."""
    rng = np.random.default_rng(seed)
    store.add_device({"id": DEV_A, "name": DEV_A, "kind": "gpu"})
    trials = []
    for i in range(n):
        fp = f"m{i:04d}".ljust(32, "0")
        f = _features(rng)
        store.add_matrix(fp, name=f"m{i}", rows=int(f["rows"]), cols=int(f["rows"]), nnz=int(f["nnz"]), features=f)
        winner = "csr_vector" if f["npr_mean"] > 32 else "csr_scalar"
        for family in REGISTRY:
            defaults = get_family(family).space.defaults()
            t = 1.5e-4 if family == BASELINE else (1.2e-4 if family == winner else 3e-4)
            trials.append({"fingerprint": fp, "device": DEV_A, "dtype": DTYPE, "kernel": family, "params": defaults,
                           "state": "ok", "time_s": t, "verified": True})
        tuned = {"threads_per_row": 16, "block_size": 128} if winner == "csr_vector" else {"block_size": 512}
        trials.append({"fingerprint": fp, "device": DEV_A, "dtype": DTYPE, "kernel": winner, "params": tuned,
                       "state": "ok", "time_s": 1e-4, "verified": True})
    store.add_trials(trials)


def test_evaluation_scores_the_selector_against_the_tuned_best_and_the_baselines():
    with Store(memory=True) as store:
        _measured_store(store, 60)
        table = training_table(store, device=DEV_A, dtype=DTYPE)
        result = evaluate_selector(table, device=DEV_A, dtype=DTYPE, classifier="random_forest", cv=3)
    rows = {r.strategy: r for r in result.rows}
    assert (result.matrices, result.folds, result.classifier) == (60, 3, "random_forest")
    sel, upper = rows["selector: predicted config"], rows["selector: predicted family, best params"]
    assert sel.accuracy >= 0.8 and sel.matrices == upper.matrices == 60
    # a right family comes with its tuned params (the best on the neighbours), measured on every matrix of that
    # family; a wrong one with a config measured on the neighbours, often on this matrix too (the defaults)
    assert round(sel.accuracy * 60) <= result.exact <= 60
    assert upper.geomean >= sel.geomean and 0 < sel.worst5 <= sel.geomean <= 1
    cusparse = rows[f"{BASELINE} default (no model)"]
    assert cusparse.accuracy == 0 and cusparse.geomean == pytest.approx(1e-4 / 1.5e-4)
    fixed = next(r for name, r in rows.items() if name.startswith("best fixed family at default"))
    assert fixed.geomean < sel.geomean and fixed.matrices == 60
    metrics = result.as_metrics()
    assert json.loads(json.dumps(metrics, allow_nan=False)) == metrics and len(metrics["strategies"]) == 5


def test_train_ship_writes_the_file_the_executor_reads(tmp_path, models):
    db = tmp_path / "s.db"
    with Store(db) as store:
        _measured_store(store, 40)
    out = CliRunner().invoke(app, ["train", "--db", str(db), "--cv", "3", "--ship", "--ship-dir", str(models)],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "selector: predicted config" in out.output and "worst 5%" in out.output and "shipped as" in out.output
    header = shipped.read_header(shipped.shipped_path(DEV_A, DTYPE))
    assert json.loads(header["metrics"])["evaluation"]["matrices"] == 40
    with Store(db) as store:
        trained = json.loads(store.db["models"].get(1)["metrics"])
    assert trained["evaluation"] == json.loads(header["metrics"])["evaluation"]
    feats = dict(zip(FEATURE_NAMES, training_table(Store(db), device=DEV_A, dtype=DTYPE).X[0], strict=True))
    with Store(memory=True) as fresh:
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE, features=feats).source == "predicted"


@pytest.mark.gpu
def test_plan_predicts_from_the_shipped_model_on_a_fresh_store(models, table):
    from tuner.execute.plan import plan
    from tuner.matrix.generate import generate
    from tuner.measure.backend import GpuBackend

    device = GpuBackend().info.id
    params = [{"threads_per_row": 4, "block_size": 128}] * len(table)
    ship_model(KernelSelector().fit(table.X, ["csr_vector"] * len(table), params), device=device, dtype=DTYPE,
               folder=models)
    A = generate("poisson2d", n=60)
    with Store(memory=True) as fresh:
        ex = plan(A, db=fresh)
        assert (ex.source, ex.kernel, ex.params) == ("predicted", "csr_vector", params[0])
        np.testing.assert_allclose(ex(np.ones(A.shape[1])), A @ np.ones(A.shape[1]), rtol=1e-12)
        assert plan(A, dtype="float32", db=fresh).source == "default"  # shipped for float64 only


def test_the_package_carries_its_shipped_selectors():
    import tomllib

    from tests.conftest import REPO

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "tuner.data" in config["packages"] and config["package-data"]["tuner.data"] == ["*"]
    assert (REPO / "tuner" / "data").is_dir() and shipped.DATA_DIR == REPO / "tuner" / "data"


def test_the_shipped_selectors_load_and_predict(monkeypatch):
    """The files in tuner/data were pickled when the selectors' modules were tuner.model and
    tuner.spmspv_selector: they still load (tuner.select.model's renaming unpickler) and predict."""
    from tuner.matrix.features import extract_features
    from tuner.matrix.generate import generate
    from tuner.select.spmspv_selector import MODES, ModeSelector

    monkeypatch.delenv(shipped.ENV)
    files = sorted(shipped.DATA_DIR.glob("*.pkl.gz"))
    assert {shipped.read_header(f)["task"] for f in files} == {"spmv", "spmspv"}
    features = extract_features(generate("powerlaw", rows=2000, seed=1))
    for path in files:
        header = shipped.read_header(path)
        device, dtype, task = header["device"], header["dtype"], header["task"]
        if task == "spmv":
            model = load_shipped(device, dtype)
            assert isinstance(model, KernelSelector), path
            (p,) = model.predict_details(features)
            assert p.kernel in REGISTRY and 0 < p.confidence <= 1
            get_family(p.kernel).space.validate(p.params, family=p.kernel)  # what choose() runs it with
        else:
            from tuner.select.spmspv_selector import SELECTOR_FEATURES

            model = load_shipped(device, dtype, task=task, features=SELECTOR_FEATURES)
            assert isinstance(model, ModeSelector), path
            fills, modes = model.crossover_table(features)
            assert len(fills) == len(modes) > 0 and set(modes) <= set(MODES)


def test_a_blob_that_names_the_old_module_paths_unpickles():
    import pickle

    from tuner.select import spmspv_selector
    from tuner.select.model import RENAMED_MODULES, unpickle_blob

    for old, new in RENAMED_MODULES.items():
        name = "KernelSelector" if new == "tuner.select.model" else "ModeSelector"
        blob = pickle.dumps(getattr(importlib.import_module(new), name), protocol=0)
        old_blob = blob.replace(new.encode(), old.encode())
        assert new.encode() not in old_blob
        assert unpickle_blob(old_blob) is unpickle_blob(blob) is getattr(importlib.import_module(new), name)
    assert unpickle_blob(pickle.dumps(spmspv_selector._log10_1p)) is spmspv_selector._log10_1p
