"""SpMSpV on the GPU: both modes over a grid of x fill fractions, the SVM mode selector, and BFS.

Three parts, in one process on one GPU (each figure a median of repeats timed
with the host clock around a call and a device synchronize, since a mode's
call includes its own host synchronisations):

1. ``fill``: for each matrix (generated graphs and non-graphs up to ~50 M
   nonzeros, the BFS's pattern(G)ᵀ of a few graphs, and the shared matrices
   with ``--shared``) and each fill fraction,
   the time of the sparse mode (both merges), the dense mode as ``plan(A,
   op="spmspv")`` runs it (the SpMV ``plan(A)`` picks: here the shipped
   selector's prediction), the dense mode with the paper's NuT, and cuSPARSE's
   SpMV with the dense x. Each matrix's modes are checked against SciPy at one
   fill first. The sparse (default merge) and planned dense times go into the
   store's ``spmspv_trials``.
2. ``selector``: the SVM trained on those rows, evaluated by GroupKFold over
   matrices (accuracy, total time against the per-call oracle, beside always
   sparse, always dense and the default rule), then fitted on everything,
   stored in ``models`` and written to ``--out`` as the shipped pickle.
3. ``bfs``: BFS from vertex 0 on graphs: per step the frontier size and the
   time of each mode (the dense one planned, and with NuT) and of a cuSPARSE
   step (dense frontier, SpMV, new vertices); totals for the hybrid (the
   selector's mode per step), always sparse, always dense, cuSPARSE and the
   per-step oracle; plus end-to-end ``tuner.execute.algorithms.bfs`` wall times of the
   hybrid and both fixed modes, taken round-robin.

Usage (on a GPU machine)::

    python bench/spmspv.py --db /tmp/spmspv.db --out bench/results [--shared DIR] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from db.store import Store  # noqa: E402
from kernels import get_family  # noqa: E402
from kernels.spmspv import DENSE, SPARSE  # noqa: E402
from tuner.execute.algorithms import bfs, frontier_matrix  # noqa: E402
from tuner.execute.choice import choose  # noqa: E402
from tuner.execute.spmspv import plan_spmspv  # noqa: E402
from tuner.matrix.features import extract_features  # noqa: E402
from tuner.matrix.fingerprint import fingerprint  # noqa: E402
from tuner.matrix.io import read_mtx  # noqa: E402
from tuner.matrix.suites import SuiteMatrix  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402
from tuner.select import spmspv_selector  # noqa: E402
from tuner.select.shipped import slug  # noqa: E402

FILLS = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 2e-2, 3e-2, 5e-2, 0.1, 0.15, 0.3, 1.0)
MATRICES = tuple(SuiteMatrix(kind, size) for kind, size in (  # graphs (square, small diameter), non-graphs,
    ("powerlaw", 1 << 12), ("powerlaw", 1 << 14), ("powerlaw", 1 << 16), ("powerlaw", 1 << 18),
    ("powerlaw", 1 << 20), ("powerlaw", 2_000_000),
    ("uniform", 1 << 12), ("uniform", 1 << 14), ("uniform", 1 << 16), ("uniform", 1 << 18),
    ("uniform", 1 << 20), ("uniform", 3_000_000),
    ("poisson2d", 128), ("poisson2d", 512), ("poisson2d", 2000), ("poisson3d", 32), ("poisson3d", 100),
    ("banded", 1 << 16), ("banded", 1 << 20), ("fewhuge", 1 << 18), ("emptyrows", 1 << 16),
    ("emptyrows", 1 << 20), ("lp", 1 << 13), ("lp", 1 << 16), ("tallskinny", 1 << 20),  # 16 K to ~50 M nonzeros
))
FRONTIER = tuple(SuiteMatrix(kind, size) for kind, size in (  # BFS multiplies by pattern(G)ᵀ: train on such too
    ("powerlaw", 1 << 16), ("powerlaw", 1 << 20), ("uniform", 1 << 16), ("uniform", 1 << 20),
    ("uniform", 1_500_000)))  # (not the sizes of BFS_GRAPHS, whose BFS the selector is judged on)
BFS_GRAPHS = tuple(SuiteMatrix(kind, size) for kind, size in (
    ("powerlaw", 1 << 18), ("uniform", 1 << 18), ("powerlaw", 2_000_000), ("uniform", 3_000_000), ("poisson2d", 700)))
QUICK = tuple(SuiteMatrix(kind, size) for kind, size in (
    ("powerlaw", 1 << 12), ("uniform", 1 << 12), ("poisson2d", 64), ("lp", 1 << 10)))


def once(cp: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Seconds of one call of ``fn`` between two device synchronisations."""
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t0


