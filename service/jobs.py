"""Tuning jobs: accepted by POST /tune, run one at a time per device by one worker thread, kept across restarts.

A job names its matrix by fingerprint: the request kept the matrix in the
matrices folder (``<fingerprint>.npz``), and the worker thread reads it when
the job runs, so a waiting job holds no memory. The worker thread opens its own
:class:`~db.store.Store` (SQLite connections belong to the thread that opened
them) and runs :func:`tuner.search.loop.tune` on the server's backend; progress is
counted in the ``on_trial`` callback. Every state change, and every trial, is
mirrored to ``<jobs_dir>/<id>.json`` so that any worker process of the server
(``--workers N``) can report any job, and a lock file per device (``flock``)
keeps jobs from several processes off the device at the same time.

Restarts: each queue holds a lock file of its own (``owners/<token>.lock``,
``flock``) while it lives, and its jobs' files name it. A queue that starts
takes over the queued and running jobs whose owner no longer holds its lock:
its process stopped, or died (``kill -9`` included: the kernel drops the lock
with the process). Such a job is queued again and resumes for the trials it
had left (optuna's study keeps its finished trials, the store every trial; the
trials the dead process left RUNNING are failed), or it fails with the reason:
its matrix is gone, it was for another device, or its process died more than
``max_restarts`` times while it ran. A server stopped gracefully leaves its
jobs queued, the running one ended between two trials, for the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from common.errors import TunerError

if TYPE_CHECKING:
    from tuner.measure.backend import Backend
    from tuner.search.loop import TuneResult

log = logging.getLogger("service.jobs")

JOB_ID = re.compile(r"[0-9a-f]{32}")
_KEEP_FINISHED = 1000  # finished jobs remembered in memory (the files stay)


class QueueFullError(Exception):
    """Too many jobs are waiting."""


class ShuttingDownError(Exception):
    """The server is stopping; the running job ends between two trials."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


_INTERNAL = "internal"  # the key of a job file's fields that are not part of the public view


@dataclass
class Job:
    id: str
    fingerprint: str
    name: str
    device: str
    dtype: str
    trials: int
    kernels: list[str] | None
    state: str = "queued"
    done: int = 0
    created_at: str = field(default_factory=_now)
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    restarts: int = 0  # times taken over after its server process stopped or died
    ok: int = 0  # trials measured, and failed, over every run of the job
    failed: int = 0
    crashes: int = 0  # times its server process died while it ran
    orphans: bool = False  # its last run died mid-trial: fail the study's RUNNING trials before it resumes

    def public(self, queue_position: int | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "fingerprint": self.fingerprint,
            "name": self.name,
            "device": self.device,
            "dtype": self.dtype,
            "trials": self.trials,
            "kernels": self.kernels,
            "progress": {"done": self.done, "total": self.trials},
            "queue_position": queue_position,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "result": self.result,
            "error": self.error,
            "restarts": self.restarts,
        }

    def record(self, owner: str) -> dict[str, Any]:
        """What the job's file holds: the public view, and what a queue taking the job over needs."""
        return {**self.public(), _INTERNAL: {"owner": owner, "ok": self.ok, "failed": self.failed,
                                             "crashes": self.crashes}}

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Job:
        internal = data.get(_INTERNAL) or {}
        return cls(
            data["id"], data["fingerprint"], data["name"], data["device"], data["dtype"], data["trials"],
            data["kernels"], state=data["state"], done=data["progress"]["done"], created_at=data["created_at"],
            started_at=data["started_at"], finished_at=data["finished_at"], result=data["result"],
            error=data["error"], restarts=data.get("restarts", 0), ok=internal.get("ok", 0),
            failed=internal.get("failed", 0), crashes=internal.get("crashes", 0),
        )


def summarize_result(result: TuneResult, job: Job) -> dict[str, Any]:
    """What a finished job reports: each family's best re-timed beside cuSPARSE, and trial counts over its runs."""
    summary = [
        {
            "kernel": s.kernel,
            "params": s.params,
            "time_s": s.timing.median_s,
            "gflops": s.gflops,
            "gbps": s.gbps,
            "ratio_to_cusparse": s.ratio_to_cusparse,
        }
        for s in result.summary
    ]
    return {
        "best": summary[0] if summary else None,
        "summary": summary,
        "trials_ok": job.ok,
        "trials_failed": job.failed,
        "trials_cached": job.done - job.ok - job.failed,
        "study": result.study,
    }


