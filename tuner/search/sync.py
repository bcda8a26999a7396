"""``tuner sync``: the finished trials of a shared optuna storage copied into the local SQLite store.

Every finished trial's record is in its user attrs (the loop keeps it there,
:data:`tuner.search.study.RECORD_ATTR`), so the store's rows come from optuna
alone: once each, keyed by the trial's uid, for training and the service.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.console import Console
from rich.markup import escape

from common.errors import TunerError
from db.store import TRIAL_FIELDS
from tuner.search.study import CACHED_ATTR, FINISHED, RECORD_ATTR, UID_ATTR

console = Console()
err_console = Console(stderr=True)


@dataclass
class SyncReport:
    studies: int = 0
    added: int = 0
    present: int = 0
    lost: int = 0  # finished as FAIL because their worker died: stored as error_kind worker_lost
    cached: int = 0  # told an earlier trial's value: no measurement of their own, not copied
    unrecorded: int = 0  # finished without a record or a config (not asked by this tuner): not copied
    skipped_studies: list[str] = field(default_factory=list)


def sync_storage(storage: optuna.storages.BaseStorage, store: Any) -> SyncReport:
    """Copy every finished trial of the storage's tuner studies into ``store``, each once (by ``trial_uid``)."""
    report = SyncReport()
    for study in sorted(storage.get_all_studies(), key=lambda s: s.study_name):
        attrs = study.user_attrs
        fp, device = attrs.get("fingerprint"), attrs.get("device")
        if not (fp and device and attrs.get("dtype")):
            continue  # not a tuner study
        if "matrix" in attrs:
            m = attrs["matrix"]
            store.add_matrix(fp, name=m["name"], rows=m["rows"], cols=m["cols"], nnz=m["nnz"],
                             features=m.get("features") or {},
                             fingerprint_scheme=m.get("fingerprint_scheme", 1))  # studies of old tuners: 1
        if "device_record" in attrs and store.device(device) is None:
            store.add_device(attrs["device_record"])
        if store.matrix(fp) is None or store.device(device) is None:
            report.skipped_studies.append(study.study_name)  # made by an older tuner that kept no such record
            continue
        report.studies += 1
        rows = []
        trials = storage.get_all_trials(study._study_id, deepcopy=False, states=FINISHED)
        for t in sorted(trials, key=lambda t: t.number):
            if RECORD_ATTR in t.user_attrs:
                row = {k: t.user_attrs[RECORD_ATTR].get(k) for k in TRIAL_FIELDS}
                rows.append({**row, "trial_uid": row["trial_uid"] or _uid(study.study_name, t)})
            elif t.user_attrs.get(CACHED_ATTR):
                report.cached += 1
            elif t.state == optuna.trial.TrialState.FAIL and t.params.get("kernel"):
                rows.append(_lost_row(study.study_name, attrs, t))
                report.lost += 1
            else:
                report.unrecorded += 1
        added = store.import_trials(rows)
        report.added += added
        report.present += len(rows) - added
    return report


def _uid(study: str, t: optuna.trial.FrozenTrial) -> str:
    """The uid tune() gave the trial; for one it never got to (its worker died at once), one made from it."""
    made = hashlib.blake2b(f"{study}|{t.number}|{t.datetime_start}".encode(), digest_size=16).hexdigest()
    return t.user_attrs.get(UID_ATTR) or f"derived-{made}"


def _lost_row(study: str, attrs: dict[str, Any], t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    kernel = t.params["kernel"]
    return {
        "fingerprint": attrs["fingerprint"], "device": attrs["device"], "dtype": attrs["dtype"], "study": study,
        "trial_number": t.number, "trial_uid": _uid(study, t), "kernel": kernel, "state": "failed", "verified": 0,
        "params": {k.removeprefix(f"{kernel}."): v for k, v in t.params.items() if k.startswith(f"{kernel}.")},
        "error_kind": "worker_lost",
        "error": "its worker stopped beating mid-trial (killed, or its node died) and the trial was marked "
                 "failed; this says nothing about the config",
        "created_at": (t.datetime_complete or t.datetime_start).isoformat() if t.datetime_start else None,
    }


def sync(
    storage: Annotated[str, typer.Option(help="the shared optuna storage: URL, journal:PATH or PATH.log")],
    db: Annotated[Path | None, typer.Option("--db", help="SQLite store (default: $SPMV_TUNER_DB or per-user)")]
    = None,
) -> None:
    """Copy the finished trials of the shared optuna storage into the local store (again: adds only new ones)."""
    from db.store import Store
    from tuner.search.storage import open_storage

    try:
        store = Store(db)
        report = sync_storage(open_storage(storage), store)
    except TunerError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None
    console.print(f"synced {report.studies} studies into {store.path}: {report.added} trials added, "
                  f"{report.present} already there ({report.lost} lost with their worker); "
                  f"{report.cached} cached repeats and {report.unrecorded} unrecorded trials not copied")
    if report.skipped_studies:
        console.print(f"[yellow]{len(report.skipped_studies)} studies skipped: their matrix or device is neither "
                      "in the store nor recorded in the study (tuned by an older spmv-tuner)[/]")
