"""The generated suites (tuner.matrix.suites): the corpus's spread, and tune-many building them on the worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace

import numpy as np
import optuna
import pytest

from common.errors import InvalidConfigError
from tests.conftest import REPO
from tuner.matrix.generate import KINDS, generate
from tuner.matrix.sources import read_sources
from tuner.matrix.suites import SUITES, SuiteMatrix, approx_nnz, corpus, corpus_more
from tuner.measure.backend import CpuReferenceBackend
from tuner.search.storage import open_storage
from tuner.search.study import SOURCE_ATTR
from tuner.search.worker import run_worker

optuna.logging.set_verbosity(optuna.logging.WARNING)
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used:UserWarning")


def test_the_corpus_spreads_over_every_kind_and_10k_to_50m_nonzeros():
    matrices = SUITES["corpus"]
    assert matrices == corpus()  # deterministic
    assert 200 <= len(matrices) <= 300
    assert len({m.name for m in matrices}) == len({m.key for m in matrices}) == len(matrices)
    assert set(Counter(m.kind for m in matrices)) | {m.kind for m in SUITES["corpus-more"]} == set(KINDS)
    nnz = [approx_nnz(m.kind, m.size, dict(m.options)) for m in matrices]
    assert nnz == sorted(nnz)  # fewest first: a run cut short leaves the largest
    assert 8e3 <= nnz[0] < 2e4 and 4e7 <= nnz[-1] <= 6e7
    assert sum(n < 3e5 for n in nnz) > sum(n >= 3e5 for n in nnz) > 0  # mostly small: it tunes in minutes
    assert sum(n >= 3e6 for n in nnz) <= 15
    npr = {dict(m.options).get("half_width", 8) for m in matrices if m.kind == "banded"}
    assert npr == {1, 3, 8, 24, 64}  # 3 to 129 nonzeros a row, not only each kind's default
    smoke = SUITES["corpus-smoke"]
    kinds = {m.kind for m in matrices}
    assert {m.kind for m in smoke} == kinds and len(smoke) == len(kinds) and set(smoke) <= set(matrices)


def test_the_second_corpus_adds_new_structures_and_every_kind_above_10m():
    matrices = SUITES["corpus-more"]
    assert matrices == corpus_more()
    assert not {m.key for m in matrices} & {m.key for m in SUITES["corpus"]}
    assert {m.kind for m in matrices} == set(KINDS)
    nnz = [approx_nnz(m.kind, m.size, dict(m.options)) for m in matrices]
    assert nnz == sorted(nnz) and 2e5 <= nnz[0] and nnz[-1] <= 7e7
    new_kinds = {"blockfem", "kronecker", "arrowband", "bipartite"}
    for kind in new_kinds:
        assert sum(n >= 4e6 for m, n in zip(matrices, nnz, strict=True) if m.kind == kind) >= 3, kind
    assert sum(n >= 1e7 for n in nnz) >= 20
    smoke = SUITES["corpus-more-smoke"]
    assert new_kinds <= {m.kind for m in smoke} and all(n < 1e6 for n in
                                                       (approx_nnz(m.kind, m.size, dict(m.options)) for m in smoke))


@pytest.mark.parametrize("m", SUITES["corpus-more-smoke"], ids=lambda m: m.name)
def test_approx_nnz_of_the_new_kinds_is_within_20_percent(m: SuiteMatrix):
    assert m.build().nnz == pytest.approx(approx_nnz(m.kind, m.size, dict(m.options)), rel=0.2)


@pytest.mark.parametrize("m", [m for m in SUITES["corpus"] if approx_nnz(m.kind, m.size, dict(m.options)) < 4e5][::9],
                         ids=lambda m: m.name)
def test_approx_nnz_is_within_20_percent(m: SuiteMatrix):
    assert m.build().nnz == pytest.approx(approx_nnz(m.kind, m.size, dict(m.options)), rel=0.2)


def test_suite_matrices_build_with_their_options_and_names():
    m = SuiteMatrix("banded", 500, 3, (("half_width", 24),))
    assert m.name == "banded-500-half_width24-s3" and "half_width=24" in m.key and "seed=3" in m.key
    A = m.build("float32")
    assert A.dtype == np.float32 and A.nnz == 500 * 49 - 24 * 25
    assert SuiteMatrix("lp", 500).name == "lp-500"  # the benchmark suites keep their names


def test_generate_options_move_a_kind_and_are_checked():
    assert KINDS["uniform"].options == {"degree": 16} and KINDS["poisson2d"].options == {}
    assert generate("uniform", rows=1000, degree=64).nnz > 3 * generate("uniform", rows=1000).nnz
    assert generate("emptyrows", rows=1000, empty=0.3).nnz > generate("emptyrows", rows=1000).nnz
    for kwargs, match in (({"degree": 0}, "degree must be a positive integer"),
                          ({"degree": 2.5}, "degree must be a positive integer"),
                          ({"width": 3}, "uniform has no option 'width'; its options: degree")):
        with pytest.raises(InvalidConfigError, match=match):
            generate("uniform", rows=100, **kwargs)
    with pytest.raises(InvalidConfigError, match="empty must be a fraction below 1"):
        generate("emptyrows", rows=100, empty=1.0)
    with pytest.raises(InvalidConfigError, match="shape must be a positive number"):
        generate("powerlaw", rows=100, shape=float("nan"))
    with pytest.raises(InvalidConfigError, match="its options: none"):
        generate("poisson2d", n=4, degree=3)


# -- tune-many builds suites on the worker and passes done studies by their key --------------------------


def test_a_worker_builds_suite_matrices_itself_and_passes_done_studies_without_building_them(tmp_path):
    storage = open_storage(str(tmp_path / "j.log"), heartbeat_interval=1, grace_period=2)
    srcs = read_sources([], "corpus-smoke")[:3]
    assert [s.key for s in srcs] == [m.key for m in SUITES["corpus-smoke"][:3]]
    backend = CpuReferenceBackend()
    events: list[dict] = []
    first = run_worker(srcs, storage=storage, backend=backend, dtype="float32", total=3, emit=events.append,
                       start=2)
    assert (first.done, first.passed, first.left) == (3, 0, 0)
    assert [e["index"] for e in events if e["ev"] == "matrix"] == [2, 0, 1]  # from its start, wrapping around
    studies = {s.user_attrs[SOURCE_ATTR]: s.study_name for s in storage.get_all_studies()}
    assert set(studies) == {s.key for s in srcs}

    def unbuildable(dtype: str):
        raise AssertionError("a done study's matrix was built")

    again = run_worker([replace(s, load=unbuildable) for s in srcs], storage=storage, backend=backend,
                       dtype="float32", total=3)
    assert (again.done, again.passed, again.trials) == (3, 3, 0)
    # another dtype is another study: built and tuned
    other = run_worker(srcs[:1], storage=storage, backend=backend, dtype="float64", total=3)
    assert (other.done, other.passed) == (1, 0)
    # past the deadline nothing starts, and the list is left for the next run
    late = run_worker(srcs, storage=storage, backend=backend, dtype="float64", total=3, deadline=time.time() - 1)
    assert (late.matrices, late.left, late.trials) == (0, 3, 0)


def test_tune_many_takes_a_suite_and_a_time_limit(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "tuner", "tune-many", "--suite", "corpus-smoke", "--storage",
           str(tmp_path / "j.log"), "--trials-per-matrix", "3", "--device", "cpu-reference", "--workers", "2"]
    late = subprocess.run([*cmd, "--time-limit", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert late.returncode == 1 and "9 matrices not reached" in late.stdout, late.stdout + late.stderr
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "studies complete: 9 of 9" in done.stdout, done.stdout + done.stderr
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "studies complete: 9 of 9" in again.stdout
    rows = [line.split("│") for line in again.stdout.splitlines() if line.startswith("│")]
    assert [int(r[5]) for r in rows] == [9, 9]  # each worker passed every study by its key, building nothing


def test_the_graphs_suite_is_power_law_graphs_over_10m_rows():
    """Issue #5's NuT target is stated for power-law matrices of more than 10 M rows."""
    graphs = SUITES["graphs"]
    assert {m.kind for m in graphs} == {"powerlaw"} and len({m.options for m in graphs}) == len(graphs)
    for m in graphs:
        assert m.size > 10_000_000 and approx_nnz(m.kind, m.size, dict(m.options)) > 1e8
