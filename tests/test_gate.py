"""The selector's second opinion on a family it does not rank (tuner.select.gate, KernelSelector.second_opinion):
a synthetic table where csr5's race config is the fastest on one kind of matrix and slow on the others. CPU only."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import InvalidConfigError
from db.store import Store
from kernels import config_key, get_family
from tests.test_model import _features  # a matrix's features drawn at random, with consistent sizes
from tuner.execute.choice import choose
from tuner.matrix.features import FEATURE_NAMES
from tuner.select.evaluation import RankingTable, evaluate_selector, out_of_fold
from tuner.select.gate import out_of_fold_gains
from tuner.select.model import DeviceSpec, KernelSelector, compulsory_bytes, save_model

DTYPE = "float64"
DEVICE = DeviceSpec("gpu-A", bandwidth_gbs=4000.0, l2_bytes=60 * 2**20, sms=132)
A = config_key("csr_scalar", {"block_size": 128})
B = config_key("csr_vector", {"block_size": 256, "threads_per_row": 8})
ALG1 = config_key("cusparse", {"algorithm": "csr_alg1"})
RACED = get_family("csr5").unranked_config  # csr5's race config for a matrix's features and value size: answered
JUDGED = get_family("csr5").judged_config  # the config whose times teach the second opinion: setSigma's


def _csr5(f: dict[str, float]) -> list[str]:
    """The keys of csr5's judged and race configs (one where they are the same)."""
    return [config_key("csr5", JUDGED(f, 8)), config_key("csr5", RACED(f, 8))]


def _times(f: dict[str, float]) -> dict[str, float]:
    """csr_scalar fast where rows vary (npr_cv > 1), csr_vector elsewhere, csr5's configs faster than both
    where they vary least (npr_cv < 0.5) and slow elsewhere; in multiples of the compulsory bytes' time."""
    t = compulsory_bytes(f["rows"], f["cols"], f["nnz"], DTYPE) / (DEVICE.bandwidth_gbs * 1e9)
    varied, even = f["npr_cv"] > 1.0, f["npr_cv"] < 0.5
    return {A: t * (1.2 if varied else 3.0), B: t * (3.0 if varied else 1.2), ALG1: t * 2.0,
            **dict.fromkeys(_csr5(f), t * (1.0 if even else 4.0))}


@pytest.fixture(scope="module")
def table() -> RankingTable:
    rng = np.random.default_rng(3)
    feats = [_features(rng) for _ in range(150)]
    times = [_times(f) for f in feats]
    return RankingTable([f"{i:016d}" for i in range(150)], [f"m{i}" for i in range(150)],
                        [("banded", "powerlaw", "lp")[i % 3] for i in range(150)],
                        np.array([[f[n] for n in FEATURE_NAMES] for f in feats]), times,
                        [{k: 3 * v for k, v in t.items()} for t in times], DEVICE, DTYPE)


@pytest.fixture(scope="module")
def fitted(table: RankingTable) -> KernelSelector:
    return KernelSelector(n_estimators=30).fit(table.X, table.times, dtype=DTYPE, device=DEVICE,
                                               prepare_times=table.prepare, groups=table.families)


def _matrix(cv: float, seed: int = 7) -> dict[str, float]:
    return {**_features(np.random.default_rng(seed)), "npr_cv": cv}


def test_the_second_opinion_answers_csr5_where_its_race_config_beats_the_first(fitted):
    assert all(kernel != "csr5" for kernel, _ in fitted.configs_)  # never ranked
    assert fitted.gate_ is not None and fitted.gate_.family == "csr5"
    assert fitted.gate_.prepare_spmvs == pytest.approx(3.0)
    for even in (_matrix(0.2), _matrix(0.2, seed=1)):  # rows of 2.7 and 40.7 entries
        first = fitted.rank(even)[0]
        second = fitted.second_opinion(even, first)
        assert first.kernel == "csr_vector" and second is not None
        assert (second.kernel, second.params) == ("csr5", RACED(even, 8))
        assert second.expected_s < first.expected_s and 0.5 < second.votes <= 1
    # taught by setSigma's config on the second, answered with the race's: its sigma at most 8 in float64
    assert JUDGED(even, 8)["sigma"] > RACED(even, 8)["sigma"] == 8
    for cv in (0.8, 1.5):  # csr_vector, csr_scalar faster than csr5
        assert fitted.second_opinion(_matrix(cv), fitted.rank(_matrix(cv))[0]) is None


def test_no_second_opinion_without_its_family_measured_or_named(table):
    without = [{k: v for k, v in t.items() if not k.startswith("csr5")} for t in table.times]
    plain = KernelSelector(n_estimators=10).fit(table.X, without, dtype=DTYPE, device=DEVICE)
    assert plain.gate_ is None and plain.second_opinion(_matrix(0.2), plain.rank(_matrix(0.2))[0]) is None
    named_none = KernelSelector(n_estimators=10, gated=None)
    assert named_none.fit(table.X, table.times, dtype=DTYPE, device=DEVICE).gate_ is None
    # three matrices, two families: one family's two alone cannot rank the third, the third alone not them: no
    # second opinion (two first configs out of fold are needed), and the ranking is fitted as ever
    few = KernelSelector(n_estimators=10).fit(table.X[:3], table.times[:3], dtype=DTYPE, device=DEVICE,
                                              groups=["a", "b", "b"])
    assert few.gate_ is None and few.rank(_matrix(0.2))
    with pytest.raises(InvalidConfigError, match="150 feature rows but 2 groups"):
        KernelSelector(n_estimators=10).fit(table.X, table.times, dtype=DTYPE, device=DEVICE, groups=["a", "b"])


