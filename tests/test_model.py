"""The learned selector (tuner.select.model) on a small synthetic store: no GPU, no claim about real accuracy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from common.errors import InvalidConfigError, StoreError
from db.store import Store
from kernels import BASELINE, config_key, get_family
from tuner.execute.choice import choose
from tuner.matrix.features import FEATURE_NAMES
from tuner.select.model import (
    KernelSelector,
    grouped_split,
    load_latest,
    save_model,
    select_model,
    training_table,
)

DEV_A, DEV_B, DTYPE = "gpu-A", "gpu-B", "float64"
MEAN, CV = FEATURE_NAMES.index("npr_mean"), FEATURE_NAMES.index("npr_cv")


def _features(rng: np.random.Generator) -> dict[str, float]:
    f = {name: float(rng.random()) for name in FEATURE_NAMES}
    f.update(rows=float(rng.integers(100, 10**6)), nnz=float(rng.integers(10**3, 10**7)),
             npr_mean=float(rng.uniform(1, 64)), npr_cv=float(rng.uniform(0, 2)))
    return f


def _best_for(f: dict[str, float], i: int) -> tuple[str, dict]:
    """The synthetic truth: the family is a function of npr_mean and npr_cv only."""
    if f["npr_cv"] > 1.0:
        return "cusparse", {}
    if f["npr_mean"] > 32:
        return "csr_vector", {"threads_per_row": 2 ** (1 + i % 5), "block_size": 256}
    return "csr_scalar", {"block_size": 64 * (1 + i % 4)}


def _fill(store: Store, device: str, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    store.add_device({"id": device, "name": device, "kind": "gpu"})
    for i in range(n):
        fp = f"{device}-{seed}-{i:04d}".ljust(16, "0")
        f = _features(rng)
        store.add_matrix(fp, name=f"m{i}", rows=int(f["rows"]), cols=int(f["rows"]), nnz=int(f["nnz"]), features=f)
        kernel, params = _best_for(f, i)
        store.add_trial({"fingerprint": fp, "device": device, "dtype": DTYPE, "kernel": kernel, "params": params,
                         "state": "ok", "time_s": 1e-4, "verified": True})


@pytest.fixture
def store():
    with Store(memory=True) as s:
        _fill(s, DEV_A, 60, seed=1)
        _fill(s, DEV_B, 20, seed=2)
        yield s


@pytest.fixture
def table(store):
    return training_table(store, device=DEV_A, dtype=DTYPE)


def test_training_table_reads_best_and_features(store, table):
    assert len(table) == 60 and table.X.shape == (60, len(FEATURE_NAMES)) and not table.skipped
    assert len(set(table.fingerprints)) == 60 and all(fp.startswith(DEV_A) for fp in table.fingerprints)
    assert set(table.kernels) <= {"cusparse", "csr_vector", "csr_scalar"}
    assert len(training_table(store, device=DEV_B, dtype=DTYPE)) == 20
    assert len(training_table(store, device=DEV_A, dtype="float32")) == 0


def test_fit_predict_round_trip(table):
    train, test = grouped_split(table.fingerprints, test_size=0.25, random_state=0)
    sel = KernelSelector(classifier="random_forest").fit(
        table.X[train], table.kernels[train], [table.params[i] for i in train],
        groups=[table.fingerprints[i] for i in train],
    )
    assert set(sel.classes_) == set(table.kernels[train])
    assert list(sel.feature_names_in_) == list(FEATURE_NAMES) and sel.n_features_in_ == len(FEATURE_NAMES)
    # on its training rows the family is right and the params are the row's own (its nearest neighbour)
    for (kernel, params), k, p in zip(sel.predict(table.X[train]), table.kernels[train],
                                      [table.params[i] for i in train], strict=True):
        assert (kernel, params) == (k, p)
    predicted = sel.predict(table.X[test])
    assert len(predicted) == len(test)
    for kernel, params in predicted:  # params always come from a training matrix of the predicted family
        assert kernel in sel.classes_ and params in [table.params[i] for i in train if table.kernels[i] == kernel]
    assert sel.score(table.X[test], table.kernels[test]) >= 0.6  # a two-feature rule on 45 matrices
    # one matrix as a feature mapping gives the same answer as its row
    row = dict(zip(FEATURE_NAMES, table.X[test[0]], strict=True))
    assert sel.predict(row) == predicted[:1]


def test_auto_compares_classifiers_by_grouped_cv(table):
    sel = KernelSelector(cv=3).fit(table.X, table.kernels, table.params, groups=table.fingerprints)
    assert set(sel.cv_scores_) == {"gradient_boosting", "random_forest", "svm"}
    best = max(sel.cv_scores_, key=lambda n: sel.cv_scores_[n]["mean"])
    assert sel.classifier_name_ == best
    name, scores = select_model(table.X, table.kernels, table.fingerprints, candidates=("random_forest",),
                                n_splits=3)
    assert name == "random_forest" and scores["random_forest"]["folds"] == 3


def test_estimator_api():
    sel = KernelSelector(classifier="svm", random_state=3)
    assert sel.get_params() == {"classifier": "svm", "cv": 5, "n_neighbors": 5, "coverage": 0.5, "random_state": 3}
    assert sel.set_params(classifier="random_forest") is sel and sel.classifier == "random_forest"
    twin = clone(sel)
    assert twin is not sel and twin.get_params() == sel.get_params()
    assert "random_forest" in repr(sel)
    with pytest.raises(NotFittedError):
        sel.predict(np.zeros((1, len(FEATURE_NAMES))))


def test_fit_returns_self_and_checks_width(table):
    sel = KernelSelector(classifier="gradient_boosting")
    assert sel.fit(table.X, table.kernels, table.params) is sel
    with pytest.raises(ValueError, match="features"):
        sel.predict(np.zeros((1, 3)))


def test_one_family_only_gives_a_constant_model(table):
    y = np.array(["csr_scalar"] * len(table), dtype=object)
    sel = KernelSelector().fit(table.X, y, table.params)
    assert sel.classifier_name_ == "constant" and {k for k, _ in sel.predict(table.X[:5])} == {"csr_scalar"}


def test_grouped_split_never_shares_a_matrix():
    groups = np.repeat([f"fp{i}" for i in range(30)], 3)  # three rows per matrix
    for seed in range(5):
        train, test = grouped_split(groups, test_size=0.3, random_state=seed)
        assert len(train) and len(test) and not set(groups[train]) & set(groups[test])
        assert len(train) + len(test) == len(groups)


def test_saved_model_is_versioned_and_per_device(store, table):
    assert load_latest(store, device=DEV_A, dtype=DTYPE) is None
    sel = KernelSelector(classifier="random_forest").fit(table.X, table.kernels, table.params)
    first = save_model(store, sel, device=DEV_A, dtype=DTYPE, metrics={"accuracy": 0.9})
    second = save_model(store, sel, device=DEV_A, dtype=DTYPE, metrics={"accuracy": 0.95})
    assert second > first
    row = store.db["models"].get(second)
    assert row["n_train"] == 60 and row["device"] == DEV_A and '"accuracy": 0.95' in row["metrics"]
    loaded = load_latest(store, device=DEV_A, dtype=DTYPE)
    assert isinstance(loaded, KernelSelector) and loaded.predict(table.X[:3]) == sel.predict(table.X[:3])
    assert load_latest(store, device=DEV_B, dtype=DTYPE) is None  # never another device's model
    assert load_latest(store, device=DEV_A, dtype="float32") is None
    with pytest.raises(StoreError, match="unknown device"):
        save_model(store, sel, device="nope", dtype=DTYPE)


def test_choose_predicted_default_and_tuned(store, table):
    fp_new = "f" * 16
    feats = dict(zip(FEATURE_NAMES, table.X[0], strict=True))
    default = choose(fp_new, store=store, device=DEV_A, dtype=DTYPE, features=feats)
    assert default.source == "default" and default.kernel == BASELINE
    assert default.params == get_family(BASELINE).space.defaults()

    sel = KernelSelector(classifier="random_forest").fit(table.X, table.kernels, table.params)
    save_model(store, sel, device=DEV_A, dtype=DTYPE)
    predicted = choose(fp_new, store=store, device=DEV_A, dtype=DTYPE, features=feats)
    detail = sel.predict_details(table.X[:1])[0]  # as the registry reads it: missing params take defaults
    assert predicted.source == "predicted" and predicted.expected_gflops == detail.expected_gflops
    assert (predicted.kernel, predicted.params) == (detail.kernel, get_family(detail.kernel).space.validate(
        detail.params))
    assert predicted.confidence == detail.confidence and 0 < detail.confidence <= 1
    # without features, on another device, or with use_tuned=False and no model: unchanged behaviour
    assert choose(fp_new, store=store, device=DEV_A, dtype=DTYPE).source == "default"
    assert choose(fp_new, store=store, device=DEV_B, dtype=DTYPE, features=feats).source == "default"
    assert choose(fp_new, store=None, device=DEV_A, dtype=DTYPE, features=feats).source == "default"
    # a tuned best wins over the model
    tuned_fp = table.fingerprints[0]
    tuned = choose(tuned_fp, store=store, device=DEV_A, dtype=DTYPE, features=feats)
    assert tuned.source == "tuned" and tuned.kernel == table.kernels[0] and tuned.params == table.params[0]
    # use_tuned=False (the benchmark's "never tuned"): what plan() would do for a new matrix
    assert choose(tuned_fp, store=store, device=DEV_A, dtype=DTYPE, features=feats, use_tuned=False).source == \
        "predicted"


def test_params_are_scored_on_the_neighbours_measured_times():
    """Matrices measured with every csr_vector config: the fastest threads_per_row follows npr_mean, the family
    npr_cv; every other feature is constant, so the nearest matrices are those of similar npr_mean and npr_cv."""
    rng = np.random.default_rng(4)
    tprs = (2, 4, 8, 16, 32)

    def matrices(n: int) -> np.ndarray:
        X = np.ones((n, len(FEATURE_NAMES)))
        X[:, FEATURE_NAMES.index("nnz")] = 1e6
        X[:, MEAN], X[:, CV] = rng.random(n), rng.random(n)
        return X

    def fastest(row: np.ndarray) -> int:
        return tprs[min(int(row[MEAN] * 5), 4)]

    X = matrices(120)
    measured = [{config_key("csr_vector", {"threads_per_row": t, "block_size": 256}):
                 1e-4 * (1 + abs(np.log2(t / fastest(row)))) for t in tprs} for row in X]
    params = [{"threads_per_row": fastest(row), "block_size": 256} for row in X]
    kernels = np.where(X[:, CV] > 0.3, "csr_vector", "csr_scalar").astype(object)
    sel = KernelSelector(classifier="random_forest", n_neighbors=3).fit(X, kernels, params, measured=measured)
    assert len(sel.candidates_) == 5 and sel.log_fraction_.shape == (120, 5)
    test = matrices(40)
    details = sel.predict_details(test)
    vector = [(row, p) for row, p in zip(test, details, strict=True) if p.kernel == "csr_vector"]
    assert 20 <= len(vector) < 40
    for _, p in vector:
        assert p.basis == "neighbours" and 0 < p.confidence <= 1
        # 2 * nnz / t of the neighbours: 20 GFLOP/s where the config is their fastest, 4 where it is 16x off
        assert 4 - 1e-9 <= p.expected_gflops <= 20 + 1e-9
    assert sum(p.params["threads_per_row"] == fastest(row) for row, p in vector) >= 0.8 * len(vector)
    for p in details:
        if p.kernel == "csr_scalar":  # never measured as a candidate: the nearest csr_scalar winner's params
            assert p.basis == "nearest winner" and p.expected_gflops is None
    with pytest.raises(InvalidConfigError, match="measured rows"):
        KernelSelector().fit(X, kernels, params, measured=measured[:3])


def test_recommend_command_says_where_the_answer_comes_from(store, table, tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app
    from tuner.matrix.io import write_mtx

    path = tmp_path / "m.mtx"
    write_mtx(path, sp.random(50, 40, density=0.1, format="csr", random_state=0))
    db = tmp_path / "s.db"
    with Store(db) as s:
        _fill(s, DEV_A, 30, seed=1)
    run = CliRunner().invoke
    default = run(app, ["recommend", str(path), "--db", str(db), "--device", DEV_A, "--json"])
    assert default.exit_code == 0, default.output
    assert json.loads(default.output)["source"] == "default" and json.loads(default.output)["kernel"] == BASELINE
    assert run(app, ["train", "--db", str(db), "--cv", "3", "--no-evaluate"]).exit_code == 0
    predicted = json.loads(run(app, ["recommend", str(path), "--db", str(db), "--device", DEV_A, "--json"]).output)
    assert predicted["source"] == "predicted" and 0 < predicted["confidence"] <= 1 and predicted["nnz"] == 200
    text = run(app, ["recommend", str(path), "--db", str(db), "--device", DEV_A], env={"COLUMNS": "200"}).output
    assert "(predicted)" in text and "confidence in the family" in text
    bad = run(app, ["recommend", str(path), "--db", str(db), "--device", DEV_A, "--dtype", "float16"])
    assert bad.exit_code != 0 and "float16" in bad.output


def test_train_command_saves_a_model_and_needs_a_device_when_ambiguous(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app

    path = tmp_path / "s.db"
    with Store(path) as s:
        _fill(s, DEV_A, 30, seed=1)
    result = CliRunner().invoke(app, ["train", "--db", str(path), "--cv", "3"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "gradient_boosting" in result.output and "saved model 1" in result.output
    with Store(path) as s:
        _fill(s, DEV_B, 10, seed=2)
        assert load_latest(s, device=DEV_B, dtype=DTYPE) is None
    result = CliRunner().invoke(app, ["train", "--db", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 1 and "pass --device" in result.output and DEV_B in result.output


def test_a_prediction_the_registry_no_longer_knows_falls_back_to_the_default(store, table):
    sel = KernelSelector(classifier="random_forest").fit(
        table.X, np.array(["retired_family"] * len(table.X)), [{}] * len(table.X)
    )
    save_model(store, sel, device=DEV_A, dtype=DTYPE)
    feats = dict(zip(FEATURE_NAMES, table.X[0], strict=True))
    assert choose("e" * 16, store=store, device=DEV_A, dtype=DTYPE, features=feats).source == "default"


def test_a_model_pickled_by_an_older_version_gives_the_default_and_a_log_line(store, table, caplog):
    import logging
    import pickle

    sel = KernelSelector(classifier="random_forest").fit(table.X, table.kernels, table.params)
    del sel.candidates_  # as a selector pickled before the candidates existed
    model_id = save_model(store, KernelSelector(classifier="random_forest").fit(table.X, table.kernels,
                                                                                  table.params),
                          device=DEV_A, dtype=DTYPE)
    store.db["models"].update(model_id, {"blob": pickle.dumps(sel)})
    feats = dict(zip(FEATURE_NAMES, table.X[0], strict=True))
    with caplog.at_level(logging.WARNING, logger="tuner.select.model"):
        assert choose("d" * 16, store=store, device=DEV_A, dtype=DTYPE, features=feats).source == "default"
    assert "older version" in caplog.text
