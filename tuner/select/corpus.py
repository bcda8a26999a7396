"""The training corpus as one compact file: every trial of a store, with its matrices, features and devices.

A corpus file is gzipped JSON lines, written in this order so that a reader
can add each record as it comes:

1. a header: ``{"format": "spmv-tuner-corpus", "version": 1, "counts": {...}, "filter": {...}}``;
2. ``{"device": {...}}``, one per device (a ``devices`` row);
3. ``{"matrix": {"fingerprint", "name", "rows", "cols", "nnz", "fingerprint_scheme", "features": {...}}}``,
   one per matrix (a file without ``fingerprint_scheme`` is from before scheme 2: its matrices are scheme 1);
4. ``{"trial": {...}}``, one per trial (a ``trials`` row without its local ``id``; empty fields left out);
5. ``{"cusparse": {"fingerprint", "device", "dtype", "time_s"}}`` for the best rows that hold cuSPARSE's time.

Importing goes through :meth:`db.store.Store.import_trials`, keyed by
``trial_uid``, so importing a file twice, or into a store that already holds
some of its trials (the one it was exported from), adds nothing twice; the
``best`` rows follow from the trials as they do for every write. Rows of an
old store without a ``trial_uid`` get one derived from their content on export
(imported back into that same store, they would be added a second time).

The file holds no timestamp of its own and gzip's is zeroed: exporting the
same store twice gives the same bytes.

Example::

    export_corpus(store, "bench/results/corpus/h200.jsonl.gz", device="NVIDIA H200 (sm_90)")
    import_corpus(Store("fresh.db"), "bench/results/corpus/h200.jsonl.gz").trials_added
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.errors import InvalidConfigError
from db.store import TRIAL_FIELDS, Store

__all__ = ["FORMAT", "VERSION", "CorpusReport", "export_corpus", "import_corpus", "read_corpus", "replace_families"]

FORMAT = "spmv-tuner-corpus"
VERSION = 1
_MATRIX_FIELDS = ("fingerprint", "name", "rows", "cols", "nnz")
_CUSPARSE_FIELDS = ("fingerprint", "device", "dtype", "time_s")


@dataclass
class CorpusReport:
    """What an export wrote or an import found and added."""

    path: str
    devices: int = 0
    matrices: int = 0
    trials: int = 0
    trials_added: int = 0
    best: int = 0  # (matrix, device, dtype) with a best config, in the store after an import
    per_dtype: dict[str, int] = field(default_factory=dict)  # trials per dtype


def _derived_uid(row: dict[str, Any]) -> str:
    """A stable uid for a trial stored without one: the hash of its content."""
    text = json.dumps({k: row.get(k) for k in TRIAL_FIELDS if k != "trial_uid"}, sort_keys=True, default=str)
    return "derived-" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _where(device: str | None, dtype: str | None) -> tuple[str, list[str]]:
    clauses, args = [], []
    for column, value in (("device", device), ("dtype", dtype)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    return " and ".join(clauses) or "1", args


def export_corpus(store: Store, path: str | os.PathLike[str], *, device: str | None = None,
                  dtype: str | None = None) -> CorpusReport:
    """Write the store's trials (only those of ``device`` / ``dtype`` when given) with the matrices,
    features and devices they refer to, to ``path`` (gzipped JSON lines); written to a temporary file
    first, so an interrupted export leaves no half file behind."""
    if device is not None and store.device(device) is None:
        raise InvalidConfigError(f"unknown device {device!r}; devices in the store: "
                                 f"{[d['id'] for d in store.devices()]}")
    where, args = _where(device, dtype)
    trials = []
    for row in store.db["trials"].rows_where(where, args, order_by="id"):
        row = {k: row.get(k) for k in TRIAL_FIELDS}
        row["params"] = json.loads(row["params"])
        row["trial_uid"] = row["trial_uid"] or _derived_uid(row)
        trials.append({k: v for k, v in row.items() if v is not None})
    fps = sorted({t["fingerprint"] for t in trials})
    devices = sorted({t["device"] for t in trials})
    report = CorpusReport(str(path), devices=len(devices), matrices=len(fps), trials=len(trials))
    for t in trials:
        report.per_dtype[t["dtype"]] = report.per_dtype.get(t["dtype"], 0) + 1
    cusparse = [
        {"fingerprint": b["fingerprint"], "device": b["device"], "dtype": b["dtype"], "time_s": b["cusparse_time_s"]}
        for b in store.db["best"].rows_where(f"({where}) and cusparse_time_s is not null", args,
                                             order_by="fingerprint, device, dtype")
    ]
    header = {"format": FORMAT, "version": VERSION, "filter": {"device": device, "dtype": dtype},
              "counts": {"devices": len(devices), "matrices": len(fps), "trials": len(trials),
                         "per_dtype": dict(sorted(report.per_dtype.items()))}}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz, \
            io.TextIOWrapper(gz, encoding="utf-8", newline="\n") as out:
        def line(record: dict[str, Any]) -> None:
            out.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")

        line(header)
        for d in devices:
            line({"device": {k: v for k, v in store.device(d).items() if v is not None}})
        for fp in fps:
            m = store.matrix(fp)
            line({"matrix": {**{k: m[k] for k in _MATRIX_FIELDS}, "fingerprint_scheme": m["fingerprint_scheme"],
                             "features": m["features"]}})
        for t in trials:
            line({"trial": t})
        for c in cusparse:
            line({"cusparse": c})
    tmp.replace(target)
    return report


def read_corpus(path: str | os.PathLike[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind, record)`` for each line of a corpus file, the header first as ``("header", ...)``;
    InvalidConfigError names the file and line of anything that is not a corpus of a known version."""
    where = Path(path)
    try:
        with gzip.open(where, "rt", encoding="utf-8") as f:
            number = 0
            for number, text in enumerate(f, 1):
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise InvalidConfigError(f"{where}, line {number}: not JSON ({exc})") from None
                if number == 1:
                    if not isinstance(record, dict) or record.get("format") != FORMAT:
                        raise InvalidConfigError(f"{where} is not an spmv-tuner corpus (its first line has no "
                                                 f"format {FORMAT!r})")
                    if record.get("version") != VERSION:
                        raise InvalidConfigError(f"{where}: corpus version {record.get('version')!r}; this "
                                                 f"spmv-tuner reads version {VERSION}")
                    yield "header", record
                    continue
                if not isinstance(record, dict) or len(record) != 1:
                    raise InvalidConfigError(f"{where}, line {number}: expected one record, got {text[:80]!r}")
                ((kind, value),) = record.items()
                if kind not in ("device", "matrix", "trial", "cusparse") or not isinstance(value, dict):
                    raise InvalidConfigError(f"{where}, line {number}: unknown record {kind!r}")
                yield kind, value
            if number == 0:
                raise InvalidConfigError(f"{where} is empty: a corpus starts with its header line")
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # gzip.BadGzipFile is an OSError
        raise InvalidConfigError(f"cannot read the corpus {where}: {exc}") from None


