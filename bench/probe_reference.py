"""The GPU reference's cost: reference_spmv.cu's one pass against the float64 copy of A and two cuSPARSE products.

``Reference.build`` runs before every race, every search and every GPU test's check. For each matrix of
``bench/unseen.py`` chosen and each dtype: the host seconds to queue it and the GPU seconds it takes
(CUDA events), median of 10, at 4, 8, 16 and 32 entries a thread; then the path it replaced (A and x
copied to float64, y = A·x and |A|·|x| by cuSPARSE), and the largest difference of the two y and scale,
relative to |A|·|x|. Result: ``bench/results/2026-11-26_NVIDIA-H100-80GB-HBM3-sm-90_probe_reference-0a2d3a4.txt``.

    python bench/probe_reference.py --only rgg,blockdiag,communities-large
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from unseen_matrices import MATRICES  # noqa: E402

from tuner.measure import verify  # noqa: E402
from tuner.measure.verify import Reference  # noqa: E402


def cusparse_reference(A: object, dtype: str) -> tuple[object, object]:
    """(y, scale) as Reference.build computed them before reference_spmv.cu."""
    import cupy

    x = cupy.empty(A.shape[1], dtype=dtype)
    verify._uniform_kernel()(np.uint64(0), x)
    A64, x64 = A.astype(cupy.float64), x.astype(cupy.float64)
    y = A64 @ x64
    cupy.abs(A64.data, out=A64.data)
    return y, A64 @ cupy.abs(x64)


def timed(fn: Callable[[], object], n: int = 10) -> tuple[float, float]:
    """Median host milliseconds to queue ``fn`` and median GPU milliseconds it takes."""
    import cupy

    fn()
    cupy.cuda.Device().synchronize()
    host, gpu = [], []
    for _ in range(n):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        t = time.perf_counter()
        start.record()
        fn()
        end.record()
        host.append(time.perf_counter() - t)
        end.synchronize()
        gpu.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return float(np.median(host)) * 1e3, float(np.median(gpu)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="rgg,blockdiag,communities-large",
                    help="comma-separated matrix names of bench/unseen.py")
    args = ap.parse_args()
    import cupy
    import cupyx.scipy.sparse as cusp

    for m in MATRICES:
        if m.name not in args.only.split(","):
            continue
        for dtype in ("float32", "float64"):
            A = cusp.csr_matrix(m.make(1.0).astype(dtype))
            for entries in (4, 8, 16, 32):
                verify.REFERENCE_ENTRIES = entries
                host, gpu = timed(lambda: Reference.build(A, dtype, npr_max=100))  # noqa: B023
                print(f"{m.name} {dtype} nnz {A.nnz} new entries={entries}: host {host:.3f} ms gpu {gpu:.3f} ms",
                      flush=True)
            host, gpu = timed(lambda: cusparse_reference(A, dtype))  # noqa: B023
            print(f"{m.name} {dtype} old: host {host:.3f} ms gpu {gpu:.3f} ms", flush=True)
            verify.REFERENCE_ENTRIES = 8
            (y, scale), new = cusparse_reference(A, dtype), Reference.build(A, dtype)
            floor = cupy.maximum(scale, 1e-300)
            print("  max rel diff y", float(cupy.max(cupy.abs(y - new.y) / floor)),
                  "scale", float(cupy.max(cupy.abs(scale - new.scale) / floor)), flush=True)


if __name__ == "__main__":
    main()
