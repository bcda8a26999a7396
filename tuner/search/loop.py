"""The tuning loop: optuna ask/tell over the registry's families and spaces.

It knows no family by name: the kernel is a categorical over the registry,
each family's parameters come from its declared :class:`~kernels.Space`, and a
config is measured by :func:`tuner.measure.evaluate.evaluate` on a
:class:`~tuner.measure.backend.Backend`. One study per (matrix fingerprint, device,
dtype, registry version) lives in optuna's storage, so running ``tuner tune``
again continues it; every measurement also goes into the SQLite store.

Many workers share a study through one storage (``tuner tune-many``): with
``total=N`` each worker stops once the study holds N *finished* trials (COMPLETE
or FAIL) across all of them, exactly N (see :class:`tuner.search.study.Budget`);
every trial's full record is kept in its user attrs (``record``) so ``tuner
sync`` can rebuild the store's rows from optuna alone; and, when the storage has
heartbeats, every asked trial beats while it runs and stale trials are failed
before each ask. A family that refuses the matrix whatever its parameters (``not_applicable``:
rcm on a small-world graph, rowsort on rows in order) is sampled no more on it: optuna's
further picks of it are pruned and do not count as trials.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import optuna
from optuna.storages._heartbeat import get_heartbeat_thread
from optuna.trial import TrialState

from common.errors import MatrixFormatError
from db.store import Store
from kernels import BASELINE, REGISTRY, Family, config_key, get_family, with_adapted
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import SCHEME, fingerprint
from tuner.matrix.io import as_csr
from tuner.measure.backend import Backend, DeviceInfo, Timing
from tuner.measure.evaluate import NOT_APPLICABLE, ContextLostError, TrialResult, evaluate, time_interleaved
from tuner.measure.metrics import gbps, gflops
from tuner.measure.verify import Reference
from tuner.search.seeds import seed_configs, unique_valid
from tuner.search.study import (
    CACHED_ATTR,
    DEFAULT_ATTR,
    RECORD_ATTR,
    SOURCE_ATTR,
    SURPLUS_ATTR,
    UID_ATTR,
    Budget,
    fail_stale_trials,
    keeps_place,
    repeats_queued,
    settle,
    study_budget,
    study_name,
)

_log = logging.getLogger(__name__)


@dataclass
class FamilySummary:
    """A family's best config, re-timed beside cuSPARSE at the end of a run."""

    kernel: str
    params: dict[str, Any]
    timing: Timing
    gflops: float
    gbps: float
    bandwidth_fraction: float
    ratio_to_cusparse: float | None
    prepare_s: float | None


@dataclass
class TuneResult:
    fingerprint: str
    name: str
    shape: tuple[int, int]
    nnz: int
    dtype: str
    device: DeviceInfo
    study: str
    copy_bandwidth_gbs: float
    trials: list[TrialResult] = field(default_factory=list)
    summary: list[FamilySummary] = field(default_factory=list)
    budget: Budget | None = None  # with total=N: where the study stood when this call returned

    @property
    def best(self) -> FamilySummary | None:
        return min(self.summary, key=lambda s: s.timing.median_s, default=None)


def check_tunable(A: Any, name: str = "") -> None:
    """Refuse a matrix without rows or columns: it has no product worth timing (``plan()`` still takes one)."""
    if 0 in A.shape:
        raise MatrixFormatError(f"{name or 'the matrix'} is {A.shape[0]} x {A.shape[1]}: a matrix without rows "
                                "or columns has nothing to tune")


