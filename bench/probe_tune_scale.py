"""plan(effort="tune") on the issue18 suite's matrices at a larger size: its wall time and the GPU memory it takes.

For each matrix named (the first word of an issue18 suite name: bipartite, emptyrows, ...), built at ``--scale``
times its size and put on the GPU: ``plan(A, effort="tune", trials=N)`` on a new store in a temporary folder, the
wall time, the bytes CuPy's pool holds before (the matrix) and after (its peak, the pool keeping what was freed),
and the tuned best. Result: ``bench/results/2026-11-29_H200_tune-scale-66.txt``.

    python bench/probe_tune_scale.py --only bipartite,emptyrows --scale 6 --trials 12
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from unseen_matrices import from_suite  # noqa: E402

from db.store import Store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="bipartite,emptyrows", help="comma-separated first words of issue18 names")
    ap.add_argument("--scale", type=float, default=6.0)
    ap.add_argument("--trials", type=int, default=12)
    args = ap.parse_args()
    import cupy
    import cupyx.scipy.sparse as cusp

    from tuner import plan

    pool = cupy.get_default_memory_pool()
    for m in from_suite("issue18"):
        if m.name.split("-")[0] not in args.only.split(","):
            continue
        start = time.perf_counter()
        A = cusp.csr_matrix(m.make(args.scale))
        built = time.perf_counter() - start
        held = pool.total_bytes()
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            ex = plan(A, effort="tune", trials=args.trials, db=Store(f"{folder}/store.db"))
            wall = time.perf_counter() - start
        print(f"{m.name} at {args.scale:g}x: {A.shape[0]} x {A.shape[1]}, {A.nnz / 1e6:.0f} M nonzeros (built in "
              f"{built:.0f} s): {args.trials} trials in {wall:.1f} s; CuPy's pool {held / 2**30:.1f} GiB with A, "
              f"{pool.total_bytes() / 2**30:.1f} GiB after; {ex.explain().splitlines()[0]}", flush=True)
        del A, ex
        pool.free_all_blocks()


if __name__ == "__main__":
    main()
