"""The ``tuner`` command line, end to end on the CPU references."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from db.store import Store
from kernels import REGISTRY
from kernels._cuda import gpu_available
from tests.conftest import REPO
from tuner.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "160"})


@pytest.fixture
def matrix(tmp_path):
    path = tmp_path / "P.mtx"
    result = invoke("generate", "powerlaw", "--rows", "3000", "--seed", "1", "-o", path)
    assert result.exit_code == 0, result.output
    return path


def test_generate_writes_a_matrix_and_rejects_unknown_kinds(tmp_path, matrix):
    assert matrix.read_text().startswith("%%MatrixMarket")
    bad = invoke("generate", "nope", "-o", tmp_path / "x.mtx")
    assert bad.exit_code == 1 and "poisson2d" in bad.output


def test_tune_on_cpu_reference_then_resume_and_show(tmp_path, matrix):
    db = tmp_path / "s.db"
    first = invoke("tune", matrix, "--device", "cpu-reference", "--db", db, "--trials", str(len(REGISTRY)))
    assert first.exit_code == 0, first.output
    assert "CPU reference" in first.output and "vs cuSPARSE" in first.output
    for name in REGISTRY:
        assert re.search(rf"^.*{name}.*\d+\.\d+x", first.output, re.M), name
    store = Store(db)
    (m,) = store.matrices()
    n1 = len(store.trials(m["fingerprint"]))
    again = invoke("tune", matrix, "--device", "cpu-reference", "--db", db, "--trials", "8")
    assert again.exit_code == 0, again.output
    assert len(store.trials(m["fingerprint"])) > n1
    shown = invoke("show", matrix, "--db", db, "--trials")
    assert shown.exit_code == 0 and m["fingerprint"] in shown.output and "trials stored" in shown.output
    by_name = invoke("show", "P", "--db", db)
    assert by_name.exit_code == 0 and m["fingerprint"] in by_name.output


def test_tune_measures_the_selectors_first_configs_first(tmp_path, matrix, monkeypatch):
    """With a selector for the device, `tuner tune` starts where plan(effort="tune") does: its first configs."""
    import tuner.execute.choice
    from tuner.select.model import RankedConfig

    first = ("csr_vector", {"threads_per_row": 8, "block_size": 128, "indices": "narrow"})
    monkeypatch.setattr(tuner.execute.choice, "rank_configs",
                        lambda *a, **k: ([RankedConfig(*first, 1e-5, 1.0, 1.0)], "a test selector"))
    db = tmp_path / "s.db"
    result = invoke("tune", matrix, "--device", "cpu-reference", "--db", db, "--trials", "2")
    assert result.exit_code == 0, result.output
    assert "the first of a test selector" in result.output
    (m,) = Store(db).matrices()
    assert [(t["kernel"], t["params"]) for t in Store(db).trials(m["fingerprint"])][:1] == [first]


def test_errors_are_one_clear_line_and_exit_1(tmp_path, matrix):
    bad = tmp_path / "bad.mtx"
    bad.write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n2 x 2.0\n")
    result = invoke("tune", bad, "--device", "cpu-reference", "--db", tmp_path / "s.db")
    assert result.exit_code == 1 and "bad.mtx" in result.output and "line 4" in result.output
    assert "Traceback" not in result.output
    result = invoke("tune", matrix, "--device", "cpu-reference", "--dtype", "float16", "--db", tmp_path / "s.db")
    assert result.exit_code == 1 and "float32" in result.output
    result = invoke("tune", matrix, "--device", "cpu-reference", "--kernels", "nope", "--db", tmp_path / "s.db")
    assert result.exit_code == 1 and "known kernels" in result.output
    result = invoke("show", "0123456789abcdef", "--db", tmp_path / "s.db")
    assert result.exit_code == 1 and "nothing stored" in result.output
    result = invoke("tune", tmp_path / "missing.mtx", "--device", "cpu-reference", "--db", tmp_path / "s.db")
    assert result.exit_code == 1 and "missing.mtx" in result.output


@pytest.mark.skipif(gpu_available(), reason="checks the message on a machine without a GPU")
def test_a_large_file_is_read_with_progress_and_a_newline_free_one_refused(tmp_path, matrix, monkeypatch):
    import gzip

    import tuner.cli

    db = tmp_path / "s.db"
    assert invoke("tune", matrix, "--device", "cpu-reference", "--db", db, "--trials", "2").exit_code == 0
    monkeypatch.setattr(tuner.cli, "_PROGRESS_BYTES", 0)  # every file counts as large
    shown = invoke("show", matrix, "--db", db)
    assert shown.exit_code == 0 and "trials stored" in shown.output
    bomb = tmp_path / "bomb.mtx.gz"
    bomb.write_bytes(gzip.compress(bytes(8 << 20), compresslevel=1))
    result = invoke("show", bomb, "--db", db)
    assert result.exit_code == 1 and "line 1: longer than 1048576 bytes" in result.output


def test_tune_without_gpu_exits_non_zero_and_names_the_way_out(matrix, tmp_path):
    result = invoke("tune", matrix, "--db", tmp_path / "s.db")
    assert result.exit_code == 1 and "cpu-reference" in result.output


def test_kernels_lists_the_registry():
    result = invoke("kernels", "--json")
    assert result.exit_code == 0
    assert {d["name"] for d in json.loads(result.output)} == set(REGISTRY)


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_command():
    lines = (REPO / "README.md").read_text().splitlines()
    fence = lines.index("```bash")
    install, test = lines[fence + 1], lines[fence + 2]
    assert "tuner tune" in install and "pip install" in install
    assert "pytest" in test
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test in ci


def test_recommend_race_on_the_cpu_references_then_from_the_store(tmp_path):
    from typer.testing import CliRunner

    from tuner.cli import app
    from tuner.matrix.generate import generate
    from tuner.matrix.io import write_mtx

    write_mtx(tmp_path / "a.mtx", generate("powerlaw", rows=2000))
    args = ["recommend", str(tmp_path / "a.mtx"), "--race", "--device", "cpu-reference", "--db",
            str(tmp_path / "s.db"), "--json"]
    first = json.loads(CliRunner().invoke(app, args).output)
    raced = [line.lstrip("* ").split()[0] for line in first["race"]]  # no selector: csr5 and NuT among them
    assert first["source"] == "raced" and raced.count("cusparse") == 2 and {"csr5", "nut"} <= set(raced)
    starred = [line for line in first["race"] if line.startswith("*")]  # the winner: the fastest, or cuSPARSE
    assert len(starred) == 1 and starred[0].startswith(f"* {first['kernel']} ")  # within 3 % of it (a tie)
    again = json.loads(CliRunner().invoke(app, args).output)
    assert again["source"] == "raced" and again["race"] is None and again["kernel"] == first["kernel"]
    # without --race, cpu-reference names the same device as the race (and `tuner tune --device`) stored
    asked = json.loads(CliRunner().invoke(app, [a for a in args if a != "--race"]).output)
    assert asked["source"] == "raced" and asked["kernel"] == first["kernel"] and asked["device"] == first["device"]