def wall(cp: Any, repeats: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """Median seconds of ``fn(*args, **kwargs)`` (:func:`once`), after one warm-up call."""
    fn(*args, **kwargs)
    return statistics.median(once(cp, fn, *args, **kwargs) for _ in range(repeats))


def random_x(cp: Any, n: int, k: int, seed: int, dtype: str) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(n, size=k, replace=False) if k < n else np.arange(n)).astype(np.int32)
    return cp.asarray(idx), cp.asarray(rng.uniform(0.5, 1.0, k).astype(dtype))


class CuSparseStep:
    """y = A·x by cuSPARSE with x scattered dense from a sparse one, nonzeros found after (the baseline)."""

    def __init__(self, cp: Any, A_dev: Any) -> None:
        self.cp, self.family = cp, get_family("cusparse")
        self.prepared = self.family.prepare(A_dev)
        self.x = cp.zeros(A_dev.shape[1], dtype=A_dev.dtype)
        self.y = cp.empty(A_dev.shape[0], dtype=A_dev.dtype)

    def __call__(self, idx: Any, val: Any) -> Any:
        self.x.fill(0)
        self.x[idx] = val
        self.family.run(self.prepared, self.x, self.y)
        return self.cp.flatnonzero(self.y).astype(self.cp.int32)


