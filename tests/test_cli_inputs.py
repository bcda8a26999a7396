"""The CLI refuses input it cannot mean, and a store stays whole: counts, empty matrices, bad files and stores,
two tuners at once, Ctrl-C, a read-only store, a full disk (issue #22; CPU references only)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest
from typer.testing import CliRunner

from db.store import Store
from tests.conftest import REPO
from tuner.cli import app
from tuner.matrix.generate import generate
from tuner.matrix.io import write_mtx
from tuner.search.storage import open_storage

BANNER = "%%MatrixMarket matrix coordinate real general\n"
TUNE = ("tune", "--device", "cpu-reference")


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def cli(*args: object, **kw) -> subprocess.CompletedProcess[str]:
    """``tuner ARGS`` in a process of its own (its stores closed when it exits, as a user's are)."""
    return subprocess.run([sys.executable, "-m", "tuner.cli", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "400"}, **kw)


def tune_args(matrix: Path, db: Path, trials: int, *more: object) -> list[object]:
    return [*TUNE, matrix, "--db", db, "--trials", trials, *more]


def study_of(journal: Path) -> optuna.Study:
    (name,) = optuna.get_all_study_names(open_storage(str(journal)))
    return optuna.load_study(study_name=name, storage=open_storage(str(journal)))


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials() if t.state in (optuna.trial.TrialState.COMPLETE,
                                                         optuna.trial.TrialState.FAIL)]


def stored_uids(db: Path) -> list[str]:
    with Store(db) as store:
        return [r["trial_uid"] for r in store.db["trials"].rows]


def measured_uids(study: optuna.Study) -> list[str]:
    """The uids of the study's finished trials that were measured (not told a cached value)."""
    return [t.user_attrs["uid"] for t in finished(study) if not t.user_attrs.get("cached")]


@pytest.fixture
def matrix(tmp_path: Path) -> Path:
    path = tmp_path / "m" / "P.mtx"
    path.parent.mkdir()
    write_mtx(path, generate("poisson2d", n=8))
    return path


# -- 1. each store its own journal -----------------------------------------------------------------


def test_two_stores_in_one_folder_keep_their_own_studies(tmp_path, matrix):
    for name in ("A", "B"):
        result = invoke(*tune_args(matrix, tmp_path / f"{name}.db", 3))
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.glob("*.log")) == ["A.optuna.log", "B.optuna.log"]
    for name in ("A", "B"):
        study = study_of(tmp_path / f"{name}.optuna.log")
        assert [t.number for t in finished(study)] == [0, 1, 2], name  # B's study did not go on from A's
        with Store(tmp_path / f"{name}.db") as store:
            assert sorted(r["trial_number"] for r in store.db["trials"].rows) == [0, 1, 2]


# -- 2. counts --------------------------------------------------------------------------------------


BENCH = ("bench", "{m}", "--device", "cpu-reference", "--db", "{db}", "--out", "{out}")


@pytest.mark.parametrize(("args", "option"), [
    ((*TUNE, "{m}", "--db", "{db}", "--trials", "-1"), "--trials"),
    ((*TUNE, "{m}", "--db", "{db}", "--trials", "0"), "--trials"),
    ((*TUNE, "{m}", "--db", "{db}", "--timeout", "-5"), "--timeout"),
    ((*BENCH, "--trials", "-1"), "--trials"),
    ((*BENCH, "--family-trials", "-2"), "--family-trials"),
    (("tune-many", "{m}", "--device", "cpu-reference", "--storage", "{db}.log", "--trials-per-matrix", "-1"),
     "--trials-per-matrix"),
    (("train", "--db", "{db}", "--cv", "-1"), "--cv"),
    (("train", "--db", "{db}", "--cv", "1"), "--cv"),
], ids=["tune -1", "tune 0", "tune timeout", "bench", "bench family", "tune-many", "train cv -1", "train cv 1"])
def test_meaningless_counts_are_refused_before_anything_runs(tmp_path, matrix, args, option):
    result = invoke(*(a.format(m=matrix, db=tmp_path / "s.db", out=tmp_path / "r") for a in args))
    assert result.exit_code == 2 and "Invalid value" in result.output and option in result.output, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no store, journal or result folder


# -- 3. (tests/test_io.py: a line with more fields than its header says) -----------------------------


