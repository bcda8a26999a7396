"""db.write_behind: writes that land after their caller returns, whole or not at all, in order; and the race's."""

from __future__ import annotations

import time

import pytest
import scipy.sparse as sp

from db import Store, write_behind
from tuner.execute.plan import race_matrix
from tuner.execute.race import STUDY
from tuner.matrix.io import as_csr
from tuner.measure.backend import CpuReferenceBackend


def _matrix(name: str, nnz: int = 1):
    def write(store: Store) -> None:
        store.add_matrix(name, name=name, rows=2, cols=2, nnz=nnz)
    return write


def test_a_write_lands_on_its_own_connection_in_the_order_given(tmp_path) -> None:
    store = Store(tmp_path / "s.db")
    futures = [write_behind.submit(store, _matrix(name, nnz)) for name, nnz in (("a", 1), ("b", 2), ("a", 3))]
    write_behind.wait(str(tmp_path / "." / "s.db"))  # the same file, spelled otherwise
    assert all(f.done() and f.result() > 0 for f in futures)
    assert store.db["matrices"].get("a")["nnz"] == 3 and store.db["matrices"].get("b")["nnz"] == 2


def test_a_write_that_landed_leaves_nothing_to_wait_for(tmp_path, monkeypatch) -> None:
    """Once every write has landed, wait() returns at once, without resolving the store's file name (75 us of
    plan()'s lookup where a race had written before); a failed write stays queued until a wait warns of it."""
    store = Store(tmp_path / "s.db")
    write_behind.submit(store, _matrix("m")).result()
    deadline = time.monotonic() + 5  # the future's callbacks run just after its result is set
    while write_behind._pending and time.monotonic() < deadline:
        time.sleep(0.001)
    monkeypatch.setattr(write_behind, "_key", lambda path: pytest.fail(f"resolved {path} with nothing queued"))
    write_behind.wait(store.path)


def test_a_store_in_memory_is_written_at_once() -> None:
    store = Store(memory=True)
    assert write_behind.submit(store, _matrix("m")) is None
    assert store.db["matrices"].get("m")["name"] == "m"


def test_a_failed_write_leaves_nothing_half_written_and_warns_the_waiter(tmp_path) -> None:
    store = Store(tmp_path / "s.db")

    def half(into: Store) -> None:
        with into.transaction():
            into.add_matrix("h", name="h", rows=2, cols=2, nnz=1)
            raise RuntimeError("interrupted after the first row")

    future = write_behind.submit(store, half)
    with pytest.warns(RuntimeWarning, match="not written to the store .*interrupted after the first row"):
        write_behind.wait(store.path)
    assert isinstance(future.exception(), RuntimeError)
    assert store.db["matrices"].count_where("fingerprint = ?", ["h"]) == 0
    write_behind.wait(store.path)  # nothing pending any more: no second warning


def test_a_race_recorded_behind_lands_whole_with_its_steps_timed(tmp_path) -> None:
    A = as_csr(sp.random(300, 200, density=0.05, format="csr", random_state=3))
    store = Store(tmp_path / "s.db")
    choice, result = race_matrix(A, backend=CpuReferenceBackend(), store=store, fp="r" * 32, record_behind=True)
    assert result.recorded is not None and result.recorded.result() > 0
    assert list(result.seconds) == ["reference", "prepare", "verify", "time", "record"]
    rows = store.trials("r" * 32)
    assert len(rows) == len(result.laps) and {r["study"] for r in rows} == {STUDY}
    assert (choice.kernel, choice.source) == (result.winner.entrant.kernel, "raced")


def _submit_and_wait(path: str) -> None:
    store = Store(path)
    write_behind.submit(store, _matrix("child"))
    write_behind.wait(path)
    assert store.db["matrices"].get("child")["name"] == "child"


def test_a_forked_child_writes_through_a_writer_of_its_own(tmp_path) -> None:
    """The parent's writer thread does not exist in a forked child: the child's writes must not wait on it."""
    import multiprocessing

    store = Store(tmp_path / "s.db")
    write_behind.submit(store, _matrix("parent"))  # the parent's writer exists before the fork
    child = multiprocessing.get_context("fork").Process(target=_submit_and_wait, args=(str(store.path),))
    child.start()
    child.join(timeout=30)
    if child.is_alive():  # hung waiting on the parent's writer: not left behind
        child.kill()
    write_behind.wait(store.path)
    assert child.exitcode == 0
    assert {r["fingerprint"] for r in store.db["matrices"].rows} >= {"parent", "child"}
