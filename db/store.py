"""The SQLite store: matrices and their features, devices, every trial, and the best config found.

One file in WAL mode, shared by many tuning processes at once. Every write
takes SQLite's write lock up front (``BEGIN IMMEDIATE``), so "is this trial
faster than the stored best?" is decided without races, and a process killed
mid-way leaves only whole transactions behind. The schema lives in
``sqlite_utils`` migrations, applied when a store is opened.

Example::

    with Store(memory=True) as store:
        store.add_matrix("ab12cd34ef", name="poisson2d", rows=4, cols=4, nnz=10)
        store.add_device({"id": "cpu", "name": "cpu", "kind": "cpu-reference"})
        store.add_trial({"fingerprint": "ab12cd34ef", "device": "cpu", "dtype": "float64",
                         "kernel": "csr_scalar", "params": {"block": 128}, "state": "ok",
                         "time_s": 1e-5, "verified": True})
        store.best("ab12cd34ef", device="cpu", dtype="float64")["params"]  # {'block': 128}
"""

from __future__ import annotations

import contextlib
import json
import math
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from sqlite_utils import Database
from sqlite_utils.db import NotFoundError
from sqlite_utils.migrations import Migrations

from common.errors import StoreError

TRIAL_STATES = ("ok", "failed")
ERROR_KINDS = ("compile_error", "launch_error", "wrong_answer", "out_of_memory", "timeout", "invalid_config",
               "not_applicable", "worker_lost")
# not_applicable: the family refused the matrix whatever its parameters (rcm, rowsort: common.errors.NotApplicableError)
# worker_lost: its worker died mid-trial (tuner sync); says nothing of the config
DEVICE_KINDS = ("gpu", "cpu-reference")

_MIGRATION_SET = "spmv-tuner"
_BUSY_TIMEOUT_MS = 60_000  # a tuning worker waits this long for another's write instead of failing
_MIN_PREFIX = 6  # shortest fingerprint prefix find_matrix accepts
_TRIAL_REQUIRED = ("fingerprint", "device", "dtype", "kernel", "params", "state")
_BEST_PK = ("fingerprint", "device", "dtype")
TRIAL_FIELDS = (
    "fingerprint", "device", "dtype", "kernel", "params", "study", "trial_number", "trial_uid", "state",
    "time_s", "time_p10_s", "time_p90_s", "prepare_s", "gflops", "gbps", "verified", "rel_error", "error_kind",
    "error", "created_at",
)  # fmt: skip
"""The fields of a trial record that travels between stores (``tuner sync``, corpus files): every
``trials`` column but the store's own ``id``."""
_BEST_FROM_TRIAL = ("fingerprint", "device", "dtype", "kernel", "params", "time_s", "gflops", "gbps")

Migration = Callable[[Database], None]


def default_path() -> Path:
    """Where the store lives when no path is given: ``$SPMV_TUNER_DB``, else the per-user data dir."""
    if env := os.environ.get("SPMV_TUNER_DB"):
        return Path(env).expanduser()
    data = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data) / "spmv-tuner" / "tuner.db"


