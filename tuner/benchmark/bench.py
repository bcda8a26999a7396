"""The benchmark harness: tuned kernels against cuSPARSE on a matrix suite, in one process.

For each matrix: tune (or reuse what the store holds): one search over every
family, then optionally ``family_trials`` more trials for each family alone (a
joint search of a few dozen trials spends most of them on the families leading
early, so the others would be timed near their defaults), and any ``enqueue``
configs (a :mod:`tuner.select.portfolio`); then time in the same run, interleaved,
cuSPARSE's best config, every family's best config, and the config ``plan()``
would pick without tuning; cold (L2 flushed between repeats)
and warm. Every figure is a ratio to cuSPARSE measured in that same run, and the
bandwidth is a fraction of the copy bandwidth measured in that same run. A
matrix that fails is recorded with its error and the run goes on.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import platform
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from db.store import Store
from kernels import BASELINE, REGISTRY, get_family
from tuner.execute.choice import choose
from tuner.matrix.features import extract_features
from tuner.matrix.fingerprint import fingerprint
from tuner.matrix.sources import Source
from tuner.measure.backend import Backend
from tuner.measure.evaluate import time_interleaved
from tuner.measure.metrics import gbps, gflops
from tuner.measure.verify import Reference
from tuner.search.loop import check_tunable, tune
from tuner.select.shipped import slug

_ROOT = Path(__file__).resolve().parents[2]
"""The top of the tree this code runs from (a checkout's, where it is one)."""
COLUMNS = (
    "suite", "matrix", "fingerprint", "rows", "cols", "nnz", "dtype", "npr_cv", "npr_max", "empty_row_frac",
    "kernel", "family", "params", "time_s", "time_p10_s", "time_p90_s", "warm_time_s", "gflops", "gbps",
    "bandwidth_fraction", "ratio_to_cusparse", "warm_ratio_to_cusparse", "prepare_s", "prepare_spmvs",
    "error",
)
PLAN_LABEL = "plan-untuned"


def environment(backend: Backend) -> dict[str, Any]:
    """Device, driver, library versions and git commit: enough to reproduce a result file."""
    env: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "device": backend.info.id,
        "device_kind": backend.info.kind,
        "driver": backend.info.driver,
        "copy_bandwidth_gbs": backend.copy_bandwidth_gbs(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "optuna": optuna.__version__,
        "git_commit": _git_commit(),
    }
    if backend.info.kind == "gpu":
        cp = backend.cp  # type: ignore[attr-defined]
        env.update(cupy=cp.__version__, cuda_runtime=cp.cuda.runtime.runtimeGetVersion())
    return env


def _git_commit(root: Path = _ROOT) -> str:
    """``$SPMV_GIT_COMMIT`` when set, else the commit of the checkout whose top is ``root`` (this code's), with
    ``+modified`` where its tracked files differ from that commit; ``unknown`` where ``root`` is no checkout's top
    (a tree copied into another checkout's folder, or no checkout at all).

    A tree copied to another machine may carry a stale ``.git`` whose HEAD is not the code that ran (the GPU
    machines' copies do): the variable names the code; without it, ``+modified`` says the commit alone does not.
    """
    if commit := os.environ.get("SPMV_GIT_COMMIT"):
        return commit

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=root).stdout.strip()

    try:
        top, head = git("rev-parse", "--show-toplevel"), git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not re.fullmatch(r"[0-9a-f]{40}", head) or not top or Path(top).resolve() != root.resolve():
        return "unknown"
    return head + ("+modified" if changed else "")


def families_of(kernels: Sequence[str] | None) -> list[str]:
    """The families a benchmark tunes and times: ``kernels`` (all when None) and always the baseline."""
    names = [get_family(k).name for k in (kernels or REGISTRY)]
    return [BASELINE, *(n for n in dict.fromkeys(names) if n != BASELINE)]


