"""The selectors shipped in the package (tuner.select.shipped, tuner.select.model.ship_model and find_selector):
exactly this device's, else one of its architecture carried over; on synthetic stores, no GPU."""

from __future__ import annotations

import gzip
import importlib
import json
import logging
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from common.errors import InvalidConfigError
from db.store import Store
from kernels import REGISTRY, get_family
from tests.test_model import DEV_A, DEV_B, DEVICE, DTYPE, A, B, _fill, _table
from tuner.cli import app
from tuner.execute.choice import choose
from tuner.matrix.features import FEATURE_NAMES
from tuner.select import shipped
from tuner.select.evaluation import ranking_table
from tuner.select.model import DeviceSpec, KernelSelector, find_selector, load_shipped, save_model, ship_model

FP_NEW = "f" * 32
H200, H100, H100_NVL, A100 = ("NVIDIA H200 (sm_90)", "NVIDIA H100 80GB HBM3 (sm_90)", "NVIDIA H100 NVL (sm_90)",
                              "NVIDIA A100-SXM4-80GB (sm_80)")


@pytest.fixture
def models(tmp_path, monkeypatch):
    """An empty folder as the place shipped selectors are looked for."""
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv(shipped.ENV, str(folder))
    return folder


@pytest.fixture(scope="module")
def data():
    feats, times = _table(40, seed=1)
    return feats, times


def _selector(data, device: DeviceSpec = DEVICE, only: str | None = None, dtype: str = DTYPE) -> KernelSelector:
    feats, times = data
    if only is not None:
        times = [{only: t[only]} for t in times]
    return KernelSelector(n_estimators=10).fit(feats, times, dtype=dtype, device=device)


def _first(model: KernelSelector, feats: dict, device: DeviceSpec | None = None) -> tuple[str, dict]:
    ranked = model.rank(feats, device=device)[0]
    return ranked.kernel, get_family(ranked.kernel).space.validate(ranked.params)


def test_a_shipped_model_predicts_on_a_fresh_store_for_exactly_its_device_and_dtype(models, data):
    sel = _selector(data)
    path = ship_model(sel, device=DEV_A, dtype=DTYPE, metrics={"note": "test"}, folder=models)
    assert path == shipped.shipped_path(DEV_A, DTYPE) and path.parent == models
    header = shipped.read_header(path)
    assert (header["device"], header["dtype"], header["task"], header["n_train"]) == (DEV_A, DTYPE, "spmv", 40)
    assert json.loads(header["metrics"])["note"] == "test" and "sklearn" in json.loads(header["metrics"])
    assert header["device_spec"] == {"id": DEV_A, "bandwidth_gbs": 4000.0, "l2_bytes": 60 * 2**20, "sms": 132}

    feats = data[0][0]
    with Store(memory=True) as fresh:  # no model, no trial: a fresh install
        got = choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE, features=feats)
        assert got.source == "predicted" and (got.kernel, got.params) == _first(sel, feats)
        assert got.basis == f"the selector shipped for {DEV_A}"
        assert choose(FP_NEW, store=None, device=DEV_A, dtype=DTYPE, features=feats).source == "predicted"
        # another device (no architecture in its id), another dtype, or no features: the default
        assert choose(FP_NEW, store=fresh, device=DEV_B, dtype=DTYPE, features=feats).source == "default"
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype="float32", features=feats).source == "default"
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE).source == "default"


def test_a_model_for_another_device_is_not_used_even_under_this_devices_file_name(models, data):
    sel = _selector(data)
    other = ship_model(sel, device=DEV_B, dtype=DTYPE, folder=models)
    assert not shipped.may_predict(None, DEV_A, DTYPE)
    other.rename(shipped.shipped_path(DEV_A, DTYPE))  # a file named for DEV_A whose header says DEV_B
    assert not shipped.may_predict(None, DEV_A, DTYPE)  # files are looked for once a process (and folder)...
    shipped._found.cache_clear()  # ...or after write_shipped: renamed by hand, it is seen once looked for again
    assert shipped.may_predict(None, DEV_A, DTYPE)  # the cheap check only looks at the name...
    assert shipped.read_shipped(DEV_A, DTYPE) is None and load_shipped(DEV_A, DTYPE) is None  # ...the header decides
    with Store(memory=True) as fresh:
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE, features=data[0][0]).source == "default"
    # slugs that collide still need the exact id
    assert shipped.shipped_path("GPU X (sm_90)", DTYPE) == shipped.shipped_path("GPU-X sm 90", DTYPE)
    ship_model(sel, device="GPU X (sm_90)", dtype=DTYPE, folder=models)
    assert load_shipped("GPU-X sm 90", DTYPE) is None and load_shipped("GPU X (sm_90)", DTYPE) is not None