def test_the_second_opinion_is_taught_by_the_judged_configs_times(table):
    """csr5's judged config (setSigma's) teaches it, not the race config it answers with (in float64 a sigma of 8
    where setSigma's is more: on most rows of the table)."""
    feats = [dict(zip(FEATURE_NAMES, row, strict=True)) for row in table.X.tolist()]

    def only(which: int) -> list[dict[str, float]]:
        return [{k: v for k, v in t.items() if not k.startswith("csr5") or k == _csr5(f)[which]}
                for t, f in zip(table.times, feats, strict=True)]

    fit = {"dtype": DTYPE, "device": DEVICE, "groups": table.families}
    assert KernelSelector(n_estimators=10).fit(table.X, only(0), **fit).gate_ is not None
    assert KernelSelector(n_estimators=10).fit(table.X, only(1), **fit).gate_ is None


def test_a_selector_pickled_before_the_second_opinion_loads_without_one(fitted):
    state = dict(fitted.__getstate__())  # a copy: the fitted selector's own dict otherwise
    del state["gated"], state["gate_"]
    old = KernelSelector.__new__(KernelSelector)
    old.__setstate__(state)
    assert old.gated is None and old.second_opinion(_matrix(0.2), old.rank(_matrix(0.2))[0]) is None
    assert [r.kernel for r in old.rank(_matrix(0.2))] == [r.kernel for r in fitted.rank(_matrix(0.2))]


def test_gains_are_taken_against_the_first_config_out_of_fold():
    times = [{"a{}": 2.0, "c{}": 1.0}, {"a{}": 1.0, "b{}": 4.0, "c{}": 2.0}, {"a{}": 1.0}]
    splits = [(np.array([1, 2]), np.array([0])), (np.array([0]), np.array([1, 2]))]
    firsts = {(0,): ["a{}"], (1, 2): ["x{}", "a{}"]}  # x never measured on row 1: its slowest times 2
    gains = out_of_fold_gains(times, ["c{}", "c{}", "c{}"], splits, lambda train, test: firsts[tuple(test)])
    assert gains[0] == pytest.approx(np.log(2.0)) and gains[1] == pytest.approx(np.log(8.0 / 2.0))
    assert np.isnan(gains[2])  # its race config never measured
    unfitted = out_of_fold_gains(times, ["c{}", "c{}", None], splits, lambda train, test: [None] * len(test))
    assert np.isnan(unfitted).all()  # no first config out of fold (a fold too small to fit), or no race config


def test_the_recommendation_and_its_evaluation_take_the_second_opinion(fitted, table):
    with Store(memory=True) as store:
        store.add_device({"id": DEVICE.id, "name": DEVICE.id, "kind": "gpu", "sms": DEVICE.sms,
                          "l2_bytes": DEVICE.l2_bytes, "copy_bandwidth_gbs": DEVICE.bandwidth_gbs})
        save_model(store, fitted, device=DEVICE.id, dtype=DTYPE)
        even, varied = _matrix(0.2), _matrix(1.5)
        got = choose("f" * 16, store=store, device=DEVICE.id, dtype=DTYPE, features=even)
        assert (got.kernel, got.params, got.source) == ("csr5", RACED(even, 8), "predicted")
        assert got.basis.endswith("whose second opinion expects csr5 faster than its first config (csr_vector)")
        assert choose("f" * 16, store=store, device=DEVICE.id, dtype=DTYPE, features=varied).kernel == "csr_scalar"
    rankings = out_of_fold(table, cv="lofo", make=lambda: KernelSelector(n_estimators=20))
    cv = table.X[:, FEATURE_NAMES.index("npr_cv")]
    seconded = np.array([r.second is not None for r in rankings])
    assert seconded[cv < 0.4].mean() > 0.6 and not seconded[cv > 0.6].any()
    assert all(r.first == (r.second or r.keys[0]) and not r.keys[0].startswith("csr5") for r in rankings)
    best = np.array([min(t.values()) for t in table.times])

    def geomean(keys: list[str]) -> float:
        return float(np.exp(np.mean(np.log(best / [t[k] for t, k in zip(table.times, keys, strict=True)]))))

    seconded_first, ranked_first = geomean([r.first for r in rankings]), geomean([r.keys[0] for r in rankings])
    assert seconded_first > ranked_first + 0.02  # csr5 where it is fastest
    first = {s.strategy: s for s in evaluate_selector(table, cv="lofo", ks=(2,),
                                                      make=lambda: KernelSelector(n_estimators=20)).rows}["first"]
    assert first.geomean == pytest.approx(seconded_first) and first.unmeasured == 0
