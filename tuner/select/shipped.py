"""Kernel selectors shipped inside the package, so ``plan()`` predicts on a fresh install.

A shipped selector is one file per (device, dtype),
``tuner/data/spmv-selector_<device slug>_<dtype>.pkl.gz``: gzip of one JSON
line, the header (the ``models`` row's fields but the blob: ``task``,
``device``, ``dtype``, ``created_at``, ``n_train``, ``features``, ``metrics``,
and the scikit-learn version it was pickled with), then the blob, the same
bytes the store's ``models.blob`` holds (:func:`tuner.select.model.save_model`).
``tuner train --ship`` writes it; a kernel selector's header also holds its
training device's copy bandwidth, L2 and SMs (``device_spec``). It answers
for exactly the device and dtype its header names (the file name is only
where to look) when the store has no selector of its own for them, and for
another GPU of the same architecture (the ``(sm_XX)`` of a device id,
:func:`architecture`) that has no selector of its own, shipped or stored
(:func:`tuner.select.model.find_selector`).

This module reads headers and paths only; it imports no scikit-learn, so
``plan()`` can ask whether a selector exists without paying for it.
``$SPMV_TUNER_MODELS`` names another folder to look in, or with an empty value
turns shipped selectors off (the tests do, so what is shipped never changes
their answers). The file for a device and dtype is looked for once a process
and folder (:func:`shipped_file`; :func:`write_shipped` looks again): a file
another process ships is seen by the next process.
"""

from __future__ import annotations

import enum
import functools
import gzip
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from stat import S_ISREG
from typing import TYPE_CHECKING, Any, NamedTuple

from common.errors import InvalidConfigError

if TYPE_CHECKING:
    from db.store import Store

__all__ = ["ASK_STORE", "DATA_DIR", "ENV", "ShippedFile", "StoredRow", "architecture", "may_predict", "read_header",
           "read_shipped", "shipped_dir", "shipped_file", "shipped_path", "shipped_selectors", "slug", "write_shipped"]

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
ENV = "SPMV_TUNER_MODELS"
FORMAT = "spmv-tuner-selector"
VERSION = 1
_ARCH = re.compile(r"\((sm_\d+[a-z]?)\)\s*$")


class _Newest(enum.Enum):
    ASK_STORE = "ask the store"


ASK_STORE = _Newest.ASK_STORE
"""``newest`` (of :func:`may_predict`, :func:`tuner.select.model.find_selector` and the functions that pass it on)
where the caller has not asked the store for its newest selector row: the function asks it. ``plan()`` has asked,
with the matrix's shape (:meth:`db.store.Store.shaped_and_newest_model`)."""

StoredRow = Mapping[str, Any] | None | _Newest
"""The store's newest ``models`` row for a device and dtype (its id and created_at), None where it holds none,
or :data:`ASK_STORE`."""


def architecture(device: str) -> str | None:
    """``NVIDIA H100 80GB HBM3 (sm_90)`` → ``sm_90``: the architecture a device id names, or None."""
    found = _ARCH.search(device)
    return found.group(1) if found else None


def shipped_dir() -> Path | None:
    """Where shipped selectors are looked for: ``$SPMV_TUNER_MODELS`` (empty: nowhere), else the package's."""
    env = os.environ.get(ENV)
    if env is None:
        return DATA_DIR
    return Path(env).expanduser() if env else None


def slug(text: str) -> str:
    """``NVIDIA H200 (sm_90)`` → ``NVIDIA-H200-sm-90``: a device or label as part of a file name (the
    benchmark's result files and the shipped selectors)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


def shipped_path(device: str, dtype: str, folder: Path | None = None, *, task: str = "spmv") -> Path | None:
    """The file a selector for ``task`` ('spmv': kernels, 'spmspv': SpMSpV modes) on (device, dtype) has in
    ``folder`` (default :func:`shipped_dir`); None when shipped selectors are off."""
    folder = shipped_dir() if folder is None else folder
    return None if folder is None else _named(folder, task, device, dtype)


def _named(folder: Path, task: str, device: str, dtype: str) -> Path:
    """:func:`shipped_path`'s file (``plan()`` asks :func:`shipped_file`, which names it once a process)."""
    return folder / f"{task}-selector_{slug(device)}_{dtype}.pkl.gz"


