"""tuner.execute.race: the shortlist's rules, the race on the CPU references, its records, cuSPARSE's ties."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import scipy.sparse as sp

from db.store import Store
from kernels import BASELINE_CONFIGS, REGISTRY, canonical, get_family
from tuner.execute.choice import stored_choice
from tuner.execute.race import (
    CHEAP_SPMVS,
    EARLY_SPMVS,
    ROOF,
    STUDY,
    UNSELECTED,
    Entrant,
    adapted,
    fitted_entrants,
    race,
    record_race,
    roof,
    search_seeds,
    shortlist,
    unranked_entrants,
    waits,
)
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend
from tuner.measure.verify import Reference
from tuner.select.model import RankedConfig


def ranked(kernel: str, params: dict, expected: float, prepare: float = 0.0) -> RankedConfig:
    return RankedConfig(kernel, get_family(kernel).space.validate(params, family=kernel), expected, prepare, 0.5)


KNOWN = [ranked(k, {}, 1e3, prepare=1e4) for k in REGISTRY if k != "cusparse"]
"""A config of every family, far behind the others: a selector that knows every family (none races unranked)."""

RANKING = [
    ranked("nut", {}, 1.0, prepare=250.0),
    ranked("nut", {"slabs": 2}, 1.1, prepare=150.0),
    ranked("csr_vector", {"threads_per_row": 4}, 1.2, prepare=0.8),
    ranked("csr_vector", {"threads_per_row": 8}, 1.25, prepare=0.8),
    ranked("csr_vector", {"threads_per_row": 16}, 1.3, prepare=0.8),
    ranked("csr_scalar", {}, 1.4, prepare=0.5),
    ranked("specsum", {}, 1.6, prepare=3.0),
    ranked("cusparse", {"algorithm": "default"}, 2.0),
    *KNOWN,
]


def test_the_shortlist_keeps_the_first_then_cheap_and_diverse_configs_and_always_cusparse() -> None:
    entrants = shortlist(RANKING, size=4, per_family=2, prepare_budget=120.0, slack=1.5)
    names = [(e.kernel, e.params.get("threads_per_row"), e.params.get("slabs")) for e in entrants]
    # nut first (the selector's answer) though its preparation alone is over the budget; the second nut is
    # over it; two csr_vector at most; cuSPARSE's ranked default left for its two algorithms; specsum
    # expected over 1.5x the first
    assert names[:4] == [("nut", None, 1), ("csr_vector", 4, None), ("csr_vector", 8, None), ("csr_scalar", None, None)]
    assert [(e.kernel, e.params) for e in entrants[4:]] == [(k, p) for k, p in BASELINE_CONFIGS]
    assert entrants[0].expected_s == 1.0 and entrants[0].prepare_spmvs == 250.0
    assert len(shortlist(RANKING, size=1)) == 3
    # past 1.15x the first only what predict runs (the first cheap to prepare) races beside it
    assert [e.kernel for e in shortlist(RANKING, size=4, slack=1.15)] == ["nut", "csr_vector", "cusparse", "cusparse"]


def test_the_shortlist_leaves_out_configs_not_expected_to_beat_cusparse_by_the_margin() -> None:
    ranking = [ranked("nut", {}, 1.0, prepare=250.0), ranked("csr_vector", {"threads_per_row": 4}, 1.2, 0.8),
               ranked("specsum", {}, 1.25, prepare=3.0), ranked("cusparse", {"algorithm": "csr_alg1"}, 1.29),
               ranked("csr_scalar", {}, 1.3, prepare=0.5), *KNOWN]
    # 0.97 x 1.29 = 1.2513: specsum (1.25) may still win, csr_scalar (1.3) cannot
    assert [e.kernel for e in shortlist(ranking, size=4)] == ["nut", "csr_vector", "specsum", "cusparse", "cusparse"]
    assert [e.kernel for e in shortlist(ranking, size=4, margin=0.05)] == ["nut", "csr_vector", "cusparse",
                                                                          "cusparse"]
    # the selector's first and what predict runs race whatever cuSPARSE is expected to take
    slow = [ranked("cusparse", {"algorithm": "csr_alg1"}, 0.5, prepare=6.0), *ranking]
    assert [e.kernel for e in shortlist(slow, size=4)] == ["nut", "csr_vector", "cusparse", "cusparse"]


def test_the_shortlist_always_has_what_predict_would_run() -> None:
    """The first config cheap to prepare races even when expected slower than ``slack`` times the first."""
    ranking = [ranked("nut", {}, 1.0, prepare=250.0), ranked("ipcsr", {}, 1.05, prepare=100.0),
               ranked("specsum", {}, 1.7, prepare=30.0), ranked("csr_vector", {"threads_per_row": 4}, 2.0, 0.8),
               ranked("csr_scalar", {}, 2.1, prepare=0.5), *KNOWN]
    kernels = [e.kernel for e in shortlist(ranking, size=4, slack=1.5, prepare_budget=120.0)]
    assert kernels == ["nut", "ipcsr", "csr_vector", "cusparse", "cusparse"]
    assert [e.kernel for e in shortlist(ranking, size=2)] == ["nut", "csr_vector", "cusparse", "cusparse"]
    assert [e.kernel for e in shortlist(ranking, size=4, prepare_budget=50.0)] == [
        "nut", "csr_vector", "cusparse", "cusparse"]  # ipcsr's 100 SpMVs are over the budget
    assert [e.kernel for e in shortlist(ranking, size=4, cheap=0.6, prepare_budget=120.0)] == [
        "nut", "ipcsr", "csr_scalar", "cusparse", "cusparse"]


def test_where_predict_would_run_cusparse_a_cheap_config_of_ours_near_it_races() -> None:
    """cuSPARSE, raced anyway, is the first config cheap to prepare: the first cheap one of ours joins where it is
    expected within ``slack`` times cuSPARSE."""
    ranking = [ranked("nut", {}, 1.0, prepare=250.0), ranked("cusparse", {"algorithm": "csr_alg1"}, 1.1, 3.0),
               ranked("ipcsr", {}, 1.2, prepare=100.0), ranked("csr_vector", {"threads_per_row": 4}, 1.5, 0.8),
               ranked("csr_scalar", {}, 1.7, prepare=0.5), *KNOWN]
    # ipcsr (1.2) cannot beat cuSPARSE (1.1) by the margin; csr_vector (1.5) is within 1.5 x 1.1 of it
    assert [e.kernel for e in shortlist(ranking, size=4, slack=1.5)] == ["nut", "csr_vector", "cusparse", "cusparse"]
    assert [e.kernel for e in shortlist(ranking, size=4, slack=1.3)] == ["nut", "cusparse", "cusparse"]
    assert [e.kernel for e in shortlist(ranking, size=4, slack=1.6, cheap=0.6)] == [
        "nut", "csr_scalar", "cusparse", "cusparse"]


def test_the_shortlist_races_what_covers_the_nearest_matrices_where_the_ranking_carries_outcomes() -> None:
    """On the training matrices nearest (here four), nut and csr_vector fail together on the last two and
    csr_scalar is best there: with outcomes the third place goes to csr_scalar, not to the second
    csr_vector the ranking puts next; without them, to the ranking's order. A config that covers nothing
    more leaves its place to the ranking's order."""
    def with_outcomes(r: RankedConfig, *outcomes: float) -> RankedConfig:
        return dataclasses.replace(r, outcomes=outcomes)

    ranking = [with_outcomes(ranked("nut", {}, 1.0, prepare=250.0), 0, 0, 1, 1),
               with_outcomes(ranked("csr_vector", {"threads_per_row": 4}, 1.1, 0.8), 0.1, 0.1, 1, 1),
               with_outcomes(ranked("csr_vector", {"threads_per_row": 8}, 1.15, 0.8), 0.1, 0.05, 0.9, 0.9),
               with_outcomes(ranked("csr_scalar", {}, 1.3, prepare=0.5), 1, 1, 0, 0),
               with_outcomes(ranked("cusparse", {"algorithm": "csr_alg1"}, 2.0), 0.5, 0.5, 0.5, 0.5),
               *(with_outcomes(r, 2, 2, 2, 2) for r in KNOWN)]
    covered = shortlist(ranking, size=3)
    assert [(e.kernel, e.params.get("threads_per_row")) for e in covered[:3]] == [
        ("nut", None), ("csr_vector", 4), ("csr_scalar", None)]
    plain = shortlist([dataclasses.replace(r, outcomes=()) for r in ranking], size=3)
    assert [(e.kernel, e.params.get("threads_per_row")) for e in plain[:3]] == [
        ("nut", None), ("csr_vector", 4), ("csr_vector", 8)]
    # csr_scalar expected over 1.2x the first is not admitted; nothing else covers more: the ranking's order
    assert [e.kernel for e in shortlist(ranking, size=3, slack=1.2)][:3] == ["nut", "csr_vector", "csr_vector"]
    # where cuSPARSE already covers what nut and csr_vector miss, nothing gains: the ranking's order
    level = [dataclasses.replace(r, outcomes=(0,) * 4) if r.kernel == "cusparse" else r for r in ranking]
    assert [e.params.get("threads_per_row") for e in shortlist(level, size=3)[:3]] == [None, 4, 8]