def bench_matrix(src: Source, *, backend: Backend, store: Store, storage: Any, dtype: str,
                 trials: int, family_trials: int = 0,
                 enqueue: Sequence[tuple[str, dict[str, Any]]] = (),
                 kernels: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows (one per timed config) for one matrix; raises on failure (the caller records it).

    ``kernels`` limits the families tuned and timed (cuSPARSE, the baseline, always is).
    """
    families = families_of(kernels)
    A = src.load(dtype)
    check_tunable(A, src.name)
    A_dev = backend.matrix(A)
    fp = fingerprint(A_dev)
    device = backend.info.id
    stored = store.best_per_kernel(fp, device=device, dtype=dtype)
    common = {"backend": backend, "store": store, "storage": storage, "name": src.name, "dtype": dtype,
              "summary": False}
    if trials > 0 or not stored:  # with nothing stored, at least every family's default is measured
        tune(A, **common, trials=max(trials, len(families)) + len(enqueue), enqueue=enqueue, kernels=families)
    measured = {b["kernel"] for b in store.best_per_kernel(fp, device=device, dtype=dtype)}
    for family in families:  # a family the search's budget did not reach (the store's seeds ran first) gets one
        if family_trials > 0 or family not in measured:
            tune(A, **common, trials=max(family_trials, 1), kernels=[family])
    bests = [b for b in store.best_per_kernel(fp, device=device, dtype=dtype) if b["kernel"] in families]
    feats = extract_features(A_dev)
    untuned = choose(fp, store=store, device=device, dtype=dtype, use_tuned=False, features=feats)
    labelled = [(b["kernel"], b["kernel"], b["params"]) for b in bests]
    labelled.append((PLAN_LABEL, untuned.kernel, untuned.params))
    configs = [(get_family(family), params) for _, family, params in labelled]

    x_dev = Reference.build(A_dev, dtype).x
    cold = time_interleaved(backend, configs, A_dev, x_dev, flush_l2=True)
    warm = time_interleaved(backend, configs, A_dev, x_dev)
    base = dict(zip([lab for lab, _, _ in labelled], zip(cold, warm, strict=True), strict=True)).get(BASELINE)
    bandwidth = backend.copy_bandwidth_gbs()
    rows = []
    for (label, family, params), (t, prepare_s), (w, _) in zip(labelled, cold, warm, strict=True):
        rate = gbps(A.shape[0], A.shape[1], A.nnz, dtype, t.median_s)
        rows.append({
            "suite": src.suite, "matrix": src.name, "fingerprint": fp, "rows": A.shape[0], "cols": A.shape[1],
            "nnz": A.nnz, "dtype": dtype, "npr_cv": feats["npr_cv"], "npr_max": feats["npr_max"],
            "empty_row_frac": feats["empty_row_frac"], "kernel": label, "family": family,
            "params": json.dumps(params, sort_keys=True), "time_s": t.median_s, "time_p10_s": t.p10_s,
            "time_p90_s": t.p90_s, "warm_time_s": w.median_s, "gflops": gflops(A.nnz, t.median_s),
            "gbps": rate, "bandwidth_fraction": rate / bandwidth if bandwidth else None,
            "ratio_to_cusparse": base[0][0].median_s / t.median_s if base else None,
            "warm_ratio_to_cusparse": base[1][0].median_s / w.median_s if base else None,
            "prepare_s": prepare_s, "prepare_spmvs": prepare_s / t.median_s if t.median_s else None,
            "error": "",
        })
    return rows


def run_bench(srcs: Sequence[Source], *, backend: Backend, store: Store, storage: Any, dtype: str = "float64",
              trials: int = 40, family_trials: int = 0, enqueue: Sequence[tuple[str, dict[str, Any]]] = (),
              kernels: Sequence[str] | None = None, out_dir: str | Path = "bench/results",
              label: str = "matrices", on_matrix: Callable[[Source, str], None] | None = None) -> tuple[Path, Path]:
    """Benchmark every source; write ``<date>_<device>_<label>_<dtype>.csv`` and ``.json`` into ``out_dir``."""
    env = {**environment(backend), "kernels": families_of(kernels)}  # an unknown family fails here
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{env['date'][:10]}_{slug(env['device'])}_{slug(label)}_{dtype}"
    csv_path, json_path = out / f"{stem}.csv", out / f"{stem}.json"
    rows: list[dict[str, Any]] = []
    for src in srcs:
        try:
            rows += bench_matrix(src, backend=backend, store=store, storage=storage, dtype=dtype, trials=trials,
                                 family_trials=family_trials, enqueue=enqueue, kernels=kernels)
            status = "ok"
        except Exception as exc:  # one matrix failing must not end the run: record it
            status = f"{type(exc).__name__}: {exc}"
            rows.append({c: None for c in COLUMNS} | {"suite": src.suite, "matrix": src.name, "dtype": dtype,
                                                       "error": status[:1000]})
        _write(csv_path, json_path, env, rows)  # after every matrix: an interrupted run keeps what it measured
        if on_matrix:
            on_matrix(src, status)
    _write(csv_path, json_path, env, rows)
    return csv_path, json_path


def _write(csv_path: Path, json_path: Path, env: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Replace both result files atomically (a temporary file, then a rename)."""
    tmp = csv_path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(csv_path)
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    tmp.replace(json_path)

