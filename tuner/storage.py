"""Where optuna keeps its studies: a URL or a journal file, never a bare SQLite default.

optuna's FAQ warns that SQLite does not promise concurrent writers, so the
default is a JournalStorage on a file beside the store: two ``tuner tune``
processes on one machine append to it under a file lock. ``postgresql://…``
(or any RDB URL) serves many machines.
"""

from __future__ import annotations

import os
from pathlib import Path

import optuna

from tuner.errors import InvalidConfigError


def default_storage(db_path: str | os.PathLike) -> str:
    """The journal file beside the SQLite store."""
    return str(Path(db_path).with_name("optuna-journal.log"))


def open_storage(spec: str) -> optuna.storages.BaseStorage:
    """An RDB URL (``postgresql://``, ``sqlite:///``), ``journal:PATH`` or a path ending in ``.log``."""
    if "://" in spec:
        return optuna.storages.RDBStorage(spec)
    path = spec.removeprefix("journal:")
    if not (spec.startswith("journal:") or path.endswith(".log")):
        raise InvalidConfigError(
            f"storage {spec!r} is neither a URL (postgresql://…, sqlite:///…) nor a journal file "
            "(journal:PATH or a path ending in .log)"
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    backend = optuna.storages.journal.JournalFileBackend(path)
    return optuna.storages.JournalStorage(backend)