def test_a_family_the_selector_does_not_know_races_with_its_default() -> None:
    """One added to the registry after the selector was trained (csr5, for the selectors shipped on
    2026-11-24) cannot be ranked: the configs its family races unranked are measured, beyond ``size``, with
    what its family says a preparation costs (csr5 without features, in float64: its default with sigma 8, then
    its default's 16). merge_path races only where a selector ranks it."""
    ranking = [r for r in RANKING if r.kernel not in ("merge_path", "csr5")]
    entrants = shortlist(ranking, size=2)
    assert [e.kernel for e in entrants] == ["nut", "csr_vector", "csr5", "csr5", "cusparse", "cusparse"]
    csr5 = get_family("csr5").space.defaults()
    assert entrants[2].params == {**csr5, "sigma": 8} and entrants[2].expected_s is None
    assert entrants[3].params == csr5 and csr5["sigma"] == 16
    for csr5 in entrants[2:4]:
        assert CHEAP_SPMVS < csr5.prepare_spmvs == get_family("csr5").prepare_spmvs <= EARLY_SPMVS
        assert not waits(csr5)  # costlier than predict's bound, yet raced from the first round
    assert get_family("merge_path").unranked_config({}, 8) is None
    assert [e.kernel for e in shortlist(RANKING, size=2)] == ["nut", "csr_vector", "cusparse", "cusparse"]
    # families that race only on some matrices (rcm: square, regular rows, scattered gathers of x; rowsort:
    # regular rows, enough of them for its preparation to check their order; firsttouch: scattered gathers of
    # regular rows and columns, enough rows) race where their features say so, and not without features
    unranked = [r for r in RANKING if r.kernel not in ("merge_path", "rcm", "rowsort", "firsttouch")]
    assert [e.kernel for e in shortlist(unranked, size=2)] == ["nut", "csr_vector", "cusparse", "cusparse"]
    scattered = {"rows": 1e6, "cols": 1e6, "cf_128": 1.05, "npr_cv": 0.1, "col_cv": 0.1, "npr_mean": 27.0,
                 "diag_frac": 0.0}
    entrants = shortlist(unranked, size=2, features=scattered, itemsize=4)
    assert [e.kernel for e in entrants] == ["nut", "csr_vector", "rcm", "rowsort", "firsttouch", "cusparse",
                                            "cusparse"]
    # Rcm.unranked_config, float32, costly to prepare as its family says; rowsort and firsttouch the same threads
    # a row
    assert entrants[2].params == entrants[3].params == entrants[4].params == {
        "threads_per_row": 4, "block_size": 256, "indices": "narrow"}
    assert entrants[2].prepare_spmvs == get_family("rcm").prepare_spmvs > CHEAP_SPMVS
    assert waits(entrants[3]) and entrants[3].prepare_spmvs == get_family("rowsort").prepare_spmvs
    assert waits(entrants[4]) and entrants[4].prepare_spmvs == get_family("firsttouch").prepare_spmvs
    local = {**scattered, "cf_128": 6.0}
    assert [e.kernel for e in shortlist(unranked, size=2, features=local)][2:4] == ["rowsort", "cusparse"]
    few, skewed = {**local, "rows": 60_000.0}, {**local, "npr_cv": 1.5}
    assert all("rowsort" not in [e.kernel for e in shortlist(unranked, size=2, features=f)] for f in (few, skewed))


