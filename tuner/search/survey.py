"""A survey: every config of a portfolio measured on every matrix of a list, for the selector's corpus.

Tuning samples different configs on each matrix; the selector
(:class:`tuner.select.model.KernelSelector`) learns each config's time from
the matrices it was measured on, so its corpus needs the same configs
measured everywhere: a :mod:`tuner.select.portfolio`. A survey prepares,
checks against the float64 reference (on the GPU, for a matrix there) and
times each config with :func:`tuner.measure.evaluate.evaluate`, the tuner's
own measurement, and stores every outcome, failed ones with their reason, as
trials of study :data:`STUDY`, one transaction per matrix and dtype: an
interrupted survey keeps every matrix it finished, and running it again
passes those by without building them (by name). Generated matrices are
built by worker processes ahead of the GPU, the largest memory cost of a
survey being the matrices in flight.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.errors import TunerError
from db.store import Store
from kernels import canonical, config_key, get_family
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.sources import Source
from tuner.measure.backend import Backend
from tuner.measure.evaluate import evaluate
from tuner.measure.verify import Reference
from tuner.select.portfolio import Config

__all__ = ["STUDY", "SurveyReport", "load_ahead", "survey"]

STUDY = "portfolio"
"""The ``study`` of a survey's trials in the store."""


@dataclass
class SurveyReport:
    """What a survey did: matrices measured and passed by (done before), trials stored and failed, seconds."""

    matrices: int = 0
    passed_by: int = 0
    trials: int = 0
    failed: int = 0
    seconds: float = 0.0
    unreadable: dict[str, str] = field(default_factory=dict)  # source name -> why it could not be loaded


def survey(srcs: Sequence[Source], configs: Sequence[Config], *, backend: Backend, store: Store,
           dtypes: Sequence[str] = ("float64", "float32"), repeats: int = 20, max_duration: float = 0.1,
           workers: int = 0, on_matrix: Callable[[Source, int], None] | None = None) -> SurveyReport:
    """Measure every config on every source in every dtype into ``store`` (see the module's doc).

    ``workers`` processes build generated matrices ahead of the GPU (0: each in turn here). ``on_matrix``
    is called after each matrix with the number of trials stored for it.
    """
    if repeats < 1 or max_duration <= 0 or workers < 0:
        raise ValueError(f"repeats must be >= 1, max_duration > 0 and workers >= 0; got {repeats}, "
                         f"{max_duration}, {workers}")
    report = SurveyReport()
    start = time.perf_counter()
    device = backend.info
    store.add_device(device.record(backend.copy_bandwidth_gbs()))
    todo = []
    for src in srcs:
        if all(_measured(store, src.name, device.id, dtype) >= len(configs) for dtype in dtypes):
            report.passed_by += 1
        else:
            todo.append(src)
    for src, A in load_ahead(todo, workers):
        if isinstance(A, TunerError):  # a complex or malformed file: said, and the survey goes on
            report.unreadable[src.name] = str(A)
            continue
        stored = _measure_matrix(src, A, configs, backend=backend, store=store, dtypes=dtypes,
                                 repeats=repeats, max_duration=max_duration)
        report.matrices += 1
        report.trials += len(stored)
        report.failed += sum(r["state"] != "ok" for r in stored)
        if on_matrix:
            on_matrix(src, len(stored))
    report.seconds = time.perf_counter() - start
    return report


def _measured(store: Store, name: str, device: str, dtype: str) -> int:
    """Survey trials the store holds for the matrix called ``name`` on (device, dtype)."""
    row = store.db.execute(
        "select count(*) from trials join matrices using (fingerprint) where matrices.name = ? and "
        "trials.device = ? and trials.dtype = ? and trials.study = ?", [name, device, dtype, STUDY]).fetchone()
    return int(row[0])


def load_ahead(srcs: Sequence[Source], workers: int) -> Iterator[tuple[Source, Any]]:
    """Each source with its float64 matrix (or the TunerError that loading it raised), in order; generated
    ones built ``workers`` at a time in other processes (spawned: the parent holds a CUDA context)."""
    if workers == 0:
        for src in srcs:
            yield src, _load(src)
        return
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        ahead: list[tuple[Source, cf.Future[Any] | None]] = []
        queue = list(srcs)
        while queue or ahead:
            while queue and len(ahead) < workers:
                src = queue.pop(0)
                ahead.append((src, pool.submit(_load, src) if src.key is not None else None))
            src, future = ahead.pop(0)
            yield src, future.result() if future is not None else _load(src)


def _load(src: Source) -> Any:
    try:
        return src.load("float64")
    except TunerError as exc:
        return exc


def _measure_matrix(src: Source, A: Any, configs: Sequence[Config], *, backend: Backend, store: Store,
                    dtypes: Sequence[str], repeats: int, max_duration: float) -> list[dict[str, Any]]:
    """Every config not yet stored for this matrix, in every dtype; the trial rows written."""
    A_dev = backend.matrix(A)
    fp = fingerprint(A_dev)
    store.add_matrix(fp, name=src.name, rows=A.shape[0], cols=A.shape[1], nnz=A.nnz,
                     features=extract_features(A_dev))
    written = []
    for dtype in dtypes:
        done = {config_key(r["kernel"], r["params"])  # as recorded: what ran (kernels.canonical)
                for r in store.trials(fp, device=backend.info.id, dtype=dtype) if r["study"] == STUDY}
        A_d = A_dev if dtype == str(A_dev.dtype) else A_dev.astype(dtype)
        reference = Reference.build(A_d, dtype)
        rows = []
        for kernel, params in configs:
            if config_key(kernel, canonical(kernel, params)) in done:
                continue
            outcome = evaluate(backend, get_family(kernel), A_d, params, reference, reference.x, repeats=repeats,
                               max_duration=max_duration)
            rows.append({**outcome.record(shape=A.shape, nnz=A.nnz, dtype=dtype), "fingerprint": fp,
                         "device": backend.info.id, "dtype": dtype, "study": STUDY, "trial_uid": uuid.uuid4().hex})
        store.add_trials(rows)
        written += rows
        del A_d, reference
    return written
