"""SOURCES: what the commands' matrix arguments name, as a list of matrices to load, each when it is needed.

:func:`sources` takes ``.mtx``/``.mtx.gz`` files and folders of them (``tuner
bench``), and checks that every path exists first; :func:`read_sources` also
takes manifests (``tuner tune-many``). Both add a named generated suite's matrices
(:mod:`tuner.matrix.suites`), each built only when it is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import InvalidConfigError
from tuner.matrix import suites
from tuner.matrix.io import matrix_name, read_mtx

__all__ = ["Source", "read_sources", "sources"]


@dataclass(frozen=True)
class Source:
    """One matrix to tune or benchmark: a name, the suite it belongs to, and how to load it.

    ``key``, for a generated matrix, says which one it is without building it
    (``tune-many`` passes done studies by it).
    """

    name: str
    suite: str
    load: Callable[[str], Any]
    key: str | None = None


def sources(matrices: Sequence[str | Path], suite_name: str | None = None) -> list[Source]:
    """Files, folders of .mtx/.mtx.gz files, and the matrices of a named suite; a path that does not exist
    fails here, before any matrix is loaded."""
    out: list[Source] = []
    for item in map(Path, matrices):
        if not item.exists():
            raise FileNotFoundError(f"source {item} does not exist")
        files = sorted([*item.glob("*.mtx"), *item.glob("*.mtx.gz")]) if item.is_dir() else [item]
        label = item.name if item.is_dir() else "files"
        out += [Source(matrix_name(f), label, lambda dtype, f=f: read_mtx(f, dtype=dtype)) for f in files]
    if suite_name:
        out += [Source(m.name, suite_name, m.build, m.key) for m in suites.suite(suite_name)]
    return out


def read_sources(items: Sequence[str | Path], suite: str | None = None) -> list[Source]:
    """``.mtx``/``.mtx.gz`` files, folders of them, and manifests, then a named generated suite's
    matrices (built by whoever loads them), as :func:`sources` gives them.

    A manifest is any other file: one path per line (blank lines and ``#``
    comments skipped, relative paths taken from the manifest's folder), or a
    TSV whose header has a ``path`` or ``file`` column (like shared/matrices/MANIFEST.tsv).
    """
    paths: list[Path] = []
    for item in map(Path, items):
        paths += _manifest(item) if item.is_file() and not item.name.endswith((".mtx", ".mtx.gz")) else [item]
    return sources(paths, suite)


def _manifest(path: Path) -> list[Path]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if lines and "\t" in lines[0]:
        header = lines[0].split("\t")
        column = next((c for c in ("path", "file") if c in header), None)
        if column is None:
            raise InvalidConfigError(f"manifest {path}: a TSV manifest needs a 'path' or 'file' column")
        lines = [ln.split("\t")[header.index(column)] for ln in lines[1:]]
    out = [p if p.is_absolute() else path.parent / p for p in map(Path, lines)]
    if missing := [str(p) for p in out if not p.exists()]:
        raise FileNotFoundError(f"manifest {path} names missing files: {', '.join(missing[:5])}")
    return out