def test_where_most_rows_are_empty_csr_vector_races_with_the_threads_the_filled_rows_take() -> None:
    """A matrix padded to 50 times its rows (topheavy: 98 % of 5 M rows empty, the others of 100 to 300 entries):
    csr_vector, which runs over the filled rows alone there, races beside its ranked configs with the threads a
    row their mean's first loads take (32: 190 entries of 8 or 4 bytes), and a search measures it too; none where
    most rows are filled, where one row is far longer than their mean (an inverted index's first), or where the
    selector ranks no csr_vector."""
    from kernels.csr_vector import LISTED_SPREAD

    ranking = [ranked("nut", {}, 1.0, 150.0), ranked("csr_vector", {"threads_per_row": 8}, 1.1, 0.5)]
    padded = {"rows": 5e6, "cols": 5e6, "nnz": 19e6, "empty_row_frac": 0.98, "npr_max": 300.0, "npr_mean": 3.8,
              "npr_cv": 7.0, "col_cv": 0.5, "cf_128": 5.0, "diag_frac": 0.0}
    fitted = get_family("csr_vector").space.validate({"threads_per_row": 32}, family="csr_vector")
    for itemsize in (8, 4):
        kernels = [r.kernel for r in ranking]
        assert [(e.kernel, e.params) for e in fitted_entrants(kernels, padded, itemsize)] == [("csr_vector", fitted)]
        entrants = shortlist(ranking, size=2, features=padded, itemsize=itemsize)
        assert ("csr_vector", fitted) in [(e.kernel, e.params) for e in entrants[:-2]]
        assert [e.kernel for e in entrants[-2:]] == ["cusparse", "cusparse"]
        seeds = search_seeds(ranking, size=2, cols=5_000_000, itemsize=itemsize, l2_bytes=50 << 20, features=padded)
        assert ("csr_vector", fitted) in seeds
    half = {**padded, "empty_row_frac": 0.5, "nnz": 100e6}  # rows of 40: 8 threads in float64
    assert fitted_entrants([r.kernel for r in ranking], half, 8)[0].params["threads_per_row"] == 8
    filled = {**padded, "empty_row_frac": 0.3}
    one_long = {**padded, "npr_max": LISTED_SPREAD * 190.0 * 1.5}
    for features in (filled, one_long, None):
        assert fitted_entrants([r.kernel for r in ranking], features, 8) == []
    assert fitted_entrants([ranking[0].kernel], padded, 8) == []
    already = [ranked("csr_vector", {"threads_per_row": 32}, 1.0, 0.5)]  # ranked as it fits: not twice
    assert [e.kernel for e in shortlist(already, size=2, features=padded)].count("csr_vector") == 1

def plain(*kernels: str) -> list[Entrant]:
    """Entrants of these families' defaults with nothing expected of them, then cuSPARSE's two."""
    return [Entrant(k, get_family(k).space.validate({}, family=k)) for k in kernels] + \
        [Entrant(k, dict(p)) for k, p in BASELINE_CONFIGS]


def test_without_a_ranking_the_families_that_win_most_race_as_they_do_unranked() -> None:
    """No selector for this GPU: csr_scalar, csr_vector (threads covering a mean row), csr5 at setSigma's sigma and
    its second, NuT with tiles joined to the shared memory (costly: it waits for the roof), rcm only where
    renumbering can pay; nothing expected of any; then cuSPARSE. A race fits NuT's slabs to the L2 in its place.
    Rows too long for their lanes keep csr_scalar and csr_vector out."""
    from kernels.csr5 import RACE_SIGMAS, set_sigma
    from kernels.csr_vector import threads_covering
    from tuner.matrix.features import extract_features

    grid = as_csr(sp.kron(sp.eye(60), sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(60, 60))) + sp.eye(3600, k=60))
    scattered = np.random.default_rng(0).permutation(3600)
    for A, renumbers in ((grid, False), (as_csr(grid[scattered][:, scattered]), True)):
        features = extract_features(A)
        entrants = shortlist(None, size=4, features=features, itemsize=8)
        kernels = [e.kernel for e in entrants]
        assert kernels[-2:] == ["cusparse"] * 2 and kernels.count("csr5") == 2 and set(kernels[:-2]) <= set(UNSELECTED)
        assert set(kernels[:-2]) == {"csr_scalar", "csr_vector", "csr5", "nut", *(["rcm"] if renumbers else [])}
        assert all(e.expected_s is None for e in entrants)
        by = {e.kernel: e for e in entrants if e.kernel != "csr5"}
        assert by["csr_vector"].params["threads_per_row"] == threads_covering(features["npr_mean"], 8)
        sigmas = [e.params["sigma"] for e in entrants if e.kernel == "csr5"]
        assert sigmas[0] == set_sigma(features["npr_mean"]) and sigmas[1] in RACE_SIGMAS and len(set(sigmas)) == 2
        assert [by["nut"].params[k] for k in ("rows_per_panel", "cols_per_tile", "threads")] == [4096, 8192, 1024]
        assert waits(by["nut"]) and not any(waits(e) for e in entrants if e.kernel in ("csr_scalar", "csr5"))
    raced = adapted(entrants, None, cols=8_000_000, itemsize=8, l2_bytes=50 << 20)  # x of 64 MB: NuT in 4 slabs
    assert [e.params["slabs"] for e in raced if e.kernel == "nut"] == [4]
    assert [e.params["indices"] for e in raced if e.kernel == "csr_scalar"] == ["narrow", "int32"]  # the first's
    nut = next(e for e in shortlist(None, features=features, itemsize=4) if e.kernel == "nut")  # float32
    assert [nut.params[k] for k in ("rows_per_panel", "cols_per_tile", "threads")] == [8192, 16384, 1024]
    # most rows empty, the others alike: csr_vector also with the threads that cover them (fitted, as ranked)
    top = {**features, "rows": 5e6, "nnz": 5e6 * 0.02 * 200, "npr_mean": 4.0, "npr_max": 300.0, "empty_row_frac": 0.98}
    vector = [e.params["threads_per_row"] for e in shortlist(None, features=top, itemsize=8)
              if e.kernel == "csr_vector"]
    assert vector == [threads_covering(4.0, 8), 32]
    long_rows = {**features, "rows": 64.0, "nnz": 30e6, "npr_mean": 30e6 / 64, "npr_max": 480e3}  # fewlongrows
    assert {e.kernel for e in shortlist(None, features=long_rows, itemsize=8)} == {"csr5", "nut", "cusparse"}
    with pytest.raises(ValueError, match="at least one entrant"):
        shortlist(None, size=0)