class ShippedFile(NamedTuple):
    """A selector file found, with its modification time and size (what names its contents in a cache)."""

    path: Path
    mtime_ns: int
    size: int

    @classmethod
    def at(cls, path: Path) -> ShippedFile | None:
        """The regular file at ``path`` with its status (one ``stat``), or None where there is none."""
        try:
            stat = path.stat()
        except OSError:
            return None
        return cls(path, stat.st_mtime_ns, stat.st_size) if S_ISREG(stat.st_mode) else None


def shipped_file(device: str, dtype: str, *, task: str = "spmv") -> ShippedFile | None:
    """The file of the ``task`` selector shipped for (device, dtype) in :func:`shipped_dir`, if there is one:
    looked for once a process and folder (:func:`write_shipped` looks again). ``plan()`` asks twice (whether a
    selector may exist, then which): a file's status is 10-40 us on the GPU machines' cold hosts."""
    folder = shipped_dir()
    return None if folder is None else _found(folder, task, device, dtype)


@functools.lru_cache(maxsize=64)
def _found(folder: Path, task: str, device: str, dtype: str) -> ShippedFile | None:
    return ShippedFile.at(_named(folder, task, device, dtype))


def write_shipped(header: dict[str, Any], blob: bytes, folder: Path) -> Path:
    """Write a selector file for ``header['task']``, ``header['device']`` and ``header['dtype']`` into
    ``folder``; its path. Written to a temporary name first; gzip's timestamp is zeroed (same selector, same
    bytes)."""
    path = shipped_path(header["device"], header["dtype"], folder, task=header["task"])
    assert path is not None
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
        gz.write(json.dumps({"format": FORMAT, "version": VERSION, **header}, sort_keys=True).encode() + b"\n")
        gz.write(blob)
    tmp.replace(path)
    _found.cache_clear()
    return path


def read_header(path: Path) -> dict[str, Any]:
    """The header of a selector file; InvalidConfigError if it is not one."""
    try:
        with gzip.open(path, "rb") as f:
            header = json.loads(f.readline())
    except (OSError, EOFError, ValueError) as exc:
        raise InvalidConfigError(f"{path} is not a shipped selector: {exc}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("version") != VERSION:
        raise InvalidConfigError(f"{path} is not a shipped selector of version {VERSION}")
    return header


def read_shipped(device: str, dtype: str, *, task: str = "spmv", path: Path | None = None
                 ) -> tuple[dict[str, Any], bytes] | None:
    """(header, blob) of the ``task`` selector shipped for exactly (device, dtype) in ``path`` (default: the
    file named for them), or None."""
    path = shipped_path(device, dtype, task=task) if path is None else path
    if path is None or not path.is_file():
        return None
    header = read_header(path)
    if header.get("device") != device or header.get("dtype") != dtype or header.get("task", "spmv") != task:
        return None
    with gzip.open(path, "rb") as f:
        f.readline()
        return header, f.read()


def shipped_selectors(task: str = "spmv") -> list[dict[str, Any]]:
    """The header of every ``task`` selector shipped (in :func:`shipped_dir`), each with its ``path``; files
    that are not selectors are passed over. Reads only the headers (each once while the file is unchanged)."""
    folder = shipped_dir()
    if folder is None or not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob(f"{task}-selector_*.pkl.gz")):
        stat = path.stat()
        header = _cached_header(str(path), stat.st_mtime_ns, stat.st_size)
        if header is not None and header.get("task", "spmv") == task:
            out.append({**header, "path": path})
    return out


@functools.lru_cache(maxsize=64)
def _cached_header(path: str, mtime_ns: int, size: int) -> dict[str, Any] | None:
    try:
        return read_header(Path(path))
    except InvalidConfigError:
        return None


def may_predict(store: Store | None, device: str, dtype: str, newest: StoredRow = ASK_STORE) -> bool:
    """Whether a selector may exist for (device, dtype): the store holds models (``newest``: its newest for them,
    where the caller asked already), a file is shipped for them, or one for another GPU of the same architecture
    and dtype. Cheap (no scikit-learn): ``plan()`` extracts features only then."""
    if newest is ASK_STORE:
        if store is not None and store.db["models"].count_where("task = 'spmv'"):
            return True
    elif newest is not None:
        return True
    if shipped_file(device, dtype) is not None:
        return True
    arch = architecture(device)
    return arch is not None and any(h.get("dtype") == dtype and architecture(h.get("device", "")) == arch
                                    for h in shipped_selectors())
