"""Writes to a store that need not hold up their caller: a race's trials land while the user's products run.

``plan()`` races on the GPU in milliseconds; writing the laps to SQLite (the
matrix, its features, the device, a trial per lap, one transaction) took 4 to
9 ms more on the GPU machines, as long as the race's products. :func:`submit`
hands such a write to one background thread (one, so writes land in the order
given), which opens its own connection to the store's file: each write is
still one transaction, whole or not at all. :func:`wait` blocks until what was
queued for a file has landed (``plan()`` waits before it reads the store, so the
next ``plan()`` of a matrix finds its race); the interpreter waits for the
thread at exit; a fork waits until the writer is idle, and the child starts a
writer of its own. A store in memory has no file to share: its writes run at once.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from db.store import Store

__all__ = ["submit", "wait"]

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pending: dict[str, list[Future[float]]] = {}


def submit(store: Store, write: Callable[[Store], None]) -> Future[float] | None:
    """Run ``write(store)`` on the writer thread with a connection of its own to ``store``'s file; the future
    gives the write's seconds (or its error). A store in memory is written here and now (None)."""
    global _pool
    path = _key(store.path)
    if path == ":memory:":
        write(store)
        return None
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")
        future = _pool.submit(_write, path, write)
        _pending.setdefault(path, []).append(future)
    future.add_done_callback(functools.partial(_landed, path))
    return future


def wait(path: object) -> None:
    """Block until every write queued for the store at ``path`` has landed; one that failed is a warning
    (what it measured is lost, nothing stored is half-written)."""
    if not _pending:  # nothing queued, nothing failed unseen (the usual case): no file name to resolve
        return
    with _lock:
        futures = _pending.pop(_key(path), [])
    for future in futures:
        if (error := future.exception()) is not None:
            warnings.warn(f"measurements not written to the store {path}: {error}", RuntimeWarning, stacklevel=2)


def _landed(path: str, future: Future[float]) -> None:
    """A write that landed leaves the queue (:func:`wait` has nothing to wait for); one that failed stays until
    a wait warns of it."""
    if future.exception() is None:
        with _lock:
            queued = _pending.get(path, [])
            if future in queued:
                queued.remove(future)
            if not queued:
                _pending.pop(path, None)


def _settle_before_fork() -> None:
    """A fork copies no thread but every lock as it stands: let the writer finish what it holds first."""
    with _lock:
        futures = [f for queued in _pending.values() for f in queued]
    concurrent.futures.wait(futures)


def _forget_in_child() -> None:
    """A forked process has no writer thread of its parent: it starts its own, and waits for none of the
    parent's writes (they land from the parent)."""
    global _lock, _pool, _pending
    _lock, _pool, _pending = threading.Lock(), None, {}


os.register_at_fork(before=_settle_before_fork, after_in_child=_forget_in_child)


def _key(path: object) -> str:
    """One name for a file however it was spelled (relative, absolute): ``:memory:`` stays as it is."""
    return str(path) if str(path) == ":memory:" else str(Path(str(path)).resolve())


def _write(path: str, write: Callable[[Store], None]) -> float:
    start = time.perf_counter()
    with Store(path) as store:
        write(store)
    return time.perf_counter() - start