@pytest.fixture
def A() -> sp.csr_matrix:
    return as_csr(sp.random(400, 300, density=0.03, format="csr", random_state=5))


def test_a_race_on_the_cpu_references_keeps_the_fastest_prepared_and_records_every_lap(A) -> None:
    backend = CpuReferenceBackend()
    entrants = [*plain("csr_vector", "csr_scalar", "specsum"), Entrant("nut", {"rows_per_panel": 3})]  # fails
    ref = Reference.build(A, "float64")
    result = race(backend, A, entrants, ref, ref.x, margin=0.0)
    assert len(result.laps) == 6
    failed = [lap for lap in result.laps if not lap.result.ok]
    assert [lap.entrant.kernel for lap in failed] == ["nut"] and failed[0].result.error_kind == "invalid_config"
    assert result.winner is not None and result.prepared is not None
    assert result.winner.time_s == min(lap.time_s for lap in result.laps if lap.result.ok)
    y = get_family(result.winner.entrant.kernel).run_reference(result.prepared, ref.x)
    np.testing.assert_allclose(y, A @ ref.x, rtol=1e-12)
    assert result.baseline_s == min(lap.time_s for lap in result.laps if lap.entrant.kernel == "cusparse")
    assert set(result.seconds) == {"prepare", "verify", "time"}
    table = result.table()
    assert table[0].startswith("*") and any("out (invalid_config" in line for line in table)
    assert all(" ms" in line for line in table if "out (" not in line)  # each timed lap: its preparation
    assert all(f"{len(lap.samples)} product" in line for lap, line in  # and its products (their range)
               zip(sorted(result.laps, key=lambda lap: lap.time_s), table, strict=True) if lap.result.ok)

    store = Store(memory=True)
    store.add_matrix("f" * 32, name="A", rows=400, cols=300, nnz=A.nnz)
    store.add_device(backend.info.record(None))
    record_race(store, result, fingerprint="f" * 32, device=backend.info.id, dtype="float64", shape=A.shape,
                nnz=A.nnz)
    rows = store.trials("f" * 32)
    assert len(rows) == 6 and {r["study"] for r in rows} == {STUDY} and len({r["trial_uid"] for r in rows}) == 6
    best = store.best("f" * 32, device=backend.info.id, dtype="float64")
    assert (best["kernel"], best["params"]) == (result.winner.entrant.kernel, result.winner.entrant.params)
    assert math.isclose(best["cusparse_time_s"], result.baseline_s)


class Scripted(CpuReferenceBackend):
    """The CPU backend with each kernel's product time set by the test."""

    def __init__(self, seconds: dict[str, float]) -> None:
        super().__init__()
        self.seconds = seconds
        self.rounds: list[int] = []  # how many entrants each call of time_queued timed
        self._ran = ""

    def run(self, family, prepared, x, out):
        self._ran = family.name
        return super().run(family, prepared, x, out)

    def time_queued(self, fns, *, repeats, flush_l2=False):
        self.rounds.append(len(fns))
        timed = []
        for fn in fns:
            fn()  # which kernel it runs sets its time
            timed.append([self.seconds[self._ran]] * repeats)
        return timed


@pytest.mark.parametrize(("vector_s", "winner"), [(0.98, "cusparse"), (0.95, "csr_vector")])
def test_a_tie_with_cusparse_goes_to_cusparse(A, vector_s: float, winner: str) -> None:
    backend = Scripted({"csr_vector": vector_s, "cusparse": 1.0})
    entrants = [Entrant("csr_vector", {"threads_per_row": 4, "block_size": 256}),
                Entrant("cusparse", {"algorithm": "csr_alg1"})]
    ref = Reference.build(A, "float64")
    result = race(backend, A, entrants, ref, ref.x, rounds=1)
    assert result.winner.entrant.kernel == winner and result.prepared.family == winner
    # read back from the store, the race's answer again (the store's best is the fastest lap)
    store = Store(memory=True)
    store.add_matrix("f" * 32, name="A", rows=A.shape[0], cols=A.shape[1], nnz=A.nnz)
    store.add_device(backend.info.record(None))
    record_race(store, result, fingerprint="f" * 32, device=backend.info.id, dtype="float64", shape=A.shape,
                nnz=A.nnz)
    assert store.best("f" * 32, device=backend.info.id, dtype="float64")["kernel"] == "csr_vector"
    again = stored_choice(store, "f" * 32, device=backend.info.id, dtype="float64")
    assert (again.kernel, again.source, again.cusparse_time_s) == (winner, "raced", 1.0)
    assert again.params == result.winner.result.params == canonical(winner, result.winner.entrant.params)


