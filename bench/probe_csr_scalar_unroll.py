"""csr_scalar's ``unroll`` on the large suite: is loading a row's first entries at once ever slower?

For each matrix of ``tuner.matrix.suites`` ``large`` and each dtype: csr_scalar at every unroll (1, 2, 4, 8) and
block size 128, 256 and 512, beside cuSPARSE's CSR_ALG1 and CSR_ALG2, timed cold (L2 flushed before every
product) and interleaved; per unroll the best block size's ratio to cuSPARSE's best and its effective bandwidth
as a fraction of the copy bandwidth, and unroll 4 (the default) over unroll 1 (the plain loop). The result of
08e8bb3 on an H100: ``bench/results/2026-11-26_NVIDIA-H100-80GB-HBM3-sm-90_probe_csr_scalar_unroll-08e8bb3.txt``.

    python bench/probe_csr_scalar_unroll.py --only tallskinny-20000000,poisson2d-2000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernels import BASELINE, get_family  # noqa: E402
from kernels.csr_scalar import UNROLL  # noqa: E402
from tuner.matrix.suites import suite  # noqa: E402
from tuner.measure.metrics import gbps  # noqa: E402

BLOCKS = (128, 256, 512)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated matrix names of the large suite")
    args = ap.parse_args()
    import cupyx.scipy.sparse as cusp

    from tuner.measure.backend import GpuBackend
    from tuner.measure.evaluate import time_interleaved
    from tuner.measure.verify import Reference

    backend = GpuBackend()
    copy = backend.copy_bandwidth_gbs()
    scalar, cusparse = get_family("csr_scalar"), get_family(BASELINE)
    print("copy", round(copy), flush=True)
    for m in suite("large"):
        if args.only and m.name not in args.only.split(","):
            continue
        host = m.build()
        for dtype in ("float64", "float32"):
            A = cusp.csr_matrix(host.astype(dtype))
            configs = [(scalar, {"block_size": b, "unroll": u}) for u in UNROLL for b in BLOCKS]
            configs += [(cusparse, {"algorithm": a}) for a in ("csr_alg1", "csr_alg2")]
            timed = time_interleaved(backend, configs, A, Reference.build(A, dtype).x, flush_l2=True, rounds=3,
                                     max_duration=0.1)
            seconds = [t.median_s for t, _ in timed]
            best = {u: min(s for (_, p), s in zip(configs, seconds, strict=False) if p.get("unroll") == u)
                    for u in UNROLL}
            base = min(seconds[-2:])
            print(f"{m.name:20s} {dtype}: " + "  ".join(
                f"u{u} {base / s:.3f}x {gbps(*A.shape, A.nnz, dtype, s) / copy:.0%}" for u, s in best.items())
                + f"  | u4/u1 {best[1] / best[4]:.3f}", flush=True)


if __name__ == "__main__":
    main()
