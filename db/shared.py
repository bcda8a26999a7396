"""One open :class:`~db.store.Store` per thread and file, for callers that are handed a path on every call.

``plan(A)`` takes the store as a path (default: the per-user one) and used to
open it on each call: the connection's pragmas, the WAL check and the schema
check cost about a millisecond, as much as plan()'s lookup and ranking
together, and the connection was left for the garbage collector. Here the
first call of a thread opens the file and later ones get that Store again (an
SQLite connection belongs to the thread that opened it), for the last
:data:`KEPT` files a thread asked for; an older one is let go, as before (its
connection closes once no one holds the Store). A file replaced since (another
inode at the path: the kept connection holds the old one open, so its number
cannot be reused) is opened anew. A forked child opens its own: a connection
must not cross a fork, so the parent's are left untouched.
"""

from __future__ import annotations

import os
import threading

from db.store import Store, default_path

__all__ = ["KEPT", "shared_store"]

KEPT = 4
"""Files a thread keeps open (a process's plan() calls use one store; a test suite's, hundreds)."""

_local = threading.local()
_left_by_fork: list[threading.local] = []
"""The parent's connections as a forked child found them: kept, never used, never closed (closing is use)."""


def shared_store(path: str | os.PathLike[str] | None = None) -> Store:
    """The calling thread's open Store of the file at ``path`` (default: :func:`~db.store.default_path`),
    opened (and created) on first use and kept for the thread's later calls."""
    key = os.fspath(path if path is not None else default_path())
    stores: dict[str, tuple[tuple[int, int] | None, Store]] = _local.__dict__.setdefault("stores", {})
    cached = stores.pop(key, None)
    if cached is not None and cached[0] == _identity(key):
        stores[key] = cached  # the newest again
        return cached[1]
    store = Store(key)
    stores[key] = (_identity(key), store)
    while len(stores) > KEPT:
        del stores[next(iter(stores))]
    return store


def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``, None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _forget_in_child() -> None:
    global _local
    _left_by_fork.append(_local)
    _local = threading.local()


os.register_at_fork(after_in_child=_forget_in_child)
