"""tune-many: one worker process per GPU of this host (or CPU slot), their progress, and a summary.

Many GPUs on many hosts tune one list of matrices together by sharing optuna's
studies: PostgreSQL for many hosts, a journal file on a shared file system,
SQLite for one process only. This starts one worker
(:mod:`tuner.search.worker`) per GPU, pinned with ``CUDA_VISIBLE_DEVICES``, each
beginning at its own share of the list; running the same command on every host
spreads the work over the cluster, and running it again after a node died
finishes what it left. A worker whose kernel broke its CUDA context is
restarted.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import optuna
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from common.errors import InvalidConfigError, TunerError
from tuner.matrix.io import check_dtype
from tuner.matrix.sources import read_sources
from tuner.search.study import study_budget
from tuner.search.worker import CONTEXT_LOST, GRACE_S, HEARTBEAT_S, open_shared_storage
from tuner.select.portfolio import read_portfolio

MAX_RESTARTS = 20

console = Console()
err_console = Console(stderr=True)


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
    deadline = None if time_limit is None else time.time() + time_limit
    try:
        check_dtype(dtype)
        srcs = read_sources(sources or [], suite)
        if enqueue is not None:
            read_portfolio(enqueue)  # a bad file fails here, not in every worker
        if not srcs:
            raise InvalidConfigError("nothing to tune: the sources hold no .mtx files (and no --suite was given)")
        if device == "gpu":
            if workers is not None:
                raise InvalidConfigError("--workers is for --device cpu-reference; on GPUs give --gpus "
                                         "(one worker per GPU)")
            slots = [(f"GPU {g}", {"CUDA_VISIBLE_DEVICES": g}) for g in _gpus(gpus)]
        elif device == "cpu-reference":
            slots = [(f"cpu {k}", {}) for k in range(workers or 1)]
        else:
            raise InvalidConfigError(f"unknown device {device!r}; choose gpu or cpu-reference")
        if storage.startswith("sqlite") and len(slots) > 1:
            raise InvalidConfigError("SQLite serves one process only: give a journal file (PATH.log) or postgresql://… "
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
        cmd = [sys.executable, "-m", "tuner.search.worker", *args, "--seed", str(_seed(seed, w.slot)),
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
