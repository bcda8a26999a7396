"""One tune-many worker: a pass over the list of matrices, each study brought to N finished trials.

There is no scheduler and no queue of our own. Every worker walks the same
list of matrices and, for each, works on the study of (matrix fingerprint, GPU
model, dtype) until that study holds exactly N finished trials across all
workers (:class:`tuner.search.study.Budget`), sharing it through optuna's
storage. A worker that dies mid-trial stops its trial's heartbeat, and a grace
period later whoever looks next marks that trial failed, which counts towards
N: the study still completes. tune-many (:mod:`tuner.search.pool`) starts one
per GPU as ``python -m tuner.search.worker``, which prints JSON lines of
progress.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from optuna.storages._heartbeat import is_heartbeat_enabled

from common.errors import TunerError
from tuner.matrix.sources import read_sources
from tuner.search.study import SOURCE_ATTR, settle, study_name
from tuner.select.portfolio import read_portfolio

HEARTBEAT_S = 10  # a running trial beats this often...
GRACE_S = 60  # ...and is failed when silent this long (its worker died)
CONTEXT_LOST = 75  # a worker's exit code when a kernel broke its CUDA context: tune-many restarts it


@dataclass
class WorkerStats:
    """What one worker did: matrices visited and how each ended, trials it ran."""

    matrices: int = 0
    done: int = 0
    waiting: int = 0  # its last trials run on another worker that has not finished them yet
    errors: int = 0
    trials: int = 0
    failed: int = 0
    cached: int = 0
    lost: int = 0  # stale trials of dead workers that this one marked failed (counted by the caller)
    passed: int = 0  # done studies passed by their source key, without building the matrix
    left: int = 0  # matrices not visited because the deadline came first
    studies: list[str] = field(default_factory=list)


def open_shared_storage(spec: str, *, heartbeat: int, grace: int,
                        on_stale: Callable[..., None] | None = None) -> optuna.storages.BaseStorage:
    """``spec`` opened with heartbeats every ``heartbeat`` seconds (0: none) and ``grace`` seconds of grace."""
    from tuner.search.storage import open_storage

    return open_storage(spec, heartbeat_interval=heartbeat or None, grace_period=grace if heartbeat else None,
                        stale_trial_callback=on_stale)


def run_worker(
    srcs: Sequence[Any],
    *,
    storage: optuna.storages.BaseStorage,
    backend: Any,
    dtype: str,
    total: int,
    kernels: Sequence[str] | None = None,
    seed: int = 0,
    emit: Callable[[dict[str, Any]], None] = lambda event: None,
    poll_s: float = 1.0,
    start: int = 0,
    deadline: float | None = None,
    enqueue: Sequence[tuple[str, dict[str, Any]]] = (),
) -> WorkerStats:
    """Bring the study of every source (on this backend's device model, in ``dtype``) to ``total`` finished trials.

    One pass over the list does the work, beginning at index ``start`` and
    wrapping around (tune-many starts each worker at its own share of the
    list, so workers begin on different studies and meet only at the end);
    then, if the storage has heartbeats, the worker waits for studies whose
    last trials run elsewhere, failing them if their worker died, until every
    study is done. A source with a ``key`` whose study is done is passed by
    without building its matrix. With ``deadline`` (a ``time.time()``), no
    trial starts after it and the rest of the list is left (``stats.left``)
    for a later run. ``enqueue`` (a :mod:`tuner.select.portfolio`) is measured in every study (see
    :func:`tuner.search.loop.tune`).
    """
    from tuner.matrix.fingerprint import fingerprint
    from tuner.matrix.io import as_csr
    from tuner.measure.evaluate import ContextLostError
    from tuner.search.loop import tune

    stats = WorkerStats()
    pending: dict[str, tuple[int, Any]] = {}
    by_key = _studies_by_source(storage, study_name("", backend.info, dtype)) if any(s.key for s in srcs) else {}

    def remaining() -> float | None:
        """Seconds to the deadline (0 once it has passed), or None."""
        return None if deadline is None else max(deadline - time.time(), 0.0)

    def on_trial(outcome: Any) -> None:
        stats.trials += 1
        stats.cached += outcome is None
        stats.failed += outcome is not None and not outcome.ok
        emit({"ev": "trial", "ok": outcome is None or outcome.ok, "cached": outcome is None})

    def visit(index: int, src: Any) -> None:
        # The study's name: known without building the matrix for a generated one whose study exists.
        name, A = by_key.get(src.key), None
        if name is None:
            A = as_csr(src.load(dtype), dtype=dtype)
            name = study_name(fingerprint(A), backend.info, dtype)
        try:  # a study that needs nothing more is passed by without building the matrix or its reference
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            study = None
        if study is not None:
            budget = settle(study, total)
            if not budget.open:
                stats.passed += A is None
                finished(index, src, name, budget)
                return
        if A is None:
            A = as_csr(src.load(dtype), dtype=dtype)
        result = tune(A, backend=backend, store=None, storage=storage, name=src.name, dtype=dtype, trials=total,
                      timeout=remaining(), total=total, kernels=kernels, seed=seed, on_trial=on_trial,
                      summary=False, source=src.key, enqueue=enqueue)
        finished(index, src, result.study, result.budget)

    def finished(index: int, src: Any, name: str, budget: Any) -> None:
        state = "done" if budget.done else "waiting"
        if name not in stats.studies:
            stats.studies.append(name)
        if budget.done:
            pending.pop(name, None)
        else:
            pending[name] = (index, src)
        emit({"ev": "matrix", "index": index, "name": src.name, "study": name, "state": state,
              "finished": budget.finished, "failed": budget.failed})

    order = [*range(start % max(len(srcs), 1), len(srcs)), *range(start % max(len(srcs), 1))]
    for step, index in enumerate(order):
        if deadline is not None and time.time() >= deadline:
            stats.left = len(order) - step
            break
        src = srcs[index]
        stats.matrices += 1
        try:
            visit(index, src)
        except ContextLostError:
            raise  # this process can launch nothing more: tune-many restarts it
        except TunerError as exc:  # a matrix that cannot be read or tuned: recorded, and the list goes on
            stats.errors += 1
            emit({"ev": "matrix", "index": index, "name": src.name, "state": "error", "message": str(exc)[:500]})

    while pending and is_heartbeat_enabled(storage) and (deadline is None or time.time() < deadline):
        time.sleep(poll_s)
        for name, (index, src) in list(pending.items()):
            budget = settle(optuna.load_study(study_name=name, storage=storage), total)
            if budget.open:
                visit(index, src)
            elif budget.done:
                finished(index, src, name, budget)
    stats.done = len(stats.studies) - len(pending)
    stats.waiting = len(pending)
    return stats


def _studies_by_source(storage: optuna.storages.BaseStorage, suffix: str) -> dict[str, str]:
    """Source key → study name, for the storage's studies whose name ends with ``suffix``
    (``|device|dtype|registry version``: this worker's device model, dtype and registry)."""
    return {s.user_attrs[SOURCE_ATTR]: s.study_name for s in storage.get_all_studies()
            if s.study_name.endswith(suffix) and s.user_attrs.get(SOURCE_ATTR)}


def worker(
    storage: Annotated[str, typer.Option(help="optuna storage shared by every worker")],
    trials_per_matrix: Annotated[int, typer.Option(min=1, help="finished trials per study, all workers together")],
    sources: Annotated[list[Path] | None, typer.Argument(help=".mtx files, folders, manifests")] = None,
    suite: Annotated[str | None, typer.Option()] = None,
    dtype: Annotated[str, typer.Option()] = "float64",
    device: Annotated[str, typer.Option()] = "gpu",
    kernels: Annotated[str | None, typer.Option()] = None,
    seed: Annotated[int, typer.Option()] = 0,
    heartbeat: Annotated[int, typer.Option()] = HEARTBEAT_S,
    grace: Annotated[int, typer.Option()] = GRACE_S,
    start: Annotated[int, typer.Option(help="index of the list to begin at (wrapping around)")] = 0,
    deadline: Annotated[float | None, typer.Option(help="time.time() after which no trial starts")] = None,
    enqueue: Annotated[Path | None, typer.Option(help="portfolio file: configs measured in every study")] = None,
) -> None:
    """One worker (started by tune-many): JSON lines of progress on stdout."""
    from tuner.measure.backend import get_backend
    from tuner.measure.evaluate import ContextLostError

    def emit(event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    lost = []
    try:
        srcs = read_sources(sources or [], suite)
        configs = read_portfolio(enqueue) if enqueue else []
        backend = get_backend(device)
        shared = open_shared_storage(storage, heartbeat=heartbeat, grace=grace,
                                     on_stale=lambda study, trial: lost.append(trial.number))
        emit({"ev": "start", "device": backend.info.id, "matrices": len(srcs), "pid": os.getpid()})
        stats = run_worker(srcs, storage=shared, backend=backend, dtype=dtype, total=trials_per_matrix,
                           kernels=kernels.split(",") if kernels else None, seed=seed, emit=emit, start=start,
                           deadline=deadline, enqueue=configs)
        stats.lost = len(lost)
    except ContextLostError as exc:
        emit({"ev": "fatal", "message": str(exc)[:1000]})
        raise typer.Exit(CONTEXT_LOST) from None
    except (TunerError, FileNotFoundError) as exc:
        emit({"ev": "fatal", "message": str(exc)[:1000]})
        raise typer.Exit(1) from None
    emit({"ev": "end", **asdict(stats)})


app = typer.Typer(pretty_exceptions_enable=False)
app.command()(worker)

if __name__ == "__main__":  # `python -m tuner.search.worker`, as tune-many starts it
    app()
