"""Tuning past one GPU: many workers on many GPUs and hosts sharing optuna studies through one storage.

There is no scheduler and no queue of our own. Every worker walks the same
list of matrices and, for each, works on the study of (matrix fingerprint, GPU
model, dtype) until that study holds exactly N finished trials across all
workers (:class:`Budget`); optuna's storage is what they share:
PostgreSQL for many hosts, a journal file on a shared file system, SQLite for
one process only. ``tune-many`` starts one worker process per GPU of this host
(pinned with ``CUDA_VISIBLE_DEVICES``); running the same command on every host
spreads the work over the cluster, and running it again after a node died
finishes what it left. A worker that dies mid-trial stops its trial's
heartbeat, and a grace period later whoever looks next marks that trial
failed, which counts towards N: the study still completes.

``sync`` copies every finished trial's record from the storage into the local
SQLite store, once each (keyed by the trial's uid), for training and the service.
"""

from __future__ import annotations

import bisect
import contextlib
import copy
import hashlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import TrialState
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from common.errors import InvalidConfigError, TunerError
from db.store import TRIAL_FIELDS
from tuner.matrix.io import check_dtype
from tuner.select.portfolio import read_portfolio

DEFAULT_ATTR = "default"  # a trial enqueued by tune(total=N): a family's default or a config of its `enqueue`
SURPLUS_ATTR = "surplus"  # a trial asked past the budget and pruned unmeasured
FINISHED = (TrialState.COMPLETE, TrialState.FAIL)
HEARTBEAT_S = 10  # a running trial beats this often...
GRACE_S = 60  # ...and is failed when silent this long (its worker died)
CONTEXT_LOST = 75  # a worker's exit code when a kernel broke its CUDA context: tune-many restarts it
MAX_RESTARTS = 20

console = Console()
err_console = Console(stderr=True)


# -- the budget: exactly N finished trials per study, however many workers race ------------------------


@dataclass(frozen=True)
class Budget:
    """Where a study stands against a budget of ``total`` finished (COMPLETE or FAIL) trials.

    The budget is the study's first ``total`` trials by number that are not
    PRUNED (its *head*). A worker asks only while the budget is ``open`` (the
    head is short, or holds a WAITING trial that ask() will pop); after asking it
    keeps its trial only if fewer than ``total`` unpruned trials precede it, and
    else tells it PRUNED unmeasured (:data:`SURPLUS_ATTR`). Trial numbers are
    unique and only grow, so a kept trial stays in the head for ever and a
    pruned one gives its place back: the head ends with exactly ``total``
    finished trials however many workers raced for the last places, and no
    trial outside it is ever finished by a worker in this mode.
    """

    total: int
    finished: int  # COMPLETE or FAIL, in the whole study
    failed: int
    running: int
    open: bool  # a worker may ask for a trial now
    done: bool  # the head holds `total` finished trials, and no trial is left running outside it


def study_budget(study: optuna.Study, total: int, trials: Sequence[optuna.trial.FrozenTrial] | None = None) -> Budget:
    """The study's :class:`Budget` for ``total`` finished trials (``trials``: already read, else read now)."""
    trials = study.get_trials(deepcopy=False) if trials is None else trials
    head = sorted((t for t in trials if t.state != TrialState.PRUNED), key=lambda t: t.number)[:total]
    running = sum(t.state == TrialState.RUNNING for t in trials)
    return Budget(
        total=total,
        finished=sum(t.state in FINISHED for t in trials),
        failed=sum(t.state == TrialState.FAIL for t in trials),
        running=running,
        open=len(head) < total or any(t.state == TrialState.WAITING for t in head),
        # A surplus trial whose worker died between ask() and pruning it stays RUNNING until its
        # heartbeat goes stale and settle() prunes it: until then the study is waited for, not done.
        done=len(head) == total and all(t.state in FINISHED for t in head) and running == 0,
    )


def settle(study: optuna.Study, total: int) -> Budget:
    """Fail stale trials, then the study's :class:`Budget`; a done study's leftover WAITING trials are pruned.

    Workers starting on a new study at once may each enqueue the families'
    defaults, so a few WAITING copies can outlive the budget: pruned, they
    never come back as repeats when a later run raises N.
    """
    fail_stale_trials(study, total)
    trials = study.get_trials(deepcopy=False)
    budget = study_budget(study, total, trials)
    if budget.done:
        for t in trials:
            if t.state == TrialState.WAITING:
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    study._storage.set_trial_state_values(t._trial_id, state=TrialState.PRUNED)
    return budget


