"""Tuning jobs: accepted by POST /tune, run one at a time per device by one worker thread.

A job holds its matrix (already read and validated by the request) until it
runs. The worker thread opens its own :class:`~db.store.Store` (SQLite
connections belong to the thread that opened them) and runs
:func:`tuner.search.loop.tune` on the server's backend; progress is counted in the
``on_trial`` callback. Every state change is mirrored to ``<jobs_dir>/<id>.json``
so that any worker process of the server (``--workers N``) can report any job,
and a lock file per device (``flock``) keeps jobs from several processes off
the device at the same time.
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
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import TunerError

if TYPE_CHECKING:
    from tuner.measure.backend import Backend
    from tuner.search.loop import TuneResult

log = logging.getLogger("service.jobs")

JOB_ID = re.compile(r"[0-9a-f]{32}")
_KEEP_FINISHED = 1000  # finished jobs remembered in memory (the files stay)
_PROGRESS_EVERY_S = 0.5  # at most this often a running job's file is rewritten for progress alone


class QueueFullError(Exception):
    """Too many jobs are waiting."""


class ShuttingDownError(Exception):
    """The server is stopping; the running job ends between two trials."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Job:
    id: str
    fingerprint: str
    name: str
    device: str
    dtype: str
    trials: int
    kernels: list[str] | None
    matrix: Any = field(repr=False)
    state: str = "queued"
    done: int = 0
    created_at: str = field(default_factory=_now)
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    ok: int = 0
    failed: int = 0

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
        }


def summarize_result(result: TuneResult, *, done: int) -> dict[str, Any]:
    """What a finished job reports: each family's best re-timed beside cuSPARSE, and trial counts."""
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
    ok = sum(t.ok for t in result.trials)
    return {
        "best": summary[0] if summary else None,
        "summary": summary,
        "trials_ok": ok,
        "trials_failed": len(result.trials) - ok,
        "trials_cached": done - len(result.trials),
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
        max_queued: int,
    ) -> None:
        self.backend = backend
        self.db_path = db_path
        self.storage = storage
        self.jobs_dir = jobs_dir
        self.max_queued = max_queued
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._waiting: list[str] = []  # ids in queue order
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.counters = {"submitted": 0, "done": 0, "failed": 0, "trials": 0}
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="tuning-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Fail the waiting jobs, end the running one between two trials, and join the thread."""
        self._stop.set()
        with self._lock:
            waiting = [self._jobs[i] for i in self._waiting]
            self._waiting.clear()
        for job in waiting:
            self._finish(job, "failed", error="the server stopped before the job ran")
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- requests -----------------------------------------------------------------------------------

    def submit(self, *, matrix: Any, fingerprint: str, name: str, dtype: str, trials: int,
               kernels: list[str] | None) -> dict[str, Any]:
        """Queue a job for a validated matrix and return its public view; QueueFullError when full."""
        job = Job(secrets.token_hex(16), fingerprint, name, self.backend.info.id, dtype, trials, kernels, matrix)
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
        try:
            return json.loads((self.jobs_dir / f"{job_id}.json").read_text())
        except (OSError, ValueError):
            return None

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

    # -- the worker thread --------------------------------------------------------------------------

    def _work(self) -> None:
        from db.store import Store
        from tuner.search.storage import open_storage

        store = storage = None
        try:
            while (job := self._queue.get()) is not None:
                with self._lock:
                    if job.id not in self._waiting:
                        continue  # failed by stop()
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

        from tuner.search.loop import tune

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        with self._device_lock():
            with self._lock:
                if job.id not in self._waiting:
                    return
                self._waiting.remove(job.id)
                job.state, job.started_at = "running", _now()
            self._save(job)
            last_save = time.monotonic()

            def on_trial(outcome: Any) -> None:
                nonlocal last_save
                if self._stop.is_set():
                    raise ShuttingDownError("the server stopped while the job ran (the trials so far are stored)")
                with self._lock:
                    job.done += 1
                    if outcome is not None:
                        self.counters["trials"] += 1
                if time.monotonic() - last_save > _PROGRESS_EVERY_S:
                    last_save = time.monotonic()
                    self._save(job)

            try:
                result = tune(job.matrix, backend=self.backend, store=store, storage=storage, name=job.name,
                              dtype=job.dtype, trials=job.trials, kernels=job.kernels, on_trial=on_trial)
            except (TunerError, ShuttingDownError) as exc:
                self._finish(job, "failed", error=str(exc))
            except Exception as exc:  # a bug: keep the worker alive, say so in the job
                log.exception("tuning job %s failed", job.id)
                self._finish(job, "failed", error=f"internal error: {type(exc).__name__}: {exc}")
            else:
                self._finish(job, "done", result=summarize_result(result, done=job.done))

    def _finish(self, job: Job, state: str, *, result: dict[str, Any] | None = None,
                error: str | None = None) -> None:
        with self._lock:
            job.state, job.finished_at, job.result, job.error = state, _now(), result, error
            job.matrix = None  # the matrix is no longer needed: free it
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

    def _save(self, job: Job) -> None:
        """Write the job's public view atomically (a reader never sees half a file)."""
        with self._lock:
            text = json.dumps(job.public())
        target = self.jobs_dir / f"{job.id}.json"
        temporary = target.with_suffix(f".{threading.get_ident()}.tmp")
        try:
            temporary.write_text(text)
            os.replace(temporary, target)
        except OSError:
            log.warning("cannot write %s", target, exc_info=True)