def test_tune_refuses_a_line_with_an_extra_field_and_stores_nothing(tmp_path):
    path = tmp_path / "extra.mtx"
    path.write_text(BANNER + "2 2 2\n1 1 1.0 extra\n2 2 2.0\n")
    result = invoke(*tune_args(path, tmp_path / "s.db", 3))
    assert result.exit_code == 1 and "extra.mtx, line 3: 4 fields" in result.output, result.output
    assert not (tmp_path / "s.db").exists()


# -- 4. no rows or no columns -----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 0), (0, 5), (5, 0)], ids=["0x0", "0x5", "5x0"])
def test_a_matrix_without_rows_or_columns_is_refused_by_tune_and_bench(tmp_path, shape):
    path = tmp_path / "empty.mtx"
    path.write_text(BANNER + f"{shape[0]} {shape[1]} 0\n")
    db = tmp_path / "s.db"
    result = invoke(*tune_args(path, db, 3))
    assert result.exit_code == 1, result.output
    assert f"empty is {shape[0]} x {shape[1]}: a matrix without rows or columns" in result.output
    result = invoke("bench", path, "--device", "cpu-reference", "--db", db, "--out", tmp_path / "r", "--trials", "2")
    assert "empty failed" in result.output and "without rows or columns" in result.output, result.output
    with Store(db) as store:
        assert store.count_matrices() == 0 and store.db["trials"].count == 0
    from tuner.execute.plan import plan  # plan() takes it: y = A·x is empty, or zeros

    ex = plan(str(path), db=db)
    assert np.array_equal(ex(np.ones(shape[1])), np.zeros(shape[0]))


# -- 5. show ----------------------------------------------------------------------------------------


def test_show_of_a_missing_file_says_it_does_not_exist(tmp_path, matrix):
    db = tmp_path / "s.db"
    assert invoke(*tune_args(matrix, db, 2)).exit_code == 0
    for missing in (tmp_path / "missing.mtx", tmp_path / "gone" / "x.mtx.gz", tmp_path / "gone" / "A"):
        result = invoke("show", missing, "--db", db)
        assert result.exit_code == 1 and f"{missing}: file not found" in result.output, result.output
        assert "nothing stored" not in result.output


# -- the same bad inputs given to bench, train, report, corpus import ----------------------------------


@pytest.mark.parametrize(("args", "expected"), [
    (("bench", "{missing}.mtx", "--device", "cpu-reference", "--db", "{new}", "--out", "{out}"),
     "{missing}.mtx does not exist"),
    (("bench", "{broken}", "--device", "cpu-reference", "--db", "{garbage}", "--out", "{out}"),
     "{garbage}: file is not a database"),
    (("bench", "{broken}", "--device", "cpu-reference", "--db", "{broken}/s.db", "--out", "{out}"),
     "cannot create the folder of the store {broken}/s.db"),
    (("train", "--db", "{new}"), "no store at {new}"),
    (("train", "--db", "{garbage}"), "{garbage}: file is not a database"),
    (("train", "--db", "{new}", "--corpus", "{missing}.jsonl.gz"), "{missing}.jsonl.gz"),
    (("report", "{missing}.json"), "{missing}.json is not a benchmark result file"),
    (("report", "{broken}"), "{broken} is not a benchmark result file"),
    (("corpus", "import", "{missing}.jsonl.gz", "--db", "{new}"), "cannot read the corpus {missing}.jsonl.gz"),
    (("corpus", "import", "{broken}", "--db", "{new}"), "cannot read the corpus {broken}"),
    (("corpus", "import", "{broken}", "--db", "{garbage}"), "{garbage}: file is not a database"),
    (("corpus", "export", "{out}/c.jsonl.gz", "--db", "{new}"), "no store at {new}"),
    (("show", "P", "--db", "{new}"), "no store at {new}"),
], ids=["bench missing", "bench garbage db", "bench db under a file", "train no store", "train garbage db",
        "train missing corpus", "report missing", "report not json", "import missing", "import not a corpus",
        "import garbage db", "export no store", "show no store"])
def test_bad_files_and_stores_are_one_clear_line_and_change_nothing(tmp_path, args, expected):
    names = {"missing": tmp_path / "missing", "new": tmp_path / "new" / "s.db", "out": tmp_path / "out",
             "broken": tmp_path / "broken.mtx", "garbage": tmp_path / "garbage.db"}
    names["broken"].write_text(BANNER + "2 2 1\n1 9 1.0\n")
    names["garbage"].write_bytes(b"not a database, not a corpus either\n" * 100)
    before = sorted(tmp_path.rglob("*"))
    garbage = names["garbage"].read_bytes()
    result = invoke(*(a.format(**names) for a in args))
    assert result.exit_code == 1 and expected.format(**names) in result.output, result.output
    assert "Traceback" not in result.output
    assert names["garbage"].read_bytes() == garbage
    if "--corpus" not in args and "import" not in args:  # importing into a new store creates it first
        assert sorted(tmp_path.rglob("*")) == before