def tune(
    A: Any,
    *,
    backend: Backend,
    store: Store | None,
    storage: str | optuna.storages.BaseStorage,
    name: str = "",
    dtype: str = "float64",
    trials: int = 40,
    timeout: float | None = None,
    kernels: Sequence[str] | None = None,
    seed: int = 0,
    on_trial: Callable[[TrialResult | None], None] | None = None,
    total: int | None = None,
    summary: bool = True,
    source: str | None = None,
    enqueue: Sequence[tuple[str, dict[str, Any]]] = (),
) -> TuneResult:
    """Tune SpMV for ``A`` on ``backend``: ``trials`` more trials (or until ``timeout`` seconds).

    Every family tried gets a config measured first (one of ``enqueue``, else its
    default), so the summary always has one row per family. Configs already measured in this study are
    not measured again (optuna is told the stored value; ``on_trial`` gets None).

    ``total=N`` (for many workers on one study): stop as soon as the study
    holds N finished (COMPLETE or FAIL) trials across every worker, or its
    last trials are running elsewhere (``result.budget`` says which); ``trials``
    still caps this call. ``store=None`` writes no SQLite row (the trials'
    ``record`` user attrs keep everything; ``tuner sync`` copies them), and
    ``summary=False`` skips the final re-timing. ``source`` (a generated
    matrix's :attr:`~tuner.matrix.suites.SuiteMatrix.key`) is kept in the study's
    user attrs (:data:`SOURCE_ATTR`), so a later run finds the study without
    building the matrix. ``enqueue`` (``(kernel, params)`` pairs, e.g. a
    :mod:`tuner.select.portfolio`, the selector's first configs) is measured before the
    defaults, each config once per study (so a budget of a few trials runs what is
    known rather than a default of every family); those of families outside
    ``kernels`` are left out. With a store, what it knows goes first
    (:func:`tuner.search.seeds.seed_configs`: this matrix's best in the other
    dtype, the bests of the tuned matrices nearest in features).
    """
    families = [get_family(k) for k in (kernels or REGISTRY)]
    A = as_csr(A, dtype=dtype)
    check_tunable(A, name)
    A_dev = backend.matrix(A)  # fingerprint, features and reference where the kernels run: on the GPU, fast
    fp = fingerprint(A_dev)
    features = extract_features(A_dev)
    device = backend.info
    bandwidth = backend.copy_bandwidth_gbs()
    if store is not None:
        store.add_matrix(fp, name=name, rows=A.shape[0], cols=A.shape[1], nnz=A.nnz, features=features)
        store.add_device(device.record(bandwidth))
        # what the store knows first: this matrix in the other dtype, the tuned matrices nearest to it
        enqueue = seed_configs(store, fingerprint=fp, device=device.id, dtype=dtype, features=features) + list(enqueue)
    # the first known config as its family fits it to this matrix and GPU, second (NuT's slabs to the L2)
    enqueue = with_adapted(unique_valid(enqueue), cols=A.shape[1], itemsize=np.dtype(dtype).itemsize,
                           l2_bytes=device.l2_bytes)

    reference = Reference.build(A_dev, dtype, seed=seed)
    x_dev = reference.x
    study = optuna.create_study(
        study_name=study_name(fp, device, dtype),
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=seed),
        direction="minimize",
        load_if_exists=True,
    )
    attrs = {
        "fingerprint": fp, "device": device.id, "dtype": dtype,
        # what `tuner sync` needs to add the matrix and the device to a store that has never seen them
        "matrix": _jsonable({"name": name, "rows": A.shape[0], "cols": A.shape[1], "nnz": A.nnz,
                             "features": features, "fingerprint_scheme": SCHEME}),
        "device_record": _jsonable(device.record(bandwidth)),
        **({SOURCE_ATTR: source} if source else {}),
    }
    for key, value in attrs.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)
    result = TuneResult(fp, name, A.shape, A.nnz, dtype, device, study.study_name, bandwidth)
    seen = _measured(study)
    current = study.get_trials(deepcopy=False)
    tried = {t.params.get("kernel") for t in current}
    refused = {t.params.get("kernel") for t in current if t.user_attrs.get("error_kind") == NOT_APPLICABLE}
    if store is not None:  # a study shared with another store: measure again what this store lacks
        rows = store.trials(fp, device=device.id, dtype=dtype)
        stored = {config_key(r["kernel"], r["params"]) for r in rows if r["state"] == "ok"}
        seen = {k: v for k, v in seen.items() if k in stored}
        tried = {r["kernel"] for r in rows}
        refused |= {r["kernel"] for r in rows if r["error_kind"] == NOT_APPLICABLE}
    if total is None or study_budget(study, total, current).open:
        names = {f.name for f in families}
        queue = [(get_family(k), p) for k, p in enqueue if k in names]  # what is known first: a short budget
        waiting = {(t.system_attrs.get("fixed_params") or {}).get("kernel") for t in current
                   if t.state == TrialState.WAITING}  # queued by an earlier run that ended before them
        untried = [f for f in families if f.name not in tried | waiting | {f.name for f, _ in queue}]
        if total is not None:  # no more defaults than the budget has places left
            untried = untried[: max(0, total - sum(t.state != TrialState.PRUNED for t in current))]
        queue += [(f, f.space.defaults()) for f in untried]
        for f, params in queue:  # skip_if_exists: a config the study holds (or has queued) is not queued again
            study.enqueue_trial({"kernel": f.name, **_prefixed(f, params)},
                                user_attrs={DEFAULT_ATTR: True} if total is not None else None,
                                skip_if_exists=total is not None or bool(enqueue))
    restricted = {f.name for f in families} != set(REGISTRY)
    rng = np.random.default_rng(seed + len(seen))
    deadline = time.monotonic() + timeout if timeout is not None else float("inf")
    record = {"fingerprint": fp, "device": device.id, "dtype": dtype, "study": study.study_name}

    ran = 0
    while ran < trials:
        if time.monotonic() > deadline or not {f.name for f in families} - refused:
            break
        if total is None:
            fail_stale_trials(study)
        else:
            if not settle(study, total).open:
                break
            for key, value in _measured(study).items():  # what the other workers measured meanwhile
                seen.setdefault(key, value)
        if restricted and not _waiting(study):
            study.enqueue_trial({"kernel": str(rng.choice([f.name for f in families if f.name not in refused]))})
        with warnings.catch_warnings():  # heartbeats with ask/tell are what this loop is built for
            warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
            trial = study.ask()
        if total is not None and (not keeps_place(study, trial, total) or repeats_queued(study, trial)):
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # or pruned by settle()
                trial.set_user_attr(SURPLUS_ATTR, True)
                study.tell(trial, state=TrialState.PRUNED)
            continue
        ran += 1
        with get_heartbeat_thread(trial._trial_id, study._storage):
            uid = uuid.uuid4().hex
            trial.set_user_attr(UID_ATTR, uid)
            family = get_family(trial.suggest_categorical("kernel", sorted(REGISTRY)))
            if family.name in refused:  # it refused this matrix whatever its parameters: not a trial of the budget
                ran -= 1
                _tell(study, trial, state=TrialState.PRUNED)
                continue
            params = family.space.suggest(trial, prefix=family.name)
            key = config_key(family.name, params)
            if key in seen:
                trial.set_user_attr(CACHED_ATTR, True)
                _tell(study, trial, seen[key])
                if on_trial:
                    on_trial(None)
                continue
            try:
                outcome = evaluate(backend, family, A_dev, params, reference, x_dev)
            except ContextLostError as exc:
                _finish(store, study, trial, exc.result, {**record, "trial_uid": uid}, A)
                raise
            _finish(store, study, trial, outcome, {**record, "trial_uid": uid}, A)
        if outcome.ok:
            seen[key] = outcome.timing.median_s
        elif outcome.error_kind == NOT_APPLICABLE:
            refused.add(family.name)
        result.trials.append(outcome)
        if on_trial:
            on_trial(outcome)

    if total is not None:
        result.budget = study_budget(study, total)
    if summary and store is not None:
        result.summary = summarize(backend, store, A, A_dev, x_dev, fp=fp, dtype=dtype, families=families)
    return result


