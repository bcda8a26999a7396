"""The tuning loop: optuna ask/tell over the registry's families and spaces.

It knows no family by name: the kernel is a categorical over the registry,
each family's parameters come from its declared :class:`~kernels.Space`, and a
config is measured by :func:`tuner.evaluate.evaluate` on a
:class:`~tuner.backend.Backend`. One study per (matrix fingerprint, device,
dtype, registry version) lives in optuna's storage, so running ``tuner tune``
again continues it; every measurement also goes into the SQLite store.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from db.store import Store
from kernels import BASELINE, REGISTRY, Family, get_family
from tuner.backend import Backend, DeviceInfo, Timing
from tuner.evaluate import ContextLostError, TrialResult, evaluate, time_interleaved
from tuner.features import extract_features, fingerprint
from tuner.io import as_csr
from tuner.metrics import gbps, gflops
from tuner.verify import Reference


def registry_version() -> str:
    """A short hash of every family's name and space: optuna needs fixed distributions
    within a study, so a change to the registry starts new studies (the store keeps the old trials)."""
    text = json.dumps({n: f.space.to_dict() for n, f in sorted(REGISTRY.items())}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def study_name(fp: str, device: DeviceInfo, dtype: str) -> str:
    return f"{fp}|{device.id}|{dtype}|r{registry_version()}"


def config_key(kernel: str, params: dict[str, Any]) -> str:
    return kernel + json.dumps(params, sort_keys=True)


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

    @property
    def best(self) -> FamilySummary | None:
        return min(self.summary, key=lambda s: s.timing.median_s, default=None)


def tune(
    A: Any,
    *,
    backend: Backend,
    store: Store,
    storage: str | optuna.storages.BaseStorage,
    name: str = "",
    dtype: str = "float64",
    trials: int = 40,
    timeout: float | None = None,
    kernels: Sequence[str] | None = None,
    seed: int = 0,
    on_trial: Callable[[TrialResult | None], None] | None = None,
) -> TuneResult:
    """Tune SpMV for ``A`` on ``backend``: ``trials`` more trials (or until ``timeout`` seconds).

    Every family tried gets its default config measured first, so the summary
    always has one row per family. Configs already measured in this study are
    not measured again (optuna is told the stored value; ``on_trial`` gets None).
    """
    families = [get_family(k) for k in (kernels or REGISTRY)]
    A = as_csr(A, dtype=dtype)
    fp = fingerprint(A)
    store.add_matrix(fp, name=name, rows=A.shape[0], cols=A.shape[1], nnz=A.nnz, features=extract_features(A))
    device = backend.info
    bandwidth = backend.copy_bandwidth_gbs()
    store.add_device(device.record(bandwidth))

    reference = Reference.build(A, dtype, seed=seed)
    A_dev, x_dev = backend.matrix(A), backend.vector(reference.x)
    study = optuna.create_study(
        study_name=study_name(fp, device, dtype),
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=seed),
        direction="minimize",
        load_if_exists=True,
    )
    for key, value in {"fingerprint": fp, "device": device.id, "dtype": dtype}.items():
        study.set_user_attr(key, value)
    result = TuneResult(fp, name, A.shape, A.nnz, dtype, device, study.study_name, bandwidth)
    seen = _measured(study)
    tried = {t.params.get("kernel") for t in study.get_trials(deepcopy=False)}
    for f in families:
        if f.name not in tried:
            study.enqueue_trial({"kernel": f.name, **_prefixed(f, f.space.defaults())})
    restricted = {f.name for f in families} != set(REGISTRY)
    rng = np.random.default_rng(seed + len(seen))
    deadline = time.monotonic() + timeout if timeout else float("inf")
    record = {"fingerprint": fp, "device": device.id, "dtype": dtype, "study": study.study_name}

    for _ in range(trials):
        if time.monotonic() > deadline:
            break
        if restricted and not _waiting(study):
            study.enqueue_trial({"kernel": str(rng.choice([f.name for f in families]))})
        trial = study.ask()
        family = get_family(trial.suggest_categorical("kernel", sorted(REGISTRY)))
        params = family.space.suggest(trial, prefix=family.name)
        key = config_key(family.name, params)
        if key in seen:
            study.tell(trial, seen[key])
            if on_trial:
                on_trial(None)
            continue
        try:
            outcome = evaluate(backend, family, A_dev, params, reference, x_dev)
        except ContextLostError as exc:
            _finish(store, study, trial, exc.result, record, A)
            raise
        _finish(store, study, trial, outcome, record, A)
        if outcome.ok:
            seen[key] = outcome.timing.median_s
        result.trials.append(outcome)
        if on_trial:
            on_trial(outcome)

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


def _finish(store: Store, study: optuna.Study, trial: optuna.Trial, outcome: TrialResult,
            record: dict[str, Any], A: Any) -> None:
    """Store the measurement, then tell optuna: a crash between the two loses no measurement."""
    row = {**record, "trial_number": trial.number,
           **outcome.record(shape=A.shape, nnz=A.nnz, dtype=record["dtype"])}
    store.add_trial(row)
    if outcome.ok:
        study.tell(trial, outcome.timing.median_s)
    else:
        trial.set_user_attr("error_kind", outcome.error_kind)
        trial.set_user_attr("error", (outcome.error or "")[:500])
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
