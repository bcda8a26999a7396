"""db.shared: one open Store per thread and file, opened anew where the file was replaced, left behind at a fork."""

from __future__ import annotations

import os
import sys
import threading

from db import Store
from db.shared import KEPT, shared_store


def test_a_thread_gets_the_store_it_opened_again(tmp_path) -> None:
    first = shared_store(tmp_path / "s.db")
    assert shared_store(tmp_path / "s.db") is first
    assert shared_store(str(tmp_path / "s.db")) is first  # a str or a Path: one key
    first.add_matrix("m", name="m", rows=2, cols=2, nnz=1)
    assert Store(tmp_path / "s.db").matrix("m") is not None  # an open connection like any other


def test_the_default_store_is_the_per_user_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPMV_TUNER_DB", str(tmp_path / "user.db"))
    assert shared_store().path == tmp_path / "user.db"
    assert shared_store() is shared_store(tmp_path / "user.db")


def test_a_replaced_file_is_opened_anew(tmp_path) -> None:
    path = tmp_path / "s.db"
    old = shared_store(path)
    old.add_matrix("old", name="old", rows=2, cols=2, nnz=1)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")
    with Store(path) as fresh:
        fresh.add_matrix("new", name="new", rows=2, cols=2, nnz=1)
    now = shared_store(path)
    assert now is not old
    assert now.matrix("new") is not None and now.matrix("old") is None


def test_each_thread_has_its_own(tmp_path) -> None:
    mine = shared_store(tmp_path / "s.db")
    theirs: list[Store] = []
    worker = threading.Thread(target=lambda: theirs.append(shared_store(tmp_path / "s.db")))
    worker.start()
    worker.join()
    assert theirs and theirs[0] is not mine


def test_only_the_newest_files_stay_open(tmp_path) -> None:
    stores = [shared_store(tmp_path / f"{i}.db") for i in range(KEPT)]
    assert shared_store(tmp_path / "0.db") is stores[0]  # asked again: the newest now
    shared_store(tmp_path / "extra.db")  # pushes out the oldest, 1.db
    assert shared_store(tmp_path / "0.db") is stores[0]
    assert shared_store(tmp_path / "1.db") is not stores[1]
    assert stores[1].matrix("none") is None  # let go, not closed: whoever holds it can still use it


def _open_in_child(path: str, parent_id: int) -> None:
    """A forked child's work: exit 0 only if the Store it gets is not the parent's and writes through."""
    child = shared_store(path)
    if id(child) == parent_id:
        sys.exit(1)
    child.add_matrix("child", name="child", rows=2, cols=2, nnz=1)


def test_a_forked_child_opens_its_own(tmp_path) -> None:
    """The parent's connection must not be used in a forked child: the child opens the file again."""
    import multiprocessing

    parent = shared_store(tmp_path / "s.db")
    child = multiprocessing.get_context("fork").Process(target=_open_in_child,
                                                        args=(str(tmp_path / "s.db"), id(parent)))
    child.start()
    child.join(timeout=30)
    if child.is_alive():  # hung on something the fork copied: not left behind
        child.kill()
    assert child.exitcode == 0
    assert parent.matrix("child") is not None