def summarize(
    backend: Backend,
    store: Store,
    A: Any,
    A_dev: Any,
    x_dev: Any,
    *,
    fp: str,
    dtype: str,
    families: Sequence[Family],
) -> list[FamilySummary]:
    """Re-time each family's stored best beside cuSPARSE's, interleaved in this process."""
    device = backend.info
    names = {f.name for f in families} | {BASELINE}
    bests = [b for b in store.best_per_kernel(fp, device=device.id, dtype=dtype) if b["kernel"] in names]
    if not bests:
        return []
    configs = [(get_family(b["kernel"]), b["params"]) for b in bests]
    timings = time_interleaved(backend, configs, A_dev, x_dev)
    base = {b["kernel"]: t for b, (t, _) in zip(bests, timings, strict=True)}.get(BASELINE)
    if base is not None:
        store.set_cusparse_time(fp, device=device.id, dtype=dtype, time_s=base.median_s)
    bandwidth = backend.copy_bandwidth_gbs()
    rows, cols = A.shape
    out = []
    for b, (t, prepare_s) in zip(bests, timings, strict=True):
        rate = gbps(rows, cols, A.nnz, dtype, t.median_s)
        out.append(
            FamilySummary(
                kernel=b["kernel"],
                params=b["params"],
                timing=t,
                gflops=gflops(A.nnz, t.median_s),
                gbps=rate,
                bandwidth_fraction=rate / bandwidth if bandwidth else 0.0,
                ratio_to_cusparse=base.median_s / t.median_s if base else None,
                prepare_s=prepare_s,
            )
        )
    return sorted(out, key=lambda s: s.timing.median_s)


