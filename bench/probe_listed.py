"""csr_vector over the nonempty rows alone against over every row, on unseen matrices with many empty rows.

csr_vector lists the nonempty rows where at least :data:`kernels.csr_vector.EMPTY_SHARE` of them are empty
(:func:`kernels.csr_vector.listed_rows`). For each matrix named (bench/unseen.py's) and each dtype, timed cold
(L2 flushed before every product) and interleaved: cuSPARSE's two algorithms, and csr_vector at each threads a
row, with the rows listed and without (``CsrVector(lists_rows=False)``, as rcm's inner kernel runs), each
checked against cuSPARSE's y. Results: ``bench/results/*_probe_listed-*.txt``.

    python bench/probe_listed.py --only topheavy,bursts,everyother,hypersparse,invertedindex
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

import probing  # noqa: E402

from kernels.csr_vector import THREADS_PER_ROW, CsrVector  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="topheavy,bursts,everyother,hypersparse,invertedindex")
    args = ap.parse_args()
    from tuner.measure.backend import GpuBackend

    backend = GpuBackend()
    for name, A, dtype in probing.each_unseen(args.only):
        probe(backend, name, A, dtype)


def probe(backend, name: str, A, dtype: str) -> None:
    """csr_vector listed and whole at each threads a row against cuSPARSE (printed, us)."""
    import cupy

    x = cupy.random.RandomState(0).random_sample(A.shape[1]).astype(dtype)
    runs: list[tuple[str, object]] = []
    for lists in (True, False):
        family = CsrVector(lists_rows=lists)
        for tpr in THREADS_PER_ROW:
            prepared = family.prepare(A, {"threads_per_row": tpr})
            label = f"csr_vector {tpr} a row, {'listed' if 'listed' in prepared.extra else 'every row'}"
            runs.append((label, lambda f=family, p=prepared: f.run(p, x)))
    empty = A.shape[0] - int(cupy.count_nonzero(cupy.diff(A.indptr)))
    probing.against_cusparse(backend, A, x, runs, f"{name} {dtype}: {A.shape[0]} x {A.shape[1]}, {A.nnz} nonzeros, "
                             f"{empty / A.shape[0]:.0%} of the rows empty")


if __name__ == "__main__":
    main()
