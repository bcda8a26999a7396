"""tuner.search.seeds: what a study measures first, read from the store; and tune() measuring it first."""

from __future__ import annotations

import scipy.sparse as sp

from db.store import Store
from kernels import get_family
from tuner.matrix.features import FEATURE_NAMES, extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend
from tuner.search.loop import tune
from tuner.search.seeds import nearest_bests, seed_configs, unique_valid
from tuner.search.storage import open_storage

DEV = "GPU (sm_90)"
BASE = {n: 1.0 for n in FEATURE_NAMES}


def features(nnz: float, npr_std: float) -> dict[str, float]:
    return {**BASE, "nnz": nnz, "npr_std": npr_std}


def best(store: Store, fp: str, kernel: str, params: dict, *, dtype: str = "float64", feats=None) -> None:
    store.add_matrix(fp, name=fp, rows=10, cols=10, nnz=int((feats or BASE)["nnz"]), features=feats or BASE)
    store.add_trial({"fingerprint": fp, "device": DEV, "dtype": dtype, "kernel": kernel, "params": params,
                     "state": "ok", "time_s": 1e-4, "verified": True})


def filled() -> Store:
    store = Store(memory=True)
    store.add_device({"id": DEV, "name": "GPU", "kind": "gpu"})
    # Nearness by nnz (log1p: 1e6 is nearer 3e6 than 1e4) and npr_std; every other feature the same.
    best(store, "far", "csr_scalar", {"block_size": 64}, feats=features(1e3, 1.0))
    best(store, "near", "nut", {"rows_per_panel": 8192, "cols_per_tile": 16384}, feats=features(3e6, 2.0))
    best(store, "nearer", "csr_vector", {"threads_per_row": 16}, feats=features(1.2e6, 2.0))
    best(store, "middle", "specsum", {}, feats=features(1e5, 2.0))
    best(store, "gone", "no_such_kernel", {"a": 1}, feats=features(1e6, 2.1))  # a family since removed
    best(store, "q", "ipcsr", {"nt": 128}, dtype="float32", feats=features(1e6, 2.0))  # the matrix itself
    return store


def test_the_other_dtypes_best_comes_first_then_the_nearest_tuned_matrices() -> None:
    store = filled()
    seeds = seed_configs(store, fingerprint="q", device=DEV, dtype="float64", features=features(1e6, 2.0), k=3)
    assert [k for k, _ in seeds] == ["ipcsr", "csr_vector", "nut"]  # "gone" is nearest but no longer valid
    assert seeds[0][1] == get_family("ipcsr").space.validate({"nt": 128})  # defaults filled, as stored trials are
    wider = seed_configs(store, fingerprint="q", device=DEV, dtype="float64", features=features(1e6, 2.0), k=5)
    assert [k for k, _ in wider] == ["ipcsr", "csr_vector", "nut", "specsum", "csr_scalar"]


def test_nearest_leaves_out_the_matrix_itself_other_devices_and_dtypes() -> None:
    store = filled()
    got = nearest_bests(store, features(1e6, 2.0), device=DEV, dtype="float32", k=3)
    assert [r["fingerprint"] for r in got] == ["q"]  # the only float32 best
    assert nearest_bests(store, features(1e6, 2.0), device=DEV, dtype="float32", k=3, exclude="q") == []
    assert nearest_bests(store, features(1e6, 2.0), device="other", dtype="float64", k=3) == []
    assert seed_configs(Store(memory=True), fingerprint="q", device=DEV, dtype="float64",
                        features=features(1.0, 1.0)) == []


def test_unique_valid_keeps_the_first_of_each_config_and_drops_what_no_longer_validates() -> None:
    configs = [("csr_vector", {"threads_per_row": 4}), ("csr_vector", {"threads_per_row": 4, "block_size": 256}),
               ("csr_vector", {"threads_per_row": 3}), ("nope", {}), ("csr_scalar", {})]
    assert unique_valid(configs) == [("csr_vector", {"threads_per_row": 4, "block_size": 256, "indices": "narrow"}),
                                     ("csr_scalar", {"block_size": 256, "unroll": 4, "indices": "narrow"})]


def test_a_study_measures_the_other_dtypes_best_first(tmp_path) -> None:
    """float64 tuned first; then the float32 study of the same matrix starts with float64's best."""
    A = as_csr(sp.random(300, 250, density=0.03, format="csr", random_state=3))
    store = Store(tmp_path / "t.db")
    storage = open_storage(str(tmp_path / "j.log"))
    backend = CpuReferenceBackend()
    tune(A, backend=backend, store=store, storage=storage, name="m", trials=10, dtype="float64")
    fp = fingerprint(A)
    b64 = store.best(fp, device=backend.info.id, dtype="float64")
    near = seed_configs(store, fingerprint=fp, device=backend.info.id, dtype="float32", features=extract_features(A))
    assert near[0] == (b64["kernel"], b64["params"])
    result = tune(A, backend=backend, store=store, storage=storage, name="m", trials=3, dtype="float32")
    assert (result.trials[0].kernel, result.trials[0].params) == (b64["kernel"], b64["params"])


def test_the_first_seed_is_measured_next_as_its_family_fits_it_to_the_l2(tmp_path) -> None:
    """x of 250 float64 = 2000 bytes against an L2 of 1500: NuT's one slab, then 4 (a slab of x in a third)."""
    import dataclasses

    A = as_csr(sp.random(300, 250, density=0.03, format="csr", random_state=3))
    backend = CpuReferenceBackend()
    backend.info = dataclasses.replace(backend.info, l2_bytes=1500)
    result = tune(A, backend=backend, store=Store(tmp_path / "t.db"), storage=open_storage(str(tmp_path / "j.log")),
                  name="m", trials=3, dtype="float64", enqueue=[("nut", {})])
    assert [(t.kernel, t.params["slabs"]) for t in result.trials[:2]] == [("nut", 1), ("nut", 4)]
    assert result.trials[1].params["bands"] == 1
