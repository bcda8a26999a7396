"""The optuna journal beside a store: its own (named after it), the old shared one read on, a write cut short."""

from __future__ import annotations

import logging
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pytest
import scipy.sparse as sp

from db.store import Store
from tests.conftest import REPO
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend
from tuner.search.loop import tune
from tuner.search.storage import default_storage, open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
SHARED_JOURNAL = "optuna-journal.log"  # the journal every store of a folder shared before


@pytest.fixture
def A():
    return as_csr(sp.random(200, 150, density=0.03, format="csr", random_state=5))


def run(A, db: Path | None, storage: str, trials: int = 3):
    store = None if db is None else Store(db)
    return tune(A, backend=CpuReferenceBackend(), store=store, storage=open_storage(storage), trials=trials,
                summary=False)


def finished(storage: str) -> int:
    """Finished trials of every study in ``storage``, read afresh."""
    fresh = open_storage(storage)
    return sum(t.state.is_finished() for s in fresh.get_all_studies() for t in fresh.get_all_trials(s._study_id))


def test_each_store_has_its_own_journal_named_after_it(tmp_path):
    assert default_storage(tmp_path / "A.db") == str(tmp_path / "A.optuna.log")
    assert default_storage(tmp_path / "B.db") == str(tmp_path / "B.optuna.log")
    assert default_storage(tmp_path / "store") == str(tmp_path / "store.optuna.log")


def test_a_store_that_tuned_into_the_shared_journal_reads_on_from_it(A, tmp_path, caplog):
    shared = str(tmp_path / SHARED_JOURNAL)
    run(A, tmp_path / "old.db", shared)  # the default before each store had its own journal
    run(A[:100], tmp_path / "elsewhere.db", str(tmp_path / "other" / "j.log"))  # not a study of the shared one
    Store(tmp_path / "new.db").close()
    with caplog.at_level(logging.WARNING, logger="tuner.search.storage"):
        assert default_storage(tmp_path / "old.db") == shared
    assert "old.db reads on from" in caplog.text and "old.optuna.log" in caplog.text
    assert default_storage(tmp_path / "new.db") == str(tmp_path / "new.optuna.log")  # nothing tuned: its own
    assert default_storage(tmp_path / "elsewhere.db") == str(tmp_path / "elsewhere.optuna.log")
    again = run(A, tmp_path / "old.db", default_storage(tmp_path / "old.db"))
    assert len(optuna.load_study(study_name=again.study, storage=open_storage(shared)).trials) > 3  # went on
    (tmp_path / SHARED_JOURNAL).rename(tmp_path / "old.optuna.log")  # as the README says: now it is its own
    assert default_storage(tmp_path / "old.db") == str(tmp_path / "old.optuna.log")


def test_a_journal_write_cut_short_by_a_full_disk_is_undone(A, tmp_path):
    """A write past the file size limit (RLIMIT_FSIZE, standing in for a full disk) is cut short;
    the partial line it leaves must not make the journal unreadable once writes succeed again."""
    journal = str(tmp_path / "j.log")
    run(A, None, journal)
    limit = Path(journal).stat().st_size + 1500

    def full_disk() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    script = textwrap.dedent(f"""
        import scipy.sparse as sp
        from tuner.matrix.io import as_csr
        from tuner.measure.backend import CpuReferenceBackend
        from tuner.search.loop import tune
        from tuner.search.storage import open_storage
        A = as_csr(sp.random(200, 150, density=0.03, format="csr", random_state=5))
        tune(A, backend=CpuReferenceBackend(), store=None, storage=open_storage({journal!r}), trials=100,
             summary=False)
    """)
    cut = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                         preexec_fn=full_disk)
    assert cut.returncode == 1 and f"StoreError: cannot write the optuna journal {journal}" in cut.stderr, cut.stderr
    assert Path(journal).read_bytes().endswith(b"\n")
    before = finished(journal)
    run(A, None, journal, trials=4)
    assert finished(journal) == before + 4