def test_the_stores_own_model_comes_before_the_shipped_one(models):
    with Store(memory=True) as store:
        _fill(store, DEV_A, 30, seed=1)
        table = ranking_table(store, device=DEV_A, dtype=DTYPE)
        scalar = [{k: v for k, v in t.items() if k.startswith("csr_scalar")} for t in table.times]
        vector = [{k: v for k, v in t.items() if k.startswith("csr_vector")} for t in table.times]
        ship_model(KernelSelector(n_estimators=5).fit(table.X, scalar, dtype=DTYPE, device=table.device),
                   device=DEV_A, dtype=DTYPE, folder=models)
        feats = dict(zip(FEATURE_NAMES, table.X[0], strict=True))
        assert choose(FP_NEW, store=store, device=DEV_A, dtype=DTYPE, features=feats).kernel == "csr_scalar"
        own = KernelSelector(n_estimators=5).fit(table.X, vector, dtype=DTYPE, device=table.device)
        save_model(store, own, device=DEV_A, dtype=DTYPE)
        got = choose(FP_NEW, store=store, device=DEV_A, dtype=DTYPE, features=feats)
        assert (got.source, got.kernel) == ("predicted", "csr_vector")
        model, spec, basis = find_selector(store, device=DEV_A, dtype=DTYPE)
        assert model.rank(feats)[0].kernel == "csr_vector" and spec is None and "in the store" in basis


def test_where_shipped_models_are_looked_for(monkeypatch, tmp_path):
    monkeypatch.delenv(shipped.ENV)
    assert shipped.shipped_dir() == shipped.DATA_DIR and shipped.DATA_DIR.parent.name == "tuner"
    assert shipped.shipped_path("NVIDIA H200 (sm_90)", "float32") == \
        shipped.DATA_DIR / "spmv-selector_NVIDIA-H200-sm-90_float32.pkl.gz"
    monkeypatch.setenv(shipped.ENV, "")  # off: what the tests run with
    assert shipped.shipped_dir() is None and shipped.shipped_path(DEV_A, DTYPE) is None
    assert not shipped.may_predict(None, DEV_A, DTYPE) and load_shipped(DEV_A, DTYPE) is None
    assert shipped.shipped_selectors() == [] and not shipped.may_predict(None, H100, DTYPE)
    monkeypatch.setenv(shipped.ENV, str(tmp_path))
    assert shipped.shipped_dir() == tmp_path


def test_a_damaged_shipped_file_gives_the_default_and_a_log_line(models, data, caplog):
    path = shipped.shipped_path(DEV_A, DTYPE)
    path.write_bytes(gzip.compress(b"not a header\n"))
    with pytest.raises(InvalidConfigError, match="not a shipped selector"):
        shipped.read_header(path)
    assert shipped.shipped_selectors() == []  # passed over
    with caplog.at_level(logging.WARNING, logger="tuner.select.model"):
        assert choose(FP_NEW, store=None, device=DEV_A, dtype=DTYPE, features=data[0][0]).source == "default"
    assert "cannot be loaded" in caplog.text


# -- another GPU of the same architecture -----------------------------------------------------------------------


def test_architecture() -> None:
    assert shipped.architecture(H100) == shipped.architecture(H200) == "sm_90"
    assert shipped.architecture("NVIDIA B200 (sm_100a)") == "sm_100a"
    assert shipped.architecture(A100) == "sm_80" and shipped.architecture(DEV_A) is None


class _FakeBackend:
    """What find_selector asks of a backend: its info and its copy bandwidth (counted)."""

    def __init__(self, device: str, bandwidth: float) -> None:
        from tuner.measure.backend import DeviceInfo

        self.info = DeviceInfo(id=device, name=device.split(" (")[0], kind="gpu", compute_capability="9.0",
                               sms=114, memory_bytes=0, driver="test", l2_bytes=50 * 2**20)
        self.bandwidth, self.measured = bandwidth, 0

    def copy_bandwidth_gbs(self) -> float:
        self.measured += 1
        return self.bandwidth