def _now() -> str:
    """Current time as an ISO-8601 UTC timestamp (microseconds keep insertion order visible)."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _m001_initial(db: Database) -> None:
    """Every table of the first release. Frozen: later schema changes go in new migrations."""
    db["matrices"].create(
        {"fingerprint": str, "name": str, "rows": int, "cols": int, "nnz": int, "created_at": str},
        pk="fingerprint",
        not_null=["name", "rows", "cols", "nnz", "created_at"],
    )
    # One REAL column per feature name, added as new names appear (add_matrix).
    db["features"].create(
        {"fingerprint": str}, pk="fingerprint", foreign_keys=[("fingerprint", "matrices", "fingerprint")]
    )
    db["devices"].create(
        {
            "id": str,
            "name": str,
            "kind": str,
            "compute_capability": str,
            "sms": int,
            "memory_bytes": int,
            "copy_bandwidth_gbs": float,
            "driver": str,
            "created_at": str,
        },
        pk="id",
        not_null=["name", "kind", "created_at"],
    )
    db["trials"].create(
        {
            "id": int,
            "fingerprint": str,
            "device": str,
            "dtype": str,
            "kernel": str,
            "params": str,
            "study": str,
            "trial_number": int,
            "state": str,
            "time_s": float,
            "time_p10_s": float,
            "time_p90_s": float,
            "prepare_s": float,
            "gflops": float,
            "gbps": float,
            "verified": int,
            "rel_error": float,
            "error_kind": str,
            "error": str,
            "created_at": str,
        },
        pk="id",
        foreign_keys=[("fingerprint", "matrices", "fingerprint"), ("device", "devices", "id")],
        not_null=["fingerprint", "device", "dtype", "kernel", "params", "state", "verified", "created_at"],
    )
    db["trials"].create_index(["fingerprint", "device", "dtype"])
    db["trials"].create_index(["kernel"])
    db["best"].create(
        {
            "fingerprint": str,
            "device": str,
            "dtype": str,
            "kernel": str,
            "params": str,
            "time_s": float,
            "gflops": float,
            "gbps": float,
            "trial_id": int,
            "cusparse_time_s": float,
            "updated_at": str,
        },
        pk=("fingerprint", "device", "dtype"),
        foreign_keys=[
            ("fingerprint", "matrices", "fingerprint"),
            ("device", "devices", "id"),
            ("trial_id", "trials", "id"),
        ],
        not_null=["kernel", "params", "time_s", "trial_id", "updated_at"],
    )
    db["models"].create(
        {
            "id": int,
            "device": str,
            "dtype": str,
            "created_at": str,
            "n_train": int,
            "features": str,
            "metrics": str,
            "blob": bytes,
        },
        pk="id",
        not_null=["device", "dtype", "created_at"],
    )


def _m002_trial_uid(db: Database) -> None:
    """``trials.trial_uid``: the optuna trial's unique id, so ``tuner sync`` copies each trial once.

    Trial numbers repeat across storages (the local journal and a cluster's
    database may hold studies of the same name), so the key is a uuid the tuner
    gives every trial it asks. Rows from before have none (NULLs never collide).
    """
    db["trials"].add_column("trial_uid", str)
    db["trials"].create_index(["trial_uid"], unique=True)


def _m003_spmspv(db: Database) -> None:
    """SpMSpV: ``spmspv_trials`` (one timed product with a sparse x in one mode) and ``models.task``.

    ``models.task`` tells the SpMV kernel selector ('spmv', every row before)
    from the SpMSpV mode selector ('spmspv').
    """
    db["spmspv_trials"].create(
        {
            "id": int,
            "fingerprint": str,
            "device": str,
            "dtype": str,
            "mode": str,
            "params": str,
            "x_nnz": int,
            "x_seed": int,
            "time_s": float,
            "y_nnz": int,
            "created_at": str,
        },
        pk="id",
        foreign_keys=[("fingerprint", "matrices", "fingerprint"), ("device", "devices", "id")],
        not_null=["fingerprint", "device", "dtype", "mode", "params", "x_nnz", "x_seed", "time_s", "created_at"],
    )
    db["spmspv_trials"].create_index(["device", "dtype"])
    db["models"].add_column("task", str, not_null_default="spmv")


def _m004_fingerprint_scheme(db: Database) -> None:
    """``matrices.fingerprint_scheme`` and ``devices.l2_bytes``.

    Scheme 2 (:mod:`tuner.matrix.fingerprint`, computed on the GPU where the
    matrix is) names every matrix added from now on, the column's default; the
    rows before were named by scheme 1 (BLAKE2b), and say so, so that ``plan()``
    still finds what was tuned under it (:meth:`Store.has_legacy_matrix`).
    ``devices.l2_bytes``: the L2 size, which the selector's device-relative
    features need to answer for another GPU.
    """
    db["matrices"].add_column("fingerprint_scheme", int, not_null_default=2)
    db["matrices"].convert("fingerprint_scheme", lambda _: 1)
    db["matrices"].create_index(["rows", "cols", "nnz"])
    db["devices"].add_column("l2_bytes", int)


def _convert(kind: type, value: Any) -> Any:
    """``value`` as the plain Python type of a column (NumPy scalars included), or TypeError/ValueError."""
    if value is None:
        return None
    if kind is float and not isinstance(value, str | bytes):
        return float(value)
    if kind is int:
        return operator.index(value)
    if isinstance(value, kind):
        return value
    raise TypeError(value)


def _positive_time(value: Any, what: str) -> float:
    """A finite time in seconds > 0, or StoreError naming ``what``."""
    try:
        seconds = _convert(float, value)
    except (TypeError, ValueError):
        seconds = None
    if seconds is None or not (math.isfinite(seconds) and seconds > 0):
        raise StoreError(f"{what} must be a positive, finite time in seconds, got {value!r}")
    return seconds


def _dump_params(params: Any) -> str:
    """Params as JSON with sorted keys, so equal configs compare equal as text."""
    if not isinstance(params, Mapping):
        raise StoreError(f"trial params must be a mapping, got {type(params).__name__}")
    try:
        return json.dumps(dict(params), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"trial params {params!r} are not JSON-serialisable: {exc}") from exc


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A trial or best row with ``params`` back as a dict."""
    return {**row, "params": json.loads(row["params"])}


