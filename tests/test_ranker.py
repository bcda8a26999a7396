"""The config ranker (tuner.ranker) and its evaluation (tuner.ranker_eval): synthetic tables with a known rule,
a small store, and the committed H200 corpus. CPU only."""

from __future__ import annotations

import gzip
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from tuner.corpus import import_corpus, read_corpus
from tuner.errors import InvalidConfigError
from tuner.features import FEATURE_NAMES
from tuner.metrics import effective_bytes

from db.store import Store
from kernels import config_key
from tuner.ranker import (
    DERIVED_FEATURES,
    MISSING_PENALTY,
    ConfigRanker,
    DeviceSpec,
    compulsory_bytes,
    design_matrix,
)
from tuner.ranker_eval import (
    RankingTable,
    corpus_table,
    evaluate_ranker,
    ranking_table,
    structure_family,
)

DEVICE_H200 = "NVIDIA H200 (sm_90)"
CORPUS = Path(__file__).parent.parent / "bench/results/corpus/2026-11-22_NVIDIA-H200-sm-90_corpus.jsonl.gz"
DEVICE = DeviceSpec("gpu-A", bandwidth_gbs=4000.0, l2_bytes=60 * 2**20, sms=132)
DTYPE = "float64"
A = config_key("csr_scalar", {"block_size": 128})  # fast where row lengths vary a lot (npr_cv > 1)
B = config_key("csr_vector", {"block_size": 256, "threads_per_row": 8})  # fast elsewhere
ALG1, ALG2 = (config_key("cusparse", {"algorithm": a}) for a in ("csr_alg1", "csr_alg2"))


def _features(rng: np.random.Generator, cv: float) -> dict[str, float]:
    f = {name: float(rng.random()) for name in FEATURE_NAMES}
    rows, mean = float(rng.integers(10**3, 10**6)), float(rng.uniform(2, 64))
    f.update(rows=rows, cols=rows, nnz=rows * mean, npr_mean=mean, npr_max=mean * rng.uniform(1, 10), npr_cv=cv,
             bandwidth=rows * rng.random(), cf_1024=rng.uniform(1, mean), cf_65536=mean)
    return f


def _times(f: dict[str, float]) -> dict[str, float]:
    """The synthetic truth, in multiples of the compulsory bytes' time on DEVICE."""
    t = compulsory_bytes(f["rows"], f["cols"], f["nnz"], DTYPE) / (DEVICE.bandwidth_gbs * 1e9)
    fast_a = f["npr_cv"] > 1.0
    return {A: t * (1.2 if fast_a else 3.0), B: t * (3.0 if fast_a else 1.2), ALG1: t * 2.0, ALG2: t * 2.2}


def _table(n: int, seed: int, *, cv_range: tuple[float, float] = (0.0, 2.0)) -> tuple[list[dict], list[dict]]:
    rng = np.random.default_rng(seed)
    feats = [_features(rng, float(rng.uniform(*cv_range))) for _ in range(n)]
    return feats, [_times(f) for f in feats]


def _array(feats: list[dict]) -> np.ndarray:
    return np.array([[f[n] for n in FEATURE_NAMES] for f in feats])


@pytest.fixture(scope="module")
def fitted() -> tuple[ConfigRanker, list[dict], list[dict]]:
    feats, times = _table(120, seed=0)
    prepare = [{k: 10 * t for k, t in row.items()} for row in times]
    return ConfigRanker(n_estimators=50).fit(feats, times, dtype=DTYPE, device=DEVICE, prepare_times=prepare), \
        feats, times


def test_ranks_by_the_rule_on_unseen_matrices(fitted) -> None:
    ranker, _, _ = fitted
    feats, times = _table(60, seed=1)
    right = [config_key(*p) == min(t, key=t.get) for p, t in zip(ranker.predict(feats), times, strict=True)]
    assert np.mean(right) >= 0.9
    rng = np.random.default_rng(2)
    assert config_key(*ranker.predict([_features(rng, 1.8)])[0]) == A
    assert config_key(*ranker.predict([_features(rng, 0.2)])[0]) == B