def measure_fills(cp: Any, store: Store, device: str, name: str, A: Any, dtype: str, repeats: int,
                  fills: tuple[float, ...]) -> list[dict[str, Any]]:
    import cupyx.scipy.sparse as cusp

    A_dev = cusp.csr_matrix(A)
    fp = fingerprint(A)
    features = extract_features(A)
    store.add_matrix(fp, name=name, rows=A.shape[0], cols=A.shape[1], nnz=A.nnz, features=features)
    t0 = time.perf_counter()
    sparse = SPARSE.prepare(A_dev)
    cp.cuda.Device().synchronize()
    prep_sparse = time.perf_counter() - t0
    sort = SPARSE.prepare(A_dev, {"merge": "sort"})
    choice = choose(fp, store=store, device=device, dtype=dtype, features=features)
    t0 = time.perf_counter()
    dense = DENSE.prepare(A_dev, {"kernel": choice.kernel, **choice.params})  # as plan(A, op="spmspv") does
    cp.cuda.Device().synchronize()
    prep_dense = time.perf_counter() - t0
    nut = DENSE.prepare(A_dev, {"kernel": "nut"})
    cus = CuSparseStep(cp, A_dev)
    # Correctness first: both modes against SciPy at one fill.
    n = A.shape[1]
    idx, val = random_x(cp, n, max(1, n // 100), 7, dtype)
    x = np.zeros(n)
    x[idx.get()] = val.get()
    want = A.astype(np.float64) @ x
    for mode, prepared in ((SPARSE, sparse), (SPARSE, sort), (DENSE, dense), (DENSE, nut)):
        got_idx, got_val = (a.get() for a in mode.run(prepared, idx, val))
        y = np.zeros(A.shape[0])
        y[got_idx] = got_val
        tol = (1e-4 if dtype == "float32" else 1e-10) * (np.abs(A).astype(np.float64) @ np.abs(x) + 1e-30)
        if not np.all(np.abs(y - want) <= tol):
            bad = np.flatnonzero(np.abs(y - want) > tol)
            raise AssertionError(f"{name}: {mode.name} {prepared.params} disagrees with SciPy at {bad.size} rows, "
                                 f"e.g. row {bad[0]}: {y[bad[0]]} != {want[bad[0]]}")
    spmv = wall(cp, repeats, cus.family.run, cus.prepared, cus.x, cus.y)
    rows, trials = [], []
    for f_i, fill in enumerate(fills):
        k = max(1, min(n, round(fill * n)))
        if rows and k == rows[-1]["x_nnz"]:
            continue
        idx, val = random_x(cp, n, k, f_i, dtype)
        t = {
            "sparse": wall(cp, repeats, SPARSE.run, sparse, idx, val),
            "sparse_sort": wall(cp, repeats, SPARSE.run, sort, idx, val),
            "dense": wall(cp, repeats, DENSE.run, dense, idx, val),
            "dense_nut": wall(cp, repeats, DENSE.run, nut, idx, val),
            "cusparse": wall(cp, repeats, cus, idx, val),
        }
        rows.append({"matrix": name, "fingerprint": fp, "rows": A.shape[0], "cols": n, "nnz": A.nnz, "dtype": dtype,
                     "fill": k / n, "x_nnz": k, **{f"{m}_s": v for m, v in t.items()}, "spmv_s": spmv,
                     "dense_kernel": choice.kernel,
                     "faster": "sparse" if t["sparse"] < t["dense"] else "dense",
                     "prep_sparse_spmvs": prep_sparse / spmv, "prep_dense_spmvs": prep_dense / spmv,
                     "csc_vs_csr": SPARSE.structure_bytes(sparse) / (A.data.nbytes + A.indices.nbytes
                                                                    + A.indptr.nbytes),
                     "nut_vs_csr": DENSE.structure_bytes(nut) / (A.data.nbytes + A.indices.nbytes
                                                                + A.indptr.nbytes)})
        for mode in ("sparse", "dense"):
            trials.append({"fingerprint": fp, "device": device, "dtype": dtype, "mode": mode,
                           "params": (sparse if mode == "sparse" else dense).params, "x_nnz": k, "x_seed": f_i,
                           "time_s": t[mode]})
    store.add_spmspv_trials(trials)
    return rows


def train(store: Store, device: str, dtype: str, out: Path, label: str) -> dict[str, Any]:
    """The selector (:func:`tuner.select.spmspv_selector.train`), shipped into ``out`` with its report."""
    model, report = spmspv_selector.train(store, device=device, dtype=dtype)
    if model is None:
        print(f"selector not trained: {report['not_trained']}", flush=True)
        return report
    spmspv_selector.ship(model, device=device, dtype=dtype, metrics=report, folder=out)
    (out / f"{label}_spmspv_selector_{dtype}.json").write_text(json.dumps(report, indent=2))
    return report


def bfs_steps(cp: Any, G: Any, store: Store, repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-step times of every strategy, and end-to-end BFS wall times, for one graph."""
    import cupyx.scipy.sparse as cusp

    B = frontier_matrix(G)
    ex = plan_spmspv(B, db=store)
    B_dev = cusp.csr_matrix(B)
    cus = CuSparseStep(cp, B_dev)
    nut = DENSE.prepare(B_dev, {"kernel": "nut"})
    n = B.shape[0]
    levels = cp.full(n, -1, dtype=cp.int32)
    levels[0] = 0
    frontier = cp.asarray([0], dtype=cp.int32)
    steps, depth = [], 0
    while frontier.shape[0]:
        depth += 1
        ones = cp.ones(frontier.shape[0], dtype=ex.dtype)
        t = {mode: wall(cp, repeats, ex.run, frontier, ones, mode=mode) for mode in ("sparse", "dense")}
        t["dense_nut"] = wall(cp, repeats, DENSE.run, nut, frontier, ones)
        t["cusparse"] = wall(cp, repeats, cus, frontier, ones)
        chosen = ex.choose_mode(int(frontier.shape[0]))
        reached, _ = ex.run(frontier, ones, mode="sparse")
        steps.append({"step": depth, "frontier": int(frontier.shape[0]), "fill": frontier.shape[0] / n,
                      **{f"{m}_s": v for m, v in t.items()}, "chosen": chosen,
                      "oracle": "sparse" if t["sparse"] < t["dense"] else "dense"})
        frontier = reached[levels[reached] < 0]
        levels[frontier] = depth
    want = levels.get()
    totals = {m: sum(s[f"{m}_s"] for s in steps) for m in ("sparse", "dense", "dense_nut", "cusparse")}
    totals["oracle"] = sum(min(s["sparse_s"], s["dense_s"]) for s in steps)
    totals["hybrid"] = sum(s[f"{s['chosen']}_s"] for s in steps)
    strategies = {"hybrid": None, "sparse": "sparse", "dense": "dense"}
    for label, mode in strategies.items():  # right, and warm
        if not np.array_equal(bfs(G, 0, mode=mode, executor=ex), want):
            raise AssertionError(f"bfs {label} levels differ from the step-by-step run")
    runs: dict[str, list[float]] = {label: [] for label in strategies}
    for _ in range(max(5, repeats // 2)):  # round-robin, so that clock and cache drift hit all alike
        for label, mode in strategies.items():
            runs[label].append(once(cp, bfs, G, 0, mode=mode, executor=ex))
    end_to_end = {label: statistics.median(t) for label, t in runs.items()}
    summary = {"vertices": n, "edges": int(B.nnz), "levels": depth - 1, "reached": int((want >= 0).sum()),
               "selector": ex.selector_source, "crossover_fill": ex.crossover(),
               "dense_kernel": ex.params["dense"]["kernel"],
               **{f"steps_total_{k}_s": v for k, v in totals.items()},
               **{f"bfs_{k}_s": v for k, v in end_to_end.items()}}
    return steps, summary


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="store that receives the measurements and the selector")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--shared", type=Path, help="folder of shared .mtx.gz matrices to include")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="a few small matrices (a smoke test)")
    args = ap.parse_args(argv)
    backend = GpuBackend()
    cp = backend.cp
    store = Store(args.db)
    device = store.add_device(backend.info.record())
    label = f"{dt.date.today().isoformat()}_{slug(device)}"
    args.out.mkdir(parents=True, exist_ok=True)

    matrices = [(m.name, lambda m=m: m.build(args.dtype)) for m in (QUICK if args.quick else MATRICES)]
    matrices += [(f"{m.name}-frontier", lambda m=m: frontier_matrix(m.build(args.dtype)))
                 for m in (QUICK[:1] if args.quick else FRONTIER)]
    if args.shared:
        matrices += [(p.name.split(".")[0], lambda p=p: read_mtx(p, dtype=args.dtype))
                     for p in sorted(args.shared.glob("*.mtx.gz"))]
    fill_rows = []
    for i, (name, load) in enumerate(matrices):
        try:
            A = load()
            if A.nnz == 0:
                continue
            got = measure_fills(cp, store, device, name, A, args.dtype, args.repeats, FILLS)
        except Exception as exc:  # a matrix that fails is reported and the run goes on
            print(f"[{i + 1}/{len(matrices)}] {name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            continue
        fill_rows += got
        cross = next((r["fill"] for r in got if r["faster"] == "dense"), None)
        print(f"[{i + 1}/{len(matrices)}] {name} nnz={A.nnz} dense wins from fill {cross}", flush=True)
    write_csv(args.out / f"{label}_spmspv_fill_{args.dtype}.csv", fill_rows)

    report = train(store, device, args.dtype, args.out, label)
    print(json.dumps(report, indent=1), flush=True)

    summaries, all_steps = [], []
    for graph in (QUICK[:2] if args.quick else BFS_GRAPHS):
        steps, summary = bfs_steps(cp, graph.build(args.dtype), store, args.repeats)
        all_steps += [{"graph": graph.name, **s} for s in steps]
        summaries.append({"graph": graph.name, **summary})
        print(json.dumps(summaries[-1]), flush=True)
    write_csv(args.out / f"{label}_bfs_steps_{args.dtype}.csv", all_steps)
    write_csv(args.out / f"{label}_bfs_{args.dtype}.csv", summaries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
