"""Which kernel firsttouch's renumbered matrix runs fastest with, on unseen matrices with their columns permuted.

firsttouch (:mod:`kernels.firsttouch`) runs csr_vector, with the threads a row
:func:`kernels.csr_vector.threads_covering` gives, on B (A's columns in the order the rows first read them). For
each matrix named (bench/unseen.py's, its columns alone permuted: ``--permute-columns``) and each dtype, timed
cold (L2 flushed before every product) and interleaved: firsttouch as a race enters it, on A; cuSPARSE's two
algorithms on A; the gather of x into B's order alone; and on B (its rows' entries sorted) csr_vector at each
threads a row, csr_scalar and csr5 at setSigma's sigma and at 8, each checked against cuSPARSE's y (x gathered
first). A kernel on B runs in a product of firsttouch's after the gather.
Results: ``bench/results/*_probe_firsttouch-*.txt``.

    python bench/probe_firsttouch.py --only stencil125,upper27,sawtooth,prolong3d,knn3d,bandnoise,rgg,colperm27
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import probing  # noqa: E402
import unseen_matrices  # noqa: E402

from kernels import get_family  # noqa: E402
from kernels.csr_vector import THREADS_PER_ROW  # noqa: E402
from kernels.firsttouch import column_order  # noqa: E402
from kernels.rcm import renumbered_on_gpu  # noqa: E402
from tuner.matrix.features import extract_features  # noqa: E402

ON_B = [("csr_vector", {"threads_per_row": t}) for t in THREADS_PER_ROW] + [("csr_scalar", {}), ("csr5", {}),
                                                                            ("csr5", {"sigma": 8})]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="stencil125,upper27,sawtooth,prolong3d,knn3d,bandnoise,rgg,colperm27")
    args = ap.parse_args()
    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    for name, A, dtype in probing.each_unseen(args.only, _columns_permuted):
        probe(backend, name, A, dtype)


def _columns_permuted(m: unseen_matrices.Unseen) -> unseen_matrices.Unseen:
    """``m`` with its columns alone permuted (``--permute-columns``'s), colperm27 as it is (permuted already)."""
    return m if m.name == "colperm27" else unseen_matrices.columns_permuted(m)


def probe(backend, name: str, A, dtype: str) -> None:
    """The kernels on B, the gather and firsttouch on A, against cuSPARSE on A (printed, us)."""
    import cupy

    x = cupy.random.RandomState(0).random_sample(A.shape[1]).astype(dtype)
    cols = column_order(A.indptr, A.indices, A.shape[1], cupy)
    B = renumbered_on_gpu(A, None, cols)
    B.sort_indices()
    xb = cupy.take(x, cols)
    ft = get_family("firsttouch")
    entered = ft.unranked_config(extract_features(A), A.dtype.itemsize) or ft.space.defaults()
    prepared_ft = ft.prepare(A, entered)
    runs: list[tuple[str, object]] = [(f"firsttouch {entered['threads_per_row']} a row on A",
                                       lambda: ft.run(prepared_ft, x)),
                                      ("gather of x alone", lambda: cupy.take(x, cols, out=xb))]
    for kernel, params in ON_B:
        family = get_family(kernel)
        prepared = family.prepare(B, params)
        runs.append((f"{kernel} {params} on B", lambda f=family, p=prepared: f.run(p, xb)))
    probing.against_cusparse(backend, A, x, runs, f"{name} {dtype}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros",
                             unchecked=("gather of x alone",))


if __name__ == "__main__":
    main()