def test_learned_attributes(fitted) -> None:
    ranker, _, _ = fitted
    assert sorted(config_key(k, p) for k, p in ranker.configs_) == sorted([A, B, ALG1, ALG2])
    assert ranker.n_train_ == 120 and ranker.device_ == DEVICE and ranker.dtype_ == DTYPE
    assert list(ranker.feature_names_in_) == list(FEATURE_NAMES) and ranker.n_features_in_ == len(FEATURE_NAMES)
    assert ranker.model_[-1].n_estimators == 50
    assert clone(ranker).get_params() == ranker.get_params()
    np.testing.assert_allclose(ranker.prepare_spmvs_, 10.0)


def test_not_fitted_raises() -> None:
    feats, _ = _table(2, seed=0)
    for call in (ConfigRanker().predict, ConfigRanker().expected_times, ConfigRanker().rank):
        with pytest.raises(NotFittedError):
            call(feats[0])


def test_mappings_and_arrays_agree(fitted) -> None:
    ranker, feats, times = fitted
    from_arrays = ConfigRanker(n_estimators=50).fit(_array(feats), times, dtype=DTYPE, device=DEVICE)
    np.testing.assert_allclose(from_arrays.expected_times(_array(feats[:10])), ranker.expected_times(feats[:10]))
    assert ranker.predict(_array(feats[:10])) == ranker.predict(feats[:10])
    with pytest.raises(InvalidConfigError, match="lack"):
        ranker.rank({"rows": 1.0})


def test_coverage_drops_rare_configs() -> None:
    feats, times = _table(40, seed=3)
    rare = config_key("nut", {"tile": 1024})
    for i, row in enumerate(times):
        if i % 2:
            row[rare] = row[A]
    keys = lambda r: {config_key(k, p) for k, p in r.configs_}  # noqa: E731
    assert rare not in keys(ConfigRanker(n_estimators=5).fit(feats, times, dtype=DTYPE, device=DEVICE))
    assert rare in keys(ConfigRanker(n_estimators=5, coverage=0.4).fit(feats, times, dtype=DTYPE, device=DEVICE))


def test_a_missing_time_counts_as_the_slowest_times_two() -> None:
    feats, times = _table(30, seed=4)
    del times[0][ALG2]
    # Leaves of one sample and no bootstrap: the forest reproduces its training targets.
    ranker = ConfigRanker(n_estimators=3, min_samples_leaf=1).fit(feats, times, dtype=DTYPE, device=DEVICE)
    expected = dict(zip(ranker.config_keys(), ranker.expected_times(feats[:1])[0], strict=True))
    assert expected[ALG2] == pytest.approx(max(times[0].values()) * math.exp(MISSING_PENALTY))
    for key, t in times[0].items():
        assert expected[key] == pytest.approx(t)


def test_rows_without_a_candidate_are_left_out() -> None:
    feats, times = _table(30, seed=5)
    times[0] = {config_key("nut", {"tile": 1024}): 1e-5}
    ranker = ConfigRanker(n_estimators=5).fit(feats, times, dtype=DTYPE, device=DEVICE)
    assert ranker.n_train_ == 29
    with pytest.raises(InvalidConfigError, match="too few"):
        ConfigRanker().fit(feats[:3], [{}, {}, {A: 1.0}], dtype=DTYPE, device=DEVICE)


def test_expected_times_follow_the_device_bandwidth(fitted) -> None:
    ranker, feats, _ = fitted
    half = DeviceSpec("gpu-B", DEVICE.bandwidth_gbs / 2, DEVICE.l2_bytes, DEVICE.sms)
    np.testing.assert_allclose(ranker.expected_times(feats[:5], device=half), 2 * ranker.expected_times(feats[:5]))
    assert [r.expected_s for r in ranker.rank(feats[0], device=half)] == pytest.approx(
        [2 * r.expected_s for r in ranker.rank(feats[0])])


