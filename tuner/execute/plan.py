"""``plan(A)``: a ready-to-call y = A·x, with the fastest config this GPU can be shown to run for this matrix.

``effort`` says how much ``plan()`` may spend when the store holds nothing
measured for the matrix on this GPU and dtype:

- ``"predict"``: the selector's first config (:mod:`tuner.select.model`) among
  cuSPARSE and those cheap to prepare (:data:`~tuner.execute.race.CHEAP_SPMVS`), where the
  training matrices nearest this one show it beating cuSPARSE (:func:`~tuner.select.model.predicted`),
  else cuSPARSE, as without a selector for this GPU; the matrix's features are the only other cost (the ranking is
  queued on the GPU behind them, :mod:`tuner.select.rank_gpu`, where the matrix is new to the store);
- ``"race"`` (the default): the selector's shortlist and cuSPARSE's two
  algorithms prepared, checked and timed here (:mod:`tuner.execute.race`; the
  reference they are checked against is computed on the GPU while the host
  ranks the configs); the fastest runs, already prepared, and every lap goes
  into the store (written behind the caller's back, :mod:`db.write_behind`; a
  later ``plan()`` waits for it), so the next ``plan()`` of the matrix answers
  from the store at once;
- ``"tune"``: the optuna search (:func:`tuner.search.loop.tune`) for ``trials``
  trials, seeded with the selector's first configs (and, where x outgrows the
  L2, the fitted config a race adds: :func:`~tuner.execute.race.search_seeds`),
  then the tuned best.

What is measured always wins over what is predicted: a tuned or raced best
in the store is used whatever the effort. The matrix stays where it is: a
canonical CuPy CSR matrix is fingerprinted, described and raced on the GPU
without a copy. ``ex.cost`` holds the seconds of each step, ``ex.race`` the
race. A matrix of a shape the store holds none of cannot be in it: ``plan()`` then queues its features on
the GPU behind the canonical check and the fingerprint, reads both back at once and finds the selector
while the GPU works (``ex.cost["matrix+features"]``); otherwise it looks the matrix up first (``"matrix"``,
``"lookup"``, then ``"features"`` where it is not found). Where a race runs on a matrix not found and its
rows pay for 16-bit columns, the GPU writes them while the host ranks
(:func:`kernels._narrow.rows_written_once`), for whichever row family the race then prepares on it; a
prediction queues them behind the ranking kernel, after the read-back's copy, written only where that kernel's
pick takes them (a row family's narrow config), while the host reads the pick back.
``op="spmspv"`` (a sparse x) gives a
:class:`~tuner.execute.spmspv.SpMSpVExecutor` instead. ``from tuner import plan`` is this.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

from db import write_behind
from db.shared import shared_store
from db.store import Store
from kernels._cuda import gpu_available
from kernels._narrow import rows_written_once
from tuner.execute.choice import (
    Choice,
    default_choice,
    queue_ranking,
    rank_configs,
    ranked_choice,
    selector_for,
    stored_choice,
)
from tuner.execute.executor import Executor
from tuner.execute.race import (
    CHEAP_SPMVS,
    SEED_CONFIGS,
    RaceResult,
    adapted,
    race,
    record_race,
    search_seeds,
    shortlist,
)
from tuner.matrix.features import QueuedFeatures, extract_features
from tuner.matrix.fingerprint import device_csr_and_fingerprint, fingerprint, legacy_fingerprint
from tuner.matrix.io import as_csr, dtype_name
from tuner.measure.backend import Backend, GpuBackend
from tuner.measure.metrics import effective_bytes
from tuner.measure.verify import Reference
from tuner.select.shipped import ASK_STORE, StoredRow

if TYPE_CHECKING:
    from tuner.execute.spmspv import SpMSpVExecutor

__all__ = ["DEFAULT_TRIALS", "EFFORTS", "check_effort", "plan", "race_matrix"]

EFFORTS = ("predict", "race", "tune")
"""How much ``plan()`` may spend on a matrix it has no measurement of (see the module's doc)."""
DEFAULT_TRIALS = 30
"""Trials of ``effort="tune"`` when ``trials`` is not given."""


def plan(A: Any, *, dtype: str | None = None, db: str | os.PathLike | Store | None = None, op: str = "spmv",
         effort: str = "race", trials: int | None = None, race_size: int = 4) -> Executor | SpMSpVExecutor:
    """Prepare y = A·x for ``A`` (a .mtx path, SciPy/CuPy sparse matrix or CSR triple) on this GPU.

    The store ``db`` (default: the per-user store; a path is opened once a thread,
    :func:`db.shared.shared_store`) is asked first; without a tuned or raced best config for this matrix
    (by structural fingerprint), GPU model and dtype, ``effort`` decides: ``"predict"``, ``"race"`` (up to
    ``race_size`` configs of the selector's ranking, and cuSPARSE) or ``"tune"`` (``trials`` trials of the
    search, 30 by default). Without a GPU, SciPy computes y (``effort`` is checked, and has nothing to do).
    ``op="spmspv"`` prepares y = A·x for a *sparse* x instead.
    """
    check_effort(effort, trials, race_size)
    if op == "spmspv":
        from tuner.execute.spmspv import plan_spmspv

        return plan_spmspv(A, dtype=dtype, db=db)
    if op != "spmv":
        raise ValueError(f"unknown op {op!r}: 'spmv' (dense x) or 'spmspv' (sparse x)")
    if not gpu_available():
        host = as_csr(A, dtype=dtype)
        return Executor(A=host, choice=Choice("scipy", {}, "cpu"), backend=None, fingerprint=fingerprint(host))
    start = time.perf_counter()
    backend = GpuBackend()
    store = db if isinstance(db, Store) else shared_store(db)
    steps = _Steps(backend)
    device = backend.info.id
    newest: dict[str, StoredRow] = {}  # the store's newest selector for this GPU, by dtype: asked with the shape
    selectors: dict[str, Any] = {}  # found while the GPU describes a matrix new to the store, by dtype
    rankings: dict[str, Any] = {}  # and the rankings queued behind its features (not for a search's seeds)

    def new_to_store(rows: int, cols: int, nnz: int, values: str) -> bool:
        shaped, newest[values] = store.shaped_and_newest_model(rows=rows, cols=cols, nnz=nnz, device=device,
                                                               dtype=values)
        return not shaped

    written = contextlib.ExitStack()  # 16-bit row columns written ahead (rows_written_once), kept to the preparation

    def find(values: str, queued: QueuedFeatures, described: Any) -> None:
        if values not in selectors:
            selectors[values] = selector_for(store, device=device, dtype=values, backend=backend,
                                             newest=newest.get(values, ASK_STORE))
        if effort != "tune":
            ranking = rankings[values] = queue_ranking(selectors[values], queued, outcomes=True,
                                                       prepare_budget=CHEAP_SPMVS if effort == "predict" else None)
            if ranking is not None and ranking.rows_gate is not None:
                # a prediction's row columns, queued behind the ranking that picks on the GPU and written where its
                # pick takes them, while the host reads the pick back: after the read-back's copy, not before it
                queued.on_device.read_back.queue_copy()
                written.enter_context(rows_written_once(described, gate=ranking.rows_gate))

    with written:
        with steps("matrix"):  # on the GPU, canonical, named and, where new to the store, described: one round trip
            write_behind.wait(store.path)  # an earlier plan()'s race, still being written
            A_dev, fp, features = device_csr_and_fingerprint(A, dtype=dtype, meanwhile=find,
                                                             describe_if=new_to_store)
        if features is not None:
            steps.rename("matrix", "matrix+features")
        dtype = dtype_name(A_dev.dtype)
        choice = None
        if features is None:  # the store holds a matrix of this shape: this one?
            with steps("lookup"):
                choice = stored_choice(store, fp, device=device, dtype=dtype)
                if choice is None and store.has_legacy_matrix(rows=A_dev.shape[0], cols=A_dev.shape[1],
                                                              nnz=A_dev.nnz):
                    choice = stored_choice(store, legacy_fingerprint(A_dev), device=device, dtype=dtype)
        if choice is None and effort == "race":  # its row entrants and winner share one copy, written while it ranks
            written.enter_context(rows_written_once(A_dev))
        raced = None
        if choice is None:
            if features is None:
                with steps("features"):
                    features = extract_features(A_dev)
            queued = rankings.get(dtype)
            with steps("rank"):  # the GPU's ranking, read back before the reference is queued behind it
                ranked = queued(features) if queued else None
            # a race's reference: on the GPU while the host ranks the configs (where the GPU did not)
            reference = Reference.build(A_dev, dtype, npr_max=int(features["npr_max"]), behind=True) \
                if effort == "race" else None
            with steps("rank"):
                ranking, basis = ranked or rank_configs(store, device=device, dtype=dtype, features=features,
                                                        backend=backend, outcomes=effort != "tune",
                                                        selector=selectors.get(dtype))
            if effort == "tune":
                with steps("tune"):
                    seeds = search_seeds(ranking, size=SEED_CONFIGS, cols=A_dev.shape[1],
                                         itemsize=A_dev.dtype.itemsize, l2_bytes=backend.info.l2_bytes,
                                         features=features)
                    choice = _tuned(A_dev, store=store, backend=backend, dtype=dtype, fp=fp,
                                    trials=DEFAULT_TRIALS if trials is None else trials, seeds=seeds)
            elif effort == "predict":
                choice = (ranked_choice(ranking, basis, nnz=A_dev.nnz, prepare_budget=CHEAP_SPMVS) if ranking
                          else default_choice())
            else:
                with steps("race"):
                    raced = race_matrix(A_dev, backend=backend, store=store, fp=fp, features=features,
                                        race_size=race_size, ranking=ranking, basis=basis, reference=reference,
                                        record_behind=True)
                choice = raced[0]
        with steps("prepare"):
            ex = Executor(A=A_dev, choice=choice, backend=backend, fingerprint=fp,
                          prepared=raced[1].prepared if raced else None)
    ex.race = raced[1] if raced else None
    ex.cost = {**steps.seconds, "total": time.perf_counter() - start}
    return ex


def check_effort(effort: str, trials: int | None, race_size: int) -> None:
    """ValueError, naming the allowed values, for an unknown ``effort``, a bad ``trials`` or ``race_size``."""
    if effort not in EFFORTS:
        raise ValueError(f"unknown effort {effort!r}: one of {', '.join(map(repr, EFFORTS))}")
    if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int) or trials < 0):
        raise ValueError(f"trials must be a non-negative integer (the trials of effort='tune'), got {trials!r}")
    if trials is not None and effort != "tune":
        raise ValueError(f"trials is for effort='tune' only, not effort={effort!r}")
    if isinstance(race_size, bool) or not isinstance(race_size, int) or race_size < 1:
        raise ValueError(f"race_size must be a positive integer, got {race_size!r}")