def test_a_gpu_of_the_same_architecture_is_served_by_the_nearest_shipped_selector(models, data, monkeypatch):
    h200 = DeviceSpec(H200, 4000.0, 60 * 2**20, 132)
    h100 = DeviceSpec(H100, 3000.0, 50 * 2**20, 132)
    ship_model(_selector(data, h200, only=A), device=H200, dtype=DTYPE, folder=models)  # csr_scalar only
    ship_model(_selector(data, h100, only=B), device=H100, dtype=DTYPE, folder=models)  # csr_vector only
    ship_model(_selector(data, h100, only=B, dtype="float32"), device=H100, dtype="float32", folder=models)
    assert [h["device"] for h in shipped.shipped_selectors()] == [H100, H100, H200]
    assert shipped.may_predict(None, H100_NVL, DTYPE) and not shipped.may_predict(None, A100, DTYPE)
    feats = data[0][0]
    with Store(memory=True) as store:
        # the store knows this GPU: its bandwidth is nearer the H100's, whose selector answers in its seconds
        store.add_device({"id": H100_NVL, "name": "NVIDIA H100 NVL", "kind": "gpu", "sms": 132,
                          "copy_bandwidth_gbs": 3300.0, "l2_bytes": 50 * 2**20})
        model, spec, basis = find_selector(store, device=H100_NVL, dtype=DTYPE)
        assert model.device_ == h100 and spec == DeviceSpec(H100_NVL, 3300.0, 50 * 2**20, 132)
        assert basis == f"the selector shipped for {H100}, carried over to this GPU by its bandwidth and L2"
        got = choose(FP_NEW, store=store, device=H100_NVL, dtype=DTYPE, features=feats)
        first = model.rank(feats, device=spec)[0]
        assert (got.source, got.kernel, got.basis) == ("predicted", "csr_vector", basis)
        assert got.expected_gflops == pytest.approx(2 * feats["nnz"] / first.expected_s / 1e9)
        assert first.expected_s == pytest.approx(model.rank(feats)[0].expected_s * 3000 / 3300)
        # a faster one: the H200's
        store.add_device({"id": H100_NVL, "name": "NVIDIA H100 NVL", "kind": "gpu", "copy_bandwidth_gbs": 3900.0})
        assert find_selector(store, device=H100_NVL, dtype=DTYPE)[0].device_ == h200
        # another architecture, or the exact device's own file: no carrying over
        assert find_selector(store, device=A100, dtype=DTYPE) is None
        assert find_selector(store, device=H200, dtype=DTYPE)[1:] == (None, f"the selector shipped for {H200}")
        assert find_selector(store, device=H100_NVL, dtype="float32")[0].device_ == h100  # the only float32 one
    # nothing in the store: measured on the backend; without one, as on the source GPU
    backend = _FakeBackend(H100_NVL, 3100.0)
    model, spec, _ = find_selector(None, device=H100_NVL, dtype=DTYPE, backend=backend)
    assert model.device_ == h100 and spec == DeviceSpec(H100_NVL, 3100.0, 50 * 2**20, 114)
    assert backend.measured == 1
    other = _FakeBackend(H200, 1.0)  # a backend of another device says nothing of this one
    model, spec, basis = find_selector(None, device="NVIDIA H800 (sm_90)", dtype=DTYPE, backend=other)
    assert spec is None and "unknown" in basis and other.measured == 0