def fail_stale_trials(study: optuna.Study, total: int | None = None) -> int:
    """Fail the study's RUNNING trials whose heartbeat stopped (their worker died); returns how many.

    optuna's ``fail_stale_trials`` marks them FAIL. With a budget of ``total``
    trials, a stale trial outside the head (a worker died between ask() and
    pruning its surplus trial) is PRUNED instead, so the study still ends with
    exactly ``total`` finished trials. The storage's stale-trial callback is
    called for each failed trial. A storage without heartbeats: nothing to do.
    """
    storage = study._storage
    if not is_heartbeat_enabled(storage):
        return 0
    stale = set(storage._get_stale_trial_ids(study._study_id))
    if not stale:
        return 0
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    live = [t.number for t in trials if t.state != TrialState.PRUNED]
    getter = getattr(storage, "get_heartbeat_stale_trial_callback", None) or storage.get_failed_trial_callback
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        callback = getter()
    failed = 0
    for t in trials:
        if t._trial_id not in stale:
            continue
        surplus = total is not None and bisect.bisect_left(live, t.number) >= total
        state = TrialState.PRUNED if surplus else TrialState.FAIL
        try:
            if not storage.set_trial_state_values(t._trial_id, state=state):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # its worker (or another one) finished it meanwhile
        if surplus:
            live.remove(t.number)
            continue
        failed += 1
        if callback is not None:
            callback(study, copy.deepcopy(storage.get_trial(t._trial_id)))
    return failed


def keeps_place(study: optuna.Study, trial: optuna.Trial, total: int) -> bool:
    """Whether fewer than ``total`` unpruned trials precede ``trial`` (see :class:`Budget`)."""
    before = sum(t.number < trial.number and t.state != TrialState.PRUNED for t in study.get_trials(deepcopy=False))
    return before < total


