"""tuner.search.survey (``tuner corpus measure``): a portfolio measured on every matrix, resumable, on the CPU."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from db.store import Store
from tuner.cli import app
from tuner.matrix.io import write_mtx
from tuner.matrix.sources import Source, sources
from tuner.matrix.suites import SuiteMatrix
from tuner.measure.backend import CpuReferenceBackend
from tuner.search.survey import STUDY, survey
from tuner.select.portfolio import write_portfolio

CONFIGS = [("csr_scalar", {"block_size": 128}), ("csr_vector", {"threads_per_row": 4, "block_size": 64}),
           ("cusparse", {"algorithm": "csr_alg1"})]


@pytest.fixture
def srcs(tmp_path):
    from tuner.matrix.generate import generate

    write_mtx(tmp_path / "a.mtx", generate("banded", rows=300))
    (tmp_path / "bad.mtx").write_text("%%MatrixMarket matrix coordinate complex general\n1 1 1\n1 1 1 0\n")
    generated = [SuiteMatrix("uniform", 200, 3), SuiteMatrix("emptyrows", 400, 4)]
    return sources([tmp_path / "a.mtx", tmp_path / "bad.mtx"]) + [Source(m.name, "test", m.build, m.key)
                                                                   for m in generated]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_config_on_every_matrix_in_both_dtypes_then_passed_by(srcs, workers) -> None:
    store = Store(memory=True)
    report = survey(srcs, CONFIGS, backend=CpuReferenceBackend(), store=store, repeats=2, workers=workers)
    assert report.matrices == 3 and report.passed_by == 0 and report.failed == 0
    assert report.trials == 3 * len(CONFIGS) * 2
    assert list(report.unreadable) == ["bad"] and "complex" in report.unreadable["bad"]
    rows = list(store.db.query("select study, dtype, count(*) as n from trials group by study, dtype"))
    assert rows == [{"study": STUDY, "dtype": "float32", "n": 9}, {"study": STUDY, "dtype": "float64", "n": 9}]
    assert {r["fingerprint_scheme"] for r in store.db["matrices"].rows} == {2}
    again = survey(srcs, CONFIGS, backend=CpuReferenceBackend(), store=store, repeats=2, workers=workers)
    assert again.matrices == 0 and again.passed_by == 3 and again.trials == 0


def test_a_longer_portfolio_measures_only_what_is_missing(srcs) -> None:
    store = Store(memory=True)
    survey(srcs[:1], CONFIGS[:2], backend=CpuReferenceBackend(), store=store, dtypes=["float64"], repeats=2)
    report = survey(srcs[:1], CONFIGS, backend=CpuReferenceBackend(), store=store, dtypes=["float64"], repeats=2)
    assert report.matrices == 1 and report.trials == 1


def test_bad_arguments_are_refused(srcs) -> None:
    with pytest.raises(ValueError, match="repeats"):
        survey(srcs, CONFIGS, backend=CpuReferenceBackend(), store=Store(memory=True), repeats=0)


def test_the_command(tmp_path) -> None:
    write_portfolio(tmp_path / "p.json", CONFIGS)
    args = ["corpus", "measure", "--suite", "corpus-more-smoke", "--portfolio", str(tmp_path / "p.json"),
            "--db", str(tmp_path / "s.db"), "--device", "cpu-reference", "--dtype", "float32", "--repeats", "1",
            "--workers", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "6 matrices measured" in result.output and "18 trials (0 failed)" in result.output
    assert "passed by" in CliRunner().invoke(app, args).output
    assert CliRunner().invoke(app, ["corpus", "measure", "--portfolio", str(tmp_path / "p.json"),
                                    "--device", "cpu-reference", "--db", str(tmp_path / "s.db")]).exit_code != 0