def test_design_matrix_is_relative_to_the_device() -> None:
    feats, _ = _table(3, seed=6)
    X, names = design_matrix(feats, dtype=DTYPE, device=DEVICE)
    assert names == [*FEATURE_NAMES, *DERIVED_FEATURES] and X.shape == (3, len(names))
    X2, _ = design_matrix(_array(feats), dtype=DTYPE, device=DeviceSpec("other", 1.0, DEVICE.l2_bytes // 2, 66))
    changed = {names[j] for j in np.flatnonzero(~np.isclose(X, X2).all(axis=0))}
    assert changed == {"x_l2", "matrix_l2", "rows_per_sm"}
    unknown, _ = design_matrix(feats, dtype=DTYPE, device=DeviceSpec("other", 1.0, 0, 66))
    assert {names[j] for j in np.flatnonzero(np.isnan(unknown).any(axis=0))} == {"x_l2", "matrix_l2"}
    with pytest.raises(InvalidConfigError, match="needs the features"):
        design_matrix([[1.0, 2.0]], dtype=DTYPE, device=DEVICE, feature_names=["rows", "cols"])


def test_an_unknown_l2_still_gives_times(fitted) -> None:
    ranker, feats, _ = fitted
    assert np.isfinite(ranker.expected_times(feats[:5], device=DeviceSpec("x", 1000.0, 0, 80))).all()


def test_rank_is_sorted_with_votes(fitted) -> None:
    ranker, feats, _ = fitted
    ranking = ranker.rank(feats[0])
    assert len(ranking) == 4
    assert [r.expected_s for r in ranking] == sorted(r.expected_s for r in ranking)
    assert all(0 <= r.votes <= 1 for r in ranking) and sum(r.votes for r in ranking) == pytest.approx(1)
    assert all(r.prepare_spmvs == pytest.approx(10) for r in ranking)
    with pytest.raises(InvalidConfigError, match="one matrix"):
        ranker.rank(feats[:2])


def test_predict_details(fitted) -> None:
    ranker, feats, _ = fitted
    details = ranker.predict_details(feats[:3])
    expected = ranker.expected_times(feats[:3]).min(axis=1)
    for d, f, t, (kernel, params) in zip(details, feats[:3], expected, ranker.predict(feats[:3]), strict=True):
        assert (d.kernel, d.params, d.basis) == (kernel, params, "ranked")
        assert 0 < d.confidence <= 1
        assert d.expected_gflops == pytest.approx(2 * f["nnz"] / t / 1e9)


def test_prepare_spmvs_prefer_large_matrices() -> None:
    feats, times = _table(40, seed=7)
    prepare = [{A: t[A] * (5 if f["nnz"] >= 1e6 else 50)} for f, t in zip(feats, times, strict=True)]
    assert any(f["nnz"] >= 1e6 for f in feats) and any(f["nnz"] < 1e6 for f in feats)
    ranker = ConfigRanker(n_estimators=5).fit(feats, times, dtype=DTYPE, device=DEVICE, prepare_times=prepare)
    spmvs = dict(zip(ranker.config_keys(), ranker.prepare_spmvs_, strict=True))
    assert spmvs[A] == pytest.approx(5) and math.isnan(spmvs[B])


def test_pickle_round_trip(fitted) -> None:
    ranker, feats, _ = fitted
    again = pickle.loads(pickle.dumps(ranker))
    np.testing.assert_array_equal(again.expected_times(feats[:5]), ranker.expected_times(feats[:5]))
    assert again.rank(feats[0]) == ranker.rank(feats[0])


def test_device_spec_from_record() -> None:
    base = {"id": "NVIDIA H200 (sm_90)", "name": "NVIDIA H200", "sms": 132, "copy_bandwidth_gbs": 4172.9}
    assert DeviceSpec.from_record(base) == DeviceSpec("NVIDIA H200 (sm_90)", 4172.9, 60 * 2**20, 132)
    assert DeviceSpec.from_record({**base, "l2_bytes": 123}).l2_bytes == 123
    assert DeviceSpec.from_record({**base, "name": "NVIDIA H100 80GB HBM3", "id": "h100"}).l2_bytes == 50 * 2**20
    assert DeviceSpec.from_record({**base, "name": "NVIDIA A100", "id": "a100"}).l2_bytes == 0
    with pytest.raises(InvalidConfigError, match="copy_bandwidth_gbs"):
        DeviceSpec.from_record({**base, "copy_bandwidth_gbs": None})


def test_compulsory_bytes() -> None:
    assert compulsory_bytes(10, 20, 30, "float32") == effective_bytes(10, 20, 30, "float32") == 30 * 8 + 44 + 80 + 40
    np.testing.assert_array_equal(compulsory_bytes(np.array([10, 1]), np.array([20, 1]), np.array([30, 1]), DTYPE),
                                  [effective_bytes(10, 20, 30, DTYPE), effective_bytes(1, 1, 1, DTYPE)])


def test_structure_family() -> None:
    assert structure_family("poisson2d-n64") == "poisson2d"
    assert structure_family("lp_fit2p") == "real" and structure_family("uniform") == "real"
    assert structure_family("newkind-3", kinds=["newkind"]) == "newkind"


# -- evaluation -----------------------------------------------------------------------------------


def _ranking_table(n: int = 60) -> RankingTable:
    feats_a, times_a = _table(n // 2, seed=8, cv_range=(0.0, 1.5))
    feats_b, times_b = _table(n - n // 2, seed=9, cv_range=(0.5, 2.0))
    feats, times = feats_a + feats_b, times_a + times_b
    families = ["banded"] * len(feats_a) + ["powerlaw"] * len(feats_b)
    return RankingTable([f"fp{i}" for i in range(n)], [f"{f}-{i}" for i, f in enumerate(families)], families,
                        _array(feats), times, [{k: 3 * t for k, t in row.items()} for row in times], DEVICE, DTYPE)


@pytest.mark.parametrize("cv", ["lofo", "kfold"])
def test_evaluation_on_two_families(cv: str) -> None:
    ev = evaluate_ranker(_ranking_table(), cv=cv, make=lambda: ConfigRanker(n_estimators=20))
    assert ev.folds == (2 if cv == "lofo" else 5) and ev.matrices == 60
    assert [r.strategy for r in ev.rows] == ["first", "race2", "race3", "race4", "race5", "cusparse"]
    for row in ev.rows:
        assert 0 < row.worst5 <= row.geomean <= 1 and row.matrices == 60
    scores = {r.strategy: r for r in ev.rows}
    assert scores["race4"].geomean == 1  # four configs in all: the race runs every one
    assert scores["cusparse"].geomean == pytest.approx(1.2 / 2.0)
    assert scores["race4"].prepare_spmvs == pytest.approx(4 * 3)  # four configs, each prepared in 3 SpMVs
    assert [f.family for f in ev.families] == ["banded", "powerlaw"]
    assert all(0 < g <= 1 for f in ev.families for g in f.geomean.values())
    metrics = json.loads(json.dumps(ev.as_metrics(), allow_nan=False))
    assert metrics["cv"] == cv and len(metrics["strategies"]) == 6
    assert "powerlaw" in ev.format_table() and "race4" in ev.format_table()


def test_evaluation_rejects_unknown_cv_and_one_family() -> None:
    table = _ranking_table()
    with pytest.raises(InvalidConfigError, match="lofo"):
        evaluate_ranker(table, cv="shuffle")
    one = RankingTable(table.fingerprints, table.names, ["banded"] * len(table), table.X, table.times, table.prepare,
                       DEVICE, DTYPE)
    with pytest.raises(InvalidConfigError, match="2 families"):
        evaluate_ranker(one, cv="lofo")


def test_ranking_table_from_a_store() -> None:
    store = Store(memory=True)
    store.add_device({"id": "gpu-A", "name": "NVIDIA H200", "kind": "gpu", "sms": 132, "copy_bandwidth_gbs": 4000.0})
    rng = np.random.default_rng(10)
    for i, name in enumerate(["banded-1", "cage8", "nofeatures"]):
        f = _features(rng, 1.0)
        store.add_matrix(f"fp{i}", name=name, rows=int(f["rows"]), cols=int(f["cols"]), nnz=int(f["nnz"]),
                         features=f if name != "nofeatures" else {"rows": f["rows"]})
        base = {"fingerprint": f"fp{i}", "device": "gpu-A", "dtype": DTYPE, "kernel": "csr_scalar",
                "params": {"block_size": 128}, "state": "ok", "verified": True}
        store.add_trials([{**base, "time_s": 2e-5, "prepare_s": 1e-3}, {**base, "time_s": 1e-5, "prepare_s": 2e-3},
                          {**base, "time_s": 1e-6, "verified": False},
                          {**base, "state": "failed", "error_kind": "timeout"},
                          {**base, "dtype": "float32", "time_s": 1e-7}])
    table = ranking_table(store, device="gpu-A", dtype=DTYPE)
    assert table.names == ["banded-1", "cage8"] and table.families == ["banded", "real"]
    assert table.times == [{A: 1e-5}] * 2 and table.prepare == [{A: 2e-3}] * 2
    assert table.X.shape == (2, len(FEATURE_NAMES)) and table.device.l2_bytes == 60 * 2**20


def test_corpus_table_matches_the_store(tmp_path: Path) -> None:
    """Reading a corpus file and importing it into a store give the same table (on the corpus cut down to 20
    matrices, to stay fast)."""
    records = list(read_corpus(CORPUS))
    keep = {r["fingerprint"] for kind, r in records if kind == "matrix"}
    keep = set(sorted(keep)[:20])
    small = [(k, r) for k, r in records[1:] if k == "device" or r.get("fingerprint") in keep]
    counts = {kind + "s": sum(k == kind for k, _ in small) for kind in ("device", "matrix", "trial")}
    counts["matrices"] = counts.pop("matrixs")
    path = tmp_path / "small.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps({**records[0][1], "counts": counts}) + "\n")
        out.writelines(json.dumps({k: r}) + "\n" for k, r in small)
    store = Store(memory=True)
    import_corpus(store, path)
    for dtype in ("float32", "float64"):
        read, stored = corpus_table(path, dtype=dtype), ranking_table(store, device=DEVICE_H200, dtype=dtype)
        assert len(read) == 20 and read.device == stored.device and read.families == stored.families
        assert (read.fingerprints, read.names, read.times, read.prepare) == \
            (stored.fingerprints, stored.names, stored.times, stored.prepare)
        np.testing.assert_array_equal(read.X, stored.X)


def test_on_the_h200_corpus_leaving_families_out() -> None:
    """The claim the race rests on: on structure families it never saw, the ranker's first config reaches 0.90
    of the tuned best and a race of its first 4 beside cuSPARSE 0.97 (geometric means, float64)."""
    table = corpus_table(CORPUS, dtype="float64")
    assert len(table) == 287 and table.device.id == DEVICE_H200 and table.device.l2_bytes == 60 * 2**20
    ev = evaluate_ranker(table, cv="lofo", ks=(4,), make=lambda: ConfigRanker(n_estimators=100))
    scores = {r.strategy: r for r in ev.rows}
    assert ev.folds == len(set(table.families)) >= 10
    assert scores["first"].geomean >= 0.90
    assert scores["race4"].geomean >= 0.97
    assert scores["race4"].geomean > scores["first"].geomean > scores["cusparse"].geomean