def import_corpus(store: Store, path: str | os.PathLike[str], *,
                  keep: Callable[[dict[str, Any]], bool] | None = None) -> CorpusReport:
    """Add a corpus file's devices, matrices (with features) and trials to ``store``, in one transaction:
    a file that is damaged anywhere, or holds fewer records than its header counts, adds nothing. Trials
    the store holds already (by ``trial_uid``) are not added again, nor those ``keep`` turns down. Devices
    the store knows are kept as they are."""
    report = CorpusReport(str(path))
    trials: list[dict[str, Any]] = []
    cusparse: list[dict[str, Any]] = []
    counts: dict[str, Any] = {}
    with store.transaction():
        for kind, record in read_corpus(path):
            if kind == "header":
                counts = record.get("counts") or {}
            elif kind == "device":
                report.devices += 1
                if store.device(record.get("id", "")) is None:
                    store.add_device(record)
            elif kind == "matrix":
                report.matrices += 1
                _require(path, kind, record, _MATRIX_FIELDS)
                store.add_matrix(record["fingerprint"], **{k: record[k] for k in _MATRIX_FIELDS[1:]},
                                 features=record.get("features") or {},
                                 fingerprint_scheme=record.get("fingerprint_scheme", 1))  # files before scheme 2
            elif kind == "trial":
                report.trials += 1
                report.per_dtype[record.get("dtype", "?")] = report.per_dtype.get(record.get("dtype", "?"), 0) + 1
                if keep is None or keep(record):
                    trials.append(record)
            else:
                _require(path, kind, record, _CUSPARSE_FIELDS)
                cusparse.append(record)
        found = {"devices": report.devices, "matrices": report.matrices, "trials": report.trials}
        if short := {k: (found[k], counts[k]) for k in found if k in counts and found[k] != counts[k]}:
            raise InvalidConfigError(f"{path} is incomplete: (found, header counts) {short}; nothing imported")
        report.trials_added = store.import_trials(trials)
        for c in cusparse:
            store.set_cusparse_time(c["fingerprint"], device=c["device"], dtype=c["dtype"], time_s=c["time_s"])
    report.best = store.db["best"].count
    return report


def replace_families(base: str | os.PathLike[str], survey: str | os.PathLike[str], families: Collection[str],
                     out: str | os.PathLike[str]) -> CorpusReport:
    """Write ``out``: the corpus ``base`` with its trials of ``families`` replaced by ``survey``'s (a corpus file of
    `tuner corpus measure`) on base's matrices, the survey's trials of other families left out; what
    ``export_corpus`` wrote. For families whose kernels changed
    after the corpus was tuned (csr_vector's narrow columns) or that it predates (merge_path). Matrices only
    the survey holds are left out: measured in its families alone, they would teach a selector that every
    other config is missing."""
    dropped = set(families)
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "corpus.db") as store:
        import_corpus(store, base, keep=lambda trial: trial.get("kernel") not in dropped)
        known = {row["fingerprint"] for row in store.db["matrices"].rows}
        import_corpus(store, survey, keep=lambda trial: trial.get("fingerprint") in known
                      and trial.get("kernel") in dropped)
        return export_corpus(store, out)


def _require(path: str | os.PathLike[str], kind: str, record: dict[str, Any], fields: tuple[str, ...]) -> None:
    if missing := [k for k in fields if k not in record]:
        raise InvalidConfigError(f"{path}: {kind} record {record.get('fingerprint')!r} lacks {missing}")
