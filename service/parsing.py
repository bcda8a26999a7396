"""Uploads parsed in child processes: a few at once per worker, each under a time bound, its memory returned.

A parse runs :func:`service.uploads.read_upload` in a parse process: one of at
most ``slots`` per worker process, forked from a forkserver that has already
imported NumPy, SciPy and fast_matrix_market (so one starts in milliseconds,
not the second those imports take). A parse process answers one upload at a
time with its fingerprint and features (and keeps the matrix for a tuning
job); after an answer, if the parse took it more than ``recycle_mb`` MiB beyond
what it held when it started, it exits, and its memory goes back to the
system with it (a fresh one is forked for the next upload). The worker
serving requests never holds more than the answer. It waits at most
``timeout_s`` for an answer and kills the parse process past it (413); the
process also caps its own CPU time for each parse (``RLIMIT_CPU``), so one left
behind by a worker killed meanwhile stops too. fast_matrix_market parses on one
thread there: ``slots`` parses at once, ``slots`` CPUs. Requests past those
wait, at most ``queue`` of them; past that they get 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.forkserver
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
from fastapi import HTTPException, status

from common.errors import MatrixFormatError
from service.settings import Settings
from service.uploads import MatrixTooLargeError, ParsedMatrix, Upload, read_upload, refusal
from tuner.matrix.bounds import ReadLimitError, ReadLimits

log = logging.getLogger("service.parsing")

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload([__name__])
_ERRORS: dict[str, Callable[[str], MatrixFormatError]] = {
    "too large": MatrixTooLargeError, "format": MatrixFormatError,
}


@dataclass(frozen=True)
class ParseTask:
    """What a parse process needs to read one upload (see :func:`service.uploads.read_upload`)."""

    path: Path
    display_name: str
    dtype: str
    limits: ReadLimits
    max_size: int
    keep_dir: Path | None = None

    @property
    def scratch(self) -> Path:
        """Where a gzip upload is decompressed (removed by the worker, even when the parse is killed)."""
        return self.path.with_name(self.path.name + ".mtx")

    @classmethod
    def of(cls, upload: Upload, settings: Settings, *, dtype: str, keep_dir: Path | None = None) -> ParseTask:
        """The task of reading ``upload`` under ``settings``' bounds."""
        return cls(upload.path, upload.filename, dtype, settings.read_limits, settings.max_matrix_size, keep_dir)


def _peak_mb() -> float:
    """The most memory this process has held (MiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024  # bytes there, KiB on Linux


def _answer(task: ParseTask) -> tuple[Any, ...]:
    """``("ok", ParsedMatrix)``, or the kind of error and its message."""
    try:
        return ("ok", read_upload(task.path, display_name=task.display_name, dtype=task.dtype, limits=task.limits,
                                  max_size=task.max_size, scratch=task.scratch, keep_dir=task.keep_dir))
    except ReadLimitError as exc:
        return ("bound", str(exc), exc.bound, exc.limit)
    except MatrixTooLargeError as exc:
        return ("too large", str(exc))
    except MatrixFormatError as exc:
        return ("format", str(exc))
    except Exception:
        return ("bug", traceback.format_exc())


def _serve(conn: Connection, cpu_s: int, recycle_mb: float) -> None:
    """A parse process: answer tasks from ``conn`` until it closes, or until a parse leaves it too large."""
    import fast_matrix_market

    fast_matrix_market.PARALLELISM = 1
    baseline = _peak_mb()
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        used = resource.getrusage(resource.RUSAGE_SELF)
        resource.setrlimit(resource.RLIMIT_CPU, (math.ceil(used.ru_utime + used.ru_stime) + cpu_s, hard))
        answer = _answer(task)
        leaving = _peak_mb() > baseline + recycle_mb
        conn.send((*answer[:1], leaving, *answer[1:]))
        if leaving:
            return


class _Process:
    """A parse process and the worker's end of its pipe."""

    def __init__(self, timeout_s: float, recycle_mb: float) -> None:
        self.conn, theirs = _context.Pipe()
        self.process = _context.Process(target=_serve, args=(theirs, math.ceil(timeout_s), recycle_mb), daemon=True,
                                        name="spmv-tuner-parse")
        self.process.start()
        theirs.close()

    def ask(self, task: ParseTask, timeout_s: float) -> tuple[tuple[Any, ...], bool]:
        """The answer to ``task`` (``("gone",)`` if the process was gone) and whether it can take another."""
        try:
            self.conn.send(task)
        except OSError:
            self.close(kill=True)
            return ("gone",), False
        if not self.conn.poll(timeout_s):
            self.close(kill=True)
            return ("timeout",), False
        try:
            kind, leaving, *rest = self.conn.recv()
        except EOFError:  # it died without an answer: killed by its CPU cap, or crashed
            self.close(kill=False)
            if self.process.exitcode == -signal.SIGXCPU:
                return ("timeout",), False
            return ("died", f"exit code {self.process.exitcode}"), False
        if leaving:
            self.close(kill=False)
        return (kind, *rest), not leaving

    def close(self, *, kill: bool) -> None:
        self.conn.close()  # a process waiting for a task exits
        if kill:
            self.process.kill()
        self.process.join(5.0)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()


class Parser:
    """Parses uploads in child processes, ``slots`` at once in this process, ``queue`` more waiting."""

    def __init__(self, *, slots: int, queue: int, timeout_s: float, recycle_mb: float = 32.0) -> None:
        self.slots, self.queue, self.timeout_s, self.recycle_mb = slots, queue, timeout_s, recycle_mb
        self._free = anyio.Semaphore(slots)
        self._idle: list[_Process] = []
        self.waiting = 0
        self.running = 0
        self._mean_s = 0.1  # moving average of a parse's time, for Retry-After

    def start(self) -> None:
        """Fork the parse processes now (the first one starts the forkserver, which imports NumPy, SciPy and the
        reader: a second), not at the first upload."""
        self._idle = [_Process(self.timeout_s, self.recycle_mb) for _ in range(self.slots)]

    def stop(self) -> None:
        """Let the idle parse processes go (one answering a parse goes when it is done)."""
        while self._idle:
            self._idle.pop().close(kill=False)

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
        """Ask an idle parse process (or a new one) for ``task``'s answer (in a worker thread, holding a slot)."""
        try:
            for _ in range(2):  # an idle process found gone: once more with a new one
                try:
                    process = self._idle.pop()
                except IndexError:
                    process = _Process(self.timeout_s, self.recycle_mb)
                answer, reusable = process.ask(task, self.timeout_s)
                if answer[0] != "gone":
                    break
        finally:
            task.scratch.unlink(missing_ok=True)
        if reusable:
            self._idle.append(process)
        return answer
