"""csr_scalar's ``unroll`` and ``indices`` on the large suite: is either default ever slower than the plain loop?

For each matrix of ``tuner.matrix.suites`` ``large`` and each dtype: csr_scalar at every unroll (1, 2, 4, 8) and
block size 128, 256 and 512, with int32 columns (and with narrow ones at unroll 1 and 4), beside cuSPARSE's
CSR_ALG1 and CSR_ALG2, timed cold (L2 flushed before every product) and interleaved; per unroll and columns the
best block size's ratio to cuSPARSE's best and its effective bandwidth as a fraction of the copy bandwidth
(compulsory bytes with 4-byte columns), then the defaults (unroll 4, narrow) over the plain loop (unroll 1,
int32). Results: ``bench/results/2026-11-26_NVIDIA-H100-80GB-HBM3-sm-90_probe_csr_scalar_unroll-*.txt`` (08e8bb3:
unroll alone, before ``indices``).

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
            variants = [(u, "int32") for u in UNROLL] + [(1, "narrow"), (4, "narrow")]
            configs = [(scalar, {"block_size": b, "unroll": u, "indices": i}) for u, i in variants for b in BLOCKS]
            configs += [(cusparse, {"algorithm": a}) for a in ("csr_alg1", "csr_alg2")]
            timed = time_interleaved(backend, configs, A, Reference.build(A, dtype).x, flush_l2=True, rounds=3,
                                     max_duration=0.1)
            seconds = [t.median_s for t, _ in timed]
            best = {v: min(s for (_, p), s in zip(configs, seconds, strict=False)
                           if (p.get("unroll"), p.get("indices")) == v) for v in variants}
            base = min(seconds[-2:])
            print(f"{m.name:20s} {dtype}: " + "  ".join(
                f"u{u}{'n' if i == 'narrow' else ''} {base / s:.3f}x {gbps(*A.shape, A.nnz, dtype, s) / copy:.0%}"
                for (u, i), s in best.items())
                + f"  | u4n/u1 {best[(1, 'int32')] / best[(4, 'narrow')]:.3f}", flush=True)


if __name__ == "__main__":
    main()