class JobQueue:
    """A FIFO of tuning jobs and the one thread that runs them on ``backend``."""

    def __init__(
        self,
        *,
        backend: Backend,
        db_path: Path,
        storage: str,
        jobs_dir: Path,
        matrices_dir: Path,
        max_queued: int,
        max_restarts: int = 2,
    ) -> None:
        self.backend = backend
        self.db_path = db_path
        self.storage = storage
        self.jobs_dir = jobs_dir
        self.matrices_dir = matrices_dir
        self.max_queued = max_queued
        self.max_restarts = max_restarts
        self.owner = secrets.token_hex(8)
        self._owner_lock: IO[bytes] | None = None
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._waiting: list[str] = []  # ids in queue order
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters = {"submitted": 0, "done": 0, "failed": 0, "trials": 0, "taken_over": 0}
        (self.jobs_dir / "owners").mkdir(parents=True, exist_ok=True)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Hold this queue's owner lock, take over the jobs of queues that are gone, start the thread."""
        self._owner_lock = open(self._owner_path(self.owner), "wb")  # held, open, for the queue's life
        fcntl.flock(self._owner_lock, fcntl.LOCK_EX)
        self._take_over()
        self._thread = threading.Thread(target=self._work, name="tuning-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """End the running job between two trials and leave it queued with the waiting ones, for the next
        queue on this jobs folder to take over; then drop the owner lock."""
        self._stop.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._owner_lock is not None:
            self._owner_path(self.owner).unlink(missing_ok=True)
            self._owner_lock.close()  # drops the flock
            self._owner_lock = None

    # -- requests -----------------------------------------------------------------------------------

    @property
    def full(self) -> bool:
        with self._lock:
            return len(self._waiting) >= self.max_queued

    def matrix_path(self, fingerprint: str) -> Path:
        """Where the matrix of ``fingerprint`` is kept (``service.uploads.keep_matrix`` writes it)."""
        return self.matrices_dir / f"{fingerprint}.npz"

    def race(self, fingerprint: str, *, dtype: str, race_size: int = 4) -> tuple[Any, Any]:
        """``(choice, race)`` for a kept matrix on the server's device (``POST /recommend?race=true``): the
        store's measured best when there is one (race None), else a race of the selector's shortlist and
        cuSPARSE (:func:`tuner.execute.plan.race_matrix`), under the device lock that keeps tuning jobs off
        the device meanwhile. OSError or ValueError when the kept matrix cannot be read."""
        import scipy.sparse as sp

        from db.store import Store
        from tuner.execute.choice import stored_choice
        from tuner.execute.plan import race_matrix
        from tuner.matrix.io import as_csr

        with self._device_lock(), Store(self.db_path) as store:
            stored = stored_choice(store, fingerprint, device=self.backend.info.id, dtype=dtype)
            if stored is not None:
                return stored, None
            A = self.backend.matrix(as_csr(sp.load_npz(self.matrix_path(fingerprint)), dtype=dtype))
            return race_matrix(A, backend=self.backend, store=store, fp=fingerprint, race_size=race_size)

    def submit(self, *, fingerprint: str, name: str, dtype: str, trials: int,
               kernels: list[str] | None) -> dict[str, Any]:
        """Queue a job for a kept matrix and return its public view; QueueFullError when full."""
        job = Job(secrets.token_hex(16), fingerprint, name, self.backend.info.id, dtype, trials, kernels)
        with self._lock:
            if self._stop.is_set():
                raise ShuttingDownError("the server is stopping")
            if len(self._waiting) >= self.max_queued:
                raise QueueFullError(f"{len(self._waiting)} jobs are already waiting; try again later")
            self._jobs[job.id] = job
            self._waiting.append(job.id)
            position = len(self._waiting) - 1
            self.counters["submitted"] += 1
            self._forget_old()
        self._save(job)
        self._queue.put(job)
        return job.public(position)

    def get(self, job_id: str) -> dict[str, Any] | None:
        """A job's public view: from memory, else from the file another worker process wrote."""
        if not JOB_ID.fullmatch(job_id):
            return None
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return job.public(self._position(job_id))
        data = self._read(self.jobs_dir / f"{job_id}.json")
        if data is not None:
            data.pop(_INTERNAL, None)
        return data

    def recent(self, *, skip: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """This process's jobs, newest first."""
        with self._lock:
            jobs = list(reversed(self._jobs.values()))
            return [j.public(self._position(j.id)) for j in jobs[skip : skip + limit]], len(jobs)

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {"queued": 0, "running": 0, "done": 0, "failed": 0}
            for job in self._jobs.values():
                out[job.state] += 1
            return out

    def _position(self, job_id: str) -> int | None:
        try:
            return self._waiting.index(job_id)
        except ValueError:
            return None

    def _forget_old(self) -> None:
        finished = [i for i, j in self._jobs.items() if j.state in ("done", "failed")]
        for job_id in finished[: max(0, len(finished) - _KEEP_FINISHED)]:
            del self._jobs[job_id]

    # -- taking over the jobs of queues that are gone -----------------------------------------------

    def _owner_path(self, owner: str) -> Path:
        return self.jobs_dir / "owners" / f"{owner}.lock"

    def _owner_gone(self, owner: str | None) -> bool:
        """Whether ``owner``'s lock is free (its process is gone); its lock file is removed then."""
        if not owner:
            return True  # a file written before jobs named their owner
        path = self._owner_path(owner)
        try:
            with open(path, "rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                path.unlink(missing_ok=True)
        except FileNotFoundError:
            return True
        except BlockingIOError:
            return False
        return True

    def _take_over(self) -> None:
        """Queue again, or fail with the reason, every queued or running job whose owner is gone."""
        with open(self.jobs_dir / "take-over.lock", "a+b") as serial:  # one queue at a time takes over
            fcntl.flock(serial, fcntl.LOCK_EX)
            records = [r for p in self.jobs_dir.glob("*.json") if (r := self._read(p)) is not None]
            gone: dict[str | None, bool] = {}
            for data in sorted(records, key=lambda r: r.get("created_at", "")):
                if data.get("state") not in ("queued", "running"):
                    continue
                owner = (data.get(_INTERNAL) or {}).get("owner")
                if owner == self.owner:
                    continue
                if owner not in gone:
                    gone[owner] = self._owner_gone(owner)
                if gone[owner]:
                    self._adopt(data)
            for path in (self.jobs_dir / "owners").glob("*.lock"):  # queues that died with no job left
                if path.stem != self.owner and path.stem not in gone:
                    self._owner_gone(path.stem)

    def _adopt(self, data: dict[str, Any]) -> None:
        try:
            job = Job.from_record(data)
        except (KeyError, TypeError):
            log.warning("job file %s.json cannot be read back: left as it is", data.get("id"))
            return
        crashed = job.state == "running"
        job.crashes += crashed
        job.restarts += 1
        job.orphans = crashed
        with self._lock:
            self._jobs[job.id] = job
            self.counters["taken_over"] += 1
        reason = None
        if job.device != self.backend.info.id:
            reason = f"it was for device {job.device!r}, and this server runs on {self.backend.info.id!r}"
        elif not self.matrix_path(job.fingerprint).exists():
            reason = "the server no longer keeps its matrix"
        elif job.crashes > self.max_restarts:
            reason = f"its server process died {job.crashes} times while it ran (max_job_restarts)"
        if reason is not None:
            self._finish(job, "failed", error=f"the server stopped before the job finished; not resumed: {reason} "
                                              "(the trials it ran are stored)")
            return
        job.state = "queued"
        with self._lock:
            self._waiting.append(job.id)
        self._save(job)
        self._queue.put(job)
        log.warning("job %s taken over from a server process that %s", job.id, "died" if crashed else "stopped")

    # -- the worker thread --------------------------------------------------------------------------

    def _work(self) -> None:
        from db.store import Store
        from tuner.search.storage import open_storage

        store = storage = None
        try:
            while (job := self._queue.get()) is not None and not self._stop.is_set():
                with self._lock:
                    if job.id not in self._waiting:
                        continue
                if store is None:
                    try:
                        store = Store(self.db_path)
                        storage = open_storage(self.storage)
                    except TunerError as exc:
                        self._finish(job, "failed", error=str(exc))
                        store = None
                        continue
                self._run(job, store, storage)
        finally:
            if store is not None:
                store.close()

    def _run(self, job: Job, store: Any, storage: Any) -> None:
        import optuna
        import scipy.sparse as sp

        from tuner.matrix.io import as_csr
        from tuner.search.loop import tune

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with self._device_lock():
            with self._lock:
                if job.id not in self._waiting:
                    return
                self._waiting.remove(job.id)
                job.state, job.started_at = "running", job.started_at or _now()
            self._save(job)

            def on_trial(outcome: Any) -> None:
                if self._stop.is_set():
                    raise ShuttingDownError("the server is stopping")
                with self._lock:
                    job.done += 1
                    if outcome is not None:
                        self.counters["trials"] += 1
                        job.ok += outcome.ok
                        job.failed += not outcome.ok
                self._save(job)

            path = self.matrix_path(job.fingerprint)
            try:
                A = as_csr(sp.load_npz(path), dtype=job.dtype)
            except (OSError, ValueError) as exc:
                self._finish(job, "failed", error=f"its matrix cannot be read: {exc}")
                return
            try:
                if job.orphans:
                    self._fail_orphans(job, storage)
                result = tune(A, backend=self.backend, store=store, storage=storage, name=job.name,
                              dtype=job.dtype, trials=max(0, job.trials - job.done), kernels=job.kernels,
                              on_trial=on_trial)
            except ShuttingDownError:
                with self._lock:
                    job.state = "queued"
                    self._waiting.insert(0, job.id)
                self._save(job)
            except TunerError as exc:
                self._finish(job, "failed", error=str(exc))
            except Exception as exc:  # a bug: keep the worker alive, say so in the job
                log.exception("tuning job %s failed", job.id)
                self._finish(job, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
            else:
                self._finish(job, "done", result=summarize_result(result, job))

    def _fail_orphans(self, job: Job, storage: Any) -> None:
        """Fail the trials of the job's study that its dead process left RUNNING (their measurement never ended).

        Runs under the device lock: no other job of this jobs folder is tuning on the device, and the study
        is the device's, so a RUNNING trial there was the dead process's.
        """
        import optuna
        from optuna.trial import TrialState

        from tuner.search.study import study_name

        try:
            study = optuna.load_study(study_name=study_name(job.fingerprint, self.backend.info, job.dtype),
                                      storage=storage)
        except KeyError:
            return  # it died before the study was made
        for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                study.tell(trial.number, state=TrialState.FAIL)
        job.orphans = False

    def _finish(self, job: Job, state: str, *, result: dict[str, Any] | None = None,
                error: str | None = None) -> None:
        with self._lock:
            job.state, job.finished_at, job.result, job.error = state, _now(), result, error
            with contextlib.suppress(ValueError):
                self._waiting.remove(job.id)
            self.counters[state] += 1
        self._save(job)

    @contextlib.contextmanager
    def _device_lock(self) -> Iterator[None]:
        """An exclusive lock on the device shared by every server process using this jobs folder."""
        slug = hashlib.blake2b(self.backend.info.id.encode(), digest_size=8).hexdigest()
        with open(self.jobs_dir / f"device-{slug}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def _save(self, job: Job) -> None:
        """Write the job's file atomically (a reader never sees half a file)."""
        with self._lock:
            text = json.dumps(job.record(self.owner))
        target = self.jobs_dir / f"{job.id}.json"
        temporary = target.with_suffix(f".{threading.get_ident()}.tmp")
        try:
            temporary.write_text(text)
            os.replace(temporary, target)
        except OSError:
            log.warning("cannot write %s", target, exc_info=True)