def repeats_queued(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether ``trial`` was enqueued with a default config that a lower-numbered trial runs or ran already.

    Workers that start on a study together may all enqueue the families'
    defaults; the copy with the lowest number is measured, the others are pruned.
    """
    trials = study.get_trials(deepcopy=False)
    mine = next((t for t in trials if t.number == trial.number), None)
    if mine is None or not mine.user_attrs.get(DEFAULT_ATTR):
        return False
    fixed = mine.system_attrs.get("fixed_params")
    return any(
        t.number < trial.number and t.state not in (TrialState.PRUNED, TrialState.WAITING)
        and (t.params or t.system_attrs.get("fixed_params")) == fixed
        for t in trials
    )


# -- sources -----------------------------------------------------------------------------------------


def read_sources(items: Sequence[str | Path], suite: str | None = None) -> list[Any]:
    """``.mtx``/``.mtx.gz`` files, folders of them, and manifests, then a named generated suite's
    matrices (:mod:`tuner.matrix.suites`, built by each worker itself), as :class:`tuner.benchmark.bench.Source`.

    A manifest is any other file: one path per line (blank lines and ``#``
    comments skipped, relative paths taken from the manifest's folder), or a
    TSV whose header has a ``path`` or ``file`` column (like shared/matrices/MANIFEST.tsv).
    """
    from tuner.benchmark.bench import sources

    paths: list[Path] = []
    for item in map(Path, items):
        if not item.exists():
            raise FileNotFoundError(f"source {item} does not exist")
        paths += _manifest(item) if item.is_file() and not item.name.endswith((".mtx", ".mtx.gz")) else [item]
    return sources(paths, suite)


def _manifest(path: Path) -> list[Path]:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    if lines and "\t" in lines[0]:
        header = lines[0].split("\t")
        column = next((c for c in ("path", "file") if c in header), None)
        if column is None:
            raise InvalidConfigError(f"manifest {path}: a TSV manifest needs a 'path' or 'file' column")
        lines = [ln.split("\t")[header.index(column)] for ln in lines[1:]]
    out = [p if p.is_absolute() else path.parent / p for p in map(Path, lines)]
    if missing := [str(p) for p in out if not p.exists()]:
        raise FileNotFoundError(f"manifest {path} names missing files: {', '.join(missing[:5])}")
    return out


# -- the worker ----------------------------------------------------------------------------------------


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
    from tuner.search.loop import study_name, tune

    stats = WorkerStats()
    pending: dict[str, tuple[int, Any]] = {}
    by_key = _studies_by_source(storage, study_name("", backend.info, dtype)) if any(s.key for s in srcs) else {}

    def remaining() -> float | None:
        """Seconds to the deadline (at least a nanosecond: tune() reads a timeout of 0 as none), or None."""
        return None if deadline is None else max(deadline - time.time(), 1e-9)

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
    from tuner.search.loop import SOURCE_ATTR

    return {s.user_attrs[SOURCE_ATTR]: s.study_name for s in storage.get_all_studies()
            if s.study_name.endswith(suffix) and s.user_attrs.get(SOURCE_ATTR)}


def worker(
    storage: Annotated[str, typer.Option(help="optuna storage shared by every worker")],
    trials_per_matrix: Annotated[int, typer.Option(help="finished trials per study, all workers together")],
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


# -- tune-many: start the workers, show their progress -----------------------------------------------


def _gpus(spec: str | None) -> list[str]:
    if spec:
        return [g.strip() for g in spec.split(",") if g.strip()]
    if visible := os.environ.get("CUDA_VISIBLE_DEVICES"):
        return [g.strip() for g in visible.split(",") if g.strip()]
    smi = shutil.which("nvidia-smi")
    out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout if smi else ""
    gpus = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
    if not gpus:
        raise InvalidConfigError("no GPU found (nvidia-smi lists none): give --gpus, or --device cpu-reference")
    return gpus


def _seed(base: int, slot: int) -> int:
    """A sampler seed per (host, worker slot): workers never propose in lockstep."""
    return zlib.crc32(f"{socket.gethostname()}:{slot}:{base}".encode()) % (2**31)


@dataclass
class _Worker:
    slot: int
    label: str
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    restarts: int = 0
    device: str = ""
    stats: dict[str, Any] = field(default_factory=lambda: {"trials": 0, "failed": 0, "cached": 0, "visited": 0})
    end: dict[str, Any] | None = None
    fatal: str = ""
    task: Any = None
    seen: set[int] = field(default_factory=set)  # indices of the list it reported (a restart repeats some)


def tune_many(
    storage: Annotated[str, typer.Option(
        help="optuna storage every worker shares: postgresql://… (many hosts), PATH.log or journal:PATH "
             "(a shared file system), sqlite:///… (one worker only)")],
    trials_per_matrix: Annotated[int, typer.Option(
        "--trials-per-matrix", min=1, help="finished trials (ok or failed) per study, all workers together")],
    sources: Annotated[list[Path] | None, typer.Argument(
        help=".mtx files, folders of them, or manifests (a path a line)")] = None,
    suite: Annotated[str | None, typer.Option(
        help="also a named generated suite (small, large, graphs, corpus, corpus-smoke), built by each worker")] = None,
    gpus: Annotated[str | None, typer.Option(help="GPU indices, one worker each (default: every GPU here)")] = None,
    workers: Annotated[int | None, typer.Option(min=1, help="worker processes, with --device cpu-reference")] = None,
    dtype: Annotated[str, typer.Option(help="value type: float64 or float32")] = "float64",
    device: Annotated[str, typer.Option(help="gpu, or cpu-reference (CPU references; not GPU figures)")] = "gpu",
    kernels: Annotated[str | None, typer.Option(help="comma-separated families (default: all)")] = None,
    seed: Annotated[int, typer.Option(help="base seed of the workers' samplers")] = 0,
    heartbeat: Annotated[int, typer.Option(min=0, help="seconds between a running trial's heartbeats (0: off)")]
    = HEARTBEAT_S,
    grace: Annotated[int, typer.Option(min=1, help="seconds without a heartbeat before a trial is failed")]
    = GRACE_S,
    time_limit: Annotated[float | None, typer.Option(
        min=0, help="seconds after which no trial starts; run the same command again to go on")] = None,
    enqueue: Annotated[Path | None, typer.Option(
        help="a portfolio file (`tuner corpus portfolio`): its configs are measured in every study, before "
             "optuna's; raise --trials-per-matrix by their number")] = None,
) -> None:
    """Tune every matrix on every GPU of this host, sharing the studies through STORAGE with every other host."""
    from common.errors import InvalidConfigError as _Invalid

    deadline = None if time_limit is None else time.time() + time_limit
    try:
        check_dtype(dtype)
        srcs = read_sources(sources or [], suite)
        if enqueue is not None:
            read_portfolio(enqueue)  # a bad file fails here, not in every worker
        if not srcs:
            raise _Invalid("nothing to tune: the sources hold no .mtx files (and no --suite was given)")
        if device == "gpu":
            if workers is not None:
                raise _Invalid("--workers is for --device cpu-reference; on GPUs give --gpus (one worker per GPU)")
            slots = [(f"GPU {g}", {"CUDA_VISIBLE_DEVICES": g}) for g in _gpus(gpus)]
        elif device == "cpu-reference":
            slots = [(f"cpu {k}", {}) for k in range(workers or 1)]
        else:
            raise _Invalid(f"unknown device {device!r}; choose gpu or cpu-reference")
        if storage.startswith("sqlite") and len(slots) > 1:
            raise _Invalid("SQLite serves one process only: give a journal file (PATH.log) or postgresql://… "
                           "for several workers, or one worker")
        open_shared_storage(storage, heartbeat=heartbeat, grace=grace)  # fails early on a bad spec or server
    except (TunerError, FileNotFoundError) as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        raise typer.Exit(1) from None

    args = [*map(str, sources or []), "--storage", storage, "--trials-per-matrix", str(trials_per_matrix), "--dtype",
            dtype, "--device", device, "--heartbeat", str(heartbeat), "--grace", str(grace)]
    if kernels:
        args += ["--kernels", kernels]
    if suite:
        args += ["--suite", suite]
    if deadline is not None:
        args += ["--deadline", repr(deadline)]
    if enqueue is not None:
        args += ["--enqueue", str(enqueue.resolve())]
    root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    pool = [_Worker(k, label, {**os.environ, "PYTHONPATH": pythonpath, **env}) for k, (label, env) in enumerate(slots)]
    events: queue.Queue[tuple[_Worker, str, str | None]] = queue.Queue()

    def start(w: _Worker) -> None:
        cmd = [sys.executable, "-m", "tuner.search.distributed", "worker", *args, "--seed", str(_seed(seed, w.slot)),
               "--start", str(w.slot * len(srcs) // len(pool))]  # each worker begins on its own share
        w.proc = subprocess.Popen(cmd, env=w.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  bufsize=1)
        for stream, kind in ((w.proc.stdout, "event"), (w.proc.stderr, "log")):
            threading.Thread(target=_pump, args=(w, stream, kind, events), daemon=True).start()

    done_studies: set[str] = set()
    studies: set[str] = set()
    devices: set[str] = set()
    streams_open = {w.slot: 0 for w in pool}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console) as progress:
        total_task = progress.add_task("[bold]total", total=len(srcs), info="")
        for w in pool:
            w.task = progress.add_task(f"worker {w.slot} ({w.label})", total=len(srcs), info="starting")
            start(w)
            streams_open[w.slot] = 2
        try:
            while any(streams_open.values()):
                w, kind, line = events.get()
                if line is None:
                    streams_open[w.slot] -= 1
                    if streams_open[w.slot] == 0 and w.proc.wait() == CONTEXT_LOST and w.restarts < MAX_RESTARTS:
                        w.restarts += 1
                        progress.console.print(f"[yellow]worker {w.slot} lost its CUDA context; restarting it[/]")
                        start(w)
                        streams_open[w.slot] = 2
                    continue
                if kind == "log":
                    progress.console.print(f"[dim]worker {w.slot}:[/] {escape(line)}", highlight=False)
                    continue
                ev = json.loads(line)
                _apply(ev, w, studies, done_studies, devices)
                progress.update(w.task, completed=w.stats["visited"], info=_info(w.stats))
                sums = {k: sum(x.stats[k] for x in pool) for k in ("trials", "failed", "cached")}
                progress.update(total_task, total=len(srcs) * max(1, len(devices)), completed=len(done_studies),
                                info=f"{sums['trials']} trials, {sums['failed']} failed")
        except KeyboardInterrupt:
            for w in pool:
                if w.proc and w.proc.poll() is None:
                    w.proc.terminate()
            raise
    left = len(srcs) - len(set().union(*(w.seen for w in pool)))
    ok = _summary(pool, storage, studies, trials_per_matrix, heartbeat, grace, left)
    if not ok:
        raise typer.Exit(1)


def _pump(w: _Worker, stream: Any, kind: str, events: queue.Queue) -> None:
    for line in stream:
        if line.strip():
            events.put((w, kind, line.rstrip("\n")))
    events.put((w, kind, None))


def _apply(ev: dict[str, Any], w: _Worker, studies: set[str], done: set[str], devices: set[str]) -> None:
    kind = ev.get("ev")
    if kind == "start":
        w.device = ev["device"]
        devices.add(ev["device"])
    elif kind == "trial":
        w.stats["trials"] += 1
        w.stats["failed"] += not ev["ok"]
        w.stats["cached"] += ev["cached"]
    elif kind == "matrix":
        w.seen.add(ev["index"])
        w.stats["visited"] = len(w.seen)
        if ev.get("study"):
            studies.add(ev["study"])
            if ev["state"] == "done":
                done.add(ev["study"])
    elif kind == "end":
        w.end = ev
    elif kind == "fatal":
        w.fatal = ev["message"]


def _info(stats: dict[str, Any]) -> str:
    return f"{stats['trials']} trials, {stats['failed']} failed, {stats['cached']} cached"


def _summary(pool: Sequence[_Worker], spec: str, studies: set[str], total: int, heartbeat: int,
             grace: int, left: int = 0) -> bool:
    """Print a table per worker and the studies' totals read back from the storage; True if all is done
    (``left``: matrices of the list that no worker reached before the time limit)."""
    table = Table(title="tune-many: workers")
    for col in ("worker", "exit", "matrices", "done", "passed", "waiting", "errors", "trials", "failed", "cached",
                "lost"):
        table.add_column(col, justify="left" if col == "worker" else "right")
    healthy = True
    for w in pool:
        rc = w.proc.returncode if w.proc else None
        healthy &= rc == 0
        e = w.end or {}
        table.add_row(f"{w.slot} {w.label}", str(rc), *(str(e.get(k, "-")) for k in ("matrices", "done", "passed",
                      "waiting", "errors")), *(str(w.stats[k]) for k in ("trials", "failed", "cached")),
                      str(e.get("lost", "-")))
        if w.fatal:
            console.print(f"[red]worker {w.slot}:[/] {escape(w.fatal)}")
    console.print(table)
    for device in sorted({w.device for w in pool if w.device}):
        console.print(f"device: {escape(device)}")
    storage = open_shared_storage(spec, heartbeat=heartbeat, grace=grace)
    complete = finished = failed = 0
    for name in sorted(studies):
        budget = study_budget(optuna.load_study(study_name=name, storage=storage), total)
        complete += budget.done
        finished += budget.finished
        failed += budget.failed
    console.print(f"studies complete: {complete} of {len(studies)}; finished trials in them: {finished} "
                  f"({failed} failed); storage {spec}")
    if left:
        console.print(f"[yellow]the time limit came first: {left} matrices not reached; run the same command "
                      "again to go on (done studies are passed by)[/]")
    if complete < len(studies):
        console.print("[yellow]not every study is complete: run the same command again to finish them[/]")
    elif not healthy:
        console.print("[yellow]a worker died or failed (see its exit code); the others completed every study[/]")
    console.print(f"copy the trials into a local store with: tuner sync --storage {spec} [--db FILE]")
    return healthy and complete == len(studies) and not left


# -- sync: from the shared storage into the local SQLite store --------------------------------------


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
    from tuner.search.loop import CACHED_ATTR, RECORD_ATTR

    report = SyncReport()
    for study in sorted(storage.get_all_studies(), key=lambda s: s.study_name):
        attrs = study.user_attrs
        fp, device = attrs.get("fingerprint"), attrs.get("device")
        if not (fp and device and attrs.get("dtype")):
            continue  # not a tuner study
        if "matrix" in attrs:
            m = attrs["matrix"]
            store.add_matrix(fp, name=m["name"], rows=m["rows"], cols=m["cols"], nnz=m["nnz"],
                             features=m.get("features") or {})
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
    from tuner.search.loop import UID_ATTR

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


app = typer.Typer(help="Distributed tuning: tune-many, sync, and the worker they start.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
app.command("tune-many")(tune_many)
app.command("sync")(sync)
app.command("worker", hidden=True)(worker)

if __name__ == "__main__":  # `python -m tuner.search.distributed`: run the commands of the importable module,
    from tuner.search.distributed import (
        app as _app,  # so that tuner.search.loop and this share one Budget and one settle()
    )

    _app()