@pytest.mark.parametrize(("vector_s", "rounds", "samples", "winner"),
                         [(0.5, [2], [1, 1], "csr_vector"), (0.99, [2, 2], [3, 3], "cusparse")])
def test_the_race_times_a_second_round_only_while_two_are_close(A, vector_s: float, rounds: list[int],
                                                                 samples: list[int], winner: str) -> None:
    """One product each first (``screen``); cuSPARSE 1.05x or more behind csr_vector after it leaves, and the
    one left has won; within 5 % both get ``repeats`` products more (and a tie within the margin goes to
    cuSPARSE)."""
    backend = Scripted({"csr_vector": vector_s, "cusparse": 1.0})
    entrants = [Entrant("csr_vector", {"threads_per_row": 4, "block_size": 256}),
                Entrant("cusparse", {"algorithm": "csr_alg1"})]
    ref = Reference.build(A, "float64")
    result = race(backend, A, entrants, ref, ref.x, repeats=2, rounds=2, drop=1.05)
    assert backend.rounds == rounds
    assert result.winner.entrant.kernel == winner
    assert [len(lap.samples) for lap in result.laps] == samples


@pytest.mark.parametrize(("floor_s", "rounds", "winner"), [(0.9, [2, 2], "csr_vector"), (0.5, [2, 1], "nut")])
def test_a_cheap_entrant_at_the_roof_leaves_the_costly_ones_unprepared(A, floor_s: float, rounds: list[int],
                                                                       winner: str) -> None:
    """csr_vector (prepared in 1 SpMV) takes 1.0: at or under floor / ROOF (floor 0.9) it is at the roof and
    NuT (50 SpMVs) is never prepared; over it (floor 0.5) NuT is prepared after the first round and timed as it
    joins: the others, 25 % behind it, leave, and it has won."""
    backend = Scripted({"csr_vector": 1.0, "cusparse": 1.04, "nut": 0.8})  # cuSPARSE close: timed again
    nut = Entrant("nut", {}, prepare_spmvs=50.0)
    entrants = [nut, Entrant("csr_vector", {"threads_per_row": 4}, prepare_spmvs=1.0),
                Entrant("cusparse", {"algorithm": "csr_alg1"})]
    ref = Reference.build(A, "float64")
    result = race(backend, A, entrants, ref, ref.x, floor_s=floor_s)
    assert backend.rounds == rounds and result.winner.entrant.kernel == winner
    at_roof = floor_s / ROOF >= 1.0
    assert (result.skipped == [nut]) == at_roof and any(lap.entrant is nut for lap in result.laps) != at_roof
    assert any("nut {}: not prepared" in line for line in result.table()) == at_roof
    if not at_roof:  # one round asked: those that joined after the first are timed all the same
        backend.rounds.clear()
        once = race(backend, A, entrants, ref, ref.x, floor_s=floor_s, rounds=1)
        assert backend.rounds == [2, 1] and all(lap.result.ok for lap in once.laps)
    # two waiting: the cheaper to prepare joins first; at the roof then, the other is never prepared
    backend = Scripted({"csr_vector": 1.0, "cusparse": 1.04, "nut": 0.8, "specsum": 0.55})
    specsum = Entrant("specsum", {}, prepare_spmvs=15.0)
    result = race(backend, A, [nut, specsum, *entrants[1:]], ref, ref.x, floor_s=0.5)
    assert backend.rounds == [2, 1] and result.skipped == [nut] and result.winner.entrant is specsum
    # csr5 (its family's EARLY_SPMVS or fewer) races from the first round: at the roof it still runs and wins
    backend = Scripted({"csr_vector": 1.0, "cusparse": 1.04, "nut": 0.8, "csr5": 0.85})
    csr5 = Entrant("csr5", {}, prepare_spmvs=get_family("csr5").prepare_spmvs)
    result = race(backend, A, [nut, csr5, *entrants[1:]], ref, ref.x, floor_s=0.9)
    assert backend.rounds[0] == 3 and result.skipped == [nut] and result.winner.entrant is csr5
    # no expected preparation (no selector, or a family it does not rank): raced as before, whatever the roof
    cheap = plain("csr_vector", "csr_scalar", "specsum")
    unranked = race(CpuReferenceBackend(), A, cheap, ref, ref.x, floor_s=1.0)
    assert [lap.entrant for lap in unranked.laps] == cheap and not unranked.skipped


def test_the_roof_is_lower_where_the_values_are_smaller(A) -> None:
    """roof(8) is ROOF; a 4-byte value's entry moves 8 compulsory bytes against 12 and the same 4 beyond them, so
    its roof is 8 / 12: in float32 a cheap leader at 70 % of the copy bandwidth is at the roof (NuT left
    unprepared, the table saying at what share), in float64 it is not (NuT prepared, and wins)."""
    assert roof(8) == pytest.approx(ROOF) and roof(4) == pytest.approx(2 / 3)
    nut = Entrant("nut", {}, prepare_spmvs=50.0)
    entrants = [nut, Entrant("csr_vector", {"threads_per_row": 4}, prepare_spmvs=1.0),
                Entrant("cusparse", {"algorithm": "csr_alg1"})]
    for dtype, at_roof in (("float32", True), ("float64", False)):
        M = A.astype(dtype)
        ref = Reference.build(M, dtype)
        result = race(Scripted({"csr_vector": 1.0, "cusparse": 1.04, "nut": 0.8}), M, entrants, ref, ref.x,
                      floor_s=0.7)
        assert result.roof_share == pytest.approx(roof(M.dtype.itemsize))
        assert (result.skipped == [nut]) == at_roof
        assert result.winner.entrant.kernel == ("csr_vector" if at_roof else "nut")
        assert any("nut {}: not prepared (a cheaper entrant was at 67% of the copy bandwidth" in line
                   for line in result.table()) == at_roof