def test_listing_the_shipped_selectors_imports_no_scikit_learn(models, data):
    ship_model(_selector(data, DeviceSpec(H200, 4000.0, 60 * 2**20, 132)), device=H200, dtype=DTYPE, folder=models)
    code = ("import sys; from tuner.select import shipped; "
            f"assert shipped.may_predict(None, {H100!r}, 'float64'); "
            "assert [h['device'] for h in shipped.shipped_selectors()] == ['NVIDIA H200 (sm_90)']; "
            "assert 'sklearn' not in sys.modules, 'sklearn imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- training and shipping ------------------------------------------------------------------------------------


def test_train_ship_writes_the_file_the_executor_reads(tmp_path, models):
    db = tmp_path / "s.db"
    with Store(db) as store:
        _fill(store, DEV_A, 30, seed=3)
    out = CliRunner().invoke(app, ["train", "--db", str(db), "--cv", "3", "--ship", "--ship-dir", str(models)],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "race4" in out.output and "worst 5%" in out.output and "shipped as" in out.output
    header = shipped.read_header(shipped.shipped_path(DEV_A, DTYPE))
    evaluation = json.loads(header["metrics"])["evaluation"]
    assert evaluation["kfold"]["matrices"] == evaluation["lofo"]["matrices"] == 30
    with Store(db) as store:
        trained = json.loads(store.db["models"].get(1)["metrics"])
        feats = dict(zip(FEATURE_NAMES, ranking_table(store, device=DEV_A, dtype=DTYPE).X[0], strict=True))
    assert trained["evaluation"] == evaluation
    with Store(memory=True) as fresh:
        assert choose(FP_NEW, store=fresh, device=DEV_A, dtype=DTYPE, features=feats).source == "predicted"


@pytest.mark.gpu
def test_plan_predicts_from_the_shipped_model_on_a_fresh_store(models, data):
    from tuner.execute.plan import plan
    from tuner.matrix.generate import generate
    from tuner.measure.backend import GpuBackend

    device = GpuBackend().info.id
    feats, times = data
    times = [{B: t[B]} for t in times]  # csr_vector, the only config, prepared in 1 SpMV: cheap enough to predict
    selector = KernelSelector(n_estimators=10).fit(feats, times, dtype=DTYPE, device=DEVICE, prepare_times=times)
    ship_model(selector, device=device, dtype=DTYPE, folder=models)
    A = generate("poisson2d", n=60)
    with Store(memory=True) as fresh:
        ex = plan(A, db=fresh, effort="predict")
        assert (ex.source, ex.kernel) == ("predicted", "csr_vector")
        np.testing.assert_allclose(ex(np.ones(A.shape[1])), A @ np.ones(A.shape[1]), rtol=1e-12)
        assert plan(A, dtype="float32", db=fresh, effort="predict").source == "default"  # shipped for float64 only


def test_the_package_carries_its_shipped_selectors():
    import tomllib

    from tests.conftest import REPO

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "tuner.data" in config["packages"] and config["package-data"]["tuner.data"] == ["*"]
    assert (REPO / "tuner" / "data").is_dir() and shipped.DATA_DIR == REPO / "tuner" / "data"


def test_the_shipped_selectors_load_and_rank(monkeypatch):
    """Every file in tuner/data loads (the SpMSpV one was pickled when its module was tuner.spmspv_selector:
    tuner.select.model's renaming unpickler) and answers; a kernel selector is small and ranks its whole
    portfolio, on its own GPU and on another of its architecture; each was trained with the class's defaults
    (a change of them means training them again)."""
    from tuner.matrix.features import extract_features
    from tuner.matrix.generate import generate
    from tuner.select.spmspv_selector import MODES, SELECTOR_FEATURES, ModeSelector

    monkeypatch.delenv(shipped.ENV)
    files = sorted(shipped.DATA_DIR.glob("*.pkl.gz"))
    assert {shipped.read_header(f)["task"] for f in files} == {"spmv", "spmspv"}
    features = extract_features(generate("powerlaw", rows=2000, seed=1))
    for path in files:
        header = shipped.read_header(path)
        device, dtype, task = header["device"], header["dtype"], header["task"]
        if task == "spmv":
            assert path.stat().st_size <= 1.5e6, path
            model = load_shipped(device, dtype)
            assert isinstance(model, KernelSelector) and model.device_ == DeviceSpec(**header["device_spec"]), path
            assert model.get_params() == KernelSelector().get_params(), path  # trained as the class now trains
            ranking = model.rank(features)
            assert len(ranking) == len(model.configs_) >= 20 and ranking[0].kernel in REGISTRY
            get_family(ranking[0].kernel).space.validate(ranking[0].params, family=ranking[0].kernel)
            evaluation = json.loads(header["metrics"])["evaluation"]
            first = {s["strategy"]: s["geomean"] for s in evaluation["lofo"]["strategies"]}["first"]
            assert first >= 0.9, path
            other = DeviceSpec("NVIDIA H100 80GB HBM3 (sm_90)", 3000.0, 50 * 2**20, 132)
            assert find_selector(None, device=other.id, dtype=dtype)[0].rank(features, device=other)
        else:
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
