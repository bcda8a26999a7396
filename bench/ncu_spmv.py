"""One SpMV per (matrix, kernel) inside an NVTX range "spmv", for Nsight Compute.

Why cuSPARSE and the families run at the speed they do on large irregular
matrices: the L2 and DRAM traffic and throughput of each kernel, read from the
hardware counters. Run on a GPU (the matrices are generated, float64):

    ncu --nvtx --nvtx-include "spmv/" --clock-control none --csv --metrics \\
        gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,l1tex__t_sector_hit_rate.pct,\\
lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
sm__warps_active.avg.pct_of_peak_sustained_active \\
        python bench/ncu_spmv.py > ncu.csv

Every configuration runs once before its profiled run, so compilation and the
first-touch costs stay outside the range.
"""

from __future__ import annotations

import numpy as np

from kernels import get_family
from kernels._cuda import require_cupy
from tuner.matrix.generate import generate

MATRICES = (("powerlaw", 2_000_000), ("uniform", 2_000_000), ("fewhuge", 4_000_000))
CONFIGS = (
    ("cusparse", {}),
    ("ipcsr", {"long_chunks": 1}),
    ("specsum", {}),
    ("suraa", {"layout": "sorted"}),
    ("suraa", {}),
)


def main() -> None:
    cupy = require_cupy()
    import cupyx.scipy.sparse as cusp
    from cupy.cuda import nvtx

    for kind, rows in MATRICES:
        S = generate(kind, rows=rows)
        A = cusp.csr_matrix(S)
        x = cupy.asarray(np.random.default_rng(1).uniform(-1, 1, S.shape[1]))
        y = cupy.empty(S.shape[0])
        for name, params in CONFIGS:
            family = get_family(name)
            prepared = family.prepare(A, params)
            family.run(prepared, x, y)
            cupy.cuda.Device().synchronize()
            nvtx.RangePush("spmv")
            family.run(prepared, x, y)
            cupy.cuda.Device().synchronize()
            nvtx.RangePop()
            print(f"ran {kind}-{rows} {name} {params}", flush=True)


if __name__ == "__main__":
    main()