def _feature_values(features: Mapping[str, float]) -> dict[str, float]:
    """Feature names checked and values made plain floats (the columns are REAL)."""
    values = {}
    for name, value in features.items():
        if not isinstance(name, str) or not name or name.lower() == "fingerprint":
            raise StoreError(f"invalid feature name {name!r}")
        try:
            values[name] = _convert(float, value)
        except (TypeError, ValueError):
            raise StoreError(f"feature {name!r}: expected a number, got {value!r}") from None
    return values


class _Database(Database):
    """sqlite-utils' ``Database`` over a store, whose schema holds tables and no views: ``db[name]`` takes the
    table without asking SQLite for the names of the views first (sqlite-utils asks twice a lookup, and a
    ``plan()`` looks tables up some ten times: half the statements it sent)."""

    def view_names(self) -> list[str]:
        return []


class Store:
    """The tuner's SQLite database. Open one Store per process or thread; many may share one file.

    ``db`` is the underlying ``sqlite_utils.Database``, for read-only queries;
    write through the methods, which validate records and keep ``best`` right.
    ``create=False``: a file that does not exist is an error rather than a new, empty store.
    """

    #: The schema's migrations, in order. Append new ones; never edit, rename or reorder applied ones.
    MIGRATIONS: ClassVar[tuple[Migration, ...]] = (_m001_initial, _m002_trial_uid, _m003_spmspv,
                                                   _m004_fingerprint_scheme)
    SCHEMA_VERSION: ClassVar[int] = len(MIGRATIONS)

    def __init__(self, path: str | os.PathLike[str] | None = None, *, memory: bool = False,
                 create: bool = True) -> None:
        if memory and path is not None:
            raise ValueError("pass either a path or memory=True, not both")
        file = None if memory else Path(path if path is not None else default_path())
        self.path: Path | str = ":memory:" if file is None else file
        if file is not None and not create and not file.exists():
            raise StoreError(f"no store at {file}")
        self._migrations = Migrations(_MIGRATION_SET)
        for step in self.MIGRATIONS:
            self._migrations(name=step.__name__)(step)
        if file is not None:
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder of the store {file}: {exc}") from exc
        with self._errors("open"):
            self.db = _Database(memory=True) if file is None else _Database(file)
        try:
            with self._errors("open"):
                self._open(wal=not memory)
        except BaseException:
            self.db.close()
            raise

    def _open(self, *, wal: bool) -> None:
        """Set the connection up and bring the schema up to date."""
        self.db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
        self.db.execute("PRAGMA foreign_keys = ON")
        if wal:
            self._enable_wal()
        known = {step.__name__ for step in self.MIGRATIONS}
        applied = self._migrations.applied(self.db)
        if unknown := [m.name for m in applied if m.name not in known]:
            raise StoreError(
                f"the store {self.path} has schema version {len(applied)} (migrations {', '.join(unknown)}), "
                f"newer than this spmv-tuner knows ({self.SCHEMA_VERSION}): upgrade spmv-tuner to open it"
            )
        if self._migrations.pending(self.db):
            with self._write():  # apply() re-checks what is pending, now under the write lock
                self._migrations.apply(self.db)
        self._columns = {t: self.db[t].columns_dict for t in ("matrices", "devices", "trials", "spmspv_trials")}

    def _enable_wal(self) -> None:
        """Switch the file to WAL once; SQLite answers that switch with "locked" at once, without
        waiting, while another process opens the same new file: retry within the busy timeout."""
        deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
        while self.db.journal_mode != "wal":
            try:
                self.db.enable_wal()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the store cannot be used afterwards."""
        self.db.close()

    def schema_version(self) -> int:
        """How many of the schema's migrations this file has applied."""
        return len(self._migrations.applied(self.db))

    # -- transactions and validation -------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Turn SQLite's errors into StoreError naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"cannot {doing} the store {self.path}: {exc}") from exc

    def transaction(self) -> contextlib.AbstractContextManager[Database]:
        """Several writes as one: all of them or, on any error, none (the methods' own writes join it)."""
        return self._write()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Database]:
        """One transaction begun with ``BEGIN IMMEDIATE``, committed on success, rolled back on error;
        inside one already open (:meth:`transaction`), the writes simply join it.

        ``db.atomic()`` begins DEFERRED: two processes could then both read the
        old best before either writes. IMMEDIATE takes the write lock first
        (waiting up to the busy timeout); sqlite-utils' own writes inside it
        become savepoints.
        """
        if self.db.conn.in_transaction:
            yield self.db
            return
        with self._errors("write to"):
            self.db.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
                self.db.conn.execute("COMMIT")
            except BaseException:
                self.db.rollback()
                raise

    def _get(self, table: str, pk: Any) -> dict[str, Any] | None:
        """The row with primary key ``pk``, or None."""
        try:
            return self.db[table].get(pk)
        except NotFoundError:
            return None

    def _row(self, table: str, record: Mapping[str, Any], required: Iterable[str]) -> dict[str, Any]:
        """``record`` checked against the table's columns, with values converted to their column types."""
        columns = self._columns[table]
        if missing := [key for key in required if record.get(key) in (None, "")]:
            raise StoreError(f"{table} record lacks {', '.join(missing)}")
        if unknown := sorted(set(record) - set(columns)):
            raise StoreError(
                f"{table} record has unknown field(s) {', '.join(unknown)}; allowed: {', '.join(columns)}"
            )
        row = {}
        for key, value in record.items():
            try:
                row[key] = _convert(columns[key], value)
            except (TypeError, ValueError):
                raise StoreError(f"{table}.{key}: expected {columns[key].__name__}, got {value!r}") from None
        return row

    def _trial_row(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """A trial record validated and ready to insert, or StoreError saying what is wrong."""
        if not isinstance(record, Mapping):
            raise StoreError(f"a trial record must be a mapping, got {type(record).__name__}")
        if missing := [key for key in _TRIAL_REQUIRED if record.get(key) is None]:
            raise StoreError(f"trial record lacks {', '.join(missing)}")
        if record["state"] not in TRIAL_STATES:
            raise StoreError(f"trial state {record['state']!r} is not one of {', '.join(TRIAL_STATES)}")
        error_kind = record.get("error_kind")
        if error_kind is not None and error_kind not in ERROR_KINDS:
            raise StoreError(f"trial error_kind {error_kind!r} is not one of {', '.join(ERROR_KINDS)}")
        if record["state"] == "failed" and error_kind is None:
            raise StoreError("a failed trial needs an error_kind")
        row = self._row(
            "trials",
            {
                **record,
                "params": _dump_params(record["params"]),
                "verified": int(bool(record.get("verified"))),
            },
            _TRIAL_REQUIRED,
        )
        if row["state"] == "ok":
            row["time_s"] = _positive_time(row.get("time_s"), "an ok trial's time_s")
        row.setdefault("created_at", _now())
        return row

    def _insert_trials(self, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert validated trials inside an open write transaction, and their ids; per (matrix, device,
        dtype), the fastest ok and verified one becomes the best if it beats the stored best."""
        for table, key, what in (("matrices", "fingerprint", "matrix"), ("devices", "device", "device")):
            for value in dict.fromkeys(row[key] for row in rows):
                if self._get(table, value) is None:
                    raise StoreError(f"trial for unknown {what} {value!r}: add_{what}() it first")
        ids = [self.db["trials"].insert(row).last_pk for row in rows]
        fastest: dict[tuple[Any, ...], tuple[dict[str, Any], int]] = {}
        for row, trial_id in zip(rows, ids, strict=True):
            key = tuple(row[k] for k in _BEST_PK)
            if row["state"] != "ok" or not row["verified"]:
                continue
            if key not in fastest or row["time_s"] < fastest[key][0]["time_s"]:
                fastest[key] = (row, trial_id)
        for key, (row, trial_id) in fastest.items():
            current = self._get("best", key)
            if current is None or row["time_s"] < current["time_s"]:
                best = {k: row.get(k) for k in _BEST_FROM_TRIAL}
                self.db["best"].upsert({**best, "trial_id": trial_id, "updated_at": _now()}, pk=_BEST_PK)
        return ids

    # -- writes ------------------------------------------------------------------------------------

    def add_matrix(
        self,
        fingerprint: str,
        *,
        name: str,
        rows: int,
        cols: int,
        nnz: int,
        features: Mapping[str, float] | None = None,
        fingerprint_scheme: int | None = None,
    ) -> None:
        """Record a matrix (keeping its first ``created_at``, and its first name unless that was empty)
        and merge in its features, in one transaction. ``fingerprint_scheme``: which scheme named it (None:
        the current one, the column's default; 1 for fingerprints imported from before scheme 2)."""
        record = {"fingerprint": fingerprint, "name": name, "rows": rows, "cols": cols, "nnz": nnz}
        if fingerprint_scheme is not None:
            record["fingerprint_scheme"] = fingerprint_scheme
        row = self._row("matrices", record, ("fingerprint", "rows", "cols", "nnz"))
        if row["name"] is None or min(row["rows"], row["cols"], row["nnz"]) < 0:
            raise StoreError(f"matrix {fingerprint!r}: needs a name (may be empty) and rows, cols, nnz >= 0")
        values = _feature_values(features or {})
        with self._write():
            existing = self._get("matrices", fingerprint)
            if existing is None:
                self.db["matrices"].insert({**row, "created_at": _now()})
            else:
                if existing["name"]:
                    del row["name"]
                self.db["matrices"].update(fingerprint, row)
            if values:
                self.db["features"].upsert(
                    {"fingerprint": fingerprint, **values}, pk="fingerprint", alter=True
                )

    def add_device(self, info: Mapping[str, Any]) -> str:
        """Record a device (upsert by ``id``, keeping its first ``created_at``) and return its id."""
        row = self._row("devices", info, ("id", "name", "kind"))
        if row["kind"] not in DEVICE_KINDS:
            raise StoreError(f"device kind {row['kind']!r} is not one of {', '.join(DEVICE_KINDS)}")
        with self._write():
            if self._get("devices", row["id"]) is None:
                self.db["devices"].insert({**row, "created_at": row.get("created_at") or _now()})
            else:
                row.pop("created_at", None)
                self.db["devices"].update(row["id"], row)
        return row["id"]

    def add_trial(self, record: Mapping[str, Any]) -> int:
        """Record one trial and, if it is ok, verified and faster than the stored best, make it the best.

        The record is validated before anything is written (StoreError says
        what is wrong); the insert and the best update share one transaction.
        Returns the trial's id.
        """
        return self.add_trials([record])[0]

    def add_trials(self, records: Iterable[Mapping[str, Any]]) -> list[int]:
        """Record several trials in one transaction: all of them, or (on any error) none."""
        rows = [self._trial_row(record) for record in records]
        with self._write():
            return self._insert_trials(rows)

    def import_trials(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Record the trials whose ``trial_uid`` the store does not hold yet, in one transaction; how many.

        What ``tuner sync`` writes with: running it again, or two at once, adds nothing twice.
        Every record needs a ``trial_uid``.
        """
        rows = [self._trial_row(record) for record in records]
        if missing := [row for row in rows if not row.get("trial_uid")]:
            raise StoreError(f"{len(missing)} imported trial record(s) lack a trial_uid")
        with self._write():
            new = [row for row in rows
                   if not self.db.execute("select 1 from trials where trial_uid = ?", [row["trial_uid"]]).fetchone()]
            return len(self._insert_trials(new))

    def add_spmspv_trials(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Record SpMSpV measurements (:mod:`tuner.select.spmspv_selector` trains on them) in one transaction."""
        rows = []
        for record in records:
            params = _dump_params(record.get("params", {}))
            required = ("fingerprint", "device", "dtype", "mode", "x_nnz", "x_seed")
            row = self._row("spmspv_trials", {**record, "params": params}, required)
            row["time_s"] = _positive_time(record.get("time_s"), f"SpMSpV {row['mode']} time_s")
            if row["mode"] not in ("sparse", "dense") or row["x_nnz"] < 0:
                raise StoreError(f"SpMSpV trial: mode must be 'sparse' or 'dense' and x_nnz >= 0, got {record!r}")
            rows.append({**row, "created_at": _now()})
        with self._write():
            self.db["spmspv_trials"].insert_all(rows, pk="id")
        return len(rows)

    def spmspv_trials(self, *, device: str, dtype: str) -> list[dict[str, Any]]:
        """The SpMSpV measurements on a device in a dtype, oldest first."""
        rows = self.db["spmspv_trials"].rows_where("device = ? and dtype = ?", [device, dtype], order_by="id")
        return [_decoded(row) for row in rows]

    def trial_uids(self) -> set[str]:
        """The ``trial_uid`` of every trial that has one."""
        return {row[0] for row in self.db.execute("select trial_uid from trials where trial_uid is not null")}

    def set_cusparse_time(self, fingerprint: str, *, device: str, dtype: str, time_s: float) -> bool:
        """Record cuSPARSE's time for the matrix on its best row; False when there is no best row yet."""
        seconds = _positive_time(time_s, "the cuSPARSE time_s")
        with self._write():
            if self._get("best", (fingerprint, device, dtype)) is None:
                return False
            self.db["best"].update((fingerprint, device, dtype), {"cusparse_time_s": seconds})
        return True

    # -- reads -------------------------------------------------------------------------------------

    def best(self, fingerprint: str, *, device: str, dtype: str) -> dict[str, Any] | None:
        """The best config for a matrix on a device in a dtype, or None when none was verified (one query: every
        ``plan()`` asks, where a lookup by primary key asks three)."""
        row = next(self.db["best"].rows_where("fingerprint = ? and device = ? and dtype = ?",
                                              [fingerprint, device, dtype], limit=1), None)
        return None if row is None else _decoded(row)

    def bests(self, fingerprint: str) -> list[dict[str, Any]]:
        """The best configs of a matrix on every device and dtype."""
        rows = self.db["best"].rows_where("fingerprint = ?", [fingerprint], order_by="device, dtype")
        return [_decoded(row) for row in rows]

    def trials(
        self,
        fingerprint: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        kernel: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """A matrix's trials in the order they were recorded, optionally filtered."""
        filters = {"fingerprint": fingerprint, "device": device, "dtype": dtype, "kernel": kernel}
        used = {key: value for key, value in filters.items() if value is not None}
        where = " and ".join(f"{key} = :{key}" for key in used)
        rows = self.db["trials"].rows_where(where, used, order_by="id", limit=limit, offset=offset)
        return [_decoded(row) for row in rows]

    def bests_with_features(self, *, device: str, dtype: str) -> list[dict[str, Any]]:
        """Every matrix's best config on a device in a dtype, each with a ``features`` sub-dict (the features
        recorded for it): where the search looks for matrices like a new one."""
        columns = set(self.db["best"].columns_dict)
        rows = self.db.query(
            "select best.*, features.* from best join features using (fingerprint)"
            " where best.device = ? and best.dtype = ? order by best.fingerprint",
            [device, dtype],
        )
        return [_decoded({**{k: v for k, v in row.items() if k in columns},
                          "features": {k: v for k, v in row.items() if k not in columns and v is not None}})
                for row in rows]

    def best_per_kernel(self, fingerprint: str, *, device: str, dtype: str) -> list[dict[str, Any]]:
        """For each kernel family, its fastest ok and verified trial; fastest family first."""
        rows = self.db.query(
            """
            select * from (
              select *, row_number() over (partition by kernel order by time_s, id) as rank_in_kernel
              from trials
              where fingerprint = ? and device = ? and dtype = ? and state = 'ok' and verified = 1
            ) where rank_in_kernel = 1 order by time_s, id
            """,
            [fingerprint, device, dtype],
        )
        return [_decoded({k: v for k, v in row.items() if k != "rank_in_kernel"}) for row in rows]

    def matrix(self, fingerprint: str) -> dict[str, Any] | None:
        """A matrix with a ``features`` sub-dict (only the features recorded for it), or None."""
        row = self._get("matrices", fingerprint)
        if row is None:
            return None
        features = self._get("features", fingerprint) or {}
        row["features"] = {k: v for k, v in features.items() if k != "fingerprint" and v is not None}
        return row

    def matrices(self, *, limit: int = 100, offset: int = 0) -> list[dict[str, Any]]:
        """One page of matrices, oldest first (so pages stay stable while new ones are added)."""
        return list(
            self.db["matrices"].rows_where(order_by="created_at, fingerprint", limit=limit, offset=offset)
        )

    def shaped_and_newest_model(self, *, rows: int, cols: int, nnz: int, device: str, dtype: str,
                                task: str = "spmv") -> tuple[bool, dict[str, Any] | None]:
        """Whether the store holds a matrix of this shape and count of nonzeros (by any fingerprint scheme: where
        it holds none, nothing stored can be of a matrix of them, and ``plan()`` describes it at once), and the
        newest ``models`` row of ``task`` for exactly (device, dtype), its ``id`` and ``created_at`` (None where
        none is stored): what ``plan()`` asks of the store before it describes a matrix, in one statement (three
        took 0.3-0.4 ms of a plan on the GPU machines' hosts, ``bench/results/2026-11-28_predict-host-54.txt``)."""
        shaped, newest, created_at = self.db.execute(
            "select exists(select 1 from matrices where rows = ? and cols = ? and nnz = ?), newest.id, "
            "newest.created_at from (select 1) left join (select id, created_at from models where task = ? and "
            "device = ? and dtype = ? order by id desc limit 1) as newest",
            [rows, cols, nnz, task, device, dtype]).fetchone()
        return bool(shaped), None if newest is None else {"id": newest, "created_at": created_at}

    def has_legacy_matrix(self, *, rows: int, cols: int, nnz: int) -> bool:
        """Whether a matrix named by fingerprint scheme 1 has this shape and count of nonzeros: only then
        is its old fingerprint worth computing to look it up."""
        return bool(self.db["matrices"].count_where("fingerprint_scheme = 1 and rows = ? and cols = ? and nnz = ?",
                                                    [rows, cols, nnz]))

    def count_matrices(self) -> int:
        """How many matrices the store knows."""
        return self.db["matrices"].count

    def study_names(self) -> set[str]:
        """The studies the store's trials came from (optuna's, and the pseudo-studies of races and surveys)."""
        return {row["study"] for row in self.db.query("select distinct study from trials where study is not null")}

    def find_matrix(self, name_or_prefix: str) -> dict[str, Any] | None:
        """A matrix by exact fingerprint, unique fingerprint prefix (>= 6 chars) or exact name (newest).

        A prefix shared by several matrices, none of them named so, raises
        StoreError listing them rather than picking one.
        """
        if found := self.matrix(name_or_prefix):
            return found
        hits = []
        if len(name_or_prefix) >= _MIN_PREFIX:
            hits = [
                row["fingerprint"]
                for row in self.db["matrices"].rows_where(
                    "substr(fingerprint, 1, ?) = ?",
                    [len(name_or_prefix), name_or_prefix],
                    select="fingerprint",
                    order_by="fingerprint",
                    limit=5,
                )
            ]
        if len(hits) == 1:
            return self.matrix(hits[0])
        named = list(
            self.db["matrices"].rows_where(
                "name = ?", [name_or_prefix], select="fingerprint", order_by="created_at desc", limit=1
            )
        )
        if named:
            return self.matrix(named[0]["fingerprint"])
        if hits:
            raise StoreError(
                f"fingerprint prefix {name_or_prefix!r} matches several matrices "
                f"(such as {', '.join(hits)}): give more characters"
            )
        return None

    def device(self, device_id: str) -> dict[str, Any] | None:
        """A device by id, or None."""
        return self._get("devices", device_id)

    def devices(self) -> list[dict[str, Any]]:
        """Every device, by id."""
        return list(self.db["devices"].rows_where(order_by="id"))
