"""Where NuT loses on a band with dense rows and columns (the corpus's arrowband, stop 80): its parts apart.

A band of half-width 3 (2 M rows by default), with 64 dense rows, with 64 dense columns (2 % of the rows each), and
with both (the arrowband generator's defaults), in both dtypes: cuSPARSE, csr5 and five NuT configs, each also with
its work items cut at an eighth of an SM's share of the nonzeros whatever a panel's size (``small cap``). ``ncu``
runs two NuT configs once each on the band and on the whole, for Nsight Compute:

    python bench/probe_arrowband.py sweep [ROWS]
    ncu --clock-control none -k regex:nut_spmv --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats python bench/probe_arrowband.py ncu [ROWS]

Result (H200): ``bench/results/2026-11-30_probe_arrowband-80.txt``: the dense rows, not the columns, cost NuT its
speed (the band 1.22-1.42x cuSPARSE in float32, with the rows 0.61-0.85x, with the columns 1.01-1.31x), and cut
items win most of it back (0.74x -> 0.92x); ncu: the 8192-row config's SMs were busy 56 % of the launch on the whole,
91 % on the band. Hence kernels/nut.py's ``item_starts`` (probe K of bench/probe_unseen_configs.py). That run was at
4c6b014, before ``item_starts``: run now, the configs as they are include its cuts.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from probe_unseen_configs import _runner, sweep  # noqa: E402

from tuner.matrix import generate as g  # noqa: E402
from tuner.measure.backend import GpuBackend  # noqa: E402


def variants(rows: int) -> dict[str, sp.csr_matrix]:
    """The band, the band with dense rows, with dense columns, and with both (values in [0.5, 1.5))."""
    rng = np.random.default_rng(7)
    band = g._banded(rows, rng, half_width=3)
    k, length = 64, round(0.02 * rows)
    lines = rng.choice(rows, size=k, replace=False)
    others = np.sort(rng.random((k, length)) * rows, axis=1).astype(np.int64)
    dr = sp.csr_matrix((np.ones(k * length), (np.repeat(lines, length), others.ravel())), shape=(rows, rows))
    dc = sp.csr_matrix((np.ones(k * length), (others.ravel(), np.repeat(lines, length))), shape=(rows, rows))
    out = {}
    for name, M in (("band", band), ("band+rows", band + dr), ("band+cols", band + dc), ("arrow", band + dr + dc)):
        M = M.tocsr()
        M.sum_duplicates()
        M.data = rng.random(M.nnz) + 0.5
        out[name] = M
    return out


NUT = [(8192, 16384, 1024, 1), (2048, 4096, 1024, 1), (4096, 8192, 1024, 2), (256, 4096, 128, 1), (1024, 4096, 512, 1)]


def main() -> None:
    """``sweep``: every variant and config, timed cold; ``ncu``: two NuT configs run once on 'band' and 'arrow'."""
    import cupy as cp
    import cupyx.scipy.sparse as cusp

    from kernels import nut

    mode = sys.argv[1]
    backend = GpuBackend()
    mats = variants(int(sys.argv[2]) if len(sys.argv) > 2 else 2_000_000)
    if mode == "ncu":  # one launch of each config on 'band' and 'arrow', after a warm-up
        dtype = "float32"
        for name in ("band", "arrow"):
            A = cusp.csr_matrix(mats[name].astype(dtype))
            x = cp.ones(A.shape[1], dtype)
            out = cp.empty(A.shape[0], dtype)
            for r, c, t, s in NUT[:2]:
                fn = _runner("nut", A, {"rows_per_panel": r, "cols_per_tile": c, "threads": t, "slabs": s,
                                        **({"bands": 1} if s > 1 else {})}, x, out)
                fn()
                backend.synchronize()
                fn()
                backend.synchronize()
        return
    orig = nut.item_cap
    for dtype in ("float32", "float64"):
        for name, H in mats.items():
            A = cusp.csr_matrix(H.astype(dtype))
            x = cp.random.RandomState(0).random_sample(A.shape[1]).astype(dtype)
            configs = [("cusparse", {"algorithm": "csr_alg1"}),
                       ("csr5", {"sigma": 8, "block_size": 128, "indices": "narrow"})]
            configs += [("nut", {"rows_per_panel": r, "cols_per_tile": c, "threads": t, "slabs": s,
                                 **({"bands": 1} if s > 1 else {})}) for r, c, t, s in NUT]
            found = sweep(backend, cp, A, x, configs)
            nut.item_cap = lambda nnz, groups, sms: max(nnz // (8 * sms), 1)
            try:
                fine = sweep(backend, cp, A, x, configs[:1] + configs[2:])[1:]
            finally:
                nut.item_cap = orig
            base = min(r["time_s"] for r in found if r["kernel"] == "cusparse")
            print(f"== {name} {dtype} nnz {A.nnz} rowmax {int(np.diff(H.indptr).max())}", flush=True)
            for r in found:
                print(f"   {r['time_s']*1e6:8.1f} us {base / r['time_s']:.3f}x  {r['kernel']} {r['params']}")
            for r in fine:
                print(f"   {r['time_s']*1e6:8.1f} us {base / r['time_s']:.3f}x  {r['kernel']} {r['params']} small cap")
            del A, x
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
