"""How many trials a search needs on matrices it has never seen: within 3 % of what a long search finds (issue #21).

For each matrix of ``bench/unseen.py`` (or of a named suite of :mod:`tuner.matrix.suites`, ``--suite
large``: the benchmark harness's large matrices) chosen and each dtype: ``plan(A, effort="tune", trials=N)`` on a
fresh store (the search as a user starts it: seeded with the selector's first configs, then the
defaults, then optuna), then the trials in the order they ran: the best time of all N, the first trial
whose running best is within 3 % of it, the running best after 30 trials as a fraction of the best,
the best against the best cuSPARSE trial, the trials that improved the running best (trial, kernel, params,
seconds: where a search found its best, and what it ran before), and the best's effective bandwidth (compulsory bytes,
:func:`tuner.measure.metrics.gbps`) as a fraction of the copy bandwidth measured in the same process.
Times are the search's own (:func:`tuner.measure.evaluate.evaluate`: warm, products back to back); then
the best and cuSPARSE's two algorithms are timed again cold and interleaved (``cold``: the ratio and the
bandwidth as the benchmarks measure them). ``--reference`` judges a short search against the best a longer
one found on the same kind of GPU (its result files): the first trial within 3 % of the better of the two.

    python bench/convergence.py --trials 200 --out bench/results
    python bench/convergence.py --trials 100 --only communities,perm27 --scale 0.5
    python bench/convergence.py --suite large --trials 60 --dtype float32
    python bench/convergence.py --suite large --trials 30 --reference bench/results/<200-trial run>.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen_matrices import MATRICES  # noqa: E402

from common.jsonfile import read_json  # noqa: E402
from db.store import Store  # noqa: E402
from kernels import BASELINE, BASELINE_CONFIGS, get_family  # noqa: E402
from tuner.benchmark.bench import environment  # noqa: E402
from tuner.execute.plan import plan  # noqa: E402
from tuner.matrix.suites import suite  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402
from tuner.measure.evaluate import time_interleaved  # noqa: E402
from tuner.measure.metrics import gbps  # noqa: E402
from tuner.measure.verify import Reference  # noqa: E402
from tuner.select.shipped import slug  # noqa: E402

WITHIN = 0.03
EARLY = 30


def convergence(times: list[float], *, within: float = WITHIN, early: int = EARLY,
                reference_s: float | None = None) -> dict[str, Any]:
    """From the trials' times in the order they ran (inf: failed): the best, the first trial (1-based)
    whose running best is within ``within`` of it, the running best after ``early`` trials / the best, and
    the trials (1-based) that improved the running best. With ``reference_s`` (the best of a longer search
    of the same matrix on the same kind of GPU), also the first trial within ``within`` of the better of the
    two (``trials_to_within_reference``; None if none is)."""
    times = np.asarray(times, dtype=float)
    running = np.minimum.accumulate(times)
    best = float(running[-1])
    first = int(np.argmax(running <= (1 + within) * best)) + 1
    at_early = float(running[min(early, len(running)) - 1])
    improved = np.flatnonzero(times < np.concatenate([[np.inf], running[:-1]])) + 1
    found = {"best_s": best, "trials_to_within": first, f"best_after_{early}_over_best": best / at_early,
             "improved": improved.tolist()}
    if reference_s is not None:
        close = np.flatnonzero(running <= (1 + within) * min(best, reference_s))
        found |= {"reference_best_s": reference_s,
                  "trials_to_within_reference": int(close[0]) + 1 if close.size else None}
    return found


def one(backend: GpuBackend, name: str, A_host: Any, dtype: str, trials: int,
        reference_s: float | None = None) -> dict[str, Any]:
    import cupyx.scipy.sparse as cusp

    A = cusp.csr_matrix(A_host.astype(dtype))
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.db")
        ex = plan(A, effort="tune", trials=trials, db=store)
        rows = store.trials(ex.fingerprint, device=ex.device, dtype=dtype)
        store.close()
    times = [r["time_s"] if r["state"] == "ok" and r["time_s"] else float("inf") for r in rows]
    cusparse = min((t for t, r in zip(times, rows, strict=True) if r["kernel"] == BASELINE), default=None)
    found = convergence(times, reference_s=reference_s)
    best = rows[int(np.argmin(times))]
    rate = gbps(A.shape[0], A.shape[1], A.nnz, dtype, found["best_s"])
    improved = found.pop("improved")
    row = {"matrix": name, "rows": A.shape[0], "cols": A.shape[1], "nnz": A.nnz, "dtype": dtype,
           "trials": len(rows), **found, "best_kernel": best["kernel"], "best_params": best["params"],
           "improvements": [[i, rows[i - 1]["kernel"], rows[i - 1]["params"], times[i - 1]] for i in improved],
           "cusparse_best_s": cusparse, "ratio_to_cusparse": cusparse / found["best_s"] if cusparse else None,
           "bandwidth_fraction": rate / backend.copy_bandwidth_gbs(), "cold": cold(backend, A, best)}
    print(f"{name:18s} {dtype} {len(rows):4d} trials: within {WITHIN:.0%} at trial {found['trials_to_within']:4d}, "
          f"after {EARLY}: {found[f'best_after_{EARLY}_over_best']:.3f} of the best; best {best['kernel']} "
          f"{row['ratio_to_cusparse'] or float('nan'):.3f}x cuSPARSE, {row['bandwidth_fraction']:.0%} of copy "
          f"(warm); cold {row['cold']['ratio_to_cusparse']:.3f}x, {row['cold']['bandwidth_fraction']:.0%}"
          + (f"; within {WITHIN:.0%} of the reference at trial {found['trials_to_within_reference']}"
             if reference_s is not None else ""), flush=True)
    return row


def cold(backend: GpuBackend, A: Any, best: dict[str, Any]) -> dict[str, float]:
    """The search's best and cuSPARSE's two algorithms timed cold (L2 flushed before every product) and
    interleaved, as the benchmarks time: a search times warm (its products back to back), where a matrix of
    tens of MB keeps part of itself in the L2 from one product to the next."""
    configs = [(best["kernel"], best["params"]), *BASELINE_CONFIGS]
    x = Reference.build(A, str(A.dtype)).x
    timed = time_interleaved(backend, [(get_family(k), p) for k, p in configs], A, x, flush_l2=True)
    best_s, cusparse = timed[0][0].median_s, min(t.median_s for t, _ in timed[1:])
    rate = gbps(A.shape[0], A.shape[1], A.nnz, str(A.dtype), best_s)
    return {"best_s": best_s, "cusparse_best_s": cusparse, "ratio_to_cusparse": cusparse / best_s,
            "bandwidth_fraction": rate / backend.copy_bandwidth_gbs()}


def makers(suite_name: str, scale: float = 1.0) -> dict[str, Callable[[], Any]]:
    """Each matrix of a suite by name, to build on the host: 'unseen' (bench/unseen.py's, at ``scale``) or a
    suite of :mod:`tuner.matrix.suites`."""
    if suite_name == "unseen":
        return {m.name: functools.partial(m.make, scale) for m in MATRICES}
    return {m.name: m.build for m in suite(suite_name)}


def reference_bests(paths: list[Path]) -> dict[tuple[str, str], float]:
    """(matrix, dtype) -> the best time any of these result files found for it."""
    best: dict[tuple[str, str], float] = {}
    for path in paths:
        for row in read_json(path)["rows"]:
            key = (row["matrix"], row["dtype"])
            best[key] = min(best.get(key, float("inf")), row["best_s"])
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--suite", default="unseen", help="'unseen' (bench/unseen.py's matrices) or a suite of "
                    "tuner.matrix.suites (large, graphs, ...)")
    ap.add_argument("--only", default="", help="comma-separated matrix names of the suite")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor of the unseen matrices")
    ap.add_argument("--label", default="", help="added to the result file's name (runs of a day kept apart)")
    ap.add_argument("--reference", nargs="+", default=[], type=Path,
                    help="result files of a longer search on this kind of GPU: each row is also judged against "
                    "the best they found for its matrix and dtype")
    args = ap.parse_args()
    reference = reference_bests(args.reference)
    backend = GpuBackend()
    env = environment(backend)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "convergence" + ("" if args.suite == "unseen" else f"-{args.suite}") \
        + (f"-{args.label}" if args.label else "")
    path = out / f"{env['date'][:10]}_{slug(env['device'])}_{name}.json"
    rows: list[dict[str, Any]] = []
    for matrix, make in makers(args.suite, args.scale).items():
        if args.only and matrix not in args.only.split(","):
            continue
        A = make()
        for dtype in args.dtype:
            rows.append(one(backend, matrix, A, dtype, args.trials, reference.get((matrix, dtype))))
            path.write_text(json.dumps({"env": env, "suite": args.suite, "scale": args.scale, "within": WITHIN,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
