"""The SQLite store: schema and migrations, the best-config logic, validation, and many writers at once."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlite_utils import Database

from common.errors import StoreError
from db import Store, default_path
from db.store import ERROR_KINDS

REPO = Path(__file__).resolve().parents[1]
FP = "0123456789abcdef0123456789abcdef"
DEV = "NVIDIA H100 80GB HBM3 (sm_90)"

COLUMNS = {
    "matrices": ["fingerprint", "name", "rows", "cols", "nnz", "created_at", "fingerprint_scheme"],
    "features": ["fingerprint"],
    "devices": [
        "id", "name", "kind", "compute_capability", "sms", "memory_bytes", "copy_bandwidth_gbs", "driver",
        "created_at", "l2_bytes",
    ],
    "trials": [
        "id", "fingerprint", "device", "dtype", "kernel", "params", "study", "trial_number", "state",
        "time_s", "time_p10_s", "time_p90_s", "prepare_s", "gflops", "gbps", "verified", "rel_error",
        "error_kind", "error", "created_at", "trial_uid",
    ],
    "best": [
        "fingerprint", "device", "dtype", "kernel", "params", "time_s", "gflops", "gbps", "trial_id",
        "cusparse_time_s", "updated_at",
    ],
    "models": ["id", "device", "dtype", "created_at", "n_train", "features", "metrics", "blob", "task"],
    "spmspv_trials": ["id", "fingerprint", "device", "dtype", "mode", "params", "x_nnz", "x_seed", "time_s",
                      "y_nnz", "created_at"],
}  # fmt: skip


def seed(store: Store, fingerprint: str = FP, device: str = DEV) -> None:
    """The matrix and device that trials refer to."""
    store.add_matrix(fingerprint, name="poisson2d", rows=100, cols=100, nnz=460, features={"row_mean": 4.6})
    store.add_device({"id": device, "name": "H100", "kind": "gpu", "compute_capability": "9.0", "sms": 132})


def trial(**fields: Any) -> dict[str, Any]:
    """An ok, verified trial record; ``fields`` override."""
    record = {
        "fingerprint": FP,
        "device": DEV,
        "dtype": "float64",
        "kernel": "csr_vector",
        "params": {"block": 128, "vec": 4},
        "state": "ok",
        "time_s": 1e-4,
        "gflops": 9.2,
        "verified": True,
        "rel_error": 1e-15,
    }
    return record | fields


def counts(store: Store) -> tuple[int, int]:
    return store.db["trials"].count, store.db["best"].count


@pytest.fixture
def store():
    with Store(memory=True) as store:
        seed(store)
        yield store


# -- schema and migrations -------------------------------------------------------------------------


def test_schema_has_every_table_and_column(tmp_path: Path) -> None:
    with Store(tmp_path / "t.db") as store:
        for table, columns in COLUMNS.items():
            assert list(store.db[table].columns_dict) == columns, table
        db = store.db
        assert db["matrices"].pks == ["fingerprint"]
        assert db["best"].pks == ["fingerprint", "device", "dtype"]
        assert db["trials"].pks == ["id"] and db["models"].pks == ["id"]
        fks = {
            (f.table, f.column, f.other_table, f.other_column) for t in COLUMNS for f in db[t].foreign_keys
        }
        assert {
            ("features", "fingerprint", "matrices", "fingerprint"),
            ("trials", "fingerprint", "matrices", "fingerprint"),
            ("trials", "device", "devices", "id"),
            ("best", "trial_id", "trials", "id"),
        } <= fks
        assert {tuple(index.columns) for index in db["trials"].indexes} >= {
            ("fingerprint", "device", "dtype"),
            ("kernel",),
        }
        assert db["trials"].columns_dict["time_s"] is float and db["models"].columns_dict["blob"] is bytes
        assert db.journal_mode == "wal"
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 60000
        assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store.schema_version() == Store.SCHEMA_VERSION == len(Store.MIGRATIONS) == 4


def test_a_table_lookup_asks_sqlite_only_what_it_needs(tmp_path: Path) -> None:
    """A store holds no views, so ``db[name]`` does not ask for their names (sqlite-utils would, twice)."""
    store = Store(tmp_path / "s.db")
    sent: list[str] = []
    store.db.conn.set_trace_callback(sent.append)
    assert store.best("f" * 32, device="d", dtype="float64") is None
    assert store.db["models"].count_where("task = 'spmv'") == 0
    store.db.conn.set_trace_callback(None)
    assert any('from "best"' in s for s in sent) and not any("type = 'view'" in s for s in sent)
    assert store.db.view_names() == [] and "best" in store.db.table_names()


def test_memory_store_skips_wal() -> None:
    with Store(memory=True) as store:
        assert store.db.journal_mode == "memory"
        assert store.schema_version() == Store.SCHEMA_VERSION


def test_reopening_applies_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with Store(path) as store:
        seed(store)
        store.add_trial(trial())
        applied = list(store.db["_sqlite_migrations"].rows)
    with Store(path) as store:
        assert list(store.db["_sqlite_migrations"].rows) == applied
        assert store.schema_version() == Store.SCHEMA_VERSION
        assert counts(store) == (1, 1)


def _m999_add_note(db: Database) -> None:
    db["matrices"].add_column("note", str)


class StoreV2(Store):
    """A future release: the shipped migrations plus one more."""

    MIGRATIONS = (*Store.MIGRATIONS, _m999_add_note)
    SCHEMA_VERSION = len(MIGRATIONS)


def test_pending_migration_is_applied_on_open_and_old_code_refuses_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with Store(path) as store:
        seed(store)
        assert "note" not in store.db["matrices"].columns_dict
    with StoreV2(path) as store:
        assert store.schema_version() == Store.SCHEMA_VERSION + 1
        assert "note" in store.db["matrices"].columns_dict
        assert store.matrix(FP)["name"] == "poisson2d"  # data survived the migration
        names = [m["name"] for m in store.db["_sqlite_migrations"].rows]
        assert names == [m.__name__ for m in Store.MIGRATIONS] + ["_m999_add_note"]
    with StoreV2(path) as store:  # nothing applied twice
        assert store.db["_sqlite_migrations"].count == Store.SCHEMA_VERSION + 1
    with pytest.raises(StoreError, match="newer") as info:
        Store(path)
    assert str(path) in str(info.value)


def test_first_release_store_gets_trial_uid_and_keeps_its_rows(tmp_path: Path) -> None:
    class StoreV1(Store):
        MIGRATIONS = Store.MIGRATIONS[:1]
        SCHEMA_VERSION = 1

    path = tmp_path / "v1.db"
    with StoreV1(path) as store:
        seed(store)
        store.add_trial(trial())
        assert "trial_uid" not in store.db["trials"].columns_dict
    with Store(path) as store:
        assert store.schema_version() == Store.SCHEMA_VERSION
        assert store.trials(FP)[0]["trial_uid"] is None and counts(store) == (1, 1)
        assert any(index.unique and index.columns == ["trial_uid"] for index in store.db["trials"].indexes)


def test_import_trials_skips_known_uids_and_uids_are_unique(store: Store) -> None:
    records = [trial(trial_uid=f"u{i}", time_s=1e-4 * (i + 1)) for i in range(3)]
    assert store.import_trials(records[:2]) == 2
    assert store.import_trials(records) == 1  # only u2 is new
    assert store.import_trials(records) == 0
    assert store.trial_uids() == {"u0", "u1", "u2"} and counts(store) == (3, 1)
    with pytest.raises(StoreError, match="trial_uid"):
        store.import_trials([trial()])
    with pytest.raises(StoreError, match="UNIQUE"):
        store.add_trial(trial(trial_uid="u0"))
    assert counts(store) == (3, 1)


def test_not_sqlite_file_raises_store_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("this is not a database\n" * 100)
    with pytest.raises(StoreError) as info:
        Store(path)
    assert str(path) in str(info.value)
    assert path.read_text().startswith("this is not a database")  # left untouched


def test_default_path_from_env_and_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPMV_TUNER_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "spmv-tuner" / "tuner.db"
    with Store() as store:
        assert store.path == default_path() and store.path.exists()
    monkeypatch.setenv("SPMV_TUNER_DB", str(tmp_path / "deep" / "dir" / "x.db"))
    with Store() as store:
        assert store.path == tmp_path / "deep" / "dir" / "x.db" and store.path.exists()


# -- matrices and devices --------------------------------------------------------------------------


def test_add_matrix_keeps_first_created_at_and_name_and_merges_features(store: Store) -> None:
    first = store.matrix(FP)
    assert first["features"] == {"row_mean": 4.6}
    store.add_matrix(FP, name="other", rows=100, cols=100, nnz=460, features={"row_max": 9, "row_mean": 4.7})
    again = store.matrix(FP)
    assert again["created_at"] == first["created_at"] and again["name"] == "poisson2d"
    assert again["features"] == {"row_mean": 4.7, "row_max": 9.0}
    assert store.db["features"].columns_dict["row_max"] is float
    store.add_matrix("ffff00001111", name="", rows=1, cols=1, nnz=0)
    assert store.matrix("ffff00001111")["features"] == {}
    store.add_matrix("ffff00001111", name="named later", rows=1, cols=1, nnz=0)
    assert store.matrix("ffff00001111")["name"] == "named later"
    assert store.matrix("nope") is None
    with pytest.raises(StoreError, match="feature"):
        store.add_matrix("abc", name="x", rows=1, cols=1, nnz=1, features={"bad": "text"})
    assert store.matrix("abc") is None


def test_add_device_upserts_and_validates(store: Store) -> None:
    created = store.device(DEV)["created_at"]
    assert store.add_device({"id": DEV, "name": "H100", "kind": "gpu", "driver": "560.35"}) == DEV
    device = store.device(DEV)
    assert device["created_at"] == created and device["driver"] == "560.35" and device["sms"] == 132
    store.add_device({"id": "cpu", "name": "scipy", "kind": "cpu-reference"})
    assert [d["id"] for d in store.devices()] == [DEV, "cpu"]
    assert store.device("missing") is None
    with pytest.raises(StoreError, match="kind"):
        store.add_device({"id": "tpu", "name": "tpu", "kind": "tpu"})
    with pytest.raises(StoreError, match="unknown field"):
        store.add_device({"id": "x", "name": "x", "kind": "gpu", "colour": "green"})
    assert len(store.devices()) == 2


# -- trials and the best config --------------------------------------------------------------------


def test_faster_verified_trial_replaces_best(store: Store) -> None:
    first = store.add_trial(trial(time_s=2e-4))
    assert store.best(FP, device=DEV, dtype="float64")["trial_id"] == first
    faster = store.add_trial(trial(time_s=1e-4, kernel="merge", params={"items": 7}))
    best = store.best(FP, device=DEV, dtype="float64")
    assert best["trial_id"] == faster and best["kernel"] == "merge" and best["params"] == {"items": 7}
    assert best["time_s"] == 1e-4 and faster > first


@pytest.mark.parametrize(
    "loser",
    [
        {"time_s": 3e-4},  # slower
        {"time_s": 1e-4},  # a tie keeps the first
        {"time_s": 1e-6, "verified": False},
        {"time_s": 1e-6, "verified": 0},
        {"time_s": None, "state": "failed", "error_kind": "wrong_answer", "error": "max rel err 0.3"},
        {"time_s": 1e-6, "state": "failed", "error_kind": "timeout"},
    ],
)
def test_slower_failed_or_unverified_trial_never_becomes_best(store: Store, loser: dict[str, Any]) -> None:
    kept = store.add_trial(trial(time_s=1e-4))
    lost = store.add_trial(trial(kernel="ell", **loser))
    assert store.best(FP, device=DEV, dtype="float64")["trial_id"] == kept
    assert store.trials(FP)[-1]["id"] == lost  # recorded all the same


@settings(max_examples=50, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["float32", "float64"]),
            st.sampled_from(["csr", "ell", "merge"]),
            st.floats(1e-6, 1e-2),
            st.booleans(),
            st.booleans(),
        ),
        max_size=30,
    ),
    st.booleans(),
)
def test_best_is_always_the_fastest_ok_verified_trial(runs: list[tuple], batched: bool) -> None:
    records = [
        trial(dtype=dtype, kernel=kernel, time_s=time_s, verified=verified)
        if ok
        else trial(dtype=dtype, kernel=kernel, state="failed", time_s=None, error_kind="timeout")
        for dtype, kernel, time_s, ok, verified in runs
    ]
    with Store(memory=True) as store:
        seed(store)
        ids = store.add_trials(records) if batched else [store.add_trial(r) for r in records]
        for dtype in ("float32", "float64"):
            good = [
                (r["time_s"], i)
                for r, i in zip(records, ids, strict=True)
                if r["dtype"] == dtype and r["state"] == "ok" and r["verified"]
            ]
            best = store.best(FP, device=DEV, dtype=dtype)
            if not good:
                assert best is None
                continue
            time_s, trial_id = min(good)  # the first of equal times wins
            assert (best["time_s"], best["trial_id"]) == (time_s, trial_id)
            per_kernel = store.best_per_kernel(FP, device=DEV, dtype=dtype)
            assert per_kernel[0]["id"] == trial_id
            assert len(per_kernel) == len(
                {r["kernel"] for r in records if r["dtype"] == dtype and r["state"] == "ok" and r["verified"]}
            )


def test_unverified_or_failed_first_trial_makes_no_best(store: Store) -> None:
    store.add_trial(trial(verified=False))
    store.add_trial(trial(state="failed", time_s=None, error_kind="compile_error", error="nvrtc: boom"))
    assert store.best(FP, device=DEV, dtype="float64") is None
    assert [t["error_kind"] for t in store.trials(FP)] == [None, "compile_error"]


def test_params_round_trip_as_dicts_with_sorted_json(store: Store) -> None:
    params = {"z": [1, 2], "a": {"nested": True}, "m": 0.5, "s": "x"}
    trial_id = store.add_trial(trial(params=params))
    assert store.trials(FP)[0]["params"] == params
    assert store.best(FP, device=DEV, dtype="float64")["params"] == params
    raw = store.db["trials"].get(trial_id)["params"]
    assert raw == '{"a": {"nested": true}, "m": 0.5, "s": "x", "z": [1, 2]}'


def test_numpy_scalars_are_stored_as_plain_numbers(store: Store) -> None:
    np = pytest.importorskip("numpy")
    store.add_trial(trial(time_s=np.float32(5e-5), trial_number=np.int64(3), verified=np.bool_(True)))
    row = store.trials(FP)[0]
    assert type(row["time_s"]) is float and row["trial_number"] == 3 and row["verified"] == 1


BAD_RECORDS = {
    "unknown state": trial(state="crashed"),
    "missing kernel": {k: v for k, v in trial().items() if k != "kernel"},
    "missing params": {k: v for k, v in trial().items() if k != "params"},
    "missing state": {k: v for k, v in trial().items() if k != "state"},
    "non-JSON params": trial(params={"f": object()}),
    "NaN in params": trial(params={"f": float("nan")}),
    "params not a mapping": trial(params=[1, 2]),
    "unknown error_kind": trial(state="failed", time_s=None, error_kind="segfault"),
    "failed without error_kind": trial(state="failed", time_s=None),
    "ok without time": trial(time_s=None),
    "negative time": trial(time_s=-1.0),
    "text time": trial(time_s="fast"),
    "unknown field": trial(colour="red"),
    "empty dtype": trial(dtype=""),
}


@pytest.mark.parametrize("bad", BAD_RECORDS.values(), ids=BAD_RECORDS.keys())
def test_bad_record_raises_and_writes_nothing(store: Store, bad: dict[str, Any]) -> None:
    store.add_trial(trial(time_s=3e-4))
    before = counts(store), store.best(FP, device=DEV, dtype="float64")
    with pytest.raises(StoreError):
        store.add_trial(bad)
    with pytest.raises(StoreError):
        store.add_trials([trial(time_s=1e-6), bad])  # the good one before it is not written either
    assert (counts(store), store.best(FP, device=DEV, dtype="float64")) == before


def test_every_error_kind_is_accepted(store: Store) -> None:
    ids = store.add_trials(
        [trial(state="failed", time_s=None, error_kind=kind, error=kind) for kind in ERROR_KINDS]
    )
    assert [t["error_kind"] for t in store.trials(FP)] == list(ERROR_KINDS) and len(set(ids)) == len(ids)


def test_add_trials_is_all_or_nothing(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.add_trial(trial(time_s=3e-4))
    before = counts(store), store.best(FP, device=DEV, dtype="float64")
    with pytest.raises(StoreError, match="unknown matrix"):
        store.add_trials([trial(time_s=1e-6), trial(time_s=2e-6), trial(fingerprint="no-such-matrix")])
    assert (counts(store), store.best(FP, device=DEV, dtype="float64")) == before

    get = Store._get

    def failing_at_best(self: Store, table: str, pk: Any) -> dict[str, Any] | None:
        if table == "best":  # the trials are inserted by now
            raise KeyboardInterrupt  # anything at all, mid-transaction
        return get(self, table, pk)

    monkeypatch.setattr(Store, "_get", failing_at_best)
    with pytest.raises(KeyboardInterrupt):
        store.add_trials([trial(time_s=1e-6), trial(time_s=2e-6), trial(time_s=3e-6)])
    monkeypatch.undo()
    assert (counts(store), store.best(FP, device=DEV, dtype="float64")) == before
    assert not store.db.conn.in_transaction
    assert len(store.add_trials([trial(time_s=1e-6), trial(time_s=2e-6)])) == 2  # the store still works
    assert store.best(FP, device=DEV, dtype="float64")["time_s"] == 1e-6


def test_trial_for_unknown_device_raises(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown device"):
        store.add_trial(trial(device="RTX 9999"))
    assert counts(store) == (0, 0)


def test_cusparse_time_on_best_row(store: Store) -> None:
    assert store.set_cusparse_time(FP, device=DEV, dtype="float64", time_s=2e-4) is False
    store.add_trial(trial(time_s=3e-4))
    assert store.set_cusparse_time(FP, device=DEV, dtype="float64", time_s=2e-4) is True
    store.add_trial(trial(time_s=1e-4))  # a new best keeps the reference time
    best = store.best(FP, device=DEV, dtype="float64")
    assert best["cusparse_time_s"] == 2e-4 and best["time_s"] == 1e-4
    with pytest.raises(StoreError):
        store.set_cusparse_time(FP, device=DEV, dtype="float64", time_s=0)


def test_trials_filters_and_pages(store: Store) -> None:
    store.add_device({"id": "cpu", "name": "scipy", "kind": "cpu-reference"})
    ids = store.add_trials(
        [trial(dtype=dtype, kernel=kernel) for dtype in ("float32", "float64") for kernel in ("a", "b", "c")]
        + [trial(device="cpu")]
    )
    assert [t["id"] for t in store.trials(FP)] == ids
    assert [t["id"] for t in store.trials(FP, dtype="float32")] == ids[:3]
    assert [t["id"] for t in store.trials(FP, device=DEV, kernel="b")] == [ids[1], ids[4]]
    assert [t["id"] for t in store.trials(FP, limit=2, offset=3)] == ids[3:5]
    assert [t["id"] for t in store.trials(FP, offset=5)] == ids[5:]
    assert store.trials("other") == []


def test_bests_and_best_per_kernel(store: Store) -> None:
    store.add_device({"id": "cpu", "name": "scipy", "kind": "cpu-reference"})
    store.add_trials(
        [
            trial(kernel="a", time_s=5e-4, params={"v": 1}),
            trial(kernel="a", time_s=4e-4, params={"v": 2}),
            trial(kernel="a", time_s=1e-6, verified=False),
            trial(kernel="b", time_s=3e-4),
            trial(kernel="b", time_s=9e-4),
            trial(kernel="c", state="failed", time_s=None, error_kind="launch_error"),
            trial(kernel="d", time_s=1e-3, dtype="float32"),
            trial(kernel="e", time_s=1e-2, device="cpu"),
        ]
    )
    per_kernel = store.best_per_kernel(FP, device=DEV, dtype="float64")
    assert [(t["kernel"], t["time_s"]) for t in per_kernel] == [("b", 3e-4), ("a", 4e-4)]
    assert per_kernel[1]["params"] == {"v": 2} and "rank_in_kernel" not in per_kernel[0]
    assert [(b["device"], b["dtype"], b["kernel"]) for b in store.bests(FP)] == [
        (DEV, "float32", "d"),
        (DEV, "float64", "b"),
        ("cpu", "float64", "e"),
    ]
    assert store.bests("other") == [] and store.best_per_kernel("other", device=DEV, dtype="float64") == []


# -- finding and listing matrices ------------------------------------------------------------------


def test_find_matrix(store: Store) -> None:
    store.add_matrix("0123ffffffff", name="twin", rows=1, cols=1, nnz=1)  # shares FP's first 4 chars
    store.add_matrix("abcdef000000", name="poisson2d", rows=9, cols=9, nnz=33)  # a newer one of the same name
    assert store.find_matrix(FP)["fingerprint"] == FP
    assert store.find_matrix(FP[:6])["fingerprint"] == FP
    assert store.find_matrix(FP[:6])["features"] == {"row_mean": 4.6}
    assert store.find_matrix("0123") is None  # too short for a prefix
    assert store.find_matrix("poisson2d")["fingerprint"] == "abcdef000000"  # newest of that name
    assert store.find_matrix("twin")["fingerprint"] == "0123ffffffff"
    assert store.find_matrix("nothing-like-it") is None
    assert store.find_matrix("%%%%%%") is None  # no LIKE wildcards
    store.add_matrix("012345aaaaaa", name="triplet", rows=1, cols=1, nnz=1)
    with pytest.raises(StoreError, match="several"):
        store.find_matrix("012345")
    assert store.find_matrix("0123456")["fingerprint"] == FP


def test_matrices_pagination(store: Store) -> None:
    fingerprints = [FP] + [f"{i:012x}" for i in range(1, 8)]
    for fp in fingerprints[1:]:
        store.add_matrix(fp, name=f"m{fp}", rows=1, cols=1, nnz=1)
    assert store.count_matrices() == 8
    pages = [store.matrices(limit=3, offset=offset) for offset in (0, 3, 6, 9)]
    assert [len(page) for page in pages] == [3, 3, 2, 0]
    assert [m["fingerprint"] for page in pages for m in page] == fingerprints  # oldest first, no repeats
    assert store.matrices() == store.matrices(limit=100)
    assert set(store.matrices()[0]) == set(COLUMNS["matrices"])


# -- many processes, and a killed one --------------------------------------------------------------


def child_trial(child: int, j: int) -> dict:
    """Writer ``child``'s ``j``-th trial: spread-out times, every 7th failed, every 5th unverified (and
    faster than anything verified, which must not make it the best)."""
    time_s = 1e-3 * (1 + (j * 7919 + child * 104729) % 997 / 997)
    failed = j % 7 == 3
    verified = j % 5 != 1
    return {
        "fingerprint": FP,
        "device": DEV,
        "dtype": "float32",
        "kernel": f"k{j % 3}",
        "params": {"child": child, "j": j},
        "study": f"writer-{child}",
        "trial_number": j,
        "state": "failed" if failed else "ok",
        "time_s": None if failed else time_s if verified else time_s / 100,
        "verified": verified,
        "error_kind": "timeout" if failed else None,
    }


WRITER = f"""
import sys
import time
from db import Store
FP, DEV = {FP!r}, {DEV!r}
{textwrap.dedent(inspect.getsource(child_trial))}
path, child, start, stop, pause = sys.argv[1], *map(int, sys.argv[2:5]), float(sys.argv[5])
with Store(path) as store:
    store.add_matrix(FP, name="shared", rows=10, cols=10, nnz=30)
    store.add_device({{"id": DEV, "name": "gpu", "kind": "gpu"}})
    print("ready", flush=True)
    sys.stdin.readline()
    for j in range(start, stop):
        time.sleep(pause)  # the measuring, between writes
        store.add_trial(child_trial(child, j))
        print(j + 1, flush=True)
