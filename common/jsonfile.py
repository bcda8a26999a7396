"""Result files of JSON, plain or gzipped: the benchmark's larger results are committed as ``.json.gz``
(``bench/results/``), and whoever reads one should not have to know which it is."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_json"]


def read_json(path: str | os.PathLike) -> Any:
    """The JSON document in ``path``, decompressed where the name ends with ``.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: str | os.PathLike, data: Any) -> None:
    """``data`` as indented JSON in ``path``, gzipped where the name ends with ``.gz`` (no timestamp in the
    gzip header: the same data, the same bytes)."""
    path = Path(path)
    text = json.dumps(data, indent=1) + "\n"
    if path.suffix == ".gz":
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
            gz.write(text.encode("utf-8"))
    else:
        path.write_text(text, encoding="utf-8")
