"""What a product costs a caller who runs it in a loop, host included: ``ex(x, out)``, ``ex.bind(x, out)()``, ``A @ x``.

An iterative method runs y = A·x thousands of times, each call from Python. The
benchmarks time the GPU's work (products queued back to back behind a gate); here
the caller's own clock: N calls back to back, one synchronize at the end, wall time
per call, for matrices of ``bench/unseen.py`` shrunk (by default mesh2d, rgg and kkt at
0.005, 0.05 and 0.5 of their size: 0.06-12 M nonzeros; the host's share is the larger,
the smaller the product), planned with the default race on a
store in memory. Beside it, the product's GPU time (warm, as the loop runs it) and
CuPy's ``A @ x`` on the same matrix in the same loop (cuSPARSE through CuPy, which
builds its descriptors on every call: what a CuPy user writes). Ratios are CuPy's time
over ours.

    python bench/loop.py --out bench/results
    python bench/loop.py --only mesh2d,rgg --scales 0.01 0.1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen_matrices import MATRICES  # noqa: E402

from db.store import Store  # noqa: E402
from tuner.benchmark.bench import environment  # noqa: E402
from tuner.execute.plan import plan  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402
from tuner.select.shipped import slug  # noqa: E402

LOOP_SECONDS = 0.2
"""Each loop runs about this long (at least 200 calls)."""


def per_call(fn: Callable[[], object], sync: Callable[[], None], seconds_each: float) -> float:
    """Wall seconds a call of ``fn`` in a loop of them, the GPU's work waited for once at the end."""
    calls = max(200, int(LOOP_SECONDS / max(seconds_each, 1e-6)))
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


def one(backend: GpuBackend, matrix: str, scale: float, A_host: Any, dtype: str) -> dict[str, Any]:
    """One matrix and dtype: plan(), then the product's GPU time and the three loops."""
    import cupy
    import cupyx.scipy.sparse as cusp

    A = cusp.csr_matrix(A_host.astype(dtype))
    ex = plan(A, db=Store(memory=True))
    x = cupy.asarray(np.random.default_rng(0).random(A.shape[1]), dtype=dtype)
    out = cupy.empty(A.shape[0], dtype=dtype)
    bound = ex.bind(x, out)
    gpu_s = float(np.median(backend.time_queued([lambda: ex(x, out)], repeats=7, flush_l2=False)[0]))
    sync = backend.synchronize
    loop_s = per_call(lambda: ex(x, out), sync, gpu_s)
    bound_s = per_call(bound, sync, gpu_s)
    cupy_s = per_call(lambda: A @ x, sync, gpu_s)
    y = bound().get()
    rel = float(np.linalg.norm(y - (A_host.astype(dtype) @ x.get())) / max(np.linalg.norm(y), 1e-300))
    return {"matrix": matrix, "scale": scale, "rows": A.shape[0], "cols": A.shape[1], "nnz": int(A.nnz),
            "dtype": dtype, "kernel": ex.kernel, "params": ex.params, "source": ex.source, "gpu_s": gpu_s,
            "loop_s": loop_s, "bound_s": bound_s, "cupy_s": cupy_s, "captured": bound.captured,
            "reason": bound.reason, "rel_error": rel, "cupy_over_loop": cupy_s / loop_s,
            "cupy_over_bound": cupy_s / bound_s, "loop_over_bound": loop_s / bound_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--only", default="mesh2d,rgg,kkt", help="comma-separated matrices of bench/unseen.py")
    ap.add_argument("--scales", nargs="+", type=float, default=[0.005, 0.05, 0.5], help="size factors")
    ap.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    ap.add_argument("--label", default="", help="added to the result file's name")
    args = ap.parse_args()
    backend = GpuBackend()
    env = environment(backend)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{env['date'][:10]}_{slug(env['device'])}_loop{'-' + args.label if args.label else ''}.json"
    rows: list[dict[str, Any]] = []
    for m in MATRICES:
        if m.name not in args.only.split(","):
            continue
        for scale in args.scales:
            A = m.make(scale)
            for dtype in args.dtype:
                r = one(backend, m.name, scale, A, dtype)
                rows.append(r)
                print(f"{m.name:<12} {r['nnz'] / 1e6:7.2f} M {dtype}: {r['kernel']:<11} GPU {r['gpu_s'] * 1e6:7.1f} us;"
                      f" a call: ex(x, out) {r['loop_s'] * 1e6:7.1f}, bound {r['bound_s'] * 1e6:7.1f}"
                      f"{'' if r['captured'] else ' (not captured)'}, CuPy A @ x {r['cupy_s'] * 1e6:7.1f} us",
                      flush=True)
                path.write_text(json.dumps({"env": env, "rows": rows}, indent=1, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