class _Steps:
    """Wall seconds of each named step of ``plan()``, the GPU's work in it included (synchronized): ``with
    steps(name):``, one step at a time (a class's context, not a generator's: 6 against 11 us a step on an H200
    machine's host after a 64 MB sweep of its caches, 1.0 against 2.4 warm). A step that raises is not counted."""

    def __init__(self, backend: GpuBackend) -> None:
        self.seconds: dict[str, float] = {}
        self._backend = backend
        self._name = ""
        self._start = 0.0

    def __call__(self, name: str) -> _Steps:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self._backend.synchronize()
            self.seconds[self._name] = self.seconds.get(self._name, 0.0) + time.perf_counter() - self._start

    def rename(self, old: str, new: str) -> None:
        """Name a step that turned out to do more than its name said (the matrix's, which described it too)."""
        self.seconds[new] = self.seconds.pop(old)


def race_matrix(A: Any, *, backend: Backend, store: Store, fp: str, features: dict[str, float] | None = None,
                race_size: int = 4, ranking: list[Any] | None = None, basis: str | None = None,
                reference: Reference | None = None, record_behind: bool = False) -> tuple[Choice, RaceResult]:
    """Race the selector's shortlist and cuSPARSE on ``A`` (where ``backend`` runs: the GPU, or the CPU
    references), store every lap with the matrix and the device, and say what won (cuSPARSE's default if
    every entrant failed). ``plan(effort="race")``, ``tuner recommend --race`` and the service's
    ``/recommend?race=true`` all race through here; ``ranking`` is computed from ``features`` when not given.
    ``reference``: A's :class:`~tuner.measure.verify.Reference` where the caller started it (``plan()``: on
    the GPU while the host ranked the configs), else built here. ``record_behind``: the laps are written by
    :mod:`db.write_behind` (``plan()``: they land while the caller's products run; ``result.recorded`` is
    that write), else before this returns. ``result.seconds["reference"]`` is the wait for the reference.
    """
    dtype = dtype_name(A.dtype)
    if features is None:
        features = extract_features(A)
    if ranking is None and basis is None:
        ranking, basis = rank_configs(store, device=backend.info.id, dtype=dtype, features=features,
                                      backend=backend if isinstance(backend, GpuBackend) else None, outcomes=True)
    start = time.perf_counter()
    if reference is None:
        reference = Reference.build(A, dtype)
    backend.synchronize()
    reference_s = time.perf_counter() - start
    itemsize = A.dtype.itemsize
    entrants = adapted(shortlist(ranking, features=features, itemsize=itemsize, size=race_size), ranking,
                       cols=A.shape[1], itemsize=itemsize, l2_bytes=backend.info.l2_bytes)
    bandwidth = backend.copy_bandwidth_gbs()
    floor_s = effective_bytes(A.shape[0], A.shape[1], A.nnz, dtype) / (bandwidth * 1e9)
    result = race(backend, A, entrants, reference, reference.x, floor_s=floor_s)
    device = backend.info.record(bandwidth)

    def record(into: Store) -> None:
        with into.transaction():
            into.add_matrix(fp, name="", rows=A.shape[0], cols=A.shape[1], nnz=A.nnz, features=features)
            into.add_device(device)
            record_race(into, result, fingerprint=fp, device=device["id"], dtype=dtype, shape=A.shape, nnz=A.nnz)

    start = time.perf_counter()
    if record_behind:
        result.recorded = write_behind.submit(store, record)
    else:
        record(store)
    result.seconds = {"reference": reference_s, **result.seconds, "record": time.perf_counter() - start}
    if result.winner is None:
        return default_choice(), result
    e = result.winner.entrant
    t = result.winner.time_s
    return Choice(e.kernel, e.params, "raced", expected_gflops=2 * A.nnz / t / 1e9, time_s=t,
                  cusparse_time_s=result.baseline_s, basis=basis), result


def _tuned(A: Any, *, store: Store, backend: GpuBackend, dtype: str, fp: str, trials: int,
           seeds: list[tuple[str, dict[str, Any]]]) -> Choice:
    """Run the search on ``A`` (its study continues any earlier one), then the store's best."""
    from tuner.search.loop import tune
    from tuner.search.storage import default_storage, open_storage

    tune(A.get(), backend=backend, store=store, storage=open_storage(default_storage(store.path)), dtype=dtype,
         trials=trials, enqueue=seeds)
    return stored_choice(store, fp, device=backend.info.id, dtype=dtype) or default_choice()