def _prefixed(family: Family, params: dict[str, Any]) -> dict[str, Any]:
    return {f"{family.name}.{k}": v for k, v in params.items()}


def _measured(study: optuna.Study) -> dict[str, float]:
    """Config key → time for the study's completed trials (from any earlier run or worker)."""
    out = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        kernel = t.params.get("kernel")
        if kernel in REGISTRY:
            prefix = f"{kernel}."
            params = {k.removeprefix(prefix): v for k, v in t.params.items() if k.startswith(prefix)}
            out.setdefault(config_key(kernel, params), t.value)
    return out


def _waiting(study: optuna.Study) -> bool:
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _finish(store: Store | None, study: optuna.Study, trial: optuna.Trial, outcome: TrialResult,
            record: dict[str, Any], A: Any) -> None:
    """Store the measurement, keep it in the trial's user attrs, then tell optuna.

    A crash between any two steps loses no measurement: the store row and the
    ``record`` attr are written before the trial is told (``tuner sync`` copies a
    record even from a trial that was failed after its worker died).
    """
    row = {**record, "trial_number": trial.number, "created_at": datetime.now(UTC).isoformat(timespec="microseconds"),
           **outcome.record(shape=A.shape, nnz=A.nnz, dtype=record["dtype"])}
    if store is not None:
        store.add_trial(row)
    try:
        trial.set_user_attr(RECORD_ATTR, _jsonable(row))
        if outcome.ok:
            study.tell(trial, outcome.timing.median_s)
        else:
            trial.set_user_attr("error_kind", outcome.error_kind)
            trial.set_user_attr("error", (outcome.error or "")[:500])
            study.tell(trial, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        _log.warning("trial %d of %s was failed by another worker (no heartbeat for its grace period) before "
                     "its result came in; the result is kept only in this process's store", trial.number,
                     study.study_name)


def _tell(study: optuna.Study, trial: optuna.Trial, value: float | None = None,
          state: TrialState | None = None) -> None:
    try:
        study.tell(trial, value, state=state)
    except optuna.exceptions.UpdateFinishedTrialError:
        _log.warning("trial %d of %s was failed by another worker before it was told", trial.number,
                     study.study_name)


def _jsonable(value: Any) -> Any:
    """``value`` with NumPy scalars made plain Python numbers, for optuna's JSON user attrs."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
