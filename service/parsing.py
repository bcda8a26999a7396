"""Uploads parsed in child processes: a few at once per worker, each under a time bound, its memory returned.

Each parse runs :func:`service.uploads.read_upload` in a process of its own,
forked from a forkserver that has already imported NumPy, SciPy and
fast_matrix_market (so a parse starts in milliseconds, not the second those
imports take). The child sends back the fingerprint and the features, and
exits: whatever the parse allocated goes back to the system with it, and the
worker process serving requests never holds more than the answer. The worker
waits at most ``parse_timeout_s`` and kills the child past it (413); the child
also caps its own CPU time (``RLIMIT_CPU``), so one left behind by a worker
killed meanwhile stops too. fast_matrix_market parses on one thread there: at
most ``slots`` parses at once, ``slots`` CPUs. Requests past those wait, at
most ``queue`` of them; past that they get 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.forkserver
import resource
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
from fastapi import HTTPException, status

from service.settings import Settings
from service.uploads import MatrixTooLargeError, ParsedMatrix, Upload, read_upload, refusal
from tuner.errors import MatrixFormatError
from tuner.io import ReadLimitError, ReadLimits

log = logging.getLogger("service.parsing")

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload([__name__])
_ERRORS: dict[str, Callable[[str], MatrixFormatError]] = {
    "too large": MatrixTooLargeError, "format": MatrixFormatError,
}


@dataclass(frozen=True)
class ParseTask:
    """What a child needs to read one upload (see :func:`service.uploads.read_upload`)."""

    path: Path
    display_name: str
    dtype: str
    limits: ReadLimits
    max_size: int
    keep_dir: Path | None = None

    @property
    def scratch(self) -> Path:
        """Where the child decompresses a gzip upload (removed by the parent, even when the child is killed)."""
        return self.path.with_name(self.path.name + ".mtx")

    @classmethod
    def of(cls, upload: Upload, settings: Settings, *, dtype: str, keep_dir: Path | None = None) -> ParseTask:
        """The task of reading ``upload`` under ``settings``' bounds."""
        return cls(upload.path, upload.filename, dtype, settings.read_limits, settings.max_matrix_size, keep_dir)


def _child(conn: Connection, task: ParseTask, cpu_s: int) -> None:
    """A parse's process: read the upload, send ``("ok", ParsedMatrix)`` or an error's kind and message."""
    import fast_matrix_market

    fast_matrix_market.PARALLELISM = 1
    used = resource.getrusage(resource.RUSAGE_SELF)
    cap = math.ceil(used.ru_utime + used.ru_stime) + cpu_s
    resource.setrlimit(resource.RLIMIT_CPU, (cap, cap + 1))
    try:
        answer: tuple[Any, ...] = ("ok", read_upload(
            task.path, display_name=task.display_name, dtype=task.dtype, limits=task.limits,
            max_size=task.max_size, scratch=task.scratch, keep_dir=task.keep_dir,
        ))
    except ReadLimitError as exc:
        answer = ("bound", str(exc), exc.bound, exc.limit)
    except MatrixTooLargeError as exc:
        answer = ("too large", str(exc))
    except MatrixFormatError as exc:
        answer = ("format", str(exc))
    except Exception:
        answer = ("bug", traceback.format_exc())
    conn.send(answer)
    conn.close()


class Parser:
    """Parses uploads in child processes, ``slots`` at once in this process, ``queue`` more waiting."""

    def __init__(self, *, slots: int, queue: int, timeout_s: float) -> None:
        self.slots, self.queue, self.timeout_s = slots, queue, timeout_s
        self._free = anyio.Semaphore(slots)
        self.waiting = 0
        self.running = 0
        self._mean_s = 0.1  # moving average of a parse's time, for Retry-After

    @staticmethod
    def warm_up() -> None:
        """Start the forkserver now (it imports NumPy, SciPy and the reader: a second), not at the first upload."""
        multiprocessing.forkserver.ensure_running()

    async def parse(self, task: ParseTask) -> ParsedMatrix:
        """``task`` parsed in a child: 503 when the queue is full, 413 past the time bound, else
        :func:`~service.uploads.refusal`'s answer for a file that cannot be read."""
        if self._free.value == 0 and self.waiting >= self.queue:
            retry = max(1, math.ceil(self._mean_s * (self.waiting + 1) / self.slots))
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                f"{self.running} uploads are being parsed and {self.waiting} are waiting (max_waiting_parses): "
                f"try again in {retry} s",
                headers={"Retry-After": str(retry)},
            )
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        start = time.monotonic()
        try:
            answer = await anyio.to_thread.run_sync(self._run, task)
        finally:
            self.running -= 1
            self._free.release()
            self._mean_s += 0.2 * (time.monotonic() - start - self._mean_s)
        kind, *rest = answer
        if kind == "ok":
            return rest[0]
        if kind == "bound":
            message, bound, limit = rest
            raise refusal(ReadLimitError(message, bound=bound, limit=limit))
        if kind == "timeout":
            raise HTTPException(
                status.HTTP_413_CONTENT_TOO_LARGE,
                f"{task.display_name}: parsing took longer than {self.timeout_s:g} s (parse_timeout_s)",
            )
        if kind in _ERRORS:
            raise refusal(_ERRORS[kind](rest[0]))
        log.error("parsing %s failed: %s", task.display_name, rest[0])
        raise RuntimeError(f"the parse of {task.display_name} failed ({kind})")

    def _run(self, task: ParseTask) -> tuple[Any, ...]:
        """Run one child to its answer, or kill it at the deadline (in a worker thread)."""
        receive, send = _context.Pipe(duplex=False)
        child = _context.Process(target=_child, args=(send, task, math.ceil(self.timeout_s)), daemon=True,
                                 name="spmv-tuner-parse")
        child.start()
        send.close()
        try:
            if not receive.poll(self.timeout_s):
                child.kill()
                return ("timeout",)
            try:
                return receive.recv()
            except EOFError:  # it died without an answer: killed by its CPU cap, or crashed
                child.join()
                if child.exitcode == -signal.SIGXCPU:
                    return ("timeout",)
                return ("died", f"exit code {child.exitcode}")
        finally:
            receive.close()
            child.join(1.0)
            if child.exitcode is None:
                child.kill()
                child.join()
            task.scratch.unlink(missing_ok=True)