def test_every_entrant_failing_leaves_no_winner(A) -> None:
    ref = Reference.build(A, "float64")
    result = race(CpuReferenceBackend(), A, [Entrant("nut", {"rows_per_panel": 3})], ref, ref.x)
    assert result.winner is None and result.prepared is None and result.baseline_s is None


@pytest.mark.parametrize("name", ["zero_nnz", "zero_rows", "one_by_one", "one_row", "one_column", "huge_row",
                                  "empty_rows"])
def test_a_race_on_degenerate_matrices_has_a_winner_that_computes_y(name: str) -> None:
    from tests.kernel_cases import CASES

    A = CASES[name]()
    ref = Reference.build(A, "float64")
    result = race(CpuReferenceBackend(), A, shortlist(None, size=3), ref, ref.x)
    assert result.winner is not None and all(lap.result.ok for lap in result.laps)
    y = get_family(result.winner.entrant.kernel).run_reference(result.prepared, ref.x)
    np.testing.assert_allclose(y, A @ ref.x, rtol=1e-12, atol=1e-300)


def test_predict_takes_the_first_config_cheap_to_prepare() -> None:
    """plan(effort="predict") prepares nothing costly: past the budget a config is left to the race."""
    from tuner.execute.choice import ranked_choice

    ranking = [ranked("nut", {}, 1.0e-4, 150.0), ranked("csr_vector", {"threads_per_row": 4}, 1.2e-4, 0.8),
               ranked("cusparse", {"algorithm": "csr_alg1"}, 1.3e-4, 4.0)]
    assert ranked_choice(ranking, "b", nnz=1e6).kernel == "nut"
    cheap = ranked_choice(ranking, "b", nnz=1e6, prepare_budget=CHEAP_SPMVS)
    assert (cheap.kernel, cheap.source) == ("csr_vector", "predicted")
    assert cheap.expected_gflops == pytest.approx(2e6 / 1.2e-4 / 1e9)
    unknown = ranked("csr_scalar", {}, 1.0e-4, float("nan"))  # never measured: not known to be cheap
    assert ranked_choice([ranking[0], unknown], "b", nnz=1e6, prepare_budget=5.0).source == "default"


def test_predict_takes_cusparse_where_ranked_before_any_cheap_config() -> None:
    """cuSPARSE is predict's fallback whatever its preparation costs: a config ranked after it never runs for
    being cheap (its preparation expected at 6 SpMVs here, over the budget of 5)."""
    from tuner.execute.choice import ranked_choice

    ranking = [ranked("nut", {}, 1.0e-4, 150.0), ranked("cusparse", {"algorithm": "csr_alg1"}, 1.1e-4, 6.0),
               ranked("csr_vector", {"threads_per_row": 4}, 1.2e-4, 0.8)]
    pick = ranked_choice(ranking, "b", nnz=1e6, prepare_budget=5.0)
    assert (pick.kernel, pick.params, pick.source) == ("cusparse", {"algorithm": "csr_alg1"}, "predicted")


@pytest.mark.parametrize(("wins", "kernel"), [(48, "csr_vector"), (32, "csr_vector"), (31, "cusparse"),
                                           (10, "cusparse")])
def test_predict_holds_its_pick_to_cusparse_on_the_nearest_training_matrices(wins: int, kernel: str) -> None:
    """The cheap config runs where it beat cuSPARSE's csr_alg1 on at least half the 64 training matrices drawn
    nearest (32 of 64), else csr_alg1 does (31); without outcomes the pick stands."""
    from tuner.execute.choice import ranked_choice
    from tuner.select.model import DEPART_SHARE

    assert 31 / 64 < DEPART_SHARE <= 32 / 64
    base = np.full(64, 0.2)
    mine = np.where(np.arange(64) < wins, 0.1, 0.3)  # faster than cuSPARSE on the first `wins` draws
    ranking = [ranked("nut", {}, 1.0e-4, 150.0), ranked("csr_vector", {"threads_per_row": 4}, 1.2e-4, 0.8),
               ranked("cusparse", {"algorithm": "csr_alg2"}, 1.3e-4, 4.0),
               ranked("cusparse", {"algorithm": "csr_alg1"}, 1.4e-4, 4.0)]
    ranking[1].outcomes, ranking[3].outcomes = mine, base
    pick = ranked_choice(ranking, "b", nnz=1e6, prepare_budget=CHEAP_SPMVS)
    assert (pick.kernel, pick.source) == (kernel, "predicted")
    if kernel == "cusparse":
        assert pick.params == {"algorithm": "csr_alg1"}
    ranking[1].outcomes = ()
    assert ranked_choice(ranking, "b", nnz=1e6, prepare_budget=CHEAP_SPMVS).kernel == "csr_vector"