# -- two tuners at once, Ctrl-C, a read-only store, a full disk ---------------------------------------


def test_two_tunes_into_one_store_at_once_lose_no_trial(tmp_path, matrix):
    db = tmp_path / "s.db"
    procs = [subprocess.Popen([sys.executable, "-m", "tuner.cli", *map(str, tune_args(matrix, db, 15, "--seed", k))],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for k in (1, 2)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0 and "locked" not in out, out
    study = study_of(tmp_path / "s.optuna.log")
    assert len(finished(study)) == 30  # each process ran its 15
    assert sorted(stored_uids(db)) == sorted(measured_uids(study))  # every measurement in the store, once


def test_ctrl_c_keeps_the_finished_trials_and_the_next_run_goes_on(tmp_path, matrix):
    db = tmp_path / "s.db"
    # Ctrl-C's default, whatever this process inherited: a shell without job control starts background commands
    # with SIGINT ignored, and the child would inherit that and never stop
    proc = subprocess.Popen([sys.executable, "-m", "tuner.cli", *map(str, tune_args(matrix, db, 100_000))],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    # a trial's store row comes before its tell(), and the next trial's after it: 4 rows, 3 trials told at least
    while not (db.exists() and len(stored_uids(db)) >= 4):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in out, out
    kept, stored = measured_uids(study_of(tmp_path / "s.optuna.log")), stored_uids(db)
    # the store row of a trial comes before its tell(): the trial interrupted in between is the one extra
    assert len(kept) >= 3 and set(kept) <= set(stored) and len(stored) - len(kept) <= 1
    result = cli(*tune_args(matrix, db, 4))
    assert result.returncode == 0, result.stderr
    study = study_of(tmp_path / "s.optuna.log")
    assert len(finished(study)) == len(kept) + 4 and set(kept) <= set(measured_uids(study)) <= set(stored_uids(db))


def test_a_read_only_store_is_refused_for_writing_and_still_read(tmp_path, matrix):
    db = tmp_path / "s.db"
    assert cli(*tune_args(matrix, db, 2)).returncode == 0
    db.chmod(0o444)
    try:
        try:
            db.open("ab").close()
            pytest.skip("this user writes read-only files (root)")
        except PermissionError:
            pass
        journal = (tmp_path / "s.optuna.log").read_bytes()
        result = cli(*tune_args(matrix, db, 2))
        assert result.returncode == 1 and f"{db}: attempt to write a readonly database" in result.stderr, result
        assert "Traceback" not in result.stderr
        assert (tmp_path / "s.optuna.log").read_bytes() == journal  # no trial begun in the study
        shown = cli("show", matrix, "--db", db)
        assert shown.returncode == 0 and "2 trials stored" in shown.stdout, shown
    finally:
        db.chmod(0o644)


def test_a_full_disk_stops_a_tune_with_a_clear_error_and_keeps_store_and_journal(tmp_path, matrix):
    """The file size limit (RLIMIT_FSIZE) stands in for a full disk: a write past it fails, cut short."""
    db = tmp_path / "s.db"
    assert cli(*tune_args(matrix, db, 2)).returncode == 0
    limit = max(p.stat().st_size for p in tmp_path.iterdir() if p.is_file()) + 4096

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = cli(*tune_args(matrix, db, 500), preexec_fn=full_disk)
    assert result.returncode == 1 and f"error: cannot write to the store {db}" in result.stderr, result
    assert "Traceback" not in result.stderr
    with Store(db) as store:
        assert store.db.execute("pragma integrity_check").fetchone()[0] == "ok"
    study = study_of(tmp_path / "s.optuna.log")
    before, stored = len(finished(study)), stored_uids(db)
    assert before > 2 and sorted(stored) == sorted(measured_uids(study))
    again = cli(*tune_args(matrix, db, 3))
    assert again.returncode == 0, again.stderr
    study = study_of(tmp_path / "s.optuna.log")
    assert len(finished(study)) == before + 3 and set(stored) < set(stored_uids(db))
