"""Where optuna keeps its studies: a URL or a journal file, never a bare SQLite default.

optuna's FAQ warns that SQLite does not promise concurrent writers, so the
default is a JournalStorage on a file beside the store and named after it
(:func:`default_storage`): two ``tuner tune`` processes on one machine append
to it under a file lock, and two stores in one folder keep apart histories.
An append cut short (a full disk) is undone, so the journal stays readable.
``postgresql://…`` (or any RDB URL) serves many machines.

Heartbeats (``heartbeat_interval``) let a worker that died mid-trial be noticed:
its trial stops beating, and after ``grace_period`` seconds whoever calls
``optuna.storages.fail_stale_trials`` next marks it FAIL. optuna's RDBStorage
beats natively (on the database server's clock); optuna 5's JournalStorage does
not, so :class:`HeartbeatJournalStorage` adds the same interface to it, with the
beat kept as a trial system attribute (on the hosts' clocks: hosts sharing a
journal file need clocks in step, well within the grace period, as NTP keeps
them). Both treat a RUNNING trial that has never beaten (its worker died between
``ask()`` and its first beat) as beating from the first time someone looks at it,
so it too is failed a grace period later instead of running forever.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

from common.errors import InvalidConfigError, StoreError
from db.store import Store

StaleTrialCallback = Callable[[optuna.Study, FrozenTrial], None]

_BEAT = "spmv_tuner:heartbeat"
SHARED_JOURNAL = "optuna-journal.log"
"""The journal every store of a folder shared before each store had its own."""
_log = logging.getLogger(__name__)


def default_storage(db_path: str | os.PathLike) -> str:
    """The store's own journal file, beside it and named after it: ``A.db`` → ``A.optuna.log``.

    A store that tuned into the folder's old shared journal (:data:`SHARED_JOURNAL`: its trials
    name studies there) and has no journal of its own yet reads on from the shared one, with a
    warning, so that nothing tuned before is lost; the README says how to give it its own.
    """
    path = Path(db_path)
    own = path.with_name(f"{path.stem}.optuna.log")
    shared = path.with_name(SHARED_JOURNAL)
    if own.exists() or not shared.exists() or not _tuned_into(shared, path):
        return str(own)
    _log.warning("%s reads on from %s, the optuna journal its folder's stores shared; rename or copy it to %s "
                 "to give the store its own (see the README)", path, shared, own.name)
    return str(shared)


def _tuned_into(journal: Path, db_path: Path) -> bool:
    """Whether the store at ``db_path`` holds trials of a study in the journal file ``journal``."""
    if not db_path.is_file():
        return False
    with Store(db_path) as store:
        mine = store.study_names()
    theirs = optuna.get_all_study_names(optuna.storages.JournalStorage(_JournalFile(str(journal))))
    return not mine.isdisjoint(theirs)


def open_storage(
    spec: str,
    *,
    heartbeat_interval: int | None = None,
    grace_period: int | None = None,
    stale_trial_callback: StaleTrialCallback | None = None,
) -> optuna.storages.BaseStorage:
    """An RDB URL (``postgresql://``, ``sqlite:///``), ``journal:PATH`` or a path ending in ``.log``.

    ``heartbeat_interval`` (seconds, off by default) makes every trial asked
    through :func:`tuner.search.loop.tune` beat that often; a RUNNING trial silent for
    ``grace_period`` seconds (default: twice the interval) is failed by the next
    ``fail_stale_trials``, and ``stale_trial_callback(study, trial)`` is called for it.
    """
    if heartbeat_interval is not None and heartbeat_interval <= 0:
        raise InvalidConfigError(f"heartbeat interval must be a positive number of seconds, got {heartbeat_interval}")
    if grace_period is not None and grace_period <= 0:
        raise InvalidConfigError(f"grace period must be a positive number of seconds, got {grace_period}")
    beats = heartbeat_interval is not None
    if "://" in spec:
        spec = _with_driver(spec)
        if not beats:
            return optuna.storages.RDBStorage(spec)
        # optuna < 4.9 names the callback failed_trial_callback; later ones heartbeat_stale_trial_callback
        known = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
        callback = "heartbeat_stale_trial_callback"
        if callback not in known:
            callback = "failed_trial_callback"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return HeartbeatRDBStorage(spec, heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                                       **{callback: stale_trial_callback})
    path = spec.removeprefix("journal:")
    if not (spec.startswith("journal:") or path.endswith(".log")):
        raise InvalidConfigError(
            f"storage {spec!r} is neither a URL (postgresql://…, sqlite:///…) nor a journal file "
            "(journal:PATH or a path ending in .log)"
        )
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        backend = _JournalFile(path)
    except OSError as exc:
        raise StoreError(f"cannot open the optuna journal {path}: {exc}") from exc
    if not beats:
        return optuna.storages.JournalStorage(backend)
    return HeartbeatJournalStorage(backend, heartbeat_interval=heartbeat_interval, grace_period=grace_period,
                                   stale_trial_callback=stale_trial_callback)


def _with_driver(url: str) -> str:
    """A ``postgresql://`` URL with the driver that is installed: psycopg (3), else psycopg2.

    SQLAlchemy's default PostgreSQL driver changed from psycopg2 to psycopg in
    2.1; naming the one at hand makes either work. Other URLs pass unchanged.
    """
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    for module, dialect in (("psycopg", "postgresql+psycopg"), ("psycopg2", "postgresql+psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"{dialect}{sep}{rest}"
    raise InvalidConfigError(
        f"storage {url!r} needs a PostgreSQL driver: pip install 'psycopg[binary]' (or the project's [dev] extra)"
    )


class _JournalFile(optuna.storages.journal.JournalFileBackend):
    """optuna's journal file, where an append that fails (a full disk) is undone.

    optuna appends a batch of log lines in one write; cut short, it would leave a
    partial line that the next append runs into, and from then on no process
    could read the journal. Here the file is cut back to where the batch began,
    under the same lock, and the error names the file.
    """

    def append_logs(self, logs: list[dict[str, object]]) -> None:
        data = memoryview(("\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n").encode())
        self._lock.acquire()
        try:
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND)
            try:
                end = os.lseek(fd, 0, os.SEEK_END)
                try:
                    while data:
                        data = data[os.write(fd, data):]
                    os.fsync(fd)
                except OSError as exc:
                    os.ftruncate(fd, end)
                    raise StoreError(f"cannot write the optuna journal {self._file_path}: {exc}") from exc
            finally:
                os.close(fd)
        finally:
            self._lock.release()


class HeartbeatRDBStorage(optuna.storages.RDBStorage):
    """optuna's RDBStorage with heartbeats, where a trial that never beat is stamped on first sight.

    optuna skips RUNNING trials without any heartbeat row when it looks for
    stale ones, so a worker killed between ``ask()`` and its first beat would
    leave a trial RUNNING for ever. Here the first look gives such a trial a
    beat (the server's ``now()``); if its worker is alive it beats on, else the
    trial is stale a grace period later.
    """

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            super().record_heartbeat(trial_id)
        except optuna.exceptions.StorageInternalError as exc:  # a lost connection: the next beat retries
            _log.warning("heartbeat of trial %s not recorded: %s", trial_id, exc)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        stale = super()._get_stale_trial_ids(study_id)
        for trial_id in self._never_beaten(study_id):
            self.record_heartbeat(trial_id)
        return stale

    def _never_beaten(self, study_id: int) -> list[int]:
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(self.scoped_session) as session:
            rows = (
                session.query(models.TrialModel.trial_id)
                .outerjoin(models.TrialHeartbeatModel,
                           models.TrialHeartbeatModel.trial_id == models.TrialModel.trial_id)
                .filter(models.TrialModel.study_id == study_id)
                .filter(models.TrialModel.state == TrialState.RUNNING)
                .filter(models.TrialHeartbeatModel.trial_heartbeat_id.is_(None))
                .all()
            )
        return [row[0] for row in rows]


class HeartbeatJournalStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """optuna's JournalStorage with the heartbeat interface optuna's RDBStorage has.

    A beat is the trial system attribute ``spmv_tuner:heartbeat`` set to the
    beating host's ``time.time()``; a RUNNING trial whose beat is older than the
    grace period on the checking host's clock is stale.
    """

    def __init__(
        self,
        log_storage: optuna.storages.journal.BaseJournalBackend,
        *,
        heartbeat_interval: int,
        grace_period: int | None = None,
        stale_trial_callback: StaleTrialCallback | None = None,
    ) -> None:
        super().__init__(log_storage)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        self.stale_trial_callback = stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, _BEAT, time.time())
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # told (or failed) meanwhile: nothing left to keep alive
        except OSError as exc:  # the shared file system hiccuped: the next beat retries
            _log.warning("heartbeat of trial %s not recorded: %s", trial_id, exc)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        grace = self.grace_period if self.grace_period is not None else 2 * self.heartbeat_interval
        now = time.time()
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(_BEAT)
            if beat is None:
                self.record_heartbeat(trial._trial_id)
            elif now - float(beat) > grace:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> StaleTrialCallback | None:
        return self.stale_trial_callback

    def get_failed_trial_callback(self) -> StaleTrialCallback | None:  # optuna < 4.9 asks for this name
        return self.stale_trial_callback