def test_the_first_entrant_races_beside_its_config_fitted_to_the_l2() -> None:
    """NuT's slabs: one slab of x in a third of the L2 (x of 64 MB in float64 against 50 MB: 4 slabs). (A first
    entrant costly to prepare is raced fitted only: the next test.)"""
    nut = Entrant("nut", get_family("nut").space.validate({"cols_per_tile": 4096}, family="nut"), 1e-3, 4.0)
    entrants = [nut, *plain("csr_vector", "csr_scalar")]
    l2 = 50 << 20
    fitted = adapted(entrants, cols=8_000_000, itemsize=8, l2_bytes=l2)
    assert [(e.kernel, e.params.get("slabs")) for e in fitted[:2]] == [("nut", 1), ("nut", 4)]
    assert fitted[1].params["cols_per_tile"] == 4096 and fitted[1].prepare_spmvs == 4.0
    # cut into slabs, panels of 32 KB of y: 4096 rows in float64, 8192 in float32 (2048 before)
    assert [e.params["rows_per_panel"] for e in fitted[:2]] == [2048, 4096]
    assert fitted[2:] == entrants[1:]
    single = adapted(entrants, cols=8_000_000, itemsize=4, l2_bytes=l2)[1].params
    assert (single["slabs"], single["rows_per_panel"]) == (2, 8192)
    assert adapted(entrants, cols=2_000_000, itemsize=8, l2_bytes=l2) == entrants  # x fits: one slab
    assert adapted(entrants, cols=8_000_000, itemsize=8, l2_bytes=0) == entrants  # L2 unknown (the CPU)
    assert adapted(fitted, cols=8_000_000, itemsize=8, l2_bytes=l2) == fitted  # not twice
    others = plain("csr_vector", "csr_scalar", "specsum")  # a family without an adaptation: as it was
    assert adapted(others, cols=8_000_000, itemsize=8, l2_bytes=l2) == others
    # x of 192 MB: 4 slabs at most (past them y's passes cost more than the x they keep in L2)
    assert adapted(entrants, cols=24_000_000, itemsize=8, l2_bytes=l2)[1].params["slabs"] == 4


def test_a_first_entrant_costly_to_prepare_races_fitted_only_and_a_search_seeds_both() -> None:
    """NuT's preparation costs tens of SpMVs: where its fit differs, the race prepares the fitted config alone (a
    cheap first races beside its fit: the test above); a search measures both."""
    params = get_family("nut").space.validate({"cols_per_tile": 4096}, family="nut")
    l2 = 50 << 20
    costly = [Entrant("nut", params, 1e-3, 150.0), *plain("csr_vector", "csr_scalar")]
    raced = adapted(costly, cols=8_000_000, itemsize=8, l2_bytes=l2)
    assert len(raced) == len(costly) and raced[1:] == costly[1:]
    assert (raced[0].params["slabs"], raced[0].params["rows_per_panel"], raced[0].prepare_spmvs) == (4, 4096, 150.0)
    seeds = search_seeds([ranked("nut", params, 1e-3, 150.0), *KNOWN], size=1, cols=8_000_000, itemsize=8,
                         l2_bytes=l2)
    assert [p["slabs"] for k, p in seeds if k == "nut"] == [1, 4]


def test_a_search_also_measures_first_what_a_race_enters_unranked() -> None:
    """The families a selector does not rank (csr5, and rcm where its features say it can pay) are what a race
    enters beside the ranking; a search seeded from that ranking measures them too, after the ranked ones."""
    ranking = [ranked("csr_vector", {"threads_per_row": 2}, 1.0, 0.5), ranked("nut", {}, 1.2, 150.0)]
    scattered = {"rows": 1e6, "cols": 1e6, "cf_128": 1.05, "npr_cv": 0.1, "col_cv": 0.1, "npr_mean": 27.0,
                 "npr_max": 27.0, "diag_frac": 0.0, "nnz": 27e6}
    seeds = search_seeds(ranking, size=2, cols=20_000, itemsize=4, l2_bytes=50 << 20, features=scattered)
    assert seeds[:2] == [("csr_vector", ranking[0].params), ("nut", ranking[1].params)]
    raced = [(e.kernel, e.params) for e in unranked_entrants(ranking, scattered, 4)]
    assert {k for k, _ in raced} >= {"csr5", "rcm"} and all(config in seeds[2:] for config in raced)
    # csr5: the race's sigmas (setSigma's: 24 for 27 a row, and 8) and the two beside setSigma's
    assert [p["sigma"] for k, p in seeds if k == "csr5"] == [24, 8, 16, 32]
    without = search_seeds(ranking, size=2, cols=20_000, itemsize=4, l2_bytes=50 << 20)
    assert ("csr5", get_family("csr5").space.defaults()) in without and "rcm" not in [k for k, _ in without]
    assert search_seeds(None, size=2, cols=20_000, itemsize=4, l2_bytes=50 << 20, features=scattered) == []
    # a selector that ranks every family: nothing unranked; NuT, expected as fast as the first, is measured too
    assert [k for k, _ in search_seeds(KNOWN, size=2, cols=20_000, itemsize=4, l2_bytes=50 << 20,
                                       features=scattered)] == [KNOWN[0].kernel, KNOWN[1].kernel, "nut"]


def test_a_csr_scalar_first_races_beside_its_int32_variant_in_float64() -> None:
    """Narrow columns save 2 of an entry's 12 bytes in float64, which pays on some matrices and GPUs and not on
    others: a csr_scalar first races (and a search measures) both; in float32 narrow alone. Only beside a
    csr_scalar first: csr_scalar names nothing it fits first, so no csr_scalar entrant joins otherwise."""
    scalar = ranked("csr_scalar", {"block_size": 512}, 1.0, 0.5)
    ranking = [scalar, ranked("csr_vector", {"threads_per_row": 2}, 1.1, 0.8), *KNOWN]
    entrants = shortlist(ranking, size=2)
    raced = adapted(entrants, ranking, cols=20_000, itemsize=8, l2_bytes=50 << 20)
    assert [(e.kernel, e.params.get("indices")) for e in raced[:3]] == [
        ("csr_scalar", "narrow"), ("csr_scalar", "int32"), ("csr_vector", "narrow")]
    assert raced[1].params == {**raced[0].params, "indices": "int32"} and raced[1].prepare_spmvs == 0.5
    assert adapted(entrants, ranking, cols=20_000, itemsize=4, l2_bytes=50 << 20) == entrants
    seeds = search_seeds(ranking, size=2, cols=20_000, itemsize=8, l2_bytes=50 << 20)
    assert [(k, p.get("indices")) for k, p in seeds] == [("csr_scalar", "narrow"), ("csr_scalar", "int32"),
                                                         ("csr_vector", "narrow")]
    vector_first = [ranking[1], scalar, *KNOWN]
    assert adapted(shortlist(vector_first, size=2), vector_first, cols=20_000, itemsize=8,
                   l2_bytes=50 << 20) == shortlist(vector_first, size=2)
    assert get_family("csr_scalar").adapt({"indices": "int32"}, cols=20_000, itemsize=8, l2_bytes=0) is None