"""


def writer(path: Path, child: int, start: int, stop: int, pause: float) -> subprocess.Popen[str]:
    """A separate Python process running WRITER; it waits for a line on stdin before writing, and
    prints how many trials it has committed after each one."""
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(child), str(start), str(stop), str(pause)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_three_processes_write_concurrently_without_losing_trials(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"  # created by whichever writer opens it first
    # A pause between writes lets the writers interleave: without one, the writer holding the lock
    # takes it again at once while the others back off, and they would run one after another.
    procs = [writer(path, child, 0, 200, pause=0.001) for child in range(3)]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "locked" not in err and out.split()[-1] == "200"

    records = [child_trial(child, j) for child in range(3) for j in range(200)]
    fastest = min(r["time_s"] for r in records if r["state"] == "ok" and r["verified"])
    with Store(path) as store:
        assert store.db["trials"].count == 600
        studies = [t["study"] for t in store.trials(FP)]
        stored = {(t["study"], t["trial_number"]) for t in store.trials(FP)}
        assert stored == {(f"writer-{child}", j) for child in range(3) for j in range(200)}
        assert sum(map(str.__ne__, studies, studies[1:])) > 3  # they did write at the same time
        best = store.best(FP, device=DEV, dtype="float32")
        assert best["time_s"] == fastest
        winner = store.db["trials"].get(best["trial_id"])
        assert winner["time_s"] == fastest and winner["verified"] == 1 and winner["state"] == "ok"


@pytest.mark.parametrize("kill_after", [1, 40, 150])
def test_killed_writer_leaves_a_sound_store(tmp_path: Path, kill_after: int) -> None:
    path = tmp_path / "crash.db"
    proc = writer(path, 0, 0, 1_000_000, pause=0)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    reported = 0
    while reported < kill_after:
        reported = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)  # while it goes on writing
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    reported = max([reported, *map(int, out.split())])

    with Store(path) as store:
        assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert store.db.execute("PRAGMA foreign_key_check").fetchall() == []
        numbers = [t["trial_number"] for t in store.trials(FP)]
        assert len(numbers) >= reported and numbers == list(range(len(numbers)))  # whole trials, no holes
        verified = [t["time_s"] for t in store.trials(FP) if t["state"] == "ok" and t["verified"]]
        if verified:
            assert store.best(FP, device=DEV, dtype="float32")["time_s"] == min(verified)
        store.add_trial(child_trial(0, len(numbers)))  # and it takes new writes


def test_processes_opening_a_new_file_at_once_all_get_a_wal_store(tmp_path):
    """The switch to WAL answers "locked" without waiting while another process opens the file: retried."""
    code = "import sys; from db.store import Store; Store(sys.argv[1]).close(); print('ok')"
    for i in range(6):
        path = tmp_path / f"new{i}.db"
        procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and out.strip() == "ok", err
        with Store(path) as store:
            assert store.db.journal_mode == "wal"


def test_migration_4_marks_older_matrices_as_fingerprint_scheme_1(tmp_path: Path) -> None:
    class Before(Store):
        MIGRATIONS = Store.MIGRATIONS[:3]

    with Before(tmp_path / "t.db") as old:
        old.add_matrix("a" * 32, name="old", rows=3, cols=4, nnz=5)
    with Store(tmp_path / "t.db") as store:
        store.add_matrix("b" * 32, name="new", rows=3, cols=4, nnz=5)
        store.add_matrix("c" * 32, name="imported", rows=6, cols=6, nnz=6, fingerprint_scheme=1)
        schemes = {m["name"]: m["fingerprint_scheme"] for m in store.db["matrices"].rows}
        assert schemes == {"old": 1, "new": 2, "imported": 1}
        assert store.has_legacy_matrix(rows=3, cols=4, nnz=5) and store.has_legacy_matrix(rows=6, cols=6, nnz=6)
        assert not store.has_legacy_matrix(rows=3, cols=4, nnz=6)

        def shaped(rows: int, cols: int, nnz: int) -> bool:
            return store.shaped_and_newest_model(rows=rows, cols=cols, nnz=nnz, device="x", dtype="float64")[0]

        assert shaped(3, 4, 5) and shaped(6, 6, 6) and not shaped(3, 4, 6) and not shaped(4, 3, 5)
        assert store.device("x") is None and "l2_bytes" in store.db["devices"].columns_dict


def test_the_store_answers_plans_question_of_shape_and_selector_in_one_statement(tmp_path: Path) -> None:
    """shaped_and_newest_model: whether a matrix of the shape is stored, and the newest models row of the task
    for exactly (device, dtype), as latest_row finds it; None where none is."""
    from tuner.select.model import latest_row

    def models(**row: str) -> None:
        store.db["models"].insert({"created_at": "2026-11-28T00:00:00+00:00", "n_train": 1, "features": "[]",
                                   "metrics": "{}", "blob": b"", **row})

    with Store(tmp_path / "t.db") as store:
        store.add_matrix("a" * 32, name="a", rows=3, cols=4, nnz=5)
        ask = {"rows": 3, "cols": 4, "nnz": 5, "device": "GPU A (sm_90)", "dtype": "float64"}
        assert store.shaped_and_newest_model(**ask) == (True, None)
        models(task="spmv", device="GPU A (sm_90)", dtype="float64")
        models(task="spmv", device="GPU A (sm_90)", dtype="float64")
        models(task="spmv", device="GPU A (sm_90)", dtype="float32")
        models(task="spmv", device="GPU B (sm_90)", dtype="float64")
        models(task="spmspv", device="GPU A (sm_90)", dtype="float64")
        for device, dtype in [("GPU A (sm_90)", "float64"), ("GPU A (sm_90)", "float32"), ("GPU B (sm_90)", "float64"),
                              ("GPU C (sm_90)", "float64")]:
            expected = latest_row(store, device=device, dtype=dtype, select="id, created_at")
            for rows in (3, 4):
                got = store.shaped_and_newest_model(**{**ask, "rows": rows, "device": device, "dtype": dtype})
                assert got == (rows == 3, expected)
        assert store.shaped_and_newest_model(**ask)[1]["id"] == 2
        assert store.shaped_and_newest_model(**ask, task="spmspv")[1]["id"] == 5