def test_where_x_outgrows_the_l2_the_best_ranked_fitted_nut_races_though_ranked_behind_cusparse() -> None:
    """The selector ranks NuT's slab configs behind cuSPARSE on a structure it never saw: with x of 64 MB the
    best-ranked NuT config of 4 slabs races all the same (before cuSPARSE), its panels fitted to the slabs,
    and only then."""
    slab4 = {"slabs": 4, "threads": 512}
    ranking = [ranked("csr_vector", {"threads_per_row": 4}, 1.0, 0.8),
               ranked("cusparse", {"algorithm": "csr_alg1"}, 1.1, 4.0),
               ranked("nut", {"slabs": 2}, 1.2, 150.0),
               ranked("nut", slab4, 1.3, 150.0),
               ranked("nut", {"slabs": 4, "threads": 1024}, 1.4, 150.0),
               *KNOWN]
    entrants = shortlist(ranking, size=2)
    assert "nut" not in [e.kernel for e in entrants]
    l2 = 50 << 20
    raced = adapted(entrants, ranking, cols=8_000_000, itemsize=8, l2_bytes=l2)
    nut = [e for e in raced if e.kernel == "nut"]
    fitted = get_family("nut").space.validate({**slab4, "rows_per_panel": 4096}, family="nut")
    assert len(nut) == 1 and nut[0].params == fitted
    assert nut[0].expected_s == 1.3 and raced[raced.index(nut[0]) + 1:] == entrants[-len(BASELINE_CONFIGS):]
    # x fits (or the L2 is unknown): the NuT config expected fastest as ranked, within JOIN_SLACK of the first,
    # wherever the ranking put it (here behind another NuT config), as NuT joins it (its tiles widened)
    behind = [*ranking[:2], ranking[3], ranking[2], *ranking[4:]]
    wide = get_family("nut").joined(ranking[2].params, itemsize=8)
    assert wide == {**get_family("nut").space.validate(ranking[2].params, family="nut"), "cols_per_tile": 8192}
    for cols, size in ((2_000_000, l2), (8_000_000, 0)):
        for order in (ranking, behind):
            joined = adapted(entrants, order, cols=cols, itemsize=8, l2_bytes=size)
            assert [e.params for e in joined if e.kernel == "nut"] == [wide]
            assert [e for e in joined if e.kernel != "nut"] == entrants
    slow = [r if r.kernel != "nut" else dataclasses.replace(r, expected_s=r.expected_s * 1.05) for r in ranking]
    assert adapted(entrants, slow, cols=2_000_000, itemsize=8, l2_bytes=l2) == entrants  # 1.26x the first
    assert adapted(raced, ranking, cols=8_000_000, itemsize=8, l2_bytes=l2) == raced  # fitted already: not twice
    # in float32 (x of 32 MB) two slabs fit: the best-ranked of those, with panels of 8192 rows
    assert [(e.params["slabs"], e.params["rows_per_panel"]) for e in adapted(entrants, ranking, cols=8_000_000,
            itemsize=4, l2_bytes=l2) if e.kernel == "nut"] == [(2, 8192)]
    # none ranked has the fitted slabs: nothing added (the first's own fitted variant is the other way in)
    unfit = [r for r in ranking if not (r.kernel == "nut" and r.params["slabs"] == 4)]
    assert adapted(entrants, unfit, cols=8_000_000, itemsize=8, l2_bytes=l2) == entrants


def test_a_nut_first_fitted_to_the_l2_races_beside_the_best_ranked_nut_of_those_slabs() -> None:
    """A NuT first of one slab is fitted to 4 with its own tiles and threads; the best-ranked 4-slab config races
    too (its panels fitted), since the fit's tiles and threads were chosen for one slab. Where the fit is that
    config, once."""
    one = ranked("nut", {"slabs": 1, "cols_per_tile": 16384, "threads": 1024}, 1.0, 150.0)
    four = ranked("nut", {"slabs": 4, "cols_per_tile": 4096, "threads": 512}, 1.1, 150.0)
    ranking = [one, ranked("cusparse", {"algorithm": "csr_alg1"}, 1.05, 4.0), four, *KNOWN]
    l2 = 50 << 20
    raced = adapted(shortlist(ranking, size=1), ranking, cols=8_000_000, itemsize=8, l2_bytes=l2)
    nut = [e for e in raced if e.kernel == "nut"]
    assert [(e.params["slabs"], e.params["cols_per_tile"], e.params["threads"]) for e in nut] == [
        (4, 8192, 1024), (4, 4096, 512)]  # the fit's tiles narrowed to its panels' shared memory
    assert nut[1].expected_s == 1.1 and nut[1].params["rows_per_panel"] == 4096
    same = ranked("nut", {**four.params, "rows_per_panel": 4096}, 1.0, 150.0)
    again = adapted(shortlist([same, *ranking[1:]], size=1), [same, *ranking[1:]], cols=8_000_000, itemsize=8,
                    l2_bytes=l2)
    assert [e.params for e in again if e.kernel == "nut"] == [get_family("nut").space.validate(same.params,
                                                                                               family="nut")]
